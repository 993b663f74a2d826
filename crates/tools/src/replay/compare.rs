//! `accalloc compare`: one trace under several settings, figures side by side.

use super::session::{replay_with, ReplayOptions, ReplayReport};
use super::trace::{devices_used, TraceOp};
use crate::backend::simulated::SimulatedBackend;
use crate::caching::CachingConfig;
use crate::error::Result;
use crate::units::format_size;
use std::fmt::Write;
use std::sync::Arc;

/// Replay `ops` once per config, each on a fresh simulated device of `capacity` bytes, with the
/// timeline sampled.
pub fn compare(
    ops: &[TraceOp],
    configs: &[CachingConfig],
    capacity: usize,
) -> Result<Vec<ReplayReport>> {
    let devices = devices_used(ops);
    let options = ReplayOptions {
        timeline: true,
        ..ReplayOptions::default()
    };
    configs
        .iter()
        .map(|config| {
            replay_with(
                ops,
                Arc::new(SimulatedBackend::new(devices, capacity)),
                config,
                options,
            )
        })
        .collect()
}

/// The figures of each run in a Markdown table, one column a run.
pub fn comparison_table(labels: &[String], reports: &[ReplayReport]) -> String {
    fn bytes(b: i64) -> String {
        format!("{} ({b})", format_size(b.max(0) as u64))
    }
    type Row = (&'static str, fn(&ReplayReport) -> String);
    let rows: [Row; 8] = [
        ("peak allocated", |r| bytes(r.peak_allocated())),
        ("peak reserved", |r| bytes(r.peak_reserved())),
        ("utilization (peak allocated / peak reserved)", |r| {
            format!("{:.3}", r.utilization())
        }),
        ("OOMs", |r| r.ooms.to_string()),
        ("retries", |r| r.alloc_retries().to_string()),
        ("device allocations", |r| r.device_allocs().to_string()),
        ("device frees", |r| r.device_frees().to_string()),
        ("time per operation (ns)", |r| {
            format!("{:.1}", r.ns_per_op())
        }),
    ];
    let mut out = String::from("| |");
    for label in labels {
        let _ = write!(
            out,
            " `{}` |",
            if label.is_empty() {
                "(defaults)"
            } else {
                label
            }
        );
    }
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(labels.len()));
    out.push('\n');
    for (name, value) in rows {
        let _ = write!(out, "| {name} |");
        for report in reports {
            let _ = write!(out, " {} |", value(report));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caching::settings::parse_settings;

    #[test]
    fn two_settings_side_by_side() {
        let ops = vec![
            TraceOp::Alloc {
                id: 0,
                size: 30 << 20,
                stream: 0,
                device: 0,
            },
            TraceOp::Free { id: 0 },
            TraceOp::Alloc {
                id: 1,
                size: 50 << 20,
                stream: 0,
                device: 0,
            },
        ];
        let configs = [
            CachingConfig::default(),
            parse_settings("expandable_segments:True", &CachingConfig::default()).unwrap(),
        ];
        let reports = compare(&ops, &configs, 1 << 40).unwrap();
        assert_eq!(
            reports[0].peak_reserved(),
            80 << 20,
            "30 MiB cached, 50 MiB new"
        );
        assert_eq!(
            reports[1].peak_reserved(),
            60 << 20,
            "one segment grown in 20 MiB pages"
        );
        assert_eq!(reports[0].timeline.len(), 3);
        let labels = ["".to_string(), "expandable_segments:True".to_string()];
        let table = comparison_table(&labels, &reports);
        assert!(
            table.starts_with("| | `(defaults)` | `expandable_segments:True` |\n|---|---:|---:|\n")
        );
        assert!(
            table.contains("| peak reserved | 80.00 MiB (83886080) | 60.00 MiB (62914560) |"),
            "{table}"
        );
        // 50 MiB at peak: utilization is peak allocated / peak reserved, the direction tune uses.
        assert!(
            table.contains("| utilization (peak allocated / peak reserved) | 0.625 | 0.833 |"),
            "{table}"
        );
    }
}
