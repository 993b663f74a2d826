//! Pinned host memory: each accelerator's host caching allocator (PyTorch's CachingHostAllocator,
//! behind `pin_memory=True`, non-blocking copies and torch.accelerator.empty_host_cache()).

use super::guard::{current_type, guard, on, out_ptr, str_arg, write_text};
use super::types::{AccallocDeviceType, AccallocStatus};
use crate::error::Error;
use crate::runtime::runtime;
use std::ffi::{c_char, c_void};

/// Allocate at least `size` bytes of pinned host memory from the current accelerator's host caching
/// allocator and store the address in `*out`: memory its devices copy from and to asynchronously.
/// The size is rounded up to a power of two; a cached block of that size is reused, the newest first,
/// once every stream that used it (accalloc_host_record_stream) has finished the work queued before
/// its free. Size 0 stores NULL and succeeds. The host backend page-locks the memory where the system
/// allows it (RLIMIT_MEMLOCK) and hands out ordinary memory where not: the statistic
/// page_locked_bytes tells which.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL); ACCALLOC_ERROR_OUT_OF_MEMORY (after giving
/// the cached blocks back and trying again); ACCALLOC_ERROR_NOT_SUPPORTED where the accelerator's
/// backend has no pinned host memory (a registered backend without host_alloc and host_free); on
/// error *out is not touched.
#[no_mangle]
pub unsafe extern "C" fn accalloc_host_malloc(
    out: *mut *mut c_void,
    size: usize,
) -> AccallocStatus {
    accalloc_host_malloc_on(current_type(), out, size)
}

/// accalloc_host_malloc from the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_host_malloc_on(
    device_type: AccallocDeviceType,
    out: *mut *mut c_void,
    size: usize,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let ptr = on(device_type)?.pinned_host()?.allocate(size)?;
        *out = ptr as *mut c_void;
        Ok(())
    })
}

/// Give back memory from accalloc_host_malloc (of any accelerator). NULL is a no-op. The block is
/// reused once the streams recorded on it have finished the work queued until now.
///
/// Errors: ACCALLOC_ERROR_INVALID_POINTER for a pointer that is not from accalloc_host_malloc, an
/// interior pointer or a double free (nothing changes); ACCALLOC_ERROR_BACKEND where a stream's use
/// could be neither recorded as an event nor waited for: the block stays handed out, the events made
/// for it are destroyed, and the free may be retried (as accalloc_free's).
#[no_mangle]
pub unsafe extern "C" fn accalloc_host_free(ptr: *mut c_void) -> AccallocStatus {
    guard(|| runtime()?.pinned_host_free(ptr as usize))
}

/// Note that `stream` of `device` (-1: the current device of the accelerator the memory is from)
/// uses the pinned block that `ptr` lies in (any address inside it), as PyTorch's
/// CachingHostAllocator_recordEvent does after a non-blocking copy: its reuse after
/// accalloc_host_free waits for the work queued on `stream` until that free. `*out_recorded`
/// (may be NULL) is false where `ptr` is not pinned memory from accalloc: nothing to record, not an
/// error, as PyTorch calls this for every tensor of a non-blocking copy.
///
/// Errors: ACCALLOC_ERROR_INVALID_POINTER (the block is not handed out), ACCALLOC_ERROR_INVALID_DEVICE,
/// ACCALLOC_ERROR_NOT_SUPPORTED (the backend has neither events nor stream synchronization).
#[no_mangle]
pub unsafe extern "C" fn accalloc_host_record_stream(
    ptr: *const c_void,
    device: i32,
    stream: *mut c_void,
    out_recorded: *mut bool,
) -> AccallocStatus {
    guard(|| {
        let recorded =
            runtime()?.pinned_host_record_stream(ptr as usize, device, stream as usize)?;
        if !out_recorded.is_null() {
            // SAFETY: non-NULL out-pointers are valid for a write (the header's contract).
            unsafe { *out_recorded = recorded };
        }
        Ok(())
    })
}

/// Store in `*out` whether `ptr` lies in pinned host memory from accalloc_host_malloc (of any
/// accelerator, handed out or cached): PyTorch's isPinnedPtr.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL).
#[no_mangle]
pub unsafe extern "C" fn accalloc_host_is_pinned(
    ptr: *const c_void,
    out: *mut bool,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        *out = runtime()?.pinned_host_holder(ptr as usize).is_some();
        Ok(())
    })
}

