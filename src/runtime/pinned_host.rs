//! Each accelerator's pinned host caching allocator (accalloc_core::pinned), made on first use, and
//! finding the accelerator that holds a pinned pointer.

use super::{Accelerator, Runtime};
use crate::error::{Error, ErrorKind, Result};
use accalloc_core::pinned::PinnedHostCache;
use std::sync::MutexGuard;

/// An accelerator's pinned host cache, locked.
pub struct PinnedHostGuard<'a>(MutexGuard<'a, Option<PinnedHostCache>>);

impl std::ops::Deref for PinnedHostGuard<'_> {
    type Target = PinnedHostCache;
    fn deref(&self) -> &PinnedHostCache {
        self.0
            .as_ref()
            .expect("made before the guard is handed out")
    }
}

impl std::ops::DerefMut for PinnedHostGuard<'_> {
    fn deref_mut(&mut self) -> &mut PinnedHostCache {
        self.0
            .as_mut()
            .expect("made before the guard is handed out")
    }
}

impl Accelerator {
    /// This accelerator's pinned host cache, made on first use; NotSupported, naming the backend,
    /// where the backend has no pinned host memory.
    pub fn pinned_host(&self) -> Result<PinnedHostGuard<'_>> {
        // The settings first: set_settings takes the settings' lock and then this one.
        let settings = self.settings();
        let mut slot = self.pinned_host.lock().map_err(|_| {
            Error::new(
                ErrorKind::Internal,
                format!(
                    "the {} accelerator's pinned host memory is unusable: a thread panicked while \
                     holding it",
                    self.name()
                ),
            )
        })?;
        if slot.is_none() {
            let mut cache = PinnedHostCache::new(self.backend.clone())?;
            cache.configure(&settings);
            *slot = Some(cache);
        }
        Ok(PinnedHostGuard(slot))
    }

    /// Give the pinned host cache, if made, the pinned_ settings of `settings`.
    pub(super) fn configure_pinned_host(&self, settings: &crate::caching::CachingConfig) {
        let mut slot = self.pinned_host.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cache) = slot.as_mut() {
            cache.configure(settings);
        }
    }

    /// Whether `ptr` lies in a block of this accelerator's pinned host cache (false before the
    /// cache is made).
    pub fn holds_pinned_host(&self, ptr: usize) -> bool {
        let slot = self.pinned_host.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().is_some_and(|cache| cache.contains(ptr))
    }
}

impl Runtime {
    /// The accelerator whose pinned host cache holds `ptr`: the current accelerator is asked first.
    /// Accelerators whose backend callback this thread is inside are not asked (their lock may be
    /// held).
    pub fn pinned_host_holder(&self, ptr: usize) -> Option<&'static Accelerator> {
        if ptr == 0 {
            return None;
        }
        let current = self.current();
        let askable = |a: &&'static Accelerator| !super::reentry::inside(a.device_type());
        if askable(&current) && current.holds_pinned_host(ptr) {
            return Some(current);
        }
        self.accelerators()
            .filter(|a| a.device_type() != current.device_type())
            .filter(askable)
            .find(|a| a.holds_pinned_host(ptr))
    }

    /// Give back pinned host memory from any accelerator's pinned host cache; NULL is a no-op.
    pub fn pinned_host_free(&self, ptr: usize) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        match self.pinned_host_holder(ptr) {
            Some(accelerator) => accelerator.pinned_host()?.free(ptr),
            None => Err(not_pinned(ptr)),
        }
    }

    /// `stream` of `device` (-1: the holding accelerator's current device) uses the pinned block
    /// `ptr` lies in. Ok(false) where `ptr` is not pinned memory from accalloc.
    pub fn pinned_host_record_stream(
        &self,
        ptr: usize,
        device: i32,
        stream: crate::backend::StreamId,
    ) -> Result<bool> {
        let Some(accelerator) = self.pinned_host_holder(ptr) else {
            return Ok(false);
        };
        let index = accelerator.resolve(device)?;
        accelerator.pinned_host()?.record_stream(ptr, index, stream)
    }
}

fn not_pinned(ptr: usize) -> Error {
    Error::invalid_pointer(format!(
        "{ptr:#x} is not pinned host memory from accalloc (accalloc_host_malloc), or was given back \
         already"
    ))
}
