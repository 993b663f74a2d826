//! The statistics entry points of torch.accelerator's memory API. Each has an `_on` form taking an
//! explicit device type; the plain form uses the current accelerator.

use super::guard::{current_type, fill_sized, guard, on, out_ptr, str_arg, write_text};
use super::types::{AccallocDeviceStats, AccallocDeviceType, AccallocStatus};
use crate::caching::{DeviceStats, StatType};
use crate::error::{Error, Result};
use std::ffi::c_char;

/// Fill `*out` with every statistic of `device` (-1: current). Set out->struct_size to
/// sizeof(AccallocDeviceStats) first; on return it holds the number of bytes filled.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out NULL or struct_size too small), ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_get_device_stats(
    device: i32,
    out: *mut AccallocDeviceStats,
) -> AccallocStatus {
    accalloc_get_device_stats_on(current_type(), device, out)
}

/// accalloc_get_device_stats on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_get_device_stats_on(
    device_type: AccallocDeviceType,
    device: i32,
    out: *mut AccallocDeviceStats,
) -> AccallocStatus {
    guard(|| {
        // SAFETY: AccallocDeviceStats is repr(C) and starts with struct_size; `out` is the
        // caller's (the contract stated in capi/mod.rs).
        unsafe {
            fill_sized(out, "AccallocDeviceStats", || {
                Ok(AccallocDeviceStats::from(
                    &on(device_type)?.device_stats(device)?,
                ))
            })
        }
    })
}

const ALL: usize = StatType::All as usize;

fn read_stat(
    device_type: AccallocDeviceType,
    device: i32,
    out: *mut i64,
    read: fn(&DeviceStats) -> i64,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        *out = read(&on(device_type)?.device_stats(device)?);
        Ok(())
    })
}

/// Bytes handed out now on `device` (memory_stats "allocated_bytes.all.current").
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_allocated(device: i32, out: *mut i64) -> AccallocStatus {
    accalloc_memory_allocated_on(current_type(), device, out)
}

/// accalloc_memory_allocated on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_allocated_on(
    device_type: AccallocDeviceType,
    device: i32,
    out: *mut i64,
) -> AccallocStatus {
    read_stat(device_type, device, out, |s| s.allocated_bytes[ALL].current)
}

/// Peak of bytes handed out ("allocated_bytes.all.peak").
#[no_mangle]
pub unsafe extern "C" fn accalloc_max_memory_allocated(
    device: i32,
    out: *mut i64,
) -> AccallocStatus {
    accalloc_max_memory_allocated_on(current_type(), device, out)
}

/// accalloc_max_memory_allocated on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_max_memory_allocated_on(
    device_type: AccallocDeviceType,
    device: i32,
    out: *mut i64,
) -> AccallocStatus {
    read_stat(device_type, device, out, |s| s.allocated_bytes[ALL].peak)
}

/// Bytes held from the device now, in use or cached ("reserved_bytes.all.current").
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_reserved(device: i32, out: *mut i64) -> AccallocStatus {
    accalloc_memory_reserved_on(current_type(), device, out)
}

/// accalloc_memory_reserved on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_reserved_on(
    device_type: AccallocDeviceType,
    device: i32,
    out: *mut i64,
) -> AccallocStatus {
    read_stat(device_type, device, out, |s| s.reserved_bytes[ALL].current)
}

/// Peak of bytes held from the device ("reserved_bytes.all.peak").
#[no_mangle]
pub unsafe extern "C" fn accalloc_max_memory_reserved(
    device: i32,
    out: *mut i64,
) -> AccallocStatus {
    accalloc_max_memory_reserved_on(current_type(), device, out)
}

/// accalloc_max_memory_reserved on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_max_memory_reserved_on(
    device_type: AccallocDeviceType,
    device: i32,
    out: *mut i64,
) -> AccallocStatus {
    read_stat(device_type, device, out, |s| s.reserved_bytes[ALL].peak)
}

/// Zero the "allocated" and "freed" totals of every statistic and the five event counters.
#[no_mangle]
pub extern "C" fn accalloc_reset_accumulated_memory_stats(device: i32) -> AccallocStatus {
    accalloc_reset_accumulated_memory_stats_on(current_type(), device)
}

