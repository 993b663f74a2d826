//! Planned placement under threads: one thread runs a training-like step over and over (the plan
//! forms, and requests are served from the blocks parked at their planned addresses, the stretch
//! matcher not asked while the step keeps to the plan) while others break in with bursts of
//! requests of their own and empty_cache at times the scheduler picks, on the same device.
//! Nothing panics or hangs, every block comes back, and the books balance (debug builds recount
//! them after every request). (planned_placement keeps its pools in expandable segments, which
//! grow under the device lock: release_lock_on_malloc, set too, has no segment to let it go for.)

use accalloc::capi::memory::{accalloc_empty_cache, accalloc_free, accalloc_malloc};
use accalloc::capi::planned::{accalloc_planner_stats, AccallocPlannerStats};
use accalloc::capi::settings::accalloc_set_allocator_settings;
use accalloc::capi::{AccallocStatus, ACCALLOC_STAT_ALL};
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

mod common;
use common::{last_error, stats};

const STEPS: usize = 120;
const BURSTING_THREADS: usize = 3;

fn malloc(size: usize) -> usize {
    let mut p: *mut c_void = std::ptr::null_mut();
    let status = unsafe { accalloc_malloc(&mut p, size, -1, std::ptr::null_mut()) };
    assert_eq!(status, AccallocStatus::ACCALLOC_OK, "{}", last_error());
    p as usize
}

fn free(p: usize) {
    assert_eq!(
        unsafe { accalloc_free(p as *mut c_void) },
        AccallocStatus::ACCALLOC_OK,
        "{}",
        last_error()
    );
}

/// Per layer, four activations held to the layer's backward and three temporaries; per layer
/// backward, two temporaries, then the layer's activations go: 66 allocations for 6 layers.
fn step(layers: usize) -> usize {
    let mut held = Vec::new();
    let mut count = 0;
    for layer in 0..layers {
        let kept: Vec<usize> = [3 << 20, 1 << 20, 2 << 20, 1 << 20]
            .iter()
            .enumerate()
            .map(|(i, size)| malloc(size + (layer * 4 + i) * 4096))
            .collect();
        for size in [2 << 20, 1 << 20, 4 << 20] {
            free(malloc(size));
        }
        count += 7;
        held.push(kept);
    }
    for kept in held.into_iter().rev() {
        for size in [1 << 20, 2 << 20] {
            free(malloc(size));
        }
        count += 2;
        kept.into_iter().for_each(free);
    }
    count
}

#[test]
fn a_plan_kept_to_by_one_thread_while_others_break_in_keeps_exact_books() {
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "4GiB");
    let settings = CString::new("planned_placement:True,release_lock_on_malloc:True").unwrap();
    assert_eq!(
        unsafe { accalloc_set_allocator_settings(settings.as_ptr()) },
        AccallocStatus::ACCALLOC_OK
    );
    let done = Arc::new(AtomicBool::new(false));
    let allocations = Arc::new(AtomicUsize::new(0));
    let bursts: Vec<_> = (0..BURSTING_THREADS)
        .map(|t| {
            let (done, allocations) = (done.clone(), allocations.clone());
            std::thread::spawn(move || {
                let mut state = t as u64 * 7919 + 11;
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_micros(400 + 200 * t as u64));
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let count = 1 + (state >> 60) as usize;
                    let held: Vec<usize> = (0..count)
                        .map(|i| malloc(1 + ((state >> (20 + i)) as usize % (5 << 20))))
                        .collect();
                    allocations.fetch_add(count, Ordering::Relaxed);
                    if t == 0 && state.is_multiple_of(16) {
                        assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
                    }
                    held.into_iter().for_each(free);
                }
            })
        })
        .collect();
    let mut stepped = 0;
    for _ in 0..STEPS {
        stepped += step(6);
    }
    done.store(true, Ordering::Relaxed);
    for burst in bursts {
        burst.join().unwrap();
    }
    let total = (stepped + allocations.load(Ordering::Relaxed)) as i64;
    let s = stats(0);
    assert_eq!(s.allocation[ACCALLOC_STAT_ALL].current, 0);
    assert_eq!(s.allocation[ACCALLOC_STAT_ALL].allocated, total);
    assert_eq!(s.allocation[ACCALLOC_STAT_ALL].freed, total);
    assert_eq!(s.allocated_bytes[ACCALLOC_STAT_ALL].current, 0);
    accalloc::runtime::runtime()
        .unwrap()
        .current()
        .lock(0)
        .unwrap()
        .check_invariants()
        .unwrap();
    // The planner saw the step: it tried plans, and the requests it advised are counted.
    let mut planner = AccallocPlannerStats {
        struct_size: std::mem::size_of::<AccallocPlannerStats>(),
        ..Default::default()
    };
    assert_eq!(
        unsafe { accalloc_planner_stats(0, &mut planner) },
        AccallocStatus::ACCALLOC_OK
    );
    assert!(planner.attempts >= 1, "{planner:?}");
    assert!(planner.from_parked <= planner.advised, "{planner:?}");
    assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
    let s = stats(0);
    assert_eq!(s.reserved_bytes[ACCALLOC_STAT_ALL].current, 0);
}
