//! Sleep and wake of a pool (allocator/sleep.rs), on the simulated device: the device gets the
//! memory back while the books stand still, failures half way leave every page paused or running,
//! and the invariants recount paused bytes after every step.

use super::pools::Route;
use super::*;
use crate::backend::simulated::SimulatedBackend;
use crate::backend::Backend;
use crate::error::ErrorKind;
use std::sync::Arc;

const MIB: usize = 1 << 20;
const ALL: usize = StatType::All as usize;
const TAG: (u64, u64) = (0, 7);

/// A device of 1 GiB with expandable segments off (a sleepable pool grows them all the same), and
/// the tag's pool, sleepable.
fn tagged() -> (CachingAllocator, Arc<SimulatedBackend>) {
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
    let mut a = CachingAllocator::new(backend.clone(), 0, CachingConfig::default()).unwrap();
    a.create_pool(TAG, false, false).unwrap();
    a.make_pool_sleepable(TAG).unwrap();
    (a, backend)
}

fn in_tag<T>(a: &mut CachingAllocator, f: impl FnOnce(&mut CachingAllocator) -> T) -> T {
    a.begin_allocate_to_pool(TAG, Route::Thread(std::thread::current().id()))
        .unwrap();
    let result = f(a);
    a.end_allocate_to_pool(TAG).unwrap();
    a.release_pool(TAG).unwrap();
    result
}

fn free_bytes(backend: &SimulatedBackend) -> usize {
    backend.mem_get_info(0).unwrap().free
}