/// Give every cached pinned block of the current accelerator whose streams have finished back to
/// the system (torch.accelerator.empty_host_cache). Blocks handed out stay.
///
/// Errors: ACCALLOC_ERROR_BACKEND where the backend refused to free a block (it stays cached and
/// counted; the others are still given back); ACCALLOC_ERROR_NOT_SUPPORTED as accalloc_host_malloc.
#[no_mangle]
pub extern "C" fn accalloc_host_empty_cache() -> AccallocStatus {
    accalloc_host_empty_cache_on(current_type())
}

/// accalloc_host_empty_cache on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_host_empty_cache_on(device_type: AccallocDeviceType) -> AccallocStatus {
    guard(|| on(device_type)?.pinned_host()?.empty_cache())
}

/// Write the current accelerator's pinned host statistics as one JSON object plus a NUL, with
/// torch.cuda.host_memory_stats()'s keys, sorted: allocations, allocated_bytes, active_requests and
/// active_bytes (each .current/.peak/.allocated/.freed; the active peaks summed per power of two, as
/// PyTorch does), num_host_alloc, num_host_free, host_alloc_time and host_free_time
/// (.total/.max/.min/.count/.avg, microseconds), and accalloc's page_locked_bytes. `*len` receives
/// the bytes needed including the NUL; with buf NULL this only sets *len; with cap too small it
/// returns ACCALLOC_ERROR_BUFFER_TOO_SMALL and leaves buf untouched.
#[no_mangle]
pub unsafe extern "C" fn accalloc_host_memory_stats_json(
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    accalloc_host_memory_stats_json_on(current_type(), buf, cap, len)
}

/// accalloc_host_memory_stats_json on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_host_memory_stats_json_on(
    device_type: AccallocDeviceType,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    guard(|| {
        out_ptr(len, "len")?;
        let json = on(device_type)?.pinned_host()?.stats().to_json();
        write_text(&json, buf, cap, len)
    })
}

/// Store one pinned host statistic of the current accelerator, by its key in
/// accalloc_host_memory_stats_json (e.g. "allocated_bytes.current", "num_host_alloc"), in `*out`.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (a NULL argument or an unknown key).
#[no_mangle]
pub unsafe extern "C" fn accalloc_host_memory_stat(
    key: *const c_char,
    out: *mut i64,
) -> AccallocStatus {
    accalloc_host_memory_stat_on(current_type(), key, out)
}

/// accalloc_host_memory_stat on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_host_memory_stat_on(
    device_type: AccallocDeviceType,
    key: *const c_char,
    out: *mut i64,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let key = str_arg(key, "key")?;
        let stats = on(device_type)?.pinned_host()?.stats();
        *out = stats.get(key).ok_or_else(|| {
            Error::invalid_argument(format!(
                "unknown pinned host statistic {}: keys look like 'allocated_bytes.current' \
                 (<allocations|allocated_bytes|active_requests|active_bytes>.<current|peak|allocated|freed>), \
                 'host_alloc_time.avg' or 'num_host_alloc'",
                crate::error::quote(key)
            ))
        })?;
        Ok(())
    })
}

/// Set the running totals (.allocated, .freed, num_host_alloc, num_host_free) and the timing sums
/// of the current accelerator's pinned host statistics to 0
/// (torch.cuda.reset_accumulated_host_memory_stats).
#[no_mangle]
pub extern "C" fn accalloc_host_reset_accumulated_memory_stats() -> AccallocStatus {
    accalloc_host_reset_accumulated_memory_stats_on(current_type())
}

/// accalloc_host_reset_accumulated_memory_stats on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_host_reset_accumulated_memory_stats_on(
    device_type: AccallocDeviceType,
) -> AccallocStatus {
    guard(|| {
        on(device_type)?.pinned_host()?.reset_accumulated_stats();
        Ok(())
    })
}

/// Set every peak of the current accelerator's pinned host statistics to its current value, and
/// the timing extremes to 0 (torch.cuda.reset_peak_host_memory_stats).
#[no_mangle]
pub extern "C" fn accalloc_host_reset_peak_memory_stats() -> AccallocStatus {
    accalloc_host_reset_peak_memory_stats_on(current_type())
}

/// accalloc_host_reset_peak_memory_stats on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_host_reset_peak_memory_stats_on(
    device_type: AccallocDeviceType,
) -> AccallocStatus {
    guard(|| {
        on(device_type)?.pinned_host()?.reset_peak_stats();
        Ok(())
    })
}
