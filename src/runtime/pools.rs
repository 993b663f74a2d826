//! Private pools through the runtime: ids handed out for the process, and each pool call on its
//! device's allocator (the rules are the core's: accalloc_core::caching::pools).

use super::ownership::IndexedBackend;
use super::{trace_log, Accelerator};
use crate::backend::Backend;
use crate::backend::StreamId;
use crate::error::{Error, Result};
use crate::trace::PoolCall;
use accalloc_core::caching::pools::{MempoolId, Route, StreamFilter};
use accalloc_core::caching::{PoolCheckpoint, Restored};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The next id of a pool made by accalloc_pool_create: (0, n), n from 1, as PyTorch's MemPool().
static NEXT_USER_POOL: AtomicU64 = AtomicU64::new(1);

fn next_user_pool() -> MempoolId {
    (0, NEXT_USER_POOL.fetch_add(1, Ordering::Relaxed))
}

/// ACCALLOC_TRACE's record of a pool made.
fn trace_created(device: usize, id: MempoolId, use_on_oom: bool, no_split: bool) {
    trace_log::pool(
        device,
        id,
        PoolCall::Create {
            use_on_oom,
            no_split,
        },
    );
}

impl Accelerator {
    /// A new pool (0, n) on `device` with one use and its flags.
    pub fn create_pool(&self, device: i32, use_on_oom: bool, no_split: bool) -> Result<MempoolId> {
        let index = self.resolve(device)?;
        let id = next_user_pool();
        self.lock(index)?.create_pool(id, use_on_oom, no_split)?;
        trace_created(index, id, use_on_oom, no_split);
        Ok(id)
    }

    /// A new pool (0, n) on `device` whose segments come from `allocator` (a pool allocator over
    /// this accelerator's backend): its segments are recorded as the device's (so frees find them),
    /// and its calls run as callbacks of this device type (a call back into accalloc for it is
    /// refused). A trace records it as an ordinary pool: a replay takes its memory from the device.
    ///
    /// # Safety
    /// `functions` are valid functions with the documented signatures, and their context valid for
    /// them, from any thread, for as long as the pool holds memory from them.
    pub unsafe fn create_pool_with_allocator(
        &self,
        device: i32,
        use_on_oom: bool,
        no_split: bool,
        functions: accalloc_core::backend::custom::SegmentFunctions,
        context: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Result<MempoolId> {
        let index = self.resolve(device)?;
        // SAFETY: this function's own contract.
        let allocator = unsafe {
            accalloc_core::backend::custom::PoolAllocator::new(
                self.backend.clone(),
                functions,
                context,
            )
        };
        let indexed: Arc<dyn Backend> = Arc::new(IndexedBackend::new(
            Arc::new(allocator),
            self.device_type(),
            self.index.clone(),
        ));
        super::reentry::foreign_callbacks_added();
        let id = next_user_pool();
        self.lock(index)?
            .create_pool_with_allocator(id, use_on_oom, no_split, indexed)?;
        trace_created(index, id, use_on_oom, no_split);
        Ok(id)
    }

    /// One more use of pool `id` on `device` (made with one use if new): PyTorch's
    /// createOrIncrefPool, for ids its MemPool and graphs hand out themselves.
    pub fn retain_pool(&self, device: i32, id: MempoolId) -> Result<()> {
        self.lock(self.resolve(device)?)?.retain_pool(id)
    }

    /// setUseOnOOM / setNoSplit of pool `id` on `device`.
    pub fn set_pool_flags(
        &self,
        device: i32,
        id: MempoolId,
        use_on_oom: Option<bool>,
        no_split: bool,
    ) -> Result<()> {
        self.lock(self.resolve(device)?)?
            .set_pool_flags(id, use_on_oom, no_split)
    }

    /// Route to pool `id` the allocations on `device` whose stream `filter` accepts (`capture`: a
    /// graph capture, under its rules). The filter runs with the device held, as a callback of
    /// this device type.
    pub fn begin_allocate_to_pool_filtered(
        &self,
        device: i32,
        id: MempoolId,
        filter: StreamFilter,
        capture: bool,
    ) -> Result<()> {
        let index = self.resolve(device)?;
        super::reentry::foreign_callbacks_added();
        let device_type = self.device_type();
        let scoped: StreamFilter = Arc::new(move |stream| {
            let _inside = super::reentry::CallbackScope::enter(device_type, "pool filter");
            filter(stream)
        });
        self.lock(index)?.begin_allocate_to_pool(
            id,
            Route::Filter {
                accepts: scoped,
                capture,
            },
        )
    }

    /// Route allocations on `device` to pool `id`: this thread's (stream None), or those on a
    /// stream (a capture).
    pub fn begin_allocate_to_pool(
        &self,
        device: i32,
        id: MempoolId,
        stream: Option<StreamId>,
    ) -> Result<()> {
        let index = self.resolve(device)?;
        let route = match stream {
            None => Route::Thread(std::thread::current().id()),
            Some(stream) => Route::Stream(stream),
        };
        self.lock(index)?.begin_allocate_to_pool(id, route)?;
        // A trace replays on one thread: a thread's pool there takes that thread's allocations,
        // which is exact for a program that allocates from one thread while it is begun.
        trace_log::pool(index, id, PoolCall::Begin { stream });
        Ok(())
    }

    pub fn end_allocate_to_pool(&self, device: i32, id: MempoolId) -> Result<()> {
        let index = self.resolve(device)?;
        // The route (a caller's filter, with its release) goes after the device is let go.
        let route = self.lock(index)?.end_allocate_to_pool(id)?;
        drop(route);
        trace_log::pool(index, id, PoolCall::End);
        Ok(())
    }

    pub fn release_pool(&self, device: i32, id: MempoolId) -> Result<()> {
        let index = self.resolve(device)?;
        self.lock(index)?.release_pool(id)?;
        trace_log::pool(index, id, PoolCall::Release);
        Ok(())
    }

    /// PyTorch's emptyCache(pool) (`live` false), or accalloc's empty of a live pool too.
    pub fn empty_pool(&self, device: i32, id: MempoolId, live: bool) -> Result<()> {
        let index = self.resolve(device)?;
        let mut allocator = self.lock(index)?;
        if live {
            allocator.empty_live_pool(id)?;
        } else {
            allocator.empty_pool_cache(id)?;
        }
        drop(allocator);
        trace_log::pool(index, id, PoolCall::Empty { live });
        Ok(())
    }

    /// Pool `id`'s reserved bytes, [all, small pool, large pool]; None where it does not exist.
    pub fn pool_reserved_bytes(
        &self,
        device: i32,
        id: MempoolId,
    ) -> Result<Option<crate::caching::stats::StatArray>> {
        Ok(self.lock(self.resolve(device)?)?.pool_reserved_bytes(id))
    }

    /// Pool `id`'s live allocations on `device`, ascending (None: no such pool).
    pub fn pool_live_allocations(&self, device: i32, id: MempoolId) -> Result<Option<Vec<usize>>> {
        Ok(self.lock(self.resolve(device)?)?.pool_live_allocations(id))
    }

    /// (use count, segments) of pool `id`; None where it does not exist.
    pub fn pool_counts(&self, device: i32, id: MempoolId) -> Result<Option<(u32, usize)>> {
        let allocator = self.lock(self.resolve(device)?)?;
        Ok(allocator
            .pool_use_count(id)
            .zip(allocator.pool_segment_count(id)))
    }
}

impl Accelerator {
    /// Pool `id`'s layout on `device` now (PyTorch's getCheckpointState).
    pub fn pool_checkpoint(&self, device: i32, id: MempoolId) -> Result<PoolCheckpoint> {
        self.lock(self.resolve(device)?)?.pool_checkpoint(id)
    }

