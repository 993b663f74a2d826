//! The pinned host cache against figures worked out by hand from PyTorch's rules.

use super::*;
use crate::backend::simulated::SimulatedBackend;

fn cache() -> (Arc<SimulatedBackend>, PinnedHostCache) {
    let backend = Arc::new(SimulatedBackend::new(2, 1 << 30));
    let cache = PinnedHostCache::new(backend.clone()).unwrap();
    (backend, cache)
}

/// (current, peak, allocated, freed)
fn stat(s: Stat) -> (i64, i64, i64, i64) {
    (s.current, s.peak, s.allocated, s.freed)
}

#[test]
fn pytorchs_own_example_rounds_40960_bytes_to_65536() {
    // torch.ones(10 * 1024, pin_memory=True): 40,960 bytes.
    let (backend, mut cache) = cache();
    let ptr = cache.allocate(40_960).unwrap();
    let s = cache.stats();
    assert_eq!(stat(s.allocations), (1, 1, 1, 0));
    assert_eq!(stat(s.allocated_bytes), (65_536, 65_536, 65_536, 0));
    assert_eq!(stat(s.active_requests), (1, 1, 1, 0));
    assert_eq!(stat(s.active_bytes), (65_536, 65_536, 65_536, 0));
    assert_eq!((s.num_host_alloc, s.num_host_free), (1, 0));
    assert_eq!(s.host_alloc_time.count, 1);
    assert_eq!(backend.live_pinned_host(), vec![(ptr, 65_536)]);

    // empty_host_cache while the tensor lives changes nothing.
    cache.empty_cache().unwrap();
    assert_eq!(cache.stats(), s);

    // Freed with no stream use: reusable at once, still held.
    cache.free(ptr).unwrap();
    let s = cache.stats();
    assert_eq!(stat(s.active_requests), (0, 1, 1, 1));
    assert_eq!(stat(s.allocations), (1, 1, 1, 0));

    cache.empty_cache().unwrap();
    let s = cache.stats();
    assert_eq!(stat(s.allocations), (0, 1, 1, 1));
    assert_eq!(stat(s.allocated_bytes), (0, 65_536, 65_536, 65_536));
    assert_eq!((s.num_host_alloc, s.num_host_free), (1, 1));
    assert_eq!(s.host_free_time.count, 1);
    assert!(backend.live_pinned_host().is_empty());
    cache.check_invariants().unwrap();
}

#[test]
fn a_block_is_reused_from_its_own_power_of_two_only_newest_first() {
    let (_, mut cache) = cache();
    let a = cache.allocate(1000).unwrap(); // 1,024
    let b = cache.allocate(600).unwrap(); // 1,024
    cache.free(a).unwrap();
    cache.free(b).unwrap();
    assert_eq!(
        cache.allocate(513).unwrap(),
        b,
        "the newest free block of 1,024 first"
    );
    // 2,000 rounds to 2,048: the free 1,024 block is not taken, nor split.
    let c = cache.allocate(2000).unwrap();
    assert!(c != a && c != b);
    // 100 rounds to 128: a list of its own, empty.
    let d = cache.allocate(100).unwrap();
    assert!(d != a);
    let s = cache.stats();
    assert_eq!(s.num_host_alloc, 4);
    assert_eq!(
        stat(s.allocated_bytes),
        (1024 + 1024 + 2048 + 128, 4224, 4224, 0)
    );
    // Peaks summed per list: 2 (the 1,024 list held a and b) + 1 + 1, where 3 were ever active.
    assert_eq!(stat(s.active_requests), (3, 4, 5, 2));
    // 1 byte rounds to 1 (2^0): a block of its own.
    cache.allocate(1).unwrap();
    assert_eq!(cache.stats().allocated_bytes.current, 4225);
    cache.check_invariants().unwrap();
}

