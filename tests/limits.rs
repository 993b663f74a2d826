//! Limits on numbers that come from a backend or a user: a reported capacity so large that no
//! reservation can cover it, sizes whose sums would overflow, rounding divisions out of range,
//! expandable reservations of streams no longer used, and a memory fraction set by call against a
//! later settings string. Each answers with a status or falls back; none panics (debug builds check
//! for overflow and recount the books after every operation).

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::{CachingAllocator, CachingConfig, StatType};
use accalloc::error::ErrorKind;
use accalloc::runtime::ownership::SegmentIndex;
use accalloc::runtime::Accelerator;
use std::sync::Arc;

const ALL: usize = StatType::All as usize;
const MIB: usize = 1 << 20;

fn config(text: &str) -> CachingConfig {
    parse_settings(text, &CachingConfig::default()).unwrap()
}

#[test]
fn empty_cache_releases_the_reservations_of_streams_no_longer_used() {
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
    let mut a =
        CachingAllocator::new(backend.clone(), 0, config("expandable_segments:True")).unwrap();
    for stream in 1..=50 {
        let p = a.malloc(4 * MIB, stream).unwrap();
        let q = a.malloc(1000, stream).unwrap();
        assert_eq!(
            backend.live_reservations(0),
            2,
            "one per pool of stream {stream}"
        );
        a.free(p).unwrap();
        a.free(q).unwrap();
        a.empty_cache().unwrap();
        assert_eq!(
            backend.live_reservations(0),
            0,
            "stream {stream}'s reservations went back"
        );
    }
    let s = a.stats();
    assert_eq!(s.reserved_bytes[ALL].current, 0);
    assert_eq!((s.num_device_alloc, s.num_device_free), (100, 100));
    // A reservation that still maps a live block stays; an empty one beside it goes.
    let kept = a.malloc(4 * MIB, 7).unwrap();
    let other = a.malloc(4 * MIB, 8).unwrap();
    a.free(other).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(backend.live_reservations(0), 1);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 20 * MIB as i64);
    // The hole it left is reused by the next reservation.
    let again = a.malloc(4 * MIB, 9).unwrap();
    assert_eq!(backend.live_reservations(0), 2);
    a.free(again).unwrap();
    a.free(kept).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(backend.live_reservations(0), 0);
    assert_eq!(backend.mapped_bytes(0), 0);
}

#[test]
fn a_capacity_too_large_to_reserve_falls_back_to_ordinary_segments() {
    for capacity in [1usize << 62, usize::MAX] {
        let backend = Arc::new(SimulatedBackend::new(1, capacity));
        let mut a =
            CachingAllocator::new(backend.clone(), 0, config("expandable_segments:True")).unwrap();
        let p = a.malloc(MIB, 0).unwrap();
        let q = a.malloc(30 * MIB, 0).unwrap();
        assert_eq!(backend.live_reservations(0), 0, "no reservation was tried");
        assert_eq!(
            backend.live_segments(0).len(),
            2,
            "ordinary segments instead"
        );
        a.free(p).unwrap();
        a.free(q).unwrap();
        a.empty_cache().unwrap();
        assert_eq!(backend.live_segments(0), vec![]);
    }
}

#[test]
fn sizes_near_the_top_of_the_address_space_are_out_of_memory_not_overflows() {
    // A device that reports usize::MAX bytes, with a memory fraction: the sums are checked.
    let backend = Arc::new(SimulatedBackend::new(1, usize::MAX));
    let mut a = CachingAllocator::new(backend.clone(), 0, CachingConfig::default()).unwrap();
    a.set_memory_fraction(0.5).unwrap();
    let p = a.malloc(1000, 0).unwrap();
    for size in [usize::MAX - (4 << 20), 1 << 63, (1 << 63) + 4096] {
        let error = a.malloc(size, 0).unwrap_err();
        assert_eq!(
            error.kind,
            ErrorKind::OutOfMemory,
            "{size}: {}",
            error.message
        );
    }
    // Without a fraction, no device may hold more than isize::MAX bytes either.
    a.set_memory_fraction(1.0).unwrap();
    let error = a.malloc(1 << 63, 0).unwrap_err();
    assert_eq!(error.kind, ErrorKind::OutOfMemory, "{}", error.message);
    // The device is still usable.
    let q = a.malloc(5 * MIB, 0).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn rounding_divisions_set_past_the_parser_do_not_overflow() {
    // The parser refuses divisions above 2^26; the rounding is safe against any value anyway.
    let error = parse_settings(
        "roundup_power2_divisions:9223372036854775808",
        &CachingConfig::default(),
    )
    .unwrap_err();
    assert_eq!(error.kind, ErrorKind::Config);
    assert!(
        error.message.contains("roundup_power2_divisions")
            && error.message.contains("from 1 to 67108864"),
        "{}",
        error.message
    );
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
    let config = CachingConfig {
        roundup_power2_divisions: [1 << 63; 16],
        ..CachingConfig::default()
    };
    let mut a = CachingAllocator::new(backend, 0, config).unwrap();
    for size in [1000, 3 * MIB + 1, 100 * MIB + 7] {
        let p = a.malloc(size, 0).unwrap();
        a.free(p).unwrap();
    }
}

#[test]
fn a_settings_string_keeps_a_fraction_set_by_call_unless_it_names_the_key() {
    let accelerator = Accelerator::new(
        9,
        Arc::new(SimulatedBackend::new(1, 64 * MIB)),
        Arc::new(SegmentIndex::default()),
        config("per_process_memory_fraction:0.5"),
    );
    assert_eq!(
        accelerator.lock(0).unwrap().allowed_maximum(),
        Some(32 * MIB)
    );
    accelerator.set_memory_fraction(1.0, 0).unwrap();
    accelerator.set_settings("max_split_size_mb:64").unwrap();
    assert_eq!(
        accelerator.lock(0).unwrap().allowed_maximum(),
        None,
        "the unrelated string left the fraction alone"
    );
    let p = accelerator.alloc(40 * MIB, 0, 0).unwrap();
    assert!(accelerator
        .settings()
        .to_settings_string()
        .contains("per_process_memory_fraction:0.5"));
    // A string that names the key applies it.
    accelerator
        .set_settings("per_process_memory_fraction:0.25")
        .unwrap();
    assert_eq!(
        accelerator.lock(0).unwrap().allowed_maximum(),
        Some(16 * MIB)
    );
    accelerator.lock(0).unwrap().free(p).unwrap();
}
