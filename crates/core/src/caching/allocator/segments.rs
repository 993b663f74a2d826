//! Segments from the backend: the miss path (new segment, release of cached memory, one retry,
//! out of memory) and giving segments back.

use super::*;
use crate::caching::observers::SegmentAction;

/// PyTorch's three tries for a segment the cache cannot serve: as asked; after releasing the cached
/// blocks that would make room; after releasing every cached segment (a retry, counted in
/// num_alloc_retries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegmentTry {
    First,
    AfterReleasingAvailable,
    AfterReleasingAll,
}

/// What to try after a try for a segment failed (`after_failed_try`).
enum NextTry {
    /// A free block of a use_on_oom pool serves the request.
    Found(BlockId),
    /// The segment again, as this try.
    Segment(SegmentTry),
    /// Nothing: out of memory.
    OutOfMemory,
}

/// What comes of a segment refused to a request asked for without the lock (`retry_unlocked`).
pub(super) enum SegmentRetry {
    /// A free block of a use_on_oom pool serves it.
    Found(BlockId),
    /// Ask the backend for this segment, without the lock, and finish with its answer.
    Ask(SegmentRequest),
}

impl CachingAllocator {
    /// The miss path: a new segment, else free oversize cached blocks and ask again, else free every
    /// cached segment and retry once, else out of memory.
    pub(super) fn allocate_segment_with_fallbacks(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
        alloc_size: usize,
    ) -> Result<BlockId> {
        if self.garbage_collection_on() {
            self.garbage_collect_cached_blocks()?;
        }
        if let Some(id) =
            self.allocate_segment(private, pool, stream, rounded, alloc_size, false)?
        {
            return Ok(id);
        }
        self.allocate_after_first_failure(private, pool, stream, rounded, alloc_size)
    }

    /// After a try for a segment failed, what to try next, in PyTorch's order, with what that needs
    /// released first: after the first, a free block of a use_on_oom pool (PyTorch 2.15: a
    /// default-pool request tries those before anything is released; the block stays its pool's),
    /// else the segment again once the cached blocks that make room are released, if any were;
    /// then, unless a capture is underway (as in PyTorch), once every cached segment is released;
    /// then nothing.
    fn after_failed_try(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
        failed: SegmentTry,
    ) -> Result<NextTry> {
        if failed == SegmentTry::First {
            if private == DEFAULT_POOLS {
                for candidate in self.private_pools.use_on_oom_pools() {
                    // A paused pool's free blocks have no memory behind them until it resumes.
                    if self.pool_paused(candidate) {
                        continue;
                    }
                    if let Some(id) = self.take_free_block(candidate, pool, stream, rounded) {
                        return Ok(NextTry::Found(id));
                    }
                }
            }
            if self.release_available_cached_blocks(private, pool, stream, rounded)? {
                return Ok(NextTry::Segment(SegmentTry::AfterReleasingAvailable));
            }
        }
        if failed != SegmentTry::AfterReleasingAll && !self.capturing {
            self.release_cached_blocks()?;
            return Ok(NextTry::Segment(SegmentTry::AfterReleasingAll));
        }
        Ok(NextTry::OutOfMemory)
    }

    /// The rest of the miss path once the first request for a segment failed.
    pub(super) fn allocate_after_first_failure(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
        alloc_size: usize,
    ) -> Result<BlockId> {
        self.allocate_after_failure(
            private,
            pool,
            stream,
            rounded,
            alloc_size,
            SegmentTry::First,
        )
    }

    /// The rest of the miss path once try `failed` for a segment failed, under the lock.
    fn allocate_after_failure(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
        alloc_size: usize,
        mut failed: SegmentTry,
    ) -> Result<BlockId> {
        loop {
            match self.after_failed_try(private, pool, stream, rounded, failed)? {
                NextTry::Found(id) => return Ok(id),
                NextTry::Segment(attempt) => {
                    let is_retry = attempt == SegmentTry::AfterReleasingAll;
                    if let Some(id) =
                        self.allocate_segment(private, pool, stream, rounded, alloc_size, is_retry)?
                    {
                        return Ok(id);
                    }
                    failed = attempt;
                }
                NextTry::OutOfMemory => return Err(self.out_of_memory(alloc_size, rounded, stream)),
            }
        }
    }