/// accalloc_reset_accumulated_memory_stats on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_reset_accumulated_memory_stats_on(
    device_type: AccallocDeviceType,
    device: i32,
) -> AccallocStatus {
    guard(|| on(device_type)?.reset_accumulated_stats(device))
}

/// Set every peak to its current value.
#[no_mangle]
pub extern "C" fn accalloc_reset_peak_memory_stats(device: i32) -> AccallocStatus {
    accalloc_reset_peak_memory_stats_on(current_type(), device)
}

/// accalloc_reset_peak_memory_stats on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_reset_peak_memory_stats_on(
    device_type: AccallocDeviceType,
    device: i32,
) -> AccallocStatus {
    guard(|| on(device_type)?.reset_peak_stats(device))
}

/// Read one statistic by its memory_stats() key, e.g. "reserved_bytes.large_pool.peak" or
/// "num_ooms". Errors: ACCALLOC_ERROR_INVALID_ARGUMENT for a NULL or unknown key.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_stat(
    device: i32,
    key: *const c_char,
    out: *mut i64,
) -> AccallocStatus {
    accalloc_memory_stat_on(current_type(), device, key, out)
}

/// accalloc_memory_stat on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_stat_on(
    device_type: AccallocDeviceType,
    device: i32,
    key: *const c_char,
    out: *mut i64,
) -> AccallocStatus {
    guard(|| {
        let key = str_arg(key, "key")?;
        let out = out_ptr(out, "out")?;
        *out = lookup(&on(device_type)?.device_stats(device)?, key)?;
        Ok(())
    })
}

fn lookup(stats: &DeviceStats, key: &str) -> Result<i64> {
    stats.get(key).ok_or_else(|| {
        Error::invalid_argument(format!(
            "unknown statistic {}: keys look like 'allocated_bytes.all.current' \
             (<family>.<all|small_pool|large_pool>.<current|peak|allocated|freed>) or 'num_ooms'",
            crate::error::quote(key)
        ))
    })
}

/// Write every statistic of `device` as one JSON object with PyTorch's 122 keys, sorted, plus a NUL.
/// `*len` receives the bytes needed including the NUL. With buf NULL this only sets *len; with cap too
/// small it returns ACCALLOC_ERROR_BUFFER_TOO_SMALL and leaves buf untouched.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_stats_json(
    device: i32,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    accalloc_memory_stats_json_on(current_type(), device, buf, cap, len)
}

/// accalloc_memory_stats_json on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_stats_json_on(
    device_type: AccallocDeviceType,
    device: i32,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    guard(|| {
        out_ptr(len, "len")?;
        let json = on(device_type)?.device_stats(device)?.to_json();
        write_text(&json, buf, cap, len)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caching::stats::FLAT_KEY_COUNT;
    use std::mem::{offset_of, size_of};

    /// The C struct is struct_size followed by every statistic of the table, in the table's field
    /// order, and the conversion puts each value in its place: the i64s after struct_size, read in
    /// memory order, are DeviceStats::entries().
    #[test]
    fn the_c_struct_holds_the_table_in_order() {
        let mut stats = DeviceStats::default();
        for (i, (_, value)) in stats.entries_mut().into_iter().enumerate() {
            *value = 1000 + i as i64;
        }
        let c = AccallocDeviceStats::from(&stats);
        assert_eq!(c.struct_size, size_of::<AccallocDeviceStats>());
        let first = offset_of!(AccallocDeviceStats, allocation);
        assert_eq!(
            size_of::<AccallocDeviceStats>() - first,
            FLAT_KEY_COUNT * size_of::<i64>(),
            "AccallocDeviceStats holds other than the table's {FLAT_KEY_COUNT} statistics"
        );
        // SAFETY: AccallocDeviceStats is repr(C): `first` is the first i64 (aligned) and
        // FLAT_KEY_COUNT i64s follow it to the end of the struct (checked above).
        let values = unsafe {
            std::slice::from_raw_parts(
                (&c as *const AccallocDeviceStats as *const u8).add(first) as *const i64,
                FLAT_KEY_COUNT,
            )
        };
        for (i, (key, want)) in stats.entries().into_iter().enumerate() {
            assert_eq!(
                values[i], want,
                "AccallocDeviceStats's statistic number {i} should be {key}"
            );
        }
    }
}
