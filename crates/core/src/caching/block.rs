//! Blocks (pieces of segments), their slab, the free-block pools ordered by (stream, size, address),
//! and the pointer map of live allocations.

use super::policy::PoolKind;
use crate::backend::StreamId;
use std::collections::BTreeMap;
#[cfg(test)]
use std::collections::HashMap;

/// Index of a block in the slab.
pub type BlockId = u32;

/// Which pools a block's segment belongs to: 0 for the device's default pools, else a private pool's
/// slot (caching::pools) plus one.
pub type PoolIndex = u16;

/// The default pools' PoolIndex.
pub const DEFAULT_POOLS: PoolIndex = 0;

/// A contiguous piece of one segment: handed out, or cached in a pool.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub ptr: usize,
    pub size: usize,
    /// The size the caller asked for (0 while cached).
    pub requested_size: usize,
    pub stream: StreamId,
    pub pool: PoolKind,
    /// The pools its segment belongs to (DEFAULT_POOLS or a private pool's).
    pub private: PoolIndex,
    pub allocated: bool,
    /// Stream events still pending on a freed block; it returns to the pool when this reaches 0.
    pub event_count: u32,
    /// The pool's lookup count when this block was cached: its age for garbage collection.
    pub gc_count_base: u64,
    /// Backed by memory; false only for the unmapped address space of an expandable segment.
    pub mapped: bool,
    /// Index of the expandable segment this block lies in, if any.
    pub expandable: Option<u32>,
    /// This allocation was counted in oversize_allocations (so its free uncounts it, even if
    /// max_split_size changed meanwhile).
    pub counted_oversize_allocation: bool,
    /// Its segment was counted in oversize_segments (every block of the segment carries this).
    pub counted_oversize_segment: bool,
    /// Handed out at its planned address (planned_placement): its free parks it while that plan
    /// is in force.
    pub planned: bool,
    /// Free, and parked where the plan put it: kept in its pool's address index only, not merged
    /// with its free neighbours, so that the plan's next request of this address and size takes it
    /// whole (see allocator/parking.rs).
    pub parked: bool,
    /// Parked, or handed out from where it was parked, with no entry in its pool's address index:
    /// a part cut off a parked block, entered there only when something looks the index up
    /// (allocator/parking.rs, `index_rests`).
    pub unindexed: bool,
    /// Neighbours in the same segment, by address.
    pub prev: Option<BlockId>,
    pub next: Option<BlockId>,
}

impl Block {
    /// A free block with no neighbours yet.
    pub fn new(ptr: usize, size: usize, stream: StreamId, pool: PoolKind) -> Block {
        Block {
            ptr,
            size,
            requested_size: 0,
            stream,
            pool,
            private: DEFAULT_POOLS,
            allocated: false,
            event_count: 0,
            gc_count_base: 0,
            mapped: true,
            expandable: None,
            counted_oversize_allocation: false,
            counted_oversize_segment: false,
            planned: false,
            parked: false,
            unindexed: false,
            prev: None,
            next: None,
        }
    }

    /// Part of a segment that was cut in pieces (the segment is not this block alone).
    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// Block storage addressed by index, reusing freed slots so the hot path rarely allocates.
#[derive(Default)]
pub struct Slab {
    blocks: Vec<Block>,
    vacant: Vec<BlockId>,
}

impl Slab {
    pub fn insert(&mut self, block: Block) -> BlockId {
        if let Some(id) = self.vacant.pop() {
            self.blocks[id as usize] = block;
            id
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as BlockId
        }
    }

    pub fn remove(&mut self, id: BlockId) {
        self.vacant.push(id);
    }

    /// The slots no block holds now.
    pub fn vacant(&self) -> &[BlockId] {
        &self.vacant
    }

    /// The block in slot `id`, if the slab has such a slot (live or vacant: a vacant slot keeps
    /// what its last block held).
    #[inline]
    pub fn get(&self, id: BlockId) -> Option<&Block> {
        self.blocks.get(id as usize)
    }

