//! PyTorch memory snapshots as traces: the dict torch.cuda.memory._snapshot() returns (and
//! _dump_snapshot pickles), read from its history, and the same structure written from a trace.
//!
//! The snapshot holds `segments` (what is reserved at the end, with its blocks) and `device_traces`
//! (one list per device of TraceEntry dicts: `action`, `addr`, `size`, `stream`, `time_us`, `frames`).
//! The history becomes a trace as follows:
//! - `alloc` hands out a new id; `free_requested` frees the live id at that address (addresses are
//!   reused, ids are not); its `free_completed` is then nothing more. A `free_completed` with no
//!   request before it frees the live id too.
//! - The ring buffer wraps (`max_entries`): a free of an address not allocated in the history was
//!   allocated before the first entry, and an `active_allocated` block of `segments` that the history
//!   does not hold live was too. Both are allocated at the start of the trace (in address order), and
//!   counted.
//! - `oom` is a request that failed: it becomes an alloc of its size freed at once (where the replay
//!   has room for it, the program's later use of that memory is unknown).
//! - `segment_free` / `segment_unmap` entries not followed by an `oom` are an explicit empty_cache (or
//!   a release that let a request succeed on retry: the history cannot tell them apart). They are
//!   counted, and become an empty_cache op when asked (`segment_free_as_empty_cache`); otherwise the
//!   allocator under replay decides its own releases.
//! - `segment_alloc`, `segment_map` and `snapshot` are the allocator's own doing and are skipped.
//! - Devices are kept apart (trace device i is the i-th device replayed) and merged in `time_us`
//!   order; stream values become stream ids 0, 1, ... in the order of their values.
//! - Private pools: an allocation whose address lies in a segment of `segments` with a
//!   `segment_pool_id` other than [0, 0] is routed to that pool (pool_begin, alloc, pool_end,
//!   pool_release), each such pool made once at the start (pool_create, one use: it lives through the
//!   trace, as the program's MemPool or graph did). Only the segments held at the end tell pools
//!   apart: an allocation in a pool segment freed before the snapshot reads as the default pools'.

use super::session::{replay_with, ReplayOptions};
use super::trace::{PoolCall, TraceOp};
use crate::backend::Backend;
use crate::caching::pools::MempoolId;
use crate::caching::CachingConfig;
use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// How to turn a snapshot into a trace.
#[derive(Clone, Copy, Debug, Default)]
pub struct SnapshotOptions {
    /// Replay only this device of the snapshot (as device 0); None: every device with history.
    pub device: Option<usize>,
    /// Replay each run of segment frees outside an OOM as an empty_cache.
    pub segment_free_as_empty_cache: bool,
}

/// A snapshot read as a trace, and what the reading found.
#[derive(Clone, Debug, Default)]
pub struct SnapshotImport {
    pub ops: Vec<TraceOp>,
    /// The snapshot's device number of each trace device.
    pub devices: Vec<usize>,
    /// Distinct streams, over the devices replayed.
    pub streams: usize,
    /// History entries read.
    pub entries: usize,
    /// Frees of blocks allocated before the first entry (the ring buffer wrapped).
    pub frees_before_history: usize,
    /// Blocks live at the end, in `segments`, that the history never allocated.
    pub live_before_history: usize,
    /// Runs of segment frees outside an OOM (explicit empty_cache calls, or a retry that worked).
    pub segment_free_runs: usize,
    /// Requests that failed (`oom` entries).
    pub ooms: usize,
    /// Allocations routed to a private pool (their address lies in one of its segments).
    pub pool_allocs: usize,
}

impl SnapshotImport {
    /// One line on what was read, for the tools to print.
    pub fn describe(&self) -> String {
        let devices: Vec<String> = self.devices.iter().map(|d| d.to_string()).collect();
        format!(
            "snapshot: {} history entries of device(s) {}, {} stream(s); {} free(s) and {} live block(s) \
             from before the history (allocated at the start); {} OOM(s); {} segment-free run(s) outside \
             an OOM",
            self.entries,
            devices.join(", "),
            self.streams,
            self.frees_before_history,
            self.live_before_history,
            self.ooms,
            self.segment_free_runs
        )
    }
}