    /// `allocate_after_first_failure` for a request whose segment was asked for without the lock
    /// (release_lock_on_malloc) and refused: the same tries in the same order and the same figures,
    /// each segment asked for without the lock again (`SegmentRetry::Ask`).
    pub(super) fn retry_unlocked(&mut self, request: SegmentRequest) -> Result<SegmentRetry> {
        let SegmentRequest {
            size,
            stream,
            rounded,
            pool,
            private,
            ..
        } = request;
        let mut failed = request.attempt;
        if self.grows_expandable() {
            // The settings changed while the segment was asked for: expandable segments grow
            // under the lock, as `allocate_segment` grows them.
            return self
                .allocate_after_failure(private, pool, stream, rounded, size, failed)
                .map(SegmentRetry::Found);
        }
        loop {
            match self.after_failed_try(private, pool, stream, rounded, failed)? {
                NextTry::Found(id) => return Ok(SegmentRetry::Found(id)),
                NextTry::Segment(attempt) => {
                    // As `allocate_segment` counts a retry: when tried, within the fraction or not.
                    if attempt == SegmentTry::AfterReleasingAll {
                        self.stats.num_alloc_retries += 1;
                    }
                    if self.within_fraction(size) {
                        self.reserving_unlocked += size;
                        return Ok(SegmentRetry::Ask(SegmentRequest { attempt, ..request }));
                    }
                    failed = attempt;
                }
                NextTry::OutOfMemory => return Err(self.out_of_memory(size, rounded, stream)),
            }
        }
    }

    /// A request (of `rounded` bytes after rounding, needing a segment of `alloc_size`) that ends in
    /// out of memory: counted in num_ooms, recorded in the history with the rounded size (as
    /// PyTorch's trace entry has it), queued for the OOM observers, and answered with PyTorch's
    /// message, which names alloc_size.
    pub(super) fn out_of_memory(
        &mut self,
        alloc_size: usize,
        rounded: usize,
        stream: StreamId,
    ) -> Error {
        self.stats.num_ooms += 1;
        let info = self.backend.mem_get_info(self.device).unwrap_or(MemInfo {
            free: 0,
            total: self.capacity,
        });
        self.trace(TraceAction::Oom, info.free, rounded, stream);
        self.report_oom(alloc_size, info.free);
        self.out_of_memory_message(alloc_size, info)
    }

    /// Whether a new segment of `size` bytes stays within the memory fraction, counting the
    /// segments other threads are asking the backend for right now (release_lock_on_malloc). No
    /// device holds more than isize::MAX bytes, so the statistics (i64) can never overflow, whatever
    /// capacity a backend reports.
    pub(super) fn within_fraction(&self, size: usize) -> bool {
        let Some(after) = self
            .reserved_total
            .checked_add(self.reserving_unlocked)
            .and_then(|held| held.checked_add(size))
            .filter(|&after| after <= isize::MAX as usize)
        else {
            return false;
        };
        self.allowed_maximum.is_none_or(|allowed| after <= allowed)
    }

    /// Whether new memory comes from growing an expandable segment (set_config turned them off where
    /// the backend has no virtual memory, or reports so much memory that a reservation would be too
    /// large).
    pub(super) fn grows_expandable(&self) -> bool {
        self.config.expandable_segments
    }

