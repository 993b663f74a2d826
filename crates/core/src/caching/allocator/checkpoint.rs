//! A private pool's layout, checkpointed and put back (PyTorch's getCheckpointState and
//! setCheckpointPoolState). CUDA graph trees (torch.compile's mode="reduce-overhead") take a
//! checkpoint of the graph pool after recording each graph. Replaying a graph hands out no block,
//! so when a tree must record a new graph after a replay, it puts the pool back as it was after the
//! replayed graph's recording: the blocks live now are freed, and the blocks live then (the replayed
//! outputs) are handed out again at their addresses.
//!
//! Putting back checks everything first and changes nothing when it refuses: the pool exists and is
//! in use, no block of it waits for a stream, and each checkpointed segment is still the pool's,
//! with the same address and stream and at least its size (an expandable segment may have grown).
//! Statistics move as PyTorch's do: the live blocks are freed, then every checkpointed block is
//! handed out in turn (its size asked for) and those free at the checkpoint are freed again; no
//! segment is taken or given back.

use super::*;
use crate::caching::pools::MempoolId;

/// A block of a checkpointed segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointBlock {
    pub ptr: usize,
    pub size: usize,
    /// Handed out at the checkpoint (else free).
    pub allocated: bool,
}

/// A segment of a checkpointed pool (for an expandable segment, a mapped stretch of it, as
/// snapshots show it): its blocks in address order, end to end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSegment {
    pub address: usize,
    pub stream: StreamId,
    pub blocks: Vec<CheckpointBlock>,
}

impl CheckpointSegment {
    fn size(&self) -> usize {
        self.blocks.iter().map(|b| b.size).sum()
    }
}

/// A private pool's layout at one moment: every segment it held and which blocks were handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolCheckpoint {
    pub pool: MempoolId,
    pub segments: Vec<CheckpointSegment>,
}

impl PoolCheckpoint {
    /// The blocks handed out at the checkpoint, (address, size), in address order per segment.
    pub fn allocations(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.allocated)
            .map(|b| (b.ptr, b.size))
    }
}

/// What putting a checkpoint back did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// The pool's allocations live before, now freed (ascending).
    pub freed: Vec<usize>,
    /// The checkpoint's allocations, handed out again: (address, size). An address may be in both.
    pub allocated: Vec<(usize, usize)>,
}

impl CachingAllocator {
    /// getCheckpointState: the layout of pool `id` now. Refused while one of its blocks waits for
    /// a stream's event (PyTorch's rule: synchronize first) or while it is paused.
    pub fn pool_checkpoint(&self, id: MempoolId) -> Result<PoolCheckpoint> {
        self.checkpointable_pool(id)?;
        let mut segments = Vec::new();
        for segment in self.segments().into_iter().filter(|s| s.pool_id == id) {
            let mut blocks = Vec::with_capacity(segment.blocks.len());
            for block in &segment.blocks {
                if block.state == BlockState::ActivePendingFree {
                    return Err(waits_for_a_stream(id, block.address));
                }
                blocks.push(CheckpointBlock {
                    ptr: block.address,
                    size: block.size,
                    allocated: block.state == BlockState::ActiveAllocated,
                });
            }
            segments.push(CheckpointSegment {
                address: segment.address,
                stream: segment.stream,
                blocks,
            });
        }
        Ok(PoolCheckpoint { pool: id, segments })
    }

    /// setCheckpointPoolState: put pool `checkpoint.pool` back as the checkpoint found it (see the
    /// module's comment). Refused, nothing changed, when the pool is gone, released (no use left) or
    /// paused, when one of its blocks waits for or is used by another stream, or when a
    /// checkpointed segment is not the pool's as it was.
    pub fn restore_pool_checkpoint(&mut self, checkpoint: &PoolCheckpoint) -> Result<Restored> {
        let result = self.restore_unchecked(checkpoint);
        self.verify("pool restore");
        result
    }

