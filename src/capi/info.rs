//! Errors and versions.

use super::guard::last_error_ptr;
use super::types::{AccallocStatus, ACCALLOC_ABI_VERSION};
use std::ffi::c_char;

/// This thread's last failure message ("" before any). Never NULL; valid until this thread's next
/// failing call.
#[no_mangle]
pub extern "C" fn accalloc_last_error_message() -> *const c_char {
    last_error_ptr()
}

/// The name of a status ("ACCALLOC_OK", "ACCALLOC_ERROR_OUT_OF_MEMORY", ...), "ACCALLOC_ERROR_UNKNOWN" for a value
/// that is not one. Never NULL; static storage.
#[no_mangle]
pub extern "C" fn accalloc_status_name(status: i32) -> *const c_char {
    let name: &'static [u8] = match status {
        0 => b"ACCALLOC_OK\0",
        1 => b"ACCALLOC_ERROR_INVALID_ARGUMENT\0",
        2 => b"ACCALLOC_ERROR_INVALID_DEVICE\0",
        3 => b"ACCALLOC_ERROR_INVALID_POINTER\0",
        4 => b"ACCALLOC_ERROR_OUT_OF_MEMORY\0",
        5 => b"ACCALLOC_ERROR_BACKEND\0",
        6 => b"ACCALLOC_ERROR_NOT_SUPPORTED\0",
        7 => b"ACCALLOC_ERROR_CONFIG\0",
        8 => b"ACCALLOC_ERROR_BUFFER_TOO_SMALL\0",
        9 => b"ACCALLOC_ERROR_INTERNAL\0",
        _ => b"ACCALLOC_ERROR_UNKNOWN\0",
    };
    name.as_ptr() as *const c_char
}

/// The library's version, "MAJOR.MINOR.PATCH". Static storage.
#[no_mangle]
pub extern "C" fn accalloc_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The library's ABI version; a program should refuse a library whose value differs from the
/// ACCALLOC_ABI_VERSION it was built with.
#[no_mangle]
pub extern "C" fn accalloc_abi_version() -> u32 {
    ACCALLOC_ABI_VERSION
}

/// Check that this library has the ABI a program was built for: pass the header's ACCALLOC_ABI_VERSION
/// (the ACCALLOC_CHECK_ABI() macro does). ACCALLOC_ERROR_NOT_SUPPORTED, with a message saying both versions,
/// when they differ: the program must not use this library.
#[no_mangle]
pub extern "C" fn accalloc_check_abi(header_abi: u32) -> AccallocStatus {
    super::guard::guard(|| {
        if header_abi == ACCALLOC_ABI_VERSION {
            return Ok(());
        }
        Err(crate::error::Error::new(
            crate::error::ErrorKind::NotSupported,
            format!(
                "this program was built against accalloc ABI {header_abi}, but the loaded libaccalloc {} \
                 provides ABI {ACCALLOC_ABI_VERSION}: rebuild the program against this library's accalloc.h, \
                 or load a library of ABI {header_abi}",
                env!("CARGO_PKG_VERSION")
            ),
        ))
    })
}

// AccallocStatus crosses the boundary as a C enum: it must stay int-sized.
const _: () = assert!(std::mem::size_of::<AccallocStatus>() == 4);