    /// Put `checkpoint` back into its pool on `device` (PyTorch's setCheckpointPoolState), refused
    /// with nothing changed when more allocations would be freed than `freed_capacity` or handed
    /// out than `allocated_capacity` (what the caller has room to hear of), or by the core's checks.
    pub fn restore_pool_checkpoint(
        &self,
        device: i32,
        checkpoint: &PoolCheckpoint,
        freed_capacity: usize,
        allocated_capacity: usize,
    ) -> Result<Restored> {
        let index = self.resolve(device)?;
        let mut allocator = self.lock(index)?;
        let live = allocator
            .pool_live_allocations(checkpoint.pool)
            .map_or(0, |live| live.len());
        let allocations = checkpoint.allocations().count();
        if live > freed_capacity || allocations > allocated_capacity {
            return Err(Error::invalid_argument(format!(
                "room for {freed_capacity} freed and {allocated_capacity} allocated addresses: putting \
                 the checkpoint back frees {live} and hands out {allocations}"
            )));
        }
        let restored = allocator.restore_pool_checkpoint(checkpoint)?;
        // Written with the device held: no other thread's request may take a freed address, and be
        // written, before these frees are.
        if trace_log::enabled() {
            // The blocks handed out again, with their segments' streams (in the checkpoint's order,
            // as `restored` lists them).
            let allocated: Vec<(usize, usize, usize)> = checkpoint
                .segments
                .iter()
                .flat_map(|s| {
                    s.blocks
                        .iter()
                        .filter(|b| b.allocated)
                        .map(move |b| (b.ptr, b.size, s.stream))
                })
                .collect();
            debug_assert!(allocated
                .iter()
                .map(|&(ptr, size, _)| (ptr, size))
                .eq(restored.allocated.iter().copied()));
            trace_log::pool_restored(index, checkpoint.pool, &restored.freed, &allocated);
        }
        drop(allocator);
        Ok(restored)
    }
}
