//! The default policy's statistics, worked out by hand from REFERENCE.md's precise rules.

use super::*;
use crate::backend::simulated::SimulatedBackend;
use crate::error::ErrorKind;
use std::sync::Arc;

const KIB: i64 = 1024;
const MIB: i64 = 1024 * 1024;
const ALL: usize = StatType::All as usize;
const SMALL: usize = StatType::SmallPool as usize;
const LARGE: usize = StatType::LargePool as usize;

fn allocator(capacity: usize) -> (CachingAllocator, Arc<SimulatedBackend>) {
    allocator_with(capacity, CachingConfig::default())
}

fn allocator_with(
    capacity: usize,
    config: CachingConfig,
) -> (CachingAllocator, Arc<SimulatedBackend>) {
    let backend = Arc::new(SimulatedBackend::new(1, capacity));
    let allocator = CachingAllocator::new(backend.clone(), 0, config).unwrap();
    (allocator, backend)
}

fn stat(current: i64, peak: i64, allocated: i64, freed: i64) -> Stat {
    Stat {
        current,
        peak,
        allocated,
        freed,
    }
}

#[test]
fn small_request_splits_a_2mib_segment_and_merges_back() {
    let (mut a, _) = allocator(1 << 30);
    let p = a.malloc(1000, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.allocated_bytes[ALL], stat(1024, 1024, 1024, 0));
    assert_eq!(s.allocated_bytes[SMALL], stat(1024, 1024, 1024, 0));
    assert_eq!(s.allocated_bytes[LARGE], Stat::default());
    assert_eq!(s.requested_bytes[ALL], stat(1000, 1000, 1000, 0));
    assert_eq!(s.reserved_bytes[SMALL], stat(2 * MIB, 2 * MIB, 2 * MIB, 0));
    assert_eq!(s.segment[SMALL], stat(1, 1, 1, 0));
    assert_eq!(s.inactive_split[SMALL], stat(1, 1, 1, 0));
    assert_eq!(s.inactive_split_bytes[SMALL].current, 2 * MIB - KIB);
    assert_eq!(s.num_device_alloc, 1);
    assert_eq!(s.max_split_size, -1);

    a.free(p).unwrap();
    let s = a.stats();
    assert_eq!(s.allocated_bytes[ALL], stat(0, 1024, 1024, 1024));
    assert_eq!(s.active[ALL], stat(0, 1, 1, 1));
    assert_eq!(s.requested_bytes[ALL], stat(0, 1000, 1000, 1000));
    assert_eq!(s.inactive_split[ALL], stat(0, 1, 1, 1));
    assert_eq!(
        s.inactive_split_bytes[ALL],
        stat(0, 2 * MIB - KIB, 2 * MIB - KIB, 2 * MIB - KIB)
    );
    assert_eq!(
        s.reserved_bytes[ALL].current,
        2 * MIB,
        "the segment stays cached"
    );

    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!(s.reserved_bytes[ALL], stat(0, 2 * MIB, 2 * MIB, 2 * MIB));
    assert_eq!(s.segment[SMALL], stat(0, 1, 1, 1));
    assert_eq!((s.num_device_free, s.num_sync_all_streams), (1, 1));
}

#[test]
fn inactive_split_moves_by_net_change() {
    let (mut a, _) = allocator(1 << 30);
    let first = a.malloc(1000, 0).unwrap();
    let second = a.malloc(600, 0).unwrap();
    assert_eq!(second, first + 1024, "the remainder is cut from its start");
    let s = a.stats();
    // The second request shrinks an already split block: bytes drop by 1024, the count stays.
    assert_eq!(s.inactive_split[SMALL], stat(1, 1, 1, 0));
    assert_eq!(
        s.inactive_split_bytes[SMALL],
        stat(2 * MIB - 2 * KIB, 2 * MIB - KIB, 2 * MIB - KIB, KIB)
    );
    assert_eq!(s.num_device_alloc, 1);

    a.free(first).unwrap();
    let s = a.stats();
    // Its neighbour is live: no merge, one more inactive split block.
    assert_eq!(s.inactive_split[SMALL], stat(2, 2, 2, 0));
    assert_eq!(s.inactive_split_bytes[SMALL].current, 2 * MIB - KIB);

    a.free(second).unwrap();
    let s = a.stats();
    // Merging both neighbours leaves a whole segment: net -2 blocks, -(2 MiB - 1024) bytes.
    assert_eq!(s.inactive_split[SMALL], stat(0, 2, 2, 2));
    assert_eq!(
        s.inactive_split_bytes[SMALL],
        stat(0, 2 * MIB - KIB, 2 * MIB, 2 * MIB)
    );
    assert_eq!(s.active_bytes[SMALL], stat(0, 2 * KIB, 2 * KIB, 2 * KIB));
    assert_eq!(s.requested_bytes[SMALL], stat(0, 1600, 1600, 1600));
    assert_eq!(a.segments().len(), 1);
    let blocks = &a.segments()[0].blocks;
    assert_eq!(blocks.len(), 1);
    assert_eq!(
        (blocks[0].address, blocks[0].size, blocks[0].state),
        (first, 2 << 20, BlockState::Inactive)
    );
}

#[test]
fn merging_one_neighbour_of_a_still_split_block_leaves_the_count() {
    let (mut a, _) = allocator(1 << 30);
    let x = a.malloc(512, 0).unwrap();
    let y = a.malloc(512, 0).unwrap();
    let _z = a.malloc(512, 0).unwrap();
    a.free(x).unwrap();
    let before = a.stats();
    assert_eq!(before.inactive_split[SMALL].current, 2);
    // y merges with x (free) but z is live: net blocks 0, net bytes +512.
    a.free(y).unwrap();
    let s = a.stats();
    assert_eq!(
        s.inactive_split[SMALL], before.inactive_split[SMALL],
        "no movement at all for net 0"
    );
    assert_eq!(
        s.inactive_split_bytes[SMALL].allocated,
        before.inactive_split_bytes[SMALL].allocated + 512
    );
}

#[test]
fn large_requests_follow_the_segment_bands() {
    let (mut a, _) = allocator(1 << 30);
    // 11 MiB: a 12 MiB segment; the 1 MiB remainder is not > 1 MiB, so the caller gets all 12 MiB.
    let q = a.malloc(11 * MIB as usize, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.reserved_bytes[LARGE].current, 12 * MIB);
    assert_eq!(s.allocated_bytes[LARGE].current, 12 * MIB);
    assert_eq!(s.requested_bytes[LARGE].current, 11 * MIB);
    assert_eq!(s.inactive_split[LARGE].current, 0);

    // 5 MiB: a 20 MiB segment, split with a 15 MiB remainder.
    let p = a.malloc(5 * MIB as usize, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.reserved_bytes[LARGE].current, 32 * MIB);
    assert_eq!(s.allocated_bytes[LARGE].current, 17 * MIB);
    assert_eq!(s.inactive_split_bytes[LARGE].current, 15 * MIB);
    assert_eq!(s.segment[LARGE].current, 2);

    // 3 MiB fits the cached 15 MiB remainder: best fit, no new segment.
    let r = a.malloc(3 * MIB as usize, 0).unwrap();
    assert_eq!(r, p + (5 << 20));
    assert_eq!(a.stats().num_device_alloc, 2);
    assert_eq!(a.stats().inactive_split_bytes[LARGE].current, 12 * MIB);
    a.free(q).unwrap();
    a.free(p).unwrap();
    a.free(r).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    assert_eq!(a.stats().num_device_free, 2);
}

