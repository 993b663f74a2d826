//! Replaying a trace through fresh caching allocators (one per device) and measuring it.

use crate::backend::Backend;
use crate::caching::pools::{MempoolId, Route};
use crate::caching::snapshot::settings_json;
use crate::caching::{CachingAllocator, CachingConfig, DeviceStats, StatType};
use crate::error::{Error, ErrorKind, Result};
use crate::replay::trace::{devices_used, PoolCall, TraceOp};
use accalloc_core::planning::online::PlannerCounters;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// What to collect besides the figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplayOptions {
    /// Sample allocated and reserved bytes by pool after every operation (for the timeline).
    pub timeline: bool,
    /// Take a snapshot (segments, blocks, history) at the operation where reserved memory peaks.
    pub snapshot_at_peak: bool,
    /// Record the history of the whole replay and take the snapshot after the last operation
    /// instead (what `accalloc convert TRACE -o SNAPSHOT` writes).
    pub snapshot_at_end: bool,
    /// Reset the peak statistics before this operation (its index): the peaks then say what the
    /// rest of the trace needed (a long run past its first steps).
    pub reset_peaks_at: Option<usize>,
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
    /// record_stream ops applied, and those skipped because the backend has no events.
    pub stream_uses: usize,
    pub stream_uses_skipped: usize,
    /// Statistics of each device the trace used (index = device).
    pub device_stats: Vec<DeviceStats>,
    /// planned_placement's planner of each device (None: the setting is off).
    pub planners: Vec<Option<PlannerCounters>>,
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
    /// The figures every tool's JSON gives for one replay, under one set of names: peaks,
    /// utilization, out-of-memory errors and retries, device calls, time per operation.
    pub fn figures_json(&self) -> serde_json::Value {
        serde_json::json!({
            "peak_allocated_bytes": self.peak_allocated(),
            "peak_reserved_bytes": self.peak_reserved(),
            "utilization": self.utilization(),
            "ooms": self.ooms,
            "alloc_retries": self.alloc_retries(),
            "device_allocs": self.device_allocs(),
            "device_frees": self.device_frees(),
            "ns_per_op": self.ns_per_op(),
        })
    }

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
    /// Utilization: peak allocated / peak reserved (1.0: nothing held back; 0 when nothing was
    /// reserved). The one direction every output of the tool uses.
    pub fn utilization(&self) -> f64 {
        self.peak_allocated() as f64 / self.peak_reserved().max(1) as f64
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
    /// Every private pool the trace named, by device: those still in use at the end are let go.
    pools: BTreeSet<(usize, MempoolId)>,
}

