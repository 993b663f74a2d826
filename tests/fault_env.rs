//! ACCALLOC_HOST_FAIL from the environment, through the C ABI.

use accalloc::capi::memory::{accalloc_empty_cache, accalloc_free, accalloc_malloc};
use accalloc::capi::AccallocStatus;
use std::ffi::c_void;

mod common;
use common::stat;

#[test]
fn every_second_device_allocation_fails_and_is_retried() {
    std::env::set_var("ACCALLOC_HOST_FAIL", "alloc:every=2");
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "1GiB");
    let mut ptrs = Vec::new();
    unsafe {
        for size in [1000usize, 5 << 20, 30 << 20, 12 << 20] {
            let mut p: *mut c_void = std::ptr::null_mut();
            assert_eq!(
                accalloc_malloc(&mut p, size, -1, std::ptr::null_mut()),
                AccallocStatus::ACCALLOC_OK
            );
            ptrs.push(p);
        }
    }
    // Device calls 2 and 4 (for the 5 MiB and 30 MiB requests) failed: each time the cache was
    // released and the retry (calls 3 and 5) succeeded. 12 MiB fits the 5 MiB request's segment.
    assert_eq!(stat("num_alloc_retries"), 2);
    assert_eq!(stat("num_ooms"), 0);
    assert_eq!(stat("num_sync_all_streams"), 2);
    assert_eq!(stat("segment.all.current"), 3);
    unsafe {
        for p in ptrs {
            assert_eq!(accalloc_free(p), AccallocStatus::ACCALLOC_OK);
        }
        assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
    }
    assert_eq!(stat("reserved_bytes.all.current"), 0);
}