#[test]
fn a_block_used_by_a_stream_waits_for_its_event_before_reuse() {
    let (backend, mut cache) = cache();
    let a = cache.allocate(4096).unwrap();
    assert_eq!(
        cache.record_stream(a + 100, 1, 7),
        Ok(true),
        "an address inside the block"
    );
    cache.free(a).unwrap();
    let s = cache.stats();
    assert_eq!(
        stat(s.active_requests),
        (1, 1, 1, 0),
        "active until reusable"
    );
    assert_eq!(backend.live_events(), 1);

    // The stream's copy has not finished: a request of the same size gets a new block.
    let b = cache.allocate(4096).unwrap();
    assert_ne!(a, b);
    cache.free(b).unwrap();
    // Now it has: the next allocation processes the event and reuses the newest free block (b,
    // cached first; a joins the list after it), then a.
    backend.complete_stream(7);
    assert_eq!(cache.allocate(4096).unwrap(), a);
    assert_eq!(backend.live_events(), 0, "a processed event is destroyed");
    assert_eq!(cache.allocate(4096).unwrap(), b);
    let s = cache.stats();
    assert_eq!(stat(s.active_requests), (2, 2, 4, 2));
    assert_eq!(s.num_host_alloc, 2);
    cache.check_invariants().unwrap();
}

#[test]
fn events_are_processed_oldest_first_stopping_at_the_first_pending_one() {
    let (backend, mut cache) = cache();
    let a = cache.allocate(4096).unwrap();
    let b = cache.allocate(8192).unwrap();
    cache.record_stream(a, 0, 5).unwrap();
    cache.record_stream(b, 0, 6).unwrap();
    cache.free(a).unwrap();
    cache.free(b).unwrap();
    // b's stream is done, a's (recorded first) is not: processing stops at a's event.
    backend.complete_stream(6);
    let c = cache.allocate(8192).unwrap();
    assert_ne!(c, b, "b waits behind a's pending event, as in PyTorch");
    assert_eq!(cache.stats().active_requests.current, 3);
    backend.complete_stream(5);
    cache.free(c).unwrap();
    cache.empty_cache().unwrap();
    let s = cache.stats();
    assert_eq!(
        s.allocations.current, 0,
        "every block was reusable, so every one went back"
    );
    assert_eq!(s.num_host_free, 3);
    cache.check_invariants().unwrap();
}

#[test]
fn a_block_used_by_two_streams_waits_for_both() {
    let (backend, mut cache) = cache();
    let a = cache.allocate(4096).unwrap();
    cache.record_stream(a, 0, 5).unwrap();
    cache.record_stream(a, 1, 6).unwrap();
    cache.record_stream(a, 1, 6).unwrap(); // the same stream twice is one use
    cache.free(a).unwrap();
    assert_eq!(backend.live_events(), 2);
    backend.complete_stream(5);
    cache.empty_cache().unwrap();
    assert_eq!(
        cache.stats().allocations.current,
        1,
        "still waiting for stream 6"
    );
    backend.complete_stream(6);
    cache.empty_cache().unwrap();
    assert_eq!(cache.stats().allocations.current, 0);
    cache.check_invariants().unwrap();
}

#[test]
fn peaks_of_the_active_figures_are_summed_per_power_of_two_as_pytorch_does() {
    let (_, mut cache) = cache();
    let a = cache.allocate(1024).unwrap();
    cache.free(a).unwrap();
    let b = cache.allocate(2048).unwrap();
    let s = cache.stats();
    // Never more than one block active at once, but each list's peak counts.
    assert_eq!(stat(s.active_requests), (1, 2, 2, 1));
    assert_eq!(stat(s.active_bytes), (2048, 3072, 3072, 1024));
    // allocations is one figure: its peak is the true one.
    assert_eq!(stat(s.allocations), (2, 2, 2, 0));

    cache.reset_peak_stats();
    let s = cache.stats();
    assert_eq!(s.active_requests.peak, 1);
    assert_eq!(s.active_bytes.peak, 2048);
    assert_eq!((s.host_alloc_time.max, s.host_alloc_time.min), (0, 0));

    cache.reset_accumulated_stats();
    let s = cache.stats();
    assert_eq!(stat(s.active_requests), (1, 1, 0, 0));
    assert_eq!((s.num_host_alloc, s.num_host_free), (0, 0));
    assert_eq!((s.host_alloc_time.count, s.host_alloc_time.total), (0, 0));
    cache.free(b).unwrap();
    cache.check_invariants().unwrap();
}

