//! Helpers shared by the integration tests that go through the C ABI.
#![allow(dead_code)] // each test binary uses its own subset

use accalloc::capi::info::accalloc_last_error_message;
use accalloc::capi::stats::{accalloc_get_device_stats, accalloc_memory_stat};
use accalloc::capi::{AccallocDeviceStats, AccallocStatus};
use std::ffi::{CStr, CString};

/// This thread's last error message.
pub fn last_error() -> String {
    unsafe { CStr::from_ptr(accalloc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// One flat statistic of this thread's current device.
pub fn stat(key: &str) -> i64 {
    let key = CString::new(key).unwrap();
    let mut value = 0;
    assert_eq!(
        unsafe { accalloc_memory_stat(-1, key.as_ptr(), &mut value) },
        AccallocStatus::ACCALLOC_OK
    );
    value
}

/// Every statistic of `device` (-1: current).
pub fn stats(device: i32) -> AccallocDeviceStats {
    let mut out = AccallocDeviceStats {
        struct_size: std::mem::size_of::<AccallocDeviceStats>(),
        ..Default::default()
    };
    assert_eq!(
        unsafe { accalloc_get_device_stats(device, &mut out) },
        AccallocStatus::ACCALLOC_OK
    );
    out
}
