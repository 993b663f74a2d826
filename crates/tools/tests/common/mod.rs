//! What the tools' tests share.

use std::path::PathBuf;

/// Every committed trace, generated (examples/traces) and recorded from real models
/// (examples/traces/real), in path order.
pub fn committed_traces() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/traces");
    let mut paths = Vec::new();
    for dir in [root.clone(), root.join("real")] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "jsonl") {
                paths.push(path);
            }
        }
    }
    paths.sort();
    assert!(paths.len() >= 15, "the 3 generated and 12 real traces");
    paths
}
