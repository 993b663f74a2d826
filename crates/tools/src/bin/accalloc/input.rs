//! Reading the file a command works on: a trace or a PyTorch snapshot, by content.

use crate::args::Args;
use accalloc_tools::replay::{read_workload, SnapshotImport, SnapshotOptions, Workload};

/// Replay each run of segment frees outside an OOM in a snapshot as an empty_cache.
pub const EMPTY_CACHE_FLAG: &str = "--segment-free-as-empty-cache";

/// The snapshot options of a command's flags (--device N, --segment-free-as-empty-cache).
pub fn snapshot_options(args: &Args) -> Result<SnapshotOptions, String> {
    let device = args
        .value("--device")
        .map(|text| {
            text.parse::<usize>()
                .map_err(|_| format!("--device: '{text}' is not a device number (0, 1, ...)"))
        })
        .transpose()?;
    Ok(SnapshotOptions {
        device,
        segment_free_as_empty_cache: args.has(EMPTY_CACHE_FLAG),
    })
}

/// Read `path` as a trace or snapshot; errors name the file.
pub fn load(path: &str, args: &Args) -> Result<Workload, String> {
    let options = snapshot_options(args)?;
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    read_workload(&bytes, &options).map_err(|e| format!("{path}: {}", e.message))
}

/// What reading a snapshot found, for --json.
pub fn snapshot_json(import: &SnapshotImport) -> serde_json::Value {
    serde_json::json!({
        "devices": import.devices,
        "streams": import.streams,
        "entries": import.entries,
        "frees_before_history": import.frees_before_history,
        "live_before_history": import.live_before_history,
        "segment_free_runs": import.segment_free_runs,
        "ooms": import.ooms,
        "pool_allocs": import.pool_allocs,
    })
}
