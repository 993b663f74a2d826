//! fork(): a child process does not use the allocator it inherited. Another thread of the parent
//! may have held a device's lock, the registry or the segment index at the moment of fork, and the
//! child's copy would stay locked forever; a device's memory (a GPU context above all) does not
//! survive a fork either. So, as PyTorch does for CUDA, every call in a child of a process that
//! had started using accalloc fails at once with ACCALLOC_ERROR_NOT_SUPPORTED and a message that says
//! why; no lock is touched, so no child ever hangs. Only the atfork child handler runs at fork
//! time, and it only sets a flag.

use crate::error::{Error, ErrorKind};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set in the child of a fork.
static FORKED: AtomicBool = AtomicBool::new(false);
/// Whether the atfork handler is installed.
static WATCHING: AtomicBool = AtomicBool::new(false);

extern "C" fn in_child() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Install the atfork handler, once, before anything that a fork could leave half done.
pub(super) fn watch() {
    if !WATCHING.load(Ordering::Relaxed) && !WATCHING.swap(true, Ordering::AcqRel) {
        // SAFETY: registering a handler that only stores to an atomic has no preconditions.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    }
}

/// Err in the child of a fork.
#[inline]
pub(super) fn check() -> Result<(), Error> {
    if FORKED.load(Ordering::Relaxed) {
        return Err(forked());
    }
    Ok(())
}

#[cold]
fn forked() -> Error {
    Error::new(
        ErrorKind::NotSupported,
        "accalloc cannot be used in this process: it is a fork() child of a process that used \
         accalloc, and the parent's devices, locks and books are not valid here (another thread may \
         have held them at the fork). Allocate in the parent, or start children with exec \
         (Python's multiprocessing 'spawn' method)",
    )
}
