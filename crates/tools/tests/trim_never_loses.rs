//! expandable_trim at its default line never reserves more at peak than plain expandable segments,
//! on every committed trace: the real models' (examples/traces/real) and the generated ones. The
//! 20 MiB floor the line had before lost on two real traces (the CNN's and GPT-2's); a test with
//! that floor shows it, so this one can tell the difference.

mod common;

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::CachingConfig;
use accalloc_tools::replay::{parse_trace, replay, TraceOp};
use common::committed_traces;
use std::path::PathBuf;
use std::sync::Arc;

const PLAIN: &str = "expandable_segments:True";
const TRIM: &str = "expandable_segments:True,expandable_trim:True";

fn peak_reserved(ops: &[TraceOp], settings: &str) -> i64 {
    let config = parse_settings(settings, &CachingConfig::default()).unwrap();
    let report = replay(ops, Arc::new(SimulatedBackend::new(1, 1 << 40)), &config).unwrap();
    assert_eq!(report.ooms, 0);
    report.peak_reserved()
}

#[test]
fn trim_at_its_default_line_reserves_at_most_what_plain_expandable_segments_do() {
    for path in committed_traces() {
        let ops = parse_trace(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let (plain, trimmed) = (peak_reserved(&ops, PLAIN), peak_reserved(&ops, TRIM));
        assert!(
            trimmed <= plain,
            "{}: trim reserves {trimmed} bytes at peak, plain expandable segments {plain}",
            path.display()
        );
    }
}

#[test]
fn the_old_fixed_floor_lost_on_a_small_real_job() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/traces/real/cnn_train.jsonl");
    let ops = parse_trace(&std::fs::read_to_string(path).unwrap()).unwrap();
    let old_line = format!("{TRIM},expandable_trim_slack:0.0714,expandable_trim_floor_mb:20");
    assert!(peak_reserved(&ops, &old_line) > peak_reserved(&ops, PLAIN));
}
