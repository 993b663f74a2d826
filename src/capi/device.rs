//! Devices and accelerators.

use super::guard::{guard, out_ptr};
use super::types::{AccDeviceType, AccStatus};
use crate::runtime::{device_type_name, runtime};
use std::ffi::c_char;

/// Free and total memory of `device` (-1: current), as the device reports them.
#[no_mangle]
pub unsafe extern "C" fn acc_mem_get_info(
    device: i32,
    free: *mut u64,
    total: *mut u64,
) -> AccStatus {
    guard(|| {
        let free = out_ptr(free, "free")?;
        let total = out_ptr(total, "total")?;
        let info = runtime()?.mem_get_info(device)?;
        *free = info.free as u64;
        *total = info.total as u64;
        Ok(())
    })
}

/// Limit the memory accalloc reserves on `device` to `fraction` (0 to 1) of its total memory;
/// a request past it fails as out of memory without asking the device.
/// Errors: ACC_ERROR_INVALID_ARGUMENT for a fraction outside [0, 1] or NaN.
#[no_mangle]
pub extern "C" fn acc_set_memory_fraction(fraction: f64, device: i32) -> AccStatus {
    guard(|| runtime()?.set_memory_fraction(fraction, device))
}

/// Number of devices of the current accelerator.
#[no_mangle]
pub unsafe extern "C" fn acc_device_count(out: *mut i32) -> AccStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        *out = runtime()?.device_count() as i32;
        Ok(())
    })
}

/// This thread's current device index (0 until acc_set_device is called).
#[no_mangle]
pub unsafe extern "C" fn acc_current_device(out: *mut i32) -> AccStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        *out = runtime()?.current_device() as i32;
        Ok(())
    })
}

/// Make `device` this thread's current device (what -1 means in other calls).
#[no_mangle]
pub extern "C" fn acc_set_device(device: i32) -> AccStatus {
    guard(|| runtime()?.set_device(device))
}

/// The accelerator that calls use: ACC_DEVICE_CUDA when a GPU is present, else ACC_DEVICE_HOST.
#[no_mangle]
pub extern "C" fn acc_current_accelerator() -> AccDeviceType {
    runtime()
        .map(|r| r.current().device_type())
        .unwrap_or(super::types::ACC_DEVICE_HOST)
}

/// The name of a device type ("host", "cuda"), or "unknown". Never NULL; static storage.
#[no_mangle]
pub extern "C" fn acc_device_type_name(device_type: AccDeviceType) -> *const c_char {
    let name: &'static [u8] = match device_type_name(device_type) {
        Some("host") => b"host\0",
        Some("cuda") => b"cuda\0",
        _ => b"unknown\0",
    };
    name.as_ptr() as *const c_char
}
