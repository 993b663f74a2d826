//! Each thread's last answers of the segment index: the ranges of the segments it found lately, with
//! their device type and their device's lock. A free of an address in one of them tries that device
//! first, reaching its lock in one load instead of walking the accelerator tables. The guess needs no
//! lock: a stale one (the segment went back and its addresses were handed to another device since)
//! only costs a look that finds no live block, because no two devices ever hold the same address at
//! once; device locks live as long as the process.

use super::device_lock::DeviceLock;
use super::DeviceType;
use crate::caching::CachingAllocator;
use std::cell::Cell;

/// Segments remembered per thread: a thread's frees alternate between a few segments at most (the
/// small pool's 2 MiB ones and a large one or two), and a look through four ranges costs less than
/// one read lock.
const REMEMBERED: usize = 4;

/// The remembered segments, field by field: a look reads the ranges straight from the thread's
/// slots (one Cell of the whole table would be copied to the stack first, and read back in smaller
/// pieces than it was written: a store-forwarding stall on every free of the general path).
struct Recent {
    starts: [Cell<usize>; REMEMBERED],
    ends: [Cell<usize>; REMEMBERED],
    device_types: [Cell<DeviceType>; REMEMBERED],
    /// The device's lock address (0: nothing remembered).
    locks: [Cell<usize>; REMEMBERED],
    next: Cell<usize>,
}

thread_local! {
    // Copy cells with no destructor, usable from TLS destructors and atexit handlers too.
    static RECENT: Recent = const {
        Recent {
            starts: [const { Cell::new(0) }; REMEMBERED],
            ends: [const { Cell::new(0) }; REMEMBERED],
            device_types: [const { Cell::new(0) }; REMEMBERED],
            locks: [const { Cell::new(0) }; REMEMBERED],
            next: Cell::new(0),
        }
    };
}

/// The device type and lock of a segment this thread found lately, if `ptr` lies in one.
#[inline]
pub fn guess(ptr: usize) -> Option<(DeviceType, &'static DeviceLock<CachingAllocator>)> {
    let (device_type, lock) = RECENT
        .try_with(|recent| {
            (0..REMEMBERED)
                .find(|&k| recent.starts[k].get() <= ptr && ptr < recent.ends[k].get())
                .map(|k| (recent.device_types[k].get(), recent.locks[k].get()))
        })
        .ok()
        .flatten()?;
    // SAFETY: a remembered address is that of a device lock, and device locks are never freed
    // (accelerators are leaked, their devices never removed).
    Some((device_type, unsafe {
        &*(lock as *const DeviceLock<CachingAllocator>)
    }))
}

/// Remember that [start, end) was the segment of the device behind `lock`, of `device_type`, in
/// place of the oldest range remembered.
#[inline]
pub fn remember(
    start: usize,
    end: usize,
    device_type: DeviceType,
    lock: &'static DeviceLock<CachingAllocator>,
) {
    let lock = lock as *const DeviceLock<CachingAllocator> as usize;
    let _ = RECENT.try_with(|recent| {
        let k = recent.next.get();
        recent.starts[k].set(start);
        recent.ends[k].set(end);
        recent.device_types[k].set(device_type);
        recent.locks[k].set(lock);
        recent.next.set((k + 1) % REMEMBERED);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::simulated::SimulatedBackend;
    use crate::caching::CachingConfig;
    use std::sync::Arc;

    fn device_lock() -> &'static DeviceLock<CachingAllocator> {
        let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
        let allocator = CachingAllocator::new(backend, 0, CachingConfig::default()).unwrap();
        Box::leak(Box::new(DeviceLock::new(allocator)))
    }

    #[test]
    fn remembers_the_newest_four_ranges() {
        let locks: Vec<_> = (0..5).map(|_| device_lock()).collect();
        for (k, &lock) in locks.iter().enumerate() {
            remember(k << 20, (k << 20) + 4096, k as DeviceType, lock);
        }
        // The first range was replaced by the fifth.
        assert!(guess(100).is_none());
        for (k, &lock) in locks.iter().enumerate().skip(1) {
            let (device_type, found) = guess((k << 20) + 100).unwrap();
            assert_eq!(device_type, k as DeviceType);
            assert!(std::ptr::eq(found, lock));
            assert!(guess((k << 20) + 4096).is_none());
        }
    }
}