    /// `get`, to change.
    #[inline]
    pub fn get_mut(&mut self, id: BlockId) -> Option<&mut Block> {
        self.blocks.get_mut(id as usize)
    }

    /// How many blocks are live.
    pub fn len(&self) -> usize {
        self.blocks.len() - self.vacant.len()
    }

    /// Whether the slab keeps far more slots than it has live blocks (after a peak of many small
    /// blocks): worth `compact`ing. A quarter live at most, so that a compacted slab must more than
    /// double before the answer is yes again.
    pub fn is_sparse(&self) -> bool {
        self.blocks.capacity() > MIN_SLAB_SLOTS && self.len() * 4 < self.blocks.capacity()
    }

    /// Renumber the live blocks 0, 1, ... in their present order and give the rest of the slots'
    /// memory back. Returns the new id of each old one (NO_BLOCK for vacant slots), which every
    /// holder of ids must then apply; the blocks' own neighbour links are renumbered here.
    pub fn compact(&mut self) -> Vec<BlockId> {
        let mut renumbered = vec![0 as BlockId; self.blocks.len()];
        for &id in &self.vacant {
            renumbered[id as usize] = NO_BLOCK;
        }
        let live = self.len();
        let mut blocks = Vec::with_capacity(live.max(MIN_SLAB_SLOTS));
        for (old, block) in self.blocks.iter().enumerate() {
            if renumbered[old] != NO_BLOCK {
                renumbered[old] = blocks.len() as BlockId;
                blocks.push(*block);
            }
        }
        for block in &mut blocks {
            block.prev = block.prev.map(|id| renumbered[id as usize]);
            block.next = block.next.map(|id| renumbered[id as usize]);
        }
        self.blocks = blocks;
        self.vacant = Vec::new();
        renumbered
    }

    /// Bytes of memory the slab keeps (its slots and its list of vacant ones).
    pub fn memory_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<Block>()
            + self.vacant.capacity() * std::mem::size_of::<BlockId>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::ops::Index<BlockId> for Slab {
    type Output = Block;
    #[inline]
    fn index(&self, id: BlockId) -> &Block {
        &self.blocks[id as usize]
    }
}

impl std::ops::IndexMut<BlockId> for Slab {
    #[inline]
    fn index_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id as usize]
    }
}

/// Slots a slab keeps however few blocks are live (a compaction below this would gain nothing).
const MIN_SLAB_SLOTS: usize = 1024;

/// Order of cached blocks: best fit is the first key >= (stream, size, 0).
pub type PoolKey = (StreamId, usize, usize);

/// The cached (free) blocks of one pool, ordered by (stream, size, address).
///
/// The most recently cached block waits in a one-entry staging slot in front of the ordered set: in
/// the common malloc/free cycle the block freed (or the remainder split off) is the next one taken, so
/// it never enters the tree. Every query sees the slot and the tree together, so the order, and with
/// it the choice of block, is exactly that of a single ordered set.
#[derive(Default)]
pub struct BlockPool {
    tree: BTreeMap<PoolKey, BlockId>,
    staged: Slot,
    /// Lookups made while garbage collection is on; a cached block's age is measured in them.
    pub lookups: u64,
    /// Unmapped address space of expandable segments, by (stream, address).
    pub unmapped: BTreeMap<(StreamId, usize), BlockId>,
    /// The cached blocks again, by (stream, address), kept only once `index_addresses` is called
    /// (planned placement asks for the free block at an address; nothing else does, so the
    /// pools of an allocator that does not plan pay one branch per change for it).
    by_address: Option<BTreeMap<(StreamId, usize), BlockId>>,
    /// Entries of `by_address` that are not in the tree: parked blocks, and blocks handed out at
    /// their planned address, which keep their entry for their free to park them
    /// (allocator/parking.rs).
    held: usize,
    /// How many of those are parked.
    parked: usize,
    /// Entries `hold` made so far (for the tests).
    #[cfg(test)]
    pub holds_made: usize,
}

impl BlockPool {
    #[inline]
    pub fn key(block: &Block) -> PoolKey {
        (block.stream, block.size, block.ptr)
    }

