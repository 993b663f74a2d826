//! The pinned host caching allocator: PyTorch's CachingHostAllocator (the allocator behind
//! `pin_memory=True`, non-blocking copies and `torch.accelerator.empty_host_cache()`) over any
//! backend's pinned host memory.
//!
//! PyTorch's rules: a request is rounded up to a power of two and served from that power's free
//! list, newest block first, with no splitting; a miss allocates a new block from the backend. A
//! block used by other streams (`record_stream`) is reusable only once an event recorded on each of
//! those streams at its free has completed; events are processed oldest first, stopping at the first
//! not yet complete, at every allocation and at `empty_cache`. `empty_cache` gives every free cached
//! block back. The statistics are `torch.cuda.host_memory_stats()`'s, moving as PyTorch 2.15's do:
//! the active figures are kept per power of two and summed, peaks included (PyTorch's own
//! approximation of the true peak, kept for exactness).
//!
//! Not thread-safe by itself: the runtime keeps one per accelerator behind a mutex.

use crate::backend::{Backend, BackendError, EventId, StreamId};
use crate::caching::config::CachingConfig;
use crate::caching::stats::Stat;
use crate::error::{Error, ErrorKind, Result};
use crate::units::format_size;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::Arc;
use std::time::Instant;

/// One free list per power of two a block size can have (2^0 to 2^64).
const BUCKETS: usize = 65;

/// PyTorch's DurationStat: time spent in the backend's pinned allocation or free calls, in
/// microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurationStat {
    pub total: i64,
    pub max: i64,
    /// The smallest call's time (0 until a call was timed, and again after a peak reset).
    pub min: i64,
    pub count: i64,
}

impl DurationStat {
    fn record(&mut self, micros: i64) {
        self.total += micros;
        self.count += 1;
        self.max = self.max.max(micros);
        self.min = if self.min == 0 {
            micros
        } else {
            self.min.min(micros)
        };
    }

    /// total / count, 0 before the first call.
    pub fn avg(&self) -> i64 {
        if self.count == 0 {
            0
        } else {
            self.total / self.count
        }
    }

    fn reset_accumulated(&mut self) {
        self.total = 0;
        self.count = 0;
    }

    fn reset_peak(&mut self) {
        self.min = 0;
        self.max = 0;
    }
}

/// The figures of `torch.cuda.host_memory_stats()`, plus accalloc's page_locked_bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Blocks the cache holds, handed out or cached.
    pub allocations: Stat,
    /// Their bytes (rounded sizes).
    pub allocated_bytes: Stat,
    /// Blocks handed out and not yet reusable.
    pub active_requests: Stat,
    /// Their bytes.
    pub active_bytes: Stat,
    /// Backend allocations made (allocations.allocated).
    pub num_host_alloc: i64,
    /// Backend frees made (allocations.freed).
    pub num_host_free: i64,
    pub host_alloc_time: DurationStat,
    pub host_free_time: DurationStat,
    /// Bytes of the blocks held that the system page-locked (the rest of allocated_bytes is
    /// ordinary memory: the host backend's fallback where mlock is refused). accalloc's own figure.
    pub page_locked_bytes: i64,
}

/// The names of the statistics, in the order `HostStats::entries` gives them (sorted, as PyTorch's
/// dict is).
impl HostStats {
    /// Every figure as (key, value), keys as torch.cuda.host_memory_stats() names them, sorted.
    pub fn entries(&self) -> Vec<(String, i64)> {
        let mut out = Vec::with_capacity(34);
        for (family, stat) in [
            ("active_bytes", &self.active_bytes),
            ("active_requests", &self.active_requests),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocations", &self.allocations),
        ] {
            for (field, value) in stat.fields() {
                out.push((format!("{family}.{field}"), value));
            }
        }
        for (family, stat) in [
            ("host_alloc_time", &self.host_alloc_time),
            ("host_free_time", &self.host_free_time),
        ] {
            for (field, value) in [
                ("avg", stat.avg()),
                ("count", stat.count),
                ("max", stat.max),
                ("min", stat.min),
                ("total", stat.total),
            ] {
                out.push((format!("{family}.{field}"), value));
            }
        }
        out.push(("num_host_alloc".into(), self.num_host_alloc));
        out.push(("num_host_free".into(), self.num_host_free));
        out.push(("page_locked_bytes".into(), self.page_locked_bytes));
        out.sort();
        out
    }

