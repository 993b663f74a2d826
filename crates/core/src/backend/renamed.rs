//! A backend under another name: the same devices, memory, events and virtual memory, registered as
//! a device type of its own ("host" and "cuda" are taken, and a name is registered once). The
//! benchmark puts other devices in use with one; tests register many.

use super::{Backend, BackendError, EventId, MemInfo, StreamId};

/// `inner`, named `name`; every call goes to `inner`.
pub struct Renamed<B> {
    name: String,
    inner: B,
}

impl<B: Backend> Renamed<B> {
    pub fn new(name: impl Into<String>, inner: B) -> Self {
        Renamed {
            name: name.into(),
            inner,
        }
    }
}

impl<B: Backend> Backend for Renamed<B> {
    fn name(&self) -> &str {
        &self.name
    }
    fn device_count(&self) -> usize {
        self.inner.device_count()
    }
    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError> {
        self.inner.raw_alloc(device, size, stream)
    }
    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.inner.raw_free(device, ptr, size)
    }
    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        self.inner.mem_get_info(device)
    }
    fn events_supported(&self) -> bool {
        self.inner.events_supported()
    }
    fn create_event(&self, device: usize) -> Result<EventId, BackendError> {
        self.inner.create_event(device)
    }
    fn record_event(
        &self,
        device: usize,
        event: EventId,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.inner.record_event(device, event, stream)
    }
    fn query_event(&self, device: usize, event: EventId) -> Result<bool, BackendError> {
        self.inner.query_event(device, event)
    }
    fn synchronize_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        self.inner.synchronize_event(device, event)
    }
    fn destroy_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        self.inner.destroy_event(device, event)
    }
    fn stream_synchronize_supported(&self) -> bool {
        self.inner.stream_synchronize_supported()
    }
    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        self.inner.synchronize_stream(device, stream)
    }
    fn vm_granularity(&self, device: usize) -> Option<usize> {
        self.inner.vm_granularity(device)
    }
    fn vm_reserve(&self, device: usize, size: usize) -> Result<usize, BackendError> {
        self.inner.vm_reserve(device, size)
    }
    fn vm_map(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.inner.vm_map(device, ptr, size)
    }
    fn vm_unmap(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.inner.vm_unmap(device, ptr, size)
    }
    fn vm_release(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.inner.vm_release(device, ptr, size)
    }
}
