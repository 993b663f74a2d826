//! Calls back into accalloc from a backend's own callbacks (or a segment observer, which runs with
//! the device held). While a backend function runs, the device's lock may be held (raw_alloc, the event calls) or the device may be half made (the first
//! mem_get_info), so a call for the same device type from inside it would deadlock or spin. Each
//! thread remembers which device types it is inside a callback of, and such a call is answered with
//! ACCALLOC_ERROR_NOT_SUPPORTED and a message instead. Calls for other device types are fine.

use super::{DeviceType, FIRST_REGISTERED_TYPE};
use crate::error::{Error, ErrorKind, Result};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    // Plain cells, no destructor: usable from TLS destructors too.
    /// One bit per device type whose callback this thread is inside.
    static INSIDE: Cell<u32> = const { Cell::new(0) };
    /// The innermost callback's name, for the message.
    static CALL: Cell<&'static str> = const { Cell::new("") };
}

/// Marks this thread as inside `call` of `device_type`'s backend until dropped.
pub(crate) struct CallbackScope {
    previous_inside: u32,
    previous_call: &'static str,
}

impl CallbackScope {
    #[inline]
    pub(crate) fn enter(device_type: DeviceType, call: &'static str) -> Self {
        let bit = bit(device_type);
        let previous_inside = INSIDE.try_with(|c| c.replace(c.get() | bit)).unwrap_or(0);
        let previous_call = CALL.try_with(|c| c.replace(call)).unwrap_or("");
        CallbackScope {
            previous_inside,
            previous_call,
        }
    }
}

impl Drop for CallbackScope {
    #[inline]
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|c| c.set(self.previous_inside));
        let _ = CALL.try_with(|c| c.set(self.previous_call));
    }
}

fn bit(device_type: DeviceType) -> u32 {
    u32::try_from(device_type)
        .ok()
        .and_then(|t| 1u32.checked_shl(t))
        .unwrap_or(0)
}

/// Err when this thread is inside a callback of `device_type`'s backend (`name` for the message).
#[inline]
pub(crate) fn check(device_type: DeviceType, name: &str) -> Result<()> {
    if !inside(device_type) {
        return Ok(());
    }
    Err(reentered(device_type, name))
}

/// Set for good once code of someone else's may run with a host or CUDA device held: a segment
/// observer, or a private pool's own allocator.
static FOREIGN_CALLBACKS: AtomicBool = AtomicBool::new(false);

/// A segment observer or a pool allocator was added: from now on every device type's calls check
/// whether they come from inside such a callback (and the sole-device shortcut does too).
pub(crate) fn foreign_callbacks_added() {
    FOREIGN_CALLBACKS.store(true, Ordering::SeqCst);
    super::sole_device::callbacks_possible();
}

/// Whether code of someone else's may run while `device_type`'s device is held: a registered
/// backend's callbacks, or, once one was added, a segment observer or a pool allocator (of any
/// device type). Until then the host and CUDA backends never call back, and their calls skip the
/// thread-local read.
#[inline]
pub(crate) fn may_call_back(device_type: DeviceType) -> bool {
    device_type >= FIRST_REGISTERED_TYPE || FOREIGN_CALLBACKS.load(Ordering::SeqCst)
}

/// Whether this thread is inside a callback of `device_type`'s backend (never for a backend that
/// does not call back, whose calls skip the thread-local read).
#[inline]
pub(crate) fn inside(device_type: DeviceType) -> bool {
    may_call_back(device_type) && INSIDE.try_with(Cell::get).unwrap_or(0) & bit(device_type) != 0
}

#[cold]
fn reentered(device_type: DeviceType, name: &str) -> Error {
    let call = CALL.try_with(Cell::get).unwrap_or("");
    Error::new(
        ErrorKind::NotSupported,
        format!(
            "accalloc was called for device type {device_type} ({name}) from inside that backend's \
             own {call} callback: a backend's callbacks and segment observers may not call accalloc \
             for their own device type (the device is locked or being set up; the call would \
             deadlock). Calls for other device types are allowed"
        ),
    )
}
