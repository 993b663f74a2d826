//! A bad ACC_ALLOC_CONF at start-up fails every call with a message naming the variable and the key.

use accalloc::capi::device::acc_device_count;
use accalloc::capi::info::acc_last_error_message;
use accalloc::capi::AccStatus;
use std::ffi::CStr;

#[test]
fn bad_alloc_conf_is_a_configuration_error() {
    std::env::set_var("ACC_ALLOC_CONF", "expandable_segments:yes");
    let mut count = 0;
    assert_eq!(
        unsafe { acc_device_count(&mut count) },
        AccStatus::ACC_ERROR_CONFIG
    );
    let message = unsafe { CStr::from_ptr(acc_last_error_message()) }
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(
        message,
        "ACC_ALLOC_CONF: invalid allocator setting expandable_segments:yes: expandable_segments must be True or False"
    );
}
