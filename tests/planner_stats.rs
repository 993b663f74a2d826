//! accalloc_planner_stats through the C ABI: off by default, on with planned_placement, counting a
//! repeating step served at planned addresses; bad arguments refused with a message.

use accalloc::capi::memory::{accalloc_free, accalloc_malloc};
use accalloc::capi::planned::{accalloc_planner_stats, AccallocPlannerStats};
use accalloc::capi::settings::accalloc_set_allocator_settings;
use accalloc::capi::AccallocStatus;
use std::ffi::{c_void, CString};

mod common;
use common::last_error;

fn planner_stats(device: i32) -> (AccallocStatus, AccallocPlannerStats) {
    let mut out = AccallocPlannerStats {
        struct_size: std::mem::size_of::<AccallocPlannerStats>(),
        ..Default::default()
    };
    let status = unsafe { accalloc_planner_stats(device, &mut out) };
    (status, out)
}

fn malloc(size: usize) -> *mut c_void {
    let mut p: *mut c_void = std::ptr::null_mut();
    let status = unsafe { accalloc_malloc(&mut p, size, -1, std::ptr::null_mut()) };
    assert_eq!(status, AccallocStatus::ACCALLOC_OK, "{}", last_error());
    p
}

/// One step: 40 blocks of 2 MiB + i x 4 KiB, each freed once the next is made.
fn chain_step() {
    let mut previous: Option<*mut c_void> = None;
    for i in 0..40 {
        let p = malloc((2 << 20) + i * 4096);
        if let Some(q) = previous.replace(p) {
            assert_eq!(unsafe { accalloc_free(q) }, AccallocStatus::ACCALLOC_OK);
        }
    }
    assert_eq!(
        unsafe { accalloc_free(previous.unwrap()) },
        AccallocStatus::ACCALLOC_OK
    );
}

#[test]
fn the_planner_is_seen_through_the_c_abi() {
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "1GiB");
    // Off by default: the struct says so and holds nothing else.
    let (status, off) = planner_stats(-1);
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    assert_eq!(
        off,
        AccallocPlannerStats {
            struct_size: std::mem::size_of::<AccallocPlannerStats>(),
            ..Default::default()
        }
    );

    let settings = CString::new("planned_placement:True").unwrap();
    assert_eq!(
        unsafe { accalloc_set_allocator_settings(settings.as_ptr()) },
        AccallocStatus::ACCALLOC_OK
    );
    for _ in 0..6 {
        chain_step();
    }
    let (status, on) = planner_stats(-1);
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    assert_eq!((on.enabled, on.in_force), (1, 1), "{on:?}");
    assert!(on.plans >= 1 && on.attempts >= on.plans, "{on:?}");
    assert_eq!(on.dropped, 0);
    // The chain's floor, two blocks of 2 MiB and more, at least.
    assert!(on.plan_height >= 4 << 20, "{on:?}");
    chain_step();
    let (_, after) = planner_stats(-1);
    assert_eq!(
        after.advised - on.advised,
        40,
        "every request of a step advised"
    );
    assert_eq!(after.conflicts, on.conflicts);

    // A caller built against a shorter struct gets the bytes it knows of.
    let mut short = AccallocPlannerStats {
        struct_size: std::mem::size_of::<usize>() + 2 * std::mem::size_of::<i32>(),
        ..Default::default()
    };
    assert_eq!(
        unsafe { accalloc_planner_stats(0, &mut short) },
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!((short.enabled, short.in_force, short.plans), (1, 1, 0));
    assert_eq!(short.struct_size, 16);

    // Refused, with a message: no struct, a struct_size too small, a device that is not there.
    assert_eq!(
        unsafe { accalloc_planner_stats(0, std::ptr::null_mut()) },
        AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("out"), "{}", last_error());
    let mut tiny = AccallocPlannerStats {
        struct_size: 2,
        ..Default::default()
    };
    assert_eq!(
        unsafe { accalloc_planner_stats(0, &mut tiny) },
        AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("struct_size"), "{}", last_error());
    assert_eq!(
        planner_stats(7).0,
        AccallocStatus::ACCALLOC_ERROR_INVALID_DEVICE
    );

    // Off again at run time: the planner goes with the setting.
    let settings = CString::new("planned_placement:False").unwrap();
    assert_eq!(
        unsafe { accalloc_set_allocator_settings(settings.as_ptr()) },
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(planner_stats(0).1.enabled, 0);
}
