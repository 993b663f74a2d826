//! A backend whose event or stream calls fail once: no block is lost. A free that cannot record its
//! events (or synchronize its streams) is refused and leaves the block allocated, to be freed again;
//! an event that cannot be synchronized or destroyed stays pending until a later call succeeds. The
//! books are recounted after every operation (debug builds), and each test ends with nothing held.

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::caching::{CachingAllocator, CachingConfig, StatType};
use accalloc::error::ErrorKind;
use std::sync::Arc;

const ALL: usize = StatType::All as usize;
const MIB: usize = 1 << 20;

fn allocator(backend: SimulatedBackend) -> (CachingAllocator, Arc<SimulatedBackend>) {
    let backend = Arc::new(backend);
    let a = CachingAllocator::new(backend.clone(), 0, CachingConfig::default()).unwrap();
    (a, backend)
}

/// allocated, active, reserved bytes (current).
fn figures(a: &CachingAllocator) -> (i64, i64, i64) {
    let s = a.stats();
    (
        s.allocated_bytes[ALL].current,
        s.active_bytes[ALL].current,
        s.reserved_bytes[ALL].current,
    )
}

/// Nothing allocated, nothing reserved, nothing left at the backend.
fn assert_nothing_held(a: &mut CachingAllocator, backend: &SimulatedBackend) {
    a.empty_cache().unwrap();
    assert_eq!(figures(a), (0, 0, 0));
    assert_eq!(backend.live_segments(0), vec![]);
    assert_eq!(backend.live_events(), 0, "every event was destroyed");
}

#[test]
fn a_free_whose_event_cannot_be_created_leaves_the_block_allocated() {
    let (mut a, backend) = allocator(SimulatedBackend::new(1, 1 << 30));
    let p = a.malloc(1000, 0).unwrap();
    a.record_stream(p, 1).unwrap();
    backend.fail_calls("create_event", 1);
    let error = a.free(p).unwrap_err();
    assert_eq!(error.kind, ErrorKind::Backend);
    assert!(
        error.message.contains("create_event") && error.message.contains("still allocated"),
        "{}",
        error.message
    );
    assert_eq!(figures(&a), (1024, 1024, 2 * MIB as i64), "nothing changed");
    // The retry succeeds: the block waits for stream 1, then returns to the pool.
    a.free(p).unwrap();
    assert_eq!(figures(&a), (0, 1024, 2 * MIB as i64));
    assert_eq!(backend.live_events(), 1);
    backend.complete_stream(1);
    assert_eq!(
        a.malloc(1000, 0).unwrap(),
        p,
        "the block came back to the pool"
    );
    a.free(p).unwrap();
    assert_nothing_held(&mut a, &backend);
}

#[test]
fn a_free_whose_event_cannot_be_recorded_destroys_the_events_it_made() {
    let (mut a, backend) = allocator(SimulatedBackend::new(1, 1 << 30));
    let p = a.malloc(5 * MIB, 0).unwrap();
    a.record_stream(p, 1).unwrap();
    a.record_stream(p, 2).unwrap();
    // The first stream's event is created and recorded, the second's is created and fails to record.
    backend.fail_calls_after("record_event", 1, 1);
    let error = a.free(p).unwrap_err();
    assert_eq!(error.kind, ErrorKind::Backend);
    assert!(error.message.contains("record_event"), "{}", error.message);
    assert_eq!(
        backend.live_events(),
        0,
        "the events made for the refused free are gone"
    );
    assert_eq!(figures(&a).0, 5 * MIB as i64, "still allocated");
    // Two streams, the second event cannot be created: the first one goes again.
    backend.fail_calls_after("create_event", 1, 1);
    assert_eq!(a.free(p).unwrap_err().kind, ErrorKind::Backend);
    assert_eq!(backend.live_events(), 0);
    a.free(p).unwrap();
    assert_eq!(backend.live_events(), 2);
    assert_nothing_held(&mut a, &backend);
}

#[test]
fn a_free_whose_stream_cannot_be_synchronized_leaves_the_block_allocated() {
    let (mut a, backend) = allocator(SimulatedBackend::without_events(1, 1 << 30));
    let p = a.malloc(1000, 0).unwrap();
    a.record_stream(p, 3).unwrap();
    backend.fail_calls("stream_synchronize", 1);
    let error = a.free(p).unwrap_err();
    assert_eq!(error.kind, ErrorKind::Backend);
    assert!(
        error.message.contains("stream_synchronize"),
        "{}",
        error.message
    );
    assert_eq!(figures(&a), (1024, 1024, 2 * MIB as i64));
    a.free(p).unwrap();
    assert_eq!(
        figures(&a),
        (0, 0, 2 * MIB as i64),
        "synchronized: free at once"
    );
    assert_nothing_held(&mut a, &backend);
}

#[test]
fn pending_events_survive_a_failed_synchronization_in_empty_cache() {
    for failing in ["synchronize_event", "destroy_event"] {
        let (mut a, backend) = allocator(SimulatedBackend::new(1, 1 << 30));
        let p = a.malloc(1000, 0).unwrap();
        let q = a.malloc(1000, 0).unwrap();
        a.record_stream(p, 1).unwrap();
        a.record_stream(q, 1).unwrap();
        a.free(p).unwrap();
        a.free(q).unwrap();
        assert_eq!(figures(&a), (0, 2048, 2 * MIB as i64));
        backend.fail_calls(failing, 1);
        let error = a.empty_cache().unwrap_err();
        assert_eq!(error.kind, ErrorKind::Backend);
        assert!(error.message.contains(failing), "{}", error.message);
        assert_eq!(
            figures(&a),
            (0, 2048, 2 * MIB as i64),
            "{failing}: both blocks still wait"
        );
        assert_eq!(backend.live_events(), 2);
        // The retry completes both events and releases the segment.
        a.empty_cache().unwrap();
        assert_eq!(figures(&a), (0, 0, 0), "{failing}");
        assert_eq!(a.stats().num_sync_all_streams, 2);
        assert_nothing_held(&mut a, &backend);
    }
}

#[test]
fn an_event_that_cannot_be_queried_or_destroyed_stays_pending_for_the_next_malloc() {
    for failing in ["query_event", "destroy_event"] {
        let (mut a, backend) = allocator(SimulatedBackend::new(1, 1 << 30));
        let p = a.malloc(1000, 0).unwrap();
        a.record_stream(p, 1).unwrap();
        a.free(p).unwrap();
        backend.complete_stream(1);
        backend.fail_calls(failing, 1);
        let error = a.malloc(1000, 0).unwrap_err();
        assert_eq!(error.kind, ErrorKind::Backend, "{failing}");
        assert_eq!(figures(&a), (0, 1024, 2 * MIB as i64));
        assert_eq!(
            a.malloc(1000, 0).unwrap(),
            p,
            "{failing}: the event completed on the retry"
        );
        assert_eq!(backend.live_events(), 0);
        a.free(p).unwrap();
        assert_nothing_held(&mut a, &backend);
    }
}
