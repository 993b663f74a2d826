//! The one-device shortcut. While every segment accalloc holds belongs to one device (one GPU, one
//! host device, one device of a registered backend), every pointer it hands out is that device's,
//! and calls naming that device (or the current device, when its accelerator has no other) go to
//! it. Calls then reach its allocator from one address in a static, instead of walking the runtime's
//! accelerator table, the accelerator and its device table: each of those steps is a load that
//! waits for the one before, and a cached malloc or free is short enough for that chain to be a
//! fifth of it.
//!
//! The address is taken once the process is in that state (`try_take_sole_device`, from the general
//! path) and given up for good when a segment of a second device is recorded (`give_up`, called by
//! the segment index before that segment can hold a block). A backend registered from C may call
//! back into accalloc from its callbacks, which the general path refuses (runtime/reentry.rs): for
//! such a device (and for every device once a segment observer exists) the shortcut steps aside
//! while this thread is inside one of its callbacks.

use super::device_lock::DeviceLock;
use super::ownership::Owners;
use super::{reentry, DeviceType, Runtime};
use crate::caching::CachingAllocator;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Not taken yet.
const UNSET: usize = 0;
/// Given up for good.
const NEVER: usize = 1;

/// Set in SOLE beside the address when the device's backend may call back (a registered one), so
/// that a free learns it from the word it loads anyway. Device locks are 128-byte aligned.
const CALLS_BACK: usize = 2;
const ADDRESS_MASK: usize = !127;
const _: () = assert!(std::mem::align_of::<DeviceLock<CachingAllocator>>() >= 128);

/// The device's lock, as an address with CALLS_BACK (or UNSET, NEVER).
static SOLE: AtomicUsize = AtomicUsize::new(UNSET);
/// Which device it is: written before SOLE publishes the address, never changed after.
static IDENTITY: AtomicU64 = AtomicU64::new(0);

/// The sole device and who it is.
#[derive(Clone, Copy)]
pub(super) struct Sole {
    pub lock: &'static DeviceLock<CachingAllocator>,
    pub device_type: DeviceType,
    pub index: usize,
    /// Its accelerator has no other device (so device -1 always means this one).
    pub only_device: bool,
    /// Its backend may call back (a registered one).
    calls_back: bool,
}

impl Sole {
    /// Whether a call for `device` (-1: the thread's current device) of `device_type` is this
    /// device's.
    #[inline(always)]
    pub fn serves(&self, device_type: DeviceType, device: i32) -> bool {
        device_type == self.device_type
            && ((device == -1 && self.only_device) || device as usize == self.index)
            && !self.reentered()
    }

    /// Whether this thread is inside one of the device's callbacks (a registered backend's, or a
    /// segment observer): the general path answers then, with the error that says so.
    #[inline(always)]
    pub fn reentered(&self) -> bool {
        self.calls_back && inside_callback(self.device_type)
    }
}

/// The sole device, while there is one.
#[inline(always)]
pub(super) fn sole() -> Option<Sole> {
    let word = SOLE.load(Ordering::Acquire);
    if word <= NEVER {
        return None;
    }
    let identity = IDENTITY.load(Ordering::Relaxed);
    Some(Sole {
        lock: lock_of(word),
        device_type: (identity & 0xff) as DeviceType,
        only_device: identity & 0x100 != 0,
        index: (identity >> 16) as usize,
        calls_back: word & CALLS_BACK != 0,
    })
}

/// reentry::inside, out of line: only calls for a device that may call back get here.
#[cold]
#[inline(never)]
fn inside_callback(device_type: DeviceType) -> bool {
    reentry::inside(device_type)
}

/// The sole device's lock for a free (any pointer is its), unless this thread is inside one of
/// its backend's callbacks.
#[inline(always)]
pub(super) fn sole_for_free() -> Option<&'static DeviceLock<CachingAllocator>> {
    sole()
        .filter(|sole| !sole.reentered())
        .map(|sole| sole.lock)
}

#[inline(always)]
fn lock_of(word: usize) -> &'static DeviceLock<CachingAllocator> {
    // SAFETY: a value past NEVER holds the address of a device lock that lives as long as the
    // process (accelerators are leaked and their devices never removed).
    unsafe { &*((word & ADDRESS_MASK) as *const DeviceLock<CachingAllocator>) }
}

/// Whether calls take the shortcut now.
#[cfg(feature = "bench-internals")]
pub fn taken() -> bool {
    SOLE.load(Ordering::Acquire) > NEVER
}

/// How many times give_up has run (suspended tells its own NEVER from a real one by it).
static GIVE_UPS: AtomicUsize = AtomicUsize::new(0);

/// A segment of another device is about to be used: from now on every call takes the general path.
pub(super) fn give_up() {
    GIVE_UPS.fetch_add(1, Ordering::SeqCst);
    SOLE.store(NEVER, Ordering::SeqCst);
}

/// Run `f` with every call on the general path, then take the shortcut back if it was taken
/// before and nothing gave it up meanwhile. For the benchmark, which times the two paths in turns
/// over the same device; while `f` runs no other thread may count on the shortcut being there.
#[cfg(feature = "bench-internals")]
pub fn suspended<T>(f: impl FnOnce() -> T) -> T {
    let before = GIVE_UPS.load(Ordering::SeqCst);
    let word = SOLE.swap(NEVER, Ordering::SeqCst);
    let result = f();
    if word > NEVER && GIVE_UPS.load(Ordering::SeqCst) == before {
        let _ = SOLE.compare_exchange(NEVER, word, Ordering::SeqCst, Ordering::Relaxed);
    }
    result
}

impl Runtime {
    /// Take the shortcut when every segment recorded so far was one device's. Racing a segment of
    /// another device is safe: the index gives up first, and the exchange here only succeeds from
    /// UNSET.
    #[inline(always)]
    pub(super) fn try_take_sole_device(&self) {
        // Inline, so that a process that gave the shortcut up pays one load on its general path.
        if SOLE.load(Ordering::Relaxed) == UNSET {
            self.take_sole_device();
        }
    }

    #[cold]
    #[inline(never)]
    fn take_sole_device(&self) {
        let (device_type, index) = match self.index.owners() {
            Owners::None => return,
            Owners::One(owner) => owner,
            Owners::Several => return give_up(),
        };
        let Ok(accelerator) = self.lookup(device_type) else {
            return;
        };
        let Some(lock) = accelerator.created_device(index) else {
            return;
        };
        let only_device = accelerator.device_count() == 1;
        // Every thread that takes it writes the same identity (the sole owner never changes).
        IDENTITY.store(
            device_type as u64 | (only_device as u64) << 8 | (index as u64) << 16,
            Ordering::Relaxed,
        );
        let address = lock as *const DeviceLock<CachingAllocator> as usize;
        let calls_back = if reentry::may_call_back(device_type) {
            CALLS_BACK
        } else {
            0
        };
        let _ = SOLE.compare_exchange(
            UNSET,
            address | calls_back,
            Ordering::SeqCst,
            Ordering::Relaxed,
        );
        // A segment observer added meanwhile may have found SOLE unset: mark it here instead.
        if reentry::may_call_back(device_type) {
            callbacks_possible();
        }
    }
}

/// Someone else's code may now run while the sole device is held (a segment observer was added):
/// its calls must check for reentry, so the shortcut marks the device as calling back.
pub(super) fn callbacks_possible() {
    let _ = SOLE.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
        (word > NEVER && word & CALLS_BACK == 0).then_some(word | CALLS_BACK)
    });
}