#[test]
fn a_pause_gives_the_memory_back_and_a_resume_brings_it_back_with_the_books_unchanged() {
    let (mut a, backend) = tagged();
    let weights = in_tag(&mut a, |a| a.malloc(5 * MIB, 0).unwrap());
    let outside = a.malloc(1000, 0).unwrap();
    let before = a.stats();
    // Expandable although the settings say no: one 20 MiB page of the tag's own range.
    assert_eq!(
        (
            before.reserved_bytes[ALL].current,
            before.segment[ALL].current
        ),
        (22 * MIB as i64, 1)
    );
    let free_before = free_bytes(&backend);
    a.pause_pool(TAG, true).unwrap();
    assert_eq!(
        free_bytes(&backend),
        free_before + 20 * MIB,
        "the device got the page back"
    );
    assert_eq!(a.pool_paused_bytes(TAG), Some(20 * MIB));
    assert_eq!(
        a.stats(),
        before,
        "the books describe the blocks, as before"
    );
    // The snapshot tells the tag's segment paused; the default pools' is not.
    let mut paused: Vec<(bool, usize)> = a
        .segments()
        .iter()
        .map(|s| (s.pool_id == TAG, s.paused_size))
        .collect();
    paused.sort();
    assert_eq!(paused, vec![(false, 0), (true, 20 * MIB)]);
    assert_eq!(a.paused_memory().current, 20 * MIB as i64);
    // A paused pool: nothing to do.
    a.pause_pool(TAG, true).unwrap();
    // An allocation in the paused tag is refused; outside it, all goes on.
    let refused = in_tag(&mut a, |a| a.malloc(1000, 0).unwrap_err());
    assert_eq!(refused.kind, ErrorKind::InvalidArgument);
    assert!(refused.message.contains("paused"), "{}", refused.message);
    a.free(outside).unwrap();
    a.resume_pool(TAG).unwrap();
    assert_eq!(free_bytes(&backend), free_before);
    assert_eq!(a.pool_paused_bytes(TAG), Some(0));
    let memory = a.paused_memory();
    assert_eq!(
        (memory.current, memory.peak, memory.allocated, memory.freed),
        (0, 20 * MIB as i64, 20 * MIB as i64, 20 * MIB as i64)
    );
    assert!(a.segments().iter().all(|s| s.paused_size == 0));
    a.resume_pool(TAG).unwrap(); // a running pool: nothing to do
    let more = in_tag(&mut a, |a| a.malloc(5 * MIB, 0).unwrap());
    assert_eq!(
        more,
        weights + 5 * MIB,
        "the tag's page serves it, at the same addresses"
    );
    a.free(weights).unwrap();
    a.free(more).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn paused_pool_at_names_the_pool_of_paused_memory_only() {
    let (mut a, _backend) = tagged();
    // 25 MiB: two 20 MiB pages of the tag's range.
    let p = in_tag(&mut a, |a| a.malloc(25 * MIB, 0).unwrap());
    let outside = a.malloc(1000, 0).unwrap();
    assert_eq!(a.paused_pool_at(p, 25 * MIB), None, "running");
    a.pause_pool(TAG, false).unwrap();
    assert_eq!(a.paused_pool_at(p, 25 * MIB), Some(TAG));
    // Any byte of it, the last of the second page's part included; nothing outside the tag.
    assert_eq!(a.paused_pool_at(p + 25 * MIB - 1, 1), Some(TAG));
    assert_eq!(a.paused_pool_at(p + 20 * MIB, 0), Some(TAG));
    assert_eq!(a.paused_pool_at(outside, 1000), None);
    assert_eq!(
        a.paused_pool_at(0, usize::MAX),
        Some(TAG),
        "a range over everything"
    );
    a.resume_pool(TAG).unwrap();
    assert_eq!(a.paused_pool_at(p, 25 * MIB), None);
    a.free(p).unwrap();
    a.free(outside).unwrap();
}

#[test]
fn a_pause_that_fails_half_way_puts_back_the_pages_it_had_paused() {
    let (mut a, backend) = tagged();
    // 25 MiB: two 20 MiB pages.
    let p = in_tag(&mut a, |a| a.malloc(25 * MIB, 0).unwrap());
    backend.fail_calls_after("vm_unmap", 1, 1);
    assert!(a.pause_pool(TAG, true).is_err());
    assert_eq!(
        a.pool_paused_bytes(TAG),
        Some(0),
        "every page running again"
    );
    assert_eq!(backend.mapped_bytes(0), 40 * MIB);
    // A backup that cannot be taken: nothing paused either.
    backend.fail_calls("copy_to_host", 1);
    assert!(a.pause_pool(TAG, true).is_err());
    assert_eq!(backend.mapped_bytes(0), 40 * MIB);
    a.pause_pool(TAG, true).unwrap();
    assert_eq!(backend.mapped_bytes(0), 0);
    a.free(p).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_resume_that_fails_keeps_the_rest_paused_and_may_be_tried_again() {
    let (mut a, backend) = tagged();
    let p = in_tag(&mut a, |a| a.malloc(25 * MIB, 0).unwrap());
    a.pause_pool(TAG, true).unwrap();
    backend.fail_calls_after("copy_from_host", 1, 1);
    assert!(a.resume_pool(TAG).is_err());
    assert_eq!(
        a.pool_paused_bytes(TAG),
        Some(20 * MIB),
        "one page back, one still paused"
    );
    assert_eq!(backend.mapped_bytes(0), 20 * MIB);
    a.resume_pool(TAG).unwrap();
    assert_eq!(
        (a.pool_paused_bytes(TAG), backend.mapped_bytes(0)),
        (Some(0), 40 * MIB)
    );
    a.free(p).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_restore_that_fails_and_cannot_unmap_leaves_the_page_running_and_says_so() {
    let (mut a, backend) = tagged();
    let p = in_tag(&mut a, |a| a.malloc(5 * MIB, 0).unwrap());
    a.pause_pool(TAG, true).unwrap();
    // The copy back fails, and so does giving the new memory back: the page is mapped, so it is
    // booked running (never paused with memory behind it, nor mapped twice by the next resume).
    backend.fail_calls("copy_from_host", 1);
    backend.fail_calls("vm_unmap", 1);
    let e = a.resume_pool(TAG).unwrap_err();
    assert!(e.message.contains("without its contents"), "{}", e.message);
    assert_eq!(
        (a.pool_paused_bytes(TAG), backend.mapped_bytes(0)),
        (Some(0), 20 * MIB)
    );
    a.check_invariants().unwrap();
    // The pool runs: it pauses and resumes again.
    a.pause_pool(TAG, false).unwrap();
    a.resume_pool(TAG).unwrap();
    a.free(p).unwrap();
    a.release_pool(TAG).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(backend.mapped_bytes(0), 0);
}

#[test]
fn empty_cache_while_paused_lets_the_free_pages_go_and_keeps_the_live_ones() {
    let (mut a, backend) = tagged();
    let (kv, weights) = in_tag(&mut a, |a| {
        (
            a.malloc(25 * MIB, 0).unwrap(),
            a.malloc(30 * MIB, 0).unwrap(),
        )
    });
    a.pause_pool(TAG, false).unwrap();
    let unmaps = backend.mapped_bytes(0);
    assert_eq!(unmaps, 0);
    // Freed while paused, then emptied: only the books change (the memory went at the pause).
    a.free(kv).unwrap();
    a.empty_cache().unwrap();
    let paused = a.pool_paused_bytes(TAG).unwrap();
    assert_eq!(
        a.stats().reserved_bytes[ALL].current as usize,
        paused,
        "what stays reserved is the paused pages still under live blocks"
    );
    // kv took pages 0 and 1 (0..40 MiB), weights 25..55 MiB (page 2 mapped for it); freed, kv
    // leaves page 0 wholly free: pages 1 and 2 stay.
    assert_eq!(paused, 40 * MIB);
    a.resume_pool(TAG).unwrap();
    assert_eq!(backend.mapped_bytes(0), paused);
    a.free(weights).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn sleep_needs_virtual_memory_and_a_sleepable_pool() {
    let backend = Arc::new(SimulatedBackend::without_virtual_memory(1, 1 << 30));
    let mut a = CachingAllocator::new(backend, 0, CachingConfig::default()).unwrap();
    a.create_pool(TAG, false, false).unwrap();
    let error = a.make_pool_sleepable(TAG).unwrap_err();
    assert_eq!(error.kind, ErrorKind::NotSupported);
    assert!(error.message.contains("test backend"), "{}", error.message);
    assert_eq!(
        a.pause_pool(TAG, false).unwrap_err().kind,
        ErrorKind::NotSupported
    );

    let (mut a, _) = tagged();
    a.create_pool((0, 8), false, false).unwrap();
    assert_eq!(
        a.pause_pool((0, 8), false).unwrap_err().kind,
        ErrorKind::InvalidArgument,
        "not sleepable"
    );
    assert_eq!(
        a.pause_pool((0, 9), false).unwrap_err().kind,
        ErrorKind::InvalidArgument,
        "no such pool"
    );
}

#[test]
fn a_resume_without_room_is_out_of_memory_and_keeps_the_rest_paused() {
    let backend = Arc::new(SimulatedBackend::new(1, 64 * MIB));
    let mut a = CachingAllocator::new(backend.clone(), 0, CachingConfig::default()).unwrap();
    a.create_pool(TAG, false, false).unwrap();
    a.make_pool_sleepable(TAG).unwrap();
    let p = in_tag(&mut a, |a| a.malloc(25 * MIB, 0).unwrap()); // two 20 MiB pages
    a.pause_pool(TAG, false).unwrap();
    // Meanwhile another request takes 40 of the 64 MiB.
    let other = a.malloc(40 * MIB, 0).unwrap();
    let error = a.resume_pool(TAG).unwrap_err();
    assert_eq!(error.kind, ErrorKind::OutOfMemory, "{}", error.message);
    assert_eq!(a.pool_paused_bytes(TAG), Some(20 * MIB), "one page fitted");
    a.free(other).unwrap();
    a.empty_cache().unwrap();
    a.resume_pool(TAG).unwrap();
    assert_eq!(a.pool_paused_bytes(TAG), Some(0));
    a.free(p).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_paused_use_on_oom_pool_lends_no_block() {
    let backend = Arc::new(SimulatedBackend::new(1, 64 * MIB));
    let mut a = CachingAllocator::new(backend, 0, CachingConfig::default()).unwrap();
    a.create_pool(TAG, true, false).unwrap(); // use_on_oom
    a.make_pool_sleepable(TAG).unwrap();
    let p = in_tag(&mut a, |a| a.malloc(25 * MIB, 0).unwrap()); // 40 MiB mapped, 15 MiB free
    a.pause_pool(TAG, false).unwrap();
    // 60 of the 64 MiB elsewhere, then a request the device cannot hold: the paused pool's free
    // 15 MiB (no memory behind them) are not lent.
    let other = a.malloc(60 * MIB, 0).unwrap();
    let error = a.malloc(10 * MIB, 0).unwrap_err();
    assert_eq!(error.kind, ErrorKind::OutOfMemory);
    a.free(other).unwrap();
    a.empty_cache().unwrap();
    a.resume_pool(TAG).unwrap();
    // Resumed, its free block is lent again.
    let hog = a.malloc(24 * MIB, 0).unwrap();
    let lent = a.malloc(10 * MIB, 0).unwrap();
    assert!(
        lent > p && lent < p + 40 * MIB,
        "the pool's free block, lent"
    );
    for ptr in [hog, lent, p] {
        a.free(ptr).unwrap();
    }
    a.check_invariants().unwrap();
}
