//! The one-device shortcut for a backend registered from outside (this test binary is its own
//! process, and the registered backend is the only one that ever holds memory in it). Such a backend
//! may call accalloc from its own callbacks; while it is inside one, the device may be locked by the
//! very call that invoked it. The shortcut must step aside then, so that the call gets the general
//! path's clear error instead of waiting for ever on a lock its own thread holds.

mod common;

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::capi::AccallocStatus;
use accalloc::runtime::runtime;
use common::{free, try_malloc, FarBackend};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

static DEVICE_TYPE: OnceLock<i32> = OnceLock::new();
/// When set, the next raw_alloc calls accalloc for its own device type first.
static REENTER: AtomicBool = AtomicBool::new(false);
/// A live block the callback tries to free.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// What accalloc answered the callback: malloc, then free.
static INNER_MALLOC: AtomicI32 = AtomicI32::new(-1);
static INNER_FREE: AtomicI32 = AtomicI32::new(-1);

/// The backend's hook before each raw_alloc: when asked, call accalloc for its own device type.
fn call_back() {
    if REENTER.swap(false, Ordering::SeqCst) {
        let own = *DEVICE_TYPE.get().unwrap();
        INNER_MALLOC.store(try_malloc(Some(own), 0, 4096).0 as i32, Ordering::SeqCst);
        INNER_FREE.store(free(LIVE.load(Ordering::SeqCst)) as i32, Ordering::SeqCst);
    }
}

#[test]
fn a_callback_calling_back_gets_the_error_not_a_deadlock() {
    std::env::set_var("ACCALLOC_DEVICE", "host");
    let runtime = runtime().unwrap();
    let t = runtime
        .register(Arc::new(FarBackend {
            name: "reentrant",
            inner: SimulatedBackend::new(1, 1 << 30),
            before_alloc: call_back,
        }))
        .unwrap();
    DEVICE_TYPE.set(t).unwrap();
    let accelerator = runtime.accelerator(t).unwrap();
    let allocated = || accelerator.device_stats(0).unwrap().allocated_bytes[0].current;

    // The backend's device is the only one holding memory: the shortcut is taken for it.
    for _ in 0..3 {
        let (status, ptr) = try_malloc(Some(t), 0, 4096);
        assert_eq!(status, AccallocStatus::ACCALLOC_OK);
        assert_eq!(free(ptr), AccallocStatus::ACCALLOC_OK);
    }
    let (_, live) = try_malloc(Some(t), 0, 4096);
    LIVE.store(live, Ordering::SeqCst);

    // A request for a new segment: its raw_alloc runs under the device's lock and calls back.
    REENTER.store(true, Ordering::SeqCst);
    let (done, wait) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(try_malloc(Some(t), 0, 64 << 20));
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