#[test]
fn best_fit_picks_the_smallest_block_that_fits() {
    let (mut a, _) = allocator(1 << 30);
    let big = a.malloc(12 * MIB as usize, 0).unwrap(); // 12 MiB segment
    let small = a.malloc(10 * MIB as usize, 0).unwrap(); // 10 MiB segment
    a.free(big).unwrap();
    a.free(small).unwrap();
    assert_eq!(a.malloc(10 * MIB as usize - 4096, 0).unwrap(), small);
    assert_eq!(a.malloc(11 * MIB as usize, 0).unwrap(), big);
    assert_eq!(a.stats().num_device_alloc, 2);
}

#[test]
fn blocks_are_reused_only_on_their_stream() {
    let (mut a, _) = allocator(1 << 30);
    let p = a.malloc(1000, 1).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(1000, 2).unwrap();
    assert_ne!(p, q);
    assert_eq!(a.stats().num_device_alloc, 2);
    a.free(q).unwrap();
    assert_eq!(a.malloc(1000, 1).unwrap(), p);
}

#[test]
fn device_oom_releases_cache_and_retries_once() {
    let (mut a, backend) = allocator(40 << 20);
    let p = a.malloc(15 * MIB as usize, 0).unwrap(); // a 16 MiB segment
    a.free(p).unwrap();
    // 30 MiB does not fit beside the cached 16 MiB: release it, retry, succeed.
    let q = a.malloc(30 * MIB as usize, 0).unwrap();
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams),
        (1, 0, 1)
    );
    assert_eq!((s.num_device_alloc, s.num_device_free), (2, 1));
    assert_eq!(
        s.reserved_bytes[ALL],
        stat(30 * MIB, 30 * MIB, 46 * MIB, 16 * MIB)
    );

    // A second 30 MiB cannot be had at all.
    let err = a.malloc(30 * MIB as usize, 0).unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutOfMemory);
    assert_eq!(
        err.message,
        "test out of memory. Tried to allocate 30.00 MiB. Device 0 has a total capacity of 40.00 MiB of \
         which 10.00 MiB is free. Of the allocated memory 30.00 MiB is allocated by the allocator, and 0 \
         bytes is reserved but unallocated. If reserved but unallocated memory is large try setting \
         expandable_segments:True in ACCALLOC_CONF to avoid fragmentation."
    );
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams),
        (2, 1, 2)
    );
    assert_eq!(s.allocation[ALL].current, 1);
    assert_eq!(backend.live_segments(0).len(), 1);
    a.free(q).unwrap();
}

#[test]
fn oom_figure_is_the_segment_size_not_the_request() {
    let (mut a, backend) = allocator(64 << 20);
    backend.fail_next_allocs(0, 2);
    let err = a.malloc(1000, 0).unwrap_err();
    assert!(
        err.message.contains("Tried to allocate 2.00 MiB."),
        "{}",
        err.message
    );
    assert_eq!(a.stats().num_ooms, 1);
    assert_eq!(a.stats().num_alloc_retries, 1);
}

#[test]
fn a_request_larger_than_the_device_counts_an_oom_and_changes_nothing_else() {
    let (mut a, _) = allocator(40 << 20);
    let p = a.malloc(1000, 0).unwrap();
    a.free(p).unwrap();
    let before = a.stats();
    for size in [1usize << 40, usize::MAX, usize::MAX - 511] {
        let err = a.malloc(size, 0).unwrap_err();
        assert_eq!(err.kind, ErrorKind::OutOfMemory);
        assert!(err.message.contains("Tried to allocate"), "{}", err.message);
    }
    assert!(a
        .malloc(1 << 40, 0)
        .unwrap_err()
        .message
        .contains("Tried to allocate 1024.00 GiB."));
    // Four refusals, each an OOM as PyTorch counts it; no retry, no release.
    let after = a.stats();
    assert_eq!(after.num_ooms, before.num_ooms + 4);
    assert_eq!(
        DeviceStats {
            num_ooms: before.num_ooms,
            ..after
        },
        before,
        "the cached segment and every other counter are untouched"
    );
}

#[test]
fn the_memory_fraction_reads_back_as_the_bytes_allowed_over_the_total() {
    let (mut a, _backend) = allocator(40 << 20);
    assert_eq!(a.memory_fraction(), 1.0, "none set");
    a.set_memory_fraction(0.5).unwrap();
    assert_eq!(a.memory_fraction(), 0.5);
    // 0.3 of 41943040 bytes: 12582912 allowed, and 12582912 / 41943040 read back.
    a.set_memory_fraction(0.3).unwrap();
    assert_eq!(a.allowed_maximum(), Some(12_582_912));
    assert_eq!(a.memory_fraction(), 12_582_912.0 / 41_943_040.0);
    assert!(a.set_memory_fraction(-0.5).is_err());
    assert_eq!(
        a.memory_fraction(),
        12_582_912.0 / 41_943_040.0,
        "a refused one leaves it"
    );
    a.set_memory_fraction(0.0).unwrap();
    assert_eq!(a.memory_fraction(), 0.0);
    a.set_memory_fraction(1.0).unwrap();
    assert_eq!(a.memory_fraction(), 1.0);
}

