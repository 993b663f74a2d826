//! This thread's last failure message: what accalloc_last_error_message() returns, kept by the
//! C ABI's guard and by the ORT face alike (both report failures through it).

use std::cell::RefCell;

/// Room for one message, its NUL included; a longer one is cut at a character boundary and ends in
/// "...". Messages quote at most a bounded prefix of their inputs, so they fit.
pub(crate) const LAST_ERROR_CAPACITY: usize = 2048;

thread_local! {
    // A plain byte array, not a CString: a thread-local that needs no destructor is never torn down,
    // so calls from TLS destructors, atexit handlers and C++ global destructors (which run after this
    // thread's other thread-locals are gone) still get their message instead of a panic.
    static LAST_ERROR: RefCell<[u8; LAST_ERROR_CAPACITY]> =
        const { RefCell::new([0; LAST_ERROR_CAPACITY]) };
}

/// Remember `message` as this thread's last failure.
pub(crate) fn set_last_error(message: &str) {
    let _ = LAST_ERROR.try_with(|slot| {
        let Ok(mut slot) = slot.try_borrow_mut() else {
            return;
        };
        let limit = LAST_ERROR_CAPACITY - 1;
        let (text, cut) = if message.len() <= limit {
            (message, false)
        } else {
            let mut end = limit - 3;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            (&message[..end], true)
        };
        let mut len = text.len();
        slot[..len].copy_from_slice(text.as_bytes());
        if cut {
            slot[len..len + 3].copy_from_slice(b"...");
            len += 3;
        }
        // Interior NULs cannot cross into C; they never occur in our messages but must not cut them.
        for byte in &mut slot[..len] {
            if *byte == 0 {
                *byte = b' ';
            }
        }
        slot[len] = 0;
    });
}

/// A pointer to this thread's last failure message, valid until this thread's next failure.
pub(crate) fn last_error_ptr() -> *const std::ffi::c_char {
    LAST_ERROR
        .try_with(|slot| slot.as_ptr() as *const std::ffi::c_char)
        .unwrap_or(c"".as_ptr())
}
