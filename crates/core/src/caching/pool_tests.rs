//! Private pools against figures worked out by hand from PyTorch's rules (POOLS.md's summary in
//! caching/pools.rs): isolation, routing, release, empty_cache with live and freeable pools, the
//! live-pool empty, no_split and use_on_oom. Every operation is followed by the invariants' recount
//! (debug builds verify after each one).

use super::pools::Route;
use super::*;
use crate::backend::simulated::SimulatedBackend;
use crate::error::ErrorKind;
use std::sync::Arc;

const KIB: i64 = 1024;
const MIB: i64 = 1024 * 1024;
const ALL: usize = StatType::All as usize;
const SMALL: usize = StatType::SmallPool as usize;
const POOL: (u64, u64) = (0, 1);

fn allocator(capacity: usize) -> (CachingAllocator, Arc<SimulatedBackend>) {
    let backend = Arc::new(SimulatedBackend::new(1, capacity));
    let allocator = CachingAllocator::new(backend.clone(), 0, CachingConfig::default()).unwrap();
    (allocator, backend)
}

fn this_thread() -> Route {
    Route::Thread(std::thread::current().id())
}

#[test]
fn a_pools_blocks_come_from_its_own_segments_and_go_back_to_them() {
    let (mut a, _) = allocator(1 << 30);
    a.create_pool(POOL, false, false).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    assert_eq!(
        a.pool_use_count(POOL),
        Some(2),
        "created (1) and begun (+1)"
    );
    let in_pool = a.malloc(1000, 0).unwrap();
    assert_eq!(a.pool_segment_count(POOL), Some(1));
    a.end_allocate_to_pool(POOL).unwrap();
    assert_eq!(
        a.pool_use_count(POOL),
        Some(2),
        "ending leaves the use count alone"
    );
    // The pool's free 2 MiB - 1 KiB are not the default pools': a segment of their own.
    let outside = a.malloc(1000, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.segment[SMALL].current, 2);
    assert_eq!(s.reserved_bytes[ALL].current, 4 * MIB);
    assert_eq!(
        s.allocated_bytes[ALL].current,
        2 * KIB,
        "pool blocks count device-wide"
    );
    assert_eq!(s.inactive_split[SMALL].current, 2);
    // Freed, each block merges back into its own segment and pool.
    a.free(in_pool).unwrap();
    a.free(outside).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let again = a.malloc(2000, 0).unwrap();
    assert_eq!(
        again, in_pool,
        "the pool's cached block, not the default pools'"
    );
    a.end_allocate_to_pool(POOL).unwrap();
    assert_eq!(a.stats().segment[ALL].allocated, 2, "no new segment");
    a.free(again).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn empty_cache_keeps_a_live_pools_segments_and_releases_a_freeable_one() {
    let (mut a, backend) = allocator(1 << 30);
    a.create_pool(POOL, false, false).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let p = a.malloc(5 << 20, 0).unwrap(); // large: a 20 MiB segment of the pool
    a.end_allocate_to_pool(POOL).unwrap();
    let q = a.malloc(1000, 0).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    // Live pool (use count 2): only the default pools' segment goes.
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!(s.reserved_bytes[ALL].current, 20 * MIB);
    assert_eq!(s.num_device_free, 1);
    // PyTorch's emptyCache(pool) does nothing to a live pool.
    a.empty_pool_cache(POOL).unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 20 * MIB);
    // use_mem_pool's exit and ~MemPool: two releases; freeable, the next empty_cache frees it.
    a.release_pool(POOL).unwrap();
    a.release_pool(POOL).unwrap();
    assert_eq!(a.pool_use_count(POOL), Some(0));
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    assert_eq!(
        a.pool_use_count(POOL),
        None,
        "a freeable pool with no segment is erased"
    );
    assert!(backend.live_segments(0).is_empty());
}

#[test]
fn a_block_freed_after_its_pool_was_released_returns_to_the_pool() {
    let (mut a, _) = allocator(1 << 30);
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap(); // made with use count 1
    let p = a.malloc(4096, 0).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    a.release_pool(POOL).unwrap();
    // Freeable but holding a live block: empty_cache cannot take its segment.
    a.empty_cache().unwrap();
    assert_eq!(a.pool_segment_count(POOL), Some(1));
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.pool_segment_count(POOL), None);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn the_live_pool_empty_gives_back_what_pytorch_keeps() {
    let (mut a, backend) = allocator(1 << 30);
    a.create_pool(POOL, false, false).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let kept = a.malloc(1000, 0).unwrap();
    let freed = a.malloc(3 << 20, 0).unwrap(); // a 20 MiB segment
    a.free(freed).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    a.empty_live_pool(POOL).unwrap();
    let s = a.stats();
    assert_eq!(
        s.reserved_bytes[ALL].current,
        2 * MIB,
        "the free 20 MiB segment went back"
    );
    assert_eq!(a.pool_use_count(POOL), Some(2), "still live");
    assert_eq!(backend.live_segments(0).len(), 1);
    a.free(kept).unwrap();
    assert_eq!(
        a.empty_live_pool((0, 9)).unwrap_err().kind,
        ErrorKind::InvalidArgument
    );
}