/// Where an entry is, for error messages.
fn at(device: usize, index: usize) -> String {
    format!("device_traces[{device}][{index}]")
}

fn int_field(object: &Map<String, Value>, key: &str) -> std::result::Result<Option<i64>, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match (v.as_i64(), v.as_u64()) {
            (Some(i), _) => Ok(Some(i)),
            (None, Some(u)) => Ok(Some(u as i64)),
            _ => Err(format!("\"{key}\" must be an integer, got {}", short(v))),
        },
    }
}

fn size_field(object: &Map<String, Value>, key: &str) -> std::result::Result<usize, String> {
    match int_field(object, key)? {
        None => Err(format!("missing \"{key}\"")),
        Some(n) if n < 0 => Err(format!("\"{key}\" must not be negative, got {n}")),
        Some(n) => usize::try_from(n).map_err(|_| format!("\"{key}\" is too large")),
    }
}

fn short(value: &Value) -> String {
    super::trace::abbreviate(&value.to_string())
}

/// One device's history as ops, before ids and streams are fixed.
#[derive(Default)]
struct DeviceHistory {
    /// Blocks allocated before the history: (address, size, stream value).
    before: BTreeMap<u64, (usize, i64)>,
    /// (time_us, op) with the trace device filled in and stream ids as raw values.
    ops: Vec<(i64, RawOp)>,
}

/// An op whose id is local to its device and whose stream is still the snapshot's value.
#[derive(Clone, Copy)]
enum RawOp {
    Alloc {
        id: u64,
        size: usize,
        stream: i64,
        pool: Option<MempoolId>,
    },
    Free {
        id: u64,
    },
    EmptyCache,
}

