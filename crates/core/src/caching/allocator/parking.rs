//! Parking, planned_placement's fast path. A block handed out at its planned address is, when it
//! is freed while that plan is in force, parked where it lies: kept in its pool's address index
//! alone, out of the tree the policy searches, and not merged with its free neighbours. The plan's
//! next request at that address (most often the same tensor one step later) finds it by a hash of
//! the address (`parked_at`) and takes it as it is. A planned block keeps its address index entry
//! while it lives ("held"), so that where the sizes repeat a step costs no index operation at all;
//! an ordinary free merges the block into its neighbours and the next planned request cuts the
//! merged block apart again, several tree operations each way. A request longer than the block
//! parked at its address takes in the free blocks after it (`gather_parked`); one that finds no
//! block parked at its address is served as without parking, the parked blocks under its range
//! unparked first. The part cut off a parked block longer than the request (`take_parked`) gets
//! no address index entry at once: most are taken in again by a longer request within the step
//! (`gather_parked`), and each entry would cost a tree insertion and a removal. They are entered
//! (`index_rests`) only when a planned request its hint did not serve looks an address up;
//! `unpark_all` (the policy, a new plan, the trims, empty_cache) and snapshots find them in their
//! list (`unindexed_parked`).
//!
//! Parking changes no figure. Whatever looks at free memory sees it as merging would have left
//! it: the policy's requests, a new plan, the trims at the plans' line and empty_cache unpark every
//! block first; the trim at a pass's end, which keeps the plan's pages, treats a free block beside
//! a parked one as part of the plan, as the merged block would be; snapshots show a parked block
//! and its free neighbours as one block. Only blocks of expandable segments park, which never
//! count as inactive splits, so the statistics are those of the merged books too.

use super::*;

/// Sets of the parked blocks' hints (a power of two), of two hints each: a plan's addresses that
/// share a set (a few pairs in any plan of some size) do not push each other out every step.
const PARKED_HINT_SETS: usize = 512;

