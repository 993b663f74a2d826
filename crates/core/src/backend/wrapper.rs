//! One delegation for every backend that wraps another: a wrapper names its inner backend and
//! writes only the calls it changes; everything else, the optional groups and their capability
//! answers included, reaches the inner backend through the one forwarding place below.
//!
//! Every method of [`Backend`] is forwarded here: its required methods by the compiler (the blanket
//! impl does not build without them), its provided ones by clippy (`missing_trait_methods` is
//! denied on the blanket impl, so a call added to `Backend` with a default cannot fall through to
//! that default, "not provided", under a wrapper whose inner backend provides it).

use super::{Backend, BackendError, EventId, MemInfo, PinnedHostAllocation, StreamId};

/// A backend made of another one. Implement this instead of [`Backend`] (which every `Wrapper` is)
/// and override only what the wrapper adds; each default forwards to [`Wrapper::inner`], through
/// [`Wrapper::around`] for the calls that run the inner backend's own code.
///
/// Callers use a wrapper through [`Backend`]. Where both traits are in scope a method call on a
/// wrapper names two methods (the same call, but the compiler asks which); call the inner
/// backend's methods, or `Backend::call(&wrapper, ...)`, there.
pub trait Wrapper: Send + Sync {
    /// The backend wrapped.
    fn inner(&self) -> &dyn Backend;

    /// Runs `forward`, the call named `call`, for every call that reaches the inner backend's own
    /// code: all but `name`, `device_count` and the answers to whether events and stream
    /// synchronization are supported. `call` is the method's name, but "stream_synchronize" for
    /// `synchronize_stream`. A wrapper that overrides one of those calls wraps it itself if it
    /// wants to.
    fn around<T>(&self, call: &'static str, forward: impl FnOnce() -> T) -> T {
        let _ = call;
        forward()
    }

    fn name(&self) -> &str {
        self.inner().name()
    }
    fn device_count(&self) -> usize {
        self.inner().device_count()
    }
    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError> {
        self.around("raw_alloc", || self.inner().raw_alloc(device, size, stream))
    }
    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.around("raw_free", || self.inner().raw_free(device, ptr, size))
    }
    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        self.around("mem_get_info", || self.inner().mem_get_info(device))
    }

    fn events_supported(&self) -> bool {
        self.inner().events_supported()
    }
    fn create_event(&self, device: usize) -> Result<EventId, BackendError> {
        self.around("create_event", || self.inner().create_event(device))
    }
    fn record_event(
        &self,
        device: usize,
        event: EventId,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.around("record_event", || {
            self.inner().record_event(device, event, stream)
        })
    }
    fn query_event(&self, device: usize, event: EventId) -> Result<bool, BackendError> {
        self.around("query_event", || self.inner().query_event(device, event))
    }
    fn synchronize_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        self.around("synchronize_event", || {
            self.inner().synchronize_event(device, event)
        })
    }
    fn destroy_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        self.around("destroy_event", || {
            self.inner().destroy_event(device, event)
        })
    }

    fn stream_synchronize_supported(&self) -> bool {
        self.inner().stream_synchronize_supported()
    }
    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        self.around("stream_synchronize", || {
            self.inner().synchronize_stream(device, stream)
        })
    }

    fn vm_granularity(&self, device: usize) -> Option<usize> {
        self.around("vm_granularity", || self.inner().vm_granularity(device))
    }
    fn vm_reserve(&self, device: usize, size: usize) -> Result<usize, BackendError> {
        self.around("vm_reserve", || self.inner().vm_reserve(device, size))
    }
    fn vm_map(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.around("vm_map", || self.inner().vm_map(device, ptr, size))
    }
    fn vm_unmap(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.around("vm_unmap", || self.inner().vm_unmap(device, ptr, size))
    }
    fn vm_release(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.around("vm_release", || self.inner().vm_release(device, ptr, size))
    }

    fn pinned_host_supported(&self) -> bool {
        self.inner().pinned_host_supported()
    }
    fn pinned_host_alloc(&self, size: usize) -> Result<PinnedHostAllocation, BackendError> {
        self.around("pinned_host_alloc", || self.inner().pinned_host_alloc(size))
    }
    fn pinned_host_free(&self, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.around("pinned_host_free", || {
            self.inner().pinned_host_free(ptr, size)
        })
    }

    fn copies_supported(&self) -> bool {
        self.inner().copies_supported()
    }
    fn copy_to_host(
        &self,
        device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        self.around("copy_to_host", || {
            self.inner().copy_to_host(device, dst, src, size)
        })
    }
    fn copy_from_host(
        &self,
        device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        self.around("copy_from_host", || {
            self.inner().copy_from_host(device, dst, src, size)
        })
    }
}