/// Read one device's entries and its live blocks.
fn read_device(
    device: usize,
    entries: &[Value],
    live_at_end: &[LiveBlock],
    pool_segments: &[PoolSegment],
    options: &SnapshotOptions,
    import: &mut SnapshotImport,
) -> Result<DeviceHistory> {
    // The private pool of an address, if a pool's segment holds it.
    let pool_of = |addr: u64| {
        pool_segments
            .iter()
            .find(|&&(start, end, _)| (start..end).contains(&addr))
            .map(|&(_, _, pool)| pool)
    };
    let mut history = DeviceHistory::default();
    let mut next_id: u64 = 0;
    let mut before_ids: HashMap<u64, u64> = HashMap::new();
    let mut live: HashMap<u64, (u64, usize)> = HashMap::new();
    let mut awaiting_completion: BTreeSet<u64> = BTreeSet::new();
    // Where the current run of segment frees began (index into ops) and its time.
    let mut run: Option<(usize, i64)> = None;
    let mut last_time = 0i64;
    for (index, entry) in entries.iter().enumerate() {
        let bad = |why: String| Error::invalid_argument(format!("{}: {why}", at(device, index)));
        let object = entry
            .as_object()
            .ok_or_else(|| bad(format!("not a dict: {}", short(entry))))?;
        let action = match object.get("action") {
            Some(Value::String(action)) => action.as_str(),
            Some(other) => {
                return Err(bad(format!(
                    "\"action\" must be a string, got {}",
                    short(other)
                )))
            }
            None => return Err(bad("missing \"action\"".into())),
        };
        let time = int_field(object, "time_us")
            .map_err(&bad)?
            .unwrap_or(last_time);
        last_time = time;
        let stream = int_field(object, "stream").map_err(&bad)?.unwrap_or(0);
        let addr = || -> Result<u64> {
            match int_field(object, "addr").map_err(&bad)? {
                None => Err(bad(format!("missing \"addr\" (action \"{action}\")"))),
                Some(a) if a < 0 => Err(bad(format!("\"addr\" must not be negative, got {a}"))),
                Some(a) => Ok(a as u64),
            }
        };
        let size = || {
            size_field(object, "size").map_err(|why| bad(format!("{why} (action \"{action}\")")))
        };
        // A run of segment frees ends at the next entry that is not one; an OOM makes it the
        // release-and-retry path of the request that failed.
        if !matches!(action, "segment_free" | "segment_unmap" | "snapshot") {
            if let Some((position, run_time)) = run.take() {
                if action != "oom" {
                    import.segment_free_runs += 1;
                    if options.segment_free_as_empty_cache {
                        history.ops.insert(position, (run_time, RawOp::EmptyCache));
                    }
                }
            }
        }
        match action {
            "alloc" => {
                let (addr, size) = (addr()?, size()?);
                if let Some((_, since)) = live.get(&addr) {
                    return Err(bad(format!(
                        "alloc at address {addr:#x}, which is allocated since {} and not freed",
                        at(device, *since)
                    )));
                }
                awaiting_completion.remove(&addr);
                live.insert(addr, (next_id, index));
                let pool = pool_of(addr);
                import.pool_allocs += pool.is_some() as usize;
                history.ops.push((
                    time,
                    RawOp::Alloc {
                        id: next_id,
                        size,
                        stream,
                        pool,
                    },
                ));
                next_id += 1;
            }
            "free_requested" | "free_completed" => {
                let addr = addr()?;
                if action == "free_completed" && awaiting_completion.remove(&addr) {
                    continue;
                }
                let id = match live.remove(&addr) {
                    Some((id, _)) => id,
                    // Its free was requested before the first entry: nothing left to replay.
                    None if action == "free_completed" => continue,
                    None => {
                        import.frees_before_history += 1;
                        let size = size()?;
                        history.before.insert(addr, (size, stream));
                        let id = next_id;
                        next_id += 1;
                        before_ids.insert(addr, id);
                        id
                    }
                };
                if action == "free_requested" {
                    awaiting_completion.insert(addr);
                }
                history.ops.push((time, RawOp::Free { id }));
            }
            "oom" => {
                let size = size()?;
                import.ooms += 1;
                history.ops.push((
                    time,
                    RawOp::Alloc {
                        id: next_id,
                        size,
                        stream,
                        pool: None,
                    },
                ));
                history.ops.push((time, RawOp::Free { id: next_id }));
                next_id += 1;
            }
            "segment_free" | "segment_unmap" => {
                if run.is_none() {
                    run = Some((history.ops.len(), time));
                }
            }
            "segment_alloc" | "segment_map" | "snapshot" => {}
            other => {
                return Err(bad(format!(
                    "unknown action \"{other}\" (expected alloc, free_requested, free_completed, \
                     segment_alloc, segment_free, segment_map, segment_unmap, snapshot or oom)"
                )))
            }
        }
    }
    if let Some((position, run_time)) = run {
        import.segment_free_runs += 1;
        if options.segment_free_as_empty_cache {
            history.ops.insert(position, (run_time, RawOp::EmptyCache));
        }
    }
    for &(addr, size, stream) in live_at_end {
        if !live.contains_key(&addr) && !history.before.contains_key(&addr) {
            import.live_before_history += 1;
            history.before.insert(addr, (size, stream));
            before_ids.insert(addr, next_id);
            next_id += 1;
        }
    }
    // The blocks from before the history come first, in address order, with the ids given above.
    let mut before_ops: Vec<(i64, RawOp)> = history
        .before
        .iter()
        .map(|(addr, &(size, stream))| {
            let id = before_ids[addr];
            let pool = pool_of(*addr);
            import.pool_allocs += pool.is_some() as usize;
            (
                i64::MIN,
                RawOp::Alloc {
                    id,
                    size,
                    stream,
                    pool,
                },
            )
        })
        .collect();
    before_ops.append(&mut history.ops);
    history.ops = before_ops;
    Ok(history)
}

