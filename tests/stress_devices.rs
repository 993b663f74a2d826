//! Stress: 20 threads allocate and free sizes up to 64 MiB on 1, then 2, 3 and 4 host devices of
//! 1 GiB each, freeing each other's blocks, retrying out-of-memory after empty_cache, and changing
//! settings (expandable segments on and off among them) as they go. The operating system hands a
//! segment's addresses, once given back, to whichever device maps next: no malloc may fail but for
//! out of memory, and at the end every device's books are back to zero.
//!
//! ACCALLOC_STRESS_SECONDS (default 24) is the whole run's length, split evenly between the phases.
//! This binary is its own process (ACCALLOC_HOST_DEVICES is read when the runtime starts).

mod common;

use accalloc::capi::memory::accalloc_empty_cache;
use accalloc::capi::settings::accalloc_set_allocator_settings;
use accalloc::capi::AccallocStatus::{ACCALLOC_ERROR_OUT_OF_MEMORY, ACCALLOC_OK};
use accalloc::runtime::DEVICE_TYPE_HOST;
use common::{free, last_error, stats, try_malloc};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const THREADS: usize = 20;
const DEVICES: i32 = 4;
const MAX_HELD: usize = 6;
const SETTINGS: [&str; 4] = [
    "expandable_segments:False",
    "expandable_segments:True",
    "expandable_segments:False,max_split_size_mb:40",
    "expandable_segments:False,garbage_collection_threshold:0.6",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// Mostly small and medium sizes, some up to 64 MiB.
    fn size(&mut self) -> usize {
        match self.next() % 8 {
            0..=3 => 1 + self.next() as usize % 8192,
            4..=5 => 1 + self.next() as usize % (4 << 20),
            _ => 1 + self.next() as usize % (64 << 20),
        }
    }
}

/// One thread's work until `until`: (mallocs, out-of-memory retries).
fn worker(
    thread: usize,
    devices: i32,
    until: Instant,
    handoff: &Mutex<Vec<usize>>,
    failures: &Mutex<Vec<String>>,
) -> (u64, u64) {
    let mut rng = Rng(thread as u64 * 7919 + devices as u64);
    let mut held: Vec<usize> = Vec::new();
    let (mut mallocs, mut retries) = (0, 0);
    while Instant::now() < until {
        let device = (rng.next() % devices as u64) as i32;
        let size = rng.size();
        let (mut status, mut ptr) = try_malloc(Some(DEVICE_TYPE_HOST), device, size);
        if status == ACCALLOC_ERROR_OUT_OF_MEMORY {
            // Give this thread's blocks back and retry once, as a framework would.
            retries += 1;
            for ptr in held.drain(..) {
                assert_eq!(free(ptr), ACCALLOC_OK, "{}", last_error());
            }
            assert_eq!(accalloc_empty_cache(), ACCALLOC_OK, "{}", last_error());
            (status, ptr) = try_malloc(Some(DEVICE_TYPE_HOST), device, size);
        }
        match status {
            ACCALLOC_OK => {
                mallocs += 1;
                // The memory is real and the thread's own.
                unsafe { (ptr as *mut u8).write(thread as u8) };
                held.push(ptr);
            }
            ACCALLOC_ERROR_OUT_OF_MEMORY => retries += 1,
            other => failures.lock().unwrap().push(format!(
                "malloc({size}) on device {device} gave {other:?}: {}",
                last_error()
            )),
        }
        if held.len() > MAX_HELD || rng.next().is_multiple_of(3) {
            if let Some(ptr) = held.pop() {
                // Every other block is freed by another thread.
                if rng.next().is_multiple_of(2) {
                    handoff.lock().unwrap().push(ptr);
                } else {
                    assert_eq!(free(ptr), ACCALLOC_OK, "{}", last_error());
                }
            }
        }
        let theirs = handoff.lock().unwrap().pop();
        if let Some(ptr) = theirs {
            assert_eq!(free(ptr), ACCALLOC_OK, "{}", last_error());
        }
        match rng.next() % 64 {
            0 => assert_eq!(accalloc_empty_cache(), ACCALLOC_OK, "{}", last_error()),
            1 => {
                let text = SETTINGS[rng.next() as usize % SETTINGS.len()];
                let conf = std::ffi::CString::new(text).unwrap();
                let status = unsafe { accalloc_set_allocator_settings(conf.as_ptr()) };
                assert_eq!(status, ACCALLOC_OK, "{}", last_error());
            }
            _ => {}
        }
    }
    for ptr in held {
        assert_eq!(free(ptr), ACCALLOC_OK, "{}", last_error());
    }
    (mallocs, retries)
}

#[test]
fn devices_racing_on_reused_addresses_never_refuse_a_segment() {
    std::env::set_var("ACCALLOC_HOST_DEVICES", DEVICES.to_string());
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "1GiB");
    std::env::set_var("ACCALLOC_DEVICE", "host");
    let seconds: f64 = std::env::var("ACCALLOC_STRESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24.0);
    let phase = Duration::from_secs_f64(seconds / DEVICES as f64);
    let failures = Mutex::new(Vec::new());
    for devices in 1..=DEVICES {
        let handoff = Mutex::new(Vec::new());
        let (mallocs, retries) = (AtomicU64::new(0), AtomicU64::new(0));
        let until = Instant::now() + phase;
        std::thread::scope(|scope| {
            for thread in 0..THREADS {
                let (handoff, failures) = (&handoff, &failures);
                let (mallocs, retries) = (&mallocs, &retries);
                scope.spawn(move || {
                    let (m, r) = worker(thread, devices, until, handoff, failures);
                    mallocs.fetch_add(m, Ordering::Relaxed);
                    retries.fetch_add(r, Ordering::Relaxed);
                });
            }
        });
        for ptr in handoff.into_inner().unwrap() {
            assert_eq!(free(ptr), ACCALLOC_OK, "{}", last_error());
        }
        println!(
            "{devices} device(s): {} mallocs, {} out-of-memory retries",
            mallocs.into_inner(),
            retries.into_inner()
        );
        let failed = failures.lock().unwrap();
        assert!(
            failed.is_empty(),
            "{} mallocs failed: {:#?}",
            failed.len(),
            &failed[..failed.len().min(5)]
        );
    }
    assert_eq!(accalloc_empty_cache(), ACCALLOC_OK);
    for device in 0..DEVICES {
        let s = stats(device);
        assert_eq!(s.allocation[0].current, 0, "device {device}");
        assert_eq!(s.allocated_bytes[0].current, 0, "device {device}");
        assert_eq!(s.reserved_bytes[0].current, 0, "device {device}");
    }
}
