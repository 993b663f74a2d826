//! The books must always balance. `check_invariants` recounts everything from the blocks themselves:
//! segments tile their ranges with no gap or overlap, every free block sits in exactly one pool under
//! its own key, live allocations never overlap and are 512-byte aligned, and every current statistic
//! equals its recount. In debug builds (and with the `invariants` feature) it runs after every
//! operation that changes the allocator.

use super::*;
use std::collections::HashSet;

impl CachingAllocator {
    /// Panic when an invariant is broken after `operation` (debug builds, or the `invariants`
    /// feature; otherwise this is compiled out).
    #[cfg(any(debug_assertions, feature = "invariants"))]
    pub(super) fn verify(&self, operation: &str) {
        if let Err(broken) = self.check_invariants() {
            panic!("accalloc invariant broken after {operation}: {broken}");
        }
    }

    #[cfg(not(any(debug_assertions, feature = "invariants")))]
    #[inline(always)]
    pub(super) fn verify(&self, _operation: &str) {}

    /// Recount everything and compare; Err names the first broken invariant.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        // Every block the allocator knows, from where it is kept.
        let mut known: Vec<BlockId> = Vec::new();
        for (&ptr, &id) in &self.active {
            let block = &self.blocks[id];
            if !block.allocated || block.ptr != ptr {
                return Err(format!(
                    "live map entry {ptr:#x} points at a block at {:#x} that is not allocated",
                    block.ptr
                ));
            }
            known.push(id);
        }
        // What a parked block is: free with no event pending, mapped, in an expandable segment.
        let can_park = |block: &Block| {
            !block.allocated
                && block.event_count == 0
                && block.mapped
                && block.expandable.is_some()
                && !block.planned
        };
        let mut cached = HashSet::new();
        let mut parked = HashSet::new();
        let mut held_planned = 0;
        let mut pools = vec![
            (DEFAULT_POOLS, PoolKind::Small, &self.small),
            (DEFAULT_POOLS, PoolKind::Large, &self.large),
        ];
        for (index, pool) in self.private_pools.iter() {
            pools.push((index, PoolKind::Small, &pool.small));
            pools.push((index, PoolKind::Large, &pool.large));
        }
        for (private, pool_kind, pool) in pools {
            if !pool.address_index_agrees() {
                return Err(format!(
                    "the address index of pool {private} {pool_kind:?} differs from its blocks"
                ));
            }
            for (key, id) in pool.entries() {
                let block = &self.blocks[id];
                if BlockPool::key(block) != key
                    || block.pool != pool_kind
                    || block.private != private
                    || block.allocated
                    || !block.mapped
                {
                    return Err(format!(
                        "pool entry {key:?} does not match its block {block:?}"
                    ));
                }
                if !cached.insert(id) {
                    return Err(format!("block at {:#x} is cached twice", block.ptr));
                }
            }
            // Entries of the address index outside the tree (allocator/parking.rs): parked
            // blocks, free and mapped, in an expandable segment of the default pools; and blocks
            // handed out at their planned address.
            let mut parked_here = 0;
            for ((stream, ptr), id) in pool.by_address() {
                let block = &self.blocks[id];
                if block.ptr != ptr || block.stream != stream || block.pool != pool_kind {
                    return Err(format!(
                        "address entry {ptr:#x} does not match its block {block:?}"
                    ));
                }
                if block.planned {
                    if !block.allocated || private != DEFAULT_POOLS {
                        return Err(format!("planned block at {ptr:#x} is {block:?}"));
                    }
                    held_planned += 1;
                }
                if !block.parked {
                    continue;
                }
                parked_here += 1;
                if private != DEFAULT_POOLS || !can_park(block) {
                    return Err(format!("parked block at {ptr:#x} is {block:?}"));
                }
                if !parked.insert(id) {
                    return Err(format!("block at {:#x} is parked twice", block.ptr));
                }
            }
            // Parked parts cut off parked blocks that have no index entry yet.
            if private == DEFAULT_POOLS {
                for id in self.unindexed_parked() {
                    let block = &self.blocks[id];
                    if block.pool != pool_kind {
                        continue;
                    }
                    parked_here += 1;
                    if !can_park(block) {
                        return Err(format!("parked block at {:#x} is {block:?}", block.ptr));
                    }
                    if !parked.insert(id) {
                        return Err(format!("block at {:#x} is parked twice", block.ptr));
                    }
                }
            }
            if parked_here != pool.parked_len() {
                return Err(format!(
                    "pool {private} {pool_kind:?} counts {} parked blocks, holds {parked_here}",
                    pool.parked_len()
                ));
            }
            for (&(stream, ptr), &id) in &pool.unmapped {
                let block = &self.blocks[id];
                if block.mapped
                    || block.ptr != ptr
                    || block.stream != stream
                    || block.pool != pool_kind
                    || block.private != private
                {
                    return Err(format!(
                        "unmapped entry {ptr:#x} does not match its block {block:?}"
                    ));
                }
                known.push(id);
            }
        }
        // Blocks without an address index entry (allocator/parking.rs): listed, counted, parked
        // or handed out from where they were parked, and in no index.
        let unindexed: Vec<BlockId> = (0..self.blocks.len() + self.blocks.vacant().len())
            .map(|id| id as BlockId)
            .filter(|&id| self.blocks.get(id).is_some_and(|b| b.unindexed))
            .collect();
        if unindexed.len() != self.unindexed {
            return Err(format!(
                "{} blocks say unindexed, {} counted",
                unindexed.len(),
                self.unindexed
            ));
        }
        for &id in &unindexed {
            let block = &self.blocks[id];
            let indexed = self
                .block_pool(DEFAULT_POOLS, block.pool)
                .by_address()
                .any(|(_, entry)| entry == id);
            if self.blocks.vacant().contains(&id)
                || !(block.parked || (block.allocated && block.planned))
                || indexed
                || !self.unindexed_rests.contains(&id)
            {
                return Err(format!("unindexed block {id} is {block:?}"));
            }
        }
        let held_unindexed = unindexed
            .iter()
            .filter(|&&id| self.blocks[id].allocated)
            .count();
        let planned_live = self
            .active
            .values()
            .filter(|&&id| self.blocks[id].planned)
            .count();
        if planned_live != held_planned + held_unindexed {
            return Err(format!(
                "{planned_live} live blocks handed out at their planned address, {held_planned} \
                 of them in an address index"
            ));
        }
        if let Some(id) = cached.iter().find(|id| parked.contains(id)) {
            return Err(format!(
                "block at {:#x} is parked and cached",
                self.blocks[*id].ptr
            ));
        }
        known.extend(cached.iter().copied());
        known.extend(parked.iter().copied());
        for queue in self.pending_events.values() {
            for &(_, id) in queue {
                let block = &self.blocks[id];
                if block.allocated || block.event_count == 0 {
                    return Err(format!(
                        "block at {:#x} waits on events but is {block:?}",
                        block.ptr
                    ));
                }
                known.push(id);
            }
        }
        // The cached path is closed while any pool is begun or any free waits for a capture's end.
        let closed = self.private_pools.closes_cached_path();
        if self.routing != closed || self.capturing != self.private_pools.capturing() {
            return Err(format!(
                "routing is {} and capturing {}, but pools begun or frees deferred say {closed}",
                self.routing, self.capturing
            ));
        }
        for &id in &self.private_pools.deferred_frees {
            let block = &self.blocks[id];
            if block.allocated || block.event_count == 0 || !self.stream_uses.contains_key(&id) {
                return Err(format!(
                    "block at {:#x} waits for a capture to end but is {block:?}",
                    block.ptr
                ));
            }
            known.push(id);
        }
        // The parked hints trust that no vacant slot says parked (allocator/parking.rs).
        if let Some(&id) = self
            .blocks
            .vacant()
            .iter()
            .find(|&&id| self.blocks[id].parked)
        {
            return Err(format!("vacant slot {id} says parked"));
        }
        // The planner finds a freed block's log entry by its slot: each slot it says is live holds
        // an allocated block at the address the entry logged (slab compactions renumber both).
        if let Some(planner) = &self.planner {
            for (slot, ptr) in planner.logged_live() {
                let block = self.blocks.get(slot as BlockId);
                if !block.is_some_and(|b| b.allocated && b.ptr == ptr) {
                    return Err(format!(
                        "the planner's slot {slot} says {ptr:#x} is live, the slab says {block:?}"
                    ));
                }
            }
        }
        known.sort_unstable();
        known.dedup();
        if known.len() != self.blocks.len() {
            return Err(format!(
                "{} blocks in the slab, {} reachable",
                self.blocks.len(),
                known.len()
            ));
        }

