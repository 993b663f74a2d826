//! Allocation traces: reading them and replaying them through a caching allocator.
//!
//! Format: one JSON object a line: `{"op":"alloc","id":7,"size":4096,"stream":0}` (optional
//! "device"), `{"op":"free","id":7}`, `{"op":"empty_cache"}`. Blank lines are skipped.

use crate::backend::Backend;
use crate::caching::snapshot::settings_json;
use crate::caching::{CachingAllocator, CachingConfig, DeviceStats, StatType};
use crate::error::{Error, ErrorKind, Result};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// One operation of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceOp {
    Alloc {
        id: u64,
        size: usize,
        stream: usize,
        device: usize,
    },
    Free {
        id: u64,
    },
    EmptyCache,
}

/// Read a whole trace; a malformed line is an error naming its number (from 1).
pub fn parse_trace(text: &str) -> Result<Vec<TraceOp>> {
    let mut ops = Vec::new();
    let mut live: HashMap<u64, usize> = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let op = parse_line(line).map_err(|why| {
            Error::invalid_argument(format!("trace line {number}: {why}: {}", abbreviate(line)))
        })?;
        match &op {
            TraceOp::Alloc { id, .. } => {
                if let Some(first) = live.insert(*id, number) {
                    return Err(Error::invalid_argument(format!(
                        "trace line {number}: id {id} is allocated again while live (allocated on line {first})"
                    )));
                }
            }
            TraceOp::Free { id } => {
                if live.remove(id).is_none() {
                    return Err(Error::invalid_argument(format!(
                        "trace line {number}: free of id {id}, which is not live"
                    )));
                }
            }
            TraceOp::EmptyCache => {}
        }
        ops.push(op);
    }
    Ok(ops)
}

fn abbreviate(line: &str) -> String {
    if line.len() <= 80 {
        line.to_string()
    } else {
        format!(
            "{}...",
            &line[..line.char_indices().nth(77).map_or(line.len(), |(i, _)| i)]
        )
    }
}

fn parse_line(line: &str) -> std::result::Result<TraceOp, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let object = value.as_object().ok_or("not a JSON object")?;
    let uint = |key: &str, required: bool| -> std::result::Result<Option<u64>, String> {
        match object.get(key) {
            None if required => Err(format!("missing \"{key}\"")),
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or(format!("\"{key}\" must be a non-negative integer")),
        }
    };
    match object.get("op").and_then(|v| v.as_str()) {
        Some("alloc") => Ok(TraceOp::Alloc {
            id: uint("id", true)?.unwrap(),
            size: usize::try_from(uint("size", true)?.unwrap())
                .map_err(|_| "\"size\" is too large")?,
            stream: uint("stream", false)?.unwrap_or(0) as usize,
            device: uint("device", false)?.unwrap_or(0) as usize,
        }),
        Some("free") => Ok(TraceOp::Free {
            id: uint("id", true)?.unwrap(),
        }),
        Some("empty_cache") => Ok(TraceOp::EmptyCache),
        Some(other) => Err(format!(
            "unknown op \"{other}\" (expected alloc, free or empty_cache)"
        )),
        None => Err("missing \"op\"".into()),
    }
}

/// What to collect besides the figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplayOptions {
    /// Sample allocated and reserved bytes by pool after every operation (for the timeline).
    pub timeline: bool,
    /// Take a snapshot (segments, blocks, history) at the operation where reserved memory peaks.
    pub snapshot_at_peak: bool,
}

/// Bytes allocated and reserved after one operation, summed over devices, as [small, large].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelinePoint {
    pub allocated: [i64; 2],
    pub reserved: [i64; 2],
}

/// What a replay measured.
#[derive(Clone, Debug)]
pub struct ReplayReport {
    pub operations: usize,
    pub allocs: usize,
    pub frees: usize,
    /// Failed allocations (their later frees are skipped).
    pub ooms: usize,
    /// Statistics of each device the trace used (index = device).
    pub device_stats: Vec<DeviceStats>,
    /// Wall time of all operations, and of mallocs and frees alone, in nanoseconds.
    pub total_ns: u128,
    pub malloc_ns: u128,
    pub free_ns: u128,
    /// One point per operation, when asked for.
    pub timeline: Vec<TimelinePoint>,
    /// The snapshot at peak reserved memory, when asked for.
    pub snapshot: Option<serde_json::Value>,
}

impl ReplayReport {
    fn sum(&self, f: impl Fn(&DeviceStats) -> i64) -> i64 {
        self.device_stats.iter().map(f).sum()
    }
    /// Peak bytes handed out (summed over devices).
    pub fn peak_allocated(&self) -> i64 {
        self.sum(|s| s.allocated_bytes[StatType::All as usize].peak)
    }
    /// Peak bytes reserved from the device (summed over devices).
    pub fn peak_reserved(&self) -> i64 {
        self.sum(|s| s.reserved_bytes[StatType::All as usize].peak)
    }
    /// Peak reserved / peak allocated: 1.0 is no waste.
    pub fn reserved_ratio(&self) -> f64 {
        self.peak_reserved() as f64 / self.peak_allocated().max(1) as f64
    }
    pub fn alloc_retries(&self) -> i64 {
        self.sum(|s| s.num_alloc_retries)
    }
    pub fn device_allocs(&self) -> i64 {
        self.sum(|s| s.num_device_alloc)
    }
    pub fn device_frees(&self) -> i64 {
        self.sum(|s| s.num_device_free)
    }
    pub fn ns_per_op(&self) -> f64 {
        self.total_ns as f64 / self.operations.max(1) as f64
    }
    pub fn ns_per_malloc(&self) -> f64 {
        self.malloc_ns as f64 / self.allocs.max(1) as f64
    }
    pub fn ns_per_free(&self) -> f64 {
        self.free_ns as f64 / self.frees.max(1) as f64
    }
}

