//! Any thread may call any function: many threads allocate and free on two devices at once, and the
//! books balance afterwards.

use accalloc::capi::device::accalloc_set_device;
use accalloc::capi::memory::{
    accalloc_allocation_info, accalloc_empty_cache, accalloc_free, accalloc_malloc,
    accalloc_record_stream,
};

use accalloc::capi::{AccallocStatus, ACCALLOC_STAT_ALL};
use std::ffi::c_void;

/// More threads than this machine's two cores.
const THREADS: usize = 6;
const ROUNDS: usize = 3_000;

mod common;
use common::stats;

#[test]
fn concurrent_malloc_free_keeps_exact_books() {
    std::env::set_var("ACCALLOC_HOST_DEVICES", "2");
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "4GiB");
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let device = (t % 2) as i32;
                assert_eq!(accalloc_set_device(device), AccallocStatus::ACCALLOC_OK);
                let mut held: Vec<usize> = Vec::new();
                let mut state = t as u64 * 7919 + 1;
                for round in 0..ROUNDS {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let size = 1 + (state >> 33) as usize % (3 << 20);
                    let mut p: *mut c_void = std::ptr::null_mut();
                    let stream = ((t % 3) * 8) as *mut c_void;
                    assert_eq!(
                        unsafe { accalloc_malloc(&mut p, size, -1, stream) },
                        AccallocStatus::ACCALLOC_OK
                    );
                    unsafe { *(p as *mut u8) = t as u8 };
                    if round % 13 == 0 {
                        // A block this thread holds is its own, whatever the others do meanwhile:
                        // its size at least the request's, in 512-byte units, on this device.
                        let (mut bytes, mut on) = (0u64, -1i32);
                        let status = unsafe {
                            accalloc_allocation_info(p, &mut bytes, std::ptr::null_mut(), &mut on)
                        };
                        assert_eq!(status, AccallocStatus::ACCALLOC_OK);
                        assert!(
                            bytes as usize >= size && bytes % 512 == 0,
                            "{bytes} for {size}"
                        );
                        assert_eq!(on, device);
                    }
                    held.push(p as usize);
                    if round % 3 != 0 || held.len() > 64 {
                        let victim = held.swap_remove((state as usize >> 7) % held.len());
                        assert_eq!(
                            unsafe { accalloc_free(victim as *mut c_void) },
                            AccallocStatus::ACCALLOC_OK
                        );
                    }
                    if t == 0 && round % 500 == 0 {
                        assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
                    }
                    if round % 97 == 0 {
                        // Statistics read while other threads allocate stay consistent snapshots.
                        let s = stats(device);
                        assert!(
                            s.allocated_bytes[ACCALLOC_STAT_ALL].current
                                <= s.reserved_bytes[ACCALLOC_STAT_ALL].current
                        );
                        assert!(
                            s.active[ACCALLOC_STAT_ALL].current
                                >= s.allocation[ACCALLOC_STAT_ALL].current
                        );
                    }
                    if round % 31 == 0 {
                        if let Some(&shared) = held.last() {
                            let other = ((t + 1) % 3 * 8 + 8) as *mut c_void;
                            assert_eq!(
                                unsafe { accalloc_record_stream(shared as *mut c_void, other) },
                                AccallocStatus::ACCALLOC_OK
                            );
                        }
                    }
                }
                for p in held {
                    assert_eq!(
                        unsafe { accalloc_free(p as *mut c_void) },
                        AccallocStatus::ACCALLOC_OK
                    );
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let per_device = (THREADS / 2 * ROUNDS) as i64;
    for device in 0..2 {
        let s = stats(device);
        assert_eq!(s.allocation[ACCALLOC_STAT_ALL].current, 0);
        assert_eq!(s.allocation[ACCALLOC_STAT_ALL].allocated, per_device);
        assert_eq!(s.allocation[ACCALLOC_STAT_ALL].freed, per_device);
        assert_eq!(s.allocated_bytes[ACCALLOC_STAT_ALL].current, 0);
        // Blocks freed after record_stream stay active until their events are seen to complete
        // (at the next malloc, or the synchronization of empty_cache below).
    }
    // A full recount of every device's books.
    let runtime = accalloc::runtime::runtime().unwrap();
    for device in 0..2 {
        runtime
            .current()
            .lock(device)
            .unwrap()
            .check_invariants()
            .unwrap();
    }
    assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
    for device in 0..2 {
        let s = stats(device);
        assert_eq!(s.reserved_bytes[ACCALLOC_STAT_ALL].current, 0);
        assert_eq!(s.active_bytes[ACCALLOC_STAT_ALL].current, 0);
        assert_eq!(s.requested_bytes[ACCALLOC_STAT_ALL].current, 0);
        assert_eq!(s.num_device_alloc, s.num_device_free);
        assert_eq!(s.inactive_split[ACCALLOC_STAT_ALL].current, 0);
    }
}
