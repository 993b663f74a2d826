//! Expandable segments: one address range reserved per (stream, pool), with memory mapped in pages
//! (2 MiB small, 20 MiB large) as blocks need it and unmapped when wholly free under pressure. A
//! request grows the segment in place instead of adding a segment of its own, which is what keeps
//! reserved memory close to allocated memory when request sizes keep changing.

use super::sleep::PauseState;
use super::*;
use crate::caching::observers::SegmentAction;
use crate::planning::online::PLAN_SLACK;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once the fallback warning has been printed (it is printed once per process).
static FALLBACK_WARNED: AtomicBool = AtomicBool::new(false);

/// One reserved address range and which of its pages are mapped.
pub(super) struct ExpandableSegment {
    /// The pools it serves (whose allocator, if they have one, holds the range).
    pub(super) owner: PoolIndex,
    /// The stream and pool kind whose blocks it holds.
    pub(super) stream: StreamId,
    pub(super) pool: PoolKind,
    base: usize,
    size: usize,
    pub(super) page: usize,
    pub(super) mapped: Vec<bool>,
    /// Pages mapped in the books whose memory a pause gave back (see sleep.rs).
    pub(super) paused: Vec<bool>,
}

impl ExpandableSegment {
    /// Pages [first, last) touched by [ptr, ptr + size).
    pub(super) fn pages_covering(&self, ptr: usize, size: usize) -> (usize, usize) {
        (
            (ptr - self.base) / self.page,
            (ptr + size - self.base).div_ceil(self.page),
        )
    }

    /// Pages [first, last) lying wholly inside [ptr, ptr + size).
    fn pages_inside(&self, ptr: usize, size: usize) -> (usize, usize) {
        (
            (ptr - self.base).div_ceil(self.page),
            (ptr + size - self.base) / self.page,
        )
    }

    pub(super) fn page_address(&self, page: usize) -> usize {
        self.base + page * self.page
    }

    /// Bytes of the paused pages inside [ptr, ptr + size).
    pub(super) fn paused_bytes_inside(&self, ptr: usize, size: usize) -> usize {
        let (first, last) = self.pages_inside(ptr, size);
        self.paused[first..last].iter().filter(|&&p| p).count() * self.page
    }

    /// Whether [ptr, end) touches a paused page of this range.
    pub(super) fn touches_paused(&self, ptr: usize, end: usize) -> bool {
        let (start, limit) = (ptr.max(self.base), end.min(self.base + self.size));
        if start >= limit {
            return false;
        }
        let (first, last) = self.pages_covering(start, limit - start);
        self.paused[first..last].contains(&true)
    }

    /// Whether the page holding `address` is mapped.
    pub(super) fn page_mapped(&self, address: usize) -> bool {
        self.mapped[(address - self.base) / self.page]
    }

    /// Page `page`'s (address, size).
    pub(super) fn page_range(&self, page: usize) -> (usize, usize) {
        (self.page_address(page), self.page)
    }

    /// The reserved range: (base, size).
    pub(super) fn range(&self) -> (usize, usize) {
        (self.base, self.size)
    }
}

