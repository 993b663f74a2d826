//! The caching allocator of one device: PyTorch's DeviceCachingAllocator, over any `Backend`.
//!
//! Not thread-safe by itself: the runtime keeps one behind a mutex per device.
//!
//! This file: the allocator's state, malloc and free, best fit, split and merge. Beside it:
//! `segments` (the miss path and releasing segments), `events` (streams), `gc` (garbage
//! collection), `inspect` (figures, segments, history), `checkpoint` (a pool's layout put back).

mod checkpoint;
mod events;
mod expandable;
mod gc;
mod inspect;
mod invariants;
mod metadata;
mod observers;
mod parking;
mod planned;
mod private_pools;
mod segments;
mod sleep;

use super::block::{Block, BlockId, BlockPool, PoolIndex, PtrMap, Slab, DEFAULT_POOLS};
use super::config::CachingConfig;
use super::policy::{allocation_size, round_size, should_split, PoolKind};
use super::pools::PrivatePools;
use super::snapshot::{BlockInfo, BlockState, History, SegmentInfo, TraceAction};
use super::stats::{DeviceStats, LiveStats, StatType};
use crate::backend::{Backend, BackendError, EventId, MemInfo, StreamId};
use crate::error::{Error, ErrorKind, Result};
use crate::units::format_size;
use expandable::LARGE_PAGE;
use segments::{SegmentRetry, SegmentTry};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

pub use checkpoint::{CheckpointBlock, CheckpointSegment, PoolCheckpoint, Restored};

/// What `malloc_begin` decided.
#[derive(Debug)]
pub enum MallocStep {
    /// The block at this address is handed out.
    Done(usize),
    /// A new segment is needed: ask the backend for it, then call `malloc_finish`.
    NeedSegment(SegmentRequest),
}

/// A segment a malloc waits for.
#[derive(Clone, Copy, Debug)]
pub struct SegmentRequest {
    /// Bytes to ask the backend for.
    pub size: usize,
    /// The stream the segment is for.
    pub stream: StreamId,
    requested: usize,
    rounded: usize,
    pool: PoolKind,
    private: PoolIndex,
    /// Which of PyTorch's three tries this is (`segments::SegmentTry`).
    attempt: SegmentTry,
}

/// One device's caching allocator.
pub struct CachingAllocator {
    backend: Arc<dyn Backend>,
    device: usize,
    config: CachingConfig,
    /// The device's total memory, read once: a segment larger than this can never be had.
    capacity: usize,
    blocks: Slab,
    small: BlockPool,
    large: BlockPool,
    /// Blocks handed out and not yet freed, by address.
    active: PtrMap,
    stats: LiveStats,
    /// Bytes of all segments held from the backend (PyTorch's total_allocated_memory).
    reserved_total: usize,
    /// Bytes of segments being asked for without the lock (release_lock_on_malloc): the memory
    /// fraction counts them as reserved already, so that threads cannot overshoot it together.
    reserving_unlocked: usize,
    /// Set by set_memory_fraction: reserved memory may not grow past this.
    allowed_maximum: Option<usize>,
    /// Streams other than its own that use a live block (accalloc_record_stream).
    stream_uses: HashMap<BlockId, Vec<StreamId>>,
    /// Events recorded when such a block was freed, per stream in record order.
    pending_events: BTreeMap<StreamId, VecDeque<(EventId, BlockId)>>,
    /// Recent allocator events, when recording is on (accalloc_record_memory_history).
    history: Option<History>,
    /// Reserved address ranges of expandable segments; blocks refer to them by index.
    expandable: Vec<expandable::ExpandableSegment>,
    /// Private pools (MemPool, graph pools) and the routing of allocations to them: boxed, so that
    /// the hot path's fields stay together; `routing` mirrors whether any pool is begun, or frees
    /// deferred by a capture wait for their events (either sends malloc past the cached path).
    private_pools: Box<PrivatePools>,
    routing: bool,
    /// Whether a capture (a pool begun for a stream) is underway.
    capturing: bool,
    /// The segment observer and the OOM reports waiting for the runtime.
    observers: Box<observers::Observers>,
    /// planned_placement's planner (see planned.rs); while there is one, malloc passes the cached
    /// path and free tells it.
    planner: Option<Box<crate::planning::online::OnlinePlanner>>,
    /// The default pool whose expandable segment the plan in force lies in.
    plan_pool: PoolKind,
    /// The most allocated (all pools) during the plan's pass under way, and during the pass before
    /// it: what a pass's end keeps mapped for the next (`keeps_pages_at_pass_end`).
    pass_allocated_peaks: [usize; 2],
    /// A large step's plan being placed off the request path (planned.rs), and the steps that
    /// big (PLAN_OFF_PATH_FROM; the tests set less, and may place it on the calling thread).
    plan_in_making: Option<Box<planned::PlanInMaking>>,
    /// Placements no one wants any more, kept until their threads have finished.
    retired_workers: Vec<planned::Worker>,
    plan_off_path_from: usize,
    #[cfg(test)]
    plan_off_path_inline: bool,
    #[cfg(test)]
    plans_placed_off_path_used: usize,
    /// Requests `malloc_parked` served.
    #[cfg(test)]
    served_parked_first: usize,
    /// Where blocks were parked lately, (address, block) by a hash of the address: a guess that
    /// spares a planned request the address index lookup (allocator/parking.rs). Empty until a
    /// block parks.
    parked_hints: Vec<(usize, BlockId)>,
    /// The parts cut off parked blocks that have no address index entry yet (`Block::unindexed`;
    /// the list may name blocks entered or gone since), and how many blocks are unindexed.
    unindexed_rests: Vec<BlockId>,
    unindexed: usize,
    /// Tests turn parking off to show that it changes no figure (planned_tests.rs).
    #[cfg(test)]
    parking_off: bool,
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        self.release_reservations();
    }
}

