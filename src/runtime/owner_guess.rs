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

/// [start, end), the device type, the device's lock address (0: nothing remembered).
type Entry = (usize, usize, DeviceType, usize);
type Recent = ([Entry; REMEMBERED], usize);

thread_local! {
    // Copy cells with no destructor, usable from TLS destructors and atexit handlers too.
    static RECENT: Cell<Recent> = const { Cell::new(([(0, 0, 0, 0); REMEMBERED], 0)) };
}

/// The device type and lock of a segment this thread found lately, if `ptr` lies in one.
#[inline]
pub fn guess(ptr: usize) -> Option<(DeviceType, &'static DeviceLock<CachingAllocator>)> {
    let (_, _, device_type, lock) = RECENT
        .try_with(|recent| {
            let (entries, _) = recent.get();
            entries
                .into_iter()
                .find(|&(start, end, _, _)| start <= ptr && ptr < end)
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
        let (mut entries, next) = recent.get();
        entries[next] = (start, end, device_type, lock);
        recent.set((entries, (next + 1) % REMEMBERED));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testing::TestBackend;
    use crate::caching::CachingConfig;
    use std::sync::Arc;

    fn device_lock() -> &'static DeviceLock<CachingAllocator> {
        let backend = Arc::new(TestBackend::new(1, 1 << 30));
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
