//! The current device of each thread, per device type (as cudaSetDevice is per thread).

use super::DeviceType;
use std::cell::RefCell;

thread_local! {
    static CURRENT_DEVICE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// This thread's current device of `device_type` (0 until set).
pub fn current_device_of(device_type: DeviceType) -> usize {
    CURRENT_DEVICE.with(|c| c.borrow().get(device_type as usize).copied().unwrap_or(0))
}

/// Make `index` this thread's current device of `device_type`.
pub fn set_current_device_of(device_type: DeviceType, index: usize) {
    CURRENT_DEVICE.with(|c| {
        let mut current = c.borrow_mut();
        let slot = device_type as usize;
        if current.len() <= slot {
            current.resize(slot + 1, 0);
        }
        current[slot] = index;
    })
}
