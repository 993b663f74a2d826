//! Allocation entry points.

use super::guard::{current_type, guard, on, out_ptr};
use super::types::{AccallocDeviceType, AccallocStatus};
use crate::runtime::runtime;
use std::ffi::c_void;

/// Allocate at least `size` bytes on `device` (-1: this thread's current device) of the current
/// accelerator for use on `stream` (NULL: the default stream) and store the address in `*out`.
/// Blocks are 512-byte aligned and are reused only on the stream they were allocated on. Size 0
/// stores NULL and succeeds.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE,
/// ACCALLOC_ERROR_OUT_OF_MEMORY (message in PyTorch's "Tried to allocate" form). On error *out is not
/// touched.
#[no_mangle]
pub unsafe extern "C" fn accalloc_malloc(
    out: *mut *mut c_void,
    size: usize,
    device: i32,
    stream: *mut c_void,
) -> AccallocStatus {
    // The current accelerator directly: one runtime lookup instead of two on the hot path.
    guard(|| {
        let out = out_ptr(out, "out")?;
        let ptr = runtime()?.malloc_current(size, device, stream as usize)?;
        *out = ptr as *mut c_void;
        Ok(())
    })
}

/// accalloc_malloc on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_malloc_on(
    device_type: AccallocDeviceType,
    out: *mut *mut c_void,
    size: usize,
    device: i32,
    stream: *mut c_void,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let ptr = runtime()?.malloc_on(device_type, size, device, stream as usize)?;
        *out = ptr as *mut c_void;
        Ok(())
    })
}

/// Return memory from accalloc_malloc (of any accelerator) to the cache. NULL is a no-op.
///
/// Errors: ACCALLOC_ERROR_INVALID_POINTER for a pointer accalloc did not hand out, an interior pointer or
/// a double free; nothing is changed.
#[no_mangle]
pub unsafe extern "C" fn accalloc_free(ptr: *mut c_void) -> AccallocStatus {
    guard(|| runtime()?.free(ptr as usize))
}

/// The live allocation at `ptr` (of any accelerator): the bytes it holds as memory_allocated counts
/// them (the request rounded up by the allocator's rules) in `*size`, and where it lies in
/// `*device_type` and `*device` (each of these two may be NULL when not wanted). For profilers, which
/// are told each allocation's size when it is made and again when it is freed (PyTorch's
/// reportMemoryUsageToProfiler); not meant for a hot path.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (size is NULL), ACCALLOC_ERROR_INVALID_POINTER when `ptr`
/// is not a live allocation. On error nothing is stored.
#[no_mangle]
pub unsafe extern "C" fn accalloc_allocation_info(
    ptr: *const c_void,
    size: *mut u64,
    device_type: *mut AccallocDeviceType,
    device: *mut i32,
) -> AccallocStatus {
    guard(|| {
        let size = out_ptr(size, "size")?;
        let (of_type, index, bytes) = runtime()?.allocation_of(ptr as usize)?;
        *size = bytes as u64;
        if !device_type.is_null() {
            // SAFETY: non-NULL out-pointers are valid for a write (the header's contract).
            unsafe { *device_type = of_type };
        }
        if !device.is_null() {
            // SAFETY: as above.
            unsafe { *device = index as i32 };
        }
        Ok(())
    })
}

/// Note that `stream` uses the allocation at `ptr` (PyTorch's record_stream): when it is freed, the
/// block returns to the cache only after the work queued on `stream` until then has completed.
/// Uses on the stream the block was allocated on are ignored.
///
/// Errors: ACCALLOC_ERROR_INVALID_POINTER when `ptr` is not a live allocation; ACCALLOC_ERROR_NOT_SUPPORTED
/// when its backend has neither events nor stream synchronization.
#[no_mangle]
pub unsafe extern "C" fn accalloc_record_stream(
    ptr: *mut c_void,
    stream: *mut c_void,
) -> AccallocStatus {
    guard(|| runtime()?.record_stream(ptr as usize, stream as usize))
}

/// Release every unused cached segment of every device of the current accelerator back to the
/// device (torch.accelerator.empty_cache).
#[no_mangle]
pub extern "C" fn accalloc_empty_cache() -> AccallocStatus {
    accalloc_empty_cache_on(current_type())
}

/// accalloc_empty_cache on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_empty_cache_on(device_type: AccallocDeviceType) -> AccallocStatus {
    guard(|| on(device_type)?.empty_cache())
}
