//! Devices and accelerators: device counts and the current device, the current accelerator, and
//! backends registered from C.

use super::backend_table::AccallocBackendVTable;
use super::guard::{current_type, guard, on, out_ptr, str_arg};
use super::types::{AccallocDeviceType, AccallocStatus};
use crate::backend::custom::CustomBackend;
use crate::error::Error;
use crate::runtime::runtime;
use std::ffi::c_char;
use std::sync::Arc;

/// Free and total memory of `device` (-1: current), as the device reports them.
#[no_mangle]
pub unsafe extern "C" fn accalloc_mem_get_info(
    device: i32,
    free: *mut u64,
    total: *mut u64,
) -> AccallocStatus {
    accalloc_mem_get_info_on(current_type(), device, free, total)
}

/// accalloc_mem_get_info on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_mem_get_info_on(
    device_type: AccallocDeviceType,
    device: i32,
    free: *mut u64,
    total: *mut u64,
) -> AccallocStatus {
    guard(|| {
        let free = out_ptr(free, "free")?;
        let total = out_ptr(total, "total")?;
        let info = on(device_type)?.mem_get_info(device)?;
        *free = info.free as u64;
        *total = info.total as u64;
        Ok(())
    })
}

/// Limit the memory accalloc reserves on `device` to `fraction` (0 to 1) of its total memory;
/// a request past it fails as out of memory without asking the device.
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT for a fraction outside [0, 1] or NaN.
#[no_mangle]
pub extern "C" fn accalloc_set_memory_fraction(fraction: f64, device: i32) -> AccallocStatus {
    accalloc_set_memory_fraction_on(current_type(), fraction, device)
}

/// accalloc_set_memory_fraction on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_set_memory_fraction_on(
    device_type: AccallocDeviceType,
    fraction: f64,
    device: i32,
) -> AccallocStatus {
    guard(|| on(device_type)?.set_memory_fraction(fraction, device))
}

/// The fraction of its total memory accalloc may reserve on `device` (-1: this thread's current
/// device) of the current accelerator, in `*out`: what accalloc_set_memory_fraction (or the
/// per_process_memory_fraction setting) left, as PyTorch's torch.cuda.get_per_process_memory_fraction
/// reports it (the bytes allowed over the total); 1.0 when no fraction is set.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_get_memory_fraction(
    out: *mut f64,
    device: i32,
) -> AccallocStatus {
    accalloc_get_memory_fraction_on(current_type(), out, device)
}

/// accalloc_get_memory_fraction on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_get_memory_fraction_on(
    device_type: AccallocDeviceType,
    out: *mut f64,
    device: i32,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        *out = on(device_type)?.memory_fraction(device)?;
        Ok(())
    })
}

/// Number of devices of the current accelerator.
#[no_mangle]
pub unsafe extern "C" fn accalloc_device_count(out: *mut i32) -> AccallocStatus {
    accalloc_device_count_on(current_type(), out)
}

/// accalloc_device_count of the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_device_count_on(
    device_type: AccallocDeviceType,
    out: *mut i32,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        *out = on(device_type)?.device_count() as i32;
        Ok(())
    })
}

/// This thread's current device index (0 until accalloc_set_device is called).
#[no_mangle]
pub unsafe extern "C" fn accalloc_current_device(out: *mut i32) -> AccallocStatus {
    accalloc_current_device_on(current_type(), out)
}

/// accalloc_current_device of the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_current_device_on(
    device_type: AccallocDeviceType,
    out: *mut i32,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        *out = on(device_type)?.current_device() as i32;
        Ok(())
    })
}

/// Make `device` this thread's current device (what -1 means in other calls).
#[no_mangle]
pub extern "C" fn accalloc_set_device(device: i32) -> AccallocStatus {
    accalloc_set_device_on(current_type(), device)
}

/// accalloc_set_device on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_set_device_on(
    device_type: AccallocDeviceType,
    device: i32,
) -> AccallocStatus {
    guard(|| on(device_type)?.set_device(device))
}

/// The accelerator that calls without a device type use: ACCALLOC_DEVICE_CUDA when a GPU is present,
/// else ACCALLOC_DEVICE_HOST, until accalloc_set_accelerator chooses another.
#[no_mangle]
pub extern "C" fn accalloc_current_accelerator() -> AccallocDeviceType {
    current_type()
}

/// Make `device_type` the accelerator of calls without a device type (process-wide).
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT when no such type exists.
#[no_mangle]
pub extern "C" fn accalloc_set_accelerator(device_type: AccallocDeviceType) -> AccallocStatus {
    guard(|| runtime()?.set_accelerator(device_type))
}

/// The name of a device type ("host", "cuda", or a registered backend's name), or "unknown".
/// Never NULL; valid for the life of the process.
#[no_mangle]
pub extern "C" fn accalloc_device_type_name(device_type: AccallocDeviceType) -> *const c_char {
    match device_type {
        super::types::ACCALLOC_DEVICE_HOST => c"host".as_ptr(),
        super::types::ACCALLOC_DEVICE_CUDA => c"cuda".as_ptr(),
        _ => on(device_type).map_or(c"unknown".as_ptr(), |accelerator| {
            accelerator.c_name().as_ptr()
        }),
    }
}

/// Register an accelerator backend written in C and store its new device type in `*out`; every
/// function of this library then works on it (the `_on` forms, or after accalloc_set_accelerator), with
/// its own pools and statistics. `name` (1 to 64 letters, digits, '_' or '-') must be new. The table
/// is copied; its functions and context must stay valid for the life of the process.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT for a NULL argument, a bad or taken name, a table whose
/// struct_size is wrong or whose required entries are NULL, or a device_count that fails.
#[no_mangle]
pub unsafe extern "C" fn accalloc_register_backend(
    name: *const c_char,
    vtable: *const AccallocBackendVTable,
    out: *mut AccallocDeviceType,
) -> AccallocStatus {
    guard(|| {
        let name = str_arg(name, "name")?;
        let out = out_ptr(out, "out")?;
        // SAFETY: a non-NULL table is readable for its struct_size bytes, as the caller promises.
        let table = unsafe { AccallocBackendVTable::read(vtable) }
            .ok_or_else(|| Error::invalid_argument("vtable is NULL"))?;
        let backend = table
            .functions()
            // SAFETY: the caller promises valid functions and context for the life of the process.
            .and_then(|functions| unsafe { CustomBackend::new(name, functions) })
            .map_err(|why| {
                Error::invalid_argument(format!(
                    "backend {} was not registered: {why}",
                    crate::error::quote(name)
                ))
            })?;
        *out = runtime()?.register(Arc::new(backend))?;
        Ok(())
    })
}
