//! The one wrapper every entry point goes through: catch panics, turn errors into a status, keep the
//! message for accalloc_last_error_message().

use super::types::AccallocStatus;
use crate::error::{Error, Result};
pub(crate) use crate::runtime::last_error::{last_error_ptr, set_last_error};
use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Run `body`; errors and panics become a status and a message, never an unwind into C.
#[inline]
pub(crate) fn guard(body: impl FnOnce() -> Result<()>) -> AccallocStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => AccallocStatus::ACCALLOC_OK,
        Ok(Err(error)) => fail(error),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(Error::new(
                crate::error::ErrorKind::Internal,
                format!("internal error in accalloc (please report it): {what}"),
            ))
        }
    }
}

#[cold]
fn fail(error: Error) -> AccallocStatus {
    set_last_error(&error.message);
    error.kind.into()
}

/// Check an out-pointer: NULL is an invalid argument naming the parameter.
#[inline]
pub(crate) fn out_ptr<'a, T>(ptr: *mut T, name: &str) -> Result<&'a mut T> {
    // SAFETY: the caller of the C function promises a non-NULL pointer is valid for writes of T.
    unsafe { ptr.as_mut() }.ok_or_else(|| Error::invalid_argument(format!("{name} is NULL")))
}

/// Fill a caller's growable struct (AccallocDeviceStats, AccallocPlannerStats): `out` points at a
/// repr(C) `T` whose first field is `struct_size: usize`, set by the caller to the size of the
/// struct it was built with. At most that many bytes of `full()` are written, and struct_size is
/// rewritten with the bytes filled, so a program built against an older header keeps working when
/// the struct grows. NULL, or a struct_size too small to hold struct_size itself, is an invalid
/// argument naming `type_name`.
///
/// # Safety
/// `T` is repr(C) and starts with `struct_size: usize`; a non-NULL `out` is valid for reads of a
/// usize and for writes of the struct_size bytes it holds.
pub(crate) unsafe fn fill_sized<T: Copy>(
    out: *mut T,
    type_name: &str,
    full: impl FnOnce() -> Result<T>,
) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid_argument("out is NULL"));
    }
    // Read through a usize pointer: the caller's struct may be shorter than this library's T.
    // SAFETY: non-NULL, and valid for a usize read (the caller's contract).
    let wanted = unsafe { out.cast::<usize>().read() };
    if wanted < std::mem::size_of::<usize>() {
        return Err(Error::invalid_argument(format!(
            "out->struct_size is {wanted}: set it to sizeof({type_name}) before the call"
        )));
    }
    let mut full = full()?;
    let filled = wanted.min(std::mem::size_of::<T>());
    // SAFETY: T starts with struct_size: usize; the caller's struct holds `wanted` >= `filled`
    // bytes, and `full` is a whole T.
    unsafe {
        (&mut full as *mut T).cast::<usize>().write(filled);
        std::ptr::copy_nonoverlapping(&full as *const T as *const u8, out as *mut u8, filled);
    }
    Ok(())
}

/// Read a NUL-terminated UTF-8 string argument.
pub(crate) fn str_arg<'a>(ptr: *const std::ffi::c_char, name: &str) -> Result<&'a str> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!("{name} is NULL")));
    }
    // SAFETY: the caller promises a non-NULL pointer is a NUL-terminated string.
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| Error::invalid_argument(format!("{name} is not valid UTF-8")))
}

/// The accelerator of `device_type` (ACCALLOC_ERROR_INVALID_ARGUMENT when there is none).
#[inline]
pub(crate) fn on(device_type: i32) -> Result<&'static crate::runtime::Accelerator> {
    crate::runtime::runtime()?.accelerator(device_type)
}

/// The current accelerator's device type (the host's when the runtime could not start: the call on
/// it then reports why).
#[inline]
pub(crate) fn current_type() -> i32 {
    crate::runtime::runtime().map_or(crate::runtime::DEVICE_TYPE_HOST, |r| {
        r.current().device_type()
    })
}

/// Copy `text` and a NUL into a caller's buffer (snprintf-like: a NULL buffer asks for the size).
pub(crate) fn write_text(
    text: &str,
    buf: *mut std::ffi::c_char,
    cap: usize,
    len: *mut usize,
) -> Result<()> {
    let len = out_ptr(len, "len")?;
    let needed = text.len() + 1;
    *len = needed;
    if buf.is_null() {
        return Ok(());
    }
    if cap < needed {
        return Err(Error::new(
            crate::error::ErrorKind::BufferTooSmall,
            format!("buffer of {cap} bytes is too small: {needed} bytes are needed (see *len)"),
        ));
    }
    // SAFETY: buf is valid for cap >= needed bytes, as the caller promises.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, text.len());
        *buf.add(text.len()) = 0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::runtime::last_error::LAST_ERROR_CAPACITY;

    fn last_error() -> String {
        // SAFETY: the pointer is this thread's live message.
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_an_internal_error_with_its_message() {
        let status = guard(|| panic!("boom at the boundary"));
        assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INTERNAL);
        assert!(
            last_error().contains("boom at the boundary"),
            "{}",
            last_error()
        );
    }

    #[test]
    fn errors_map_to_their_status_and_successes_keep_the_last_message() {
        let status = guard(|| Err(Error::new(ErrorKind::OutOfMemory, "no room")));
        assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_OUT_OF_MEMORY);
        assert_eq!(guard(|| Ok(())), AccallocStatus::ACCALLOC_OK);
        assert_eq!(last_error(), "no room");
    }

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let long = "é".repeat(LAST_ERROR_CAPACITY);
        set_last_error(&long);
        let kept = last_error();
        assert!(kept.len() < LAST_ERROR_CAPACITY, "{}", kept.len());
        assert!(kept.ends_with("é..."), "{}", &kept[kept.len() - 10..]);
        set_last_error("a\0b");
        assert_eq!(last_error(), "a b");
    }

    #[test]
    fn text_output_follows_snprintf_rules() {
        let mut len = 0;
        assert!(write_text("abc", std::ptr::null_mut(), 0, &mut len).is_ok());
        assert_eq!(len, 4);
        let mut buf = [b'x' as std::ffi::c_char; 4];
        assert_eq!(
            write_text("abcd", buf.as_mut_ptr(), 4, &mut len)
                .unwrap_err()
                .kind,
            ErrorKind::BufferTooSmall
        );
        assert_eq!(buf, [b'x' as std::ffi::c_char; 4]);
        write_text("abc", buf.as_mut_ptr(), 4, &mut len).unwrap();
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str(), Ok("abc"));
        assert_eq!(
            write_text("a", buf.as_mut_ptr(), 4, std::ptr::null_mut())
                .unwrap_err()
                .kind,
            ErrorKind::InvalidArgument
        );
    }
}