#[test]
fn memory_fraction_caps_reserved_memory_without_asking_the_device() {
    let (mut a, backend) = allocator(40 << 20);
    a.set_memory_fraction(0.5).unwrap();
    assert_eq!(a.allowed_maximum(), Some(20 << 20));
    let p = a.malloc(2 * MIB as usize, 0).unwrap(); // 20 MiB segment: exactly the allowance
                                                    // 19 MiB does not fit the 18 MiB remainder, and a new 20 MiB segment would pass the allowance.
    let err = a.malloc(19 * MIB as usize, 0).unwrap_err();
    assert!(
        err.message.contains("Tried to allocate 20.00 MiB."),
        "{}",
        err.message
    );
    assert!(
        err.message
            .contains("is free. 20.00 MiB allowed; Of the allocated memory 2.00 MiB"),
        "{}",
        err.message
    );
    assert_eq!(
        backend.alloc_calls(0),
        1,
        "the device was never asked for more"
    );
    assert_eq!(a.stats().num_ooms, 1);
    a.free(p).unwrap();
    assert!(a.set_memory_fraction(1.5).is_err());
    assert!(a.set_memory_fraction(f64::NAN).is_err());
    assert_eq!(
        a.allowed_maximum(),
        Some(20 << 20),
        "a rejected fraction leaves the old one"
    );
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let config = CachingConfig {
        max_split_size: 20 << 20,
        ..CachingConfig::default()
    };
    let (mut a, _) = allocator_with(1 << 30, config);
    let big = a.malloc(30 * MIB as usize, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.oversize_allocations, stat(1, 1, 1, 0));
    assert_eq!(s.oversize_segments, stat(1, 1, 1, 0));
    assert_eq!(s.max_split_size, 20 * MIB);
    a.free(big).unwrap();
    assert_eq!(a.stats().oversize_allocations, stat(0, 1, 1, 1));

    // A small request may not take the oversize block.
    let p = a.malloc(5 * MIB as usize, 0).unwrap();
    assert_ne!(p, big);
    assert_eq!(a.stats().num_device_alloc, 2);
    // 25 MiB may take the 30 MiB block (30 < 25 + 20), whole.
    let q = a.malloc(25 * MIB as usize, 0).unwrap();
    assert_eq!(q, big);
    assert_eq!(a.stats().allocated_bytes[LARGE].current, 35 * MIB);
    a.free(q).unwrap();
    // 8 MiB is below max_split_size, and 10 MiB + 20 MiB rounding... a 50 MiB request may not take it.
    let r = a.malloc(50 * MIB as usize, 0).unwrap();
    assert_ne!(r, big);
    a.free(p).unwrap();
    a.free(r).unwrap();
}

#[test]
fn oversize_blocks_are_freed_before_the_full_retry() {
    let config = CachingConfig {
        max_split_size: 20 << 20,
        ..CachingConfig::default()
    };
    let (mut a, _) = allocator_with(64 << 20, config);
    let x = a.malloc(30 * MIB as usize, 0).unwrap();
    let y = a.malloc(30 * MIB as usize, 0).unwrap();
    a.free(x).unwrap();
    a.free(y).unwrap();
    // 50 MiB: no block is big enough and the device is full; both oversize blocks go, then it fits.
    a.malloc(50 * MIB as usize, 0).unwrap();
    let s = a.stats();
    assert_eq!(
        (
            s.num_alloc_retries,
            s.num_sync_all_streams,
            s.num_device_free
        ),
        (0, 0, 2)
    );
    assert_eq!(s.oversize_segments, stat(1, 2, 3, 2));
}

#[test]
fn bad_frees_are_reported_and_change_nothing() {
    let (mut a, _) = allocator(1 << 30);
    let p = a.malloc(4096, 0).unwrap();
    let before = a.stats();
    for bad in [p + 512, 0x1234, p + 4096] {
        let err = a.free(bad).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidPointer);
    }
    assert_eq!(a.stats(), before);
    a.free(p).unwrap();
    let after = a.stats();
    assert_eq!(
        a.free(p).unwrap_err().kind,
        ErrorKind::InvalidPointer,
        "double free"
    );
    assert_eq!(a.stats(), after);
}

#[test]
fn resets_touch_only_what_they_name() {
    let (mut a, _) = allocator(1 << 30);
    let p = a.malloc(3000, 0).unwrap();
    let q = a.malloc(3000, 0).unwrap();
    a.free(q).unwrap();
    a.reset_peak_stats();
    let s = a.stats();
    assert_eq!(s.allocated_bytes[ALL], stat(3072, 3072, 6144, 3072));
    a.reset_accumulated_stats();
    let s = a.stats();
    assert_eq!(s.allocated_bytes[ALL], stat(3072, 3072, 0, 0));
    assert_eq!((s.num_device_alloc, s.num_device_free), (0, 0));
    assert_eq!(s.segment[ALL].current, 1);
    a.free(p).unwrap();
}

#[test]
fn release_of_segments_returns_them_to_the_backend() {
    let (mut a, backend) = allocator(1 << 30);
    let ptrs: Vec<usize> = (0..10)
        .map(|i| a.malloc((i + 1) << 20, 0).unwrap())
        .collect();
    for p in ptrs {
        a.free(p).unwrap();
    }
    assert!(!backend.live_segments(0).is_empty());
    a.empty_cache().unwrap();
    assert!(backend.live_segments(0).is_empty());
    assert_eq!(backend.alloc_calls(0), backend.free_calls(0));
    let s = a.stats();
    assert_eq!(s.num_device_alloc, s.num_device_free);
}

#[test]
fn a_block_used_by_another_stream_waits_for_its_event() {
    let (mut a, backend) = allocator(1 << 30);
    let p = a.malloc(1000, 1).unwrap();
    a.record_stream(p, 2).unwrap();
    a.record_stream(p, 2).unwrap(); // a second use of the same stream needs no second event
    a.free(p).unwrap();
    let s = a.stats();
    // Freed for the caller, still active for the allocator.
    assert_eq!(
        (s.allocation[ALL].current, s.allocated_bytes[ALL].current),
        (0, 0)
    );
    assert_eq!(
        (s.active[ALL].current, s.active_bytes[ALL].current),
        (1, 1024)
    );
    assert_eq!(s.requested_bytes[ALL].current, 1000);
    assert_eq!(backend.live_events(), 1);
    let pending = a.segments()[0].blocks[0];
    assert_eq!(
        (
            pending.address,
            pending.size,
            pending.requested_size,
            pending.state
        ),
        (p, 1024, 1000, BlockState::ActivePendingFree),
        "pending blocks stay in their segment"
    );

    // Not reusable while the event is pending: the same request gets the rest of the segment.
    let q = a.malloc(1000, 1).unwrap();
    assert_eq!(q, p + 1024);
    a.free(q).unwrap();
    // q merges with the free remainder after it but not with pending p before it: still one
    // inactive split block (pending p is not counted until it returns).
    assert_eq!(a.stats().inactive_split[SMALL].current, 1);
    assert_eq!(a.segments()[0].blocks.len(), 2);

    backend.complete_stream(2);
    let r = a.malloc(1000, 1).unwrap();
    assert_eq!(
        r, p,
        "after the event completes the block is back, merged and reused"
    );
    assert_eq!(backend.live_events(), 0, "completed events are destroyed");
    let s = a.stats();
    assert_eq!(s.active[ALL].current, 1);
    assert_eq!(s.num_sync_all_streams, 0, "no synchronization was needed");
    a.free(r).unwrap();
}