    /// One figure by its key, None for a key that is not one.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.entries()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// The figures as one JSON object, keys sorted.
    pub fn to_json(&self) -> String {
        let mut text = String::from("{");
        for (i, (key, value)) in self.entries().iter().enumerate() {
            let _ = write!(text, "{}\"{key}\":{value}", if i == 0 { "" } else { "," });
        }
        text.push('}');
        text
    }
}

/// A block of pinned host memory: handed out, waiting for events, or cached in its free list.
#[derive(Debug)]
struct HostBlock {
    /// The rounded size, as asked of the backend.
    size: usize,
    allocated: bool,
    /// Events recorded at its free and not yet seen complete.
    event_count: usize,
    /// Streams that used it while handed out: (device, stream).
    streams: Vec<(usize, StreamId)>,
    page_locked: bool,
}

/// Per power of two: PyTorch keeps the active figures per free list and sums them.
#[derive(Clone, Copy, Debug, Default)]
struct BucketStats {
    active: Stat,
    active_bytes: Stat,
}

/// The pinned host caching allocator of one backend.
pub struct PinnedHostCache {
    backend: Arc<dyn Backend>,
    /// Every block held, by address.
    blocks: BTreeMap<usize, HostBlock>,
    /// Free blocks by power of two, the newest last.
    free_lists: Vec<Vec<usize>>,
    /// Events recorded at frees, the newest at the front: (device, event, block address).
    events: VecDeque<(usize, EventId, usize)>,
    allocations: Stat,
    allocated_bytes: Stat,
    buckets: Vec<BucketStats>,
    host_alloc_time: DurationStat,
    host_free_time: DurationStat,
    page_locked_bytes: i64,
    /// pinned_max_round_threshold and pinned_max_cached_size of the settings (configure).
    round_threshold: usize,
    max_cached_size: usize,
}

/// The free list of a block of `size` bytes: ceil(log2(size)).
fn bucket(size: usize) -> usize {
    size.next_power_of_two().trailing_zeros() as usize
}

fn micros_since(start: Instant) -> i64 {
    i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX)
}

impl PinnedHostCache {
    /// An empty cache over `backend`; NotSupported when the backend has no pinned host memory.
    pub fn new(backend: Arc<dyn Backend>) -> Result<Self> {
        if !backend.pinned_host_supported() {
            return Err(Error::new(
                ErrorKind::NotSupported,
                format!(
                    "the {} backend has no pinned host memory (pinned_host_alloc is not provided)",
                    backend.name()
                ),
            ));
        }
        Ok(PinnedHostCache {
            backend,
            blocks: BTreeMap::new(),
            free_lists: vec![Vec::new(); BUCKETS],
            events: VecDeque::new(),
            allocations: Stat::default(),
            allocated_bytes: Stat::default(),
            buckets: vec![BucketStats::default(); BUCKETS],
            host_alloc_time: DurationStat::default(),
            host_free_time: DurationStat::default(),
            page_locked_bytes: 0,
            round_threshold: usize::MAX,
            max_cached_size: usize::MAX,
        })
    }

    /// Take the pinned_ settings (pinned_max_round_threshold_mb, pinned_max_cached_size_mb) from
    /// `config`; blocks already held keep their sizes.
    pub fn configure(&mut self, config: &CachingConfig) {
        self.round_threshold = config.pinned_max_round_threshold;
        self.max_cached_size = config.pinned_max_cached_size;
    }

