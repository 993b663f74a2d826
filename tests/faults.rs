//! Injected device-allocation failures (the host backend's fail rules, ACCALLOC_HOST_FAIL's syntax): every
//! failing raw allocation or mapping takes the release-and-retry path and ends in a success or in
//! ACCALLOC_ERROR_OUT_OF_MEMORY, with the books exact after every operation (debug builds recount them)
//! and nothing leaked at the end.

use accalloc::backend::host::{FailRule, HostBackend, HostSettings};
use accalloc::backend::Backend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::{CachingAllocator, CachingConfig, StatType};
use accalloc::error::ErrorKind;
use std::sync::Arc;

const CAPACITY: usize = 256 << 20;
const ALL: usize = StatType::All as usize;

struct Outcome {
    ok: usize,
    ooms: usize,
}

fn workload(rule: FailRule, settings: &str) -> Outcome {
    let backend = Arc::new(HostBackend::new(HostSettings {
        capacity: CAPACITY,
        devices: 1,
        fail: Some(rule),
        event_fail: None,
    }));
    let config = parse_settings(settings, &CachingConfig::default()).unwrap();
    let mut a = CachingAllocator::new(backend.clone(), 0, config).unwrap();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut live = Vec::new();
    let mut outcome = Outcome { ok: 0, ooms: 0 };
    for step in 0..1500 {
        let r = next();
        if r % 3 != 0 || live.is_empty() {
            let size = match r % 4 {
                0 => 1 + (r >> 8) as usize % 4096,
                1 => 1 + (r >> 8) as usize % (1 << 20),
                2 => 1 + (r >> 8) as usize % (12 << 20),
                _ => 1 + (r >> 8) as usize % (48 << 20),
            };
            match a.malloc(size, (r >> 60) as usize % 2) {
                Ok(p) => {
                    live.push(p);
                    outcome.ok += 1;
                }
                Err(e) => {
                    assert_eq!(e.kind, ErrorKind::OutOfMemory, "{}", e.message);
                    outcome.ooms += 1;
                }
            }
        } else {
            let p = live.swap_remove((r >> 8) as usize % live.len());
            a.free(p).unwrap();
        }
        if step % 200 == 199 {
            a.empty_cache().unwrap();
        }
    }
    let s = a.stats();
    assert_eq!(
        s.num_ooms as usize, outcome.ooms,
        "every failed malloc counted once"
    );
    for p in live {
        a.free(p).unwrap();
    }
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!(
        (s.allocation[ALL].current, s.reserved_bytes[ALL].current),
        (0, 0)
    );
    if !settings.contains("expandable") {
        // (Expandable segments count mappings page by page but unmap runs of pages at once.)
        assert_eq!(
            s.num_device_alloc, s.num_device_free,
            "{settings}: every segment went back"
        );
    }
    drop(a);
    assert_eq!(
        backend.mem_get_info(0).unwrap().free,
        CAPACITY,
        "nothing leaked at the backend"
    );
    outcome
}

#[test]
fn every_nth_allocation_failing_is_absorbed_by_the_retry() {
    for settings in [
        "",
        "max_split_size_mb:20",
        "expandable_segments:True",
        "release_lock_on_malloc:True",
    ] {
        for n in [2, 3, 7] {
            let outcome = workload(FailRule::Every(n), settings);
            assert!(
                outcome.ok > 500,
                "{settings} every={n}: {} succeeded",
                outcome.ok
            );
        }
    }
}

#[test]
fn allocations_failing_after_a_point_end_in_out_of_memory_cleanly() {
    for settings in [
        "",
        "expandable_segments:True,expandable_trim:True",
        "garbage_collection_threshold:0.5,per_process_memory_fraction:0.9",
    ] {
        let outcome = workload(FailRule::After(20), settings);
        assert!(outcome.ooms > 0 && outcome.ok > 0, "{settings}");
        let none = workload(FailRule::After(0), settings);
        assert_eq!(
            none.ok, 0,
            "{settings}: nothing can be allocated when every device call fails"
        );
    }
}

/// Streams share blocks (record_stream) while every n-th event or stream call of the host fails: a
/// refused free leaves its block allocated and is retried, a failed empty_cache is retried, and at
/// the end nothing is allocated, reserved or held by the backend.
fn event_workload(event_rule: FailRule, settings: &str) -> (usize, usize) {
    let backend = Arc::new(HostBackend::new(HostSettings {
        capacity: CAPACITY,
        devices: 1,
        fail: None,
        event_fail: Some(event_rule),
    }));
    let config = parse_settings(settings, &CachingConfig::default()).unwrap();
    let mut a = CachingAllocator::new(backend.clone(), 0, config).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut refused, mut retried_empty) = (0, 0);
    let mut live = Vec::new();
    // Each call that fails is retried; at most a few tries are needed since the failures are spaced.
    let free = |a: &mut CachingAllocator, p: usize, refused: &mut usize| {
        for _ in 0..8 {
            match a.free(p) {
                Ok(()) => return,
                Err(e) => {
                    assert_eq!(e.kind, ErrorKind::Backend, "{}", e.message);
                    assert!(e.message.contains("still allocated"), "{}", e.message);
                    *refused += 1;
                }
            }
        }
        panic!("a free kept failing");
    };
    for step in 0..1500 {
        let r = next();
        if r % 3 != 0 || live.is_empty() {
            let size = 1 + (r >> 8) as usize % (6 << 20);
            let stream = (r >> 60) as usize % 3;
            match a.malloc(size, stream) {
                Ok(p) => {
                    if r % 5 < 2 {
                        a.record_stream(p, (stream + 1) % 3).unwrap();
                    }
                    live.push(p);
                }
                // The events pending when a malloc starts are checked first: that can fail too.
                Err(e) => assert!(
                    matches!(e.kind, ErrorKind::Backend | ErrorKind::OutOfMemory),
                    "{}",
                    e.message
                ),
            }
        } else {
            let p = live.swap_remove((r >> 8) as usize % live.len());
            free(&mut a, p, &mut refused);
        }
        if step % 100 == 99 {
            while a.empty_cache().is_err() {
                retried_empty += 1;
            }
        }
    }
    for p in live {
        free(&mut a, p, &mut refused);
    }
    while a.empty_cache().is_err() {
        retried_empty += 1;
    }
    let s = a.stats();
    assert_eq!(
        (
            s.allocation[ALL].current,
            s.active[ALL].current,
            s.reserved_bytes[ALL].current
        ),
        (0, 0, 0),
        "{settings}: every block came back"
    );
    drop(a);
    assert_eq!(
        backend.mem_get_info(0).unwrap().free,
        CAPACITY,
        "nothing leaked at the backend"
    );
    (refused, retried_empty)
}

#[test]
fn failing_event_and_stream_calls_lose_no_block() {
    for settings in ["", "expandable_segments:True", "max_split_size_mb:20"] {
        for n in [3, 5, 7] {
            let (refused, retried) = event_workload(FailRule::Every(n), settings);
            assert!(
                refused > 0 && retried > 0,
                "{settings} every={n}: the failures were exercised ({refused} refused frees, \
                 {retried} empty_cache retries)"
            );
        }
    }
}
