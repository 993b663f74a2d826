//! The C ABI from Rust, as a C caller sees it: statuses, out-pointers, messages and figures.
//! One test function: the runtime is process-wide, so the steps run in a known order.

use accalloc::capi::device::*;
use accalloc::capi::info::*;
use accalloc::capi::memory::*;
use accalloc::capi::stats::*;
use accalloc::capi::*;
use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};

mod common;
use common::{last_error, stat};

fn stats() -> AccallocDeviceStats {
    common::stats(-1)
}

#[test]
fn c_abi_end_to_end() {
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "256MiB");
    std::env::set_var("ACCALLOC_HOST_DEVICES", "2");
    unsafe {
        assert_eq!(accalloc_current_accelerator(), ACCALLOC_DEVICE_HOST);
        assert_eq!(
            CStr::from_ptr(accalloc_device_type_name(ACCALLOC_DEVICE_HOST)).to_str(),
            Ok("host")
        );
        assert_eq!(
            CStr::from_ptr(accalloc_device_type_name(42)).to_str(),
            Ok("unknown")
        );
        assert_eq!(accalloc_abi_version(), ACCALLOC_ABI_VERSION);
        assert_eq!(
            CStr::from_ptr(accalloc_version()).to_str(),
            Ok(env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(last_error(), "");

        let mut count = 0;
        assert_eq!(
            accalloc_device_count(&mut count),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(count, 2);

        // Size 0 gives NULL and changes nothing.
        let mut p: *mut c_void = std::ptr::dangling_mut::<c_void>();
        assert_eq!(
            accalloc_malloc(&mut p, 0, -1, null_mut()),
            AccallocStatus::ACCALLOC_OK
        );
        assert!(p.is_null());
        assert_eq!(stats().num_device_alloc, 0);

        assert_eq!(
            accalloc_malloc(&mut p, 1000, -1, null_mut()),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(p as usize % 512, 0);
        std::ptr::write_bytes(p as *mut u8, 7, 1000);
        let s = stats();
        assert_eq!(s.allocated_bytes[ACCALLOC_STAT_ALL].current, 1024);
        assert_eq!(s.reserved_bytes[ACCALLOC_STAT_SMALL_POOL].current, 2 << 20);
        assert_eq!(stat("requested_bytes.all.current"), 1000);
        assert_eq!(stat("max_split_size"), -1);
        let mut value = 0;
        assert_eq!(
            accalloc_memory_allocated(-1, &mut value),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(value, 1024);
        assert_eq!(
            accalloc_max_memory_reserved(0, &mut value),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(value, 2 << 20);

        // JSON: a size query, a too-small buffer, then the real thing.
        let mut len = 0;
        assert_eq!(
            accalloc_memory_stats_json(-1, null_mut(), 0, &mut len),
            AccallocStatus::ACCALLOC_OK
        );
        let mut small = vec![0x55 as std::ffi::c_char; 8];
        assert_eq!(
            accalloc_memory_stats_json(-1, small.as_mut_ptr(), small.len(), &mut len),
            AccallocStatus::ACCALLOC_ERROR_BUFFER_TOO_SMALL
        );
        assert!(
            small.iter().all(|&c| c == 0x55),
            "a too-small buffer is left untouched"
        );
        let mut buf = vec![0 as std::ffi::c_char; len];
        assert_eq!(
            accalloc_memory_stats_json(-1, buf.as_mut_ptr(), len, &mut len),
            AccallocStatus::ACCALLOC_OK
        );
        let json: serde_json::Value =
            serde_json::from_str(CStr::from_ptr(buf.as_ptr()).to_str().unwrap()).unwrap();
        let object = json.as_object().unwrap();
        assert_eq!(object.len(), 122);
        assert_eq!(object["allocated_bytes.all.current"], 1024);
        assert!(object.keys().zip(object.keys().skip(1)).all(|(a, b)| a < b));

        // A request no device could hold: out of memory with PyTorch's message, one OOM counted.
        let ooms_before = stats().num_ooms;
        let mut q: *mut c_void = null_mut();
        assert_eq!(
            accalloc_malloc(&mut q, 1 << 40, -1, null_mut()),
            AccallocStatus::ACCALLOC_ERROR_OUT_OF_MEMORY
        );
        assert!(q.is_null());
        assert!(
            last_error().starts_with(
                "host out of memory. Tried to allocate 1024.00 GiB. Device 0 has a total capacity of \
                 256.00 MiB of which 254.00 MiB is free. Of the allocated memory 1024 bytes is allocated \
                 by the allocator, and 2.00 MiB is reserved but unallocated."
            ),
            "{}",
            last_error()
        );
        assert_eq!(stats().num_ooms, ooms_before + 1);

        // Bad input: a status, a message, nothing changed.
        let before = stats();
        assert_eq!(
            accalloc_malloc(null_mut(), 8, -1, null_mut()),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(last_error(), "out is NULL");
        assert_eq!(
            accalloc_malloc(&mut p, 8, 2, null_mut()),
            AccallocStatus::ACCALLOC_ERROR_INVALID_DEVICE
        );
        assert!(
            last_error().contains("device 2 does not exist"),
            "{}",
            last_error()
        );
        assert_eq!(
            accalloc_malloc(&mut p, 8, -2, null_mut()),
            AccallocStatus::ACCALLOC_ERROR_INVALID_DEVICE
        );
        assert_eq!(
            accalloc_free((p as usize + 512) as *mut c_void),
            AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER
        );
        let mut local = 0u64;
        assert_eq!(
            accalloc_free(&mut local as *mut u64 as *mut c_void),
            AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER
        );
        assert!(
            last_error().contains("was not allocated by accalloc"),
            "{}",
            last_error()
        );
        let key = CString::new("allocated_bytes.all.now").unwrap();
        assert_eq!(
            accalloc_memory_stat(-1, key.as_ptr(), &mut value),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("unknown statistic 'allocated_bytes.all.now'"));
        assert_eq!(
            accalloc_memory_stat(-1, null(), &mut value),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            accalloc_set_memory_fraction(1.5, -1),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            accalloc_set_memory_fraction(f64::NAN, -1),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        let mut zero_sized = AccallocDeviceStats::default();
        assert_eq!(
            accalloc_get_device_stats(-1, &mut zero_sized),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            accalloc_get_device_stats(-1, null_mut()),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            accalloc_memory_stats_json(-1, null_mut(), 0, null_mut()),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            accalloc_mem_get_info(-1, null_mut(), &mut local),
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            accalloc_set_device(5),
            AccallocStatus::ACCALLOC_ERROR_INVALID_DEVICE
        );
        assert_eq!(
            accalloc_set_device(-1),
            AccallocStatus::ACCALLOC_ERROR_INVALID_DEVICE
        );
        assert_eq!(stats(), before, "failed calls changed the statistics");

        // An older caller with a shorter struct gets only its prefix.
        let mut prefix = AccallocDeviceStats {
            struct_size: 8 + 32,
            ..Default::default()
        };
        assert_eq!(
            accalloc_get_device_stats(-1, &mut prefix),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(prefix.struct_size, 40);
        assert_eq!(prefix.allocation[ACCALLOC_STAT_ALL].current, 1);
        assert_eq!(
            prefix.allocation[ACCALLOC_STAT_SMALL_POOL],
            AccallocStat::default()
        );

        // Free, double free, empty_cache.
        assert_eq!(accalloc_free(p), AccallocStatus::ACCALLOC_OK);
        assert_eq!(
            accalloc_free(p),
            AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER
        );
        assert!(last_error().contains("already freed"), "{}", last_error());
        assert_eq!(accalloc_free(null_mut()), AccallocStatus::ACCALLOC_OK);
        assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
        let s = stats();
        assert_eq!(
            (
                s.reserved_bytes[ACCALLOC_STAT_ALL].current,
                s.num_device_free,
                s.num_sync_all_streams
            ),
            (0, 1, 1)
        );

        // Devices are separate; the current device is per thread.
        assert_eq!(accalloc_set_device(1), AccallocStatus::ACCALLOC_OK);
        let mut current = -1;
        assert_eq!(
            accalloc_current_device(&mut current),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(current, 1);
        std::thread::spawn(|| {
            let mut current = -1;
            assert_eq!(
                accalloc_current_device(&mut current),
                AccallocStatus::ACCALLOC_OK
            );
            assert_eq!(current, 0, "a new thread starts on device 0");
        })
        .join()
        .unwrap();
        assert_eq!(
            accalloc_malloc(&mut p, 3 << 20, -1, null_mut()),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(stat("reserved_bytes.large_pool.current"), 20 << 20);
        let (mut free, mut total) = (0u64, 0u64);
        assert_eq!(
            accalloc_mem_get_info(1, &mut free, &mut total),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!((free, total), ((236 << 20), 256 << 20));
        assert_eq!(
            accalloc_mem_get_info(0, &mut free, &mut total),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(free, 256 << 20);

        // Fraction: device 1 may hold 64 MiB; 50 MiB more does not fit beside 20 MiB.
        assert_eq!(
            accalloc_set_memory_fraction(0.25, 1),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(
            accalloc_malloc(&mut q, 50 << 20, 1, null_mut()),
            AccallocStatus::ACCALLOC_ERROR_OUT_OF_MEMORY
        );
        assert!(
            last_error().contains("64.00 MiB allowed; "),
            "{}",
            last_error()
        );
        assert_eq!(stat("num_ooms"), 1);
        assert_eq!(accalloc_free(p), AccallocStatus::ACCALLOC_OK);

        // Resets.
        assert_eq!(
            accalloc_reset_peak_memory_stats(1),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(stat("allocated_bytes.all.peak"), 0);
        assert_eq!(
            accalloc_reset_accumulated_memory_stats(1),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(
            (stat("allocated_bytes.all.allocated"), stat("num_ooms")),
            (0, 0)
        );
        assert_eq!(
            stat("reserved_bytes.all.current"),
            20 << 20,
            "resets leave current values"
        );
        assert_eq!(
            accalloc_reset_peak_memory_stats(9),
            AccallocStatus::ACCALLOC_ERROR_INVALID_DEVICE
        );

        // record_stream: host events complete at once, so the block returns at the next malloc.
        let stream_a = 0x10 as *mut c_void;
        let stream_b = 0x20 as *mut c_void;
        assert_eq!(
            accalloc_malloc(&mut p, 1000, 1, stream_a),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(
            accalloc_record_stream(p, stream_b),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(accalloc_free(p), AccallocStatus::ACCALLOC_OK);
        assert_eq!(stat("active.all.current"), 1, "pending on stream b's event");
        assert_eq!(
            accalloc_malloc(&mut q, 1000, 1, stream_a),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(q, p, "the event completed and the block was reused");
        assert_eq!(
            accalloc_record_stream(q, stream_a),
            AccallocStatus::ACCALLOC_OK
        );
        assert_eq!(accalloc_free(q), AccallocStatus::ACCALLOC_OK);
        assert_eq!(
            accalloc_record_stream(q, stream_b),
            AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER
        );
        assert_eq!(
            accalloc_record_stream(&mut local as *mut u64 as *mut c_void, stream_b),
            AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER
        );

        for (status, name) in [
            (0, "ACCALLOC_OK"),
            (4, "ACCALLOC_ERROR_OUT_OF_MEMORY"),
            (9, "ACCALLOC_ERROR_INTERNAL"),
            (99, "ACCALLOC_ERROR_UNKNOWN"),
        ] {
            assert_eq!(
                CStr::from_ptr(accalloc_status_name(status)).to_str(),
                Ok(name)
            );
        }
    }
}
