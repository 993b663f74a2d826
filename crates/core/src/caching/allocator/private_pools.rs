//! Private pools on one device: making, routing to, releasing and emptying them (the rules are in
//! caching/pools.rs).

use super::*;
use crate::caching::pools::{MempoolId, Route};

impl CachingAllocator {
    /// MemPool(allocator=None, use_on_oom, no_split): the pool `id` with one use (or one more use of
    /// it if it exists), and its flags.
    pub fn create_pool(&mut self, id: MempoolId, use_on_oom: bool, no_split: bool) -> Result<()> {
        self.private_pools.create_or_incref(id)?;
        self.private_pools.set_flags(id, Some(use_on_oom), no_split)
    }

    /// createOrIncrefPool: pool `id` with one use if new, else one more use of it (its flags
    /// unchanged).
    pub fn retain_pool(&mut self, id: MempoolId) -> Result<()> {
        self.private_pools.create_or_incref(id).map(|_| ())
    }

    /// setUseOnOOM and setNoSplit: use_on_oom as given (None: unchanged); no_split set when asked
    /// (it stays set).
    pub fn set_pool_flags(
        &mut self,
        id: MempoolId,
        use_on_oom: Option<bool>,
        no_split: bool,
    ) -> Result<()> {
        self.private_pools.set_flags(id, use_on_oom, no_split)
    }

    /// MemPool(allocator, use_on_oom, no_split): a new pool `id` whose segments come from
    /// `allocator` (its raw_alloc and raw_free, and its virtual memory for expandable segments when
    /// it has some: else the pool's segments are ordinary ones). Refused, nothing changed, when the
    /// pool exists already.
    pub fn create_pool_with_allocator(
        &mut self,
        id: MempoolId,
        use_on_oom: bool,
        no_split: bool,
        allocator: Arc<dyn Backend>,
    ) -> Result<()> {
        if self.private_pools.index_of(id).is_some() {
            return Err(Error::invalid_argument(format!(
                "pool ({}, {}) exists already: an allocator is given when a pool is made",
                id.0, id.1
            )));
        }
        self.create_pool(id, use_on_oom, no_split)?;
        self.private_pools.set_allocator(id, allocator)
    }

    /// Where the segments of `private` come from: its own allocator, else the device's backend.
    pub(super) fn segment_backend(&self, private: PoolIndex) -> Arc<dyn Backend> {
        if private != DEFAULT_POOLS {
            if let Some(allocator) = self.private_pools.allocator(private) {
                return allocator.clone();
            }
        }
        self.backend.clone()
    }

    /// beginAllocateToPool: allocations `route` accepts go to pool `id` (made with one use if new;
    /// else one use more) until end_allocate_to_pool.
    pub fn begin_allocate_to_pool(&mut self, id: MempoolId, route: Route) -> Result<()> {
        self.private_pools.begin(id, route)?;
        self.routing = true;
        self.capturing = self.private_pools.capturing();
        Ok(())
    }

    /// endAllocateToPool: allocations stop going to pool `id`. Returns the route that ended: a
    /// filter given by a caller is theirs to drop once the device is let go.
    pub fn end_allocate_to_pool(&mut self, id: MempoolId) -> Result<Route> {
        let route = self.private_pools.end(id)?;
        self.routing = self.private_pools.closes_cached_path();
        self.capturing = self.private_pools.capturing();
        Ok(route)
    }

    /// releasePool: one use of pool `id` less; at none it is freeable, and empty_cache gives its free
    /// segments back.
    pub fn release_pool(&mut self, id: MempoolId) -> Result<()> {
        self.private_pools.release(id)
    }

    /// PyTorch's emptyCache(id): a freeable pool's free whole segments go back to the backend, and
    /// the pool is erased once it has none. Nothing happens to a live pool or an unknown id.
    pub fn empty_pool_cache(&mut self, id: MempoolId) -> Result<()> {
        let Some(index) = self.private_pools.index_of(id) else {
            return Ok(());
        };
        if self.private_pools.get(index).use_count > 0 {
            return Ok(());
        }
        self.empty_pool_at(index)
    }

    /// accalloc's own, beyond PyTorch: the free whole segments of pool `id` go back to the backend
    /// even while the pool is live (PyTorch keeps them reserved for as long as the pool lives:
    /// pytorch#159674). Blocks waiting on stream events are synchronized first, as empty_cache does.
    pub fn empty_live_pool(&mut self, id: MempoolId) -> Result<()> {
        let index = self.private_pools.index_of(id).ok_or_else(|| {
            Error::invalid_argument(format!("pool ({}, {}) does not exist", id.0, id.1))
        })?;
        self.empty_pool_at(index)
    }

    /// Both empties: synchronize first (PyTorch counts it), so that the pool's blocks waiting on
    /// events come back; then its free whole segments go, and a freeable pool left empty is erased.
    fn empty_pool_at(&mut self, index: PoolIndex) -> Result<()> {
        let result = self
            .synchronize_and_free_events()
            .and_then(|()| self.release_pool_blocks(index))
            .and_then(|()| self.release_empty_reservations_of(index));
        self.private_pools.erase_if_empty(index);
        self.verify("pool empty");
        result
    }

    /// The use count of pool `id` (None: no such pool).
    pub fn pool_use_count(&self, id: MempoolId) -> Option<u32> {
        let index = self.private_pools.index_of(id)?;
        Some(self.private_pools.get(index).use_count)
    }

    /// The addresses of pool `id`'s live allocations (handed out and not yet freed; a freed block
    /// waiting for its streams' events is not live), ascending (None: no such pool). CUDA graph
    /// trees compare them with the tensors they hold (PyTorch's checkPoolLiveAllocations).
    pub fn pool_live_allocations(&self, id: MempoolId) -> Option<Vec<usize>> {
        let index = self.private_pools.index_of(id)?;
        let mut live: Vec<usize> = self
            .active
            .values()
            .map(|&block| &self.blocks[block])
            .filter(|block| block.private == index)
            .map(|block| block.ptr)
            .collect();
        live.sort_unstable();
        Some(live)
    }

    /// The segments pool `id` holds (None: no such pool).
    pub fn pool_segment_count(&self, id: MempoolId) -> Option<usize> {
        let index = self.private_pools.index_of(id)?;
        Some(self.private_pools.get(index).segments)
    }

    /// Pool `id`'s reserved bytes, [all, small pool, large pool] (PyTorch's
    /// reserved_bytes_by_private_pools; None: no such pool).
    pub fn pool_reserved_bytes(&self, id: MempoolId) -> Option<crate::caching::stats::StatArray> {
        let index = self.private_pools.index_of(id)?;
        Some(self.private_pools.get(index).reserved_bytes.slots())
    }

    /// The pool a segment starting at `ptr` belongs to, (0, 0) for the default pools (snapshots'
    /// segment_pool_id).
    pub fn pool_of_block(&self, private: PoolIndex) -> MempoolId {
        if private == DEFAULT_POOLS {
            (0, 0)
        } else {
            self.private_pools.get(private).id
        }
    }
}
