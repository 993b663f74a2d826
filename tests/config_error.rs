//! A bad environment setting is a configuration error on every call, naming the variable.

use accalloc::capi::device::accalloc_device_count;
use accalloc::capi::info::accalloc_last_error_message;
use accalloc::capi::memory::accalloc_malloc;
use accalloc::capi::AccallocStatus;
use std::ffi::{c_void, CStr};

#[test]
fn bad_capacity_fails_every_call_with_a_clear_message() {
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "lots");
    unsafe {
        let mut count = 0;
        assert_eq!(
            accalloc_device_count(&mut count),
            AccallocStatus::ACCALLOC_ERROR_CONFIG
        );
        let message = CStr::from_ptr(accalloc_last_error_message())
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            message.starts_with("ACCALLOC_HOST_CAPACITY='lots' is not a valid capacity"),
            "{message}"
        );
        let mut p: *mut c_void = std::ptr::null_mut();
        assert_eq!(
            accalloc_malloc(&mut p, 64, -1, std::ptr::null_mut()),
            AccallocStatus::ACCALLOC_ERROR_CONFIG
        );
        assert_eq!(count, 0, "outputs are not written on failure");
    }
}