#[test]
fn no_split_hands_out_whole_blocks() {
    // POOLS.md's example: a 1000 B request in a no_split pool.
    let (mut a, _) = allocator(1 << 30);
    a.create_pool(POOL, false, true).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let p = a.malloc(1000, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.segment[SMALL].current, 1);
    assert_eq!(s.reserved_bytes[SMALL].current, 2_097_152);
    assert_eq!(s.allocated_bytes[SMALL].current, 2_097_152);
    assert_eq!(s.active_bytes[SMALL].current, 2_097_152);
    assert_eq!(s.requested_bytes[SMALL].current, 1000);
    assert_eq!(s.inactive_split[SMALL].allocated, 0, "no inactive split");
    // A second request needs a second segment: the first is wholly handed out.
    let q = a.malloc(1000, 0).unwrap();
    assert_eq!(a.stats().segment[SMALL].current, 2);
    a.free(p).unwrap();
    a.free(q).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    // no_split stays set once set.
    a.create_pool(POOL, false, false).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let r = a.malloc(1000, 0).unwrap();
    assert_eq!(a.stats().allocated_bytes[SMALL].current, 2_097_152);
    a.free(r).unwrap();
}

#[test]
fn a_default_request_about_to_fail_takes_a_free_block_of_a_use_on_oom_pool() {
    for use_on_oom in [true, false] {
        let (mut a, _) = allocator(4 << 20);
        a.create_pool(POOL, use_on_oom, false).unwrap();
        a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
        let in_pool = a.malloc(512 << 10, 0).unwrap(); // the pool's 2 MiB segment
        a.free(in_pool).unwrap();
        a.end_allocate_to_pool(POOL).unwrap();
        let first = a.malloc(1 << 20, 0).unwrap(); // the default pools' 2 MiB segment
        let second = a.malloc(1 << 20, 0).unwrap(); // its other half
                                                    // A third needs a segment: the device is full and the live pool keeps its own, so only
                                                    // the use_on_oom pool's free block can serve it.
        let third = a.malloc(1 << 20, 0);
        let s = a.stats();
        // PyTorch 2.15 tries the use_on_oom pools right after the first failed device allocation,
        // before the releases and the retry.
        assert_eq!(s.num_alloc_retries, if use_on_oom { 0 } else { 1 });
        if use_on_oom {
            assert_eq!(third.unwrap(), in_pool, "the pool's free block");
            assert_eq!(s.num_ooms, 0);
            assert_eq!(s.segment[ALL].current, 2);
            a.free(in_pool).unwrap();
        } else {
            assert_eq!(third.unwrap_err().kind, ErrorKind::OutOfMemory);
            assert_eq!(s.num_ooms, 1);
        }
        a.free(first).unwrap();
        a.free(second).unwrap();
        // The block went back to the pool it belongs to: beginning the pool finds it.
        a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
        assert_eq!(a.malloc(512 << 10, 0).unwrap(), in_pool);
    }
}

#[test]
fn the_newest_matching_pool_takes_a_request() {
    let (mut a, _) = allocator(1 << 30);
    let graph = (1, 0);
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    a.begin_allocate_to_pool(graph, Route::Stream(5)).unwrap();
    let on_stream = a.malloc(1000, 5).unwrap();
    let other_stream = a.malloc(1000, 0).unwrap();
    assert_eq!(
        a.pool_segment_count(graph),
        Some(1),
        "stream 5: the graph's pool, begun last"
    );
    assert_eq!(
        a.pool_segment_count(POOL),
        Some(1),
        "stream 0: the thread's pool"
    );
    a.end_allocate_to_pool(graph).unwrap();
    // Stream 5 now goes to the thread's pool: a segment of its own there (blocks serve their stream).
    let after = a.malloc(1000, 5).unwrap();
    assert_eq!(a.pool_segment_count(POOL), Some(2));
    assert_eq!(a.pool_segment_count(graph), Some(1));
    assert_eq!(
        a.stats().segment[ALL].current,
        3,
        "no default segment at all"
    );
    for p in [on_stream, other_stream, after] {
        a.free(p).unwrap();
    }
}

#[test]
fn routing_by_thread_leaves_other_threads_in_the_default_pools() {
    let (a, _) = allocator(1 << 30);
    let a = std::sync::Mutex::new(a);
    a.lock()
        .unwrap()
        .begin_allocate_to_pool(POOL, this_thread())
        .unwrap();
    let mine = a.lock().unwrap().malloc(1000, 0).unwrap();
    let theirs = std::thread::scope(|scope| {
        scope
            .spawn(|| a.lock().unwrap().malloc(1000, 0).unwrap())
            .join()
            .unwrap()
    });
    let mut a = a.into_inner().unwrap();
    assert_eq!(a.pool_segment_count(POOL), Some(1));
    assert_eq!(
        a.stats().segment[ALL].current,
        2,
        "the other thread's block: a default segment"
    );
    a.free(mine).unwrap();
    a.free(theirs).unwrap();
}