/// A block live at the end: (address, requested size, stream value).
/// The list under `key` (none when absent or None); anything else is an error saying it must be
/// `what`.
fn list_field<'a>(object: &'a Map<String, Value>, key: &str, what: &str) -> Result<&'a [Value]> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(Error::invalid_argument(format!(
            "\"{key}\" must be {what}, got {}",
            short(other)
        ))),
    }
}

type LiveBlock = (u64, usize, i64);

/// A private pool's segment held at the end: [start, end) and the pool.
type PoolSegment = (u64, u64, MempoolId);

/// The segments of private pools (`segment_pool_id` other than [0, 0]), by device.
fn pool_segments(snapshot: &Map<String, Value>) -> Result<BTreeMap<usize, Vec<PoolSegment>>> {
    let mut by_device: BTreeMap<usize, Vec<PoolSegment>> = BTreeMap::new();
    for (index, segment) in list_field(snapshot, "segments", "a list")?
        .iter()
        .enumerate()
    {
        let bad = |why: String| Error::invalid_argument(format!("segments[{index}]: {why}"));
        let Some(segment) = segment.as_object() else {
            continue; // live_blocks reports it
        };
        let pool = match segment.get("segment_pool_id") {
            None | Some(Value::Null) => continue,
            Some(Value::Array(pair)) if pair.len() == 2 => {
                let part = |v: &Value| {
                    v.as_u64().ok_or_else(|| {
                        bad(format!(
                            "\"segment_pool_id\" must hold two non-negative integers, got {}",
                            short(v)
                        ))
                    })
                };
                (part(&pair[0])?, part(&pair[1])?)
            }
            Some(other) => {
                return Err(bad(format!(
                    "\"segment_pool_id\" must be a pair, got {}",
                    short(other)
                )))
            }
        };
        if pool == (0, 0) {
            continue;
        }
        let device = int_field(segment, "device").map_err(&bad)?.unwrap_or(0);
        let device =
            usize::try_from(device).map_err(|_| bad(format!("bad \"device\" {device}")))?;
        let start = size_field(segment, "address").map_err(&bad)? as u64;
        let size = size_field(segment, "total_size").map_err(&bad)? as u64;
        by_device
            .entry(device)
            .or_default()
            .push((start, start.saturating_add(size), pool));
    }
    Ok(by_device)
}

/// The `active_allocated` blocks of `segments`, by device.
fn live_blocks(snapshot: &Map<String, Value>) -> Result<BTreeMap<usize, Vec<LiveBlock>>> {
    let mut by_device: BTreeMap<usize, Vec<LiveBlock>> = BTreeMap::new();
    let segments = list_field(snapshot, "segments", "a list")?;
    for (index, segment) in segments.iter().enumerate() {
        let bad = |why: String| Error::invalid_argument(format!("segments[{index}]: {why}"));
        let segment = segment
            .as_object()
            .ok_or_else(|| bad(format!("not a dict: {}", short(segment))))?;
        let device = int_field(segment, "device").map_err(&bad)?.unwrap_or(0);
        let device =
            usize::try_from(device).map_err(|_| bad(format!("bad \"device\" {device}")))?;
        let stream = int_field(segment, "stream").map_err(&bad)?.unwrap_or(0);
        let Some(blocks) = segment.get("blocks") else {
            continue;
        };
        let blocks = blocks
            .as_array()
            .ok_or_else(|| bad(format!("\"blocks\" must be a list, got {}", short(blocks))))?;
        for (b, block) in blocks.iter().enumerate() {
            let bad = |why: String| bad(format!("blocks[{b}]: {why}"));
            let block = block
                .as_object()
                .ok_or_else(|| bad(format!("not a dict: {}", short(block))))?;
            if block.get("state").and_then(Value::as_str) != Some("active_allocated") {
                continue;
            }
            let address = size_field(block, "address").map_err(&bad)? as u64;
            let size = size_field(block, "size").map_err(&bad)?;
            // What the program asked for; a snapshot without it gives the block's size.
            let requested = match int_field(block, "requested_size").map_err(&bad)? {
                Some(r) if r > 0 => usize::try_from(r).unwrap_or(size),
                _ => size,
            };
            by_device
                .entry(device)
                .or_default()
                .push((address, requested, stream));
        }
    }
    Ok(by_device)
}