    #[inline]
    pub fn insert(&mut self, block: &Block, id: BlockId) {
        self.insert_key(Self::key(block), id);
    }

    /// Cache block `id` under `key` (its current key).
    #[inline]
    pub fn insert_key(&mut self, key: PoolKey, id: BlockId) {
        if let Some(index) = &mut self.by_address {
            index.insert((key.0, key.2), id);
        }
        if !self.staged.is_empty() {
            let displaced = self.tree.insert(self.staged.key(), self.staged.id);
            debug_assert!(displaced.is_none(), "block cached twice");
        }
        self.staged.set(key, id);
    }

    /// Take a block out of the pool by its current key.
    #[inline]
    pub fn remove(&mut self, block: &Block) {
        self.remove_key(&Self::key(block));
    }

    #[inline]
    pub fn remove_key(&mut self, key: &PoolKey) {
        if let Some(index) = &mut self.by_address {
            index.remove(&(key.0, key.2));
        }
        if self.staged.holds(key) {
            self.staged.clear();
        } else {
            let removed = self.tree.remove(key);
            debug_assert!(removed.is_some(), "block was not cached");
        }
    }

    /// The first cached block at or after (stream, size, 0).
    #[inline]
    pub fn lower_bound(&self, stream: StreamId, size: usize) -> Option<(PoolKey, BlockId)> {
        let bound = (stream, size, 0);
        if self.tree.is_empty() {
            return self
                .staged
                .at_or_after(stream, size)
                .then(|| (self.staged.key(), self.staged.id));
        }
        let in_tree = self.tree.range(bound..).next().map(|(k, v)| (*k, *v));
        let staged = self.staged.get().filter(|(key, _)| *key >= bound);
        match (in_tree, staged) {
            (Some(t), Some(s)) => Some(if s.0 < t.0 { s } else { t }),
            (t, s) => t.or(s),
        }
    }

    /// Take out the first cached block at or after (stream, size, 0) if `accept` takes its key.
    #[inline(always)]
    pub fn take_lower_bound(
        &mut self,
        stream: StreamId,
        size: usize,
        accept: impl FnOnce(PoolKey) -> bool,
    ) -> Option<BlockId> {
        let in_slot = self.staged.at_or_after(stream, size);
        if self.tree.is_empty() {
            if !in_slot || !accept(self.staged.key()) {
                return None;
            }
            let id = self.staged.id;
            if let Some(index) = &mut self.by_address {
                index.remove(&(self.staged.stream, self.staged.ptr));
            }
            self.staged.clear();
            return Some(id);
        }
        self.take_lower_bound_in_tree(stream, size, in_slot, accept)
    }

    /// take_lower_bound when the tree holds blocks too (out of line: the common cycle of one free
    /// block per pool never gets here).
    #[inline(never)]
    fn take_lower_bound_in_tree(
        &mut self,
        stream: StreamId,
        size: usize,
        in_slot: bool,
        accept: impl FnOnce(PoolKey) -> bool,
    ) -> Option<BlockId> {
        let (key, id) = match self.tree.range((stream, size, 0)..).next() {
            Some((key, _)) if in_slot && self.staged.key() < *key => {
                (self.staged.key(), self.staged.id)
            }
            Some((key, id)) => (*key, *id),
            None if in_slot => (self.staged.key(), self.staged.id),
            None => return None,
        };
        if !accept(key) {
            return None;
        }
        if let Some(index) = &mut self.by_address {
            index.remove(&(key.0, key.2));
        }
        if in_slot && id == self.staged.id {
            self.staged.clear();
        } else {
            self.tree.remove(&key);
        }
        Some(id)
    }

    /// The whole pool as one ordered map (moves the staged block into it; for the slow paths).
    pub fn ordered(&mut self) -> &BTreeMap<PoolKey, BlockId> {
        if let Some((key, id)) = self.staged.get() {
            self.staged.clear();
            self.tree.insert(key, id);
        }
        &self.tree
    }

