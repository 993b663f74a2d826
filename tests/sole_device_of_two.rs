//! The one-device shortcut on an accelerator of two devices (ACCALLOC_HOST_DEVICES=2, set before the
//! runtime starts: this test binary is its own process). While only device 1 holds memory, calls
//! naming device 1 take the shortcut, but a call for the current device (-1, which is device 0 on
//! this thread) must not: it goes to device 0, whose first segment ends the shortcut.

mod common;

use accalloc::capi::AccallocStatus;
use accalloc::runtime::{runtime, DEVICE_TYPE_HOST};
use common::{free, malloc};

#[test]
fn the_current_device_is_not_taken_for_the_sole_one() {
    std::env::set_var("ACCALLOC_HOST_DEVICES", "2");
    std::env::set_var("ACCALLOC_DEVICE", "host");
    let host = runtime().unwrap().current();
    assert_eq!(host.device_count(), 2);
    let allocated = |device: i32| host.device_stats(device).unwrap().allocated_bytes[0].current;

    // Only device 1 holds memory: calls naming it are served (through the shortcut once taken).
    for _ in 0..3 {
        let p = malloc(Some(DEVICE_TYPE_HOST), 1, 4096);
        assert_eq!(free(p), AccallocStatus::ACCALLOC_OK);
    }
    let on_one = malloc(Some(DEVICE_TYPE_HOST), 1, 8192);
    let also_on_one = malloc(None, 1, 512);
    assert_eq!((allocated(0), allocated(1)), (0, 8192 + 512));

    // The current device of this thread is 0: a call for it goes there, not to the sole device.
    let on_zero = malloc(None, -1, 4096);
    assert_eq!((allocated(0), allocated(1)), (4096, 8192 + 512));
    let again_on_one = malloc(Some(DEVICE_TYPE_HOST), 1, 4096);
    assert_eq!((allocated(0), allocated(1)), (4096, 8192 + 512 + 4096));

    // Every free finds its device, and the books come back to zero.
    for ptr in [on_one, on_zero, also_on_one, again_on_one] {
        assert_eq!(free(ptr), AccallocStatus::ACCALLOC_OK);
    }
    assert_eq!((allocated(0), allocated(1)), (0, 0));
    assert_eq!(free(on_one), AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
}
