//! Sleep and wake from C: a pool's memory given back to the device and brought back at the same
//! addresses (vLLM's sleep mode, torch_memory_saver's regions), with the caching kept.

use super::guard::{current_type, guard, on, out_ptr};
use super::pools::AccallocPoolId;
use super::types::{AccallocDeviceType, AccallocStatus};
use std::ffi::c_void;

/// Make `pool` sleepable: its segments grow as expandable ones (pages that can be unmapped and
/// mapped again at the same addresses) whatever `expandable_segments` says. Call it before the pool
/// allocates.
///
/// Errors: ACCALLOC_ERROR_NOT_SUPPORTED (the pool's memory has no virtual memory; the message names
/// the backend), ACCALLOC_ERROR_INVALID_ARGUMENT (no such pool; it holds ordinary segments already),
/// ACCALLOC_ERROR_INVALID_DEVICE; nothing changes.
#[no_mangle]
pub extern "C" fn accalloc_pool_set_sleepable(device: i32, pool: AccallocPoolId) -> AccallocStatus {
    accalloc_pool_set_sleepable_on(current_type(), device, pool)
}

/// accalloc_pool_set_sleepable on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_pool_set_sleepable_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
) -> AccallocStatus {
    guard(|| on(device_type)?.make_pool_sleepable(device, (pool.first, pool.second)))
}

/// Pause a sleepable `pool`: the memory behind each of its mapped pages goes back to the device
/// (accalloc_mem_get_info's free rises by accalloc_pool_paused_bytes), the addresses stay reserved,
/// and with `backup` non-zero the contents are first copied to host memory. Every statistic stays:
/// its blocks are still allocated or free as they were. Until accalloc_pool_resume, an allocation
/// routed to the pool fails with ACCALLOC_ERROR_INVALID_ARGUMENT (its blocks may be freed), and its
/// memory must not be touched. Work queued on the pool's memory must be finished first. Pausing a
/// paused pool does nothing. A failure half way puts back the pages this call paused.
///
/// Errors: ACCALLOC_ERROR_NOT_SUPPORTED (no virtual memory; a backup where the backend has no
/// copies to host memory: the message says which), ACCALLOC_ERROR_INVALID_ARGUMENT (no such pool;
/// not sleepable), ACCALLOC_ERROR_BACKEND, ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub extern "C" fn accalloc_pool_pause(
    device: i32,
    pool: AccallocPoolId,
    backup: i32,
) -> AccallocStatus {
    accalloc_pool_pause_on(current_type(), device, pool, backup)
}

/// accalloc_pool_pause on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_pool_pause_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    backup: i32,
) -> AccallocStatus {
    guard(|| on(device_type)?.pause_pool(device, (pool.first, pool.second), backup != 0))
}

/// Resume a paused `pool`: new memory at the same addresses, and the backup copied back (without
/// one, the contents are undefined). Resuming a running pool does nothing. When the device has no
/// room (ACCALLOC_ERROR_OUT_OF_MEMORY) or a call fails (ACCALLOC_ERROR_BACKEND), the pages resumed so
/// far stay resumed and the rest paused: call it again.
///
/// Errors: as accalloc_pool_pause.
#[no_mangle]
pub extern "C" fn accalloc_pool_resume(device: i32, pool: AccallocPoolId) -> AccallocStatus {
    accalloc_pool_resume_on(current_type(), device, pool)
}

/// accalloc_pool_resume on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_pool_resume_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
) -> AccallocStatus {
    guard(|| on(device_type)?.resume_pool(device, (pool.first, pool.second)))
}

/// Store in `*out` the bytes of `pool` paused now (-1 where the pool does not exist).
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_paused_bytes(
    device: i32,
    pool: AccallocPoolId,
    out: *mut i64,
) -> AccallocStatus {
    accalloc_pool_paused_bytes_on(current_type(), device, pool, out)
}

/// accalloc_pool_paused_bytes on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_paused_bytes_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    out: *mut i64,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let bytes = on(device_type)?.pool_paused_bytes(device, (pool.first, pool.second))?;
        *out = bytes.map_or(-1, |b| b as i64);
        Ok(())
    })
}

/// Store in `*out` the sleepable pool whose paused memory the `size` bytes at `ptr` on `device`
/// touch, or {0, 0} when none of them is paused: a framework checks a kernel's arguments with it
/// before touching them (their memory went back to the device at the pause). Until the first
/// pause on this accelerator it costs a load; after that, the device's lock and a lookup.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_paused_at(
    device: i32,
    ptr: *const c_void,
    size: usize,
    out: *mut AccallocPoolId,
) -> AccallocStatus {
    accalloc_pool_paused_at_on(current_type(), device, ptr, size, out)
}

/// accalloc_pool_paused_at on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_paused_at_on(
    device_type: AccallocDeviceType,
    device: i32,
    ptr: *const c_void,
    size: usize,
    out: *mut AccallocPoolId,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let pool = on(device_type)?.paused_pool_at(device, ptr as usize, size)?;
        let (first, second) = pool.unwrap_or((0, 0));
        *out = AccallocPoolId { first, second };
        Ok(())
    })
}
