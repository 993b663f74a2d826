//! The benchmark's two-path rows (accalloc_tools::replay::bench): the one-device shortcut and the general
//! path timed in turns on one device, the shortcut suspended for each general batch and restored
//! after it; then other devices put in use, after which the shortcut is gone for good. A process of
//! its own: it gives the shortcut up.
//!
//! The timings themselves cannot be checked; what suspending and restoring must do can:
//! - both paths serve the same device's books: every pair of both kinds is counted on host device
//!   0, exactly, and nothing stays allocated;
//! - suspending changes no figure: a second comparison, once the cache is warm, leaves every current
//!   and peak statistic and the device call counts as they were before it (the general path takes
//!   the same cached blocks as the shortcut, and asks the device for nothing);
//! - the shortcut is restored: the second comparison finds it taken again after the warm-up (a
//!   suspended shortcut left unrestored is never taken back, so it would find none);
//! - once other devices hold memory, the shortcut is given up for good, and the general path still
//!   counts every pair on host device 0 while each other device keeps the one segment it was given.

#[path = "../../../tests/common/mod.rs"]
mod common;

use accalloc::capi::device::{accalloc_device_count_on, accalloc_device_type_name};
use accalloc::capi::stats::accalloc_get_device_stats_on;
use accalloc::capi::{
    AccallocDeviceStats, AccallocDeviceType, AccallocStat, AccallocStatus, ACCALLOC_DEVICE_HOST,
    ACCALLOC_STAT_ALL,
};
use accalloc_tools::replay::bench::{general_path, several_devices, DEVICES_IN_USE, SIZES};
use std::ffi::CStr;

const ALL: usize = ACCALLOC_STAT_ALL;
const BATCHES: usize = 3;
/// A multiple of SIZES.len(), so that each batch takes every size equally often.
const PAIRS: usize = 200;

fn stats_on(device_type: AccallocDeviceType, device: i32) -> AccallocDeviceStats {
    let mut out = AccallocDeviceStats {
        struct_size: std::mem::size_of::<AccallocDeviceStats>(),
        ..Default::default()
    };
    // SAFETY: a valid out-pointer with its struct_size set.
    let status = unsafe { accalloc_get_device_stats_on(device_type, device, &mut out) };
    assert_eq!(
        status,
        AccallocStatus::ACCALLOC_OK,
        "{}",
        common::last_error()
    );
    out
}

fn host() -> AccallocDeviceStats {
    stats_on(ACCALLOC_DEVICE_HOST, 0)
}

/// The statistics without their running totals (allocated and freed): what a malloc+free pair
/// served from the cache must leave as it found it.
fn without_totals(mut s: AccallocDeviceStats) -> AccallocDeviceStats {
    let mut clear = |stat: &mut AccallocStat| {
        stat.allocated = 0;
        stat.freed = 0;
    };
    for array in [
        &mut s.allocation,
        &mut s.segment,
        &mut s.active,
        &mut s.inactive_split,
        &mut s.allocated_bytes,
        &mut s.reserved_bytes,
        &mut s.active_bytes,
        &mut s.inactive_split_bytes,
        &mut s.requested_bytes,
    ] {
        array.iter_mut().for_each(&mut clear);
    }
    clear(&mut s.oversize_allocations);
    clear(&mut s.oversize_segments);
    s
}

/// How many malloc+free pairs, and of how many bytes, a step added to host device 0's books.
fn pairs_between(before: &AccallocDeviceStats, after: &AccallocDeviceStats) -> (i64, i64) {
    let count = after.allocation[ALL].allocated - before.allocation[ALL].allocated;
    let freed = after.allocation[ALL].freed - before.allocation[ALL].freed;
    assert_eq!(count, freed, "every block handed out was freed");
    let bytes = after.allocated_bytes[ALL].allocated - before.allocated_bytes[ALL].allocated;
    let requested = after.requested_bytes[ALL].allocated - before.requested_bytes[ALL].allocated;
    // SIZES are multiples of 512: nothing is rounded.
    assert_eq!(bytes, requested);
    (count, bytes)
}

/// What `pairs` pairs cycling through SIZES count: (pairs, bytes).
fn cycling(pairs: usize) -> (i64, i64) {
    assert_eq!(pairs % SIZES.len(), 0);
    let bytes = SIZES.iter().sum::<usize>() * (pairs / SIZES.len());
    (pairs as i64, bytes as i64)
}

