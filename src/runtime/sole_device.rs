//! The one-device shortcut. While the host's device 0 is the only device of the process (no CUDA,
//! no registered backend, one host device) every pointer accalloc hands out is its, and every call
//! without a device goes to it. Calls then reach its allocator from one address kept in the runtime,
//! instead of walking the runtime's accelerator table, the accelerator and its device table: each
//! of those steps is a load that waits for the one before, and a cached malloc or free is short
//! enough for that chain to be a fifth of it.
//!
//! The address is taken once the process is in that state (`try_take_sole_device`, from the general
//! path) and given up for good when a backend is registered (`give_up_sole_device`, before the new
//! accelerator can hand out anything). CUDA is installed before the runtime is published, so the
//! shortcut is never taken beside it; only an installed accelerator can be made current.

use super::device_lock::DeviceLock;
use super::{Runtime, DEVICE_TYPE_HOST};
use crate::caching::CachingAllocator;
use std::sync::atomic::Ordering;

/// Not taken yet.
pub(super) const UNSET: usize = 0;
/// Given up for good.
const NEVER: usize = 1;

impl Runtime {
    /// The host's only device, when the process has no other.
    #[inline(always)]
    pub(super) fn sole_device(&self) -> Option<&'static DeviceLock<CachingAllocator>> {
        let address = self.sole_device.load(Ordering::Acquire);
        // SAFETY: a value past NEVER is the address of a device lock that lives as long as the
        // process (accelerators are leaked and their devices never removed).
        (address > NEVER).then(|| unsafe { &*(address as *const DeviceLock<CachingAllocator>) })
    }

    /// Take the shortcut when the process has come to that state: the host current, no other
    /// accelerator, one host device and in use. Racing a registration is safe: that stores NEVER
    /// first, and the exchange here only succeeds from UNSET.
    #[cold]
    #[inline(never)]
    pub(super) fn try_take_sole_device(&self) {
        if self.sole_device.load(Ordering::Relaxed) != UNSET
            || self.current.load(Ordering::Acquire) != DEVICE_TYPE_HOST
            || self.accelerators[DEVICE_TYPE_HOST as usize + 1..]
                .iter()
                .any(|once| once.is_completed())
        {
            return;
        }
        let Ok(host) = self.lookup(DEVICE_TYPE_HOST) else {
            return;
        };
        if let Some(lock) = host.created_device(0).filter(|_| host.device_count() == 1) {
            let address = lock as *const DeviceLock<CachingAllocator> as usize;
            let _ = self.sole_device.compare_exchange(
                UNSET,
                address,
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
        }
    }

    /// Another accelerator is coming: from now on every call takes the general path.
    pub(super) fn give_up_sole_device(&self) {
        self.sole_device.store(NEVER, Ordering::SeqCst);
    }
}
