//! Private pools: memory of its own for a set of allocations (PyTorch's MemPool and CUDA graph
//! pools), routed by thread or by stream, with PyTorch's rules.

use super::backend_table::AccallocBackendVTable;
use super::guard::{current_type, guard, on, out_ptr};
use super::types::{stat, AccallocDeviceType, AccallocStat, AccallocStatus};
use crate::error::Error;
use std::ffi::c_void;
use std::sync::Arc;

/// A pool's id, PyTorch's MempoolId_t: {0, 0} is the default pools; accalloc_pool_create makes
/// {0, n}; a graph capture may name its own pool {n, 0}.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccallocPoolId {
    pub first: u64,
    pub second: u64,
}

impl AccallocPoolId {
    fn pair(self) -> (u64, u64) {
        (self.first, self.second)
    }
}

/// The error of a call naming a pool that does not exist.
fn no_such_pool(pool: AccallocPoolId) -> Error {
    Error::invalid_argument(format!(
        "pool ({}, {}) does not exist",
        pool.first, pool.second
    ))
}

/// Route to the pool the allocations of the calling thread, on any stream (use_mem_pool).
pub const ACCALLOC_ROUTE_THREAD: i32 = 0;
/// Route to the pool the allocations on one stream, from any thread (a graph capture).
pub const ACCALLOC_ROUTE_STREAM: i32 = 1;

/// Make a private pool on `device` (-1: current) of the current accelerator, with one use, and
/// store its id ({0, n}, n counting from 1 in the process) in `*out`. `use_on_oom` non-zero: a
/// default-pool request about to fail may take one of its free blocks. `no_split` non-zero: its
/// blocks are never split (a request gets a whole free block or segment; stays set once set).
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_create(
    device: i32,
    use_on_oom: i32,
    no_split: i32,
    out: *mut AccallocPoolId,
) -> AccallocStatus {
    accalloc_pool_create_on(current_type(), device, use_on_oom, no_split, out)
}

/// accalloc_pool_create on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_create_on(
    device_type: AccallocDeviceType,
    device: i32,
    use_on_oom: i32,
    no_split: i32,
    out: *mut AccallocPoolId,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let (first, second) =
            on(device_type)?.create_pool(device, use_on_oom != 0, no_split != 0)?;
        *out = AccallocPoolId { first, second };
        Ok(())
    })
}

/// A new pool whose segments come from `functions` (`context`: what they point into, kept alive with
/// the pool), for the two C forms below.
///
/// # Safety
/// As Accelerator::create_pool_with_allocator.
unsafe fn pool_with_allocator(
    device_type: AccallocDeviceType,
    device: i32,
    use_on_oom: i32,
    no_split: i32,
    functions: crate::backend::custom::SegmentFunctions,
    context: Option<Box<dyn std::any::Any + Send + Sync>>,
) -> crate::error::Result<AccallocPoolId> {
    let accelerator = on(device_type)?;
    // SAFETY: this function's own contract.
    let (first, second) = unsafe {
        accelerator.create_pool_with_allocator(
            device,
            use_on_oom != 0,
            no_split != 0,
            functions,
            context,
        )?
    };
    Ok(AccallocPoolId { first, second })
}

/// accalloc_pool_create for a pool whose segments come from `allocator` (PyTorch's
/// MemPool(allocator=...)): its raw_alloc and raw_free (required; raw_alloc answers
/// ACCALLOC_BACKEND_OUT_OF_MEMORY when it has no room, which is the pool's out of memory: the device
/// is not asked), and its virtual-memory group when all five entries are there, for expandable
/// segments inside the pool (without it, the pool's segments are ordinary ones). The other entries
/// are not used and may be NULL: the device's backend answers for events, streams and memory
/// figures. The table is copied; its functions and context must stay valid, and usable from any
/// thread, until the pool is gone and every segment it held was given back. Its functions run as
/// callbacks of the device type: calling accalloc for it from them is refused. What they hand out
/// is checked as a registered backend's is (NULL, alignment, overlap: refused and given back).
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (allocator or out is NULL; the table's struct_size is
/// too small; raw_alloc or raw_free is NULL), ACCALLOC_ERROR_INVALID_DEVICE; nothing is made.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_create_with_allocator(
    device: i32,
    use_on_oom: i32,
    no_split: i32,
    allocator: *const AccallocBackendVTable,
    out: *mut AccallocPoolId,
) -> AccallocStatus {
    accalloc_pool_create_with_allocator_on(
        current_type(),
        device,
        use_on_oom,
        no_split,
        allocator,
        out,
    )
}