#[test]
fn uses_on_the_blocks_own_stream_need_no_event() {
    let (mut a, backend) = allocator(1 << 30);
    let p = a.malloc(4096, 3).unwrap();
    a.record_stream(p, 3).unwrap();
    a.free(p).unwrap();
    assert_eq!(backend.live_events(), 0);
    assert_eq!(a.stats().active[ALL].current, 0);
    assert_eq!(
        a.record_stream(p, 4).unwrap_err().kind,
        ErrorKind::InvalidPointer
    );
}

#[test]
fn empty_cache_synchronizes_pending_events_and_releases_their_segments() {
    let (mut a, backend) = allocator(1 << 30);
    let p = a.malloc(5 << 20, 0).unwrap();
    a.record_stream(p, 9).unwrap();
    a.record_stream(p, 8).unwrap();
    a.free(p).unwrap();
    assert_eq!(backend.live_events(), 2);
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!(backend.live_events(), 0);
    assert_eq!((s.num_sync_all_streams, s.num_device_free), (1, 1));
    assert_eq!(
        (s.active[ALL].current, s.reserved_bytes[ALL].current),
        (0, 0)
    );
    assert!(backend.live_segments(0).is_empty());
}

#[test]
fn the_oom_retry_synchronizes_pending_events_first() {
    let (mut a, backend) = allocator(40 << 20);
    let p = a.malloc(30 << 20, 0).unwrap();
    a.record_stream(p, 5).unwrap();
    a.free(p).unwrap();
    // 30 MiB again on another stream: the pending 30 MiB segment must be synchronized and released.
    let q = a.malloc(30 << 20, 1).unwrap();
    let s = a.stats();
    assert_eq!(
        (s.num_sync_all_streams, s.num_alloc_retries, s.num_ooms),
        (1, 1, 0)
    );
    assert_eq!(backend.live_events(), 0);
    assert_eq!(s.reserved_bytes[ALL].current, 30 << 20);
    a.free(q).unwrap();
}

#[test]
fn garbage_collection_frees_the_oldest_cached_segments_without_synchronizing() {
    let config = CachingConfig {
        garbage_collection_threshold: 0.7,
        ..CachingConfig::default()
    };
    let (mut a, _) = allocator_with(100 << 20, config);
    a.set_memory_fraction(0.5).unwrap(); // allowed 50 MiB; collection above 35 MiB reserved
    let first = a.malloc(12 << 20, 0).unwrap(); // lookup 1: a 12 MiB segment
    let _held = a.malloc(12 << 20, 0).unwrap(); // lookup 2: another
    let other = a.malloc(14 << 20, 0).unwrap(); // lookup 3: a 14 MiB segment
    a.free(first).unwrap(); // cached at lookup 3
    a.free(other).unwrap(); // cached at lookup 3
    for _ in 0..3 {
        // Hits refresh the 14 MiB block (cached again at lookups 4, 5, 6); no collection on a hit.
        let t = a.malloc(13 << 20, 0).unwrap();
        assert_eq!(t, other);
        a.free(t).unwrap();
    }
    assert_eq!(a.stats().num_device_free, 0);
    // Lookup 7 misses with 38 MiB reserved > 35 MiB: ages are 4 (12 MiB) and 1 (14 MiB), average
    // 2.5, so only the older block goes, which is enough.
    a.malloc(15 << 20, 0).unwrap();
    let s = a.stats();
    assert_eq!(
        (
            s.num_device_free,
            s.num_sync_all_streams,
            s.num_alloc_retries
        ),
        (1, 0, 0)
    );
    assert_eq!(s.reserved_bytes[ALL].current, (12 + 14 + 16) << 20);
    let segments = a.segments();
    assert!(
        segments.iter().all(|seg| seg.address != first),
        "the old block was released"
    );
    assert!(
        segments.iter().any(|seg| seg.address == other),
        "the young one stays cached"
    );
}

#[test]
fn garbage_collection_needs_a_memory_fraction() {
    let config = CachingConfig {
        garbage_collection_threshold: 0.1,
        ..CachingConfig::default()
    };
    let (mut a, _) = allocator_with(100 << 20, config);
    let p = a.malloc(12 << 20, 0).unwrap();
    a.free(p).unwrap();
    a.malloc(14 << 20, 0).unwrap();
    assert_eq!(
        a.stats().num_device_free,
        0,
        "no fraction set: nothing is collected"
    );
}

#[test]
fn history_records_each_step_when_on_and_nothing_when_off() {
    let (mut a, _) = allocator(40 << 20);
    let p = a.malloc(1000, 0).unwrap();
    a.free(p).unwrap();
    assert!(a.history().is_none(), "off by default");
    a.record_history(true, 100);
    let q = a.malloc(1000, 0).unwrap();
    a.record_stream(q, 4).unwrap();
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    let _ = a.malloc(100 << 20, 0).unwrap_err(); // larger than the device: an OOM entry, nothing else
    let r = a.malloc(30 << 20, 0).unwrap();
    assert!(a.malloc(30 << 20, 0).is_err());
    a.free(r).unwrap();
    let actions: Vec<&str> = a
        .history()
        .unwrap()
        .entries()
        .map(|e| e.action.name())
        .collect();
    assert_eq!(
        actions,
        [
            "alloc",
            "free_requested",
            "free_completed",
            "segment_free", // q, then empty_cache
            "oom",          // 100 MiB on a 40 MiB device
            "segment_alloc",
            "alloc", // r
            "oom",
            "free_requested",
            "free_completed",
        ]
    );
    let alloc = a.history().unwrap().entries().next().copied().unwrap();
    assert_eq!(
        (alloc.addr, alloc.size),
        (q, 1000),
        "entries carry the requested size"
    );
    a.record_history(false, 0);
    assert!(a.history().is_none());
}

#[test]
fn an_oom_entry_carries_the_rounded_request_and_the_message_the_segment_size() {
    let (mut a, _) = allocator(40 << 20);
    let live = a.malloc(30 << 20, 0).unwrap();
    a.record_history(true, 10);
    // 9 MiB + 1 rounds to 9 MiB + 512 and needs a 20 MiB segment: 30 + 20 > 40.
    let err = a.malloc((9 << 20) + 1, 0).unwrap_err();
    assert!(
        err.message.contains("Tried to allocate 20.00 MiB"),
        "{}",
        err.message
    );
    let oom = a
        .history()
        .unwrap()
        .entries()
        .find(|e| e.action.name() == "oom")
        .copied()
        .unwrap();
    assert_eq!(
        oom.size,
        (9 << 20) + 512,
        "PyTorch's entry has params.size()"
    );
    a.free(live).unwrap();
}

fn expandable() -> CachingConfig {
    CachingConfig {
        expandable_segments: true,
        ..CachingConfig::default()
    }
}

