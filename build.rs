//! Generates include/accalloc.h from src/capi with cbindgen.
//!
//! The header is written to OUT_DIR on every build; include/accalloc.h is refreshed from it when it
//! differs, except under CI (CI set), where a stale committed header must fail the header test instead
//! of being silently fixed.

use std::path::{Path, PathBuf};

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let capi_dir = crate_dir.join("src/capi");
    println!("cargo:rerun-if-changed=src/capi");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=CI");

    // The shared library's SONAME carries the ABI version: libaccalloc.so.<ABI>.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,-soname,libaccalloc.so.{}",
            abi_version(&crate_dir)
        );
        link_soname_in_target_dir(&crate_dir);
        // Never unloaded by dlclose: the allocator's books live for the process, and memory it
        // handed out may outlive any handle to the library (as with any allocator). Without
        // thread-local destructors nothing else would keep the library mapped.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }

    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    // cbindgen follows the `mod` items of src/capi/mod.rs, so the header holds the C ABI and nothing
    // else of the crate.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(capi_dir.join("mod.rs"))
        .generate()
        .expect("cbindgen could not generate the header");

    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let generated = out_dir.join("accalloc.h");
    bindings.write_to_file(&generated);

    let committed = crate_dir.join("include/accalloc.h");
    if std::env::var_os("CI").is_none() && differs(&generated, &committed) {
        std::fs::create_dir_all(committed.parent().unwrap()).unwrap();
        std::fs::copy(&generated, &committed).expect("write include/accalloc.h");
    }
}

/// ACCALLOC_ABI_VERSION as src/capi/types.rs defines it: the one source of the ABI number.
fn abi_version(crate_dir: &Path) -> u32 {
    let types =
        std::fs::read_to_string(crate_dir.join("src/capi/types.rs")).expect("src/capi/types.rs");
    types
        .lines()
        .find_map(|line| line.strip_prefix("pub const ACCALLOC_ABI_VERSION: u32 = "))
        .and_then(|rest| rest.trim_end_matches(';').trim().parse().ok())
        .expect("src/capi/types.rs defines ACCALLOC_ABI_VERSION")
}

/// Programs linked with `-Ltarget/<profile> -laccalloc` ask the loader for the SONAME, which cargo does
/// not create: leave `libaccalloc.so.<ABI>` -> `libaccalloc.so` beside the library (dangling until the
/// library is linked), so the build tree runs as an installed prefix does.
fn link_soname_in_target_dir(crate_dir: &Path) {
    // OUT_DIR is <profile dir>/build/accalloc-<hash>/out.
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let Some(profile_dir) = out_dir.ancestors().nth(3) else {
        return;
    };
    let link = profile_dir.join(format!("libaccalloc.so.{}", abi_version(crate_dir)));
    if std::fs::read_link(&link).ok().as_deref() != Some(Path::new("libaccalloc.so")) {
        let _ = std::fs::remove_file(&link);
        #[cfg(unix)]
        let _ = std::os::unix::fs::symlink("libaccalloc.so", &link);
    }
}

fn differs(a: &Path, b: &Path) -> bool {
    std::fs::read(a).ok() != std::fs::read(b).ok()
}