        // Segments: walk each chain from its head; blocks tile it with no gap.
        let mut recount = DeviceStats::default();
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        let mut reserved = 0usize;
        // Per private pool: [small, large] reserved bytes.
        let mut pool_reserved: HashMap<PoolIndex, [i64; 2]> = HashMap::new();
        let mut seen = 0usize;
        for &head in known.iter().filter(|&&id| self.blocks[id].prev.is_none()) {
            let first = self.blocks[head];
            let slot = stat_type(first.pool) as usize;
            let mut cursor = Some(head);
            let mut end = first.ptr;
            let mut total = 0;
            while let Some(id) = cursor {
                let block = &self.blocks[id];
                seen += 1;
                if block.ptr != end {
                    return Err(format!(
                        "gap or overlap in a segment at {:#x} (expected {end:#x})",
                        block.ptr
                    ));
                }
                if block.stream != first.stream
                    || block.pool != first.pool
                    || block.private != first.private
                    || block.expandable != first.expandable
                {
                    return Err(format!(
                        "block at {:#x} differs from its segment in stream, pool or kind",
                        block.ptr
                    ));
                }
                let free = !block.allocated && block.event_count == 0;
                if let Some(next) = block.next {
                    let after = &self.blocks[next];
                    if after.prev != Some(id) {
                        return Err(format!("broken neighbour links after {:#x}", block.ptr));
                    }
                    // Free neighbours merge: two left side by side would each hold part of a page
                    // that neither could give back. A parked block waits to be unparked first.
                    if free
                        && !block.parked
                        && !after.parked
                        && !after.allocated
                        && after.event_count == 0
                        && after.mapped == block.mapped
                    {
                        return Err(format!(
                            "free blocks at {:#x} and {:#x} side by side, not merged",
                            block.ptr, after.ptr
                        ));
                    }
                }
                if free && block.mapped && !cached.contains(&id) && !parked.contains(&id) {
                    return Err(format!("free block at {:#x} is in no pool", block.ptr));
                }
                if block.parked != parked.contains(&id) {
                    return Err(format!(
                        "block at {:#x} is marked parked but not parked",
                        block.ptr
                    ));
                }
                if block.planned && !block.allocated {
                    return Err(format!("free block at {:#x} is marked planned", block.ptr));
                }
                if block.mapped && !block.ptr.is_multiple_of(512) {
                    return Err(format!("block at {:#x} is not 512-byte aligned", block.ptr));
                }
                if block.counted_oversize_segment != first.counted_oversize_segment {
                    return Err(format!(
                        "block at {:#x} disagrees with its segment on oversize",
                        block.ptr
                    ));
                }
                if block.counted_oversize_allocation {
                    if !block.allocated {
                        return Err(format!(
                            "free block at {:#x} still counted as an oversize allocation",
                            block.ptr
                        ));
                    }
                    recount.oversize_allocations.current += 1;
                }
                if block.allocated || block.event_count > 0 {
                    if block.allocated {
                        recount.allocation[slot].current += 1;
                        recount.allocated_bytes[slot].current += block.size as i64;
                    }
                    recount.active[slot].current += 1;
                    recount.active_bytes[slot].current += block.size as i64;
                    recount.requested_bytes[slot].current += block.requested_size as i64;
                } else if block.mapped && block.expandable.is_none() && block.is_split() {
                    recount.inactive_split[slot].current += 1;
                    recount.inactive_split_bytes[slot].current += block.size as i64;
                }
                if let Some(index) = block.expandable {
                    // The segment's pages are mapped where its blocks say: a page the device holds
                    // that no mapped block counts is memory lost to the books. Every page under a
                    // mapped block (as many as are reserved); an unmapped block's first and last
                    // (it may span a whole reservation, and a map undone half way leaves pages at
                    // its start).
                    let segment = &self.expandable[index as usize];
                    let (first, last) = segment.pages_covering(block.ptr, block.size);
                    let wrong = if block.mapped {
                        segment.mapped[first..last].contains(&false)
                    } else {
                        segment.mapped[first] || segment.mapped[last - 1]
                    };
                    if wrong {
                        return Err(format!(
                            "block {:#x}+{} is {} but a page under it is not",
                            block.ptr,
                            block.size,
                            if block.mapped { "mapped" } else { "unmapped" }
                        ));
                    }
                }
                if block.expandable.is_some() && block.mapped {
                    recount.reserved_bytes[slot].current += block.size as i64;
                    reserved += block.size;
                    if block.private != DEFAULT_POOLS {
                        pool_reserved.entry(block.private).or_default()[slot - 1] +=
                            block.size as i64;
                    }
                }
                end += block.size;
                total += block.size;
                cursor = block.next;
            }
            if first.counted_oversize_segment {
                recount.oversize_segments.current += 1;
            }
            match first.expandable {
                None => {
                    recount.segment[slot].current += 1;
                    recount.reserved_bytes[slot].current += total as i64;
                    reserved += total;
                    if first.private != DEFAULT_POOLS {
                        pool_reserved.entry(first.private).or_default()[slot - 1] += total as i64;
                    }
                }
                Some(index) => {
                    let segment = &self.expandable[index as usize];
                    if (first.ptr, total) != segment.range() {
                        return Err(format!(
                            "an expandable segment's blocks cover {:#x}+{total}, not its range",
                            first.ptr
                        ));
                    }
                }
            }
            ranges.push((first.ptr, total));
        }
        if seen != known.len() {
            return Err(format!(
                "{} blocks reachable, {seen} in segments",
                known.len()
            ));
        }
        ranges.sort_unstable();
        if let Some(pair) = ranges.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(format!(
                "segments overlap: {:#x}+{} and {:#x}",
                pair[0].0, pair[0].1, pair[1].0
            ));
        }
        for (index, pool) in self.private_pools.iter() {
            let kept = pool.reserved_bytes;
            let counted = pool_reserved.remove(&index).unwrap_or_default();
            if [kept.current(PoolKind::Small), kept.current(PoolKind::Large)] != counted {
                return Err(format!(
                    "pool {:?} counts {:?} reserved bytes (small, large) but holds {counted:?}",
                    pool.id,
                    [kept.current(PoolKind::Small), kept.current(PoolKind::Large)]
                ));
            }
        }
        // Sleep: paused pages are mapped in the books; each pool's paused bytes are its paused
        // pages, and its backups are theirs. Only a sleepable pool's ranges can pause (pause walks
        // no other), so only theirs are walked page by page: a default range of a large device has
        // hundreds of thousands of pages, and this runs after every operation in debug builds.
        let mut paused_pages: HashMap<PoolIndex, (usize, HashSet<usize>)> = HashMap::new();
        for segment in self
            .expandable
            .iter()
            .filter(|s| s.owner != DEFAULT_POOLS && self.private_pools.get(s.owner).sleep.sleepable)
        {
            for (page, (&mapped, &paused)) in segment.mapped.iter().zip(&segment.paused).enumerate()
            {
                if paused && !mapped {
                    return Err(format!(
                        "page {:#x} is paused but not mapped in the books",
                        segment.page_address(page)
                    ));
                }
                if paused {
                    let entry = paused_pages.entry(segment.owner).or_default();
                    entry.0 += segment.page;
                    entry.1.insert(segment.page_address(page));
                }
            }
        }
        let paused_everywhere: usize = paused_pages.values().map(|(bytes, _)| bytes).sum();
        if self.private_pools.paused_memory.current != paused_everywhere as i64 {
            return Err(format!(
                "paused memory is {} but {paused_everywhere} bytes of pages are paused",
                self.private_pools.paused_memory.current
            ));
        }
        for (index, pool) in self.private_pools.iter() {
            let (bytes, pages) = paused_pages.remove(&index).unwrap_or_default();
            if pool.sleep.paused_bytes != bytes
                || pool.sleep.backups.keys().any(|a| !pages.contains(a))
                || pool.sleep.paused != (bytes > 0)
            {
                return Err(format!(
                    "pool {:?} counts {} paused bytes (paused: {}) but has {bytes} in paused pages",
                    pool.id, pool.sleep.paused_bytes, pool.sleep.paused
                ));
            }
        }
        if !paused_pages.is_empty() {
            return Err("pages of a pool that is no more are paused".to_string());
        }
        if let Some((index, _)) = pool_reserved.into_iter().next() {
            return Err(format!(
                "segments belong to pool slot {index}, which does not exist"
            ));
        }
        if reserved != self.reserved_total {
            return Err(format!(
                "reserved_total is {} but segments add up to {reserved}",
                self.reserved_total
            ));
        }

        // The statistics' current values against the recount, slot by slot.
        for slot in [StatType::SmallPool as usize, StatType::LargePool as usize] {
            for family in [
                &mut recount.allocation,
                &mut recount.allocated_bytes,
                &mut recount.active,
                &mut recount.active_bytes,
                &mut recount.requested_bytes,
                &mut recount.segment,
                &mut recount.reserved_bytes,
                &mut recount.inactive_split,
                &mut recount.inactive_split_bytes,
            ] {
                family[StatType::All as usize].current += family[slot].current;
            }
        }
        let s = &self.stats();
        if s.oversize_allocations.current != recount.oversize_allocations.current
            || s.oversize_segments.current != recount.oversize_segments.current
        {
            return Err(format!(
                "oversize allocations/segments are {}/{} but the blocks give {}/{}",
                s.oversize_allocations.current,
                s.oversize_segments.current,
                recount.oversize_allocations.current,
                recount.oversize_segments.current
            ));
        }
        for (name, kept, counted) in [
            ("allocation", &s.allocation, &recount.allocation),
            (
                "allocated_bytes",
                &s.allocated_bytes,
                &recount.allocated_bytes,
            ),
            ("active", &s.active, &recount.active),
            ("active_bytes", &s.active_bytes, &recount.active_bytes),
            (
                "requested_bytes",
                &s.requested_bytes,
                &recount.requested_bytes,
            ),
            ("segment", &s.segment, &recount.segment),
            ("reserved_bytes", &s.reserved_bytes, &recount.reserved_bytes),
            ("inactive_split", &s.inactive_split, &recount.inactive_split),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                &recount.inactive_split_bytes,
            ),
        ] {
            for slot in 0..3 {
                if kept[slot].current != counted[slot].current {
                    return Err(format!(
                        "{name}.{}.current is {} but the blocks give {}",
                        super::super::stats::STAT_TYPE_NAMES[slot],
                        kept[slot].current,
                        counted[slot].current
                    ));
                }
                if kept[slot].peak < kept[slot].current {
                    return Err(format!("{name} peak below current"));
                }
            }
        }
        Ok(())
    }
}
