//! A bad ACCALLOC_CONF at start-up fails every call with a message naming the variable and the key.

use accalloc::capi::device::accalloc_device_count;
use accalloc::capi::info::accalloc_last_error_message;
use accalloc::capi::AccallocStatus;
use std::ffi::CStr;

#[test]
fn bad_alloc_conf_is_a_configuration_error() {
    std::env::set_var("ACCALLOC_CONF", "expandable_segments:yes");
    let mut count = 0;
    assert_eq!(
        unsafe { accalloc_device_count(&mut count) },
        AccallocStatus::ACCALLOC_ERROR_CONFIG
    );
    let message = unsafe { CStr::from_ptr(accalloc_last_error_message()) }
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(
        message,
        "ACCALLOC_CONF: invalid allocator setting expandable_segments:yes: expandable_segments must be True or False"
    );
}
