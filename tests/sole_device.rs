//! The one-device shortcut (Runtime::sole_device): while the host's single device is the only one of
//! the process, malloc and free reach its allocator directly. These checks run in their own process
//! (this test binary) so that the shortcut is taken first and then has to be given up: errors must
//! read as on the general path, and once another accelerator exists, its pointers and the calls made
//! current on it must go to it, never to the host.

mod common;

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::capi::device::accalloc_set_accelerator;
use accalloc::capi::AccallocStatus;
use accalloc::runtime::{runtime, DEVICE_TYPE_HOST};
use common::{free, last_error, malloc, FarBackend, FAR};
use std::sync::Arc;

/// A free that fails: its status and message.
fn free_error(ptr: usize) -> (AccallocStatus, String) {
    (free(ptr), last_error())
}

fn allocated(device_type: i32) -> i64 {
    let accelerator = runtime().unwrap().accelerator(device_type).unwrap();
    accelerator.device_stats(0).unwrap().allocated_bytes[0].current
}

#[test]
fn the_one_device_shortcut_answers_as_the_general_path_and_gives_way() {
    // The shortcut needs the host as the only accelerator, with one device, whatever the machine or
    // the shell says: this binary's one test fixes that before the runtime first reads it.
    std::env::set_var("ACCALLOC_DEVICE", "host");
    std::env::remove_var("ACCALLOC_HOST_DEVICES");
    assert_eq!(runtime().unwrap().current().device_type(), DEVICE_TYPE_HOST);
    assert_eq!(runtime().unwrap().current().device_count(), 1);
    // Warm: the first calls make the host's device and take the shortcut.
    for size in [512, 4096, 1 << 20, 16 << 20] {
        let ptr = malloc(None, -1, size);
        assert_eq!(free(ptr), AccallocStatus::ACCALLOC_OK);
    }
    let live = malloc(None, -1, 4096);
    assert_eq!(allocated(DEVICE_TYPE_HOST), 4096);

    // Errors on the shortcut read as on the general path.
    let (status, message) = free_error(live + 512);
    assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
    assert!(message.contains("not the start of a block"), "{message}");
    let stack = 0u64;
    let (status, message) = free_error(&stack as *const u64 as usize);
    assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
    assert!(
        message.contains("was not allocated by accalloc"),
        "{message}"
    );
    // A live pointer, freed once; then the same pointer again.
    assert_eq!(free(live), AccallocStatus::ACCALLOC_OK);
    let (status, message) = free_error(live);
    assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
    assert!(message.contains("already freed"), "{message}");
    assert_eq!(allocated(DEVICE_TYPE_HOST), 0);

    // Another accelerator appears while two threads keep the host busy through the shortcut: its
    // pointers are freed by it, not refused by the host, and the host's books stay exact.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let other = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut pairs = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) || pairs < 10_000 {
                        let ptr = malloc(None, -1, [512, 4096, 1 << 20][pairs as usize % 3]);
                        assert_eq!(free(ptr), AccallocStatus::ACCALLOC_OK);
                        pairs += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let other = runtime()
            .unwrap()
            .register(Arc::new(FarBackend {
                name: "distant",
                inner: SimulatedBackend::new(1, 64 << 20),
                before_alloc: || {},
            }))
            .unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for worker in workers {
            worker.join().unwrap();
        }
        other
    });
    assert_eq!(allocated(DEVICE_TYPE_HOST), 0);
    let foreign = malloc(Some(other), 0, 8192);
    assert!(foreign >= FAR);
    assert_eq!(allocated(other), 8192);
    assert_eq!(free(foreign), AccallocStatus::ACCALLOC_OK);
    assert_eq!(allocated(other), 0);

    // Made current, it serves calls without a device type.
    assert_eq!(accalloc_set_accelerator(other), AccallocStatus::ACCALLOC_OK);
    let on_other = malloc(None, -1, 4096);
    assert!(on_other >= FAR);
    assert_eq!((allocated(other), allocated(DEVICE_TYPE_HOST)), (4096, 0));
    assert_eq!(free(on_other), AccallocStatus::ACCALLOC_OK);

    // And back on the host, everything still adds up.
    assert_eq!(
        accalloc_set_accelerator(DEVICE_TYPE_HOST),
        AccallocStatus::ACCALLOC_OK
    );
    let on_host = malloc(None, -1, 4096);
    assert_eq!((allocated(other), allocated(DEVICE_TYPE_HOST)), (0, 4096));
    assert_eq!(free(on_host), AccallocStatus::ACCALLOC_OK);
    assert_eq!(allocated(DEVICE_TYPE_HOST), 0);
}