#[test]
fn misuse_is_refused_and_changes_nothing() {
    let (mut a, _) = allocator(1 << 30);
    let kind = |r: crate::error::Result<()>| r.unwrap_err().kind;
    assert_eq!(
        kind(a.create_pool((0, 0), false, false)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        kind(a.end_allocate_to_pool(POOL).map(drop)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(kind(a.release_pool(POOL)), ErrorKind::InvalidArgument);
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let refused = a
        .begin_allocate_to_pool(POOL, Route::Stream(3))
        .unwrap_err();
    assert!(
        refused.message.contains("already go to pool (0, 1)"),
        "{}",
        refused.message
    );
    assert_eq!(
        a.pool_use_count(POOL),
        Some(1),
        "the refused begin counted no use"
    );
    a.end_allocate_to_pool(POOL).unwrap();
    a.release_pool(POOL).unwrap();
    let refused = a.release_pool(POOL).unwrap_err();
    assert!(
        refused.message.contains("released more often"),
        "{}",
        refused.message
    );
    a.empty_pool_cache((7, 7)).unwrap(); // unknown: nothing, as PyTorch
}

#[test]
fn a_pool_released_while_begun_is_not_forgotten_until_it_ends() {
    // Found by fuzzing: begun (made with one use), released, then the cache emptied while the pool
    // still takes allocations. It stays until ended, and is forgotten at the next empty after.
    let (mut a, _) = allocator(1 << 30);
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    a.release_pool(POOL).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.pool_use_count(POOL), Some(0));
    let p = a.malloc(1000, 0).unwrap();
    assert_eq!(a.pool_segment_count(POOL), Some(1));
    a.end_allocate_to_pool(POOL).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.pool_use_count(POOL), None);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn only_a_capture_skips_the_last_resort_and_keeps_empty_cache_off_the_default_pools() {
    for capture in [false, true] {
        let (mut a, _) = allocator(3 << 20);
        let cached = a.malloc(1 << 20, 0).unwrap(); // the default pools' 2 MiB segment
        a.free(cached).unwrap();
        let route = if capture {
            Route::Stream(7)
        } else {
            this_thread()
        };
        a.begin_allocate_to_pool(POOL, route).unwrap();
        // The pool's request (on stream 7) needs a 2 MiB segment of its own: only after the
        // default segment is released, the last resort.
        let got = a.malloc(600 << 10, 7);
        assert_eq!(got.is_ok(), !capture, "capture {capture}");
        // empty_cache during a capture leaves the default pools' cached segment alone.
        a.empty_cache().unwrap();
        let s = a.stats();
        assert_eq!(s.num_sync_all_streams, if capture { 0 } else { 2 });
        if let Ok(p) = got {
            a.free(p).unwrap();
        }
        a.end_allocate_to_pool(POOL).unwrap();
    }
}

fn expandable_allocator(capacity: usize) -> (CachingAllocator, Arc<SimulatedBackend>) {
    let backend = Arc::new(SimulatedBackend::new(1, capacity));
    let config = CachingConfig {
        expandable_segments: true,
        ..CachingConfig::default()
    };
    let allocator = CachingAllocator::new(backend.clone(), 0, config).unwrap();
    (allocator, backend)
}

#[test]
fn a_pool_grows_expandable_segments_of_its_own() {
    let (mut a, backend) = expandable_allocator(1 << 30);
    a.create_pool(POOL, false, false).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let in_pool = a.malloc(5 << 20, 0).unwrap();
    let in_pool_too = a.malloc(5 << 20, 0).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    // One 20 MiB page of the pool's own range serves both: a map counts reserved bytes and
    // num_device_alloc, never a segment (PyTorch's rule, pools too).
    assert_eq!(in_pool_too, in_pool + (5 << 20));
    let s = a.stats();
    assert_eq!(
        (
            s.reserved_bytes[ALL].current,
            s.num_device_alloc,
            s.segment[ALL].current
        ),
        (20 * MIB, 1, 0)
    );
    assert_eq!(a.pool_segment_count(POOL), Some(0));
    // The default pools' request has a range of its own: the pool's free 10 MiB are not its.
    let outside = a.malloc(5 << 20, 0).unwrap();
    assert_eq!(backend.live_reservations(0), 2);
    assert!(outside.abs_diff(in_pool) >= 1 << 30, "another reservation");
    assert_eq!(a.stats().reserved_bytes[ALL].current, 40 * MIB);
    let pools: Vec<_> = a
        .segments()
        .iter()
        .map(|s| (s.address, s.pool_id))
        .collect();
    assert_eq!(pools.len(), 2);
    assert!(pools.contains(&(in_pool, POOL)) && pools.contains(&(outside, (0, 0))));

    a.free(in_pool).unwrap();
    a.free(in_pool_too).unwrap();
    a.free(outside).unwrap();
    // A live pool keeps its mapped page through empty_cache; the default pools' goes, with its range.
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 20 * MIB);
    assert_eq!(backend.live_reservations(0), 1);
    // The live-pool empty unmaps it and gives the range back.
    a.empty_live_pool(POOL).unwrap();
    let s = a.stats();
    assert_eq!((s.reserved_bytes[ALL].current, s.num_device_free), (0, 2));
    assert_eq!(backend.live_reservations(0), 0);
    assert_eq!(backend.mapped_bytes(0), 0);
    a.release_pool(POOL).unwrap();
    a.release_pool(POOL).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.pool_use_count(POOL), None, "freeable and empty: erased");
}