/// The allocators of one replay and the trace ids they hold.
struct Session {
    allocators: Vec<CachingAllocator>,
    live: HashMap<u64, (usize, usize)>,
}

impl Session {
    fn new(ops: &[TraceOp], backend: &Arc<dyn Backend>, config: &CachingConfig) -> Result<Session> {
        let devices_used = ops
            .iter()
            .filter_map(|op| match op {
                TraceOp::Alloc { device, .. } => Some(*device + 1),
                _ => None,
            })
            .max()
            .unwrap_or(1);
        if devices_used > backend.device_count() {
            return Err(Error::invalid_device(format!(
                "the trace uses device {} but {} has {} device(s)",
                devices_used - 1,
                backend.name(),
                backend.device_count()
            )));
        }
        let allocators = (0..devices_used)
            .map(|d| CachingAllocator::new(backend.clone(), d, config.clone()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Session {
            allocators,
            live: HashMap::with_capacity(1024),
        })
    }

    /// Apply one operation, counting and timing it in `report`.
    fn step(&mut self, op: &TraceOp, report: &mut ReplayReport) -> Result<()> {
        match *op {
            TraceOp::Alloc {
                id,
                size,
                stream,
                device,
            } => {
                report.allocs += 1;
                if size == 0 {
                    return Ok(());
                }
                let t = Instant::now();
                let result = self.allocators[device].malloc(size, stream);
                report.malloc_ns += t.elapsed().as_nanos();
                match result {
                    Ok(ptr) => {
                        self.live.insert(id, (device, ptr));
                    }
                    Err(e) if e.kind == ErrorKind::OutOfMemory => report.ooms += 1,
                    Err(e) => return Err(e),
                }
            }
            TraceOp::Free { id } => {
                report.frees += 1;
                if let Some((device, ptr)) = self.live.remove(&id) {
                    let t = Instant::now();
                    self.allocators[device].free(ptr)?;
                    report.free_ns += t.elapsed().as_nanos();
                }
            }
            TraceOp::EmptyCache => {
                for allocator in &mut self.allocators {
                    allocator.empty_cache()?;
                }
            }
        }
        Ok(())
    }

    fn point(&self) -> TimelinePoint {
        let mut point = TimelinePoint::default();
        for allocator in &self.allocators {
            let (allocated, reserved) = allocator.current_bytes_by_pool();
            for pool in 0..2 {
                point.allocated[pool] += allocated[pool];
                point.reserved[pool] += reserved[pool];
            }
        }
        point
    }

    fn snapshot(&self, config: &CachingConfig) -> serde_json::Value {
        let segments: Vec<serde_json::Value> = self
            .allocators
            .iter()
            .flat_map(|a| a.segments().into_iter().map(|s| s.to_json(a.device())))
            .collect();
        let traces: Vec<serde_json::Value> = self
            .allocators
            .iter()
            .map(|a| {
                a.history()
                    .map(|h| h.entries().map(|e| e.to_json()).collect())
                    .unwrap_or_default()
            })
            .collect();
        serde_json::json!({
            "segments": segments,
            "device_traces": traces,
            "allocator_settings": settings_json(config),
        })
    }

    /// Give everything back so the backend ends as it began.
    fn finish(mut self) -> Result<()> {
        for (_, (device, ptr)) in std::mem::take(&mut self.live) {
            self.allocators[device].free(ptr)?;
        }
        for allocator in &mut self.allocators {
            allocator.empty_cache()?;
        }
        Ok(())
    }
}

fn empty_report(operations: usize) -> ReplayReport {
    ReplayReport {
        operations,
        allocs: 0,
        frees: 0,
        ooms: 0,
        device_stats: Vec::new(),
        total_ns: 0,
        malloc_ns: 0,
        free_ns: 0,
        timeline: Vec::new(),
        snapshot: None,
    }
}

/// Replay `ops` through fresh caching allocators (one per device) over `backend`. Allocations left
/// live at the end are freed (not timed) so the backend gets its memory back.
pub fn replay(
    ops: &[TraceOp],
    backend: Arc<dyn Backend>,
    config: &CachingConfig,
) -> Result<ReplayReport> {
    replay_with(ops, backend, config, ReplayOptions::default())
}

/// `replay`, also collecting what `options` asks for.
pub fn replay_with(
    ops: &[TraceOp],
    backend: Arc<dyn Backend>,
    config: &CachingConfig,
    options: ReplayOptions,
) -> Result<ReplayReport> {
    let mut session = Session::new(ops, &backend, config)?;
    let mut report = empty_report(ops.len());
    let sampling = options.timeline || options.snapshot_at_peak;
    let (mut peak_reserved, mut peak_at) = (-1i64, 0usize);
    let start = Instant::now();
    for (index, op) in ops.iter().enumerate() {
        session.step(op, &mut report)?;
        if sampling {
            let point = session.point();
            let reserved = point.reserved[0] + point.reserved[1];
            if reserved > peak_reserved {
                (peak_reserved, peak_at) = (reserved, index);
            }
            if options.timeline {
                report.timeline.push(point);
            }
        }
    }
    report.total_ns = start.elapsed().as_nanos();
    report.device_stats = session.allocators.iter().map(|a| a.stats()).collect();
    session.finish()?;

    if options.snapshot_at_peak {
        // Replay again up to the peak with history on, and look inside there.
        let mut again = Session::new(ops, &backend, config)?;
        for allocator in &mut again.allocators {
            allocator.record_history(true, ops.len().max(1));
        }
        let mut scratch = empty_report(ops.len());
        for op in &ops[..ops.len().min(peak_at + 1)] {
            again.step(op, &mut scratch)?;
        }
        report.snapshot = Some(again.snapshot(config));
        again.finish()?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testing::TestBackend;

    #[test]
    fn parses_the_three_ops() {
        let ops = parse_trace(
            "{\"op\":\"alloc\",\"id\":7,\"size\":4096,\"stream\":0}\n\n{\"op\":\"alloc\",\"id\":8,\"size\":1,\"stream\":2,\"device\":1}\n{\"op\":\"free\",\"id\":7}\n{\"op\":\"empty_cache\"}\n",
        )
        .unwrap();
        assert_eq!(
            ops,
            vec![
                TraceOp::Alloc {
                    id: 7,
                    size: 4096,
                    stream: 0,
                    device: 0
                },
                TraceOp::Alloc {
                    id: 8,
                    size: 1,
                    stream: 2,
                    device: 1
                },
                TraceOp::Free { id: 7 },
                TraceOp::EmptyCache,
            ]
        );
    }

    #[test]
    fn malformed_lines_are_named_by_number() {
        let cases = [
            (
                "{\"op\":\"alloc\",\"id\":1,\"size\":8}\nnot json",
                "trace line 2: not JSON",
            ),
            (
                "{\"op\":\"alloc\",\"id\":1}",
                "trace line 1: missing \"size\"",
            ),
            (
                "{\"op\":\"alloc\",\"id\":1,\"size\":-3}",
                "trace line 1: \"size\" must be a non-negative integer",
            ),
            ("{\"op\":\"resize\"}", "trace line 1: unknown op \"resize\""),
            ("[1,2]", "trace line 1: not a JSON object"),
            ("{\"id\":1}", "trace line 1: missing \"op\""),
            (
                "{\"op\":\"free\",\"id\":3}",
                "trace line 1: free of id 3, which is not live",
            ),
            (
                "{\"op\":\"alloc\",\"id\":1,\"size\":8}\n{\"op\":\"alloc\",\"id\":1,\"size\":8}",
                "trace line 2: id 1 is allocated again while live (allocated on line 1)",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_trace(text).unwrap_err();
            assert!(
                err.message.starts_with(expected),
                "{} / {}",
                err.message,
                expected
            );
        }
    }

    #[test]
    fn replay_reports_peaks_and_counts() {
        let trace = "{\"op\":\"alloc\",\"id\":1,\"size\":1000}\n{\"op\":\"alloc\",\"id\":2,\"size\":5242880}\n\
                     {\"op\":\"free\",\"id\":1}\n{\"op\":\"empty_cache\"}\n{\"op\":\"free\",\"id\":2}\n";
        let ops = parse_trace(trace).unwrap();
        let backend = Arc::new(TestBackend::new(1, 1 << 30));
        let report = replay(&ops, backend.clone(), &CachingConfig::default()).unwrap();
        assert_eq!((report.allocs, report.frees, report.ooms), (2, 2, 0));
        assert_eq!(report.peak_allocated(), 1024 + (5 << 20));
        assert_eq!(report.peak_reserved(), (2 << 20) + (20 << 20));
        assert_eq!(report.device_allocs(), 2);
        assert_eq!(
            report.device_frees(),
            1,
            "empty_cache released the small segment only"
        );
        assert!(
            backend.live_segments(0).is_empty(),
            "replay gives everything back at the end"
        );
    }

    #[test]
    fn replay_counts_ooms_and_skips_their_frees() {
        let trace = "{\"op\":\"alloc\",\"id\":1,\"size\":104857600}\n{\"op\":\"free\",\"id\":1}\n";
        let report = replay(
            &parse_trace(trace).unwrap(),
            Arc::new(TestBackend::new(1, 64 << 20)),
            &CachingConfig::default(),
        )
        .unwrap();
        assert_eq!((report.ooms, report.frees), (1, 1));
        assert_eq!(report.device_stats[0].allocation[0].allocated, 0);
    }
}
