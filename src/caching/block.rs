//! Blocks (pieces of segments), their slab, the free-block pools ordered by (stream, size, address),
//! and the pointer map of live allocations.

use super::policy::PoolKind;
use crate::backend::StreamId;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Index of a block in the slab.
pub type BlockId = u32;

/// A contiguous piece of one segment: handed out, or cached in a pool.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub ptr: usize,
    pub size: usize,
    /// The size the caller asked for (0 while cached).
    pub requested_size: usize,
    pub stream: StreamId,
    pub pool: PoolKind,
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
            allocated: false,
            event_count: 0,
            gc_count_base: 0,
            mapped: true,
            expandable: None,
            counted_oversize_allocation: false,
            counted_oversize_segment: false,
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

    /// How many blocks are live.
    pub fn len(&self) -> usize {
        self.blocks.len() - self.vacant.len()
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
    staged: Option<(PoolKey, BlockId)>,
    /// Lookups made while garbage collection is on; a cached block's age is measured in them.
    pub lookups: u64,
    /// Unmapped address space of expandable segments, by (stream, address).
    pub unmapped: BTreeMap<(StreamId, usize), BlockId>,
}

impl BlockPool {
    #[inline]
    pub fn key(block: &Block) -> PoolKey {
        (block.stream, block.size, block.ptr)
    }

    #[inline]
    pub fn insert(&mut self, block: &Block, id: BlockId) {
        if let Some((key, previous)) = self.staged.replace((Self::key(block), id)) {
            let displaced = self.tree.insert(key, previous);
            debug_assert!(displaced.is_none(), "block cached twice");
        }
    }

    /// Take a block out of the pool by its current key.
    #[inline]
    pub fn remove(&mut self, block: &Block) {
        self.remove_key(&Self::key(block));
    }

    #[inline]
    pub fn remove_key(&mut self, key: &PoolKey) {
        if self.staged.is_some_and(|(staged, _)| staged == *key) {
            self.staged = None;
        } else {
            let removed = self.tree.remove(key);
            debug_assert!(removed.is_some(), "block was not cached");
        }
    }

    /// The first cached block at or after (stream, size, 0).
    #[inline]
    pub fn lower_bound(&self, stream: StreamId, size: usize) -> Option<(PoolKey, BlockId)> {
        let bound = (stream, size, 0);
        let in_tree = self.tree.range(bound..).next().map(|(k, v)| (*k, *v));
        let staged = self.staged.filter(|(key, _)| *key >= bound);
        match (in_tree, staged) {
            (Some(t), Some(s)) => Some(if s.0 < t.0 { s } else { t }),
            (t, s) => t.or(s),
        }
    }

    /// The whole pool as one ordered map (moves the staged block into it; for the slow paths).
    pub fn ordered(&mut self) -> &BTreeMap<PoolKey, BlockId> {
        if let Some((key, id)) = self.staged.take() {
            self.tree.insert(key, id);
        }
        &self.tree
    }

    /// Every cached block with its key, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (PoolKey, BlockId)> + '_ {
        self.tree.iter().map(|(k, v)| (*k, *v)).chain(self.staged)
    }

    /// Every cached block, in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.tree
            .values()
            .copied()
            .chain(self.staged.map(|(_, id)| id))
    }

    pub fn len(&self) -> usize {
        self.tree.len() + self.staged.is_some() as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A hasher for addresses: blocks are 512-byte aligned, so drop those bits and mix the rest.
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    #[inline]
    fn write_usize(&mut self, address: usize) {
        let mixed = ((address as u64) >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Fold the high bits down: the table indexes by the low bits, the control bytes by the high.
        self.0 = mixed ^ (mixed >> 29);
    }
}

/// Live allocations by address.
pub type PtrMap = HashMap<usize, BlockId, BuildHasherDefault<AddressHasher>>;