impl CachingAllocator {
    /// A fresh allocator for `device` of `backend`.
    pub fn new(backend: Arc<dyn Backend>, device: usize, config: CachingConfig) -> Result<Self> {
        let capacity = backend
            .mem_get_info(device)
            .map_err(|e| backend_error(&*backend, device, "mem_get_info", e))?
            .total;
        let mut allocator = CachingAllocator {
            backend,
            device,
            config: CachingConfig::default(),
            capacity,
            blocks: Slab::default(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            active: PtrMap::default(),
            stats: LiveStats::default(),
            reserved_total: 0,
            reserving_unlocked: 0,
            allowed_maximum: None,
            stream_uses: HashMap::new(),
            pending_events: BTreeMap::new(),
            history: None,
            expandable: Vec::new(),
            private_pools: Box::default(),
            routing: false,
            capturing: false,
            observers: Box::default(),
            planner: None,
            plan_pool: PoolKind::Large,
            pass_allocated_peaks: [0; 2],
            plan_in_making: None,
            retired_workers: Vec::new(),
            plan_off_path_from: planned::PLAN_OFF_PATH_FROM,
            #[cfg(test)]
            plan_off_path_inline: false,
            #[cfg(test)]
            plans_placed_off_path_used: 0,
            #[cfg(test)]
            served_parked_first: 0,
            parked_hints: Vec::new(),
            unindexed_rests: Vec::new(),
            unindexed: 0,
            #[cfg(test)]
            parking_off: false,
        };
        allocator.set_config(config);
        Ok(allocator)
    }

    pub fn device(&self) -> usize {
        self.device
    }

    pub fn config(&self) -> &CachingConfig {
        &self.config
    }

    /// Replace the policy settings; cached blocks stay where they are. A per_process_memory_fraction
    /// in them becomes this device's memory fraction. Expandable segments asked of a backend that
    /// cannot grow them are off for this device, every rule of theirs included (the split rule, the
    /// best fit), as PyTorch's `expandable_segments()` answers false where the platform lacks them.
    pub fn set_config(&mut self, mut config: CachingConfig) {
        if let Some(fraction) = config.per_process_memory_fraction {
            self.allowed_maximum = allowed_bytes(fraction, self.capacity);
        }
        // Planned placement places blocks in the default pools' expandable segments.
        config.expandable_segments |= config.planned_placement;
        if config.expandable_segments
            && !(self.virtual_memory_available() && self.reservation_size(LARGE_PAGE).is_some())
        {
            config.expandable_segments = false;
            config.planned_placement = false;
        }
        match (config.planned_placement, self.planner.is_some()) {
            (true, false) => {
                self.planner = Some(Box::default());
                // A new planner's passes start their own count.
                self.pass_allocated_peaks = [0; 2];
            }
            (false, true) => {
                // The policy alone serves from here: it sees no parked block.
                self.unpark_all();
                self.planner = None;
                // A plan being made is no one's now: its thread is let finish.
                self.let_go_plan_in_making();
            }
            _ => {}
        }
        self.config = config;
        self.verify("set_config");
    }

    /// Hand out a block of at least `size` bytes (size > 0) for use on `stream`.
    pub fn malloc(&mut self, size: usize, stream: StreamId) -> Result<usize> {
        if let Some(ptr) = self.malloc_cached(size, stream) {
            return Ok(ptr);
        }
        match self.malloc_begin(size, stream)? {
            MallocStep::Done(ptr) => Ok(ptr),
            MallocStep::NeedSegment(mut request) => loop {
                let raw = self
                    .backend
                    .raw_alloc(self.device, request.size, request.stream);
                match self.malloc_finish(request, raw)? {
                    MallocStep::Done(ptr) => return Ok(ptr),
                    MallocStep::NeedSegment(next) => request = next,
                }
            },
        }
    }

    /// malloc when a cached block fits: its address, or None (nothing changed) when the request
    /// needs the full path of `malloc_begin` (events to process, garbage collection on, or no cached
    /// block fits). The common case answers with a plain address, not a MallocStep in a Result.
    /// With planned_placement on, the common case is the block parked at the planned address
    /// (`malloc_parked`).
    #[inline]
    pub fn malloc_cached(&mut self, size: usize, stream: StreamId) -> Option<usize> {
        if self.planner.is_some() {
            return self.malloc_parked(size, stream);
        }
        // Garbage collection counts lookups, so a failed try here would count twice.
        if size == 0
            || !self.pending_events.is_empty()
            || self.garbage_collection_on()
            || self.routing
        {
            return None;
        }
        let rounded = round_size(size, &self.config)?;
        let id =
            self.take_free_block(DEFAULT_POOLS, PoolKind::for_size(rounded), stream, rounded)?;
        let ptr = self.hand_out_found(id, rounded, size);
        self.verify("malloc");
        Some(ptr)
    }

    /// malloc up to the point where a new segment is needed. With release_lock_on_malloc set, the
    /// caller asks the backend for that segment without holding this device's lock (device
    /// allocations can take milliseconds) and passes the answer to `malloc_finish`; otherwise the
    /// whole request is served here.
    #[inline]
    pub fn malloc_begin(&mut self, size: usize, stream: StreamId) -> Result<MallocStep> {
        let result = if self.planner.is_some() {
            self.malloc_with_plan(size, stream)
        } else {
            self.malloc_begin_unchecked(size, stream)
        };
        self.verify("malloc");
        result
    }

    #[inline]
    fn malloc_begin_unchecked(&mut self, size: usize, stream: StreamId) -> Result<MallocStep> {
        debug_assert!(size > 0);
        // Its pools and growth chains know nothing of parked blocks (allocator/parking.rs).
        debug_assert!(!self.any_parked(), "the policy runs with a block parked");
        // While a capture is underway, events are not processed here, as in PyTorch.
        let private = if self.routing {
            self.private_pools.route(stream)
        } else {
            DEFAULT_POOLS
        };
        if !self.capturing {
            if !self.private_pools.deferred_frees.is_empty() {
                self.insert_deferred_events()?;
            }
            if !self.pending_events.is_empty() {
                self.process_events()?;
            }
        }
        let rounded = round_size(size, &self.config);
        let alloc_size = rounded.and_then(allocation_size);
        let (Some(rounded), Some(alloc_size)) = (rounded, alloc_size) else {
            // A size so large that its rounding overflows: nothing could hold it.
            return Err(self.out_of_memory(size, size, stream));
        };
        let pool = PoolKind::for_size(rounded);
        if private != DEFAULT_POOLS && self.pool_paused(private) {
            return Err(self.paused_pool_refusal(private));
        }

        let id = match self.take_free_block(private, pool, stream, rounded) {
            Some(id) => id,
            // No segment of this size could ever fit the device: fail without flushing the cache
            // (still an OOM, counted as PyTorch counts it).
            None if alloc_size > self.capacity => {
                return Err(self.out_of_memory(alloc_size, rounded, stream))
            }
            None if self.config.release_lock_on_malloc
                && !self.grows_expandable()
                && private == DEFAULT_POOLS =>
            {
                if self.garbage_collection_on() {
                    self.garbage_collect_cached_blocks()?;
                }
                if self.within_fraction(alloc_size) {
                    self.reserving_unlocked += alloc_size;
                    return Ok(MallocStep::NeedSegment(SegmentRequest {
                        size: alloc_size,
                        stream,
                        requested: size,
                        rounded,
                        pool,
                        private,
                        attempt: SegmentTry::First,
                    }));
                }
                self.allocate_after_first_failure(private, pool, stream, rounded, alloc_size)?
            }
            None => {
                self.allocate_segment_with_fallbacks(private, pool, stream, rounded, alloc_size)?
            }
        };
        Ok(MallocStep::Done(self.hand_out_found(id, rounded, size)))
    }

    /// Go on with a malloc that needed a segment, given the backend's answer to `request`: the
    /// block handed out, or, where the device had no room, the next segment to ask for without the
    /// lock after releasing cached memory (PyTorch asks for each of its three tries unlocked), to be
    /// finished the same way.
    pub fn malloc_finish(
        &mut self,
        request: SegmentRequest,
        raw: std::result::Result<usize, BackendError>,
    ) -> Result<MallocStep> {
        let result = self.malloc_finish_unchecked(request, raw);
        self.verify("malloc");
        result
    }

    fn malloc_finish_unchecked(
        &mut self,
        request: SegmentRequest,
        raw: std::result::Result<usize, BackendError>,
    ) -> Result<MallocStep> {
        self.reserving_unlocked -= request.size;
        let id = match raw {
            Ok(ptr) => self.account_segment(
                request.private,
                request.pool,
                request.stream,
                ptr,
                request.size,
            ),
            Err(BackendError::OutOfMemory) => match self.retry_unlocked(request)? {
                SegmentRetry::Found(id) => id,
                SegmentRetry::Ask(next) => return Ok(MallocStep::NeedSegment(next)),
            },
            Err(e) => return Err(backend_error(&*self.backend, self.device, "raw_alloc", e)),
        };
        Ok(MallocStep::Done(self.hand_out_found(
            id,
            request.rounded,
            request.requested,
        )))
    }

    #[inline]
    fn hand_out_found(&mut self, id: BlockId, rounded: usize, requested: usize) -> usize {
        let block = &self.blocks[id];
        let split = should_split(block.pool, block.size, rounded, &self.config)
            && !(block.private != DEFAULT_POOLS && self.private_no_split(block.private));
        self.hand_out(id, rounded, requested, split)
    }

    /// The bytes the live allocation at `ptr` holds, as allocated_bytes counts them (the request
    /// rounded up by the allocator's rules): what PyTorch's memory profiler is told when it is made
    /// and when it is freed.
    pub fn allocation_size(&self, ptr: usize) -> Result<usize> {
        match self.active.get(&ptr) {
            Some(&id) => Ok(self.blocks[id].size),
            None => Err(self.not_a_live_allocation(ptr)),
        }
    }

    /// The error for a pointer that is not a block this device handed out and has not taken back.
    #[cold]
    fn not_a_live_allocation(&self, ptr: usize) -> Error {
        Error::invalid_pointer(format!(
            "pointer {ptr:#x} is not a live allocation of {} device {}: it was already freed, or it is \
             not the start of a block that accalloc handed out",
            self.backend.name(),
            self.device
        ))
    }

    /// Return a block handed out by `malloc`.
    #[inline]
    pub fn free(&mut self, ptr: usize) -> Result<()> {
        let result = self.free_unchecked(ptr);
        self.verify("free");
        result
    }

    #[inline]
    fn free_unchecked(&mut self, ptr: usize) -> Result<()> {
        // A block other streams used needs their events (or their synchronization) first: when the
        // backend fails them, the free is refused and the block stays allocated.
        let stream_events = if self.stream_uses.is_empty() {
            None
        } else {
            self.prepare_stream_events(ptr)?
        };
        let Some(id) = self.active.remove(&ptr) else {
            return Err(self.not_a_live_allocation(ptr));
        };
        let block = &mut self.blocks[id];
        block.allocated = false;
        let planned = std::mem::take(&mut block.planned);
        let (size, pool, stream) = (block.size, block.pool, block.stream);
        // History entries carry the size the caller asked for, as PyTorch's do.
        let requested = block.requested_size;
        self.trace(TraceAction::FreeRequested, ptr, requested, stream);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size as u64);
        if self.blocks[id].counted_oversize_allocation {
            self.blocks[id].counted_oversize_allocation = false;
            self.stats.oversize_allocations.decrease(1);
        }
        // A block handed out at its planned address parks when it returns straight to its pool.
        let parks = planned
            && stream_events.is_none()
            && (self.stream_uses.is_empty() || !self.stream_uses.contains_key(&id))
            && self.parks(id);
        if planned && !parks {
            self.unhold(id);
        }
        match stream_events {
            Some(events) => {
                self.stream_uses.remove(&id);
                self.insert_events(id, events);
            }
            None if self.capturing && self.stream_uses.contains_key(&id) => {
                self.defer_until_no_capture(id)
            }
            None if parks => self.park(id),
            None => self.return_to_pool(id),
        }
        if let Some(planner) = &mut self.planner {
            planner.freed(id as usize);
        }
        Ok(())
    }

