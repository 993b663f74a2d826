//! release_lock_on_malloc: while one thread waits on a slow device allocation, others keep
//! allocating from the cache of the same device.

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::backend::{Backend, BackendError, StreamId};
use accalloc::caching::settings::parse_settings;
use accalloc::caching::CachingConfig;
use accalloc::runtime::ownership::SegmentIndex;
use accalloc::runtime::Accelerator;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A backend whose raw allocations of `slow_size` bytes, after the first `gate_after` of them, wait
/// until the test opens the gate.
struct GatedBackend {
    inner: SimulatedBackend,
    slow_size: usize,
    gate_after: usize,
    calls: AtomicUsize,
    open: Mutex<bool>,
    opened: Condvar,
    entered: Mutex<Option<mpsc::Sender<()>>>,
}

/// The SimulatedBackend in all but its name and the gate.
impl accalloc::backend::Wrapper for GatedBackend {
    fn inner(&self) -> &dyn Backend {
        &self.inner
    }
    fn name(&self) -> &str {
        "gated"
    }
    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError> {
        if size == self.slow_size && self.calls.fetch_add(1, Ordering::SeqCst) >= self.gate_after {
            if let Some(entered) = self.entered.lock().unwrap().take() {
                entered.send(()).unwrap();
            }
            let open = self.open.lock().unwrap();
            drop(self.opened.wait_while(open, |open| !*open).unwrap());
        }
        self.inner.raw_alloc(device, size, stream)
    }
}

/// An accelerator with `settings` over a gated backend of `capacity` bytes whose allocations of
/// `slow_size` wait, after the first `gate_after`; and the channel that says one is waiting.
fn gated_accelerator(
    capacity: usize,
    slow_size: usize,
    gate_after: usize,
    settings: &str,
) -> (Arc<GatedBackend>, mpsc::Receiver<()>, Arc<Accelerator>) {
    let (entered_tx, entered_rx) = mpsc::channel();
    let backend = Arc::new(GatedBackend {
        inner: SimulatedBackend::new(1, capacity),
        slow_size,
        gate_after,
        calls: AtomicUsize::new(0),
        open: Mutex::new(false),
        opened: Condvar::new(),
        entered: Mutex::new(Some(entered_tx)),
    });
    let config = parse_settings(settings, &CachingConfig::default()).unwrap();
    let accelerator = Arc::new(Accelerator::new(
        7,
        backend.clone(),
        Arc::new(SegmentIndex::default()),
        config,
    ));
    (backend, entered_rx, accelerator)
}

