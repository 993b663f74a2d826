//! Seeing inside: the summary table, the snapshot and the history of allocator events.

use super::guard::{current_type, guard, on, write_text};
use super::types::{AccallocDeviceType, AccallocStatus};
use std::ffi::c_char;

/// The statistics of `device` (-1: current) as PyTorch's memory_summary() table; `abbreviated`
/// non-zero leaves out the per-pool rows. Written like accalloc_memory_stats_json: buf NULL asks for the
/// size, *len receives the bytes needed including the NUL.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_summary(
    device: i32,
    abbreviated: i32,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    accalloc_memory_summary_on(current_type(), device, abbreviated, buf, cap, len)
}

/// accalloc_memory_summary on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_summary_on(
    device_type: AccallocDeviceType,
    device: i32,
    abbreviated: i32,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    guard(|| {
        let text = on(device_type)?.memory_summary(device, abbreviated != 0)?;
        write_text(&text, buf, cap, len)
    })
}

/// Every segment and block of every device of the current accelerator as one JSON object with the
/// fields of PyTorch's snapshot: {"segments": [...], "device_traces": [[...] per device],
/// "allocator_settings": {...}}. accalloc's own keys appear only where they say something: a
/// segment's "paused_size" (paused pages) and "planned_range" ([start, end) of it that the plan in
/// force spans, with planned_placement: on each segment the plan's range meets). Written like
/// accalloc_memory_stats_json.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_snapshot_json(
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    accalloc_memory_snapshot_json_on(current_type(), buf, cap, len)
}

/// accalloc_memory_snapshot_json of the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_memory_snapshot_json_on(
    device_type: AccallocDeviceType,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    guard(|| {
        let text = on(device_type)?.snapshot()?.to_string();
        write_text(&text, buf, cap, len)
    })
}

/// Start (`enabled` non-zero, keeping the newest `max_entries` per device) or stop recording the
/// history of allocator events (alloc, free_requested, free_completed, segment_alloc, segment_free,
/// segment_map, segment_unmap, oom) with microsecond times; the snapshot includes it as
/// device_traces. Starting again clears the history. Errors: ACCALLOC_ERROR_INVALID_ARGUMENT when enabling
/// with max_entries 0.
#[no_mangle]
pub extern "C" fn accalloc_record_memory_history(
    enabled: i32,
    max_entries: usize,
) -> AccallocStatus {
    accalloc_record_memory_history_on(current_type(), enabled, max_entries)
}

/// accalloc_record_memory_history on the accelerator of `device_type`.
#[no_mangle]
pub extern "C" fn accalloc_record_memory_history_on(
    device_type: AccallocDeviceType,
    enabled: i32,
    max_entries: usize,
) -> AccallocStatus {
    guard(|| {
        if enabled != 0 && max_entries == 0 {
            return Err(crate::error::Error::invalid_argument(
                "max_entries is 0: give how many entries to keep per device",
            ));
        }
        on(device_type)?.record_history(enabled != 0, max_entries)
    })
}
