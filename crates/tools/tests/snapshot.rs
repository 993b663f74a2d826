//! PyTorch snapshots as input: a snapshot made from a trace replays with exactly the figures of that
//! trace (all 122 statistics, peaks, OOMs, retries, device calls), whether written by accalloc or
//! pickled by Python; pickles of every protocol PyTorch may write are read; a wrapped history is
//! completed and counted.

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::CachingConfig;
use accalloc_tools::replay::input::{json_to_pickle, pickle_to_json};
use accalloc_tools::replay::{
    parse_trace, read_workload, replay, snapshot_of_trace, InputFormat, ReplayReport,
    SnapshotOptions, TraceOp,
};
use std::sync::Arc;

const CAPACITY: usize = 64 << 30;

fn root(path: &str) -> String {
    format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))
}

fn trace(path: &str) -> Vec<TraceOp> {
    parse_trace(&std::fs::read_to_string(root(path)).unwrap()).unwrap()
}

fn run(ops: &[TraceOp], config: &CachingConfig) -> ReplayReport {
    replay(ops, Arc::new(SimulatedBackend::new(1, CAPACITY)), config).unwrap()
}

fn with_empty_cache() -> SnapshotOptions {
    SnapshotOptions {
        segment_free_as_empty_cache: true,
        ..SnapshotOptions::default()
    }
}

/// Every figure a user compares: the 122 statistics and the derived ones.
fn assert_same_figures(original: &ReplayReport, replayed: &ReplayReport, what: &str) {
    assert_eq!(
        original.device_stats[0].flat(),
        replayed.device_stats[0].flat(),
        "{what}: the 122 statistics"
    );
    assert_eq!(
        original.peak_allocated(),
        replayed.peak_allocated(),
        "{what}"
    );
    assert_eq!(original.peak_reserved(), replayed.peak_reserved(), "{what}");
    assert_eq!(original.ooms, replayed.ooms, "{what}");
    assert_eq!(original.alloc_retries(), replayed.alloc_retries(), "{what}");
    assert_eq!(original.device_allocs(), replayed.device_allocs(), "{what}");
    assert_eq!(original.device_frees(), replayed.device_frees(), "{what}");
}

#[test]
fn a_snapshot_of_a_trace_replays_with_its_figures() {
    let configs = [
        "",
        "expandable_segments:True",
        "max_split_size_mb:64,roundup_power2_divisions:4",
    ];
    for path in [
        "examples/traces/random_rmm.jsonl",
        "examples/traces/varying_sizes.jsonl",
        "examples/snapshots/sample_trace.jsonl",
    ] {
        let ops = trace(path);
        for text in configs {
            let config = parse_settings(text, &CachingConfig::default()).unwrap();
            let original = run(&ops, &config);
            let snapshot = snapshot_of_trace(
                &ops,
                Arc::new(SimulatedBackend::new(1, CAPACITY)),
                &CachingConfig::default(),
            )
            .unwrap();
            // Through the pickle, as PyTorch writes snapshots.
            let pickle = json_to_pickle(&snapshot).unwrap();
            let workload = read_workload(&pickle, &with_empty_cache()).unwrap();
            assert_eq!(workload.format, InputFormat::SnapshotPickle);
            let import = workload.import.as_ref().unwrap();
            assert_eq!(
                (import.frees_before_history, import.live_before_history),
                (0, 0)
            );
            assert_same_figures(
                &original,
                &run(&workload.ops, &config),
                &format!("{path} under '{text}'"),
            );
        }
    }
}

#[test]
fn the_sample_pickled_by_python_replays_with_the_figures_of_its_trace() {
    let ops = trace("examples/snapshots/sample_trace.jsonl");
    let bytes = std::fs::read(root("examples/snapshots/sample_snapshot.pickle")).unwrap();
    let workload = read_workload(&bytes, &with_empty_cache()).unwrap();
    let import = workload.import.unwrap();
    assert_eq!(import.segment_free_runs, 1, "the trace's one empty_cache");
    let config = CachingConfig::default();
    assert_same_figures(&run(&ops, &config), &run(&workload.ops, &config), "sample");
    // As JSON, the same structure.
    let json = pickle_to_json(&bytes).unwrap().to_string();
    let from_json = read_workload(json.as_bytes(), &with_empty_cache()).unwrap();
    assert_eq!(from_json.format, InputFormat::SnapshotJson);
    assert_eq!(from_json.ops, workload.ops);
}

#[test]
fn a_wrapped_history_is_completed_from_the_segments() {
    let bytes = std::fs::read(root("examples/snapshots/sample_snapshot_wrapped.pickle")).unwrap();
    let workload = read_workload(&bytes, &SnapshotOptions::default()).unwrap();
    let import = workload.import.unwrap();
    // The last 1,500 entries of the sample: 11 blocks freed in them were allocated before, and 72
    // blocks live at the end were allocated before and never freed.
    assert_eq!(import.entries, 1500);
    assert_eq!(
        (import.frees_before_history, import.live_before_history),
        (11, 72)
    );
    let report = run(&workload.ops, &CachingConfig::default());
    assert_eq!(report.ooms, 0);
    let full = trace("examples/snapshots/sample_trace.jsonl");
    let live_at_end_full =
        run(&full, &CachingConfig::default()).device_stats[0].allocation[0].current;
    assert_eq!(
        report.device_stats[0].allocation[0].current, live_at_end_full,
        "the same blocks are live at the end as in the whole trace"
    );
}

#[test]
fn pickles_of_protocols_2_to_5_with_shared_frames_are_read() {
    for protocol in 2..=5 {
        let bytes = std::fs::read(root(&format!(
            "tests/data/snapshot_protocol{protocol}.pickle"
        )))
        .unwrap();
        let workload = read_workload(&bytes, &SnapshotOptions::default()).unwrap();
        let alloc = |id, size| TraceOp::Alloc {
            id,
            size,
            stream: 0,
            device: 0,
        };
        assert_eq!(
            workload.ops,
            vec![alloc(0, 100), alloc(1, 1000), TraceOp::Free { id: 1 }],
            "protocol {protocol}"
        );
        let report = run(&workload.ops, &CachingConfig::default());
        assert_eq!(report.peak_allocated(), 512 + 1024, "protocol {protocol}");
        assert_eq!(report.peak_reserved(), 2 << 20, "one small segment");
    }
}