/// accalloc_pool_create_with_allocator on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_create_with_allocator_on(
    device_type: AccallocDeviceType,
    device: i32,
    use_on_oom: i32,
    no_split: i32,
    allocator: *const AccallocBackendVTable,
    out: *mut AccallocPoolId,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        // SAFETY: a non-NULL table is readable for its struct_size bytes (the header's contract).
        let table = unsafe { AccallocBackendVTable::read(allocator) }
            .ok_or_else(|| Error::invalid_argument("allocator is NULL"))?;
        let functions = table
            .segment_functions()
            .map_err(|why| Error::invalid_argument(format!("pool allocator table: {why}")))?;
        // SAFETY: the caller promised valid functions for as long as the pool holds their memory.
        *out = unsafe {
            pool_with_allocator(device_type, device, use_on_oom, no_split, functions, None)?
        };
        Ok(())
    })
}

/// From now until accalloc_pool_end, allocations on `device` go to `pool`: those of the calling
/// thread (`route` ACCALLOC_ROUTE_THREAD; `stream` ignored) or those on `stream`
/// (ACCALLOC_ROUTE_STREAM). Counts a use of the pool, making it (with one use) if it does not
/// exist. Pools begun at once nest: a request goes to the newest whose route takes it. While a pool
/// is begun for a stream (a capture), the device's allocations process no finished events and
/// skip the last-resort release of every cached segment, and accalloc_empty_cache leaves the
/// default pools alone, as PyTorch 2.15 does during a capture (not for use_mem_pool's thread
/// route).
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (the pool is begun already; {0, 0}; an unknown route),
/// ACCALLOC_ERROR_INVALID_DEVICE; nothing changes.
#[no_mangle]
pub extern "C" fn accalloc_pool_begin(
    device: i32,
    pool: AccallocPoolId,
    route: i32,
    stream: *mut c_void,
) -> AccallocStatus {
    accalloc_pool_begin_on(current_type(), device, pool, route, stream)
}

/// accalloc_pool_begin on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_pool_begin_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    route: i32,
    stream: *mut c_void,
) -> AccallocStatus {
    guard(|| {
        let stream = match route {
            ACCALLOC_ROUTE_THREAD => None,
            ACCALLOC_ROUTE_STREAM => Some(stream as usize),
            other => {
                return Err(crate::error::Error::invalid_argument(format!(
                "route {other} is neither ACCALLOC_ROUTE_THREAD (0) nor ACCALLOC_ROUTE_STREAM (1)"
            )))
            }
        };
        on(device_type)?.begin_allocate_to_pool(device, pool.pair(), stream)
    })
}

/// Allocations stop going to `pool` (its use count is unchanged: release it when done).
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (the pool is not begun), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub extern "C" fn accalloc_pool_end(device: i32, pool: AccallocPoolId) -> AccallocStatus {
    accalloc_pool_end_on(current_type(), device, pool)
}

/// accalloc_pool_end on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_pool_end_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
) -> AccallocStatus {
    guard(|| on(device_type)?.end_allocate_to_pool(device, pool.pair()))
}

/// One use of `pool` less (a creation's or a begin's). At none the pool is freeable: nothing is
/// freed now, its blocks still return to it when freed, and accalloc_empty_cache gives back its
/// free segments and forgets it once it holds none.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (no such pool, or no use left), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub extern "C" fn accalloc_pool_release(device: i32, pool: AccallocPoolId) -> AccallocStatus {
    accalloc_pool_release_on(current_type(), device, pool)
}

/// accalloc_pool_release on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_pool_release_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
) -> AccallocStatus {
    guard(|| on(device_type)?.release_pool(device, pool.pair()))
}

/// Give back the free whole segments of `pool`. With `live` zero this is PyTorch's
/// emptyCache(pool): only a freeable pool (no use left) is emptied, and a live or unknown pool is
/// left alone. With `live` non-zero, accalloc's own, the free segments of a live pool go back too
/// (PyTorch keeps them reserved for as long as the pool lives: pytorch#159674).
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (`live` non-zero and no such pool),
/// ACCALLOC_ERROR_INVALID_DEVICE, ACCALLOC_ERROR_BACKEND (a segment the backend refused to free
/// stays, counted).
#[no_mangle]
pub extern "C" fn accalloc_pool_empty_cache(
    device: i32,
    pool: AccallocPoolId,
    live: i32,
) -> AccallocStatus {
    accalloc_pool_empty_cache_on(current_type(), device, pool, live)
}

