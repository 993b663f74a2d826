//! The allocator's own bookkeeping memory: the block slab and the pointer map grow with the number
//! of blocks at the peak and never shrink on the hot path. `empty_cache` gives back what is far
//! beyond the live set, so that a long-running process does not keep its worst moment's metadata.

use super::*;

impl CachingAllocator {
    /// Compact the slab when at most a quarter of it is live, and shrink the pointer map when at
    /// most an eighth full. Only empty_cache calls this: the hysteresis of both (each must more than
    /// double again before it would be shrunk again) keeps resizes off the malloc and free path.
    pub(super) fn shrink_metadata(&mut self) {
        if self.blocks.is_sparse() {
            let renumbered = self.blocks.compact();
            self.active.renumber(&renumbered);
            self.small.renumber(&renumbered);
            self.large.renumber(&renumbered);
            for (small, large) in self.private_pools.block_pools_mut() {
                small.renumber(&renumbered);
                large.renumber(&renumbered);
            }
            self.stream_uses = std::mem::take(&mut self.stream_uses)
                .into_iter()
                .map(|(id, streams)| (renumbered[id as usize], streams))
                .collect();
            for queue in self.pending_events.values_mut() {
                for (_, id) in queue.iter_mut() {
                    *id = renumbered[*id as usize];
                }
            }
            for id in &mut self.private_pools.deferred_frees {
                *id = renumbered[*id as usize];
            }
            if let Some(planner) = &mut self.planner {
                planner.renumber(&renumbered);
            }
            // Only those still unindexed (the others may be gone, their slots vacant).
            let blocks = &self.blocks;
            self.unindexed_rests.retain(|&id| {
                blocks
                    .get(renumbered[id as usize])
                    .is_some_and(|b| b.unindexed)
            });
            for id in &mut self.unindexed_rests {
                *id = renumbered[*id as usize];
            }
            self.unindexed_rests.sort_unstable();
            self.unindexed_rests.dedup();
        } else if self.active.is_sparse() {
            self.active.shrink();
        }
        self.stream_uses.shrink_to_fit();
    }

    /// Bytes of memory this allocator keeps for its bookkeeping of blocks (slab and pointer map).
    pub fn metadata_bytes(&self) -> usize {
        self.blocks.memory_bytes() + self.active.memory_bytes()
    }
}