    /// Release every cached block that is a whole segment back to the backend.
    pub fn empty_cache(&mut self) -> Result<()> {
        let result = self.release_cached_blocks().and_then(|()| {
            if self.expandable.is_empty() {
                Ok(())
            } else {
                self.release_empty_reservations()
            }
        });
        if result.is_ok() {
            self.shrink_metadata();
        }
        self.verify("empty_cache");
        result
    }

    /// A copy of the statistics, with max_split_size filled in.
    pub fn stats(&self) -> DeviceStats {
        self.stats
            .to_device_stats(self.config.max_split_size_stat())
    }

    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
        self.private_pools.reset_stats(true, false);
    }

    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
        self.private_pools.reset_stats(false, true);
    }

    /// A private pool's reserved bytes moved (its segments and mapped pages); nothing for the
    /// default pools. Out of line: only segment and page changes get here.
    #[inline(never)]
    fn pool_reserved_moved(&mut self, private: PoolIndex, pool: PoolKind, amount: i64) {
        if private != DEFAULT_POOLS {
            self.private_pools.reserved_moved(private, pool, amount);
        }
    }

    /// Limit reserved memory to `fraction` of the device's total memory.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::invalid_argument(format!(
                "memory fraction {fraction} is outside [0, 1]"
            )));
        }
        self.allowed_maximum = allowed_bytes(fraction, self.capacity);
        Ok(())
    }

    /// The fraction of the device's total memory reserved memory may grow to, as PyTorch's
    /// getMemoryFraction says it: the bytes allowed over the total (which the truncation to whole
    /// bytes may put a hair under the fraction set), 1.0 when none is set.
    pub fn memory_fraction(&self) -> f64 {
        match self.allowed_maximum {
            Some(allowed) if self.capacity > 0 => allowed as f64 / self.capacity as f64,
            _ => 1.0,
        }
    }

    /// The bytes reserved memory may grow to, when a fraction is set.
    pub fn allowed_maximum(&self) -> Option<usize> {
        self.allowed_maximum
    }

    /// Free and total memory of the device, as the backend reports it.
    pub fn mem_get_info(&self) -> Result<MemInfo> {
        self.backend
            .mem_get_info(self.device)
            .map_err(|e| backend_error(&*self.backend, self.device, "mem_get_info", e))
    }

    /// The BlockPool of `kind` of the default pools (DEFAULT_POOLS) or of a private pool.
    #[inline(always)]
    fn pool_mut(&mut self, private: PoolIndex, pool: PoolKind) -> &mut BlockPool {
        if private == DEFAULT_POOLS {
            match pool {
                PoolKind::Small => &mut self.small,
                PoolKind::Large => &mut self.large,
            }
        } else {
            self.private_pool_mut(private, pool)
        }
    }

    /// The BlockPool of `kind` of the default pools or of a private pool, to read.
    fn block_pool(&self, private: PoolIndex, pool: PoolKind) -> &BlockPool {
        match (private == DEFAULT_POOLS, pool) {
            (true, PoolKind::Small) => &self.small,
            (true, PoolKind::Large) => &self.large,
            (false, _) => self.private_pools.blocks(private, pool),
        }
    }

    /// pool_mut's private-pool branch, out of line: the hot path's is the default pools'.
    #[cold]
    #[inline(never)]
    fn private_pool_mut(&mut self, private: PoolIndex, pool: PoolKind) -> &mut BlockPool {
        self.private_pools.blocks_mut(private, pool)
    }

    /// Whether blocks of a private pool may not be split, out of line for the same reason.
    #[cold]
    #[inline(never)]
    fn private_no_split(&self, private: PoolIndex) -> bool {
        self.private_pools.no_split(private)
    }

    /// Best fit from the pool: the smallest cached block of this stream that is big enough, unless the
    /// max_split_size rules forbid it. Removes it from the pool.
    #[inline(always)]
    fn take_free_block(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
    ) -> Option<BlockId> {
        let max_split = self.config.max_split_size;
        let max_rounding = self.config.max_non_split_rounding;
        let gc_on = self.garbage_collection_on();
        let pool_kind = pool;
        if gc_on {
            self.pool_mut(private, pool_kind).lookups += 1;
        }
        // An oversize block is kept for oversize requests, and a big request may not waste too much.
        let acceptable = |(block_stream, block_size, _): super::block::PoolKey| {
            block_stream == stream
                && !(rounded < max_split && block_size >= max_split)
                && !(rounded >= max_split && block_size >= rounded.saturating_add(max_rounding))
        };
        if self.expandable.is_empty() {
            return self
                .pool_mut(private, pool_kind)
                .take_lower_bound(stream, rounded, acceptable);
        }
        let (key, id) = self.lower_bound_with_expandable(private, pool_kind, stream, rounded)?;
        if !acceptable(key) {
            return None;
        }
        self.pool_mut(private, pool_kind).remove_key(&key);
        Some(id)
    }

    /// Best fit when expandable segments exist (PyTorch's rules): with them on, a free block followed
    /// by unmapped space counts as the size it can grow to, so a later block that can grow less is
    /// preferred; with them off, expandable blocks are passed over.
    fn lower_bound_with_expandable(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
    ) -> Option<(super::block::PoolKey, BlockId)> {
        let on = self.config.expandable_segments || self.pool_sleepable(private);
        let blocks = &self.blocks;
        let growable = |id: BlockId| {
            let block = &blocks[id];
            block.size
                + block
                    .next
                    .filter(|&n| !blocks[n].mapped)
                    .map_or(0, |n| blocks[n].size)
        };
        // The pool's BlockPool, borrowed beside `blocks` (pool_mut would take all of self).
        let block_pool = match (private == DEFAULT_POOLS, pool) {
            (true, PoolKind::Small) => &mut self.small,
            (true, PoolKind::Large) => &mut self.large,
            (false, _) => self.private_pools.blocks_mut(private, pool),
        };
        let mut candidates = block_pool
            .ordered()
            .range((stream, rounded, 0)..)
            .map(|(k, v)| (*k, *v));
        let mut best = candidates.next()?;
        if blocks[best.1].expandable.is_some() {
            if on {
                for next in candidates {
                    if blocks[best.1].expandable.is_none()
                        || next.0 .0 != stream
                        || growable(next.1) >= growable(best.1)
                    {
                        break;
                    }
                    best = next;
                }
            } else {
                best = std::iter::once(best)
                    .chain(candidates)
                    .find(|(key, id)| key.0 != stream || blocks[*id].expandable.is_none())?;
            }
        }
        Some(best)
    }

    /// Put block `id` into its pool, noting when (for garbage collection by age).
    #[inline]
    fn cache_block(&mut self, id: BlockId) {
        let key = BlockPool::key(&self.blocks[id]);
        self.cache_block_as(id, key);
    }

    /// cache_block for a block whose key (stream, size, address) the caller has at hand: the hot
    /// paths have just written size and address, and reading them back at once as one wide load
    /// would wait for those stores to land.
    #[inline(always)]
    fn cache_block_as(&mut self, id: BlockId, key: super::block::PoolKey) {
        let (pool_kind, private) = (self.blocks[id].pool, self.blocks[id].private);
        let lookups = self.pool_mut(private, pool_kind).lookups;
        // Without garbage collection the age never moves: skip the store (see Stat::increase).
        if self.blocks[id].gc_count_base != lookups {
            self.blocks[id].gc_count_base = lookups;
        }
        self.pool_mut(private, pool_kind).insert_key(key, id);
    }

    /// Give the caller the first `rounded` bytes of block `id` (taken out of its pool or fresh from the
    /// backend), caching the remainder when `split`.
    #[inline]
    fn hand_out(&mut self, id: BlockId, rounded: usize, requested: usize, split: bool) -> usize {
        self.hand_out_block(id, rounded, requested, split).1
    }

    /// hand_out, returning the block handed out with its address.
    #[inline(always)]
    fn hand_out_block(
        &mut self,
        id: BlockId,
        rounded: usize,
        requested: usize,
        split: bool,
    ) -> (BlockId, usize) {
        let found = self.blocks[id];
        let pool = found.pool;
        // Blocks of expandable segments never count as inactive splits.
        let already_split = found.is_split() && found.expandable.is_none();
        let oversize = rounded >= self.config.max_split_size;
        let (handed, size) = if split {
            // The caller's block takes the front; the found block keeps the remainder.
            let handed = self.blocks.insert(Block {
                expandable: found.expandable,
                counted_oversize_segment: found.counted_oversize_segment,
                prev: found.prev,
                next: Some(id),
                allocated: true,
                requested_size: requested,
                counted_oversize_allocation: oversize,
                private: found.private,
                ..Block::new(found.ptr, rounded, found.stream, found.pool)
            });
            if let Some(prev) = found.prev {
                self.blocks[prev].next = Some(handed);
            }
            let remainder = &mut self.blocks[id];
            remainder.prev = Some(handed);
            let (remainder_ptr, remainder_size) = (found.ptr + rounded, found.size - rounded);
            remainder.ptr = remainder_ptr;
            remainder.size = remainder_size;
            self.cache_block_as(id, (found.stream, remainder_size, remainder_ptr));
            if already_split {
                self.stats
                    .inactive_split_bytes
                    .decrease(pool, rounded as u64);
            } else if found.expandable.is_none() {
                self.stats
                    .inactive_split_bytes
                    .increase(pool, remainder_size as u64);
                self.stats.inactive_split.increase(pool, 1);
            }
            (handed, rounded)
        } else {
            if already_split {
                self.stats
                    .inactive_split_bytes
                    .decrease(pool, found.size as u64);
                self.stats.inactive_split.decrease(pool, 1);
            }
            let block = &mut self.blocks[id];
            block.allocated = true;
            block.requested_size = requested;
            // The whole block, which may be larger than asked (max_non_split_rounding, or a
            // remainder too small to split off).
            let oversize = found.size >= self.config.max_split_size;
            block.counted_oversize_allocation = oversize;
            (id, found.size)
        };

        let ptr = found.ptr;
        self.active.insert(ptr, handed);
        self.trace(TraceAction::Alloc, ptr, requested, found.stream);
        let stats = &mut self.stats;
        stats.allocation.increase(pool, 1);
        stats.allocated_bytes.increase(pool, size as u64);
        stats.active.increase(pool, 1);
        stats.active_bytes.increase(pool, size as u64);
        stats.requested_bytes.increase(pool, requested as u64);
        if size >= self.config.max_split_size {
            stats.oversize_allocations.increase(1);
        }
        (handed, ptr)
    }

    /// A freed block goes back to its pool, merged with free neighbours (PyTorch's free_block).
    #[inline]
    fn return_to_pool(&mut self, id: BlockId) {
        let block = &self.blocks[id];
        let (mut ptr, mut size, stream) = (block.ptr, block.size, block.stream);
        let (original_size, requested, pool) = (block.size, block.requested_size, block.pool);
        let (prev, next, expandable) = (block.prev, block.next, block.expandable);
        self.trace(TraceAction::FreeCompleted, ptr, requested, stream);
        // inactive_split moves by the net change, as PyTorch applies it.
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        // The merged block's address and size are followed here rather than read back (see
        // cache_block_as).
        let prev_ptr = prev.map(|p| self.blocks[p].ptr);
        let subsumed = self.try_merge(id, prev);
        if subsumed > 0 {
            net_blocks -= 1;
            net_bytes -= subsumed as i64;
            ptr = prev_ptr.unwrap_or(ptr);
            size += subsumed;
        }
        let subsumed = self.try_merge(id, next);
        if subsumed > 0 {
            net_blocks -= 1;
            net_bytes -= subsumed as i64;
            size += subsumed;
        }
        let block = &mut self.blocks[id];
        block.requested_size = 0;
        let is_split = block.is_split();
        debug_assert_eq!((block.ptr, block.size), (ptr, size));
        self.cache_block_as(id, (stream, size, ptr));
        if expandable.is_some() {
            // Wholly free pages of expandable segments can always be released: not inactive splits.
            (net_blocks, net_bytes) = (0, 0);
        } else if is_split {
            net_blocks += 1;
            net_bytes += size as i64;
        }
        let stats = &mut self.stats;
        stats.inactive_split.add(pool, net_blocks);
        stats.inactive_split_bytes.add(pool, net_bytes);
        self.uncount_active(pool, original_size, requested);
    }

    /// A block of `size` bytes, `requested` asked for, is no longer active.
    #[inline(always)]
    fn uncount_active(&mut self, pool: PoolKind, size: usize, requested: usize) {
        let stats = &mut self.stats;
        stats.active.decrease(pool, 1);
        stats.active_bytes.decrease(pool, size as u64);
        stats.requested_bytes.decrease(pool, requested as u64);
    }

    /// Make [ptr, at) of block `id` a block of its own, before it and like it, and return it; `id`
    /// keeps [at, end).
    fn cut_front(&mut self, id: BlockId, at: usize) -> BlockId {
        self.cut(id, at, true)
    }

    /// Make [at, end) of block `id` a block of its own, after it and like it, and return it; `id`
    /// keeps [ptr, at).
    fn cut_back(&mut self, id: BlockId, at: usize) -> BlockId {
        self.cut(id, at, false)
    }

    /// Cut block `id` at `at` (inside it) in two blocks alike (mapped or not, parked or not): a
    /// new block takes the part in front of `at` when `new_in_front`, else the part from it on,
    /// and `id` the other. Returns the new block; the pools are the caller's to update.
    fn cut(&mut self, id: BlockId, at: usize, new_in_front: bool) -> BlockId {
        let block = self.blocks[id];
        let (ptr, size, prev, next) = if new_in_front {
            (block.ptr, at - block.ptr, block.prev, Some(id))
        } else {
            (at, block.ptr + block.size - at, Some(id), block.next)
        };
        let new = self.blocks.insert(Block {
            mapped: block.mapped,
            parked: block.parked,
            expandable: block.expandable,
            counted_oversize_segment: block.counted_oversize_segment,
            private: block.private,
            prev,
            next,
            ..Block::new(ptr, size, block.stream, block.pool)
        });
        let kept = &mut self.blocks[id];
        kept.size -= size;
        if new_in_front {
            kept.ptr = at;
            kept.prev = Some(new);
            if let Some(before) = block.prev {
                self.blocks[before].next = Some(new);
            }
        } else {
            kept.next = Some(new);
            if let Some(after) = block.next {
                self.blocks[after].prev = Some(new);
            }
        }
        new
    }

    /// Merge cached neighbour `source` into `target`; returns the bytes absorbed (0 when not merged).
    #[inline(always)]
    fn try_merge(&mut self, target: BlockId, source: Option<BlockId>) -> usize {
        let Some(source) = source else { return 0 };
        let absorbed = self.blocks[source];
        // A parked neighbour stays apart until it is unparked (allocator/parking.rs).
        if absorbed.allocated
            || absorbed.event_count > 0
            || absorbed.parked
            || absorbed.mapped != self.blocks[target].mapped
        {
            return 0;
        }
        let pool = self.pool_mut(absorbed.private, absorbed.pool);
        if absorbed.mapped {
            pool.remove(&absorbed);
        } else {
            pool.unmapped.remove(&(absorbed.stream, absorbed.ptr));
        }
        if self.blocks[target].prev == Some(source) {
            let block = &mut self.blocks[target];
            block.ptr = absorbed.ptr;
            block.prev = absorbed.prev;
            if let Some(prev) = absorbed.prev {
                self.blocks[prev].next = Some(target);
            }
        } else {
            self.blocks[target].next = absorbed.next;
            if let Some(next) = absorbed.next {
                self.blocks[next].prev = Some(target);
            }
        }
        self.blocks[target].size += absorbed.size;
        self.blocks.remove(source);
        absorbed.size
    }
}

/// PyTorch's allowed_memory_maximum: the fraction of the device's total memory, truncated; a fraction
/// of 1 means no limit at all (as in PyTorch, which then also never garbage-collects).
fn allowed_bytes(fraction: f64, total: usize) -> Option<usize> {
    (fraction < 1.0).then_some((fraction * total as f64) as usize)
}

#[inline]
fn stat_type(pool: PoolKind) -> StatType {
    match pool {
        PoolKind::Small => StatType::SmallPool,
        PoolKind::Large => StatType::LargePool,
    }
}

fn backend_error(backend: &dyn Backend, device: usize, call: &str, error: BackendError) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!(
            "{} backend: {call} on device {device} failed: {error}",
            backend.name()
        ),
    )
}