/// What general_path(BATCHES, PAIRS) counts: one warm-up pair of each size, then BATCHES batches of
/// PAIRS pairs on each path.
fn one_comparison() -> (i64, i64) {
    let (warm, warm_bytes) = cycling(SIZES.len());
    let (batch, batch_bytes) = cycling(PAIRS);
    let batches = 2 * BATCHES as i64;
    (warm + batches * batch, warm_bytes + batches * batch_bytes)
}

/// Nothing allocated or in use on host device 0.
fn assert_nothing_held(s: &AccallocDeviceStats, when: &str) {
    assert_eq!(
        (
            s.allocation[ALL].current,
            s.active[ALL].current,
            s.allocated_bytes[ALL].current,
            s.requested_bytes[ALL].current
        ),
        (0, 0, 0, 0),
        "{when}"
    );
    assert_eq!((s.num_ooms, s.num_alloc_retries), (0, 0), "{when}");
}

/// The device type the benchmark registered its other devices under.
fn bench_devices_type() -> AccallocDeviceType {
    (2..16)
        .find(|&t| {
            let name = unsafe { CStr::from_ptr(accalloc_device_type_name(t)) };
            name.to_bytes() == b"bench-devices"
        })
        .expect("several_devices registered its backend as bench-devices")
}

#[test]
fn the_general_path_is_timed_beside_the_shortcut_until_other_devices_hold_memory() {
    std::env::set_var("ACCALLOC_HOST_DEVICES", "1");
    std::env::set_var("ACCALLOC_DEVICE", "host");

    // The first comparison fills the cache.
    let start = host();
    let (shortcut, general) =
        general_path(BATCHES, PAIRS).expect("one device in use: the shortcut");
    assert!(shortcut > 0.0 && general > 0.0 && shortcut.is_finite() && general.is_finite());
    let warm = host();
    assert_eq!(pairs_between(&start, &warm), one_comparison());
    assert_nothing_held(&warm, "after the first comparison");

    // The second finds the shortcut restored, and leaves every figure as it was.
    let (shortcut, general) =
        general_path(BATCHES, PAIRS).expect("the shortcut was restored after each general batch");
    assert!(shortcut > 0.0 && general > 0.0);
    let again = host();
    assert_eq!(pairs_between(&warm, &again), one_comparison());
    assert_eq!(
        without_totals(again),
        without_totals(warm),
        "a comparison on a warm cache changes no current or peak figure and asks the device for \
         nothing"
    );
    assert!(again.segment[ALL].current > 0 && again.num_device_free == 0);

    // Other devices put in use: the rows, then the shortcut gone for good.
    let rows = several_devices(BATCHES, PAIRS);
    assert_eq!(
        rows.iter().map(|&(devices, _)| devices).collect::<Vec<_>>(),
        DEVICES_IN_USE.to_vec()
    );
    assert!(rows.iter().all(|&(_, ns)| ns > 0.0 && ns.is_finite()));
    let spread = host();
    // Each row: a warm-up pair of each size, then BATCHES batches of PAIRS pairs, on host device 0.
    let (warm_pairs, warm_bytes) = cycling(SIZES.len());
    let (batch, batch_bytes) = cycling(PAIRS);
    let rows_count = DEVICES_IN_USE.len() as i64;
    assert_eq!(
        pairs_between(&again, &spread),
        (
            rows_count * (warm_pairs + BATCHES as i64 * batch),
            rows_count * (warm_bytes + BATCHES as i64 * batch_bytes)
        )
    );
    assert_nothing_held(&spread, "after the rows of several devices");
    assert_eq!(without_totals(spread), without_totals(again));

    // The other devices: one device short of the most devices in use, each holding the one cached
    // segment (a small pool's 2 MiB) its 4 KiB block was cut from, and nothing allocated.
    let others = bench_devices_type();
    let mut count = 0;
    assert_eq!(
        unsafe { accalloc_device_count_on(others, &mut count) },
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(count as usize, DEVICES_IN_USE.iter().max().unwrap() - 1);
    for device in 0..count {
        let s = stats_on(others, device);
        assert_eq!(
            (
                s.segment[ALL].current,
                s.reserved_bytes[ALL].current,
                s.allocation[ALL].allocated,
                s.allocated_bytes[ALL].allocated,
                s.allocation[ALL].current
            ),
            (1, 2 << 20, 1, 4096, 0),
            "bench-devices device {device}"
        );
    }

    assert!(
        general_path(BATCHES, PAIRS).is_none(),
        "with other devices in use the shortcut is given up for good"
    );
    // Its warm-up still went to host device 0, on the general path.
    let last = host();
    assert_eq!(pairs_between(&spread, &last), cycling(SIZES.len()));
    assert_nothing_held(&last, "at the end");
}