/// The one forwarding place: every call of [`Backend`] goes to the wrapper's own.
#[deny(clippy::missing_trait_methods)]
impl<W: Wrapper> Backend for W {
    fn name(&self) -> &str {
        Wrapper::name(self)
    }
    fn device_count(&self) -> usize {
        Wrapper::device_count(self)
    }
    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError> {
        Wrapper::raw_alloc(self, device, size, stream)
    }
    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        Wrapper::raw_free(self, device, ptr, size)
    }
    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        Wrapper::mem_get_info(self, device)
    }
    fn events_supported(&self) -> bool {
        Wrapper::events_supported(self)
    }
    fn create_event(&self, device: usize) -> Result<EventId, BackendError> {
        Wrapper::create_event(self, device)
    }
    fn record_event(
        &self,
        device: usize,
        event: EventId,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        Wrapper::record_event(self, device, event, stream)
    }
    fn query_event(&self, device: usize, event: EventId) -> Result<bool, BackendError> {
        Wrapper::query_event(self, device, event)
    }
    fn synchronize_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        Wrapper::synchronize_event(self, device, event)
    }
    fn destroy_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        Wrapper::destroy_event(self, device, event)
    }
    fn stream_synchronize_supported(&self) -> bool {
        Wrapper::stream_synchronize_supported(self)
    }
    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        Wrapper::synchronize_stream(self, device, stream)
    }
    fn vm_granularity(&self, device: usize) -> Option<usize> {
        Wrapper::vm_granularity(self, device)
    }
    fn vm_reserve(&self, device: usize, size: usize) -> Result<usize, BackendError> {
        Wrapper::vm_reserve(self, device, size)
    }
    fn vm_map(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        Wrapper::vm_map(self, device, ptr, size)
    }
    fn vm_unmap(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        Wrapper::vm_unmap(self, device, ptr, size)
    }
    fn vm_release(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        Wrapper::vm_release(self, device, ptr, size)
    }
    fn pinned_host_supported(&self) -> bool {
        Wrapper::pinned_host_supported(self)
    }
    fn pinned_host_alloc(&self, size: usize) -> Result<PinnedHostAllocation, BackendError> {
        Wrapper::pinned_host_alloc(self, size)
    }
    fn pinned_host_free(&self, ptr: usize, size: usize) -> Result<(), BackendError> {
        Wrapper::pinned_host_free(self, ptr, size)
    }
    fn copies_supported(&self) -> bool {
        Wrapper::copies_supported(self)
    }
    fn copy_to_host(
        &self,
        device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        Wrapper::copy_to_host(self, device, dst, src, size)
    }
    fn copy_from_host(
        &self,
        device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        Wrapper::copy_from_host(self, device, dst, src, size)
    }
}

#[cfg(test)]
mod tests {
    // Wrapper by path only: with it in scope too, a call on a wrapper would name two methods.
    use crate::backend::renamed::Renamed;
    use crate::backend::simulated::SimulatedBackend;
    use crate::backend::{Backend, BackendError, MemInfo, StreamId};
    use crate::caching::settings::parse_settings;
    use crate::caching::{CachingAllocator, CachingConfig};
    use std::sync::Arc;

    /// A wrapper that changes nothing: all it states is its inner backend.
    struct Bare(Arc<dyn Backend>);

    impl super::Wrapper for Bare {
        fn inner(&self) -> &dyn Backend {
            &*self.0
        }
    }

    /// A backend that states it has no optional group and writes none of their calls.
    struct Plain;

    impl Backend for Plain {
        fn name(&self) -> &str {
            "plain"
        }
        fn device_count(&self) -> usize {
            1
        }
        fn raw_alloc(&self, _: usize, _: usize, _: StreamId) -> Result<usize, BackendError> {
            Err(BackendError::OutOfMemory)
        }
        fn raw_free(&self, _: usize, _: usize, _: usize) -> Result<(), BackendError> {
            Ok(())
        }
        fn mem_get_info(&self, _: usize) -> Result<MemInfo, BackendError> {
            Ok(MemInfo { free: 0, total: 0 })
        }
        fn events_supported(&self) -> bool {
            false
        }
        fn stream_synchronize_supported(&self) -> bool {
            false
        }
        fn vm_granularity(&self, _: usize) -> Option<usize> {
            None
        }
        fn pinned_host_supported(&self) -> bool {
            false
        }
        fn copies_supported(&self) -> bool {
            false
        }
    }

    /// (events, stream synchronization, virtual memory, pinned host memory, copies) as `backend`
    /// answers them.
    fn capabilities(backend: &dyn Backend) -> (bool, bool, Option<usize>, bool, bool) {
        (
            backend.events_supported(),
            backend.stream_synchronize_supported(),
            backend.vm_granularity(0),
            backend.pinned_host_supported(),
            backend.copies_supported(),
        )
    }

