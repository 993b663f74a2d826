//! planned_placement replays every committed trace (the real models' and the generated ones) with
//! exact books: each allocation is served (no OOM on a device with room), requested memory moves
//! exactly as under the default policy (the plan changes where blocks go, never what is asked),
//! and the device gets everything back at the end
//! (in debug builds the invariants are recounted after every request as well).

mod common;

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::backend::Backend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::{CachingConfig, StatType};
use accalloc_tools::replay::{parse_trace, replay, replay_with, ReplayOptions};
use common::committed_traces;
use std::sync::Arc;

const ALL: usize = StatType::All as usize;

#[test]
fn every_committed_trace_replays_with_planned_placement_and_exact_books() {
    let planned = parse_settings("planned_placement:True", &CachingConfig::default()).unwrap();
    for path in committed_traces() {
        let ops = parse_trace(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let backend = Arc::new(SimulatedBackend::new(1, 1 << 40));
        let report = replay(&ops, backend.clone(), &planned).unwrap();
        let default = replay(
            &ops,
            Arc::new(SimulatedBackend::new(1, 1 << 40)),
            &CachingConfig::default(),
        )
        .unwrap();
        let name = path.display();
        assert_eq!(report.ooms, 0, "{name}");
        let (stats, expected) = (&report.device_stats[0], &default.device_stats[0]);
        // What was asked does not depend on where blocks go (allocated bytes may: a block the
        // policy hands out whole is counted whole).
        assert_eq!(
            stats.requested_bytes[ALL].peak, expected.requested_bytes[ALL].peak,
            "{name}"
        );
        assert_eq!(
            stats.allocation[ALL].allocated,
            expected.allocation[ALL].allocated
        );
        assert!(report.peak_reserved() >= report.peak_allocated(), "{name}");
        // The replay frees what the trace left live and empties the cache: nothing stays held.
        let info = backend.mem_get_info(0).unwrap();
        assert_eq!(
            info.free, info.total,
            "{name}: the device got everything back"
        );
    }
}

/// The bar for the mode: over the whole of every committed trace, planned placement uses
/// its reserved memory at least as well as the default trim line (peak allocated / peak
/// reserved). llama_train fell short (0.932 against 0.971) until a large request at the line could
/// take a free range the dropped plan left in the small pool's segment.
#[test]
fn planned_placement_is_never_worse_than_the_trim_line_on_any_committed_trace() {
    let utilization = |ops: &[accalloc_tools::replay::TraceOp], settings: &str| {
        let config = parse_settings(settings, &CachingConfig::default()).unwrap();
        let report = replay(ops, Arc::new(SimulatedBackend::new(1, 1 << 40)), &config).unwrap();
        assert_eq!(report.ooms, 0);
        report.peak_allocated() as f64 / report.peak_reserved() as f64
    };
    for path in committed_traces() {
        let ops = parse_trace(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let planned = utilization(&ops, "planned_placement:True");
        let trim = utilization(&ops, "expandable_segments:True,expandable_trim:True");
        assert!(
            planned >= trim,
            "{}: planned placement {planned:.3}, the trim line {trim:.3}",
            path.display()
        );
    }
}

/// The operations of the committed real trace `name` (examples/traces/real/NAME.jsonl).
fn real_trace(name: &str) -> Vec<accalloc_tools::replay::TraceOp> {
    let path = committed_traces()
        .into_iter()
        .find(|p| p.ends_with(format!("real/{name}.jsonl")))
        .unwrap_or_else(|| panic!("{name} is committed"));
    parse_trace(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The bar for varying shapes, where it is met: T5's and Llama's training with a new batch
/// and length every step reach 0.97 utilization within twice plain expandable segments' device
/// calls (T5 0.981 at 184 calls against 93; Llama 0.971 at 90 against 48). T5 stood at 204 calls
/// until a pass's end kept the free pages the last two passes had needed
/// (`keeps_pages_at_pass_end`) instead of giving them back to map them again in the next pass;
/// Llama at 99 until a planned request that maps pages maps the rest of the plan's run of pages
/// with them, within the line (`plan_run_ahead`).
#[test]
fn training_with_varying_shapes_meets_the_varying_target() {
    for name in ["t5_train", "llama_train"] {
        let ops = real_trace(name);
        let run = |settings: &str| {
            let config = parse_settings(settings, &CachingConfig::default()).unwrap();
            replay(&ops, Arc::new(SimulatedBackend::new(1, 1 << 40)), &config).unwrap()
        };
        let (planned, plain) = (
            run("planned_placement:True"),
            run("expandable_segments:True"),
        );
        let utilization = planned.peak_allocated() as f64 / planned.peak_reserved() as f64;
        let calls = |r: &accalloc_tools::replay::ReplayReport| r.device_allocs() + r.device_frees();
        assert!(utilization >= 0.97, "{name}: {utilization:.3}");
        assert!(
            calls(&planned) <= 2 * calls(&plain),
            "{name}: {} calls against plain expandable's {}",
            calls(&planned),
            calls(&plain)
        );
    }
}

/// The other side of that rule: pages a larger shape's passes needed go back at a pass's end once
/// the passes need less, or a long run keeps them. gpt2_train's last quarter (peaks reset three
/// quarters through: what the rest of the run needed) holds 0.952; keeping every pass's pages
/// outside the plan, whatever the passes allocated, took it to 0.868.
#[test]
fn pages_a_larger_shape_needed_go_back_once_the_passes_need_less() {
    let ops = real_trace("gpt2_train");
    let config = parse_settings("planned_placement:True", &CachingConfig::default()).unwrap();
    let options = ReplayOptions {
        reset_peaks_at: Some(ops.len() * 3 / 4),
        ..ReplayOptions::default()
    };
    let report = replay_with(
        &ops,
        Arc::new(SimulatedBackend::new(1, 1 << 40)),
        &config,
        options,
    )
    .unwrap();
    let utilization = report.peak_allocated() as f64 / report.peak_reserved() as f64;
    assert!(utilization >= 0.95, "{utilization:.3}");
}