    /// Hand out a block of at least `size` bytes: its address, or 0 for a 0-byte request (PyTorch's
    /// nullptr). A miss that the backend cannot serve gives the cached blocks back and tries once
    /// more before failing as out of memory.
    pub fn allocate(&mut self, size: usize) -> Result<usize> {
        if size == 0 {
            return Ok(0);
        }
        self.process_events();
        // PyTorch's rule: a power of two, unless the request is above either pinned_ limit.
        let rounded = if size <= self.round_threshold && size <= self.max_cached_size {
            match size.checked_next_power_of_two() {
                Some(rounded) => rounded,
                None => return Err(self.out_of_memory(size, "larger than any power of two")),
            }
        } else {
            size
        };
        if let Some(ptr) = self.take_free_block(rounded) {
            return Ok(ptr);
        }
        let allocation = match self.backend_alloc(rounded) {
            Err(BackendError::OutOfMemory) => {
                let _ = self.empty_cache();
                self.backend_alloc(rounded)
            }
            other => other,
        };
        let allocation = match allocation {
            Ok(allocation) => allocation,
            Err(BackendError::OutOfMemory) => {
                return Err(self.out_of_memory(size, "the backend has no more"))
            }
            Err(error) => {
                return Err(Error::new(
                    ErrorKind::Backend,
                    format!(
                        "{} backend: pinned_host_alloc of {} failed: {error}",
                        self.backend.name(),
                        format_size(rounded as u64)
                    ),
                ))
            }
        };
        let ptr = allocation.ptr;
        if ptr == 0 || self.blocks.contains_key(&ptr) {
            // Give it back rather than hand out an address twice.
            let _ = self.backend.pinned_host_free(ptr, rounded);
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "{} backend: pinned_host_alloc returned {ptr:#x}, which is {}",
                    self.backend.name(),
                    if ptr == 0 {
                        "NULL"
                    } else {
                        "already handed out"
                    }
                ),
            ));
        }
        self.blocks.insert(
            ptr,
            HostBlock {
                size: rounded,
                allocated: true,
                event_count: 0,
                streams: Vec::new(),
                page_locked: allocation.page_locked,
            },
        );
        self.allocations.increase(1);
        self.allocated_bytes.increase(rounded as u64);
        if allocation.page_locked {
            self.page_locked_bytes += rounded as i64;
        }
        let bucket = &mut self.buckets[bucket(rounded)];
        bucket.active.increase(1);
        bucket.active_bytes.increase(rounded as u64);
        Ok(ptr)
    }

    fn backend_alloc(
        &mut self,
        size: usize,
    ) -> std::result::Result<crate::backend::PinnedHostAllocation, BackendError> {
        let start = Instant::now();
        let result = self.backend.pinned_host_alloc(size);
        if result.is_ok() {
            self.host_alloc_time.record(micros_since(start));
        }
        result
    }

    fn out_of_memory(&self, size: usize, why: &str) -> Error {
        Error::new(
            ErrorKind::OutOfMemory,
            format!(
                "pinned host memory: tried to allocate {} on the {} backend: {why} ({} held by \
                 the cache, {} of it handed out)",
                format_size(size as u64),
                self.backend.name(),
                format_size(self.allocated_bytes.current as u64),
                format_size(self.active_bytes() as u64),
            ),
        )
    }

    fn active_bytes(&self) -> i64 {
        self.buckets.iter().map(|b| b.active_bytes.current).sum()
    }

    /// The newest free block of at least `rounded` bytes in its power's list, handed out.
    fn take_free_block(&mut self, rounded: usize) -> Option<usize> {
        let index = bucket(rounded);
        let list = &mut self.free_lists[index];
        let at = list
            .iter()
            .rposition(|ptr| self.blocks.get(ptr).is_some_and(|b| b.size >= rounded))?;
        let ptr = list.remove(at);
        let block = self
            .blocks
            .get_mut(&ptr)
            .expect("a free-listed block is held");
        block.allocated = true;
        let size = block.size;
        let bucket = &mut self.buckets[index];
        bucket.active.increase(1);
        bucket.active_bytes.increase(size as u64);
        Some(ptr)
    }

    /// The block `ptr` was handed out as is given back. It becomes reusable at once, or, where other
    /// streams used it, once an event recorded now on each of them has completed.
    pub fn free(&mut self, ptr: usize) -> Result<()> {
        let Some(block) = self.blocks.get_mut(&ptr) else {
            return Err(Error::invalid_pointer(format!(
                "{ptr:#x} is not pinned host memory from accalloc's {} backend",
                self.backend.name()
            )));
        };
        if !block.allocated {
            return Err(Error::invalid_pointer(format!(
                "{ptr:#x} is pinned host memory that is not handed out (freed twice?)"
            )));
        }
        if block.streams.is_empty() {
            block.allocated = false;
            self.cache_block(ptr);
            return Ok(());
        }
        // Every stream's event first: where one cannot be had, the free is refused as a whole and
        // may be retried, as accalloc_free does for device blocks (PyTorch instead keeps such a
        // block out of reuse for good).
        let streams = block.streams.clone();
        let mut recorded = Vec::with_capacity(streams.len());
        for (device, stream) in streams {
            match self.record_free_event(device, stream) {
                Ok(Some(event)) => recorded.push((device, event)),
                Ok(None) => {} // the stream was synchronized: nothing to wait for
                Err(why) => {
                    for (device, event) in recorded {
                        let _ = self.backend.destroy_event(device, event);
                    }
                    return Err(Error::new(
                        ErrorKind::Backend,
                        format!(
                            "the pinned host block at {ptr:#x} was not freed: its use by stream \
                             {stream:#x} of device {device} can be neither recorded nor waited for \
                             ({why}); it is still handed out (free it again)"
                        ),
                    ));
                }
            }
        }
        let block = self.blocks.get_mut(&ptr).expect("held");
        block.allocated = false;
        block.streams.clear();
        block.event_count += recorded.len();
        let reusable = block.event_count == 0;
        for (device, event) in recorded {
            self.events.push_front((device, event, ptr));
        }
        if reusable {
            self.cache_block(ptr);
        }
        Ok(())
    }

    /// An event recorded on `stream` of `device`, or None where the backend has no events and the
    /// stream was synchronized instead.
    fn record_free_event(
        &mut self,
        device: usize,
        stream: StreamId,
    ) -> std::result::Result<Option<EventId>, String> {
        let backend = &*self.backend;
        let synchronize = || {
            backend
                .synchronize_stream(device, stream)
                .map(|()| None)
                .map_err(|e| format!("synchronize_stream: {e}"))
        };
        if !backend.events_supported() {
            return synchronize();
        }
        let event = match backend.create_event(device) {
            Ok(event) => event,
            Err(e) => return synchronize().map_err(|s| format!("create_event: {e}; {s}")),
        };
        match backend.record_event(device, event, stream) {
            Ok(()) => Ok(Some(event)),
            Err(e) => {
                let _ = backend.destroy_event(device, event);
                synchronize().map_err(|s| format!("record_event: {e}; {s}"))
            }
        }
    }

    /// A block that no stream still uses stops counting as active and goes to its free list, or,
    /// above pinned_max_cached_size, back to the backend (where the backend refuses, it is cached:
    /// empty_cache tries again).
    fn cache_block(&mut self, ptr: usize) {
        let size = self.blocks[&ptr].size;
        let index = bucket(size);
        let bucket = &mut self.buckets[index];
        bucket.active.decrease(1);
        bucket.active_bytes.decrease(size as u64);
        if size > self.max_cached_size && self.give_back(ptr).is_ok() {
            return;
        }
        self.free_lists[index].push(ptr);
    }

    /// Free the block at `ptr` (not in a free list) with the backend and take it off the books.
    fn give_back(&mut self, ptr: usize) -> std::result::Result<(), BackendError> {
        let size = self.blocks[&ptr].size;
        let start = Instant::now();
        self.backend.pinned_host_free(ptr, size)?;
        self.host_free_time.record(micros_since(start));
        let block = self.blocks.remove(&ptr).expect("held");
        self.allocations.decrease(1);
        self.allocated_bytes.decrease(size as u64);
        if block.page_locked {
            self.page_locked_bytes -= size as i64;
        }
        Ok(())
    }

    /// Look at the pending events oldest first, up to the first that has not completed; a block
    /// whose last event completed becomes reusable. An event the backend cannot query stays
    /// pending (its block is not reused on a guess).
    fn process_events(&mut self) {
        while let Some(&(device, event, ptr)) = self.events.back() {
            if self.backend.query_event(device, event) != Ok(true) {
                return;
            }
            self.events.pop_back();
            let _ = self.backend.destroy_event(device, event);
            let block = self
                .blocks
                .get_mut(&ptr)
                .expect("a block waits for its events");
            block.event_count -= 1;
            if block.event_count == 0 {
                self.cache_block(ptr);
            }
        }
    }

    /// `stream` of `device` uses the block that `ptr` lies in (any address inside it): its reuse
    /// waits for that stream's work queued before the block's free. Ok(false) where `ptr` is not
    /// in pinned memory of this cache (PyTorch's record_event answers false then too).
    pub fn record_stream(&mut self, ptr: usize, device: usize, stream: StreamId) -> Result<bool> {
        let Some((&start, block)) = self.blocks.range_mut(..=ptr).next_back() else {
            return Ok(false);
        };
        if ptr >= start + block.size {
            return Ok(false);
        }
        if !block.allocated {
            return Err(Error::invalid_pointer(format!(
                "{ptr:#x} lies in pinned host memory that is not handed out"
            )));
        }
        if device >= self.backend.device_count() {
            return Err(Error::invalid_device(format!(
                "device {device} does not exist: the {} backend has {}",
                self.backend.name(),
                self.backend.device_count()
            )));
        }
        if !self.backend.events_supported() && !self.backend.stream_synchronize_supported() {
            return Err(Error::new(
                ErrorKind::NotSupported,
                format!(
                    "the {} backend has neither events nor stream synchronization: a stream's \
                     use of pinned memory cannot be waited for",
                    self.backend.name()
                ),
            ));
        }
        if !block.streams.contains(&(device, stream)) {
            block.streams.push((device, stream));
        }
        Ok(true)
    }

    /// Whether `ptr` lies in a block of this cache (handed out or cached).
    pub fn contains(&self, ptr: usize) -> bool {
        self.blocks
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&start, block)| ptr < start + block.size)
    }

    /// Give every free cached block back to the backend, after processing the pending events. A
    /// block the backend refuses to free stays cached and counted; the first refusal is reported
    /// after the others were tried.
    pub fn empty_cache(&mut self) -> Result<()> {
        self.process_events();
        let mut first_error = None;
        for index in 0..BUCKETS {
            let list = std::mem::take(&mut self.free_lists[index]);
            for ptr in list {
                let size = self.blocks[&ptr].size;
                match self.give_back(ptr) {
                    Ok(()) => {}
                    Err(error) => {
                        self.free_lists[index].push(ptr);
                        first_error.get_or_insert_with(|| {
                            Error::new(
                                ErrorKind::Backend,
                                format!(
                                    "{} backend: pinned_host_free of {ptr:#x} ({}) failed, the \
                                     block stays cached: {error}",
                                    self.backend.name(),
                                    format_size(size as u64)
                                ),
                            )
                        });
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The figures, as torch.cuda.host_memory_stats() gives them.
    pub fn stats(&self) -> HostStats {
        let mut stats = HostStats {
            allocations: self.allocations,
            allocated_bytes: self.allocated_bytes,
            num_host_alloc: self.allocations.allocated,
            num_host_free: self.allocations.freed,
            host_alloc_time: self.host_alloc_time,
            host_free_time: self.host_free_time,
            page_locked_bytes: self.page_locked_bytes,
            ..HostStats::default()
        };
        for bucket in &self.buckets {
            for (sum, part) in [
                (&mut stats.active_requests, &bucket.active),
                (&mut stats.active_bytes, &bucket.active_bytes),
            ] {
                sum.current += part.current;
                sum.peak += part.peak;
                sum.allocated += part.allocated;
                sum.freed += part.freed;
            }
        }
        stats
    }

    /// reset_accumulated_host_memory_stats: the running totals and the timing sums start again.
    pub fn reset_accumulated_stats(&mut self) {
        self.allocations.reset_accumulated();
        self.allocated_bytes.reset_accumulated();
        for bucket in &mut self.buckets {
            bucket.active.reset_accumulated();
            bucket.active_bytes.reset_accumulated();
        }
        self.host_alloc_time.reset_accumulated();
        self.host_free_time.reset_accumulated();
    }

    /// reset_peak_host_memory_stats: every peak becomes the current value; the timing extremes
    /// start again.
    pub fn reset_peak_stats(&mut self) {
        self.allocations.reset_peak();
        self.allocated_bytes.reset_peak();
        for bucket in &mut self.buckets {
            bucket.active.reset_peak();
            bucket.active_bytes.reset_peak();
        }
        self.host_alloc_time.reset_peak();
        self.host_free_time.reset_peak();
    }

    /// Recount every figure from the blocks and compare (tests and fuzzing).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let held: i64 = self.blocks.values().map(|b| b.size as i64).sum();
        let active: Vec<&HostBlock> = self
            .blocks
            .values()
            .filter(|b| b.allocated || b.event_count > 0)
            .collect();
        let free: usize = self.free_lists.iter().map(Vec::len).sum();
        let checks = [
            (
                "allocations",
                self.allocations.current,
                self.blocks.len() as i64,
            ),
            ("allocated_bytes", self.allocated_bytes.current, held),
            (
                "active_requests",
                self.buckets.iter().map(|b| b.active.current).sum(),
                active.len() as i64,
            ),
            (
                "active_bytes",
                self.active_bytes(),
                active.iter().map(|b| b.size as i64).sum(),
            ),
            (
                "free blocks",
                free as i64,
                (self.blocks.len() - active.len()) as i64,
            ),
            (
                "pending events",
                self.events.len() as i64,
                self.blocks.values().map(|b| b.event_count as i64).sum(),
            ),
        ];
        for (what, counted, recounted) in checks {
            if counted != recounted {
                return Err(format!(
                    "{what}: books say {counted}, blocks say {recounted}"
                ));
            }
        }
        Ok(())
    }
}

impl Drop for PinnedHostCache {
    /// Cached blocks go back to the backend; blocks still handed out stay with their holders.
    fn drop(&mut self) {
        let _ = self.empty_cache();
    }
}

#[cfg(test)]
mod tests;