/// accalloc_pool_empty_cache on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_pool_empty_cache_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    live: i32,
) -> AccallocStatus {
    guard(|| on(device_type)?.empty_pool(device, pool.pair(), live != 0))
}

/// Store `pool`'s use count in `*use_count` and the segments it holds in `*segments` (either may be
/// NULL); both -1 where the pool does not exist (never made, or emptied and forgotten).
///
/// Errors: ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_info(
    device: i32,
    pool: AccallocPoolId,
    use_count: *mut i64,
    segments: *mut i64,
) -> AccallocStatus {
    accalloc_pool_info_on(current_type(), device, pool, use_count, segments)
}

/// accalloc_pool_info on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_info_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    use_count: *mut i64,
    segments: *mut i64,
) -> AccallocStatus {
    guard(|| {
        let counts = on(device_type)?.pool_counts(device, pool.pair())?;
        let (uses, held) = counts.map_or((-1, -1), |(u, s)| (u as i64, s as i64));
        // SAFETY: non-NULL out-pointers are valid for a write (the header's contract).
        unsafe {
            if !use_count.is_null() {
                *use_count = uses;
            }
            if !segments.is_null() {
                *segments = held;
            }
        }
        Ok(())
    })
}

/// The addresses of `pool`'s live allocations (handed out and not yet freed; a freed block still
/// waiting for a stream's event is not live), ascending: the first `capacity` of them are written to
/// `out` (which may be NULL when `capacity` is 0) and how many there are to `*count`, so that a
/// caller can ask for the count first. CUDA graph trees check a graph pool with it (PyTorch's
/// checkPoolLiveAllocations: are the live allocations exactly the tensors the tree holds?).
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (count is NULL, out is NULL with a capacity, or the pool
/// does not exist; nothing is written), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_live_allocations(
    device: i32,
    pool: AccallocPoolId,
    out: *mut *mut c_void,
    capacity: usize,
    count: *mut usize,
) -> AccallocStatus {
    accalloc_pool_live_allocations_on(current_type(), device, pool, out, capacity, count)
}

/// accalloc_pool_live_allocations on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_live_allocations_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    out: *mut *mut c_void,
    capacity: usize,
    count: *mut usize,
) -> AccallocStatus {
    guard(|| {
        let count = out_ptr(count, "count")?;
        if out.is_null() && capacity > 0 {
            return Err(Error::invalid_argument(format!(
                "out is NULL with a capacity of {capacity}"
            )));
        }
        let live = on(device_type)?
            .pool_live_allocations(device, pool.pair())?
            .ok_or_else(|| no_such_pool(pool))?;
        for (i, &address) in live.iter().take(capacity).enumerate() {
            // SAFETY: out holds `capacity` writable pointers (the header's contract).
            unsafe { *out.add(i) = address as *mut c_void };
        }
        *count = live.len();
        Ok(())
    })
}

/// Store `pool`'s share of reserved_bytes (PyTorch's reserved_bytes_by_private_pools: its segments
/// and mapped pages) for all, the small pool and the large pool in `*all`, `*small_pool` and
/// `*large_pool` (any may be NULL). It moves with every segment and page of the pool as
/// reserved_bytes does, and the resets reset it.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (the pool does not exist; nothing is written),
/// ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_reserved_bytes(
    device: i32,
    pool: AccallocPoolId,
    all: *mut AccallocStat,
    small_pool: *mut AccallocStat,
    large_pool: *mut AccallocStat,
) -> AccallocStatus {
    accalloc_pool_reserved_bytes_on(current_type(), device, pool, all, small_pool, large_pool)
}

/// accalloc_pool_reserved_bytes on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_reserved_bytes_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    all: *mut AccallocStat,
    small_pool: *mut AccallocStat,
    large_pool: *mut AccallocStat,
) -> AccallocStatus {
    guard(|| {
        let slots = on(device_type)?
            .pool_reserved_bytes(device, pool.pair())?
            .ok_or_else(|| no_such_pool(pool))?;
        for (out, slot) in [all, small_pool, large_pool].into_iter().zip(&slots) {
            // SAFETY: a non-NULL out-pointer is valid for a write (the header's contract).
            if let Some(out) = unsafe { out.as_mut() } {
                *out = stat(slot);
            }
        }
        Ok(())
    })
}