    /// Ask the backend for a segment. Ok(None) when the device (or the memory fraction) has no room.
    pub(super) fn allocate_segment(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
        size: usize,
        is_retry: bool,
    ) -> Result<Option<BlockId>> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if !self.within_fraction(size) {
            return Ok(None);
        }
        if (self.grows_expandable() || self.pool_sleepable(private)) && self.expandable_in(private)
        {
            // Grow an expandable segment of this pool by the rounded request, not a whole new
            // segment (private pools too, as PyTorch does for a pool with no allocator of its own).
            return self.try_allocate_expandable_block(private, pool, stream, rounded);
        }
        let source = self.segment_backend(private);
        match source.raw_alloc(self.device, size, stream) {
            Ok(ptr) => Ok(Some(self.account_segment(private, pool, stream, ptr, size))),
            Err(BackendError::OutOfMemory) => Ok(None),
            Err(e) => Err(backend_error(&*source, self.device, "raw_alloc", e)),
        }
    }

    /// Take a segment the backend handed out into the books; returns its (free, whole) block.
    pub(super) fn account_segment(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        ptr: usize,
        size: usize,
    ) -> BlockId {
        if private != DEFAULT_POOLS {
            self.private_pools.segment_added(private);
        }
        self.reserved_total += size;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size as u64);
        self.pool_reserved_moved(private, pool, size as i64);
        let oversize = size >= self.config.max_split_size;
        if oversize {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.trace(TraceAction::SegmentAlloc, ptr, size, stream);
        self.announce(SegmentAction::Alloc, private, ptr, size, stream);
        self.blocks.insert(Block {
            counted_oversize_segment: oversize,
            private,
            ..Block::new(ptr, size, stream, pool)
        })
    }

    /// With max_split_size set: free cached oversize blocks of this pool and stream, the smallest one
    /// big enough, else the largest ones downwards until enough bytes are freed.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        rounded: usize,
    ) -> Result<bool> {
        let max_split = self.config.max_split_size;
        if max_split == usize::MAX {
            return Ok(false);
        }
        let wanted = rounded.max(max_split);
        if let Some(((s, _, _), id)) = self.pool_mut(private, pool).lower_bound(stream, wanted) {
            let block = &self.blocks[id];
            if s == stream && !block.is_split() && block.expandable.is_none() {
                self.release_block(id)?;
                return Ok(true);
            }
        }
        // No single block is large enough: walk down from the largest block of this stream.
        let candidates: Vec<BlockId> = self
            .pool_mut(private, pool)
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
            if self.blocks[id].is_split() || self.blocks[id].expandable.is_some() {
                continue;
            }
            released += self.blocks[id].size;
            self.release_block(id)?;
        }
        Ok(released >= wanted)
    }

    /// Release every cached block that is a whole segment, in both default pools and in every
    /// freeable private pool (use count 0: PyTorch never releases a live pool's), erasing the
    /// freeable pools left with no segment.
    pub(super) fn release_cached_blocks(&mut self) -> Result<()> {
        // Parked blocks are free memory like any other (allocator/parking.rs).
        self.unpark_all();
        // Blocks waiting on stream events are returned first, so their segments can go too; while a
        // capture is underway PyTorch neither synchronizes nor releases the default pools.
        if !self.capturing {
            self.synchronize_and_free_events()?;
            self.release_pool_blocks(DEFAULT_POOLS)?;
        }
        for private in self.private_pools.freeable() {
            self.release_pool_blocks(private)?;
            self.release_empty_reservations_of(private)?;
            self.private_pools.erase_if_empty(private);
        }
        // A paused pool's free pages are of no use until it resumes: they leave the books (their
        // memory went at the pause).
        for private in self.private_pools.paused() {
            self.release_pool_blocks(private)?;
        }
        Ok(())
    }

    /// Release the cached whole segments of one set of pools (default or a private pool's).
    pub(super) fn release_pool_blocks(&mut self, private: PoolIndex) -> Result<()> {
        for pool in [PoolKind::Large, PoolKind::Small] {
            let cached: Vec<BlockId> = self
                .pool_mut(private, pool)
                .ordered()
                .values()
                .copied()
                .collect();
            // Whole segments go back; free pages of expandable segments are unmapped after.
            let (expandable, ordinary): (Vec<BlockId>, Vec<BlockId>) = cached
                .into_iter()
                .partition(|&id| self.blocks[id].expandable.is_some());
            for id in ordinary {
                if !self.blocks[id].is_split() {
                    self.release_block(id)?;
                }
            }
            for id in expandable {
                self.unmap_block(id)?;
            }
        }
        Ok(())
    }

    /// Give a cached whole-segment block back to the backend.
    pub(super) fn release_block(&mut self, id: BlockId) -> Result<()> {
        let block = self.blocks[id];
        debug_assert!(!block.is_split() && !block.allocated);
        let (private, ptr, size, stream) = (block.private, block.ptr, block.size, block.stream);
        self.announce(SegmentAction::Free, private, ptr, size, stream);
        let source = self.segment_backend(private);
        if let Err(e) = source.raw_free(self.device, ptr, size) {
            // The segment stays: observers learn that it is there again.
            self.announce(SegmentAction::Alloc, private, ptr, size, stream);
            return Err(backend_error(&*source, self.device, "raw_free", e));
        }
        self.pool_mut(block.private, block.pool).remove(&block);
        self.blocks.remove(id);
        if block.private != DEFAULT_POOLS {
            self.private_pools.segment_removed(block.private);
        }
        self.reserved_total -= block.size;
        self.stats.num_device_free += 1;
        self.trace(
            TraceAction::SegmentFree,
            block.ptr,
            block.size,
            block.stream,
        );
        let pool = block.pool;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, block.size as u64);
        self.pool_reserved_moved(block.private, pool, -(block.size as i64));
        // Uncount what was counted when the segment came, even if max_split_size changed since.
        if block.counted_oversize_segment {
            self.stats.oversize_segments.decrease(1);
        }
        Ok(())
    }

    /// PyTorch's out-of-memory text, with the device's figures at the time of failure.
    fn out_of_memory_message(&self, alloc_size: usize, info: MemInfo) -> Error {
        let allowed = self
            .allowed_maximum
            .map(|a| format!("{} allowed; ", format_size(a as u64)))
            .unwrap_or_default();
        let allocated = self.stats.allocated_bytes.current_all();
        let reserved = self.stats.reserved_bytes.current_all();
        Error::new(
            ErrorKind::OutOfMemory,
            format!(
                "{} out of memory. Tried to allocate {}. Device {} has a total capacity of {} of which {} \
                 is free. {}Of the allocated memory {} is allocated by the allocator, and {} is reserved \
                 but unallocated. If reserved but unallocated memory is large try setting \
                 expandable_segments:True in ACCALLOC_CONF to avoid fragmentation.",
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
