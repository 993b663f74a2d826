//! Private pools (PyTorch's MemPool and CUDA graph pools): segments of their own, cached and reused
//! within the pool, and the routing of allocations to them.
//!
//! PyTorch's rules (CUDACachingAllocator's PrivatePool): a pool has an id (a pair; the default pools
//! are (0, 0)), a use count, the count of its segments, its own small and large BlockPools, and the
//! flags use_on_oom and no_split. Creating a pool, or beginning to allocate to it, counts a use;
//! releasing it uncounts one, and at zero the pool is *freeable*: empty_cache then gives back its free
//! whole segments and erases it once it has none. Allocations are routed to the newest pool begun
//! whose filter accepts the request: the calling thread (use_mem_pool) or a stream (a graph capture).
//! Only a stream's route is a capture, with PyTorch 2.15's capture rules (see `capturing`).

use super::block::{BlockId, BlockPool, PoolIndex, DEFAULT_POOLS};
use super::policy::PoolKind;
use super::stats::{PooledStat, Stat};
use crate::backend::{Backend, StreamId};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::ThreadId;

/// A pool's id, PyTorch's MempoolId_t: (0, 0) is the default pools; MemPool() and
/// graph_pool_handle() make (0, n), a graph's own pool (n, 0).
pub type MempoolId = (u64, u64);

/// Decides, for the stream of a request, whether the request goes to the pool (a CUDA graph's
/// capture-id test, say).
pub type StreamFilter = Arc<dyn Fn(StreamId) -> bool + Send + Sync>;

/// Which allocations a begun pool takes.
#[derive(Clone)]
pub enum Route {
    /// Those of one thread, on any stream (use_mem_pool).
    Thread(ThreadId),
    /// Those on one stream, from any thread (a graph capture).
    Stream(StreamId),
    /// Those whose stream the filter accepts (PyTorch's beginAllocateToPool filter); `capture`:
    /// whether it is a graph capture, whose rules then hold while it is begun.
    Filter {
        accepts: StreamFilter,
        capture: bool,
    },
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::Thread(thread) => write!(f, "Thread({thread:?})"),
            Route::Stream(stream) => write!(f, "Stream({stream})"),
            Route::Filter { capture, .. } => write!(f, "Filter {{ capture: {capture} }}"),
        }
    }
}

/// One private pool.
pub struct PrivatePool {
    pub id: MempoolId,
    /// Creations and begins not yet released; 0: freeable.
    pub use_count: u32,
    /// Its segments held from the backend (PyTorch's cudaMalloc_count).
    pub segments: usize,
    /// Its expandable segments' address ranges (a pool is erased only once it holds none).
    pub reservations: usize,
    /// Its share of reserved_bytes (PyTorch's reserved_bytes_by_private_pools): its segments and
    /// its mapped pages.
    pub reserved_bytes: PooledStat,
    pub small: BlockPool,
    pub large: BlockPool,
    /// A default-pool request about to fail may take one of its free blocks.
    pub use_on_oom: bool,
    /// Its blocks are never split: a request gets a whole free block or segment.
    pub no_split: bool,
    /// Where its segments come from, when not from the device's backend (MemPool(allocator=...)):
    /// raw alloc and free, and virtual memory if it has any; everything else is the device's.
    pub allocator: Option<Arc<dyn Backend>>,
    /// Sleep and wake (allocator/sleep.rs).
    pub sleep: SleepState,
}

/// A pool's sleep: whether it may pause, whether it is paused, and what a pause kept.
#[derive(Default)]
pub struct SleepState {
    /// Its segments are expandable whatever the settings say, so that they can pause.
    pub sleepable: bool,
    /// Some of its pages are paused: allocations routed to it are refused.
    pub paused: bool,
    pub paused_bytes: usize,
    /// The contents of paused pages, by page address, when the pause kept them.
    pub backups: BTreeMap<usize, Vec<u8>>,
}