/// One more use of `pool` on `device` (made with one use if it does not exist): PyTorch's
/// createOrIncrefPool, for a framework that hands out pool ids itself (its MemPool, its graphs).
/// Such ids may meet accalloc_pool_create's {0, n}: a framework uses one or the other.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT ({0, 0}), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub extern "C" fn accalloc_pool_retain(device: i32, pool: AccallocPoolId) -> AccallocStatus {
    accalloc_pool_retain_on(current_type(), device, pool)
}

/// accalloc_pool_retain on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_pool_retain_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
) -> AccallocStatus {
    guard(|| on(device_type)?.retain_pool(device, pool.pair()))
}

/// Set `pool`'s flags, as PyTorch's setUseOnOOM and setNoSplit: `use_on_oom` 0 or 1 as given, a
/// negative value leaves it; `no_split` non-zero sets it (it stays set).
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (no such pool), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub extern "C" fn accalloc_pool_set_flags(
    device: i32,
    pool: AccallocPoolId,
    use_on_oom: i32,
    no_split: i32,
) -> AccallocStatus {
    accalloc_pool_set_flags_on(current_type(), device, pool, use_on_oom, no_split)
}

/// accalloc_pool_set_flags on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_pool_set_flags_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    use_on_oom: i32,
    no_split: i32,
) -> AccallocStatus {
    let use_on_oom = (use_on_oom >= 0).then_some(use_on_oom != 0);
    guard(|| on(device_type)?.set_pool_flags(device, pool.pair(), use_on_oom, no_split != 0))
}

/// Decides whether an allocation on `stream` goes to the pool (non-zero: it does).
pub type AccallocPoolFilter =
    Option<unsafe extern "C" fn(stream: *mut c_void, context: *mut c_void) -> i32>;
/// Releases a filter's context once its route has ended.
pub type AccallocPoolFilterRelease = Option<unsafe extern "C" fn(context: *mut c_void)>;

/// The caller's filter and context, called from whichever thread allocates.
struct CallerFilter {
    filter: AccallocPoolFilter,
    context: *mut c_void,
    release: AccallocPoolFilterRelease,
}
// SAFETY: the caller promises (accalloc_pool_begin_filtered's documentation) that its filter and
// context may be used from any thread.
unsafe impl Send for CallerFilter {}
unsafe impl Sync for CallerFilter {}

impl Drop for CallerFilter {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            // SAFETY: the caller gave a function of this type for this context.
            unsafe { release(self.context) }
        }
    }
}

/// accalloc_pool_begin with a filter of the caller's, as PyTorch's beginAllocateToPool takes one (a
/// CUDA graph's test of the stream's capture id): until accalloc_pool_end, each allocation on
/// `device` whose stream `filter(stream, context)` accepts goes to `pool`. The filter runs with the
/// device held, from the allocating thread: it must be quick and may not call accalloc for this
/// device type. `capture` non-zero: the route is a graph capture, and the capture rules hold while
/// it is begun (no event processing, no last-resort release, stream-used frees deferred). `release`
/// (may be NULL) is called with `context` once the route has ended (after the device is let go),
/// or at once when the begin fails.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (filter is NULL; the pool is begun already; {0, 0}),
/// ACCALLOC_ERROR_INVALID_DEVICE; nothing changes.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_begin_filtered(
    device: i32,
    pool: AccallocPoolId,
    filter: AccallocPoolFilter,
    context: *mut c_void,
    release: AccallocPoolFilterRelease,
    capture: i32,
) -> AccallocStatus {
    accalloc_pool_begin_filtered_on(
        current_type(),
        device,
        pool,
        filter,
        context,
        release,
        capture,
    )
}

/// accalloc_pool_begin_filtered on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_begin_filtered_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    filter: AccallocPoolFilter,
    context: *mut c_void,
    release: AccallocPoolFilterRelease,
    capture: i32,
) -> AccallocStatus {
    guard(|| {
        // The context is released when the last copy of the filter goes: at once when the begin
        // is refused (a NULL filter included), else once the route has ended.
        let caller = CallerFilter {
            filter,
            context,
            release,
        };
        let Some(filter) = caller.filter else {
            return Err(Error::invalid_argument("filter is NULL"));
        };
        let caller = Arc::new(caller);
        let accepts = move |stream: usize| {
            // SAFETY: the caller gave a function of this type for this context.
            unsafe { filter(stream as *mut c_void, caller.context) != 0 }
        };
        on(device_type)?.begin_allocate_to_pool_filtered(
            device,
            pool.pair(),
            Arc::new(accepts),
            capture != 0,
        )
    })
}

