//! Addresses that are not the start of a live block are refused with ACCALLOC_ERROR_INVALID_POINTER
//! and change nothing: through accalloc_free, accalloc_record_stream, accalloc_allocation_info and the
//! pluggable entry points, first on the one-device shortcut, then on the general path (two host
//! devices holding memory).
//! This binary is its own process, so the shortcut's state is this test's alone.

mod common;

use accalloc::capi::memory::{accalloc_allocation_info, accalloc_record_stream};
use accalloc::capi::pluggable::{accalloc_pluggable_free, accalloc_pluggable_record_stream};
use accalloc::capi::AccallocDeviceStats;
use accalloc::capi::AccallocStatus::{self, ACCALLOC_ERROR_INVALID_POINTER, ACCALLOC_OK};
use accalloc::runtime::DEVICE_TYPE_HOST;
use common::{free, last_error, malloc, stats};
use std::ffi::c_void;

/// A stream other than the default one, so that record_stream has something to record.
const SIDE_STREAM: usize = 7;

/// Every address that must be refused while `live` (address, size) blocks are held.
fn bad_pointers(live: &[(usize, usize)], freed: usize) -> Vec<usize> {
    let mut bad = vec![
        1,
        usize::MAX, // the pointer map's empty key
        usize::MAX - 511,
        0xffff_8000_0000_0000,
        512,
        freed,
    ];
    for &(ptr, size) in live {
        bad.extend([ptr + 512, ptr + size, ptr - 512, ptr + 1]);
    }
    // One past a block's end may be where the next live block starts.
    bad.retain(|candidate| live.iter().all(|&(ptr, _)| ptr != *candidate));
    bad
}

fn both_devices() -> (AccallocDeviceStats, AccallocDeviceStats) {
    (stats(0), stats(1))
}

/// Refuse each bad address through every entry point that takes one, with both devices' books
/// unchanged after each.
fn every_bad_pointer_is_refused(live: &[(usize, usize)], freed: usize) {
    let before = both_devices();
    for ptr in bad_pointers(live, freed) {
        assert_eq!(free(ptr), ACCALLOC_ERROR_INVALID_POINTER, "free({ptr:#x})");
        assert!(last_error().contains("pointer"), "{}", last_error());
        assert_eq!(both_devices(), before, "free({ptr:#x}) changed the books");

        let status: AccallocStatus =
            unsafe { accalloc_record_stream(ptr as *mut c_void, SIDE_STREAM as *mut c_void) };
        assert_eq!(
            status, ACCALLOC_ERROR_INVALID_POINTER,
            "record_stream({ptr:#x})"
        );
        assert_eq!(
            both_devices(),
            before,
            "record_stream({ptr:#x}) changed the books"
        );

        let mut size = 7u64;
        let status = unsafe {
            accalloc_allocation_info(
                ptr as *const c_void,
                &mut size,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(
            (status, size),
            (ACCALLOC_ERROR_INVALID_POINTER, 7),
            "allocation_info({ptr:#x})"
        );

        // The pluggable entry points return nothing: the last error says what happened.
        unsafe { accalloc_pluggable_free(ptr as *mut c_void, 0, 0, std::ptr::null_mut()) };
        assert!(
            last_error().contains(&format!("{ptr:#x}")),
            "{}",
            last_error()
        );
        assert_eq!(
            both_devices(),
            before,
            "pluggable_free({ptr:#x}) changed the books"
        );
        unsafe { accalloc_pluggable_record_stream(ptr as *mut c_void, SIDE_STREAM as *mut c_void) };
        assert_eq!(both_devices(), before, "pluggable_record_stream({ptr:#x})");
    }
    // free(NULL) is a no-op.
    assert_eq!(free(0), ACCALLOC_OK);
    assert_eq!(both_devices(), before);
}

#[test]
fn bad_pointers_change_nothing_on_the_shortcut_and_the_general_path() {
    std::env::set_var("ACCALLOC_HOST_DEVICES", "2");
    std::env::set_var("ACCALLOC_DEVICE", "host");

    // The state: three live blocks (4 KiB, 4 KiB, 30 MiB) on one device, and a block freed.
    let mut live = vec![];
    for size in [4096, 4096, 30 << 20] {
        live.push((malloc(Some(DEVICE_TYPE_HOST), 0, size), size));
    }
    let freed = malloc(Some(DEVICE_TYPE_HOST), 0, 8192);
    assert_eq!(free(freed), ACCALLOC_OK);
    every_bad_pointer_is_refused(&live, freed);
    assert_eq!(stats(0).allocation[0].current, 3);

    // A segment on device 1 ends the shortcut: the general path must refuse them too.
    for size in [4096, 2 << 20] {
        live.push((malloc(Some(DEVICE_TYPE_HOST), 1, size), size));
    }
    every_bad_pointer_is_refused(&live, freed);
    assert_eq!(stats(1).allocation[0].current, 2);

    // The live blocks are still theirs to free, once each.
    for &(ptr, _) in &live {
        assert_eq!(free(ptr), ACCALLOC_OK);
        assert_eq!(free(ptr), ACCALLOC_ERROR_INVALID_POINTER);
    }
    for device in [0, 1] {
        assert_eq!(stats(device).allocation[0].current, 0);
        assert_eq!(stats(device).allocated_bytes[0].current, 0);
    }
}
