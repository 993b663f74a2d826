//! The one-device shortcut for a backend registered from outside (this test binary is its own
//! process, and the registered backend is the only one that ever holds memory in it). Such a backend
//! may call accalloc from its own callbacks; while it is inside one, the device may be locked by the
//! very call that invoked it. The shortcut must step aside then, so that the call gets the general
//! path's clear error instead of waiting for ever on a lock its own thread holds.

use accalloc::backend::testing::TestBackend;
use accalloc::backend::{Backend, BackendError, MemInfo, StreamId};
use accalloc::capi::memory::{accalloc_free, accalloc_malloc_on};
use accalloc::capi::AccallocStatus;
use accalloc::runtime::runtime;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

/// Fake addresses (no memory is touched) far above user space.
const OFFSET: usize = 1 << 47;

static DEVICE_TYPE: OnceLock<i32> = OnceLock::new();
/// When set, the next raw_alloc calls accalloc for its own device type first.
static REENTER: AtomicBool = AtomicBool::new(false);
/// A live block the callback tries to free.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// What accalloc answered the callback: malloc, then free.
static INNER_MALLOC: AtomicI32 = AtomicI32::new(-1);
static INNER_FREE: AtomicI32 = AtomicI32::new(-1);

struct Reentrant(TestBackend);

fn malloc_on(device_type: i32, size: usize) -> (AccallocStatus, usize) {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: &mut ptr is a valid out-pointer.
    let status =
        unsafe { accalloc_malloc_on(device_type, &mut ptr, size, 0, std::ptr::null_mut()) };
    (status, ptr as usize)
}

impl Backend for Reentrant {
    fn name(&self) -> &str {
        "reentrant"
    }
    fn device_count(&self) -> usize {
        1
    }
    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError> {
        if REENTER.swap(false, Ordering::SeqCst) {
            let own = *DEVICE_TYPE.get().unwrap();
            INNER_MALLOC.store(malloc_on(own, 4096).0 as i32, Ordering::SeqCst);
            let live = LIVE.load(Ordering::SeqCst) as *mut c_void;
            // SAFETY: accalloc_free checks its pointer.
            INNER_FREE.store(unsafe { accalloc_free(live) } as i32, Ordering::SeqCst);
        }
        Ok(self.0.raw_alloc(device, size, stream)? + OFFSET)
    }
    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.0.raw_free(device, ptr - OFFSET, size)
    }
    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        self.0.mem_get_info(device)
    }
}

fn free(ptr: usize) -> AccallocStatus {
    // SAFETY: accalloc_free checks its pointer.
    unsafe { accalloc_free(ptr as *mut c_void) }
}

#[test]
fn a_callback_calling_back_gets_the_error_not_a_deadlock() {
    std::env::set_var("ACCALLOC_DEVICE", "host");
    let runtime = runtime().unwrap();
    let t = runtime
        .register(Arc::new(Reentrant(TestBackend::new(1, 1 << 30))))
        .unwrap();
    DEVICE_TYPE.set(t).unwrap();
    let accelerator = runtime.accelerator(t).unwrap();
    let allocated = || accelerator.device_stats(0).unwrap().allocated_bytes[0].current;

    // The backend's device is the only one holding memory: the shortcut is taken for it.
    for _ in 0..3 {
        let (status, ptr) = malloc_on(t, 4096);
        assert_eq!(status, AccallocStatus::ACCALLOC_OK);
        assert_eq!(free(ptr), AccallocStatus::ACCALLOC_OK);
    }
    let (_, live) = malloc_on(t, 4096);
    LIVE.store(live, Ordering::SeqCst);

    // A request for a new segment: its raw_alloc runs under the device's lock and calls back.
    REENTER.store(true, Ordering::SeqCst);
    let (done, wait) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(malloc_on(t, 64 << 20));
    });
    let (status, big) = wait
        .recv_timeout(Duration::from_secs(20))
        .expect("the callback's call into accalloc waited on its own thread's lock");
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    let not_supported = AccallocStatus::ACCALLOC_ERROR_NOT_SUPPORTED as i32;
    assert_eq!(INNER_MALLOC.load(Ordering::SeqCst), not_supported);
    assert_eq!(INNER_FREE.load(Ordering::SeqCst), not_supported);

    // The refused free changed nothing: the block is still live, and frees now.
    assert_eq!(allocated(), 4096 + (64 << 20));
    assert_eq!(free(live), AccallocStatus::ACCALLOC_OK);
    assert_eq!(free(big), AccallocStatus::ACCALLOC_OK);
    assert_eq!(allocated(), 0);
}