#[test]
fn expandable_segments_grow_in_place_page_by_page() {
    let (mut a, backend) = allocator_with(1 << 30, expandable());
    let first = a.malloc(5 << 20, 0).unwrap();
    let s = a.stats();
    // One 20 MiB page mapped; no segment counted; the remainder is not an inactive split.
    assert_eq!(
        (s.reserved_bytes[LARGE].current, s.num_device_alloc),
        (20 * MIB, 1)
    );
    assert_eq!(
        (s.segment[ALL].current, s.inactive_split[ALL].current),
        (0, 0)
    );
    assert_eq!(
        backend.alloc_calls(0),
        0,
        "no ordinary segment was asked for"
    );

    // 30 MiB: the free 15 MiB after `first` plus one more page, right after it.
    let second = a.malloc(30 << 20, 0).unwrap();
    assert_eq!(second, first + (5 << 20), "the segment grew in place");
    let s = a.stats();
    assert_eq!(
        (s.reserved_bytes[ALL].current, s.num_device_alloc),
        (40 * MIB, 2)
    );
    assert_eq!(s.allocated_bytes[ALL].current, 35 * MIB);
    assert_eq!(backend.mapped_bytes(0), 40 << 20);

    let segments = a.segments();
    assert_eq!(segments.len(), 1, "one contiguous mapped range");
    assert!(segments[0].is_expandable);
    assert_eq!(segments[0].total_size, 40 << 20);

    a.free(first).unwrap();
    a.free(second).unwrap();
    assert_eq!(a.stats().inactive_split[ALL], Stat::default());
    a.empty_cache().unwrap();
    let s = a.stats();
    // Both pages were wholly free: unmapped in one call.
    assert_eq!(
        (
            s.reserved_bytes[ALL].current,
            s.num_device_free,
            s.num_sync_all_streams
        ),
        (0, 1, 1)
    );
    assert_eq!(backend.mapped_bytes(0), 0);
    assert!(a.segments().is_empty());

    // The reservation held nothing any more: empty_cache gave it back too. The next request
    // reserves a new range and is served from its start.
    assert_eq!(backend.live_reservations(0), 0);
    let again = a.malloc(1 << 20 | 4096, 0).unwrap();
    assert_eq!(backend.live_reservations(0), 1);
    assert_eq!(a.segments()[0].address, again);
}

#[test]
fn expandable_small_pool_maps_2mib_pages_and_streams_get_their_own_range() {
    let (mut a, _) = allocator_with(1 << 30, expandable());
    let p = a.malloc(1000, 0).unwrap();
    let q = a.malloc(1000, 0).unwrap();
    assert_eq!(q, p + 1024);
    assert_eq!(a.stats().reserved_bytes[SMALL].current, 2 * MIB);
    let r = a.malloc(1000, 7).unwrap();
    assert!(
        r.abs_diff(p) >= 1 << 30,
        "another stream reserves its own range"
    );
    assert_eq!(a.stats().reserved_bytes[SMALL].current, 4 * MIB);
}

#[test]
fn expandable_out_of_memory_unmaps_wholly_free_pages_before_the_retry() {
    let (mut a, _) = allocator_with(40 << 20, expandable());
    let p = a.malloc(5 << 20, 0).unwrap(); // page 0: p, then 15 MiB free
    let q = a.malloc(20 << 20, 0).unwrap(); // the free 15 MiB and 5 MiB of page 1
                                            // 30 MiB needs a third page: no room, and no free page to give back (page 1 is partly used).
    let err = a.malloc(30 << 20, 0).unwrap_err();
    assert!(
        err.message.contains("Tried to allocate 30.00 MiB"),
        "{}",
        err.message
    );
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_device_free),
        (1, 1, 0)
    );
    assert_eq!(s.reserved_bytes[ALL].current, 40 * MIB);

    // With q freed, page 1 is wholly free: the retry unmaps it, and stream 1 gets its page.
    a.free(q).unwrap();
    let r = a.malloc(15 << 20, 1).unwrap();
    let s = a.stats();
    assert_eq!(
        (
            s.num_alloc_retries,
            s.num_ooms,
            s.num_device_free,
            s.num_device_alloc
        ),
        (2, 1, 1, 3)
    );
    assert_eq!(s.reserved_bytes[ALL].current, 40 * MIB);
    assert_eq!(a.stats().inactive_split[ALL].current, 0);
    a.free(p).unwrap();
    a.free(r).unwrap();
}

#[test]
fn expandable_segments_fall_back_without_virtual_memory() {
    let backend = Arc::new(SimulatedBackend::without_virtual_memory(1, 1 << 30));
    let mut a = CachingAllocator::new(backend.clone(), 0, expandable()).unwrap();
    a.malloc(5 << 20, 0).unwrap();
    let s = a.stats();
    assert_eq!(
        (s.segment[ALL].current, s.reserved_bytes[ALL].current),
        (1, 20 * MIB)
    );
    assert_eq!(backend.alloc_calls(0), 1);
    // Off means off, as PyTorch's expandable_segments() answers false without them: 25 MiB takes a
    // 26 MiB segment, and the 1 MiB left is not split off (the ordinary rule wants more than 1 MiB
    // left; expandable segments' rule would split at 512 bytes).
    let q = a.malloc(25 << 20, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.reserved_bytes[ALL].current, 46 * MIB);
    assert_eq!(s.allocated_bytes[ALL].current, (5 + 26) * MIB);
    assert_eq!(
        s.inactive_split[ALL].current, 1,
        "only the 5 MiB block's remainder"
    );
    assert!(!a.config().expandable_segments);
    a.free(q).unwrap();
}

/// Trim with the line these tests' figures were worked out for: the most allocated + 1/14, at
/// least + 20 MiB (expandable_trim_floor_mb:20), which here is always the most allocated + 20 MiB:
/// 1/14 of it would be less than 20 MiB.
fn trim() -> CachingConfig {
    CachingConfig {
        expandable_trim: true,
        expandable_trim_slack: 1.0 / 14.0,
        expandable_trim_floor: 20 << 20,
        ..expandable()
    }
}

#[test]
fn expandable_trim_by_default_keeps_a_small_job_under_plain_expandable_segments() {
    // The default line is the most allocated + 5%, no floor. 8 MiB: plain expandable segments map
    // one 20 MiB page of the large pool; trim maps 2 MiB pages, and 5% of 8 MiB is less than one,
    // so nothing ahead: 8 MiB reserved.
    let trimmed = CachingConfig {
        expandable_trim: true,
        ..expandable()
    };
    for (config, reserved) in [(expandable(), 20 * MIB), (trimmed.clone(), 8 * MIB)] {
        let (mut a, backend) = allocator_with(1 << 30, config);
        let p = a.malloc(8 << 20, 0).unwrap();
        assert_eq!(a.stats().reserved_bytes[ALL].current, reserved);
        assert_eq!(backend.mapped_bytes(0) as i64, reserved);
        a.free(p).unwrap();
    }
    // 40 MiB then 2 more: the line is 42 MiB, so the 2 MiB page after the 40 is mapped ahead with
    // them (one call) and serves the next request.
    let (mut a, _) = allocator_with(1 << 30, trimmed);
    let p = a.malloc(40 << 20, 0).unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 42 * MIB);
    let q = a.malloc(2 << 20, 0).unwrap();
    assert_eq!(q, p + (40 << 20));
    let s = a.stats();
    assert_eq!(
        (s.num_device_alloc, s.reserved_bytes[ALL].peak),
        (1, 42 * MIB)
    );
    a.free(p).unwrap();
    a.free(q).unwrap();
}

