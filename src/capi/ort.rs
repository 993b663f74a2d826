//! ONNX Runtime's allocator from C: the `accalloc::ort` allocator behind opaque pointers, so that this
//! header needs no ORT header. Built without the `ort` feature, both functions answer
//! ACCALLOC_ERROR_NOT_SUPPORTED (the header is the same either way).

use super::guard::{guard, out_ptr};
use super::types::{AccallocDeviceType, AccallocStatus};
use crate::error::{Error, Result};
use std::ffi::c_void;
use std::sync::Mutex;

/// The allocators handed out and not yet destroyed, by address: destroy refuses any other pointer
/// instead of freeing what it does not own.
static LIVE_ALLOCATORS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<usize>> {
    // A list of addresses: a panic elsewhere cannot leave it half-written.
    LIVE_ALLOCATORS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Make an ONNX Runtime allocator (an `OrtAllocator*`, stored in `*out_allocator`) whose memory comes
/// from `device` (-1: this thread's current device, fixed at this call) of the accelerator of
/// `device_type`, through accalloc's caching allocator on the default stream: ORT's tensors then show
/// in accalloc's statistics, memory_summary, snapshots and ACCALLOC_TRACE.
///
/// `ort_api` is the `const OrtApi*` from `OrtGetApiBase()->GetApi(ort_api_version)`; it must stay valid
/// while the allocator lives. The allocator's version field is the lower of `ort_api_version` and the
/// version this library was built with (23), and it sets only the callbacks that version reads
/// (GetStats and AllocOnStream from 23). Its Info is "Cpu" memory (OrtDeviceAllocator,
/// OrtMemTypeDefault) for the host and registered backends, which must then be host-accessible, and
/// "Cuda" memory of the device's index for CUDA. GetStats answers ORT's AllocatorStats keys from this
/// device's books: Limit, InUse, RequestedInUse, TotalAllocated (reserved bytes), MaxInUse,
/// NumAllocs, NumReserves, NumArenaExtensions and NumArenaShrinkages (segments taken and given
/// back), MaxAllocSize. An allocation that fails throws a C++ std::runtime_error with accalloc's
/// message, as ORT's own allocators do, through the C++ runtime ORT loaded (NULL where none is
/// loaded): ORT makes it the error status of the call that allocated. The message also stays on the
/// failing thread's accalloc_last_error_message().
///
/// Share it with `RegisterAllocator(env, allocator)` and the session config entry
/// "session.use_env_allocators" = "1". Destroy it with accalloc_ort_allocator_destroy once ORT no
/// longer uses it.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (ort_api or out_allocator NULL, ort_api_version 0 or
/// above 1000, an unknown device type), ACCALLOC_ERROR_INVALID_DEVICE, ACCALLOC_ERROR_BACKEND (ORT
/// could not create the memory info), ACCALLOC_ERROR_NOT_SUPPORTED (built without ORT support). On
/// error *out_allocator is not touched.
#[no_mangle]
pub unsafe extern "C" fn accalloc_ort_allocator_create(
    ort_api: *const c_void,
    ort_api_version: u32,
    device_type: AccallocDeviceType,
    device: i32,
    out_allocator: *mut *mut c_void,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out_allocator, "out_allocator")?;
        *out = create(ort_api, ort_api_version, device_type, device)?;
        Ok(())
    })
}

/// Destroy an allocator from accalloc_ort_allocator_create (NULL is a no-op). Call it only after ORT
/// stops using it (UnregisterAllocator, or the environment released) and after the sessions and
/// values holding its memory are released; memory still held stays allocated.
///
/// Errors: ACCALLOC_ERROR_INVALID_POINTER for a pointer that is not a live allocator of
/// accalloc_ort_allocator_create (nothing is freed).
#[no_mangle]
pub unsafe extern "C" fn accalloc_ort_allocator_destroy(allocator: *mut c_void) -> AccallocStatus {
    guard(|| {
        if allocator.is_null() {
            return Ok(());
        }
        let mut live = live();
        let Some(slot) = live.iter().position(|&a| a == allocator as usize) else {
            return Err(Error::invalid_pointer(format!(
                "{allocator:p} is not an allocator of accalloc_ort_allocator_create (or it was \
                 destroyed already)"
            )));
        };
        live.swap_remove(slot);
        drop(live);
        destroy(allocator);
        Ok(())
    })
}

#[cfg(feature = "ort")]
fn create(
    ort_api: *const c_void,
    ort_api_version: u32,
    device_type: AccallocDeviceType,
    device: i32,
) -> Result<*mut c_void> {
    // SAFETY: the caller promises a non-NULL `ort_api` is an OrtApi of that version, valid while the
    // allocator lives.
    let allocator = unsafe {
        crate::ort::Allocator::new(ort_api.cast(), ort_api_version, device_type, device)
    }?;
    let ptr = Box::into_raw(allocator);
    live().push(ptr as usize);
    Ok(ptr.cast())
}

#[cfg(feature = "ort")]
fn destroy(allocator: *mut c_void) {
    // SAFETY: a live address from `create`, removed from the list, so it is dropped once.
    drop(unsafe { Box::from_raw(allocator.cast::<crate::ort::Allocator>()) });
}

#[cfg(not(feature = "ort"))]
fn create(_: *const c_void, _: u32, _: AccallocDeviceType, _: i32) -> Result<*mut c_void> {
    Err(Error::new(
        crate::error::ErrorKind::NotSupported,
        "accalloc was built without the ort feature: rebuild with --features ort",
    ))
}

#[cfg(not(feature = "ort"))]
fn destroy(_: *mut c_void) {}