    /// Every cached block with its key, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (PoolKey, BlockId)> + '_ {
        self.tree
            .iter()
            .map(|(k, v)| (*k, *v))
            .chain(self.staged.get())
    }

    /// Every cached block, in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.tree
            .values()
            .copied()
            .chain(self.staged.get().map(|(_, id)| id))
    }

    pub fn len(&self) -> usize {
        self.tree.len() + self.staged.get().is_some() as usize
    }

    /// Apply a slab compaction's new ids (`Slab::compact`).
    pub fn renumber(&mut self, renumbered: &[BlockId]) {
        for id in self.tree.values_mut().chain(self.unmapped.values_mut()) {
            *id = renumbered[*id as usize];
        }
        if let Some(index) = &mut self.by_address {
            for id in index.values_mut() {
                *id = renumbered[*id as usize];
            }
        }
        if !self.staged.is_empty() {
            self.staged.id = renumbered[self.staged.id as usize];
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keep the cached blocks by address from now on too (see `free_at_or_below`).
    pub fn index_addresses(&mut self) {
        if self.by_address.is_none() {
            let index = self.entries().map(|(k, id)| ((k.0, k.2), id)).collect();
            self.by_address = Some(index);
        }
    }

    /// The cached or parked block of `stream` with the highest address at or below `ptr` (None
    /// also when `index_addresses` was never called).
    pub fn free_at_or_below(&self, stream: StreamId, ptr: usize) -> Option<BlockId> {
        let index = self.by_address.as_ref()?;
        index
            .range((stream, 0)..=(stream, ptr))
            .next_back()
            .map(|(_, &id)| id)
    }

    /// Hold block `id` at (stream, ptr) in the address index alone, out of the tree that the
    /// policy searches. Only a pool that keeps the address index holds blocks.
    pub fn hold(&mut self, stream: StreamId, ptr: usize, id: BlockId) {
        let index = self
            .by_address
            .as_mut()
            .expect("holding needs the address index");
        let displaced = index.insert((stream, ptr), id);
        debug_assert!(displaced.is_none(), "two blocks at one address");
        self.held += 1;
        #[cfg(test)]
        {
            self.holds_made += 1;
        }
    }

    /// Drop the entry of the held block at (stream, ptr).
    pub fn release_hold(&mut self, stream: StreamId, ptr: usize) {
        let index = self
            .by_address
            .as_mut()
            .expect("holding needs the address index");
        let removed = index.remove(&(stream, ptr));
        debug_assert!(removed.is_some(), "no held block there");
        self.held -= 1;
    }

    /// A held block was parked (+1) or taken from its parking (-1).
    #[inline]
    pub fn count_parked(&mut self, change: isize) {
        self.parked = self.parked.wrapping_add_signed(change);
    }

    /// How many blocks are parked.
    #[inline]
    pub fn parked_len(&self) -> usize {
        self.parked
    }

    /// Every entry of the address index (cached and parked blocks), by (stream, address).
    pub fn by_address(&self) -> impl Iterator<Item = ((StreamId, usize), BlockId)> + '_ {
        self.by_address
            .iter()
            .flat_map(|index| index.iter().map(|(k, id)| (*k, *id)))
    }

    /// Whether the address index, when kept, holds exactly the cached blocks and the parked ones
    /// (for the invariants).
    pub fn address_index_agrees(&self) -> bool {
        self.by_address.as_ref().is_none_or(|index| {
            index.len() == self.len() + self.held
                && self
                    .entries()
                    .all(|(k, id)| index.get(&(k.0, k.2)) == Some(&id))
        })
    }
}

/// The staging slot: one cached block and its key, or none (id NO_BLOCK). Kept as plain scalar
/// fields, read and written one at a time: the free path writes the slot and the next malloc reads
/// it at once, and an Option of a tuple was copied with mixed-width moves that defeat the CPU's
/// store-to-load forwarding.
#[derive(Clone, Copy)]
struct Slot {
    stream: StreamId,
    size: usize,
    ptr: usize,
    id: BlockId,
}

const NO_BLOCK: BlockId = BlockId::MAX;