#[test]
fn a_freeable_pool_with_live_expandable_blocks_stays_until_they_are_freed() {
    let (mut a, backend) = expandable_allocator(1 << 30);
    a.create_pool(POOL, false, false).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let p = a.malloc(1000, 0).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    a.release_pool(POOL).unwrap();
    a.release_pool(POOL).unwrap();
    // No ordinary segment, but a mapped page in use: the pool is not erased.
    a.empty_cache().unwrap();
    assert_eq!(a.pool_use_count(POOL), Some(0));
    assert_eq!(a.stats().reserved_bytes[SMALL].current, 2 * MIB);
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.pool_use_count(POOL), None);
    assert_eq!(backend.live_reservations(0), 0);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    a.check_invariants().unwrap();
}

#[test]
fn each_pool_keeps_its_own_reserved_bytes() {
    let (mut a, _) = allocator(1 << 30);
    let outside = a.malloc(1000, 0).unwrap();
    a.create_pool(POOL, false, false).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let small = a.malloc(1000, 0).unwrap();
    let large = a.malloc(3 << 20, 0).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    // A 2 MiB small segment and a 20 MiB large one; the default pools' segment is not the pool's.
    let [all, small_pool, large_pool] = a.pool_reserved_bytes(POOL).unwrap();
    let stat = |current: i64, peak: i64, allocated: i64, freed: i64| Stat {
        current,
        peak,
        allocated,
        freed,
    };
    assert_eq!(all, stat(22 * MIB, 22 * MIB, 22 * MIB, 0));
    assert_eq!(small_pool, stat(2 * MIB, 2 * MIB, 2 * MIB, 0));
    assert_eq!(large_pool, stat(20 * MIB, 20 * MIB, 20 * MIB, 0));
    assert_eq!(a.stats().reserved_bytes[ALL].current, 24 * MIB);
    a.free(small).unwrap();
    a.free(large).unwrap();
    a.empty_live_pool(POOL).unwrap();
    assert_eq!(
        a.pool_reserved_bytes(POOL).unwrap()[0],
        stat(0, 22 * MIB, 22 * MIB, 22 * MIB)
    );
    a.reset_peak_stats();
    a.reset_accumulated_stats();
    assert_eq!(a.pool_reserved_bytes(POOL).unwrap()[0], Stat::default());
    assert_eq!(a.pool_reserved_bytes((0, 9)), None);
    a.free(outside).unwrap();
    a.check_invariants().unwrap();
}

/// The device (A, with virtual memory) and a pool allocator (B) whose addresses never meet A's.
fn with_pool_allocator(
    b: SimulatedBackend,
) -> (
    CachingAllocator,
    Arc<SimulatedBackend>,
    Arc<SimulatedBackend>,
) {
    let (a, device) = expandable_allocator(1 << 30);
    (a, device, Arc::new(b.elsewhere(1 << 44)))
}

#[test]
fn a_pool_with_its_own_allocator_takes_its_segments_from_it() {
    let (mut a, device, own) =
        with_pool_allocator(SimulatedBackend::without_virtual_memory(1, 1 << 30));
    a.create_pool_with_allocator(POOL, false, false, own.clone())
        .unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let p = a.malloc(1000, 0).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    // No virtual memory in the pool's allocator: an ordinary 2 MiB segment, though the device's
    // default pools grow expandable segments.
    assert_eq!(own.live_segments(0), vec![(p, 2 << 20)]);
    assert_eq!((device.alloc_calls(0), device.mapped_bytes(0)), (0, 0));
    let q = a.malloc(1000, 0).unwrap();
    assert_eq!(device.mapped_bytes(0), 2 << 20);
    let s = a.stats();
    assert_eq!(
        (s.segment[ALL].current, s.reserved_bytes[ALL].current),
        (1, 4 * MIB)
    );
    assert_eq!(a.pool_segment_count(POOL), Some(1));
    a.free(p).unwrap();
    a.free(q).unwrap();
    a.empty_live_pool(POOL).unwrap();
    assert_eq!((own.free_calls(0), own.live_segments(0).len()), (1, 0));
    assert!(
        a.create_pool_with_allocator(POOL, false, false, own.clone())
            .is_err(),
        "an allocator is given when a pool is made"
    );
    assert_eq!(a.pool_use_count(POOL), Some(2), "nothing changed");
    a.check_invariants().unwrap();
}

