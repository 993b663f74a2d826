//! Blocks (pieces of segments), their slab, the free-block pools ordered by (stream, size, address),
//! and the pointer map of live allocations.

use super::policy::PoolKind;
use crate::backend::StreamId;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Index of a block in the slab.
pub type BlockId = u32;

/// A contiguous piece of one segment: handed out, or cached in a pool.
#[derive(Clone, Debug)]
pub struct Block {
    pub ptr: usize,
    pub size: usize,
    /// The size the caller asked for (0 while cached).
    pub requested_size: usize,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub allocated: bool,
    /// Neighbours in the same segment, by address.
    pub prev: Option<BlockId>,
    pub next: Option<BlockId>,
}

impl Block {
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

/// The cached (free) blocks of one pool.
#[derive(Default)]
pub struct BlockPool {
    pub blocks: BTreeMap<PoolKey, BlockId>,
}

impl BlockPool {
    #[inline]
    pub fn key(block: &Block) -> PoolKey {
        (block.stream, block.size, block.ptr)
    }

    #[inline]
    pub fn insert(&mut self, block: &Block, id: BlockId) {
        let previous = self.blocks.insert(Self::key(block), id);
        debug_assert!(previous.is_none(), "block cached twice");
    }

    #[inline]
    pub fn remove(&mut self, block: &Block) {
        let removed = self.blocks.remove(&Self::key(block));
        debug_assert!(removed.is_some(), "block was not cached");
    }

    /// The first cached block at or after (stream, size, 0).
    #[inline]
    pub fn lower_bound(&self, stream: StreamId, size: usize) -> Option<(PoolKey, BlockId)> {
        self.blocks
            .range((stream, size, 0)..)
            .next()
            .map(|(k, v)| (*k, *v))
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