#[test]
fn expandable_trim_unmaps_free_pages_before_growing() {
    let (mut a, backend) = allocator_with(1 << 30, trim());
    // 28 MiB: the line is 48 MiB, so 20 MiB more are mapped ahead: [0, 48) in one call.
    let p = a.malloc(28 << 20, 0).unwrap();
    let q = a.malloc(20 << 20, 0).unwrap();
    assert_eq!(q, p + (28 << 20), "the 20 MiB mapped ahead");
    assert_eq!(a.stats().reserved_bytes[ALL].current, 48 * MIB);
    // 28 MiB of free pages before q.
    a.free(p).unwrap();
    // 30 MiB: the line is 50 + 20 = 70 MiB; 48 + 30 passes it by 8, so p's 28 MiB are unmapped
    // first (the smallest free stretch that covers 8), then 30 new MiB are mapped after q.
    let r = a.malloc(30 << 20, 0).unwrap();
    assert_eq!(r, q + (20 << 20));
    let s = a.stats();
    assert_eq!(
        s.reserved_bytes[ALL].current,
        50 * MIB,
        "20 + 30 MiB, not 28 + 20 + 30"
    );
    assert_eq!(s.reserved_bytes[ALL].peak, 50 * MIB);
    assert_eq!((s.num_device_free, s.num_device_alloc), (1, 2));
    assert_eq!(backend.mapped_bytes(0), 50 << 20);
}

#[test]
fn a_map_that_fails_half_way_and_cannot_be_undone_keeps_its_pages_counted() {
    // A 6 MiB request maps its 2 MiB pages one call each: the second fails, and the device refuses
    // to unmap the first again. The request fails; the page the device kept is counted (reserved,
    // a free block the next request uses) and empty_cache gives it back.
    let (mut a, backend) = allocator_with(1 << 30, trim());
    backend.fail_calls_after("vm_map", 1, 1);
    backend.fail_calls("vm_unmap", 1);
    let error = a.malloc(6 << 20, 0).unwrap_err();
    assert!(error.to_string().contains("vm_unmap"), "{error}");
    assert_eq!(backend.mapped_bytes(0), 2 << 20);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 2 * MIB);
    a.check_invariants().unwrap();
    let p = a.malloc(6 << 20, 0).unwrap();
    assert_eq!(
        backend.mapped_bytes(0) as i64,
        a.stats().reserved_bytes[ALL].current
    );
    a.check_invariants().unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    assert_eq!(backend.mapped_bytes(0), 0);
}

