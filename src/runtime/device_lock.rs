//! The lock around one device's caching allocator.
//!
//! A cached malloc or free holds it for some tens of nanoseconds, so the price of taking and
//! dropping it matters: std's Mutex pays two atomic read-modify-writes (a compare-exchange to lock,
//! a swap to unlock, to learn whether to wake a sleeper), about 17 ns on the machines we measure on,
//! more than glibc's whole malloc+free pair. This lock unlocks with a plain release store and wakes
//! nobody: a waiter looks a few times, then sleeps in short, growing naps (see `SPINS`). A waiter
//! that arrives while another thread's call is under way gets the lock at its first looks; one that
//! keeps finding it taken, because its holder allocates in a loop or asks the device for a segment
//! (PyTorch holds the lock through cudaMalloc too), naps, at most `MAX_NAP` at a time, and the holder
//! runs on alone meanwhile.
//!
//! A panic while the lock is held poisons it, as std's Mutex does: later lockers get an error.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The longest a waiter sleeps before looking again.
const MAX_NAP: Duration = Duration::from_micros(100);
/// Looks (with the CPU's pause hint between them) before a waiter starts napping. Few on purpose: a
/// lock held for a cached malloc is free again within a look or two, but when its holder takes it
/// again at once (a thread allocating in a loop), a waiter that keeps looking catches it in the
/// short gaps between the holder's calls, and the two take it in turns: every hand-off moves the
/// allocator's cache lines between cores and costs more than the call. A waiter that naps lets the
/// holder run on alone, and takes the lock in the gap after its nap. Two threads on one device, a
/// C loop with some work outside the lock (ns a pair over both threads, against one thread's 44):
/// 20 looks then 20 yields, 96; 4 looks, no yields, 48 (yields return at once on an idle core, so
/// they are looks too).
const SPINS: u32 = 4;

/// A value only one thread at a time may use.
#[repr(C)]
pub struct DeviceLock<T> {
    // The flags first, on a line (and its prefetch pair) of their own: waiters spin reading them, and
    // if they shared a line with the value the holder writes, every spin would take it away from the
    // holder (seen: four threads on one device 4x slower when the flags sat after the value).
    flags: LockFlags,
    value: UnsafeCell<T>,
}

#[repr(align(128))]
struct LockFlags {
    locked: AtomicBool,
    poisoned: AtomicBool,
}

// SAFETY: the value is reached only through a guard, and one guard exists at a time (the locked
// flag is taken with acquire ordering and given back with release ordering).
unsafe impl<T: Send> Send for DeviceLock<T> {}
// SAFETY: as above: sharing the lock hands the value to one thread at a time.
unsafe impl<T: Send> Sync for DeviceLock<T> {}

/// Why `lock` failed: a thread panicked while it held the lock.
#[derive(Debug)]
pub struct Poisoned;

impl<T> DeviceLock<T> {
    pub fn new(value: T) -> Self {
        DeviceLock {
            flags: LockFlags {
                locked: AtomicBool::new(false),
                poisoned: AtomicBool::new(false),
            },
            value: UnsafeCell::new(value),
        }
    }

    /// Wait for the value; an error (with the lock given back) if a holder panicked.
    #[inline(always)]
    pub fn lock(&self) -> Result<DeviceGuard<'_, T>, Poisoned> {
        if self
            .flags
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        let guard = DeviceGuard {
            lock: self,
            panicking: std::thread::panicking(),
        };
        if self.flags.poisoned.load(Ordering::Relaxed) {
            return Err(Poisoned); // the guard's drop unlocks
        }
        Ok(guard)
    }

    #[cold]
    fn lock_contended(&self) {
        let mut attempt: u32 = 0;
        let mut nap = Duration::from_micros(1);
        loop {
            // Look before trying, so that waiters do not fight over the cache line.
            if !self.flags.locked.load(Ordering::Relaxed)
                && self
                    .flags
                    .locked
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            attempt += 1;
            if attempt < SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(MAX_NAP);
            }
        }
    }
}

/// The holder's access to the value; dropping it unlocks.
pub struct DeviceGuard<'a, T> {
    lock: &'a DeviceLock<T>,
    /// Whether this thread was already panicking when it locked (then its panic is not ours).
    panicking: bool,
}

impl<T> std::ops::Deref for DeviceGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard is the only one (see DeviceLock's Sync).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> std::ops::DerefMut for DeviceGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard is the only one (see DeviceLock's Sync).
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for DeviceGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if !self.panicking && std::thread::panicking() {
            self.lock.flags.poisoned.store(true, Ordering::Relaxed);
        }
        self.lock.flags.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_take_turns() {
        let lock = DeviceLock::new(0u64);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..10_000 {
                        *lock.lock().unwrap() += 1;
                    }
                });
            }
        });
        assert_eq!(*lock.lock().unwrap(), 40_000);
    }

    #[test]
    fn a_panic_while_held_poisons() {
        let lock = DeviceLock::new(1);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _guard = lock.lock().unwrap();
            panic!("while held");
        }));
        assert!(result.is_err());
        assert!(lock.lock().is_err());
        // The failed lock gave it back: the next attempt does not wait forever.
        assert!(lock.lock().is_err());
    }
}