/// Every private pool of one device, and the pools allocations are being routed to.
#[derive(Default)]
pub struct PrivatePools {
    /// By slot; a block's PoolIndex is its pool's slot plus one.
    slots: Vec<Option<PrivatePool>>,
    by_id: BTreeMap<MempoolId, PoolIndex>,
    /// Pools begun, oldest first, with their filter.
    captures: Vec<(MempoolId, PoolIndex, Route)>,
    /// Blocks other streams used that were freed during a capture, when no event may be recorded
    /// or queried: their events are recorded once no capture is underway (PyTorch's
    /// needs_events_deferred_until_no_capture). Each counts one placeholder in its event_count.
    pub deferred_frees: Vec<BlockId>,
    /// Bytes paused on the device, over every pool: current, peak, paused and resumed in all (the
    /// memory_summary's "Paused memory" row; not one of PyTorch's statistics).
    pub paused_memory: Stat,
}

impl PrivatePools {
    /// Whether any allocation is being routed to a private pool.
    #[inline(always)]
    pub fn routing(&self) -> bool {
        !self.captures.is_empty()
    }

    /// Whether malloc must go past the cached path: a pool is begun, or frees deferred by a
    /// capture still wait for their events (the allocator's `routing` flag mirrors this).
    pub fn closes_cached_path(&self) -> bool {
        self.routing() || !self.deferred_frees.is_empty()
    }

    /// Whether a capture is underway: a pool begun for a stream (or a filter). PyTorch 2.15 applies its capture
    /// rules (no event processing in malloc, no last-resort release, empty_cache leaving the
    /// default pools alone) only while a stream is being captured, not for use_mem_pool's thread
    /// routing (pytorch#159674's fix).
    pub fn capturing(&self) -> bool {
        self.captures.iter().any(|(_, _, route)| {
            matches!(
                route,
                Route::Stream(_) | Route::Filter { capture: true, .. }
            )
        })
    }

    /// The pools a request on `stream` from this thread goes to: the newest begun pool whose filter
    /// accepts it, else the default pools.
    #[inline]
    pub fn route(&self, stream: StreamId) -> PoolIndex {
        if self.captures.is_empty() {
            return DEFAULT_POOLS;
        }
        let thread = std::thread::current().id();
        self.captures
            .iter()
            .rev()
            .find(|(_, _, route)| match route {
                Route::Thread(t) => *t == thread,
                Route::Stream(s) => *s == stream,
                Route::Filter { accepts, .. } => accepts(stream),
            })
            .map_or(DEFAULT_POOLS, |&(_, index, _)| index)
    }

    fn slot(index: PoolIndex) -> usize {
        debug_assert!(index != DEFAULT_POOLS);
        index as usize - 1
    }

    /// The pool at `index` (a block's PoolIndex: it exists while the block does).
    pub fn get(&self, index: PoolIndex) -> &PrivatePool {
        self.slots[Self::slot(index)]
            .as_ref()
            .expect("a private pool outlives its blocks")
    }

    fn get_mut(&mut self, index: PoolIndex) -> &mut PrivatePool {
        self.slots[Self::slot(index)]
            .as_mut()
            .expect("a private pool outlives its blocks")
    }

    /// The BlockPool of `kind` of the pool at `index`.
    pub fn blocks(&self, index: PoolIndex, kind: PoolKind) -> &BlockPool {
        let pool = self.get(index);
        match kind {
            PoolKind::Small => &pool.small,
            PoolKind::Large => &pool.large,
        }
    }

    /// The same, to change.
    #[inline]
    pub fn blocks_mut(&mut self, index: PoolIndex, kind: PoolKind) -> &mut BlockPool {
        let pool = self.get_mut(index);
        match kind {
            PoolKind::Small => &mut pool.small,
            PoolKind::Large => &mut pool.large,
        }
    }

    pub fn no_split(&self, index: PoolIndex) -> bool {
        self.get(index).no_split
    }

    /// The pool of `id`, if it exists.
    pub fn index_of(&self, id: MempoolId) -> Option<PoolIndex> {
        self.by_id.get(&id).copied()
    }

