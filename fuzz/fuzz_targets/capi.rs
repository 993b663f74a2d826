//! Sequences of C API calls with hostile arguments: foreign, interior and freed pointers, huge sizes,
//! negative and missing devices, NULL out-pointers, bad keys, fractions and settings strings. Every
//! call must return a status (never ACCALLOC_ERROR_INTERNAL, which would mean a caught panic), and after
//! freeing what it got, each input leaves nothing allocated.
#![no_main]

use accalloc::capi::device::*;
use accalloc::capi::memory::*;
use accalloc::capi::settings::accalloc_set_allocator_settings;
use accalloc::capi::stats::*;
use accalloc::capi::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::{c_void, CString};

fn ok_or_expected(status: AccallocStatus) {
    assert_ne!(status, AccallocStatus::ACCALLOC_ERROR_INTERNAL, "a panic reached the boundary");
}

fuzz_target!(|data: &[u8]| {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        std::env::set_var("ACCALLOC_HOST_CAPACITY", "512MiB");
        std::env::set_var("ACCALLOC_HOST_DEVICES", "2");
    });
    let mut live: Vec<usize> = Vec::new();
    let mut bytes = data.chunks(9);
    unsafe {
        while let Some(chunk) = bytes.next() {
            let op = chunk[0];
            let arg = chunk.iter().skip(1).fold(0u64, |acc, &b| (acc << 8) | b as u64);
            let device = (arg as i32 % 4) - 1; // -1 .. 2: current, two devices, one that does not exist
            match op % 12 {
                0 | 1 | 2 => {
                    let size = match op % 3 {
                        0 => (arg % 4096) as usize,
                        1 => (arg % (64 << 20)) as usize,
                        _ => arg as usize, // anything, including sizes no device can hold
                    };
                    let mut p: *mut c_void = std::ptr::null_mut();
                    let status = accalloc_malloc(&mut p, size, device, ((arg >> 40) % 3) as usize as *mut c_void);
                    ok_or_expected(status);
                    if status == AccallocStatus::ACCALLOC_OK && !p.is_null() {
                        assert_eq!(p as usize % 512, 0);
                        live.push(p as usize);
                    }
                }
                3 if !live.is_empty() => {
                    let p = live.swap_remove(arg as usize % live.len());
                    assert_eq!(accalloc_free(p as *mut c_void), AccallocStatus::ACCALLOC_OK);
                    // A double free and an interior pointer are reported and change nothing.
                    assert_eq!(accalloc_free(p as *mut c_void), AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
                }
                4 => {
                    // Often an interior pointer of a live block, sometimes the start of a neighbour.
                    let p = match live.first() {
                        Some(&p) => p + 512 * (1 + arg as usize % 8),
                        None => arg as usize | 1,
                    };
                    let status = accalloc_free(p as *mut c_void);
                    match live.iter().position(|&q| q == p) {
                        Some(i) => {
                            assert_eq!(status, AccallocStatus::ACCALLOC_OK);
                            live.swap_remove(i);
                        }
                        None if p != 0 => assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER),
                        None => assert_eq!(status, AccallocStatus::ACCALLOC_OK),
                    }
                }
                5 if !live.is_empty() => {
                    let p = live[arg as usize % live.len()];
                    ok_or_expected(accalloc_record_stream(p as *mut c_void, (arg % 5) as usize as *mut c_void));
                }
                6 => ok_or_expected(accalloc_empty_cache()),
                7 => ok_or_expected(accalloc_set_memory_fraction(f64::from_bits(arg), device)),
                8 => {
                    let key = CString::new(chunk.iter().skip(1).map(|&b| b.max(1)).collect::<Vec<u8>>()).unwrap();
                    let mut value = 0;
                    ok_or_expected(accalloc_memory_stat(device, key.as_ptr(), &mut value));
                    ok_or_expected(accalloc_memory_stat(device, std::ptr::null(), &mut value));
                }
                9 => {
                    let text = CString::new(chunk.iter().skip(1).map(|&b| b.max(1)).collect::<Vec<u8>>()).unwrap();
                    ok_or_expected(accalloc_set_allocator_settings(text.as_ptr()));
                }
                10 => {
                    ok_or_expected(accalloc_reset_peak_memory_stats(device));
                    ok_or_expected(accalloc_reset_accumulated_memory_stats(device));
                    ok_or_expected(accalloc_malloc(std::ptr::null_mut(), 64, device, std::ptr::null_mut()));
                }
                _ => {
                    let mut stats = AccallocDeviceStats { struct_size: (arg % 2048) as usize, ..Default::default() };
                    ok_or_expected(accalloc_get_device_stats(device, &mut stats));
                    ok_or_expected(accalloc_set_device(device));
                }
            }
        }
        for p in live {
            assert_eq!(accalloc_free(p as *mut c_void), AccallocStatus::ACCALLOC_OK);
        }
        // Allow the pending (record_stream) blocks to return, then check nothing is left allocated.
        for device in 0..2 {
            let mut allocated = -1;
            assert_eq!(accalloc_memory_allocated(device, &mut allocated), AccallocStatus::ACCALLOC_OK);
            assert_eq!(allocated, 0, "allocations lost on device {device}");
        }
        accalloc_set_allocator_settings(c"".as_ptr());
        accalloc_empty_cache();
    }
});