impl Default for Slot {
    fn default() -> Self {
        Slot {
            stream: 0,
            size: 0,
            ptr: 0,
            id: NO_BLOCK,
        }
    }
}

impl Slot {
    #[inline]
    fn is_empty(&self) -> bool {
        self.id == NO_BLOCK
    }

    #[inline]
    fn key(&self) -> PoolKey {
        (self.stream, self.size, self.ptr)
    }

    #[inline]
    fn get(&self) -> Option<(PoolKey, BlockId)> {
        if self.is_empty() {
            None
        } else {
            Some((self.key(), self.id))
        }
    }

    /// Whether the slot holds a block at or after (stream, size, 0).
    #[inline]
    fn at_or_after(&self, stream: StreamId, size: usize) -> bool {
        !self.is_empty() && (self.stream > stream || (self.stream == stream && self.size >= size))
    }

    #[inline]
    fn holds(&self, key: &PoolKey) -> bool {
        !self.is_empty() && self.ptr == key.2 && self.size == key.1 && self.stream == key.0
    }

    #[inline]
    fn clear(&mut self) {
        self.id = NO_BLOCK;
    }

    #[inline]
    fn set(&mut self, key: PoolKey, id: BlockId) {
        self.stream = key.0;
        self.size = key.1;
        self.ptr = key.2;
        self.id = id;
    }
}

/// Live allocations by address: an open-addressing table with linear probing, kept at most half
/// full. A general hash map costs several times more per insert and remove, and the pair of them is
/// on every malloc and free.
pub struct PtrMap {
    /// (address, block); EMPTY where the slot is free. Its length is a power of two.
    slots: Vec<(usize, BlockId)>,
    len: usize,
    /// 64 - log2(slots.len()): the hash's top bits pick the slot.
    shift: u32,
}

/// No block starts at the last address (blocks are at least 512 bytes).
const EMPTY: usize = usize::MAX;
const INITIAL_SLOTS: usize = 64;

impl Default for PtrMap {
    fn default() -> Self {
        PtrMap {
            slots: vec![(EMPTY, 0); INITIAL_SLOTS],
            len: 0,
            shift: 64 - INITIAL_SLOTS.trailing_zeros(),
        }
    }
}

