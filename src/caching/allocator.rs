//! The caching allocator of one device: PyTorch's DeviceCachingAllocator, over any `Backend`.
//!
//! Not thread-safe by itself: the runtime keeps one behind a mutex per device.

use super::block::{Block, BlockId, BlockPool, PtrMap, Slab};
use super::config::CachingConfig;
use super::policy::{allocation_size, round_size, should_split, PoolKind};
use super::snapshot::{BlockInfo, BlockState, History, SegmentInfo, TraceAction};
use super::stats::{for_pool, DeviceStats, StatType};
use crate::backend::{Backend, BackendError, EventId, MemInfo, StreamId};
use crate::error::{Error, ErrorKind, Result};
use crate::units::format_size;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

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
    stats: DeviceStats,
    /// Bytes of all segments held from the backend (PyTorch's total_allocated_memory).
    reserved_total: usize,
    /// Set by set_memory_fraction: reserved memory may not grow past this.
    allowed_maximum: Option<usize>,
    /// Streams other than its own that use a live block (acc_record_stream).
    stream_uses: HashMap<BlockId, Vec<StreamId>>,
    /// Events recorded when such a block was freed, per stream in record order.
    pending_events: BTreeMap<StreamId, VecDeque<(EventId, BlockId)>>,
    /// Recent allocator events, when recording is on (acc_record_memory_history).
    history: Option<History>,
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
            stats: DeviceStats::default(),
            reserved_total: 0,
            allowed_maximum: None,
            stream_uses: HashMap::new(),
            pending_events: BTreeMap::new(),
            history: None,
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
    /// in them becomes this device's memory fraction.
    pub fn set_config(&mut self, config: CachingConfig) {
        if let Some(fraction) = config.per_process_memory_fraction {
            self.allowed_maximum = Some(allowed_bytes(fraction, self.capacity));
        }
        self.config = config;
    }

    /// Hand out a block of at least `size` bytes (size > 0) for use on `stream`.
    pub fn malloc(&mut self, size: usize, stream: StreamId) -> Result<usize> {
        debug_assert!(size > 0);
        if !self.pending_events.is_empty() {
            self.process_events()?;
        }
        let rounded = round_size(size, &self.config);
        let alloc_size = rounded.and_then(allocation_size);
        let (Some(rounded), Some(alloc_size)) = (rounded, alloc_size) else {
            // A size so large that its rounding overflows: nothing could hold it.
            return Err(self.out_of_memory_message(size));
        };
        let pool = PoolKind::for_size(rounded);

        let id = match self.take_free_block(pool, stream, rounded) {
            Some(id) => id,
            // No segment of this size could ever fit the device: fail without flushing the cache.
            None if alloc_size > self.capacity => {
                return Err(self.out_of_memory_message(alloc_size))
            }
            None => self.allocate_segment_with_fallbacks(pool, stream, rounded, alloc_size)?,
        };
        let split = should_split(pool, self.blocks[id].size, rounded, &self.config);
        Ok(self.hand_out(id, rounded, size, split))
    }

    /// Return a block handed out by `malloc`.
    pub fn free(&mut self, ptr: usize) -> Result<()> {
        let Some(id) = self.active.remove(&ptr) else {
            return Err(Error::invalid_pointer(format!(
                "pointer {ptr:#x} is not a live allocation of {} device {}: it was already freed, or it \
                 is not the start of a block that accalloc handed out",
                self.backend.name(),
                self.device
            )));
        };
        let block = &mut self.blocks[id];
        block.allocated = false;
        let (size, pool, stream) = (block.size, block.pool, block.stream);
        self.trace(TraceAction::FreeRequested, ptr, size, stream);
        let stat_type = stat_type(pool);
        for_pool(&mut self.stats.allocation, stat_type, |s| s.decrease(1));
        for_pool(&mut self.stats.allocated_bytes, stat_type, |s| {
            s.decrease(size as u64)
        });
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        match self.stream_uses.remove(&id) {
            Some(streams) => self.insert_events(id, streams),
            None => {
                self.return_to_pool(id);
                Ok(())
            }
        }
    }

    /// Note that `stream` uses the block at `ptr`: when it is freed, it waits for `stream`'s work
    /// queued until then. Uses on the block's own stream need no event and are ignored.
    pub fn record_stream(&mut self, ptr: usize, stream: StreamId) -> Result<()> {
        let Some(&id) = self.active.get(&ptr) else {
            return Err(Error::invalid_pointer(format!(
                "pointer {ptr:#x} is not a live allocation of {} device {}: record_stream needs the \
                 start of a block that is still allocated",
                self.backend.name(),
                self.device
            )));
        };
        if self.blocks[id].stream != stream {
            let uses = self.stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        Ok(())
    }

    /// Record an event on each stream that used a freed block; it stays out of the pool until they
    /// complete.
    fn insert_events(&mut self, id: BlockId, streams: Vec<StreamId>) -> Result<()> {
        for stream in streams {
            let event = self
                .backend
                .create_event(self.device)
                .map_err(|e| backend_error(&*self.backend, self.device, "create_event", e))?;
            self.backend
                .record_event(self.device, event, stream)
                .map_err(|e| backend_error(&*self.backend, self.device, "record_event", e))?;
            self.blocks[id].event_count += 1;
            self.pending_events
                .entry(stream)
                .or_default()
                .push_back((event, id));
        }
        if self.blocks[id].event_count == 0 {
            self.return_to_pool(id);
        }
        Ok(())
    }

    /// Return the blocks whose events have all completed (checked at the start of every malloc).
    fn process_events(&mut self) -> Result<()> {
        let streams: Vec<StreamId> = self.pending_events.keys().copied().collect();
        for stream in streams {
            while let Some(&(event, id)) = self.pending_events[&stream].front() {
                let done = self
                    .backend
                    .query_event(self.device, event)
                    .map_err(|e| backend_error(&*self.backend, self.device, "query_event", e))?;
                if !done {
                    break;
                }
                self.pending_events.get_mut(&stream).unwrap().pop_front();
                self.event_completed(event, id)?;
            }
            if self.pending_events[&stream].is_empty() {
                self.pending_events.remove(&stream);
            }
        }
        Ok(())
    }

    /// Wait for every pending event and return their blocks (PyTorch's synchronize_and_free_events).
    fn synchronize_and_free_events(&mut self) -> Result<()> {
        self.stats.num_sync_all_streams += 1;
        while let Some((_, mut queue)) = self.pending_events.pop_first() {
            while let Some((event, id)) = queue.pop_front() {
                self.backend
                    .synchronize_event(self.device, event)
                    .map_err(|e| {
                        backend_error(&*self.backend, self.device, "synchronize_event", e)
                    })?;
                self.event_completed(event, id)?;
            }
        }
        Ok(())
    }

    fn event_completed(&mut self, event: EventId, id: BlockId) -> Result<()> {
        self.backend
            .destroy_event(self.device, event)
            .map_err(|e| backend_error(&*self.backend, self.device, "destroy_event", e))?;
        let block = &mut self.blocks[id];
        block.event_count -= 1;
        if block.event_count == 0 {
            self.return_to_pool(id);
        }
        Ok(())
    }

    /// Release every cached block that is a whole segment back to the backend.
    pub fn empty_cache(&mut self) -> Result<()> {
        self.release_cached_blocks()
    }

    /// A copy of the statistics, with max_split_size filled in.
    pub fn stats(&self) -> DeviceStats {
        DeviceStats {
            max_split_size: self.config.max_split_size_stat(),
            ..self.stats
        }
    }

    /// Bytes allocated and reserved now, as [small pool, large pool] each (cheaper than stats()).
    #[inline]
    pub fn current_bytes_by_pool(&self) -> ([i64; 2], [i64; 2]) {
        let (small, large) = (StatType::SmallPool as usize, StatType::LargePool as usize);
        let s = &self.stats;
        (
            [
                s.allocated_bytes[small].current,
                s.allocated_bytes[large].current,
            ],
            [
                s.reserved_bytes[small].current,
                s.reserved_bytes[large].current,
            ],
        )
    }

    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// Limit reserved memory to `fraction` of the device's total memory.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::invalid_argument(format!(
                "memory fraction {fraction} is outside [0, 1]"
            )));
        }
        self.allowed_maximum = Some(allowed_bytes(fraction, self.capacity));
        Ok(())
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

    /// The size of the block at `ptr` if it is a live allocation.
    pub fn allocation_size(&self, ptr: usize) -> Option<usize> {
        self.active.get(&ptr).map(|&id| self.blocks[id].size)
    }

    /// Start (keeping the newest `max_entries`) or stop recording the history of allocator events.
    /// Starting again clears what was recorded.
    pub fn record_history(&mut self, enabled: bool, max_entries: usize) {
        self.history = enabled.then(|| History::new(max_entries));
    }

    /// The recorded history, if recording is on.
    pub fn history(&self) -> Option<&History> {
        self.history.as_ref()
    }

    /// Note an event in the history; a single branch when recording is off.
    #[inline]
    fn trace(&mut self, action: TraceAction, addr: usize, size: usize, stream: StreamId) {
        if let Some(history) = &mut self.history {
            history.record(action, addr, size, stream);
        }
    }

    /// Every segment with its blocks, ordered by address.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let mut heads: Vec<BlockId> = self
            .active
            .values()
            .copied()
            .chain(self.small.ids())
            .chain(self.large.ids())
            .chain(self.pending_events.values().flatten().map(|&(_, id)| id))
            .filter(|&id| self.blocks[id].prev.is_none())
            .collect();
        heads.sort_by_key(|&id| self.blocks[id].ptr);
        heads.dedup();
        heads
            .into_iter()
            .map(|head| {
                let first = &self.blocks[head];
                let mut segment = SegmentInfo {
                    address: first.ptr,
                    total_size: 0,
                    stream: first.stream,
                    pool: first.pool,
                    is_expandable: false,
                    blocks: Vec::new(),
                };
                let mut cursor = Some(head);
                while let Some(id) = cursor {
                    let block = &self.blocks[id];
                    segment.total_size += block.size;
                    let state = if block.allocated {
                        BlockState::ActiveAllocated
                    } else if block.event_count > 0 {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::Inactive
                    };
                    segment.blocks.push(BlockInfo {
                        address: block.ptr,
                        size: block.size,
                        requested_size: block.requested_size,
                        state,
                    });
                    cursor = block.next;
                }
                segment
            })
            .collect()
    }

    fn pool_mut(&mut self, pool: PoolKind) -> &mut BlockPool {
        match pool {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    /// Best fit from the pool: the smallest cached block of this stream that is big enough, unless the
    /// max_split_size rules forbid it. Removes it from the pool.
    fn take_free_block(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
    ) -> Option<BlockId> {
        let max_split = self.config.max_split_size;
        let max_rounding = self.config.max_non_split_rounding;
        let gc_on = self.garbage_collection_on();
        let pool = self.pool_mut(pool);
        if gc_on {
            pool.lookups += 1;
        }
        let (key, id) = pool.lower_bound(stream, rounded)?;
        let (block_stream, block_size, _) = key;
        if block_stream != stream {
            return None;
        }
        // An oversize block is kept for oversize requests, and a big request may not waste too much.
        if rounded < max_split && block_size >= max_split {
            return None;
        }
        if rounded >= max_split && block_size >= rounded.saturating_add(max_rounding) {
            return None;
        }
        pool.remove_key(&key);
        Some(id)
    }

    /// Put block `id` into its pool, noting when (for garbage collection by age).
    fn cache_block(&mut self, id: BlockId) {
        let pool_kind = self.blocks[id].pool;
        let lookups = self.pool_mut(pool_kind).lookups;
        let block = &mut self.blocks[id];
        block.gc_count_base = lookups;
        let block = *block;
        self.pool_mut(pool_kind).insert(&block, id);
    }

    /// Garbage collection runs only with a memory fraction and a threshold set, as in PyTorch.
    #[inline]
    fn garbage_collection_on(&self) -> bool {
        self.allowed_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// Free cached whole segments of the large pool, oldest (by lookups since cached) first, until
    /// reserved memory is back under threshold x allowed or nothing more can go. Unlike the OOM path it
    /// does not synchronize streams.
    fn garbage_collect_cached_blocks(&mut self) -> Result<()> {
        let allowed = self.allowed_maximum.unwrap_or(usize::MAX);
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as usize;
        if self.reserved_total <= threshold {
            return Ok(());
        }
        let target = self.reserved_total - threshold;
        let lookups = self.large.lookups;
        let blocks = &self.blocks;
        let mut candidates: Vec<(BlockId, u64)> = self
            .large
            .ordered()
            .values()
            .filter(|&&id| !blocks[id].is_split())
            .map(|&id| (id, lookups - blocks[id].gc_count_base))
            .collect();
        let mut total_age: u64 = candidates.iter().map(|&(_, age)| age).sum();
        let mut reclaimed = 0;
        while reclaimed < target && !candidates.is_empty() {
            // Free every block at least as old as the average; do not stop at the target, so that
            // collection does not run again at once.
            let average_age = total_age as f64 / candidates.len() as f64;
            let (old, young): (Vec<_>, Vec<_>) = candidates
                .into_iter()
                .partition(|&(_, age)| age as f64 >= average_age);
            if old.is_empty() {
                break;
            }
            for (id, age) in old {
                reclaimed += self.blocks[id].size;
                total_age -= age;
                self.release_block(id)?;
            }
            candidates = young;
        }
        Ok(())
    }

    /// The miss path: a new segment, else free oversize cached blocks and ask again, else free every
    /// cached segment and retry once, else out of memory.
    fn allocate_segment_with_fallbacks(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
        alloc_size: usize,
    ) -> Result<BlockId> {
        if self.garbage_collection_on() {
            self.garbage_collect_cached_blocks()?;
        }
        if let Some(id) = self.allocate_segment(pool, stream, alloc_size, false)? {
            return Ok(id);
        }
        if self.release_available_cached_blocks(pool, stream, rounded)? {
            if let Some(id) = self.allocate_segment(pool, stream, alloc_size, false)? {
                return Ok(id);
            }
        }
        self.release_cached_blocks()?;
        if let Some(id) = self.allocate_segment(pool, stream, alloc_size, true)? {
            return Ok(id);
        }
        self.stats.num_ooms += 1;
        if self.history.is_some() {
            let free = self
                .backend
                .mem_get_info(self.device)
                .map_or(0, |info| info.free);
            self.trace(TraceAction::Oom, free, alloc_size, stream);
        }
        Err(self.out_of_memory_message(alloc_size))
    }

    /// Ask the backend for a segment. Ok(None) when the device (or the memory fraction) has no room.
    fn allocate_segment(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: usize,
        is_retry: bool,
    ) -> Result<Option<BlockId>> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(allowed) = self.allowed_maximum {
            if self.reserved_total + size > allowed {
                return Ok(None);
            }
        }
        let ptr = match self.backend.raw_alloc(self.device, size, stream) {
            Ok(ptr) => ptr,
            Err(BackendError::OutOfMemory) => return Ok(None),
            Err(e) => return Err(backend_error(&*self.backend, self.device, "raw_alloc", e)),
        };
        self.reserved_total += size;
        let stat_type = stat_type(pool);
        for_pool(&mut self.stats.segment, stat_type, |s| s.increase(1));
        for_pool(&mut self.stats.reserved_bytes, stat_type, |s| {
            s.increase(size as u64)
        });
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.trace(TraceAction::SegmentAlloc, ptr, size, stream);
        Ok(Some(self.blocks.insert(Block {
            ptr,
            size,
            requested_size: 0,
            stream,
            pool,
            allocated: false,
            event_count: 0,
            gc_count_base: 0,
            prev: None,
            next: None,
        })))
    }

    /// With max_split_size set: free cached oversize blocks of this pool and stream, the smallest one
    /// big enough, else the largest ones downwards until enough bytes are freed.
    fn release_available_cached_blocks(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
    ) -> Result<bool> {
        let max_split = self.config.max_split_size;
        if max_split == usize::MAX {
            return Ok(false);
        }
        let wanted = rounded.max(max_split);
        if let Some(((s, _, _), id)) = self.pool_mut(pool).lower_bound(stream, wanted) {
            if s == stream && !self.blocks[id].is_split() {
                self.release_block(id)?;
                return Ok(true);
            }
        }
        // No single block is large enough: walk down from the largest block of this stream.
        let candidates: Vec<BlockId> = self
            .pool_mut(pool)
            .ordered()
            .range(..(stream, wanted, 0))
            .rev()
            .take_while(|((s, size, _), _)| *s == stream && *size >= max_split)
            .map(|(_, &id)| id)
            .collect();
        let mut released = 0;
        for id in candidates {
            if released >= wanted {
                break;
            }
            if self.blocks[id].is_split() {
                continue;
            }
            released += self.blocks[id].size;
            self.release_block(id)?;
        }
        Ok(released >= wanted)
    }

    /// Release every cached block that is a whole segment, in both pools.
    fn release_cached_blocks(&mut self) -> Result<()> {
        // Blocks waiting on stream events are returned first, so their segments can go too.
        self.synchronize_and_free_events()?;
        for pool in [PoolKind::Large, PoolKind::Small] {
            let blocks = &self.blocks;
            let whole: Vec<BlockId> = match pool {
                PoolKind::Large => &mut self.large,
                PoolKind::Small => &mut self.small,
            }
            .ordered()
            .values()
            .copied()
            .filter(|&id| !blocks[id].is_split())
            .collect();
            for id in whole {
                self.release_block(id)?;
            }
        }
        Ok(())
    }

    /// Give a cached whole-segment block back to the backend.
    fn release_block(&mut self, id: BlockId) -> Result<()> {
        let block = self.blocks[id];
        debug_assert!(!block.is_split() && !block.allocated);
        self.backend
            .raw_free(self.device, block.ptr, block.size)
            .map_err(|e| backend_error(&*self.backend, self.device, "raw_free", e))?;
        self.pool_mut(block.pool).remove(&block);
        self.blocks.remove(id);
        self.reserved_total -= block.size;
        self.stats.num_device_free += 1;
        self.trace(
            TraceAction::SegmentFree,
            block.ptr,
            block.size,
            block.stream,
        );
        let stat_type = stat_type(block.pool);
        for_pool(&mut self.stats.segment, stat_type, |s| s.decrease(1));
        for_pool(&mut self.stats.reserved_bytes, stat_type, |s| {
            s.decrease(block.size as u64)
        });
        if block.size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        Ok(())
    }

    /// Give the caller the first `rounded` bytes of block `id` (taken out of its pool or fresh from the
    /// backend), caching the remainder when `split`.
    fn hand_out(&mut self, id: BlockId, rounded: usize, requested: usize, split: bool) -> usize {
        let found = self.blocks[id];
        let stat_type = stat_type(found.pool);
        let already_split = found.is_split();
        let handed = if split {
            // The caller's block takes the front; the found block keeps the remainder.
            let handed = self.blocks.insert(Block {
                ptr: found.ptr,
                size: rounded,
                requested_size: 0,
                stream: found.stream,
                pool: found.pool,
                allocated: false,
                event_count: 0,
                gc_count_base: 0,
                prev: found.prev,
                next: Some(id),
            });
            if let Some(prev) = found.prev {
                self.blocks[prev].next = Some(handed);
            }
            let remainder = &mut self.blocks[id];
            remainder.prev = Some(handed);
            remainder.ptr += rounded;
            remainder.size -= rounded;
            let remainder_size = remainder.size;
            self.cache_block(id);
            if already_split {
                for_pool(&mut self.stats.inactive_split_bytes, stat_type, |s| {
                    s.decrease(rounded as u64)
                });
            } else {
                for_pool(&mut self.stats.inactive_split_bytes, stat_type, |s| {
                    s.increase(remainder_size as u64)
                });
                for_pool(&mut self.stats.inactive_split, stat_type, |s| s.increase(1));
            }
            handed
        } else {
            if already_split {
                for_pool(&mut self.stats.inactive_split_bytes, stat_type, |s| {
                    s.decrease(found.size as u64)
                });
                for_pool(&mut self.stats.inactive_split, stat_type, |s| s.decrease(1));
            }
            id
        };

        let block = &mut self.blocks[handed];
        block.allocated = true;
        block.requested_size = requested;
        let (ptr, size) = (block.ptr, block.size);
        self.active.insert(ptr, handed);
        self.trace(TraceAction::Alloc, ptr, size, found.stream);
        let stats = &mut self.stats;
        for_pool(&mut stats.allocation, stat_type, |s| s.increase(1));
        for_pool(&mut stats.allocated_bytes, stat_type, |s| {
            s.increase(size as u64)
        });
        for_pool(&mut stats.active, stat_type, |s| s.increase(1));
        for_pool(&mut stats.active_bytes, stat_type, |s| {
            s.increase(size as u64)
        });
        for_pool(&mut stats.requested_bytes, stat_type, |s| {
            s.increase(requested as u64)
        });
        if size >= self.config.max_split_size {
            stats.oversize_allocations.increase(1);
        }
        ptr
    }

    /// A freed block goes back to its pool, merged with free neighbours (PyTorch's free_block).
    fn return_to_pool(&mut self, id: BlockId) {
        let (original_size, requested, pool) = {
            let block = self.blocks[id];
            self.trace(
                TraceAction::FreeCompleted,
                block.ptr,
                block.size,
                block.stream,
            );
            (block.size, block.requested_size, block.pool)
        };
        // inactive_split moves by the net change, as PyTorch applies it.
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for neighbour in [self.blocks[id].prev, self.blocks[id].next] {
            let subsumed = self.try_merge(id, neighbour);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        let block = &mut self.blocks[id];
        block.requested_size = 0;
        let block = self.blocks[id];
        self.cache_block(id);
        if block.is_split() {
            net_blocks += 1;
            net_bytes += block.size as i64;
        }
        let stat_type = stat_type(pool);
        let stats = &mut self.stats;
        for_pool(&mut stats.inactive_split, stat_type, |s| {
            apply_net(s, net_blocks)
        });
        for_pool(&mut stats.inactive_split_bytes, stat_type, |s| {
            apply_net(s, net_bytes)
        });
        for_pool(&mut stats.active, stat_type, |s| s.decrease(1));
        for_pool(&mut stats.active_bytes, stat_type, |s| {
            s.decrease(original_size as u64)
        });
        for_pool(&mut stats.requested_bytes, stat_type, |s| {
            s.decrease(requested as u64)
        });
    }

    /// Merge cached neighbour `source` into `target`; returns the bytes absorbed (0 when not merged).
    fn try_merge(&mut self, target: BlockId, source: Option<BlockId>) -> usize {
        let Some(source) = source else { return 0 };
        let absorbed = self.blocks[source];
        if absorbed.allocated || absorbed.event_count > 0 {
            return 0;
        }
        self.pool_mut(absorbed.pool).remove(&absorbed);
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

    /// PyTorch's out-of-memory text, with the device's figures at the time of failure.
    fn out_of_memory_message(&self, alloc_size: usize) -> Error {
        let info = self.backend.mem_get_info(self.device).unwrap_or(MemInfo {
            free: 0,
            total: self.capacity,
        });
        let allowed = self
            .allowed_maximum
            .map(|a| format!("{} allowed; ", format_size(a as u64)))
            .unwrap_or_default();
        let allocated = self.stats.allocated_bytes[StatType::All as usize].current;
        let reserved = self.stats.reserved_bytes[StatType::All as usize].current;
        Error::new(
            ErrorKind::OutOfMemory,
            format!(
                "{} out of memory. Tried to allocate {}. Device {} has a total capacity of {} of which {} \
                 is free. {}Of the allocated memory {} is allocated by the allocator, and {} is reserved \
                 but unallocated. If reserved but unallocated memory is large try setting \
                 expandable_segments:True in ACC_ALLOC_CONF to avoid fragmentation.",
                self.backend.name(),
                format_size(alloc_size as u64),
                self.device,
                format_size(info.total as u64),
                format_size(info.free as u64),
                allowed,
                format_size(allocated as u64),
                format_size((reserved - allocated) as u64),
            ),
        )
    }
}

/// PyTorch's allowed_memory_maximum: the fraction of the device's total memory, truncated.
fn allowed_bytes(fraction: f64, total: usize) -> usize {
    (fraction * total as f64) as usize
}

#[inline]
fn stat_type(pool: PoolKind) -> StatType {
    match pool {
        PoolKind::Small => StatType::SmallPool,
        PoolKind::Large => StatType::LargePool,
    }
}

fn apply_net(stat: &mut super::stats::Stat, net: i64) {
    if net > 0 {
        stat.increase(net as u64);
    } else if net < 0 {
        stat.decrease((-net) as u64);
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