#[test]
fn a_miss_the_backend_cannot_serve_empties_the_cache_and_tries_again() {
    let (backend, mut cache) = cache();
    let a = cache.allocate(4096).unwrap();
    cache.free(a).unwrap();
    backend.fail_calls("pinned_host_alloc", 1);
    let b = cache.allocate(1 << 20).unwrap();
    let s = cache.stats();
    assert_eq!(
        (s.num_host_alloc, s.num_host_free),
        (2, 1),
        "a went back before the retry"
    );
    assert_eq!(backend.live_pinned_host(), vec![(b, 1 << 20)]);

    // Failing twice: out of memory, books unchanged.
    backend.fail_calls("pinned_host_alloc", 2);
    let before = cache.stats();
    let error = cache.allocate(3000).unwrap_err();
    assert_eq!(error.kind, ErrorKind::OutOfMemory);
    assert!(
        error
            .message
            .contains("pinned host memory: tried to allocate 2.93 KiB"),
        "{}",
        error.message
    );
    assert_eq!(cache.stats(), before);
    cache.check_invariants().unwrap();
}

#[test]
fn a_free_the_backend_refuses_keeps_the_block_cached_and_counted() {
    let (backend, mut cache) = cache();
    let a = cache.allocate(4096).unwrap();
    cache.free(a).unwrap();
    backend.fail_calls("pinned_host_free", 1);
    let error = cache.empty_cache().unwrap_err();
    assert_eq!(error.kind, ErrorKind::Backend);
    assert!(error.message.contains("stays cached"), "{}", error.message);
    assert_eq!(cache.stats().allocations.current, 1);
    cache.check_invariants().unwrap();
    assert_eq!(cache.allocate(4096).unwrap(), a, "still reusable");
    cache.free(a).unwrap();
    cache.empty_cache().unwrap();
    assert!(backend.live_pinned_host().is_empty());
}

#[test]
fn an_event_that_cannot_be_recorded_falls_back_to_synchronizing_the_stream() {
    let (backend, mut cache) = cache();
    let a = cache.allocate(4096).unwrap();
    cache.record_stream(a, 0, 3).unwrap();
    backend.fail_calls("record_event", 1);
    cache.free(a).unwrap();
    assert_eq!(
        backend.live_events(),
        0,
        "the event that failed was destroyed"
    );
    assert_eq!(
        cache.allocate(4096).unwrap(),
        a,
        "the stream was synchronized: reusable at once"
    );
    cache.check_invariants().unwrap();

    // Neither works: the free is refused, the block stays handed out, and a retry succeeds.
    cache.record_stream(a, 1, 3).unwrap();
    cache.record_stream(a, 0, 4).unwrap();
    backend.fail_calls_after("create_event", 1, 1); // stream 3's event is made, stream 4's not
    backend.fail_calls("stream_synchronize", 1);
    let error = cache.free(a).unwrap_err();
    assert_eq!(error.kind, ErrorKind::Backend);
    assert!(
        error.message.contains("still handed out (free it again)"),
        "{}",
        error.message
    );
    assert_eq!(
        backend.live_events(),
        0,
        "the event made for stream 3 was destroyed"
    );
    assert_eq!(cache.stats().active_requests.current, 1);
    cache.check_invariants().unwrap();
    cache.free(a).unwrap();
    assert_eq!(backend.live_events(), 2);
    cache.check_invariants().unwrap();
}

#[test]
fn bad_pointers_are_refused_and_change_nothing() {
    let (_, mut cache) = cache();
    assert_eq!(
        cache.allocate(0),
        Ok(0),
        "a 0-byte request is NULL, as in PyTorch"
    );
    let a = cache.allocate(100).unwrap();
    let before = cache.stats();
    assert_eq!(
        cache.free(a + 8).unwrap_err().kind,
        ErrorKind::InvalidPointer
    );
    assert_eq!(
        cache.free(0x1234).unwrap_err().kind,
        ErrorKind::InvalidPointer
    );
    assert_eq!(cache.record_stream(0x1234, 0, 1), Ok(false));
    assert_eq!(
        cache.record_stream(a + 128, 0, 1),
        Ok(false),
        "just past the block"
    );
    assert_eq!(
        cache.record_stream(a, 9, 1).unwrap_err().kind,
        ErrorKind::InvalidDevice
    );
    assert!(cache.contains(a + 127) && !cache.contains(a + 128));
    cache.free(a).unwrap();
    let error = cache.free(a).unwrap_err();
    assert!(error.message.contains("freed twice"), "{}", error.message);
    assert_eq!(
        cache.record_stream(a, 0, 1).unwrap_err().kind,
        ErrorKind::InvalidPointer
    );
    assert_eq!(cache.stats().allocations, before.allocations);
    assert_eq!(
        cache.allocate(usize::MAX).unwrap_err().kind,
        ErrorKind::OutOfMemory
    );
    cache.check_invariants().unwrap();
}