#[test]
fn a_trim_the_device_refuses_does_not_fail_the_request() {
    // expandable_trim_unmaps_free_pages_before_growing, with the device refusing the unmap of p's
    // 28 MiB: they stay mapped and counted, and r is served all the same, 30 MiB after q.
    let (mut a, backend) = allocator_with(1 << 30, trim());
    let p = a.malloc(28 << 20, 0).unwrap();
    let q = a.malloc(20 << 20, 0).unwrap();
    a.free(p).unwrap();
    backend.fail_calls("vm_unmap", 1);
    let r = a.malloc(30 << 20, 0).unwrap();
    assert_eq!(r, q + (20 << 20));
    let s = a.stats();
    assert_eq!(s.reserved_bytes[ALL].current, 78 * MIB, "28 + 20 + 30 MiB");
    assert_eq!(backend.mapped_bytes(0), 78 << 20);
    assert_eq!((s.num_device_free, s.num_device_alloc), (0, 2));
    a.check_invariants().unwrap();
    a.free(q).unwrap();
    a.free(r).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn expandable_trim_keeps_free_pages_while_growth_stays_under_the_line() {
    let (mut a, backend) = allocator_with(1 << 30, trim());
    let s = a.malloc(512 << 10, 0).unwrap(); // one 2 MiB page of the small pool
    a.free(s).unwrap();
    // 32 MiB: the line is 32 + 20 = 52 MiB; 2 + 32 stays under it, so the free small page stays
    // mapped, and the 18 MiB left under the line are mapped ahead with the 32 (one call).
    let x = a.malloc(32 << 20, 0).unwrap();
    let again = a.malloc(512 << 10, 0).unwrap();
    assert_eq!(again, s, "the cached page is used again");
    let stats = a.stats();
    assert_eq!((stats.num_device_free, stats.num_device_alloc), (0, 2));
    assert_eq!(stats.reserved_bytes[ALL].peak, 52 * MIB);
    assert_eq!(backend.mapped_bytes(0), 52 << 20);
    a.free(x).unwrap();
    a.free(again).unwrap();
}

#[test]
fn expandable_trim_grows_where_free_pages_are_already_mapped() {
    let (mut a, backend) = allocator_with(1 << 30, trim());
    let x = a.malloc(24 << 20, 0).unwrap(); // [0, 24); line 44: [24, 44) mapped ahead
    let y = a.malloc(2 << 20, 0).unwrap(); // [24, 26)
    let z = a.malloc(4 << 20, 0).unwrap(); // [26, 30)

    // 22 MiB: [30, 44) is free, 8 MiB more are needed; the line is 52 + 20 = 72 MiB, so
    // [44, 72) is mapped (one call) and [52, 72) stays free.
    let w = a.malloc(22 << 20, 0).unwrap(); // [30, 52)
    let v = a.malloc(2 << 20, 0).unwrap(); // [52, 54)
    let u = a.malloc(18 << 20, 0).unwrap(); // [54, 72): 72 MiB reserved, all allocated
    assert_eq!(u, x + (54 << 20));
    a.free(x).unwrap();
    a.free(w).unwrap();
    // 48 MiB: the line is 74 + 20 = 94 MiB; 72 + 48 passes it by 26, which neither free stretch
    // (24 and 22 MiB) covers: both go, largest first, then [72, 120) is mapped, nothing ahead.
    let f = a.malloc(48 << 20, 0).unwrap();
    assert_eq!(f, x + (72 << 20));
    let s = a.stats();
    assert_eq!((s.num_device_alloc, s.num_device_free), (3, 2));
    assert_eq!(s.reserved_bytes[ALL].current, 74 * MIB);
    // Free [26, 30) now lies before the unmapped [30, 52); [0, 24) is unmapped too.
    a.free(z).unwrap();
    // 24 MiB: [0, 24) would map 24 new MiB (PyTorch's choice, the lowest room), [26, 50) only 20.
    // The line is 94 + 20 = 114 MiB: 74 + 20 stays under it, and the rest of [30, 52) (2 MiB) is
    // mapped with it, one call.
    let g = a.malloc(24 << 20, 0).unwrap();
    assert_eq!(
        g,
        x + (26 << 20),
        "the free 4 MiB are used, not 24 new MiB at [0, 24)"
    );
    let s = a.stats();
    assert_eq!((s.num_device_alloc, s.num_device_free), (4, 2));
    assert_eq!(s.reserved_bytes[ALL].current, 96 * MIB);
    assert_eq!(s.reserved_bytes[ALL].peak, 96 * MIB);
    assert_eq!(backend.mapped_bytes(0), 96 << 20);
    for p in [y, v, u, f, g] {
        a.free(p).unwrap();
    }
}

#[test]
fn expandable_trim_maps_ahead_under_the_line_but_not_after_a_trim() {
    let (mut a, backend) = allocator_with(1 << 30, trim());
    let x = a.malloc(8 << 20, 0).unwrap(); // [0, 8); line 28: [8, 28) mapped ahead
    let y = a.malloc(14 << 20, 0).unwrap(); // [8, 22)
    let c = a.malloc(4 << 20, 0).unwrap(); // [22, 26); [26, 28) free
    a.free(x).unwrap();
    // 16 MiB from the free [26, 28) on needs 14 new MiB; the line is 34 + 20 = 54 MiB, so only
    // 12 MiB more fit ahead: [28, 54) is mapped (one call).
    let z = a.malloc(16 << 20, 0).unwrap();
    assert_eq!(z, x + (26 << 20));
    let s = a.stats();
    assert_eq!((s.num_device_alloc, s.num_device_free), (2, 0));
    assert_eq!(s.reserved_bytes[ALL].current, 54 * MIB);
    // [0, 22) is free now.
    a.free(y).unwrap();
    // 30 MiB from the free [42, 54) on needs 18 new MiB; the line is 50 + 20 = 70 MiB and
    // 54 + 18 passes it by 2, so the free [0, 22) goes first (one call), and then only the 18 MiB
    // are mapped, nothing ahead: the 20 MiB under the line that the trim left are what it has
    // just given back.
    let w = a.malloc(30 << 20, 0).unwrap();
    assert_eq!(w, x + (42 << 20));
    let s = a.stats();
    assert_eq!((s.num_device_alloc, s.num_device_free), (3, 1));
    assert_eq!(s.reserved_bytes[ALL].current, 50 * MIB);
    assert_eq!(s.reserved_bytes[ALL].peak, 54 * MIB);
    assert_eq!(backend.mapped_bytes(0), 50 << 20);
    for p in [c, z, w] {
        a.free(p).unwrap();
    }
}

#[test]
fn expandable_trim_keeps_the_request_when_pages_mapped_ahead_do_not_fit() {
    // A 40 MiB device: 28 MiB plus 20 ahead (the line is 48) runs out at the 21st page.
    let (mut a, backend) = allocator_with(40 << 20, trim());
    let x = a.malloc(28 << 20, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.num_ooms, 0, "the request's own pages fit");
    assert_eq!(s.num_device_alloc, 1);
    assert_eq!(
        s.reserved_bytes[ALL].current,
        40 * MIB,
        "12 of the 20 MiB ahead"
    );
    assert_eq!(backend.mapped_bytes(0), 40 << 20);
    let y = a.malloc(12 << 20, 0).unwrap();
    assert_eq!(
        y,
        x + (28 << 20),
        "the pages mapped ahead serve the next request"
    );
    assert_eq!(a.stats().num_device_alloc, 1);
    a.free(x).unwrap();
    a.free(y).unwrap();
}

#[test]
fn release_lock_on_malloc_keeps_every_figure() {
    // The same requests, with the OOM retry path and a memory fraction, with and without the option.
    let run = |config: CachingConfig| {
        let (mut a, _) = allocator_with(64 << 20, config);
        a.set_memory_fraction(0.9).unwrap();
        let mut live = Vec::new();
        for (i, size) in [
            5usize << 20,
            1000,
            30 << 20,
            12 << 20,
            3000,
            40 << 20,
            8 << 20,
        ]
        .iter()
        .enumerate()
        {
            match a.malloc(*size, i % 2) {
                Ok(p) => live.push(p),
                Err(e) => assert_eq!(e.kind, ErrorKind::OutOfMemory),
            }
            if i % 3 == 2 {
                a.free(live.remove(0)).unwrap();
            }
        }
        a.stats()
    };
    let locked = run(CachingConfig::default());
    let released = run(CachingConfig {
        release_lock_on_malloc: true,
        ..CachingConfig::default()
    });
    assert!(
        locked.num_ooms > 0 && locked.num_alloc_retries > 0,
        "the sequence reaches the OOM path"
    );
    assert_eq!(locked, released);
}

#[test]
fn release_lock_on_malloc_tries_again_after_releasing_the_oversize_blocks_that_make_room() {
    // 64 MiB, max_split_size 20 MiB: two cached oversize segments of 25 MiB, then 40 MiB asked for.
    // The first try is refused (14 MiB free); no one oversize block is large enough, so the largest
    // are released until 40 MiB are (both: PyTorch's release_available_cached_blocks, no retry
    // counted), and the second try succeeds. Figures worked out by hand, the same with each try's
    // segment asked for without the lock (a step each).
    let run = |release_lock: bool| {
        let config = CachingConfig {
            max_split_size: 20 << 20,
            release_lock_on_malloc: release_lock,
            ..CachingConfig::default()
        };
        let (mut a, backend) = allocator_with(64 << 20, config);
        let (one, two) = (
            a.malloc(25 << 20, 0).unwrap(),
            a.malloc(25 << 20, 0).unwrap(),
        );
        a.free(one).unwrap();
        a.free(two).unwrap();
        let second = match a.malloc_begin(40 << 20, 0).unwrap() {
            MallocStep::Done(ptr) => {
                assert!(!release_lock, "the locked path serves it whole");
                ptr
            }
            MallocStep::NeedSegment(request) => {
                assert!(release_lock);
                let refused = Err(crate::backend::BackendError::OutOfMemory);
                let again = match a.malloc_finish(request, refused).unwrap() {
                    MallocStep::NeedSegment(again) => again,
                    MallocStep::Done(_) => panic!("the retry is a segment to ask for"),
                };
                assert_eq!(again.size, 40 << 20);
                // Both released before the second try.
                assert_eq!(a.stats().num_device_free, 2);
                let raw =
                    crate::backend::Backend::raw_alloc(&*backend, 0, again.size, again.stream);
                match a.malloc_finish(again, raw).unwrap() {
                    MallocStep::Done(ptr) => ptr,
                    MallocStep::NeedSegment(_) => panic!("the second try succeeds"),
                }
            }
        };
        let stats = a.stats();
        a.free(second).unwrap();
        stats
    };
    let (locked, released) = (run(false), run(true));
    assert_eq!(
        (locked.num_device_alloc, locked.num_device_free),
        (3, 2),
        "25 and 25 MiB, released, then 40 MiB"
    );
    assert_eq!((locked.num_alloc_retries, locked.num_ooms), (0, 0));
    assert_eq!(locked.reserved_bytes[0].current, 40 << 20);
    assert_eq!(locked, released);
}

#[test]
fn a_retry_after_the_settings_turned_expandable_grows_a_segment_under_the_lock() {
    // A segment asked for without the lock is refused; meanwhile expandable segments were turned
    // on. The retry grows an expandable segment (as the locked path would) instead of asking for a
    // plain one: the request is served, and the books are those of one expandable segment.
    let config = CachingConfig {
        release_lock_on_malloc: true,
        ..CachingConfig::default()
    };
    let (mut a, _) = allocator_with(1 << 30, config);
    let MallocStep::NeedSegment(request) = a.malloc_begin(30 << 20, 0).unwrap() else {
        panic!("an empty cache needs a segment");
    };
    a.set_config(CachingConfig {
        expandable_segments: true,
        release_lock_on_malloc: true,
        ..CachingConfig::default()
    });
    let refused = Err(crate::backend::BackendError::OutOfMemory);
    let MallocStep::Done(ptr) = a.malloc_finish(request, refused).unwrap() else {
        panic!("the retry is served under the lock");
    };
    let stats = a.stats();
    assert_eq!(stats.allocated_bytes[0].current, 30 << 20);
    // Mapped in the large pool's 20 MiB granules, as PyTorch maps them: two for 30 MiB.
    assert_eq!(stats.reserved_bytes[0].current, 40 << 20);
    assert_eq!(a.segments().len(), 1);
    assert!(a.segments()[0].is_expandable);
    a.free(ptr).unwrap();
}

#[test]
fn max_non_split_rounding_bounds_the_waste_of_a_large_request() {
    let run = |rounding_mb: usize| {
        let config = CachingConfig {
            max_split_size: 20 << 20,
            max_non_split_rounding: rounding_mb << 20,
            ..CachingConfig::default()
        };
        let (mut a, _) = allocator_with(1 << 30, config);
        let big = a.malloc(50 << 20, 0).unwrap();
        a.free(big).unwrap();
        // 25 MiB may take the cached 50 MiB block only if 50 < 25 + rounding.
        let p = a.malloc(25 << 20, 0).unwrap();
        (p == big, a.stats().num_device_alloc)
    };
    assert_eq!(
        run(20),
        (false, 2),
        "default 20 MiB: 50 >= 45, a new segment"
    );
    assert_eq!(
        run(40),
        (true, 1),
        "40 MiB: 50 < 65, the cached block is used whole"
    );
}

/// Bytes of metadata of a slab of `slots` blocks and a pointer map of `map_slots` entries.
fn metadata(slots: usize, map_slots: usize) -> usize {
    slots * std::mem::size_of::<super::block::Block>()
        + map_slots * std::mem::size_of::<(usize, super::block::BlockId)>()
}

#[test]
fn empty_cache_gives_back_the_metadata_of_a_peak_and_keeps_the_live_blocks() {
    let (mut a, backend) = allocator(1 << 30);
    // 4096 blocks of 512 bytes fill one 2 MiB small segment exactly.
    let ptrs: Vec<usize> = (0..4096).map(|_| a.malloc(512, 0).unwrap()).collect();
    // The slab holds at least the 4096 blocks, the map 8192 slots (it is kept at most half full).
    assert!(a.metadata_bytes() >= metadata(4096, 8192));
    // Three stay live, one of them used by another stream until after its free.
    let keep = [ptrs[0], ptrs[1000], ptrs[4095]];
    a.record_stream(ptrs[2000], 1).unwrap();
    for &p in &ptrs {
        if !keep.contains(&p) {
            a.free(p).unwrap();
        }
    }
    a.empty_cache().unwrap();
    // The segment stays (it has live blocks): live 0, free [1, 1000), live 1000, free (1000, 4095),
    // live 4095 is five blocks, in a slab of its minimum 1024 slots; three live in a map of 64.
    assert_eq!(a.metadata_bytes(), metadata(1024, 64));
    let s = a.stats();
    assert_eq!(s.allocation[ALL].current, 3);
    assert_eq!(s.allocated_bytes[ALL].current, 3 * 512);
    assert_eq!(s.active[ALL].current, 3);
    assert_eq!(s.inactive_split[ALL].current, 2);
    assert_eq!(s.inactive_split_bytes[ALL].current, 2 * MIB - 3 * 512);
    assert_eq!(s.segment[ALL].current, 1);
    assert_eq!(backend.live_events(), 0);
    // The renumbered blocks are the same blocks: the freed space is handed out again at the same
    // addresses (best fit: the smaller free block first), and every live one frees once.
    assert_eq!(a.malloc(512, 0).unwrap(), ptrs[1]);
    assert_eq!(a.free(ptrs[1]).map_err(|e| e.kind), Ok(()));
    for p in keep {
        a.free(p).unwrap();
        assert_eq!(a.free(p).unwrap_err().kind, ErrorKind::InvalidPointer);
    }
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    // A slab at its minimum is kept; its list of vacant slots holds the six blocks there were.
    let vacant_list = 8 * std::mem::size_of::<super::block::BlockId>();
    assert_eq!(a.metadata_bytes(), metadata(1024, 64) + vacant_list);
}

#[test]
fn a_sparse_pointer_map_shrinks_while_the_slab_is_still_well_used() {
    let (mut a, _) = allocator(1 << 30);
    let ptrs: Vec<usize> = (0..4096).map(|_| a.malloc(512, 0).unwrap()).collect();
    // Every eighth block stays live: the seven freed between two live ones merge into one, so the
    // slab keeps 2 x 512 = 1024 blocks (a quarter of its 4096: not compacted), while 512 live
    // entries leave the map of 8192 slots at a sixteenth: it shrinks to 512 x 4 = 2048 slots.
    for (i, &p) in ptrs.iter().enumerate() {
        if i % 8 != 0 {
            a.free(p).unwrap();
        }
    }
    let slab_before = a.metadata_bytes() - metadata(0, 8192);
    a.empty_cache().unwrap();
    assert_eq!(a.metadata_bytes(), slab_before + metadata(0, 2048));
    assert_eq!(a.stats().allocation[ALL].current, 512);
    for (i, &p) in ptrs.iter().enumerate() {
        if i % 8 == 0 {
            a.free(p).unwrap();
        }
    }
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}
