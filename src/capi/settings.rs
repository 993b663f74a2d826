//! Allocator settings at run time.

use super::guard::{current_type, guard, on, str_arg, write_text};
use super::types::{AccallocDeviceType, AccallocStatus};
use std::ffi::c_char;

/// Change the current accelerator's allocator settings, in PYTORCH_ALLOC_CONF's syntax (the same as
/// the ACCALLOC_CONF environment variable), e.g.
/// "max_split_size_mb:128,roundup_power2_divisions:[64:8,>:1]". max_split_size_mb,
/// roundup_power2_divisions and garbage_collection_threshold return to their defaults unless named;
/// other keys keep their values. Errors: ACCALLOC_ERROR_CONFIG with a message naming the key, the value
/// and what is allowed; the settings in force stay as they were.
#[no_mangle]
pub unsafe extern "C" fn accalloc_set_allocator_settings(conf: *const c_char) -> AccallocStatus {
    accalloc_set_allocator_settings_on(current_type(), conf)
}

/// accalloc_set_allocator_settings on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_set_allocator_settings_on(
    device_type: AccallocDeviceType,
    conf: *const c_char,
) -> AccallocStatus {
    guard(|| {
        let text = str_arg(conf, "conf")?;
        on(device_type)?.set_settings(text)
    })
}

/// The settings in force as a configuration string ("" for the defaults), written like
/// accalloc_memory_stats_json: buf NULL asks for the size, *len receives the bytes needed including the NUL.
#[no_mangle]
pub unsafe extern "C" fn accalloc_get_allocator_settings(
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    accalloc_get_allocator_settings_on(current_type(), buf, cap, len)
}

/// accalloc_get_allocator_settings of the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_get_allocator_settings_on(
    device_type: AccallocDeviceType,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> AccallocStatus {
    guard(|| {
        let text = on(device_type)?.settings().to_settings_string();
        write_text(&text, buf, cap, len)
    })
}