#[test]
fn a_pool_allocator_with_virtual_memory_grows_expandable_segments_from_it() {
    let (mut a, device, own) = with_pool_allocator(SimulatedBackend::new(1, 1 << 30));
    a.create_pool_with_allocator(POOL, false, false, own.clone())
        .unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let p = a.malloc(5 << 20, 0).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    assert_eq!(
        (own.live_reservations(0), own.mapped_bytes(0)),
        (1, 20 << 20)
    );
    assert_eq!((device.live_reservations(0), device.alloc_calls(0)), (0, 0));
    let s = a.stats();
    assert_eq!(
        (s.segment[ALL].current, s.reserved_bytes[ALL].current),
        (0, 20 * MIB)
    );
    a.free(p).unwrap();
    a.empty_live_pool(POOL).unwrap();
    assert_eq!((own.live_reservations(0), own.mapped_bytes(0)), (0, 0));
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn a_pool_allocator_out_of_room_is_the_pools_out_of_memory() {
    let (mut a, device, own) =
        with_pool_allocator(SimulatedBackend::without_virtual_memory(1, 8 << 20));
    a.create_pool_with_allocator(POOL, false, false, own.clone())
        .unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    // 3 MiB needs a 20 MiB segment: the pool's allocator has 8 MiB; the device is not asked.
    let error = a.malloc(3 << 20, 0).unwrap_err();
    assert_eq!(error.kind, ErrorKind::OutOfMemory);
    assert_eq!((device.alloc_calls(0), device.mapped_bytes(0)), (0, 0));
    assert_eq!(a.stats().num_ooms, 1);
    // A request it can serve still works.
    let p = a.malloc(1000, 0).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    a.free(p).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_block_other_streams_used_freed_during_a_capture_waits_for_the_capture_to_end() {
    let (mut a, backend) = allocator(1 << 30);
    let graph = (1, 0);
    a.begin_allocate_to_pool(graph, Route::Stream(1)).unwrap();
    let p = a.malloc(1000, 1).unwrap();
    a.record_stream(p, 2).unwrap();
    a.free(p).unwrap();
    // No event may be recorded during a capture: none is; the block is freed but still active.
    assert_eq!(backend.live_events(), 0);
    let s = a.stats();
    assert_eq!(
        (s.allocated_bytes[ALL].current, s.active_bytes[ALL].current),
        (0, KIB)
    );
    // Not reusable meanwhile: the next request of the capture cuts a new block.
    let q = a.malloc(1000, 1).unwrap();
    assert_ne!(q, p);
    a.free(q).unwrap();
    a.end_allocate_to_pool(graph).unwrap();
    // The first malloc after the capture records the event; the block waits for stream 2.
    let r = a.malloc(1000, 0).unwrap();
    assert_eq!(backend.live_events(), 1);
    assert_eq!(a.stats().active_bytes[ALL].current, 2 * KIB);
    backend.complete_stream(2);
    let t = a.malloc(1000, 0).unwrap();
    assert_eq!(backend.live_events(), 0);
    assert_eq!(
        a.stats().active_bytes[ALL].current,
        2 * KIB,
        "r and t; p is free"
    );
    for ptr in [r, t] {
        a.free(ptr).unwrap();
    }
    a.release_pool(graph).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn empty_cache_after_a_capture_records_and_waits_for_the_deferred_events() {
    let (mut a, backend) = allocator(1 << 30);
    let graph = (1, 0);
    a.begin_allocate_to_pool(graph, Route::Stream(1)).unwrap();
    let p = a.malloc(1000, 1).unwrap();
    a.record_stream(p, 2).unwrap();
    a.free(p).unwrap();
    a.end_allocate_to_pool(graph).unwrap();
    a.release_pool(graph).unwrap();
    // empty_cache synchronizes: the deferred event is recorded and waited for, then the pool's
    // segment goes and the freeable pool is erased.
    a.empty_cache().unwrap();
    assert_eq!(backend.live_events(), 0);
    let s = a.stats();
    assert_eq!(
        (s.active_bytes[ALL].current, s.reserved_bytes[ALL].current),
        (0, 0)
    );
    assert_eq!(a.pool_use_count(graph), None);
}

#[test]
fn a_filtered_route_takes_what_its_filter_accepts_and_counts_as_a_capture() {
    let (mut a, backend) = allocator(1 << 30);
    let graph = (2, 0);
    // A graph's filter: streams 4 and 5 are being captured.
    let filter: super::pools::StreamFilter = Arc::new(|stream| stream == 4 || stream == 5);
    let route = Route::Filter {
        accepts: filter,
        capture: true,
    };
    a.begin_allocate_to_pool(graph, route).unwrap();
    let p = a.malloc(1000, 4).unwrap();
    let q = a.malloc(1000, 5).unwrap();
    let outside = a.malloc(1000, 0).unwrap();
    assert_eq!(a.pool_segment_count(graph), Some(2), "one per stream");
    // A capture: a stream-used block freed now records no event.
    a.record_stream(p, 9).unwrap();
    a.free(p).unwrap();
    assert_eq!(backend.live_events(), 0);
    let ended = a.end_allocate_to_pool(graph).unwrap();
    assert!(matches!(ended, Route::Filter { capture: true, .. }));
    for ptr in [q, outside] {
        a.free(ptr).unwrap();
    }
    a.check_invariants().unwrap();
}

#[test]
fn a_pools_live_allocations_are_its_own_blocks_handed_out_and_not_freed() {
    let (mut a, backend) = allocator(1 << 30);
    let graph = (1, 0);
    assert_eq!(a.pool_live_allocations(graph), None, "no such pool yet");
    a.begin_allocate_to_pool(graph, Route::Stream(1)).unwrap();
    let p = a.malloc(1000, 1).unwrap();
    let q = a.malloc(3 << 20, 1).unwrap();
    let r = a.malloc(1000, 1).unwrap();
    let elsewhere = a.malloc(1000, 0).unwrap(); // another stream: the default pools
    a.end_allocate_to_pool(graph).unwrap();
    a.create_pool(POOL, false, false).unwrap();
    a.begin_allocate_to_pool(POOL, this_thread()).unwrap();
    let other_pool = a.malloc(1000, 1).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    let mut expected = vec![p, q, r];
    expected.sort_unstable();
    assert_eq!(a.pool_live_allocations(graph), Some(expected));
    assert_eq!(a.pool_live_allocations(POOL), Some(vec![other_pool]));
    // Freed: r at once; p, used by stream 2, waits for its event and is no longer live either.
    a.record_stream(p, 2).unwrap();
    a.free(p).unwrap();
    a.free(r).unwrap();
    assert_eq!(backend.live_events(), 1);
    assert_eq!(a.pool_live_allocations(graph), Some(vec![q]));
    a.free(q).unwrap();
    assert_eq!(a.pool_live_allocations(graph), Some(vec![]));
    backend.complete_stream(2);
    for ptr in [elsewhere, other_pool] {
        a.free(ptr).unwrap();
    }
    a.release_pool(graph).unwrap();
    for _ in 0..2 {
        a.release_pool(POOL).unwrap(); // created and begun: two uses
    }
    a.empty_cache().unwrap();
    assert_eq!(a.pool_live_allocations(graph), None, "released and emptied");
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    a.check_invariants().unwrap();
}

#[test]
fn a_checkpoint_put_back_frees_the_live_blocks_and_hands_out_the_checkpointed_ones() {
    let (mut a, _) = allocator(1 << 30);
    let graph = (1, 0);
    a.begin_allocate_to_pool(graph, Route::Stream(1)).unwrap();
    let first = a.malloc(1000, 1).unwrap(); // 1 KiB of a 2 MiB small segment
    let second = a.malloc(3000, 1).unwrap(); // 3 KiB after it
    let big = a.malloc(5 << 20, 1).unwrap(); // 5 MiB of a 20 MiB large segment
    a.end_allocate_to_pool(graph).unwrap();
    assert_eq!(second, first + 1024);
    let checkpoint = a.pool_checkpoint(graph).unwrap();
    assert_eq!(
        checkpoint.allocations().collect::<Vec<_>>(),
        [(first, 1024), (second, 3072), (big, 5 << 20)]
    );
    assert_eq!(checkpoint.segments.len(), 2);
    assert_eq!(
        checkpoint.segments[0]
            .blocks
            .last()
            .map(|b| (b.size, b.allocated)),
        Some(((2 << 20) - 4096, false))
    );
    // The tree moves on: two blocks go, a new one comes after the checkpointed ones.
    a.free(first).unwrap();
    a.free(big).unwrap();
    a.begin_allocate_to_pool(graph, Route::Stream(1)).unwrap();
    let later = a.malloc(2000, 1).unwrap();
    a.end_allocate_to_pool(graph).unwrap();
    assert_eq!(
        later,
        first + 4096,
        "1 KiB at `first` is too small for 2 KiB"
    );
    let before = a.stats();
    assert_eq!(before.allocated_bytes[ALL].current, 5 * KIB);

    let restored = a.restore_pool_checkpoint(&checkpoint).unwrap();
    assert_eq!(restored.freed, [second, later]);
    assert_eq!(
        restored.allocated,
        [(first, 1024), (second, 3072), (big, 5 << 20)]
    );
    assert_eq!(
        a.pool_live_allocations(graph),
        Some(vec![first, second, big])
    );
    let s = a.stats();
    assert_eq!(s.allocated_bytes[ALL].current, 4 * KIB + 5 * MIB);
    assert_eq!(
        s.requested_bytes[ALL].current,
        4 * KIB + 5 * MIB,
        "each block's size asked for"
    );
    assert_eq!(s.allocation[ALL].current, 3);
    // No segment moved; each segment has one free rest: the inactive splits.
    assert_eq!(s.segment[ALL].current, 2);
    assert_eq!(s.reserved_bytes[ALL].current, 22 * MIB);
    assert_eq!(s.inactive_split[ALL].current, 2);
    assert_eq!(
        s.inactive_split_bytes[ALL].current,
        (2 * MIB - 4 * KIB) + 15 * MIB
    );
    // allocation.allocated: 4 mallocs, then 3 blocks handed out and the 2 rests handed out and freed.
    assert_eq!(
        s.allocation[ALL].allocated,
        before.allocation[ALL].allocated + 5
    );
    assert_eq!(
        a.pool_checkpoint(graph).unwrap(),
        checkpoint,
        "the same layout again"
    );

    // The restored blocks are the caller's: freed as any other.
    for ptr in [first, second, big] {
        a.free(ptr).unwrap();
    }
    assert_eq!(a.stats().allocated_bytes[ALL].current, 0);
    for _ in 0..2 {
        a.release_pool(graph).unwrap(); // begun twice: two uses
    }
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    a.check_invariants().unwrap();
}

#[test]
fn a_checkpoint_that_cannot_be_put_back_is_refused_and_nothing_changes() {
    let (mut a, backend) = allocator(1 << 30);
    let graph = (1, 0);
    a.begin_allocate_to_pool(graph, Route::Stream(1)).unwrap();
    let p = a.malloc(1000, 1).unwrap();
    let q = a.malloc(1000, 1).unwrap();
    a.end_allocate_to_pool(graph).unwrap();
    let checkpoint = a.pool_checkpoint(graph).unwrap();
    let unchanged = |a: &CachingAllocator| {
        (
            a.pool_live_allocations(graph),
            a.stats().allocated_bytes[ALL].current,
            a.stats().allocation[ALL].allocated,
        )
    };
    let before = unchanged(&a);
    let refused = |a: &mut CachingAllocator, checkpoint: &PoolCheckpoint, says: &str| {
        let error = a.restore_pool_checkpoint(checkpoint).unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidArgument);
        assert!(error.to_string().contains(says), "{error}");
    };
    // A segment that is not the pool's as it was.
    let mut moved = checkpoint.clone();
    moved.segments[0].address += 512;
    for block in &mut moved.segments[0].blocks {
        block.ptr += 512;
    }
    refused(&mut a, &moved, "no longer pool (1, 0)'s");
    let mut gapped = checkpoint.clone();
    gapped.segments[0].blocks[1].ptr += 512;
    refused(&mut a, &gapped, "end to end");
    let mut twice = checkpoint.clone();
    twice.segments.push(twice.segments[0].clone());
    refused(&mut a, &twice, "twice");
    let mut other_pool = checkpoint.clone();
    other_pool.pool = (7, 0);
    refused(&mut a, &other_pool, "does not exist");
    assert_eq!(unchanged(&a), before);
    // A block used by another stream: its free would wait for that stream.
    a.record_stream(q, 2).unwrap();
    refused(&mut a, &checkpoint, "used by other streams");
    assert_eq!(unchanged(&a), before);
    // Freed, it waits for the stream's event: neither checkpoint nor restore.
    a.free(q).unwrap();
    assert_eq!(backend.live_events(), 1);
    let waits = a.pool_checkpoint(graph).unwrap_err();
    assert!(
        waits.to_string().contains("waits for another stream"),
        "{waits}"
    );
    refused(&mut a, &checkpoint, "waits for another stream");
    backend.complete_stream(2);
    let elsewhere = a.malloc(1000, 0).unwrap(); // a request takes the event: q's block is free
    a.free(elsewhere).unwrap();
    // Now it goes back: q is live again.
    let restored = a.restore_pool_checkpoint(&checkpoint).unwrap();
    assert_eq!(restored.freed, [p]);
    assert_eq!(a.pool_live_allocations(graph), Some(vec![p, q]));
    // Released (no use left), the pool takes no checkpoint back.
    for ptr in [p, q] {
        a.free(ptr).unwrap();
    }
    a.release_pool(graph).unwrap();
    refused(&mut a, &checkpoint, "was released");
    a.empty_cache().unwrap();
    refused(&mut a, &checkpoint, "does not exist");
    a.check_invariants().unwrap();
}

/// Whatever a graph pool's program does (requests, frees, checkpoints taken and put back, with
/// ordinary and expandable segments, with the default pools busy beside it), a checkpoint put back
/// leaves exactly its blocks live in the pool, and a refused one changes nothing; the invariants'
/// recount holds after every step and the books come back to zero.
fn checkpoints_keep_the_books(settings: &str, by_thread: bool, ops: &[(u8, usize, usize)]) {
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 32));
    let config = super::settings::parse_settings(settings, &CachingConfig::default()).unwrap();
    let mut a = CachingAllocator::new(backend, 0, config).unwrap();
    let graph = (1, 0);
    // Routed by stream (a capture, begun throughout: no trimming) or by thread (use_mem_pool, begun
    // for each of its requests: the trim line may unmap a pool's free pages, and a checkpoint of
    // them is then refused).
    let mut uses = 1;
    let route = || {
        if by_thread {
            this_thread()
        } else {
            Route::Stream(1)
        }
    };
    a.begin_allocate_to_pool(graph, route()).unwrap();
    if by_thread {
        a.end_allocate_to_pool(graph).unwrap();
    }
    let (mut in_pool, mut outside): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut checkpoints: Vec<PoolCheckpoint> = Vec::new();
    for &(op, size, pick) in ops {
        match op % 6 {
            0 | 1 if by_thread => {
                a.begin_allocate_to_pool(graph, route()).unwrap();
                uses += 1;
                in_pool.push(a.malloc(size, 1).unwrap());
                a.end_allocate_to_pool(graph).unwrap();
            }
            0 | 1 => in_pool.push(a.malloc(size, 1).unwrap()),
            2 => outside.push(a.malloc(size, 0).unwrap()),
            3 if !in_pool.is_empty() => {
                let ptr = in_pool.swap_remove(pick % in_pool.len());
                a.free(ptr).unwrap();
            }
            3 if !outside.is_empty() => {
                let ptr = outside.swap_remove(pick % outside.len());
                a.free(ptr).unwrap();
            }
            4 => {
                let checkpoint = a.pool_checkpoint(graph).unwrap();
                let mut live = in_pool.clone();
                live.sort_unstable();
                let held: Vec<usize> = checkpoint.allocations().map(|(ptr, _)| ptr).collect();
                assert_eq!(held, live, "a checkpoint holds the pool's live blocks");
                checkpoints.push(checkpoint);
            }
            5 if !checkpoints.is_empty() => {
                let checkpoint = &checkpoints[pick % checkpoints.len()];
                let before = (a.stats(), a.pool_live_allocations(graph));
                match a.restore_pool_checkpoint(checkpoint) {
                    Ok(restored) => {
                        let mut freed = in_pool.clone();
                        freed.sort_unstable();
                        assert_eq!(restored.freed, freed);
                        in_pool = checkpoint.allocations().map(|(ptr, _)| ptr).collect();
                        in_pool.sort_unstable();
                        assert_eq!(a.pool_live_allocations(graph), Some(in_pool.clone()));
                        // The checkpointed segments as they were; those made since, wholly free.
                        let now = a.pool_checkpoint(graph).unwrap();
                        for segment in &now.segments {
                            match checkpoint
                                .segments
                                .iter()
                                .find(|s| s.address == segment.address)
                            {
                                // Its blocks again, and free space after them where it grew.
                                Some(then) => {
                                    let n = then.blocks.len();
                                    assert_eq!(segment.blocks[..n - 1], then.blocks[..n - 1]);
                                    let (last, was) = (segment.blocks[n - 1], then.blocks[n - 1]);
                                    assert_eq!(
                                        (last.ptr, last.allocated),
                                        (was.ptr, was.allocated)
                                    );
                                    assert!(
                                        last.size == was.size
                                            || !last.allocated && segment.blocks.len() == n
                                    );
                                    assert!(
                                        segment.blocks.len() <= n + 1
                                            && segment.blocks[n..].iter().all(|b| !b.allocated)
                                    );
                                }
                                None => assert!(
                                    segment.blocks.iter().all(|b| !b.allocated)
                                        && segment.blocks.len() == 1,
                                    "{segment:?}"
                                ),
                            }
                        }
                        assert!(checkpoint
                            .segments
                            .iter()
                            .all(|s| now.segments.iter().any(|n| n.address == s.address)));
                    }
                    Err(error) => {
                        assert_eq!(error.kind, ErrorKind::InvalidArgument, "{error}");
                        assert_eq!(
                            (a.stats(), a.pool_live_allocations(graph)),
                            before,
                            "{error}"
                        );
                    }
                }
            }
            _ => {}
        }
        a.check_invariants().unwrap();
    }
    for ptr in in_pool.into_iter().chain(outside) {
        a.free(ptr).unwrap();
    }
    if !by_thread {
        a.end_allocate_to_pool(graph).unwrap();
    }
    for _ in 0..uses {
        a.release_pool(graph).unwrap();
    }
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!(
        (
            s.allocated_bytes[ALL].current,
            s.reserved_bytes[ALL].current
        ),
        (0, 0)
    );
    a.check_invariants().unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    #[test]
    fn checkpoints_put_back_keep_the_books(
        settings in proptest::sample::select(vec![
            "",
            "expandable_segments:True",
            "expandable_segments:True,expandable_trim:True,expandable_trim_slack:0",
        ]),
        by_thread in proptest::prelude::any::<bool>(),
        ops in proptest::collection::vec((0u8..6, 1usize..(24 << 20), 0usize..1000), 1..80),
    ) {
        checkpoints_keep_the_books(settings, by_thread, &ops);
    }
}
