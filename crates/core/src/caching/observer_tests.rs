//! Segment observers and OOM reports: what a framework registering memory with a network library
//! sees, worked out from the rules in caching/observers.rs.

use super::observers::{OomReport, SegmentAction, SegmentEvent};
use super::pools::Route;
use super::*;
use crate::backend::simulated::SimulatedBackend;
use std::sync::{Arc, Mutex};

const MIB: usize = 1024 * 1024;
const POOL: (u64, u64) = (0, 1);

/// Each event, with whether the backend held the memory when the observer was told.
type Seen = Arc<Mutex<Vec<(SegmentEvent, bool)>>>;

fn observed(config: CachingConfig) -> (CachingAllocator, Arc<SimulatedBackend>, Seen) {
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
    let mut allocator = CachingAllocator::new(backend.clone(), 0, config).unwrap();
    let seen: Seen = Arc::default();
    let (log, held_by) = (seen.clone(), backend.clone());
    allocator.set_segment_observer(Some(Box::new(move |event: &SegmentEvent| {
        let held = match event.action {
            SegmentAction::Alloc | SegmentAction::Free => held_by
                .live_segments(0)
                .contains(&(event.address, event.size)),
            SegmentAction::Map | SegmentAction::Unmap => held_by.mapped_bytes(0) >= event.size,
        };
        log.lock().unwrap().push((*event, held));
    })));
    (allocator, backend, seen)
}

fn actions(seen: &Seen) -> Vec<(SegmentAction, (u64, u64), usize, usize)> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|(e, _)| (e.action, e.pool, e.address, e.size))
        .collect()
}

#[test]
fn observers_see_each_segment_with_its_pool_and_are_told_of_a_free_before_it_happens() {
    let (mut a, backend, seen) = observed(CachingConfig::default());
    a.create_pool(POOL, false, false).unwrap();
    a.begin_allocate_to_pool(POOL, Route::Thread(std::thread::current().id()))
        .unwrap();
    let in_pool = a.malloc(1000, 0).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    let outside = a.malloc(1000, 0).unwrap();
    // Each block starts a segment of its own: the pool's, then the default pools'.
    let pools: Vec<(usize, (u64, u64))> = a
        .segments()
        .iter()
        .map(|s| (s.address, s.pool_id))
        .collect();
    let (pool_segment, default_segment) = (in_pool, outside);
    assert!(pools.contains(&(pool_segment, POOL)) && pools.contains(&(default_segment, (0, 0))));
    // A block cut from a cached segment makes no event.
    let second = a.malloc(1000, 0).unwrap();
    assert_eq!(
        actions(&seen),
        vec![
            (SegmentAction::Alloc, POOL, pool_segment, 2 * MIB),
            (SegmentAction::Alloc, (0, 0), default_segment, 2 * MIB),
        ]
    );
    a.free(in_pool).unwrap();
    a.free(outside).unwrap();
    a.free(second).unwrap();
    // use_mem_pool's release, then the MemPool's own: the pool is freeable.
    a.release_pool(POOL).unwrap();
    a.release_pool(POOL).unwrap();
    a.empty_cache().unwrap();
    // empty_cache gives back the default pools' segments first, then the freeable pool's.
    let all = actions(&seen);
    assert_eq!(
        all[2..],
        [
            (SegmentAction::Free, (0, 0), default_segment, 2 * MIB),
            (SegmentAction::Free, POOL, pool_segment, 2 * MIB),
        ]
    );
    assert!(
        seen.lock().unwrap().iter().all(|&(_, held)| held),
        "alloc told after the backend gave the memory, free before it takes it back"
    );
    assert!(backend.live_segments(0).is_empty());
}

#[test]
fn a_segment_the_backend_refuses_to_free_is_announced_again() {
    let (mut a, backend, seen) = observed(CachingConfig::default());
    let p = a.malloc(1000, 0).unwrap();
    a.free(p).unwrap();
    backend.fail_calls("raw_free", 1);
    assert!(a.empty_cache().is_err());
    assert_eq!(
        actions(&seen),
        vec![
            (SegmentAction::Alloc, (0, 0), p, 2 * MIB),
            (SegmentAction::Free, (0, 0), p, 2 * MIB),
            (SegmentAction::Alloc, (0, 0), p, 2 * MIB),
        ],
        "the observer's view matches the books: the segment is still there"
    );
    assert_eq!(a.stats().segment[StatType::All as usize].current, 1);
    a.empty_cache().unwrap();
    assert_eq!(
        actions(&seen).last(),
        Some(&(SegmentAction::Free, (0, 0), p, 2 * MIB))
    );
}

#[test]
fn expandable_segments_tell_maps_and_unmaps_of_pages() {
    let config = CachingConfig {
        expandable_segments: true,
        ..CachingConfig::default()
    };
    let (mut a, backend, seen) = observed(config);
    let p = a.malloc(5 * MIB, 0).unwrap();
    a.free(p).unwrap();
    backend.fail_calls("vm_unmap", 1);
    assert!(a.empty_cache().is_err());
    a.empty_cache().unwrap();
    // One 20 MiB page of the large pool; the refused unmap leaves it mapped and says so.
    assert_eq!(
        actions(&seen),
        vec![
            (SegmentAction::Map, (0, 0), p, 20 * MIB),
            (SegmentAction::Unmap, (0, 0), p, 20 * MIB),
            (SegmentAction::Map, (0, 0), p, 20 * MIB),
            (SegmentAction::Unmap, (0, 0), p, 20 * MIB),
        ]
    );
    assert_eq!(backend.mapped_bytes(0), 0);
}

#[test]
fn each_out_of_memory_failure_leaves_a_report_with_pytorchs_figures() {
    let backend = Arc::new(SimulatedBackend::new(1, 100 * MIB));
    let mut a = CachingAllocator::new(backend, 0, CachingConfig::default()).unwrap();
    let held = a.malloc(30 * MIB, 0).unwrap();
    assert!(a.malloc(200 * MIB, 0).is_err());
    a.set_memory_fraction(0.5).unwrap();
    // 30 MiB held: 30 MiB more would pass the 50 MiB line.
    assert!(a.malloc(30 * MIB, 0).is_err());
    assert_eq!(
        a.take_oom_reports(),
        vec![
            OomReport {
                device: 0,
                alloc_size: 200 * MIB,
                limit_or_total: 100 * MIB,
                device_free: 70 * MIB,
            },
            OomReport {
                device: 0,
                alloc_size: 30 * MIB,
                limit_or_total: 50 * MIB,
                device_free: 70 * MIB,
            },
        ]
    );
    assert!(a.take_oom_reports().is_empty(), "each report is taken once");
    a.free(held).unwrap();
}