/// Read a snapshot (the dict of torch.cuda.memory._snapshot, as JSON values) as a trace.
pub fn read_snapshot(snapshot: &Value, options: &SnapshotOptions) -> Result<SnapshotImport> {
    let top = snapshot.as_object().ok_or_else(|| {
        Error::invalid_argument(format!(
            "not a memory snapshot: expected a dict with \"segments\" and \"device_traces\", got {}",
            short(snapshot)
        ))
    })?;
    if !top.contains_key("device_traces") && !top.contains_key("segments") {
        let keys: Vec<&str> = top.keys().map(String::as_str).take(8).collect();
        return Err(Error::invalid_argument(format!(
            "not a memory snapshot: no \"device_traces\" or \"segments\" key (keys: {})",
            keys.join(", ")
        )));
    }
    let traces = list_field(
        top,
        "device_traces",
        "a list (one list of entries per device)",
    )?;
    for (device, trace) in traces.iter().enumerate() {
        if !trace.is_array() {
            return Err(Error::invalid_argument(format!(
                "device_traces[{device}] must be a list of entries, got {}",
                short(trace)
            )));
        }
    }
    let entries_of = |device: usize| -> &[Value] {
        traces
            .get(device)
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    };
    let live = live_blocks(top)?;
    let pools = pool_segments(top)?;
    let devices: Vec<usize> = match options.device {
        Some(device) => {
            if device >= traces.len() && !live.contains_key(&device) {
                return Err(Error::invalid_device(format!(
                    "--device {device}: the snapshot has history for {} device(s) (0 to {})",
                    traces.len(),
                    traces.len() as i64 - 1
                )));
            }
            vec![device]
        }
        None => (0..traces.len())
            .filter(|&d| !entries_of(d).is_empty())
            .collect(),
    };
    let mut import = SnapshotImport {
        devices: devices.clone(),
        ..SnapshotImport::default()
    };
    if devices.iter().all(|&d| entries_of(d).is_empty()) {
        return Err(Error::invalid_argument(
            "the snapshot has no allocation history (device_traces is empty): record it with \
             torch.cuda.memory._record_memory_history() before the code you want to replay"
                .to_string(),
        ));
    }
    let mut histories = Vec::new();
    for &device in &devices {
        let entries = entries_of(device);
        import.entries += entries.len();
        let live_at_end = live.get(&device).map_or(&[][..], Vec::as_slice);
        let pool_segments = pools.get(&device).map_or(&[][..], Vec::as_slice);
        histories.push(read_device(
            device,
            entries,
            live_at_end,
            pool_segments,
            options,
            &mut import,
        )?);
    }
    // Stream values in their order become ids 0, 1, ...
    let streams: BTreeSet<i64> = histories
        .iter()
        .flat_map(|h| h.ops.iter())
        .filter_map(|(_, op)| match op {
            RawOp::Alloc { stream, .. } => Some(*stream),
            _ => None,
        })
        .collect();
    import.streams = streams.len();
    let stream_id: HashMap<i64, usize> = streams.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    // Ids: each device's own, offset so that they never collide.
    let mut offsets = Vec::with_capacity(histories.len());
    let mut total = 0u64;
    for history in &histories {
        offsets.push(total);
        total += history.ops.len() as u64;
    }
    // Merge the devices in time order, keeping each device's own order.
    let mut next = vec![0usize; histories.len()];
    let mut ops = Vec::with_capacity(total as usize);
    // Each private pool is made first, with the one use that keeps it alive through the trace.
    for (device, history) in histories.iter().enumerate() {
        let used: BTreeSet<MempoolId> = history
            .ops
            .iter()
            .filter_map(|(_, op)| match op {
                RawOp::Alloc { pool, .. } => *pool,
                _ => None,
            })
            .collect();
        for pool in used {
            ops.push(TraceOp::Pool {
                pool,
                device,
                call: PoolCall::Create {
                    use_on_oom: false,
                    no_split: false,
                },
            });
        }
    }
    loop {
        let pick = (0..histories.len())
            .filter(|&d| next[d] < histories[d].ops.len())
            .min_by_key(|&d| (histories[d].ops[next[d]].0, d));
        let Some(device) = pick else { break };
        let (_, op) = histories[device].ops[next[device]];
        next[device] += 1;
        let offset = offsets[device];
        let routed = |call| TraceOp::Pool {
            pool: match op {
                RawOp::Alloc { pool: Some(p), .. } => p,
                _ => unreachable!("only allocations are routed"),
            },
            device,
            call,
        };
        if let RawOp::Alloc { pool: Some(_), .. } = op {
            ops.push(routed(PoolCall::Begin { stream: None }));
        }
        ops.push(match op {
            RawOp::Alloc {
                id, size, stream, ..
            } => TraceOp::Alloc {
                id: id + offset,
                size,
                stream: stream_id[&stream],
                device,
            },
            RawOp::Free { id } => TraceOp::Free { id: id + offset },
            RawOp::EmptyCache => TraceOp::EmptyCache,
        });
        if let RawOp::Alloc { pool: Some(_), .. } = op {
            ops.push(routed(PoolCall::End));
            ops.push(routed(PoolCall::Release));
        }
    }
    import.ops = ops;
    Ok(import)
}

