//! The committed include/accalloc.h is exactly what src/capi generates.

#[test]
fn committed_header_is_current() {
    let root = accalloc_header::repository_root();
    let generated = accalloc_header::generate(&root).unwrap();
    let committed = std::fs::read_to_string(accalloc_header::committed_path(&root))
        .expect("include/accalloc.h is missing");
    assert!(
        generated == committed,
        "include/accalloc.h is stale: run `cargo run -p accalloc-header`, then commit it"
    );
}