/// The first hint of the set of a block address (multiples of 512: the low bits say nothing).
#[inline]
fn hint_set(address: usize) -> usize {
    let set = (address as u64 >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        >> (64 - PARKED_HINT_SETS.trailing_zeros());
    2 * set as usize
}

impl CachingAllocator {
    /// Whether freed block `id`, handed out at its planned address, parks: a plan is in force and
    /// the block lies in its range, in the plan's pool.
    #[inline]
    pub(super) fn parks(&self, id: BlockId) -> bool {
        #[cfg(test)]
        if self.parking_off {
            return false;
        }
        let block = &self.blocks[id];
        let Some((start, end)) = self.planner.as_ref().and_then(|p| p.range()) else {
            return false;
        };
        block.private == DEFAULT_POOLS
            && block.pool == self.plan_pool
            && block.expandable.is_some()
            && block.mapped
            && start <= block.ptr
            && block.ptr + block.size <= end
    }

    /// Park freed block `id` (see the module's comment); it counts as a free block from now on.
    /// Its address index entry, kept since it was handed out, stays.
    #[inline]
    pub(super) fn park(&mut self, id: BlockId) {
        let block = self.blocks[id];
        self.trace(
            TraceAction::FreeCompleted,
            block.ptr,
            block.requested_size,
            block.stream,
        );
        self.uncount_active(block.pool, block.size, block.requested_size);
        let parked = &mut self.blocks[id];
        parked.requested_size = 0;
        parked.parked = true;
        self.pool_mut(DEFAULT_POOLS, block.pool).count_parked(1);
        self.hint_parked(block.ptr, id);
    }

    /// Remember that block `id` is parked at `ptr`.
    #[inline(always)]
    fn hint_parked(&mut self, ptr: usize, id: BlockId) {
        if self.parked_hints.is_empty() {
            self.parked_hints = vec![(usize::MAX, BlockId::MAX); 2 * PARKED_HINT_SETS];
        }
        // The latest first; the one before it stays second unless it was for this address.
        let set = hint_set(ptr);
        let hints = &mut self.parked_hints[set..set + 2];
        if hints[0].0 != ptr {
            hints[1] = hints[0];
        }
        hints[0] = (ptr, id);
    }

    /// The block parked at `address` on `stream` in the plan's pool, if the hints know it. A hint
    /// is only a guess (its block may since have been taken, merged or renumbered); what it names
    /// is checked, and no slot of the slab says parked unless its block is (a parked block leaves
    /// the slab only through `gather_parked`, which clears the mark first).
    #[inline]
    pub(super) fn parked_at(&self, address: usize, stream: StreamId) -> Option<BlockId> {
        let set = hint_set(address);
        let hints = self.parked_hints.get(set..set + 2)?;
        let &(_, id) = hints.iter().find(|&&(ptr, _)| ptr == address)?;
        let block = self.blocks.get(id)?;
        (block.parked
            && block.ptr == address
            && block.stream == stream
            && block.pool == self.plan_pool)
            .then_some(id)
    }

    /// Freed block `id`, handed out at its planned address, does not park: its address index
    /// entry goes.
    pub(super) fn unhold(&mut self, id: BlockId) {
        let block = self.blocks[id];
        self.release_entry(id, block);
    }

    /// Block `id` (`block`), held or parked, leaves the address index: its entry goes, or, if it
    /// never had one, its mark.
    fn release_entry(&mut self, id: BlockId, block: Block) {
        if block.unindexed {
            self.blocks[id].unindexed = false;
            self.unindexed -= 1;
        } else {
            self.pool_mut(DEFAULT_POOLS, block.pool)
                .release_hold(block.stream, block.ptr);
        }
    }

    /// Enter the parts cut off parked blocks in their pools' address indexes: before anything
    /// looks an address up there.
    pub(super) fn index_rests(&mut self) {
        // Taken and put back emptied: the list keeps its room for the next cuts.
        let mut rests = std::mem::take(&mut self.unindexed_rests);
        for &id in &rests {
            let Some(&block) = self.blocks.get(id).filter(|b| b.unindexed) else {
                continue;
            };
            self.blocks[id].unindexed = false;
            self.unindexed -= 1;
            self.pool_mut(DEFAULT_POOLS, block.pool)
                .hold(block.stream, block.ptr, id);
        }
        rests.clear();
        self.unindexed_rests = rests;
    }

    /// Parked blocks with no address index entry (for `unpark_all`, snapshots and the invariants).
    pub(super) fn unindexed_parked(&self) -> impl Iterator<Item = BlockId> + '_ {
        // The list may name a slot twice (a block entered, gone, and its slot cut off again).
        let listed = if self.unindexed == 0 {
            &[][..]
        } else {
            &self.unindexed_rests[..]
        };
        let mut ids: Vec<BlockId> = listed
            .iter()
            .copied()
            .filter(|&id| self.blocks.get(id).is_some_and(|b| b.unindexed && b.parked))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
    }

    /// Planned block `id` was just handed out: it keeps an address index entry while it lives.
    pub(super) fn hold_planned(&mut self, id: BlockId) {
        let block = &mut self.blocks[id];
        block.planned = true;
        let (pool, stream, ptr) = (block.pool, block.stream, block.ptr);
        self.pool_mut(DEFAULT_POOLS, pool).hold(stream, ptr, id);
    }

    /// How many freed blocks are parked now (planned_placement's fast path; 0 without a plan).
    pub fn parked_blocks(&self) -> usize {
        self.small.parked_len() + self.large.parked_len()
    }

    /// Serve without parking from now on: every free merges at once (for the tests).
    #[cfg(test)]
    pub(crate) fn turn_parking_off(&mut self) {
        self.unpark_all();
        self.parking_off = true;
    }

    /// Address index entries made for held and parked blocks so far, and how many blocks have
    /// none (parts cut off parked blocks), for the tests.
    #[cfg(test)]
    pub(crate) fn index_entries_made(&self) -> (usize, usize) {
        (
            self.small.holds_made + self.large.holds_made,
            self.unindexed,
        )
    }

    /// How many blocks the slab holds (free, parked, allocated and unmapped), for the tests.
    #[cfg(test)]
    pub(crate) fn blocks_in_slab(&self) -> usize {
        self.blocks.len()
    }

    /// Whether any block is parked.
    #[inline]
    pub(super) fn any_parked(&self) -> bool {
        self.parked_blocks() > 0
    }

    /// Make parked block `id` an ordinary free block: merged with its free neighbours (those not
    /// parked) and cached in its pool, as its free would have left it.
    pub(super) fn unpark(&mut self, id: BlockId) {
        let block = self.blocks[id];
        debug_assert!(block.parked);
        self.blocks[id].parked = false;
        self.pool_mut(DEFAULT_POOLS, block.pool).count_parked(-1);
        self.release_entry(id, block);
        self.try_merge(id, block.prev);
        let next = self.blocks[id].next;
        self.try_merge(id, next);
        self.cache_block(id);
    }

    /// Unpark every parked block: free memory is then as merging would have left it.
    pub(super) fn unpark_all(&mut self) {
        if !self.any_parked() {
            return;
        }
        let blocks = &self.blocks;
        // Merging removes only blocks that are not parked, so these ids stay valid throughout.
        let parked: Vec<BlockId> = self
            .small
            .by_address()
            .chain(self.large.by_address())
            .map(|(_, id)| id)
            .filter(|&id| blocks[id].parked)
            .chain(self.unindexed_parked())
            .collect();
        for id in parked {
            self.unpark(id);
        }
    }

    /// Whether parked block `id` can serve a planned request from its address to `end`: it is long
    /// enough, or the blocks after it up to `end` are free, mapped, with no event pending, in its
    /// segment, and end inside the plan's range (`take_parked` takes them in).
    #[inline]
    pub(super) fn parked_serves(&self, id: BlockId, end: usize) -> bool {
        let first = &self.blocks[id];
        first.ptr + first.size >= end || self.parked_serves_gathered(id, end)
    }

    /// `parked_serves` for a block shorter than the request: the blocks after it.
    fn parked_serves_gathered(&self, id: BlockId, end: usize) -> bool {
        let first = &self.blocks[id];
        let mut cursor = Some(id);
        let mut covered = first.ptr;
        while covered < end {
            match self.allocatable(cursor) {
                Some(next)
                    if self.blocks[next].expandable == first.expandable
                        && self.blocks[next].mapped =>
                {
                    covered = self.blocks[next].ptr + self.blocks[next].size;
                    cursor = self.blocks[next].next;
                }
                _ => return false,
            }
        }
        let plan_end = self.planner.as_ref().and_then(|p| p.range()).map(|r| r.1);
        plan_end.is_some_and(|plan_end| covered <= plan_end)
    }

    /// Parked block `id` takes in the free blocks after it (parked or cached) up to `end`, the
    /// last of them whole: a planned request longer than the block parked at its address, when
    /// `parked_serves` said so. It stays parked, in the plan's range.
    fn gather_parked(&mut self, id: BlockId, end: usize) {
        while self.blocks[id].ptr + self.blocks[id].size < end {
            let next = self.blocks[id]
                .next
                .expect("alloc_at checked the blocks under the range");
            let absorbed = self.blocks[next];
            debug_assert!(!absorbed.allocated && absorbed.mapped && absorbed.event_count == 0);
            if absorbed.parked {
                self.pool_mut(DEFAULT_POOLS, absorbed.pool).count_parked(-1);
                self.release_entry(next, absorbed);
            } else {
                self.pool_mut(DEFAULT_POOLS, absorbed.pool)
                    .remove(&absorbed);
            }
            let block = &mut self.blocks[id];
            block.size += absorbed.size;
            block.next = absorbed.next;
            if let Some(after) = absorbed.next {
                self.blocks[after].prev = Some(id);
            }
            // A vacant slot never says parked (see `parked_at`).
            self.blocks[next].parked = false;
            self.blocks.remove(next);
        }
    }

    /// Keep only the listed rests still unindexed, each once: most of those listed were entered
    /// or are gone, and a slot taken again by a new rest may be listed twice. A block kept has
    /// its `unindexed` cleared while the list is walked, so that a second listing of it is
    /// dropped (no sort: this runs on the planned request's path), and set again after.
    fn prune_unindexed_rests(&mut self) {
        let blocks = &mut self.blocks;
        self.unindexed_rests.retain(|&id| match blocks.get_mut(id) {
            Some(block) if block.unindexed => {
                block.unindexed = false;
                true
            }
            _ => false,
        });
        for &id in &self.unindexed_rests {
            self.blocks[id].unindexed = true;
        }
    }

    /// Hand out the first `rounded` bytes of parked block `id` as a planned allocation, the free
    /// blocks after it taken in first when it is shorter (`parked_serves` said it can serve); the
    /// rest, if any, stays parked. Returns the block handed out and its address. The block keeps
    /// its address index entry: when the sizes repeat, a pass costs no index operation at all.
    #[inline]
    pub(super) fn take_parked(
        &mut self,
        id: BlockId,
        rounded: usize,
        requested: usize,
    ) -> (BlockId, usize) {
        let end = self.blocks[id].ptr + rounded;
        self.gather_parked(id, end);
        let block = self.blocks[id];
        debug_assert!(block.parked && block.size >= rounded);
        self.pool_mut(DEFAULT_POOLS, block.pool).count_parked(-1);
        if block.size > rounded {
            // A new block takes the rest, parked, with no address index entry yet (see the
            // module's comment).
            let rest = self.cut_back(id, block.ptr + rounded);
            self.pool_mut(DEFAULT_POOLS, block.pool).count_parked(1);
            self.blocks[rest].unindexed = true;
            self.unindexed += 1;
            if self.unindexed_rests.len() >= 2 * self.unindexed + 64 {
                self.prune_unindexed_rests();
            }
            self.unindexed_rests.push(rest);
            self.hint_parked(block.ptr + rounded, rest);
        }
        self.blocks[id].parked = false;
        if let Some(planner) = &mut self.planner {
            planner.took_parked();
        }
        let (handed, ptr) = self.hand_out_block(id, rounded, requested, false);
        self.blocks[handed].planned = true;
        (handed, ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::simulated::SimulatedBackend;
    use crate::caching::settings::parse_settings;

    #[test]
    fn two_parked_blocks_whose_addresses_share_a_hint_set_are_both_found_by_their_hints() {
        let config = parse_settings("planned_placement:True", &CachingConfig::default()).unwrap();
        let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
        let mut a = CachingAllocator::new(backend, 0, config).unwrap();
        // Three addresses of one set (a plan of some size has a few such pairs), each with a
        // block parked there.
        let base = 1usize << 40;
        let mut same_set = (0..)
            .map(|i| base + i * 512)
            .filter(|&p| hint_set(p) == hint_set(base));
        let addresses: Vec<usize> = same_set.by_ref().take(3).collect();
        let parked: Vec<BlockId> = addresses
            .iter()
            .map(|&ptr| {
                a.blocks.insert(Block {
                    parked: true,
                    ..Block::new(ptr, 512, 0, a.plan_pool)
                })
            })
            .collect();
        a.hint_parked(addresses[0], parked[0]);
        a.hint_parked(addresses[1], parked[1]);
        assert_eq!(a.parked_at(addresses[0], 0), Some(parked[0]));
        assert_eq!(a.parked_at(addresses[1], 0), Some(parked[1]));
        // The first one hinted again (freed and parked once more, as every step does) pushes
        // neither out.
        a.hint_parked(addresses[0], parked[0]);
        assert_eq!(a.parked_at(addresses[1], 0), Some(parked[1]));
        // A third goes first and the oldest hint goes: its block is then looked up by address.
        a.hint_parked(addresses[2], parked[2]);
        assert_eq!(a.parked_at(addresses[2], 0), Some(parked[2]));
        assert_eq!(a.parked_at(addresses[0], 0), Some(parked[0]));
        assert_eq!(a.parked_at(addresses[1], 0), None);
        // A hint is checked: a block no longer parked, or on another stream, is not found.
        a.blocks[parked[0]].parked = false;
        assert_eq!(a.parked_at(addresses[0], 0), None);
        assert_eq!(a.parked_at(addresses[2], 1), None);
    }

    #[test]
    fn pruning_the_list_of_rests_keeps_each_unindexed_rest_once() {
        let config = parse_settings("planned_placement:True", &CachingConfig::default()).unwrap();
        let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
        let mut a = CachingAllocator::new(backend, 0, config).unwrap();
        let rest = |a: &mut CachingAllocator, ptr: usize, unindexed: bool| {
            a.blocks.insert(Block {
                parked: true,
                unindexed,
                ..Block::new(ptr, 512, 0, a.plan_pool)
            })
        };
        let (first, second) = (rest(&mut a, 1 << 40, true), rest(&mut a, 2 << 40, true));
        // Entered in the address index since it was listed.
        let entered = rest(&mut a, 3 << 40, false);
        // A slot listed, emptied, and taken again by a new rest: listed twice.
        let gone = rest(&mut a, 4 << 40, true);
        a.blocks[gone].unindexed = false;
        a.blocks.remove(gone);
        let again = rest(&mut a, 5 << 40, true);
        assert_eq!(again, gone, "the slab gives the emptied slot again");
        a.unindexed_rests = vec![first, gone, entered, second, first, again];
        a.prune_unindexed_rests();
        assert_eq!(a.unindexed_rests, vec![first, gone, second]);
        // The rests kept are still unindexed; the one entered still is not.
        assert!([first, second, again]
            .iter()
            .all(|&id| a.blocks[id].unindexed));
        assert!(!a.blocks[entered].unindexed);
    }
}