    #[test]
    fn wrappers_keep_the_inner_backends_capabilities() {
        let makers: [fn(usize, usize) -> SimulatedBackend; 3] = [
            SimulatedBackend::new,
            SimulatedBackend::without_events,
            SimulatedBackend::without_virtual_memory,
        ];
        let mut seen = Vec::new();
        for make in makers {
            let expected = capabilities(&make(1, 1 << 30));
            let bare = Bare(Arc::new(make(1, 1 << 30)));
            assert_eq!(capabilities(&bare), expected);
            let renamed = Renamed::new("renamed", make(1, 1 << 30));
            assert_eq!(capabilities(&renamed), expected);
            assert_eq!(renamed.name(), "renamed");
            assert_eq!(capabilities(&Renamed::new("twice", bare)), expected);
            seen.push(expected);
        }
        assert_eq!(
            seen,
            [
                (true, true, Some(2 << 20), true, true),
                (false, true, Some(2 << 20), true, true),
                (true, true, None, true, true)
            ],
            "the three test backends differ in one capability each"
        );
        let plain = Bare(Arc::new(Plain));
        assert_eq!(capabilities(&plain), (false, false, None, false, false));
    }

    #[test]
    fn an_event_recorded_through_a_wrapper_is_pending_until_the_inner_backend_completes_it() {
        let inner = Arc::new(SimulatedBackend::new(1, 1 << 30));
        let outer = Renamed::new("outer", Bare(inner.clone()));
        let event = outer.create_event(0).unwrap();
        outer.record_event(0, event, 5).unwrap();
        assert_eq!(outer.query_event(0, event), Ok(false));
        inner.complete_stream(5);
        assert_eq!(outer.query_event(0, event), Ok(true));

        outer.record_event(0, event, 6).unwrap();
        assert_eq!(outer.query_event(0, event), Ok(false));
        outer.synchronize_stream(0, 6).unwrap();
        assert_eq!(outer.query_event(0, event), Ok(true));
        outer.destroy_event(0, event).unwrap();
        assert_eq!(inner.live_events(), 0);
    }

    #[test]
    fn calls_a_backend_does_not_provide_fail_and_never_read_as_done() {
        for backend in [&Plain as &dyn Backend, &Bare(Arc::new(Plain))] {
            let not_provided = |call: &str| {
                Err::<(), _>(BackendError::Failed {
                    code: -1,
                    message: format!("{call} is not provided by this backend"),
                })
            };
            assert!(backend.create_event(0).is_err());
            assert_eq!(backend.record_event(0, 1, 1), not_provided("record_event"));
            assert!(backend.query_event(0, 1).is_err(), "never 'complete'");
            assert_eq!(
                backend.synchronize_event(0, 1),
                not_provided("synchronize_event")
            );
            assert_eq!(backend.destroy_event(0, 1), not_provided("destroy_event"));
            assert_eq!(
                backend.synchronize_stream(0, 1),
                not_provided("stream_synchronize")
            );
            assert!(backend.vm_reserve(0, 2 << 20).is_err());
            assert_eq!(backend.vm_map(0, 1 << 30, 4096), not_provided("vm_map"));
            assert_eq!(backend.vm_unmap(0, 1 << 30, 4096), not_provided("vm_unmap"));
            assert_eq!(
                backend.vm_release(0, 1 << 30, 4096),
                not_provided("vm_release")
            );
            assert!(backend.pinned_host_alloc(4096).is_err());
            assert_eq!(
                backend.pinned_host_free(1 << 30, 4096),
                not_provided("pinned_host_free")
            );
        }
    }

    #[test]
    fn the_caching_layer_under_a_wrapper_waits_for_the_inner_backends_events() {
        let inner = Arc::new(SimulatedBackend::new(1, 1 << 30));
        let mut a =
            CachingAllocator::new(Arc::new(Bare(inner.clone())), 0, CachingConfig::default())
                .unwrap();
        let p = a.malloc(1000, 1).unwrap();
        a.record_stream(p, 2).unwrap();
        a.free(p).unwrap();
        assert_eq!(inner.live_events(), 1);
        let q = a.malloc(1000, 1).unwrap();
        assert_ne!(
            q, p,
            "the block is not reused while stream 2 may still use it"
        );
        inner.complete_stream(2);
        let r = a.malloc(1000, 1).unwrap();
        assert_eq!(r, p, "back once the inner backend completes the event");
        assert_eq!(inner.live_events(), 0);
        a.free(q).unwrap();
        a.free(r).unwrap();
    }

    #[test]
    fn expandable_segments_under_a_wrapper_use_the_inner_backends_virtual_memory() {
        let inner = Arc::new(SimulatedBackend::new(1, 1 << 30));
        let config = parse_settings("expandable_segments:True", &CachingConfig::default()).unwrap();
        let mut a = CachingAllocator::new(Arc::new(Bare(inner.clone())), 0, config).unwrap();
        let p = a.malloc(4 << 20, 0).unwrap();
        assert_eq!(inner.live_reservations(0), 1);
        assert!(inner.mapped_bytes(0) >= 4 << 20);
        assert_eq!(inner.alloc_calls(0), 0, "no ordinary segment");
        a.free(p).unwrap();
    }
}