impl CachingAllocator {
    /// Whether the backend can do expandable segments; warns once when it cannot.
    pub(super) fn virtual_memory_available(&self) -> bool {
        let fits = pages_fit(self.backend.vm_granularity(self.device));
        if !fits && !FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
            eprintln!(
                "accalloc: warning: expandable_segments:True is set but the {} backend has no virtual \
                 memory calls; using ordinary segments",
                self.backend.name()
            );
        }
        fits
    }

    /// Whether expandable_trim's rules are in force: set, or planned_placement, at the plans' line
    /// (`trim_limit`). With no plan in force, a program whose steps do not repeat gets the trim
    /// line; with one, requests off the plan (a step of another shape) may not grow the device past
    /// the line either: the free pages they would add to are given back first, the plan's own
    /// included (its next pass maps them again), so that a plan never holds more than the line.
    pub(super) fn trimming(&self) -> bool {
        self.config.expandable_trim || self.planner.is_some()
    }

    /// Whether the pools `private` grow expandable segments (with them on): the default pools and
    /// a pool with no allocator of its own do (set_config checked the device); a pool with one, when
    /// its allocator has virtual memory with pages that fit (else its segments are ordinary ones).
    pub(super) fn expandable_in(&self, private: PoolIndex) -> bool {
        if private == DEFAULT_POOLS {
            return true;
        }
        match self.private_pools.allocator(private) {
            None => true,
            Some(allocator) => pages_fit(allocator.vm_granularity(self.device)),
        }
    }

    /// The address space of a new reservation: 1 1/8 of the device's memory, as PyTorch reserves, in
    /// whole pages. None when that is more than MAX_RESERVATION (a backend reporting an enormous
    /// capacity): expandable segments then fall back to ordinary ones instead of failing.
    pub(super) fn reservation_size(&self, page: usize) -> Option<usize> {
        self.capacity
            .checked_add(self.capacity / 8)?
            .checked_next_multiple_of(page)
            .filter(|&size| size <= MAX_RESERVATION)
    }

    /// Grow (or start) an expandable segment of this pool and stream by at least `size` bytes and
    /// return the free block covering them, out of the pool. Ok(None) when the device has no room.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        size: usize,
    ) -> Result<Option<BlockId>> {
        // expandable_trim: unmap free pages elsewhere first if this growth would cross the line
        // (not during a capture, whose device may not be asked to unmap). Best effort: pages the
        // device would not unmap stay mapped and counted, and the request is served all the same
        // (without mapping ahead, as after a trim). planned_placement takes a free range of the
        // small pool for a large request there instead (`borrow_from_small_pool`): one that no
        // trim could give back before trimming, any after it if the trim fell short.
        let mut trimmed = false;
        if self.trimming() && !self.capturing {
            let (taken, new_bytes) = self.growth_need(private, pool, stream, size);
            let borrows = self.planner.is_some()
                && private == DEFAULT_POOLS
                && pool == PoolKind::Large
                && self.reserved_total + new_bytes > self.trim_limit(size);
            if borrows {
                if let Some(id) = self.borrow_from_small_pool(stream, size, Borrow::NoWholePage) {
                    return Ok(Some(id));
                }
            }
            trimmed = self
                .give_back_over_line(size, new_bytes, &taken)
                .unwrap_or(true);
            // What a trim gave back may have brought the growth within the line.
            let still_over = || {
                let (_, new_bytes) = self.growth_need(private, pool, stream, size);
                self.reserved_total + new_bytes > self.trim_limit(size)
            };
            if borrows && (!trimmed || still_over()) {
                if let Some(id) = self.borrow_from_small_pool(stream, size, Borrow::Any) {
                    return Ok(Some(id));
                }
            }
        }
        // A chain of blocks with room for `size`: unmapped; unmapped then free; or free then unmapped.
        let mut candidate = self.find_expandable_block(private, pool, stream, size)?;
        let mut target = if trimmed {
            // Mapping ahead now would map again what the trim has just unmapped.
            size
        } else {
            self.growth_with_headroom(pool, candidate, size)
        };
        // Pages mapped ahead are a bonus: where the device runs out after the request's own pages,
        // the growth keeps what it mapped instead of failing the request.
        if !self.blocks[candidate].mapped {
            let wanted = self.blocks[candidate].size.min(target);
            let mapped = self.map_block(candidate, wanted, wanted.min(size))?;
            if mapped == 0 {
                return Ok(None);
            }
            if mapped < wanted {
                // Cut short after the request's pages: it is covered.
                target = size;
            }
        }
        while self.blocks[candidate].size < target {
            // The block after a free one is unmapped: map what is missing; it merges with `candidate`.
            let covered = self.blocks[candidate].size;
            let next = self.blocks[candidate]
                .next
                .expect("a chain with room continues");
            let wanted = (target - covered).min(self.blocks[next].size);
            let required = size.saturating_sub(covered).min(wanted);
            let mapped = self.map_block(next, wanted, required)?;
            if mapped == 0 && required > 0 {
                return Ok(None);
            }
            if mapped > 0 {
                candidate = next;
            }
            if mapped < wanted {
                break;
            }
        }
        let block = self.blocks[candidate];
        self.pool_mut(private, pool).remove(&block);
        Ok(Some(candidate))
    }

    /// planned_placement: a large request whose growth would cross the line takes the smallest free
    /// block of the small pool (of its stream) that holds it, `which` allows, mapped already,
    /// instead of mapping new pages. A plan in the small pool's segment leaves free ranges of
    /// every size there when the steps' shapes move on, which the large pool could not use
    /// otherwise. The block counts in the small pool, where it lies, as a large planned block
    /// there does. Out of the pool, as `try_allocate_expandable_block` returns its block; None:
    /// nothing changed. expandable_trim alone keeps PyTorch's pools apart.
    fn borrow_from_small_pool(
        &mut self,
        stream: StreamId,
        size: usize,
        which: Borrow,
    ) -> Option<BlockId> {
        if which == Borrow::Any {
            return self
                .small
                .take_lower_bound(stream, size, |(block_stream, _, _)| block_stream == stream);
        }
        // A block of two pages or more holds a whole page: the smallest blocks are looked at only.
        let blocks = &self.blocks;
        let expandable = &self.expandable;
        let (_, &id) = self
            .small
            .ordered()
            .range((stream, size, 0)..)
            .take_while(|((block_stream, block_size, _), _)| {
                *block_stream == stream && *block_size < 2 * SMALL_PAGE
            })
            .find(|(_, &id)| {
                let block = &blocks[id];
                block.expandable.is_some_and(|index| {
                    let (first, last) =
                        expandable[index as usize].pages_inside(block.ptr, block.size);
                    first >= last
                })
            })?;
        let block = self.blocks[id];
        self.small.remove(&block);
        Some(id)
    }

    /// The start of a chain of free or unmapped blocks with at least `size` bytes of address space,
    /// reserving a new range when no segment of this pool and stream has room.
    pub(super) fn find_expandable_block(
        &mut self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        size: usize,
    ) -> Result<BlockId> {
        if let Some(start) = self.growth_chain(private, pool, stream, size) {
            return Ok(start);
        }
        // PyTorch maps 20 MiB pages in the large pool; expandable_trim and planned_placement map
        // 2 MiB pages everywhere.
        let page = if pool == PoolKind::Small
            || self.config.expandable_trim
            || self.config.planned_placement
        {
            SMALL_PAGE
        } else {
            LARGE_PAGE
        };
        let Some(reserve) = self.reservation_size(page) else {
            return Err(Error::new(
                ErrorKind::Internal,
                "expandable segments were used with a capacity too large for a reservation",
            ));
        };
        let source = self.segment_backend(private);
        let base = source
            .vm_reserve(self.device, reserve)
            .map_err(|e| backend_error(&*source, self.device, "vm_reserve", e))?;
        let segment = ExpandableSegment {
            owner: private,
            stream,
            pool,
            base,
            size: reserve,
            page,
            mapped: vec![false; reserve / page],
            paused: vec![false; reserve / page],
        };
        // Blocks refer to reservations by index: a released one leaves a hole, reused here.
        let index = match self.expandable.iter().position(|s| s.size == 0) {
            Some(hole) => {
                self.expandable[hole] = segment;
                hole as u32
            }
            None => {
                self.expandable.push(segment);
                (self.expandable.len() - 1) as u32
            }
        };
        let id = self.blocks.insert(Block {
            mapped: false,
            expandable: Some(index),
            private,
            ..Block::new(base, reserve, stream, pool)
        });
        self.pool_mut(private, pool)
            .unmapped
            .insert((stream, base), id);
        if private != DEFAULT_POOLS {
            self.private_pools.reservation_added(private);
        }
        Ok(id)
    }

    /// The start of an existing chain of free or unmapped blocks of this pool and stream with at
    /// least `size` bytes of address space, if there is one: the lowest such chain (PyTorch's
    /// choice), or with expandable_trim the one whose first `size` bytes need the fewest new bytes
    /// mapped (the lowest of those), so that free pages are used before new ones are mapped.
    fn growth_chain(
        &self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        size: usize,
    ) -> Option<BlockId> {
        let pool = self.block_pool(private, pool);
        let mut chains = pool
            .unmapped
            .range((stream, 0)..)
            .take_while(|((s, _), _)| *s == stream)
            .map(|(_, &id)| {
                // There may be a free block right before the lowest unmapped one to use as well.
                self.allocatable(self.blocks[id].prev).unwrap_or(id)
            })
            .map(|start| (start, self.chain_extent(start, size)))
            .filter(|&(_, (room, _))| room >= size);
        if !self.trimming() {
            return chains.next().map(|(start, _)| start);
        }
        // min_by_key keeps the first of equal keys: the lowest address.
        chains
            .min_by_key(|&(_, (_, unmapped))| unmapped)
            .map(|(start, _)| start)
    }

    /// The bytes a growth by `size` from `start` must map: the unmapped ones among the first
    /// `size` bytes of its chain.
    fn unmapped_in_growth(&self, start: BlockId, size: usize) -> usize {
        self.chain_extent(start, size).1
    }

    /// A growth by `size` from `start`, walked without a list: the address space of the blocks it
    /// would take (less than `size` when the chain is too short; more when its last block runs
    /// past `size`) and the unmapped bytes among the first `size` of it.
    fn chain_extent(&self, start: BlockId, size: usize) -> (usize, usize) {
        let (mut room, mut unmapped) = (0, 0);
        let mut cursor = Some(start);
        while room < size {
            let Some(current) = self.allocatable(cursor) else {
                break;
            };
            let block = &self.blocks[current];
            if !block.mapped {
                unmapped += block.size.min(size - room);
            }
            room += block.size;
            cursor = block.next;
        }
        (room, unmapped)
    }

    /// A block that a growing segment may take in: free, with no events pending.
    pub(super) fn allocatable(&self, id: Option<BlockId>) -> Option<BlockId> {
        id.filter(|&id| !self.blocks[id].allocated && self.blocks[id].event_count == 0)
    }

    /// The blocks from `start` on that a growth by `size` would take.
    fn chain(&self, start: BlockId, size: usize) -> Vec<BlockId> {
        let (mut blocks, mut room) = (Vec::new(), 0);
        let mut cursor = Some(start);
        while room < size {
            let Some(current) = self.allocatable(cursor) else {
                break;
            };
            blocks.push(current);
            room += self.blocks[current].size;
            cursor = self.blocks[current].next;
        }
        blocks
    }

    /// Reserved memory may grow to this (expandable_trim): the most ever allocated, counting a
    /// request of `size` bytes, plus expandable_trim_slack of it, and at least
    /// expandable_trim_floor more (no floor by default: the 20 MiB one of before made small jobs
    /// reserve more than plain expandable segments do). planned_placement holds the policy to the
    /// line its plans are held to (PLAN_SLACK) when that is the lower: the first steps, served
    /// before any plan, set the peak of a whole run.
    fn trim_limit(&self, size: usize) -> usize {
        let allocated = &self.stats.allocated_bytes;
        let needed = (allocated.current_all() as usize + size).max(allocated.peak_all() as usize);
        let fraction = if self.config.planned_placement {
            self.config.expandable_trim_slack.min(PLAN_SLACK)
        } else {
            self.config.expandable_trim_slack
        };
        let slack = (needed as f64 * fraction) as usize;
        needed.saturating_add(slack.max(self.config.expandable_trim_floor))
    }

    /// expandable_trim maps 2 MiB pages, so that free memory can be given back finely; while reserved
    /// memory stays under the trim limit, a large-pool growth maps up to 20 MiB more than it needs
    /// (as plain expandable segments' 20 MiB pages do), so that the next requests find it mapped.
    fn growth_with_headroom(&self, pool: PoolKind, start: BlockId, size: usize) -> usize {
        if !self.trimming() || pool == PoolKind::Small {
            return size;
        }
        let (room, _) = self.chain_extent(start, usize::MAX);
        let new = self
            .unmapped_in_growth(start, size)
            .next_multiple_of(SMALL_PAGE);
        let ahead = self
            .pages_ahead_within_line(size, new, SMALL_PAGE)
            .min(LARGE_PAGE);
        (size + ahead).min(room).max(size)
    }

    /// Whole pages of `page` bytes that may be mapped ahead of a request of `size` bytes whose own
    /// growth maps `new` bytes, and the device still stay within the line (`trim_limit`).
    pub(super) fn pages_ahead_within_line(&self, size: usize, new: usize, page: usize) -> usize {
        self.trim_limit(size)
            .saturating_sub(self.reserved_total + new)
            / page
            * page
    }

    /// What a growth by `size` would take: the free blocks of its chain (which a trim must leave
    /// be) and the bytes it must map, in whole pages.
    fn growth_need(
        &self,
        private: PoolIndex,
        pool: PoolKind,
        stream: StreamId,
        size: usize,
    ) -> (Vec<BlockId>, usize) {
        match self.growth_chain(private, pool, stream, size) {
            Some(start) => (
                self.chain(start, size),
                self.unmapped_in_growth(start, size)
                    .next_multiple_of(SMALL_PAGE),
            ),
            None => (Vec::new(), size.next_multiple_of(SMALL_PAGE)),
        }
    }

    /// expandable_trim: before `new_bytes` are mapped for a request of `size` bytes, unmap free
    /// pages (not those of the blocks in `taken`, which the request is to use) until reserved
    /// memory with the new bytes comes under the line (see trim_limit: the most ever allocated,
    /// this request included, plus expandable_trim_slack of it, and at least
    /// expandable_trim_floor), or no free page is left. Below the line growth maps as plain
    /// expandable segments do, so cached pages are reused rather than unmapped and mapped again.
    /// Above it, whole free stretches go: the smallest that covers the excess (one call), else the
    /// largest ones first (one call each). Giving back the whole stretch rather than just the
    /// excess leaves room under the line for the next growths, which then need no unmap of their
    /// own. Whether anything was unmapped.
    pub(super) fn give_back_over_line(
        &mut self,
        size: usize,
        new_bytes: usize,
        taken: &[BlockId],
    ) -> Result<bool> {
        let page = SMALL_PAGE;
        let limit = self.trim_limit(size);
        let mut excess = (self.reserved_total + new_bytes).saturating_sub(limit);
        if excess == 0 {
            return Ok(false);
        }
        // Free pages anywhere on the device: the default pools' and every private pool's.
        let mut candidates: Vec<(usize, BlockId)> = self
            .small
            .entries()
            .chain(self.large.entries())
            .chain(
                self.private_pools
                    .iter()
                    .flat_map(|(_, p)| p.small.entries().chain(p.large.entries())),
            )
            .filter(|((_, size, _), id)| *size >= page && !taken.contains(id))
            .filter_map(|(_, id)| {
                let block = &self.blocks[id];
                let segment = &self.expandable[block.expandable? as usize];
                let (first, last) = segment.pages_inside(block.ptr, block.size);
                (first < last).then(|| ((last - first) * segment.page, id))
            })
            .collect();
        // Largest first; ties by address, so that the choice does not depend on the pools' layout.
        candidates
            .sort_unstable_by_key(|&(bytes, id)| (std::cmp::Reverse(bytes), self.blocks[id].ptr));
        // One call where one stretch covers the excess: the smallest that does, so that the big free
        // blocks the next requests want stay mapped.
        if let Some(&(_, id)) = candidates.iter().rev().find(|(bytes, _)| *bytes >= excess) {
            self.unmap_block(id)?;
            return Ok(true);
        }
        let mut unmapped = false;
        for (bytes, id) in candidates {
            if excess == 0 {
                break;
            }
            self.unmap_block(id)?;
            unmapped = true;
            excess = excess.saturating_sub(bytes);
        }
        Ok(unmapped)
    }

    /// Map the pages under the first `size` bytes of unmapped block `id`, a call per page; the
    /// mapped part becomes a free block (merged with free neighbours), the rest stays unmapped.
    /// Returns the bytes mapped: where the device runs out once the first `required` bytes are
    /// mapped, what was mapped is kept; Ok(0) when it runs out before (nothing is left mapped
    /// then). On a failing map, the pages this call mapped are unmapped again; those the device
    /// will not unmap stay mapped and counted (a free block) and the unmap's error is returned.
    pub(super) fn map_block(&mut self, id: BlockId, size: usize, required: usize) -> Result<usize> {
        let block = self.blocks[id];
        let segment_index = block.expandable.expect("only expandable blocks are mapped") as usize;
        let segment = &self.expandable[segment_index];
        let (first, mut last) = segment.pages_covering(block.ptr, size);
        let required_pages = required.div_ceil(segment.page);
        let page = segment.page;
        let source = self.segment_backend(block.private);
        // An error to report once the pages the device kept are in the books.
        let mut failure = None;
        for p in first..last {
            let address = self.expandable[segment_index].page_address(p);
            match source.vm_map(self.device, address, page) {
                Ok(()) => self.expandable[segment_index].mapped[p] = true,
                Err(BackendError::OutOfMemory) if p > first && p - first >= required_pages => {
                    // The required pages are in: keep them (and the others mapped so far).
                    last = p;
                    break;
                }
                Err(error) => {
                    // Give back what this call mapped, the last page first, then report. Pages the
                    // device will not unmap stay mapped: a prefix of the block, counted below as
                    // any mapped page is, so that the books keep what the device holds.
                    let mut kept = p;
                    while kept > first {
                        let address = self.expandable[segment_index].page_address(kept - 1);
                        if let Err(e) = source.vm_unmap(self.device, address, page) {
                            failure = Some(backend_error(&*source, self.device, "vm_unmap", e));
                            break;
                        }
                        kept -= 1;
                        self.expandable[segment_index].mapped[kept] = false;
                    }
                    if failure.is_none() {
                        return match error {
                            BackendError::OutOfMemory => Ok(0),
                            e => Err(backend_error(&*source, self.device, "vm_map", e)),
                        };
                    }
                    last = kept;
                    break;
                }
            }
        }
        let mapped_size = (last - first) * page;
        debug_assert_eq!(
            self.expandable[segment_index].page_address(first),
            block.ptr
        );

        self.pool_mut(block.private, block.pool)
            .unmapped
            .remove(&(block.stream, block.ptr));
        if mapped_size < block.size {
            // The unmapped rest becomes a block of its own after this one.
            let rest = self.cut_back(id, block.ptr + mapped_size);
            self.pool_mut(block.private, block.pool)
                .unmapped
                .insert((block.stream, block.ptr + mapped_size), rest);
        }
        self.blocks[id].mapped = true;
        self.try_merge(id, self.blocks[id].prev);
        self.try_merge(id, self.blocks[id].next);
        self.cache_block(id);

        self.reserved_total += mapped_size;
        self.stats
            .reserved_bytes
            .increase(block.pool, mapped_size as u64);
        self.pool_reserved_moved(block.private, block.pool, mapped_size as i64);
        self.stats.num_device_alloc += 1;
        self.trace(
            TraceAction::SegmentMap,
            block.ptr,
            mapped_size,
            block.stream,
        );
        self.announce(
            SegmentAction::Map,
            block.private,
            block.ptr,
            mapped_size,
            block.stream,
        );
        match failure {
            Some(error) => Err(error),
            None => Ok(mapped_size),
        }
    }

    /// Unmap the whole pages inside cached block `id` of an expandable segment; the pieces before and
    /// after them stay cached.
    pub(super) fn unmap_block(&mut self, id: BlockId) -> Result<()> {
        let block = self.blocks[id];
        let segment_index = block
            .expandable
            .expect("only expandable blocks are unmapped") as usize;
        let segment = &self.expandable[segment_index];
        let (first, last) = segment.pages_inside(block.ptr, block.size);
        if first >= last {
            return Ok(());
        }
        let (start, size) = (segment.page_address(first), (last - first) * segment.page);
        match self.pause_state(segment_index, first, last) {
            PauseState::Running => {
                self.announce(
                    SegmentAction::Unmap,
                    block.private,
                    start,
                    size,
                    block.stream,
                );
                let source = self.segment_backend(block.private);
                if let Err(e) = source.vm_unmap(self.device, start, size) {
                    // The pages stay mapped: observers learn that they are there again.
                    self.announce(SegmentAction::Map, block.private, start, size, block.stream);
                    return Err(backend_error(&*source, self.device, "vm_unmap", e));
                }
            }
            // A pause gave their memory back already: only the books change.
            PauseState::Paused => self.forget_paused_pages(segment_index, first, last),
            // Left from a pause that failed half way: resume sorts them out first.
            PauseState::Mixed => return Ok(()),
        }
        self.expandable[segment_index].mapped[first..last].fill(false);

        self.pool_mut(block.private, block.pool).remove(&block);
        let before = start - block.ptr;
        if before > 0 {
            let piece = self.blocks.insert(Block {
                expandable: block.expandable,
                private: block.private,
                prev: block.prev,
                next: Some(id),
                ..Block::new(block.ptr, before, block.stream, block.pool)
            });
            if let Some(prev) = block.prev {
                self.blocks[prev].next = Some(piece);
            }
            self.blocks[id].prev = Some(piece);
            self.cache_block(piece);
        }
        let after = block.size - before - size;
        if after > 0 {
            let piece = self.blocks.insert(Block {
                expandable: block.expandable,
                private: block.private,
                prev: Some(id),
                next: self.blocks[id].next,
                ..Block::new(start + size, after, block.stream, block.pool)
            });
            if let Some(next) = self.blocks[id].next {
                self.blocks[next].prev = Some(piece);
            }
            self.blocks[id].next = Some(piece);
            self.cache_block(piece);
        }
        let unmapped = &mut self.blocks[id];
        unmapped.ptr = start;
        unmapped.size = size;
        unmapped.mapped = false;
        self.try_merge(id, self.blocks[id].prev);
        self.try_merge(id, self.blocks[id].next);
        let merged = self.blocks[id];
        self.pool_mut(block.private, block.pool)
            .unmapped
            .insert((merged.stream, merged.ptr), id);

        self.reserved_total -= size;
        self.stats.reserved_bytes.decrease(block.pool, size as u64);
        self.pool_reserved_moved(block.private, block.pool, -(size as i64));
        self.stats.num_device_free += 1;
        self.trace(TraceAction::SegmentUnmap, start, size, block.stream);
        Ok(())
    }

    /// empty_cache: give back each reservation of the default pools and of every freeable private
    /// pool that holds nothing (a single unmapped block covers it), so that streams used once do not
    /// keep their address space for ever. Nothing in the statistics changes: only mapped memory
    /// counts as reserved.
    pub(super) fn release_empty_reservations(&mut self) -> Result<()> {
        if !self.capturing {
            self.release_empty_reservations_of(DEFAULT_POOLS)?;
        }
        for private in self.private_pools.freeable() {
            self.release_empty_reservations_of(private)?;
        }
        Ok(())
    }

    /// Give back the reservations of one set of pools that hold nothing.
    pub(super) fn release_empty_reservations_of(&mut self, private: PoolIndex) -> Result<()> {
        for pool in [PoolKind::Large, PoolKind::Small] {
            let blocks = &self.blocks;
            let empty: Vec<BlockId> = self
                .block_pool(private, pool)
                .unmapped
                .values()
                .copied()
                .filter(|&id| blocks[id].prev.is_none() && blocks[id].next.is_none())
                .collect();
            for id in empty {
                let block = self.blocks[id];
                let index = block.expandable.expect("unmapped blocks are expandable") as usize;
                let (base, size) = self.expandable[index].range();
                let source = self.segment_backend(private);
                source
                    .vm_release(self.device, base, size)
                    .map_err(|e| backend_error(&*source, self.device, "vm_release", e))?;
                self.pool_mut(private, pool)
                    .unmapped
                    .remove(&(block.stream, block.ptr));
                self.blocks.remove(id);
                if private != DEFAULT_POOLS {
                    self.private_pools.reservation_removed(private);
                }
                self.expandable[index] = ExpandableSegment {
                    owner: DEFAULT_POOLS,
                    stream: 0,
                    pool: PoolKind::Large,
                    base: 0,
                    size: 0,
                    page: SMALL_PAGE,
                    mapped: Vec::new(),
                    paused: Vec::new(),
                };
            }
        }
        while self.expandable.last().is_some_and(|s| s.size == 0) {
            self.expandable.pop();
        }
        Ok(())
    }

    /// Give every reservation back (used when the allocator goes away).
    pub(super) fn release_reservations(&mut self) {
        for segment in std::mem::take(&mut self.expandable)
            .into_iter()
            .filter(|s| s.size > 0)
        {
            let source = self.segment_backend(segment.owner);
            for (page, _) in segment
                .mapped
                .iter()
                .zip(&segment.paused)
                .enumerate()
                .filter(|(_, (&mapped, &paused))| mapped && !paused)
            {
                let _ = source.vm_unmap(self.device, segment.page_address(page), segment.page);
            }
            let _ = source.vm_release(self.device, segment.base, segment.size);
        }
    }
}

/// Whether a backend's mapping granularity (None: no virtual memory) divides both page sizes.
/// Which free blocks of the small pool a large request at the line may take.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Borrow {
    /// Those that hold no whole page: no trim could give their memory back, so using them costs
    /// nothing. Taking a block with whole free pages keeps pages the trim would give back (and
    /// small blocks then spread over them: a CNN's small pool held two pages at its peak for one).
    NoWholePage,
    /// Any: the trim has given back what it could and the growth is still past the line.
    Any,
}

pub(super) fn pages_fit(granularity: Option<usize>) -> bool {
    granularity
        .is_some_and(|g| g > 0 && SMALL_PAGE.is_multiple_of(g) && LARGE_PAGE.is_multiple_of(g))
}

/// The largest reservation: 4 TiB of address space (a device of about 3.5 TiB), whose page table
/// takes 2 MB at 2 MiB pages.
pub(super) const MAX_RESERVATION: usize = 1 << 42;

/// Page sizes of expandable segments, as PyTorch maps them.
pub(super) const SMALL_PAGE: usize = super::super::policy::SMALL_BUFFER;
pub(super) const LARGE_PAGE: usize = super::super::policy::LARGE_BUFFER;
