//! ACCALLOC_HOST_FAIL's event rule from the environment, through the C ABI: every third event or
//! stream call of the host fails, and each failure is a status and a message, never a lost block.

use accalloc::capi::memory::*;
use accalloc::capi::AccallocStatus;
use std::ffi::c_void;
use std::ptr::null_mut;

mod common;
use common::{last_error, stat};

const BACKEND: AccallocStatus = AccallocStatus::ACCALLOC_ERROR_BACKEND;
const OK: AccallocStatus = AccallocStatus::ACCALLOC_OK;

#[test]
fn every_third_event_call_fails_and_nothing_is_lost() {
    std::env::set_var("ACCALLOC_HOST_FAIL", "alloc:every=1000, event:every=3");
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "1GiB");
    let (stream1, stream2) = (
        std::ptr::without_provenance_mut::<c_void>(1),
        std::ptr::without_provenance_mut::<c_void>(2),
    );
    unsafe {
        let mut p: *mut c_void = null_mut();
        assert_eq!(accalloc_malloc(&mut p, 1000, -1, null_mut()), OK);
        assert_eq!(accalloc_record_stream(p, stream1), OK);
        // Event calls 1 and 2: create and record.
        assert_eq!(accalloc_free(p), OK);
        assert_eq!(stat("active_bytes.all.current"), 1024);
        // Call 3 (query) fails: the malloc is refused, the block still waits.
        let mut q: *mut c_void = null_mut();
        assert_eq!(accalloc_malloc(&mut q, 1000, -1, null_mut()), BACKEND);
        assert!(last_error().contains("host backend: query_event on device 0 failed"));
        assert!(last_error().contains("injected by ACCALLOC_HOST_FAIL, call 3"));
        assert_eq!(stat("active_bytes.all.current"), 1024);
        // Calls 4 and 5 (query, destroy): the block is back and handed out again.
        assert_eq!(accalloc_malloc(&mut q, 1000, -1, null_mut()), OK);
        assert_eq!(q, p);
        assert_eq!(accalloc_record_stream(p, stream2), OK);
        // Call 6 (create) fails: the free is refused and the block stays allocated.
        assert_eq!(accalloc_free(p), BACKEND);
        assert!(last_error().contains("create_event"), "{}", last_error());
        assert!(last_error().contains("still allocated"), "{}", last_error());
        assert_eq!(stat("allocated_bytes.all.current"), 1024);
        // Calls 7 and 8: freed, waiting on stream 2.
        assert_eq!(accalloc_free(p), OK);
        assert_eq!(stat("allocated_bytes.all.current"), 0);
        // Call 9 (synchronize) fails in empty_cache; 10 and 11 succeed on the retry.
        assert_eq!(accalloc_empty_cache(), BACKEND);
        assert!(
            last_error().contains("synchronize_event"),
            "{}",
            last_error()
        );
        assert_eq!(stat("reserved_bytes.all.current"), 2 << 20);
        assert_eq!(accalloc_empty_cache(), OK);
    }
    assert_eq!(stat("active_bytes.all.current"), 0);
    assert_eq!(stat("reserved_bytes.all.current"), 0);
    assert_eq!(stat("num_device_free"), 1);
}