/// PyTorch's pluggable allocation function: `size` bytes on `device` for `stream`; NULL when it has
/// no room.
pub type AccallocPluggableAlloc =
    Option<unsafe extern "C" fn(size: usize, device: i32, stream: *mut c_void) -> *mut c_void>;
/// PyTorch's pluggable free function: give back what the allocation function returned.
pub type AccallocPluggableFree =
    Option<unsafe extern "C" fn(ptr: *mut c_void, size: usize, device: i32, stream: *mut c_void)>;

/// A pool's two functions in PyTorch's pluggable form, behind the table's context.
struct PluggablePair {
    alloc: unsafe extern "C" fn(usize, i32, *mut c_void) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void, usize, i32, *mut c_void),
}
// SAFETY: the caller promises (accalloc_pool_create_with_functions) they may run on any thread.
unsafe impl Send for PluggablePair {}
unsafe impl Sync for PluggablePair {}

unsafe extern "C" fn pluggable_raw_alloc(
    context: *mut c_void,
    device: i32,
    size: usize,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> i32 {
    // SAFETY: the context is the pool's PluggablePair, alive as long as the pool.
    let pair = unsafe { &*(context as *const PluggablePair) };
    // SAFETY: the caller's function, with the arguments PyTorch's pluggable allocators take.
    let ptr = unsafe { (pair.alloc)(size, device, stream) };
    if ptr.is_null() {
        return crate::backend::custom::BACKEND_OUT_OF_MEMORY;
    }
    // SAFETY: `out` is the backend layer's valid out-pointer.
    unsafe { *out = ptr };
    crate::backend::custom::BACKEND_OK
}

unsafe extern "C" fn pluggable_raw_free(
    context: *mut c_void,
    device: i32,
    ptr: *mut c_void,
    size: usize,
) -> i32 {
    // SAFETY: as in pluggable_raw_alloc.
    let pair = unsafe { &*(context as *const PluggablePair) };
    // SAFETY: the caller's function; accalloc keeps no stream per segment here: NULL, the default.
    unsafe { (pair.free)(ptr, size, device, std::ptr::null_mut()) };
    crate::backend::custom::BACKEND_OK
}

/// accalloc_pool_create_with_allocator for an allocator in PyTorch's pluggable form (the two
/// functions torch.cuda.memory.CUDAPluggableAllocator loads from a library: `void *alloc(size_t size,
/// int device, void *stream)`, NULL when it has no room, and `void free(void *ptr, size_t size, int
/// device, void *stream)`), as MemPool(allocator=CUDAPluggableAllocator(...)) takes it. The pool's
/// segments are ordinary ones (the pair has no virtual memory). The functions must stay valid, and
/// usable from any thread, until the pool is gone.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (a function or out is NULL),
/// ACCALLOC_ERROR_INVALID_DEVICE; nothing is made.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_create_with_functions(
    device: i32,
    use_on_oom: i32,
    no_split: i32,
    alloc: AccallocPluggableAlloc,
    free: AccallocPluggableFree,
    out: *mut AccallocPoolId,
) -> AccallocStatus {
    accalloc_pool_create_with_functions_on(
        current_type(),
        device,
        use_on_oom,
        no_split,
        alloc,
        free,
        out,
    )
}

/// accalloc_pool_create_with_functions on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_create_with_functions_on(
    device_type: AccallocDeviceType,
    device: i32,
    use_on_oom: i32,
    no_split: i32,
    alloc: AccallocPluggableAlloc,
    free: AccallocPluggableFree,
    out: *mut AccallocPoolId,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let (Some(alloc), Some(free)) = (alloc, free) else {
            return Err(Error::invalid_argument(
                "alloc and free must both be functions, not NULL",
            ));
        };
        let pair = Box::new(PluggablePair { alloc, free });
        let functions = crate::backend::custom::SegmentFunctions {
            context: &*pair as *const PluggablePair as *mut c_void,
            raw_alloc: pluggable_raw_alloc,
            raw_free: pluggable_raw_free,
            virtual_memory: None,
        };
        // SAFETY: the trampolines are valid for the pair, which the pool keeps alive; the caller
        // promised valid functions.
        *out = unsafe {
            pool_with_allocator(
                device_type,
                device,
                use_on_oom,
                no_split,
                functions,
                Some(pair),
            )?
        };
        Ok(())
    })
}
