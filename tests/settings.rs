//! ACCALLOC_CONF at start-up and accalloc_set_allocator_settings at run time, through the C ABI.

use accalloc::capi::info::accalloc_last_error_message;
use accalloc::capi::memory::{accalloc_free, accalloc_malloc};
use accalloc::capi::settings::{accalloc_get_allocator_settings, accalloc_set_allocator_settings};
use accalloc::capi::AccallocStatus;
use std::ffi::{c_void, CStr, CString};

mod common;
use common::stat;

fn settings() -> String {
    let mut len = 0;
    unsafe {
        assert_eq!(
            accalloc_get_allocator_settings(std::ptr::null_mut(), 0, &mut len),
            AccallocStatus::ACCALLOC_OK
        );
        let mut buf = vec![0 as std::ffi::c_char; len];
        assert_eq!(
            accalloc_get_allocator_settings(buf.as_mut_ptr(), len, &mut len),
            AccallocStatus::ACCALLOC_OK
        );
        CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
    }
}

fn set(text: &str) -> AccallocStatus {
    let text = CString::new(text).unwrap();
    unsafe { accalloc_set_allocator_settings(text.as_ptr()) }
}

#[test]
fn settings_from_the_environment_and_at_run_time() {
    std::env::set_var(
        "ACCALLOC_CONF",
        "max_split_size_mb:40, expandable_segments:False",
    );
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "1GiB");
    assert_eq!(stat("max_split_size"), 40 << 20);
    assert_eq!(settings(), "max_split_size_mb:40");

    // An oversize request is counted as such and never split.
    let mut p: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        unsafe { accalloc_malloc(&mut p, 50 << 20, -1, std::ptr::null_mut()) },
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(stat("oversize_allocations.current"), 1);
    assert_eq!(stat("oversize_segments.current"), 1);

    // A bad string is a configuration error and changes nothing.
    assert_eq!(
        set("max_split_size_mb:10"),
        AccallocStatus::ACCALLOC_ERROR_CONFIG
    );
    let message = unsafe { CStr::from_ptr(accalloc_last_error_message()) }
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(
        message,
        "invalid allocator setting max_split_size_mb:10: max_split_size_mb must be a whole number of MiB >= 20"
    );
    assert_eq!(settings(), "max_split_size_mb:40");
    assert_eq!(
        unsafe { accalloc_set_allocator_settings(std::ptr::null()) },
        AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
    );

    // A good one takes effect on devices already in use.
    assert_eq!(
        set("roundup_power2_divisions:[1:4,>:4],per_process_memory_fraction:0.5"),
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(
        stat("max_split_size"),
        -1,
        "max_split_size_mb returns to its default when not named"
    );
    assert!(
        settings().contains("per_process_memory_fraction:0.5"),
        "{}",
        settings()
    );
    let mut q: *mut c_void = std::ptr::null_mut();
    // 1 MiB + 1 byte rounds up to 1.25 MiB with 4 divisions.
    assert_eq!(
        unsafe { accalloc_malloc(&mut q, (1 << 20) + 1, -1, std::ptr::null_mut()) },
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(
        stat("allocated_bytes.large_pool.current"),
        (50 << 20) + (5 << 18)
    );
    // The fraction allows 512 MiB; 50 MiB + 20 MiB are reserved, so 500 MiB more does not fit.
    let mut r: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        unsafe { accalloc_malloc(&mut r, 500 << 20, -1, std::ptr::null_mut()) },
        AccallocStatus::ACCALLOC_ERROR_OUT_OF_MEMORY
    );
    unsafe {
        assert_eq!(accalloc_free(p), AccallocStatus::ACCALLOC_OK);
        assert_eq!(accalloc_free(q), AccallocStatus::ACCALLOC_OK);
    }
}