impl PtrMap {
    /// Fibonacci hashing of the address without its low bits (blocks are 512-byte aligned).
    #[inline]
    fn home(&self, address: usize) -> usize {
        (((address as u64) >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot holding `address`, if it is in the map.
    #[inline]
    fn find(&self, address: usize) -> Option<usize> {
        // EMPTY is the key of every free slot (whose block id is stale): never a live address.
        if address == EMPTY {
            return None;
        }
        let mask = self.mask();
        let mut slot = self.home(address);
        loop {
            let key = self.slots[slot].0;
            if key == address {
                return Some(slot);
            }
            if key == EMPTY {
                return None;
            }
            slot = (slot + 1) & mask;
        }
    }

    /// Record a live block (its address is not in the map).
    #[inline]
    pub fn insert(&mut self, address: usize, id: BlockId) {
        debug_assert!(address != EMPTY);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut slot = self.home(address);
        while self.slots[slot].0 != EMPTY {
            debug_assert!(self.slots[slot].0 != address, "address inserted twice");
            slot = (slot + 1) & mask;
        }
        self.slots[slot] = (address, id);
        self.len += 1;
    }

    /// Forget `address`, returning its block.
    #[inline]
    pub fn remove(&mut self, address: &usize) -> Option<BlockId> {
        let mut hole = self.find(*address)?;
        let id = self.slots[hole].1;
        // Backward-shift deletion: pull later entries of the probe run into the hole, so that no
        // tombstones are needed.
        let mask = self.mask();
        let mut next = (hole + 1) & mask;
        loop {
            let key = self.slots[next].0;
            if key == EMPTY {
                break;
            }
            // The entry at `next` may move to `hole` when its home is not in (hole, next].
            let home = self.home(key);
            if (next.wrapping_sub(home) & mask) >= (next.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[next];
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.slots[hole].0 = EMPTY;
        self.len -= 1;
        Some(id)
    }

    #[inline]
    pub fn get(&self, address: &usize) -> Option<&BlockId> {
        self.find(*address).map(|slot| &self.slots[slot].1)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every (address, block), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&usize, &BlockId)> + '_ {
        self.slots
            .iter()
            .filter(|(key, _)| *key != EMPTY)
            .map(|(key, id)| (key, id))
    }

    /// Every live block, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &BlockId> + '_ {
        self.iter().map(|(_, id)| id)
    }

    #[cold]
    fn grow(&mut self) {
        self.rebuild(self.slots.len() * 2, |id| id);
    }

    /// Whether the table is at most an eighth full and larger than it starts: worth `shrink`ing.
    /// (It grows when more than half full, so a shrunk table is never about to grow again.)
    pub fn is_sparse(&self) -> bool {
        self.slots.len() > INITIAL_SLOTS && self.len * 8 <= self.slots.len()
    }

    /// Rebuild the table at its fitted size, giving the rest of its memory back.
    pub fn shrink(&mut self) {
        self.rebuild(self.fitted_slots(), |id| id);
    }

    /// `shrink`, and give every block its new id after a slab compaction (`Slab::compact`).
    pub fn renumber(&mut self, renumbered: &[BlockId]) {
        self.rebuild(self.fitted_slots(), |id| renumbered[id as usize]);
    }

    /// The size that leaves the table a quarter full at most (at least the initial size).
    fn fitted_slots(&self) -> usize {
        (self.len * 4).next_power_of_two().max(INITIAL_SLOTS)
    }

    /// Move every entry into a table of `slots` slots (a power of two, more than twice the entries).
    fn rebuild(&mut self, slots: usize, new_id: impl Fn(BlockId) -> BlockId) {
        debug_assert!(slots.is_power_of_two() && slots >= self.len * 2);
        let old = std::mem::replace(&mut self.slots, vec![(EMPTY, 0); slots]);
        self.shift = 64 - slots.trailing_zeros();
        self.len = 0;
        for (key, id) in old {
            if key != EMPTY {
                self.insert(key, new_id(id));
            }
        }
    }

    /// Bytes of memory the table keeps.
    pub fn memory_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<(usize, BlockId)>()
    }
}

impl<'a> IntoIterator for &'a PtrMap {
    type Item = (&'a usize, &'a BlockId);
    type IntoIter = Box<dyn Iterator<Item = (&'a usize, &'a BlockId)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_map_agrees_with_a_hash_map() {
        let mut map = PtrMap::default();
        let mut reference = HashMap::new();
        let mut state: u64 = 1;
        for step in 0..20_000u32 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Few distinct addresses, so that inserts and removes collide and wrap around.
            let address = 0x7f00_0000_0000 + ((state >> 33) as usize % 3000) * 512;
            if let Some(id) = reference.remove(&address) {
                assert_eq!(map.remove(&address), Some(id));
            } else {
                map.insert(address, step);
                reference.insert(address, step);
            }
            assert_eq!(map.len(), reference.len());
            if step % 1000 == 0 {
                for (address, id) in &reference {
                    assert_eq!(map.get(address), Some(id));
                }
                assert_eq!(map.iter().count(), reference.len());
            }
        }
        assert_eq!(map.get(&0x1000), None);
        assert_eq!(map.remove(&0x1000), None);
    }

    #[test]
    fn the_empty_key_is_never_found() {
        let mut map = PtrMap::default();
        // Free slots keep the block ids of the entries removed from them.
        for id in 0..40 {
            map.insert(0x10_0000 + id as usize * 512, id);
        }
        for id in 0..39 {
            map.remove(&(0x10_0000 + id as usize * 512));
        }
        assert_eq!(map.get(&EMPTY), None);
        assert_eq!(map.remove(&EMPTY), None);
        assert_eq!(map.len(), 1);
        assert_eq!(map.get(&(0x10_0000 + 39 * 512)), Some(&39));
    }
}