impl GatedBackend {
    /// Let the waiting allocations go on.
    fn open_gate(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

#[test]
fn cached_allocations_proceed_while_a_device_allocation_waits() {
    let (backend, entered_rx, accelerator) =
        gated_accelerator(1 << 30, 64 << 20, 0, "release_lock_on_malloc:True");
    // Warm the small pool so the other thread's requests are cache hits.
    let warm = accelerator.malloc(0, 1000, 0).unwrap();
    accelerator.lock(0).unwrap().free(warm).unwrap();

    let slow = {
        let accelerator = accelerator.clone();
        std::thread::spawn(move || accelerator.malloc(0, 64 << 20, 0))
    };
    entered_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the slow allocation started");

    // The device lock is free: a cached malloc/free completes while the backend call waits.
    let (done_tx, done_rx) = mpsc::channel();
    {
        let accelerator = accelerator.clone();
        std::thread::spawn(move || {
            let p = accelerator.malloc(0, 1000, 0).unwrap();
            accelerator.lock(0).unwrap().free(p).unwrap();
            done_tx.send(p).unwrap();
        });
    }
    let reused = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a cached malloc had to wait for the device allocation");
    assert_eq!(reused, warm);

    backend.open_gate();
    let big = slow.join().unwrap().unwrap();
    let stats = accelerator.lock(0).unwrap().stats();
    assert_eq!(stats.num_device_alloc, 2);
    assert_eq!(stats.reserved_bytes[0].current, (2 << 20) + (64 << 20));
    assert_eq!(stats.allocated_bytes[0].current, 64 << 20);
    accelerator.lock(0).unwrap().free(big).unwrap();
}

#[test]
fn the_memory_fraction_holds_while_segments_are_asked_for_without_the_lock() {
    let (backend, entered_rx, accelerator) = gated_accelerator(
        64 << 20,
        20 << 20,
        0,
        "release_lock_on_malloc:True,per_process_memory_fraction:0.5",
    );
    // 32 MiB allowed. One thread waits in the backend for a 20 MiB segment, without the lock...
    let slow = {
        let accelerator = accelerator.clone();
        std::thread::spawn(move || accelerator.malloc(0, 20 << 20, 0))
    };
    entered_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the slow allocation started");
    // ...so another 22 MiB would take reserved memory to 42 MiB: refused without asking the device.
    let error = accelerator.malloc(0, 22 << 20, 0).unwrap_err();
    assert_eq!(error.kind, accalloc::error::ErrorKind::OutOfMemory);
    assert!(
        error.message.contains("32.00 MiB allowed"),
        "{}",
        error.message
    );
    backend.open_gate();
    let first = slow.join().unwrap().unwrap();
    let stats = accelerator.lock(0).unwrap().stats();
    assert_eq!(stats.reserved_bytes[0].current, 20 << 20);
    assert_eq!(stats.num_device_alloc, 1);
    // With the first segment held, 10 MiB more still fit.
    let second = accelerator.malloc(0, 10 << 20, 0).unwrap();
    accelerator.lock(0).unwrap().free(second).unwrap();
    accelerator.lock(0).unwrap().free(first).unwrap();
}

#[test]
fn the_retry_after_releasing_the_cache_asks_for_its_segment_without_the_lock_too() {
    // A 64 MiB device, 40 MiB of it a cached segment: a 48 MiB request's first try is refused, the
    // cache is released (PyTorch's last resort, counted as a retry), and the second try waits in
    // the backend. PyTorch asks for each try without its lock; so does accalloc.
    let (backend, entered_rx, accelerator) =
        gated_accelerator(64 << 20, 48 << 20, 1, "release_lock_on_malloc:True");
    // A small block stays live (its segment is not released), and 40 MiB are cached.
    let held = accelerator.malloc(0, 1000, 0).unwrap();
    let cached = accelerator.malloc(0, 40 << 20, 0).unwrap();
    accelerator.lock(0).unwrap().free(cached).unwrap();

    let slow = {
        let accelerator = accelerator.clone();
        std::thread::spawn(move || accelerator.malloc(0, 48 << 20, 0))
    };
    entered_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the retry reached the backend");
    // The device lock is free while the retry waits: a free and a cached malloc complete.
    let (done_tx, done_rx) = mpsc::channel();
    {
        let accelerator = accelerator.clone();
        std::thread::spawn(move || {
            accelerator.lock(0).unwrap().free(held).unwrap();
            done_tx
                .send(accelerator.malloc(0, 1000, 0).unwrap())
                .unwrap();
        });
    }
    let reused = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a cached malloc had to wait for the retry's device allocation");
    assert_eq!(reused, held);

    backend.open_gate();
    let big = slow.join().unwrap().unwrap();
    assert_eq!(
        backend.calls.load(Ordering::SeqCst),
        2,
        "the first try, then the retry"
    );
    let stats = accelerator.lock(0).unwrap().stats();
    // Segments: the small pool's 2 MiB, the 40 MiB one (released for the retry), the 48 MiB one.
    assert_eq!((stats.num_device_alloc, stats.num_device_free), (3, 1));
    assert_eq!((stats.num_alloc_retries, stats.num_ooms), (1, 0));
    assert_eq!(stats.reserved_bytes[0].current, (2 << 20) + (48 << 20));
    assert_eq!(stats.allocated_bytes[0].current, (48 << 20) + 1024);
    let mut device = accelerator.lock(0).unwrap();
    device.free(big).unwrap();
    device.free(reused).unwrap();
}
