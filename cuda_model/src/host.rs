//! The host's side of the driver: page-locked host memory (cuMemHostAlloc, cuMemFreeHost; its books
//! in pinned.rs), the asynchronous copies between host and device (cuMemcpyHtoDAsync,
//! cuMemcpyDtoHAsync) and the synchronous ones (cuMemcpyHtoD, cuMemcpyDtoH: on the legacy default
//! stream, which first waits for all work of the current device, and back only once the bytes are
//! copied). A copy with memory pinned for the stream's device is queued on the stream
//! and made when the stream gets there, its host range in use until then like its device range;
//! with pageable memory the call waits for the stream and copies at once, as the driver stages such
//! copies. Pinned memory handed out or freed while a queued copy on any device's stream still uses
//! it is a violation, as device memory is.

use crate::codes::*;
use crate::pinned::Host;
use crate::{driver, lock, put, CUdeviceptr, CUstream, Model, Range, Stream, Use};
use std::ffi::{c_uint, c_ulonglong, c_void};
use std::panic::catch_unwind;

/// check_unused for host memory, which the streams of every device may use.
fn check_host_unused(m: &Model, range: Range, launching: Option<&Stream>, access: Use, what: &str) {
    for device in 0..m.device_count() {
        m.check_unused(device, range, launching, access, what);
    }
}

/// Pinned for every context with CU_MEMHOSTALLOC_PORTABLE, else for the current one's device; a
/// current context is required, as by the driver.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    size: usize,
    flags: c_uint,
) -> CuResult {
    driver("cuMemHostAlloc", |m| {
        let device = m.current()?;
        if pp.is_null() {
            return Err(INVALID_VALUE);
        }
        let start = lock(&m.pinned).alloc(device, size, flags)?;
        let range = (start, start + size);
        check_host_unused(m, range, None, Use::Write, "cuMemHostAlloc handed out");
        put(pp, start as *mut c_void)
    })
}

/// Only what cuMemHostAlloc returned, once, from any current context.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CuResult {
    driver("cuMemFreeHost", |m| {
        m.current()?;
        let range = lock(&m.pinned).free(p as usize)?;
        let what = "cuMemFreeHost freed pinned host memory";
        check_host_unused(m, range, None, Use::Write, what);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> CuResult {
    driver("cuMemcpyHtoDAsync_v2", |m| {
        copy(m, true, dst as usize, src as usize, bytes, stream)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CuResult {
    driver("cuMemcpyDtoHAsync_v2", |m| {
        copy(m, false, src as usize, dst as usize, bytes, stream)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> CuResult {
    driver("cuMemcpyHtoD_v2", |m| {
        copy_synchronously(m, true, dst as usize, src as usize, bytes)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> CuResult {
    driver("cuMemcpyDtoH_v2", |m| {
        copy_synchronously(m, false, src as usize, dst as usize, bytes)
    })
}

/// The synchronous copies: every stream of the current device is waited for (the legacy default
/// stream synchronizes with them), then the copy is queued on the default stream and waited for.
fn copy_synchronously(
    m: &'static Model,
    to_device: bool,
    device_ptr: usize,
    host: usize,
    bytes: usize,
) -> Result<(), CuResult> {
    let device = m.current()?;
    m.streams_of(device).iter().for_each(|s| s.synchronize());
    copy(m, to_device, device_ptr, host, bytes, std::ptr::null_mut())?;
    m.stream(device, std::ptr::null_mut())?.synchronize();
    Ok(())
}

/// A copy of `bytes` between the current device's memory at `device_ptr` and the host's at `host`,
/// to the device or from it, on `stream`. The device range must be memory the device may access,
/// and the host range no device's address space and, inside pinned memory's, one live allocation
/// (CUDA_ERROR_INVALID_VALUE). Nothing to copy is nothing to do, as in the driver.
fn copy(
    m: &'static Model,
    to_device: bool,
    device_ptr: usize,
    host: usize,
    bytes: usize,
    stream: CUstream,
) -> Result<(), CuResult> {
    let device = m.current()?;
    let stream = m.stream(device, stream)?;
    if bytes == 0 {
        return Ok(());
    }
    let device_ok = {
        let memory = lock(&m.memory);
        memory.accessible(device, device_ptr, bytes) && host != 0 && !memory.holds(host, bytes)
    };
    let kind = lock(&m.pinned).classify(device, host, bytes);
    if !device_ok || kind == Host::Invalid {
        return Err(INVALID_VALUE);
    }
    let (device_range, host_range) = ((device_ptr, device_ptr + bytes), (host, host + bytes));
    let (on_device, on_host) = match to_device {
        true => (Use::Write, Use::Read),
        false => (Use::Read, Use::Write),
    };
    m.check_unused(
        device,
        device_range,
        Some(&stream),
        on_device,
        "a copy used",
    );
    if kind == Host::Pageable {
        stream.synchronize();
        copy_now(m, device, to_device, device_ptr, host, bytes, false);
        return Ok(());
    }
    let what = "a copy used pinned host memory";
    check_host_unused(m, host_range, Some(&stream), on_host, what);
    let (dst, src) = match to_device {
        true => (device_range, host_range),
        false => (host_range, device_range),
    };
    let run = move || copy_now(m, device, to_device, device_ptr, host, bytes, true);
    stream.copy(dst, src, Box::new(run));
    Ok(())
}

/// Make a copy whose memory is still there: memory freed under a queued copy was a violation when
/// it was freed, and the copy does not write into memory that is gone.
fn copy_now(
    m: &Model,
    device: usize,
    to_device: bool,
    device_ptr: usize,
    host: usize,
    bytes: usize,
    pinned: bool,
) {
    let memory = lock(&m.memory);
    let held = lock(&m.pinned);
    let host_ok = !pinned || held.classify(device, host, bytes) == Host::Pinned;
    if !host_ok || !memory.accessible(device, device_ptr, bytes) {
        return;
    }
    let (dst, src) = match to_device {
        true => (device_ptr, host),
        false => (host, device_ptr),
    };
    // SAFETY: the device range is live memory of the device, the host range live pinned memory or
    // the caller's own, and both locks keep them from being freed while the bytes are copied.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) }
}

/// Pinned host memory, for leak checks: out[0] live cuMemHostAlloc allocations, out[1] the bytes
/// they pin (whole pages), out[2] the limit (ACCALLOC_CUDA_MODEL_PINNED_CAPACITY).
/// CUDA_ERROR_NOT_INITIALIZED before cuInit.
#[no_mangle]
pub unsafe extern "C" fn accallocModelPinnedCounts(out: *mut c_ulonglong) -> CuResult {
    catch_unwind(|| {
        let m = crate::MODEL.get().ok_or(NOT_INITIALIZED)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        for (i, n) in lock(&m.pinned).counts().iter().enumerate() {
            *out.add(i) = *n as c_ulonglong;
        }
        Ok(())
    })
    .map_or(UNKNOWN, |r: Result<(), CuResult>| {
        r.err().unwrap_or(SUCCESS)
    })
}