impl Session {
    fn new(ops: &[TraceOp], backend: &Arc<dyn Backend>, config: &CachingConfig) -> Result<Session> {
        let devices_used = devices_used(ops);
        if devices_used > backend.device_count() {
            return Err(Error::invalid_device(format!(
                "the trace uses device {} but {} has {} device(s) (ACCALLOC_HOST_DEVICES gives the \
                 host and --simulate more; --device N replays one device of a snapshot)",
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
            pools: BTreeSet::new(),
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
            TraceOp::Pool { pool, device, call } => {
                self.pools.insert((device, pool));
                let allocator = &mut self.allocators[device];
                match call {
                    PoolCall::Create {
                        use_on_oom,
                        no_split,
                    } => allocator.create_pool(pool, use_on_oom, no_split)?,
                    PoolCall::Begin { stream } => {
                        // A replay runs on one thread: a thread's pool takes every allocation.
                        let route = match stream {
                            None => Route::Thread(std::thread::current().id()),
                            Some(stream) => Route::Stream(stream),
                        };
                        allocator.begin_allocate_to_pool(pool, route)?
                    }
                    PoolCall::End => allocator.end_allocate_to_pool(pool).map(drop)?,
                    PoolCall::Release => allocator.release_pool(pool)?,
                    PoolCall::Empty { live: false } => allocator.empty_pool_cache(pool)?,
                    PoolCall::Empty { live: true } => allocator.empty_live_pool(pool)?,
                }
            }
            TraceOp::RecordStream { id, stream } => {
                if let Some(&(device, ptr)) = self.live.get(&id) {
                    match self.allocators[device].record_stream(ptr, stream) {
                        Ok(()) => report.stream_uses += 1,
                        // The backend has no events (the host): the use cannot be modelled.
                        Err(e) if e.kind == ErrorKind::NotSupported => {
                            report.stream_uses_skipped += 1
                        }
                        Err(e) => return Err(e),
                    }
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

    /// Give everything back so the backend ends as it began. A pool the trace left in use (a
    /// snapshot's pools live through it, as the program's MemPool did) is ended and released as
    /// the program's exit would, so that empty_cache can give its segments back.
    fn finish(mut self) -> Result<()> {
        for (_, (device, ptr)) in std::mem::take(&mut self.live) {
            self.allocators[device].free(ptr)?;
        }
        for &(device, pool) in &self.pools {
            let allocator = &mut self.allocators[device];
            // Each end undoes one begin; it fails once none is left.
            while allocator.end_allocate_to_pool(pool).is_ok() {}
            while allocator.pool_use_count(pool).is_some_and(|uses| uses > 0) {
                allocator.release_pool(pool)?;
            }
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
        stream_uses: 0,
        stream_uses_skipped: 0,
        device_stats: Vec::new(),
        planners: Vec::new(),
        total_ns: 0,
        malloc_ns: 0,
        free_ns: 0,
        timeline: Vec::new(),
        snapshot: None,
    }
}

/// How many history entries a replay's snapshot keeps per device, the newest: PyTorch's default
/// `max_entries` for `_record_memory_history`, so that a snapshot of a long trace stays the size of
/// one PyTorch would write (a ring buffer, not the whole run).
pub const SNAPSHOT_HISTORY_ENTRIES: usize = 100_000;

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
    if options.snapshot_at_end {
        for allocator in &mut session.allocators {
            allocator.record_history(true, SNAPSHOT_HISTORY_ENTRIES);
        }
    }
    let mut report = empty_report(ops.len());
    let sampling = options.timeline || options.snapshot_at_peak;
    let (mut peak_reserved, mut peak_at) = (-1i64, 0usize);
    let start = Instant::now();
    for (index, op) in ops.iter().enumerate() {
        if options.reset_peaks_at == Some(index) {
            for allocator in &mut session.allocators {
                allocator.reset_peak_stats();
            }
        }
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
    report.planners = session
        .allocators
        .iter()
        .map(|a| a.planner_counters())
        .collect();
    if options.snapshot_at_end {
        report.snapshot = Some(session.snapshot(config));
    }
    session.finish()?;

    if options.snapshot_at_peak && !options.snapshot_at_end {
        // Replay again up to the peak with history on, and look inside there.
        let mut again = Session::new(ops, &backend, config)?;
        for allocator in &mut again.allocators {
            allocator.record_history(true, SNAPSHOT_HISTORY_ENTRIES);
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
    use crate::backend::simulated::SimulatedBackend;
    use crate::replay::trace::parse_trace;

    #[test]
    fn replay_reports_peaks_and_counts() {
        let trace = "{\"op\":\"alloc\",\"id\":1,\"size\":1000}\n{\"op\":\"alloc\",\"id\":2,\"size\":5242880}\n\
                     {\"op\":\"free\",\"id\":1}\n{\"op\":\"empty_cache\"}\n{\"op\":\"free\",\"id\":2}\n";
        let ops = parse_trace(trace).unwrap();
        let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
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
    fn replay_lets_go_of_the_pools_a_trace_leaves_in_use() {
        // A pool made and begun, never ended nor released (a snapshot's pools live through the
        // trace): its segment still goes back at the end, as the program's exit gives it.
        let trace = "{\"op\":\"pool_create\",\"pool\":[203,0]}\n\
                     {\"op\":\"pool_begin\",\"pool\":[203,0]}\n\
                     {\"op\":\"alloc\",\"id\":1,\"size\":512}\n";
        let ops = parse_trace(trace).unwrap();
        let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
        let report = replay(&ops, backend.clone(), &CachingConfig::default()).unwrap();
        assert_eq!(report.device_allocs(), 1);
        assert!(
            backend.live_segments(0).is_empty(),
            "the pool's segment is given back"
        );
    }

    #[test]
    fn replay_counts_ooms_and_skips_their_frees() {
        let trace = "{\"op\":\"alloc\",\"id\":1,\"size\":104857600}\n{\"op\":\"free\",\"id\":1}\n";
        let report = replay(
            &parse_trace(trace).unwrap(),
            Arc::new(SimulatedBackend::new(1, 64 << 20)),
            &CachingConfig::default(),
        )
        .unwrap();
        assert_eq!((report.ooms, report.frees), (1, 1));
        assert_eq!(report.device_stats[0].allocation[0].allocated, 0);
    }

    #[test]
    fn record_stream_defers_the_free_where_the_backend_has_events() {
        let trace = "{\"op\":\"alloc\",\"id\":1,\"size\":1000,\"stream\":0}\n\
                     {\"op\":\"record_stream\",\"id\":1,\"stream\":5}\n{\"op\":\"free\",\"id\":1}\n\
                     {\"op\":\"alloc\",\"id\":2,\"size\":1000,\"stream\":0}\n";
        let ops = parse_trace(trace).unwrap();
        let simulated = replay(
            &ops,
            Arc::new(SimulatedBackend::new(1, 1 << 30)),
            &CachingConfig::default(),
        )
        .unwrap();
        assert_eq!(
            (simulated.stream_uses, simulated.stream_uses_skipped),
            (1, 0)
        );
        // The first block waits for stream 5, so the second request takes another block of the
        // segment: two blocks of 1024 bytes active at the peak.
        let active = &simulated.device_stats[0].active_bytes[StatType::All as usize];
        assert_eq!(active.peak, 2048);
        let host = replay(
            &ops,
            Arc::new(crate::backend::host::HostBackend::new(
                crate::backend::host::HostSettings {
                    capacity: 1 << 30,
                    devices: 1,
                    fail: None,
                    event_fail: None,
                },
            )),
            &CachingConfig::default(),
        )
        .unwrap();
        assert_eq!((host.stream_uses, host.stream_uses_skipped), (1, 0));
        let active = &host.device_stats[0].active_bytes[StatType::All as usize];
        assert_eq!(
            active.peak, 1024,
            "no events: the free waits for the stream, the block is reused at once"
        );
    }

    #[test]
    fn a_snapshot_keeps_a_bounded_history_of_a_long_trace() {
        // 40,000 alloc/free pairs write 120,000 history entries, and the peak of reserved memory
        // comes last (a 30 MiB block); the snapshot at the peak or at the end keeps the newest.
        let mut ops: Vec<TraceOp> = (0..40_000u64)
            .flat_map(|id| {
                [
                    TraceOp::Alloc {
                        id,
                        size: 4096,
                        stream: 0,
                        device: 0,
                    },
                    TraceOp::Free { id },
                ]
            })
            .collect();
        ops.push(TraceOp::Alloc {
            id: 40_000,
            size: 30 << 20,
            stream: 0,
            device: 0,
        });
        for options in [
            ReplayOptions {
                snapshot_at_end: true,
                ..ReplayOptions::default()
            },
            ReplayOptions {
                snapshot_at_peak: true,
                ..ReplayOptions::default()
            },
        ] {
            let backend = Arc::new(crate::backend::simulated::SimulatedBackend::new(1, 1 << 30));
            let report = replay_with(&ops, backend, &CachingConfig::default(), options).unwrap();
            let traces = &report.snapshot.unwrap()["device_traces"][0];
            assert_eq!(traces.as_array().unwrap().len(), SNAPSHOT_HISTORY_ENTRIES);
            assert_eq!(traces[SNAPSHOT_HISTORY_ENTRIES - 1]["size"], 30 << 20);
        }
    }
}
