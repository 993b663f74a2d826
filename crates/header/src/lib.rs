//! include/accalloc.h, generated from the C library's `src/capi` with cbindgen.
//!
//! An explicit step (`cargo run -p accalloc-header`), not a side effect of building: a build never
//! writes into the source tree. The committed header is checked against a fresh generation by this
//! crate's test (so `cargo test` fails when it is stale) and by `accalloc-header --check`.

use std::path::{Path, PathBuf};

/// The repository's root (this crate lives in crates/header).
pub fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The committed header's path.
pub fn committed_path(root: &Path) -> PathBuf {
    root.join("include/accalloc.h")
}

/// The header as cbindgen generates it now from `src/capi` and `cbindgen.toml`.
pub fn generate(root: &Path) -> Result<String, String> {
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml"))
        .map_err(|e| format!("cbindgen.toml: {e}"))?;
    // cbindgen follows the `mod` items of src/capi/mod.rs, so the header holds the C ABI and nothing
    // else of the library.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/capi/mod.rs"))
        .generate()
        .map_err(|e| format!("cbindgen could not generate the header: {e}"))?;
    let mut bytes = Vec::new();
    bindings.write(&mut bytes);
    String::from_utf8(bytes).map_err(|e| format!("the generated header is not UTF-8: {e}"))
}