    fn restore_unchecked(&mut self, checkpoint: &PoolCheckpoint) -> Result<Restored> {
        let id = checkpoint.pool;
        let index = self.checkpointable_pool(id)?;
        if self.private_pools.get(index).use_count == 0 {
            return Err(Error::invalid_argument(format!(
                "pool ({}, {}) was released (no use left): a checkpoint is put back into a pool in use",
                id.0, id.1
            )));
        }
        let live = self
            .pool_live_allocations(id)
            .expect("the pool exists: checked above");
        if let Some(&ptr) = live.iter().find(|&&ptr| {
            self.active
                .get(&ptr)
                .is_some_and(|block| self.stream_uses.contains_key(block))
        }) {
            return Err(Error::invalid_argument(format!(
                "the block at {ptr:#x} of pool ({}, {}) is used by other streams (record_stream): its \
                 free would wait for them; synchronize and free it before putting a checkpoint back",
                id.0, id.1
            )));
        }
        // Once its live blocks are freed, each segment of the pool is one free block: the
        // checkpoint's segments must be these, as they were. The pool's layout now (refused, as a
        // checkpoint is, while a block of it waits for a stream).
        let now: HashMap<usize, (usize, StreamId)> = self
            .pool_checkpoint(id)?
            .segments
            .iter()
            .map(|s| (s.address, (s.size(), s.stream)))
            .collect();
        let mut addresses: Vec<usize> = checkpoint.segments.iter().map(|s| s.address).collect();
        addresses.sort_unstable();
        if let Some(twice) = addresses.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(Error::invalid_argument(format!(
                "the checkpoint holds the segment at {:#x} twice",
                twice[0]
            )));
        }
        for segment in &checkpoint.segments {
            let mut end = segment.address;
            for block in &segment.blocks {
                if block.ptr != end || block.size == 0 {
                    return Err(Error::invalid_argument(format!(
                        "the checkpoint's segment at {:#x} does not hold its blocks end to end (a \
                         block at {:#x} of {} bytes)",
                        segment.address, block.ptr, block.size
                    )));
                }
                end += block.size;
            }
            // An expandable segment may have grown since (its blocks then end in more free space,
            // as PyTorch's would); one that lost pages or went is refused.
            let still = now
                .get(&segment.address)
                .is_some_and(|&(size, stream)| size >= segment.size() && stream == segment.stream);
            if !still {
                return Err(Error::invalid_argument(format!(
                    "the checkpoint's segment at {:#x} ({} bytes, stream {:#x}) is no longer pool \
                     ({}, {})'s as it was (released or shrunk since)",
                    segment.address,
                    segment.size(),
                    segment.stream,
                    id.0,
                    id.1
                )));
            }
        }
        // Checked: from here on nothing can refuse.
        for &ptr in &live {
            self.free_unchecked(ptr)?;
        }
        let mut allocated = Vec::new();
        for segment in &checkpoint.segments {
            let rest = self.free_block_at(index, segment.address);
            for block in &segment.blocks {
                let found = self.blocks[rest];
                debug_assert_eq!(
                    found.ptr, block.ptr,
                    "the free rest starts at the next block"
                );
                self.pool_mut(found.private, found.pool)
                    .remove_key(&BlockPool::key(&found));
                // The block handed out takes the front; `rest` keeps what is left, cached again
                // (only the segment's last block may take all of it: the sizes were checked).
                let split = block.size < found.size;
                self.hand_out_block(rest, block.size, block.size, split);
            }
            for block in &segment.blocks {
                if block.allocated {
                    allocated.push((block.ptr, block.size));
                } else {
                    self.free_unchecked(block.ptr)?;
                }
            }
        }
        Ok(Restored {
            freed: live,
            allocated,
        })
    }

    /// The index of pool `id`, which a checkpoint may be taken of or put back into.
    fn checkpointable_pool(&self, id: MempoolId) -> Result<PoolIndex> {
        let index = self.private_pools.index_of(id).ok_or_else(|| {
            Error::invalid_argument(format!("pool ({}, {}) does not exist", id.0, id.1))
        })?;
        if self.pool_paused(index) {
            return Err(Error::invalid_argument(format!(
                "pool ({}, {}) is paused: resume it first",
                id.0, id.1
            )));
        }
        if let Some(&block) = self
            .private_pools
            .deferred_frees
            .iter()
            .find(|&&block| self.blocks[block].private == index)
        {
            return Err(waits_for_a_stream(id, self.blocks[block].ptr));
        }
        Ok(index)
    }

    /// The free block of private pool `index` that starts at `address`.
    fn free_block_at(&self, index: PoolIndex, address: usize) -> BlockId {
        let pool = self.private_pools.get(index);
        pool.small
            .ids()
            .chain(pool.large.ids())
            .find(|&block| self.blocks[block].ptr == address)
            .expect("a checked segment of the pool is one free block once its blocks are freed")
    }
}

fn waits_for_a_stream(id: MempoolId, address: usize) -> Error {
    Error::invalid_argument(format!(
        "the block at {address:#x} of pool ({}, {}) was freed and waits for another stream's work: \
         synchronize (or end the capture) first",
        id.0, id.1
    ))
}
