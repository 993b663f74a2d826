//! The current device of each thread, per device type (as cudaSetDevice is per thread).

use super::{DeviceType, MAX_DEVICE_TYPES};
use std::cell::Cell;

thread_local! {
    // Plain cells with no destructor: the slot outlives this thread's other thread-locals, so calls
    // from TLS destructors and atexit handlers still see (and may set) their current device.
    static CURRENT_DEVICE: [Cell<usize>; MAX_DEVICE_TYPES] =
        const { [const { Cell::new(0) }; MAX_DEVICE_TYPES] };
}

/// This thread's current device of `device_type` (0 until set).
pub fn current_device_of(device_type: DeviceType) -> usize {
    let Ok(slot) = usize::try_from(device_type) else {
        return 0;
    };
    CURRENT_DEVICE
        .try_with(|current| current.get(slot).map_or(0, Cell::get))
        .unwrap_or(0)
}

/// Make `index` this thread's current device of `device_type`.
pub fn set_current_device_of(device_type: DeviceType, index: usize) {
    let Ok(slot) = usize::try_from(device_type) else {
        return;
    };
    let _ = CURRENT_DEVICE.try_with(|current| {
        if let Some(cell) = current.get(slot) {
            cell.set(index);
        }
    });
}
