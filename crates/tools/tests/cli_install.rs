//! scripts/install.sh installs the accalloc tool beside the libraries, as the README's tune flow runs
//! it by its bare name: PREFIX/bin/accalloc.

use std::path::{Path, PathBuf};
use std::process::Command;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "accalloc-cli-install-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A build folder as `cargo build --release` leaves it: the two libraries (stand-ins: the script
/// only copies them) and, unless `without_tool`, the tool this test run built.
fn build_folder(without_tool: bool) -> PathBuf {
    let dir = temp_dir(if without_tool {
        "build-no-tool"
    } else {
        "build"
    });
    std::fs::write(dir.join("libaccalloc.so"), b"shared").unwrap();
    std::fs::write(dir.join("libaccalloc.a"), b"static").unwrap();
    if !without_tool {
        std::fs::copy(env!("CARGO_BIN_EXE_accalloc"), dir.join("accalloc")).unwrap();
    }
    dir
}

fn install(lib_dir: &Path, prefix: &Path) -> (bool, String, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install.sh");
    let out = Command::new("bash")
        .arg(script)
        .env("ACCALLOC_LIB_DIR", lib_dir)
        .env("PREFIX", prefix)
        .env_remove("DESTDIR")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn install_puts_the_tool_in_prefix_bin_and_says_so() {
    let prefix = temp_dir("prefix");
    let (ok, out, err) = install(&build_folder(false), &prefix);
    assert!(ok, "{out}{err}");
    let tool = prefix.join("bin/accalloc");
    assert!(
        out.contains("bin/accalloc, the tool"),
        "the output names the tool: {out}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&tool).unwrap().permissions().mode();
    assert_eq!(mode & 0o111, 0o111, "executable: {mode:o}");
    // The installed tool runs by itself.
    let version = Command::new(&tool).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("accalloc {} (ABI 2)", env!("CARGO_PKG_VERSION"))
    );
    for file in [
        "lib/libaccalloc.a",
        "include/accalloc.h",
        "lib/pkgconfig/accalloc.pc",
    ] {
        assert!(prefix.join(file).exists(), "{file}");
    }
    let _ = std::fs::remove_dir_all(&prefix);
}

#[test]
fn install_refuses_a_build_folder_without_the_tool() {
    let prefix = temp_dir("prefix-refused");
    let build = build_folder(true);
    let (ok, _, err) = install(&build, &prefix);
    assert!(!ok);
    assert!(
        err.contains(&format!("{}/accalloc not found", build.display())),
        "{err}"
    );
}