#[test]
fn a_backend_without_pinned_memory_is_named() {
    struct NoPinned(SimulatedBackend);
    impl crate::backend::Wrapper for NoPinned {
        fn inner(&self) -> &dyn Backend {
            &self.0
        }
        fn pinned_host_supported(&self) -> bool {
            false
        }
    }
    let error = PinnedHostCache::new(Arc::new(NoPinned(SimulatedBackend::new(1, 1 << 20))))
        .err()
        .unwrap();
    assert_eq!(error.kind, ErrorKind::NotSupported);
    assert!(
        error
            .message
            .contains("test backend has no pinned host memory"),
        "{}",
        error.message
    );
}

#[test]
fn the_json_has_pytorchs_keys_sorted() {
    let (_, mut cache) = cache();
    cache.allocate(40_960).unwrap();
    let json = cache.stats().to_json();
    assert!(
        json.starts_with("{\"active_bytes.allocated\":65536,\"active_bytes.current\":65536,"),
        "{json}"
    );
    assert!(
        json.contains("\"num_host_alloc\":1,\"num_host_free\":0,\"page_locked_bytes\":65536}"),
        "{json}"
    );
    assert_eq!(cache.stats().entries().len(), 4 * 4 + 2 * 5 + 3);
    assert_eq!(cache.stats().get("allocated_bytes.peak"), Some(65_536));
    assert_eq!(cache.stats().get("allocated_bytes"), None);
}

#[test]
fn dropping_the_cache_gives_back_what_is_cached() {
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
    let mut cache = PinnedHostCache::new(backend.clone()).unwrap();
    let a = cache.allocate(100).unwrap();
    let b = cache.allocate(100).unwrap();
    cache.free(a).unwrap();
    drop(cache);
    assert_eq!(
        backend.live_pinned_host(),
        vec![(b, 128)],
        "b is still its holder's"
    );
}

#[test]
fn the_pinned_settings_stop_rounding_and_caching_above_their_limits() {
    let (backend, mut cache) = cache();
    let config = crate::caching::settings::parse_settings(
        "pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:4",
        &crate::caching::CachingConfig::default(),
    )
    .unwrap();
    cache.configure(&config);
    // Up to 1 MiB: powers of two. Above: the size asked for.
    let small = cache.allocate(600_000).unwrap();
    let unrounded = cache.allocate(1_500_000).unwrap();
    assert_eq!(cache.stats().allocated_bytes.current, 1_048_576 + 1_500_000);
    // 1,400,000 lies in the same list (2^21) and fits the 1,500,000 block: reused.
    cache.free(unrounded).unwrap();
    assert_eq!(cache.allocate(1_400_000).unwrap(), unrounded);
    // Above 4 MiB: not cached; given back at its free.
    let big = cache.allocate(5 << 20).unwrap();
    assert_eq!(
        cache.stats().allocated_bytes.current,
        1_048_576 + 1_500_000 + (5 << 20)
    );
    cache.free(big).unwrap();
    let s = cache.stats();
    assert_eq!((s.num_host_alloc, s.num_host_free), (3, 1));
    assert_eq!(s.allocated_bytes.current, 1_048_576 + 1_500_000);
    assert_eq!(s.active_requests.current, 2);
    assert!(!backend.live_pinned_host().iter().any(|&(p, _)| p == big));
    cache.free(small).unwrap();
    cache.free(unrounded).unwrap();
    cache.check_invariants().unwrap();
}
