//! Seeing inside one device: current figures, segments and blocks, the history of events.

use super::*;

impl CachingAllocator {
    /// Bytes allocated and reserved now, as [small pool, large pool] each (cheaper than stats()).
    #[inline]
    pub fn current_bytes_by_pool(&self) -> ([i64; 2], [i64; 2]) {
        let (small, large) = (PoolKind::Small, PoolKind::Large);
        let s = &self.stats;
        (
            [
                s.allocated_bytes.current(small),
                s.allocated_bytes.current(large),
            ],
            [
                s.reserved_bytes.current(small),
                s.reserved_bytes.current(large),
            ],
        )
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
    pub(super) fn trace(
        &mut self,
        action: TraceAction,
        addr: usize,
        size: usize,
        stream: StreamId,
    ) {
        if let Some(history) = &mut self.history {
            history.record(action, addr, size, stream);
        }
    }

    /// Every segment with its blocks, ordered by address; where a plan is in force (as
    /// planner_counters' `in_force` says), the segments it lies in say which part of them it spans
    /// (`planned_range`).
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let planned = self
            .planner
            .as_ref()
            .filter(|p| p.planning())
            .and_then(|p| p.range());
        let mut heads: Vec<BlockId> = self
            .active
            .values()
            .copied()
            .chain(self.small.ids())
            .chain(self.large.ids())
            .chain(
                self.small
                    .by_address()
                    .chain(self.large.by_address())
                    .map(|(_, id)| id)
                    .chain(self.unindexed_parked()),
            )
            .chain(
                self.private_pools
                    .iter()
                    .flat_map(|(_, pool)| pool.small.ids().chain(pool.large.ids())),
            )
            .chain(self.pending_events.values().flatten().map(|&(_, id)| id))
            .chain(self.private_pools.deferred_frees.iter().copied())
            .filter(|&id| {
                // A segment starts where mapped memory starts: each contiguous mapped range of an
                // expandable segment is reported as a segment of its own, as PyTorch does.
                let block = &self.blocks[id];
                block.prev.is_none_or(|prev| !self.blocks[prev].mapped)
            })
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
                    pool_id: self.pool_of_block(first.private),
                    is_expandable: first.expandable.is_some(),
                    paused_size: 0,
                    planned_range: None,
                    blocks: Vec::new(),
                };
                let mut cursor = Some(head);
                let mut after_parked = false;
                while let Some(id) = cursor.filter(|&id| self.blocks[id].mapped) {
                    let block = &self.blocks[id];
                    segment.total_size += block.size;
                    cursor = block.next;
                    // A parked block and its free neighbours show as the one free block merging
                    // would have made of them (allocator/parking.rs).
                    let free = !block.allocated && block.event_count == 0;
                    let merges = free && (block.parked || after_parked);
                    after_parked = free && (block.parked || merges);
                    if let Some(last) = segment
                        .blocks
                        .last_mut()
                        .filter(|last| merges && last.state == BlockState::Inactive)
                    {
                        last.size += block.size;
                        continue;
                    }
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
                }
                if let Some(index) = first.expandable {
                    segment.paused_size = self.expandable[index as usize]
                        .paused_bytes_inside(segment.address, segment.total_size);
                }
                if let Some((start, end)) = planned {
                    let (low, high) = (
                        start.max(segment.address),
                        end.min(segment.address + segment.total_size),
                    );
                    segment.planned_range = (low < high).then_some((low, high));
                }
                segment
            })
            .collect()
    }
}