    /// Every pool: (index, pool), by id.
    pub fn iter(&self) -> impl Iterator<Item = (PoolIndex, &PrivatePool)> + '_ {
        self.by_id.values().map(|&index| (index, self.get(index)))
    }

    /// The use_on_oom pools, by id.
    pub fn use_on_oom_pools(&self) -> Vec<PoolIndex> {
        self.iter()
            .filter(|(_, pool)| pool.use_on_oom)
            .map(|(index, _)| index)
            .collect()
    }

    /// The paused pools that are not freeable (those are released anyway), by id.
    pub fn paused(&self) -> Vec<PoolIndex> {
        self.iter()
            .filter(|(_, pool)| pool.sleep.paused && pool.use_count > 0)
            .map(|(index, _)| index)
            .collect()
    }

    /// The freeable pools (use count 0), by id.
    pub fn freeable(&self) -> Vec<PoolIndex> {
        self.iter()
            .filter(|(_, pool)| pool.use_count == 0)
            .map(|(index, _)| index)
            .collect()
    }

    pub fn segment_added(&mut self, index: PoolIndex) {
        self.get_mut(index).segments += 1;
    }

    pub fn segment_removed(&mut self, index: PoolIndex) {
        self.get_mut(index).segments -= 1;
    }

    /// The pool's reserved bytes moved by `amount` (an increase when positive).
    pub fn reserved_moved(&mut self, index: PoolIndex, kind: PoolKind, amount: i64) {
        self.get_mut(index).reserved_bytes.add(kind, amount);
    }

    /// reset_accumulated_memory_stats and reset_peak_memory_stats, for every pool's figures.
    pub fn reset_stats(&mut self, accumulated: bool, peak: bool) {
        if accumulated {
            self.paused_memory.reset_accumulated();
        }
        if peak {
            self.paused_memory.reset_peak();
        }
        for pool in self.slots.iter_mut().flatten() {
            if accumulated {
                pool.reserved_bytes.reset_accumulated();
            }
            if peak {
                pool.reserved_bytes.reset_peak();
            }
        }
    }

    pub fn reservation_added(&mut self, index: PoolIndex) {
        self.get_mut(index).reservations += 1;
    }

    pub fn reservation_removed(&mut self, index: PoolIndex) {
        self.get_mut(index).reservations -= 1;
    }

    /// Erase a freeable pool that holds no segment and no reservation (empty_cache's last step for it). One still begun
    /// (released more often than it was ended) stays until it is ended: allocations are routed to
    /// it meanwhile (PyTorch asserts there instead).
    pub fn erase_if_empty(&mut self, index: PoolIndex) {
        let pool = self.get(index);
        let begun = self.captures.iter().any(|&(_, i, _)| i == index);
        if pool.use_count == 0 && pool.segments == 0 && pool.reservations == 0 && !begun {
            let id = pool.id;
            self.by_id.remove(&id);
            self.slots[Self::slot(index)] = None;
        }
    }

    /// PyTorch's create_or_incref_pool: a new pool with use count 1, or one more use of an existing
    /// one. (0, 0), the default pools' id, is refused.
    pub fn create_or_incref(&mut self, id: MempoolId) -> Result<PoolIndex> {
        if id == (0, 0) {
            return Err(Error::invalid_argument(
                "pool id (0, 0) is the default pools': a private pool needs another id",
            ));
        }
        if let Some(index) = self.index_of(id) {
            self.get_mut(index).use_count += 1;
            return Ok(index);
        }
        let pool = PrivatePool {
            id,
            use_count: 1,
            segments: 0,
            reservations: 0,
            reserved_bytes: PooledStat::default(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            use_on_oom: false,
            no_split: false,
            allocator: None,
            sleep: SleepState::default(),
        };
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(free) => {
                self.slots[free] = Some(pool);
                free
            }
            None if self.slots.len() < PoolIndex::MAX as usize => {
                self.slots.push(Some(pool));
                self.slots.len() - 1
            }
            None => {
                return Err(Error::invalid_argument(format!(
                    "a device holds at most {} private pools at once",
                    PoolIndex::MAX
                )))
            }
        };
        let index = (slot + 1) as PoolIndex;
        self.by_id.insert(id, index);
        Ok(index)
    }

    fn existing(&self, id: MempoolId, what: &str) -> Result<PoolIndex> {
        self.index_of(id).ok_or_else(|| {
            Error::invalid_argument(format!("{what}: pool ({}, {}) does not exist", id.0, id.1))
        })
    }

    /// Give a pool just made its own allocator (a pool that exists already keeps its own).
    pub fn set_allocator(&mut self, id: MempoolId, allocator: Arc<dyn Backend>) -> Result<()> {
        let index = self.existing(id, "give a pool its allocator")?;
        let pool = self.get_mut(index);
        if pool.allocator.is_some() || pool.segments > 0 || pool.reservations > 0 {
            return Err(Error::invalid_argument(format!(
                "pool ({}, {}) already has its segments' source: an allocator is given when a pool \
                 is made",
                id.0, id.1
            )));
        }
        pool.allocator = Some(allocator);
        Ok(())
    }

    /// The pool's sleep state, to change.
    pub fn sleep_mut(&mut self, index: PoolIndex) -> &mut SleepState {
        &mut self.get_mut(index).sleep
    }

    /// `size` bytes of pool `index` paused (the pool's figure and the device's statistic).
    pub fn pages_paused(&mut self, index: PoolIndex, size: usize) {
        self.sleep_mut(index).paused_bytes += size;
        self.paused_memory.increase(size as u64);
    }

    /// `size` bytes of pool `index` no longer paused (resumed, or let go by empty_cache); its
    /// backup of the page at `address` goes.
    pub fn pages_resumed(&mut self, index: PoolIndex, address: usize, size: usize) {
        let sleep = self.sleep_mut(index);
        sleep.paused_bytes -= size;
        sleep.backups.remove(&address);
        self.paused_memory.decrease(size as u64);
    }

    /// The pool's own allocator, if it has one.
    pub fn allocator(&self, index: PoolIndex) -> Option<&Arc<dyn Backend>> {
        self.get(index).allocator.as_ref()
    }

    /// Set a pool's flags: use_on_oom as given (None: unchanged); no_split, once set, stays (as in
    /// PyTorch).
    pub fn set_flags(
        &mut self,
        id: MempoolId,
        use_on_oom: Option<bool>,
        no_split: bool,
    ) -> Result<()> {
        let index = self.existing(id, "set the flags of a pool")?;
        let pool = self.get_mut(index);
        if let Some(use_on_oom) = use_on_oom {
            pool.use_on_oom = use_on_oom;
        }
        pool.no_split |= no_split;
        Ok(())
    }

    /// beginAllocateToPool: one more use of the pool (made if new), and allocations accepted by
    /// `route` go to it until end(id). A pool begun already is refused, nothing changed.
    pub fn begin(&mut self, id: MempoolId, route: Route) -> Result<PoolIndex> {
        if self.captures.iter().any(|(begun, _, _)| *begun == id) {
            return Err(Error::invalid_argument(format!(
                "allocations already go to pool ({}, {}): end it before beginning it again",
                id.0, id.1
            )));
        }
        let index = self.create_or_incref(id)?;
        self.captures.push((id, index, route));
        Ok(index)
    }

    /// endAllocateToPool: allocations stop going to the pool; its use count is unchanged. Returns
    /// the route ended (a filter's owner may want to drop it outside the device).
    pub fn end(&mut self, id: MempoolId) -> Result<Route> {
        let at = self
            .captures
            .iter()
            .position(|(begun, _, _)| *begun == id)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "allocations do not go to pool ({}, {}): it was not begun, or it ended already",
                    id.0, id.1
                ))
            })?;
        Ok(self.captures.remove(at).2)
    }

    /// releasePool: one use less; at 0 the pool is freeable (nothing is freed yet).
    pub fn release(&mut self, id: MempoolId) -> Result<()> {
        let index = self.existing(id, "release a pool")?;
        let pool = self.get_mut(index);
        if pool.use_count == 0 {
            return Err(Error::invalid_argument(format!(
                "pool ({}, {}) was released more often than it was created and begun",
                id.0, id.1
            )));
        }
        pool.use_count -= 1;
        Ok(())
    }

    /// Every pool's BlockPools, (small, large), for renumbering.
    pub fn block_pools_mut(
        &mut self,
    ) -> impl Iterator<Item = (&mut BlockPool, &mut BlockPool)> + '_ {
        self.slots
            .iter_mut()
            .flatten()
            .map(|pool| (&mut pool.small, &mut pool.large))
    }
}
