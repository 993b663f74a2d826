//! Observers from C: a segment observer sees every segment come and go (to register memory with
//! NCCL, RDMA or another network library), an OOM observer every out-of-memory failure (PyTorch's
//! attachOutOfMemoryObserver). They are process-wide: each call says which device type and device.

use super::guard::{guard, out_ptr};
use super::pools::AccallocPoolId;
use super::types::{AccallocDeviceType, AccallocStatus};
use crate::caching::observers::{SegmentAction, SegmentEvent};
use crate::error::{Error, Result};
use crate::runtime::observers;
use std::ffi::c_void;
use std::sync::Arc;

/// What happened to a segment.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccallocSegmentAction {
    /// A new segment came from the device: register it.
    ACCALLOC_SEGMENT_ALLOC = 0,
    /// The segment is about to go back to the device: deregister it.
    ACCALLOC_SEGMENT_FREE = 1,
    /// Pages of an expandable segment were mapped: register them.
    ACCALLOC_SEGMENT_MAP = 2,
    /// Pages of an expandable segment are about to be unmapped: deregister them.
    ACCALLOC_SEGMENT_UNMAP = 3,
}

/// One segment event.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AccallocSegmentEvent {
    pub action: AccallocSegmentAction,
    pub device_type: AccallocDeviceType,
    pub device: i32,
    /// The pool the memory belongs to ({0, 0}: the default pools).
    pub pool: AccallocPoolId,
    /// The whole segment (alloc, free) or the pages mapped or unmapped.
    pub address: *mut c_void,
    pub size: usize,
    /// The stream the segment serves (NULL: the default stream).
    pub stream: *mut c_void,
}

/// Told of every segment event, in order, while accalloc holds the event's device: it may not call
/// accalloc for that device type (such calls fail with ACCALLOC_ERROR_NOT_SUPPORTED), nor add or
/// remove observers. A free or unmap is told before the memory goes; if the device then refuses to
/// give it back, the memory stays and is told again as an alloc or map. May run on any thread.
pub type AccallocSegmentObserver =
    Option<unsafe extern "C" fn(event: *const AccallocSegmentEvent, user_data: *mut c_void)>;

/// Told of every out-of-memory failure of a device after accalloc let the device go and before the
/// failing call returns, with PyTorch's figures: the segment size that could not be had, the memory
/// fraction's limit where one is set (else the device's total memory), and the device's free memory.
/// It may call accalloc (accalloc_empty_cache, say); a failure inside it is not told again.
pub type AccallocOomObserver = Option<
    unsafe extern "C" fn(
        device_type: AccallocDeviceType,
        device: i64,
        alloc_size: usize,
        limit_or_total: usize,
        device_free: usize,
        user_data: *mut c_void,
    ),
>;

/// The caller's user data, passed back as given: the caller promises it may be used from any thread.
#[derive(Clone, Copy)]
struct UserData(*mut c_void);
// SAFETY: accalloc only hands the pointer back to the caller's own observer.
unsafe impl Send for UserData {}
unsafe impl Sync for UserData {}

fn action_of(action: SegmentAction) -> AccallocSegmentAction {
    match action {
        SegmentAction::Alloc => AccallocSegmentAction::ACCALLOC_SEGMENT_ALLOC,
        SegmentAction::Free => AccallocSegmentAction::ACCALLOC_SEGMENT_FREE,
        SegmentAction::Map => AccallocSegmentAction::ACCALLOC_SEGMENT_MAP,
        SegmentAction::Unmap => AccallocSegmentAction::ACCALLOC_SEGMENT_UNMAP,
    }
}

fn required<T>(observer: Option<T>) -> Result<T> {
    observer.ok_or_else(|| Error::invalid_argument("observer is NULL"))
}

/// Call `observer` with `user_data` for every segment event of every device from now on, and store
/// the handle that removes it in `*handle`. Observers are called in the order they were added.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (observer or handle is NULL; called from inside an
/// observer).
#[no_mangle]
pub unsafe extern "C" fn accalloc_segment_observer_add(
    observer: AccallocSegmentObserver,
    user_data: *mut c_void,
    handle: *mut u64,
) -> AccallocStatus {
    guard(|| {
        let handle = out_ptr(handle, "handle")?;
        let observer = required(observer)?;
        let user_data = UserData(user_data);
        *handle =
            observers::add_segment_observer(Arc::new(move |device_type, event: &SegmentEvent| {
                let event = AccallocSegmentEvent {
                    action: action_of(event.action),
                    device_type,
                    device: event.device as i32,
                    pool: AccallocPoolId {
                        first: event.pool.0,
                        second: event.pool.1,
                    },
                    address: event.address as *mut c_void,
                    size: event.size,
                    stream: event.stream as *mut c_void,
                };
                let user_data = user_data;
                // SAFETY: the caller gave a function of this type; the event lives for the call.
                unsafe { observer(&event, user_data.0) }
            }))?;
        Ok(())
    })
}

/// Stop calling the segment observer of `handle`. When this returns the observer is not running
/// on any thread and is never called again, so its user data may be freed.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (no such handle; called from inside an observer).
#[no_mangle]
pub extern "C" fn accalloc_segment_observer_remove(handle: u64) -> AccallocStatus {
    guard(|| observers::remove_segment_observer(handle))
}

/// Call `observer` with `user_data` after every out-of-memory failure of every device from now on,
/// and store the handle that removes it in `*handle`.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (observer or handle is NULL; called from inside an
/// observer).
#[no_mangle]
pub unsafe extern "C" fn accalloc_oom_observer_add(
    observer: AccallocOomObserver,
    user_data: *mut c_void,
    handle: *mut u64,
) -> AccallocStatus {
    guard(|| {
        let handle = out_ptr(handle, "handle")?;
        let observer = required(observer)?;
        let user_data = UserData(user_data);
        *handle = observers::add_oom_observer(Arc::new(move |device_type, report| {
            let user_data = user_data;
            // SAFETY: the caller gave a function of this type.
            unsafe {
                observer(
                    device_type,
                    report.device as i64,
                    report.alloc_size,
                    report.limit_or_total,
                    report.device_free,
                    user_data.0,
                )
            }
        }))?;
        Ok(())
    })
}

/// Stop calling the OOM observer of `handle`; as accalloc_segment_observer_remove.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (no such handle; called from inside an observer).
#[no_mangle]
pub extern "C" fn accalloc_oom_observer_remove(handle: u64) -> AccallocStatus {
    guard(|| observers::remove_oom_observer(handle))
}
