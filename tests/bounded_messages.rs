//! An error message quotes a bounded prefix of what it was given: a 1 MB settings string, key,
//! statistic name or backend name gives a message of a few hundred bytes that still says which
//! input was wrong.

use accalloc::capi::device::accalloc_register_backend;
use accalloc::capi::settings::accalloc_set_allocator_settings;
use accalloc::capi::stats::accalloc_memory_stat;
use accalloc::capi::*;
use std::ffi::CString;

mod common;
use common::last_error;

const MB: usize = 1 << 20;

fn check_bounded(status: AccallocStatus, want: AccallocStatus, starts: &str) {
    assert_eq!(
        status,
        want,
        "{}",
        &last_error()[..200.min(last_error().len())]
    );
    let message = last_error();
    assert!(message.len() < 1024, "a {} byte message", message.len());
    assert!(message.contains(starts), "{message}");
    assert!(
        message.contains("(1048576 bytes)") || message.contains("bytes)"),
        "{message}"
    );
}

#[test]
fn messages_quote_a_bounded_prefix_of_huge_inputs() {
    let config = AccallocStatus::ACCALLOC_ERROR_CONFIG;
    let long_key = CString::new("k".repeat(MB)).unwrap();
    let value = format!("max_split_size_mb:{}", "9".repeat(MB));
    let long_value = CString::new(value).unwrap();
    let malformed = CString::new(format!("expandable_segments:True{}", ":".repeat(MB))).unwrap();
    unsafe {
        check_bounded(
            accalloc_set_allocator_settings(long_key.as_ptr()),
            config,
            "kkkk",
        );
        check_bounded(
            accalloc_set_allocator_settings(long_value.as_ptr()),
            config,
            "invalid allocator setting max_split_size_mb:9999",
        );
        check_bounded(
            accalloc_set_allocator_settings(malformed.as_ptr()),
            config,
            "malformed allocator settings 'expandable_segments:True:::",
        );
        let mut value = 0;
        check_bounded(
            accalloc_memory_stat(-1, long_key.as_ptr(), &mut value),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT,
            "unknown statistic 'kkkk",
        );
        let table = AccallocBackendVTable {
            struct_size: std::mem::size_of::<AccallocBackendVTable>(),
            context: std::ptr::null_mut(),
            device_count: None,
            raw_alloc: None,
            raw_free: None,
            mem_get_info: None,
            event_create: None,
            event_record: None,
            event_query: None,
            event_synchronize: None,
            event_destroy: None,
            stream_synchronize: None,
            vm_granularity: None,
            vm_reserve: None,
            vm_map: None,
            vm_unmap: None,
            vm_release: None,
            host_alloc: None,
            host_free: None,
            copy_to_host: None,
            copy_from_host: None,
        };
        let mut device_type = -1;
        check_bounded(
            accalloc_register_backend(long_key.as_ptr(), &table, &mut device_type),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT,
            "backend 'kkkk",
        );
    }
}
