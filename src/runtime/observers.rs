//! Observers of every device: segment observers, told of each segment event in order while the
//! device is held (the core calls them; see caching/observers.rs), and OOM observers, told of each
//! out-of-memory failure after the device is let go, before the error reaches the caller (PyTorch's
//! attachOutOfMemoryObserver and its trace trackers).
//!
//! A segment observer runs under the device's lock: a call back into accalloc for its own device
//! type would deadlock, so from the first segment observer on, such calls are refused as calls from
//! a registered backend's callbacks are (runtime/reentry.rs). Adding or removing an observer from
//! inside an observer is refused too. Once `remove` returns, the observer is not running and is
//! never called again, so its user data may be freed.

use super::{reentry, DeviceType};
use crate::caching::observers::{OomReport, SegmentEvent};
use crate::error::{Error, Result};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// Told of one segment event of a device of a device type.
pub type SegmentCallback = Arc<dyn Fn(DeviceType, &SegmentEvent) + Send + Sync>;
/// Told of one out-of-memory failure of a device of a device type.
pub type OomCallback = Arc<dyn Fn(DeviceType, &OomReport) + Send + Sync>;

struct Registry<F> {
    next_handle: u64,
    entries: Vec<(u64, F)>,
}

impl<F> Registry<F> {
    const fn new() -> Self {
        Registry {
            next_handle: 1,
            entries: Vec::new(),
        }
    }
}

static SEGMENT: RwLock<Registry<SegmentCallback>> = RwLock::new(Registry::new());
static OOM: RwLock<Registry<OomCallback>> = RwLock::new(Registry::new());
/// How many of each are registered: a device with none pays one load per event.
static SEGMENT_COUNT: AtomicUsize = AtomicUsize::new(0);
static OOM_COUNT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread is running observers (their registry is read-locked).
    static NOTIFYING: Cell<bool> = const { Cell::new(false) };
}

fn refuse_inside(what: &str) -> Result<()> {
    if NOTIFYING.try_with(Cell::get).unwrap_or(false) {
        return Err(Error::invalid_argument(format!(
            "{what} from inside an observer: observers may not add or remove observers"
        )));
    }
    Ok(())
}

fn add<F>(registry: &RwLock<Registry<F>>, count: &AtomicUsize, callback: F) -> Result<u64> {
    refuse_inside("adding an observer")?;
    let mut registry = registry.write().unwrap_or_else(|p| p.into_inner());
    let handle = registry.next_handle;
    registry.next_handle += 1;
    registry.entries.push((handle, callback));
    count.store(registry.entries.len(), Ordering::SeqCst);
    Ok(handle)
}

fn remove<F>(registry: &RwLock<Registry<F>>, count: &AtomicUsize, handle: u64) -> Result<()> {
    refuse_inside("removing an observer")?;
    // The write lock waits for every observer call under way.
    let mut registry = registry.write().unwrap_or_else(|p| p.into_inner());
    let at = registry
        .entries
        .iter()
        .position(|(h, _)| *h == handle)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "observer handle {handle} is not registered (never added, or removed already)"
            ))
        })?;
    registry.entries.remove(at);
    count.store(registry.entries.len(), Ordering::SeqCst);
    Ok(())
}

/// Tell `callback` of every segment event from now on; returns the handle to remove it with.
pub fn add_segment_observer(callback: SegmentCallback) -> Result<u64> {
    let handle = add(&SEGMENT, &SEGMENT_COUNT, callback)?;
    reentry::foreign_callbacks_added();
    Ok(handle)
}

pub fn remove_segment_observer(handle: u64) -> Result<()> {
    remove(&SEGMENT, &SEGMENT_COUNT, handle)
}

/// Tell `callback` of every out-of-memory failure from now on.
pub fn add_oom_observer(callback: OomCallback) -> Result<u64> {
    add(&OOM, &OOM_COUNT, callback)
}

pub fn remove_oom_observer(handle: u64) -> Result<()> {
    remove(&OOM, &OOM_COUNT, handle)
}

/// Marks this thread as running observers until dropped.
struct Notifying(bool);

impl Notifying {
    fn enter() -> Self {
        Notifying(NOTIFYING.try_with(|c| c.replace(true)).unwrap_or(true))
    }
}

impl Drop for Notifying {
    fn drop(&mut self) {
        let _ = NOTIFYING.try_with(|c| c.set(self.0));
    }
}

/// The core's segment observer of every device: tells the registered observers, as callbacks of
/// `device_type` (calls back for it are refused meanwhile).
pub(crate) fn segment_event(device_type: DeviceType, event: &SegmentEvent) {
    if SEGMENT_COUNT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let _notifying = Notifying::enter();
    let _scope = reentry::CallbackScope::enter(device_type, "segment observer");
    let registry = SEGMENT.read().unwrap_or_else(|p| p.into_inner());
    for (_, callback) in &registry.entries {
        // A panicking Rust observer must not unwind through the allocator holding the device.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            callback(device_type, event)
        }));
    }
}

/// Tell the OOM observers of `reports`, with no device held. An observer may call accalloc (to
/// empty the cache, say); an out-of-memory failure inside an observer is not told again.
pub(crate) fn out_of_memory(device_type: DeviceType, reports: &[OomReport]) {
    if OOM_COUNT.load(Ordering::Relaxed) == 0 || NOTIFYING.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    let _notifying = Notifying::enter();
    let registry = OOM.read().unwrap_or_else(|p| p.into_inner());
    for report in reports {
        for (_, callback) in &registry.entries {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                callback(device_type, report)
            }));
        }
    }
}