/// The snapshot of a replay of `ops` with the whole history recorded: PyTorch's structure, which
/// `read_snapshot` turns back into a trace with the same figures.
pub fn snapshot_of_trace(
    ops: &[TraceOp],
    backend: Arc<dyn Backend>,
    config: &CachingConfig,
) -> Result<Value> {
    let options = ReplayOptions {
        snapshot_at_end: true,
        ..ReplayOptions::default()
    };
    let report = replay_with(ops, backend, config, options)?;
    report
        .snapshot
        .ok_or_else(|| Error::invalid_argument("the replay took no snapshot".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(action: &str, addr: u64, size: i64, stream: i64) -> Value {
        json!({"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0, "frames": []})
    }

    #[test]
    fn addresses_are_reused_and_ids_are_not() {
        let snapshot = json!({"segments": [], "device_traces": [[
            entry("segment_alloc", 0x1000, 2 << 20, 0),
            entry("alloc", 0x1000, 100, 0),
            entry("free_requested", 0x1000, 100, 0),
            entry("free_completed", 0x1000, 100, 0),
            entry("alloc", 0x1000, 200, 0),
            entry("free_requested", 0x1000, 200, 0),
            entry("free_completed", 0x1000, 200, 0),
        ]]});
        let import = read_snapshot(&snapshot, &SnapshotOptions::default()).unwrap();
        let alloc = |id, size| TraceOp::Alloc {
            id,
            size,
            stream: 0,
            device: 0,
        };
        assert_eq!(
            import.ops,
            vec![
                alloc(0, 100),
                TraceOp::Free { id: 0 },
                alloc(1, 200),
                TraceOp::Free { id: 1 }
            ]
        );
        assert_eq!((import.entries, import.frees_before_history), (7, 0));
    }

    #[test]
    fn a_wrapped_ring_buffer_allocates_the_missing_blocks_first() {
        let snapshot = json!({
        "segments": [{"device": 0, "address": 0x1000, "total_size": 2 << 20, "stream": 7,
            "blocks": [
                {"address": 0x1000, "size": 1024, "requested_size": 1000, "state": "active_allocated"},
                {"address": 0x1400, "size": 512, "requested_size": 512, "state": "active_allocated"},
                {"address": 0x1600, "size": 4096, "requested_size": 0, "state": "inactive"},
            ]}],
        "device_traces": [[
            entry("free_completed", 0x9000, 64, 7),
            entry("free_requested", 0x2000, 300, 7),
            entry("free_completed", 0x2000, 300, 7),
            entry("alloc", 0x1400, 512, 7),
        ]]});
        let import = read_snapshot(&snapshot, &SnapshotOptions::default()).unwrap();
        assert_eq!(
            (import.frees_before_history, import.live_before_history),
            (1, 1)
        );
        let alloc = |id, size| TraceOp::Alloc {
            id,
            size,
            stream: 0,
            device: 0,
        };
        assert_eq!(
            import.ops,
            vec![
                alloc(2, 1000),
                alloc(0, 300),
                TraceOp::Free { id: 0 },
                alloc(1, 512)
            ],
            "the block at 0x1000 and the one freed at 0x2000 come first, in address order"
        );
    }

    #[test]
    fn segment_frees_outside_an_oom_can_be_empty_cache() {
        let trace = json!({"device_traces": [[
            entry("alloc", 0x1000, 100, 0),
            entry("free_requested", 0x1000, 100, 0),
            entry("free_completed", 0x1000, 100, 0),
            entry("segment_free", 0x1000, 2 << 20, 0),
            entry("segment_free", 0x3000, 2 << 20, 0),
            entry("alloc", 0x5000, 100, 0),
            entry("segment_free", 0x5000, 2 << 20, 0),
            entry("oom", 12345, 1 << 40, 0),
        ]]});
        let plain = read_snapshot(&trace, &SnapshotOptions::default()).unwrap();
        assert_eq!((plain.segment_free_runs, plain.ooms), (1, 1));
        assert!(!plain.ops.contains(&TraceOp::EmptyCache));
        let options = SnapshotOptions {
            segment_free_as_empty_cache: true,
            ..SnapshotOptions::default()
        };
        let ops = read_snapshot(&trace, &options).unwrap().ops;
        assert_eq!(
            ops[2],
            TraceOp::EmptyCache,
            "one empty_cache for the run of two"
        );
        assert_eq!(
            ops.iter().filter(|op| **op == TraceOp::EmptyCache).count(),
            1
        );
        assert_eq!(
            &ops[4..],
            &[
                TraceOp::Alloc {
                    id: 2,
                    size: 1 << 40,
                    stream: 0,
                    device: 0
                },
                TraceOp::Free { id: 2 }
            ],
            "the OOM is a request freed at once"
        );
    }

    #[test]
    fn devices_are_kept_apart_and_streams_numbered() {
        let trace = json!({"device_traces": [
            [entry("alloc", 0x1000, 100, 0), entry("alloc", 0x2000, 100, 99999)],
            [],
            [entry("alloc", 0x1000, 300, 555)],
        ]});
        let all = read_snapshot(&trace, &SnapshotOptions::default()).unwrap();
        assert_eq!((all.devices.clone(), all.streams), (vec![0, 2], 3));
        assert!(all.ops.contains(&TraceOp::Alloc {
            id: 2,
            size: 300,
            stream: 1,
            device: 1
        }));
        assert!(all.ops.contains(&TraceOp::Alloc {
            id: 1,
            size: 100,
            stream: 2,
            device: 0
        }));
        let one = SnapshotOptions {
            device: Some(2),
            ..SnapshotOptions::default()
        };
        let ops = read_snapshot(&trace, &one).unwrap().ops;
        assert_eq!(
            ops,
            vec![TraceOp::Alloc {
                id: 0,
                size: 300,
                stream: 0,
                device: 0
            }]
        );
        let missing = SnapshotOptions {
            device: Some(5),
            ..SnapshotOptions::default()
        };
        assert!(read_snapshot(&trace, &missing)
            .unwrap_err()
            .message
            .contains("--device 5"));
    }

    #[test]
    fn bad_entries_are_named_by_place() {
        let cases = [
            (json!([1, 2]), "not a memory snapshot"),
            (json!({"foo": 1}), "not a memory snapshot: no \"device_traces\""),
            (json!({"device_traces": 3}), "\"device_traces\" must be a list"),
            (json!({"device_traces": [[]]}), "the snapshot has no allocation history"),
            (json!({"device_traces": [[entry("alloc", 1, 5, 0), 7]]}), "device_traces[0][1]: not a dict"),
            (json!({"device_traces": [[{"addr": 1}]]}), "device_traces[0][0]: missing \"action\""),
            (json!({"device_traces": [[entry("grow", 1, 5, 0)]]}), "device_traces[0][0]: unknown action \"grow\""),
            (json!({"device_traces": [[entry("alloc", 1, -5, 0)]]}), "device_traces[0][0]: \"size\" must not be negative, got -5"),
            (json!({"device_traces": [[{"action": "alloc", "size": 5}]]}), "device_traces[0][0]: missing \"addr\""),
            (
                json!({"device_traces": [[entry("alloc", 16, 5, 0), entry("alloc", 16, 5, 0)]]}),
                "device_traces[0][1]: alloc at address 0x10, which is allocated since device_traces[0][0]",
            ),
            (
                json!({"device_traces": [[entry("alloc", 16, 5, 0)]], "segments": [{"blocks": [{"state": "active_allocated", "size": "x"}]}]}),
                "segments[0]: blocks[0]: missing \"address\"",
            ),
        ];
        for (snapshot, expected) in cases {
            let message = read_snapshot(&snapshot, &SnapshotOptions::default())
                .unwrap_err()
                .message;
            assert!(message.starts_with(expected), "{message} / {expected}");
        }
    }

    #[test]
    fn a_pools_segments_route_their_allocations_back_to_the_pool() {
        use crate::backend::simulated::SimulatedBackend;
        use crate::caching::StatType;
        let pool = (0, 1);
        let call = |call| TraceOp::Pool {
            pool,
            device: 0,
            call,
        };
        let alloc = |id, size| TraceOp::Alloc {
            id,
            size,
            stream: 0,
            device: 0,
        };
        // One allocation in the pool, two outside it, all live at the end.
        let ops = vec![
            call(PoolCall::Create {
                use_on_oom: false,
                no_split: false,
            }),
            call(PoolCall::Begin { stream: None }),
            alloc(0, 1000),
            call(PoolCall::End),
            alloc(1, 1000),
            alloc(2, 2000),
        ];
        let backend = || Arc::new(SimulatedBackend::new(1, 1 << 30)) as Arc<dyn Backend>;
        let config = CachingConfig::default();
        let snapshot = snapshot_of_trace(&ops, backend(), &config).unwrap();
        let import = read_snapshot(&snapshot, &SnapshotOptions::default()).unwrap();
        assert_eq!(import.pool_allocs, 1);
        assert_eq!(
            import.ops[..5],
            [
                call(PoolCall::Create {
                    use_on_oom: false,
                    no_split: false
                }),
                call(PoolCall::Begin { stream: None }),
                alloc(0, 1000),
                call(PoolCall::End),
                call(PoolCall::Release),
            ]
        );
        // The replay of the import holds the pool's segment apart, as the program did: two
        // segments, where one would serve all three blocks without the pool.
        let segments = |ops: &[TraceOp]| {
            let report = super::super::session::replay(ops, backend(), &config).unwrap();
            report.device_stats[0].segment[StatType::All as usize]
        };
        assert_eq!(segments(&import.ops), segments(&ops));
        assert_eq!(segments(&import.ops).peak, 2);
    }
}
