//! Helpers shared by the integration tests that go through the C ABI.
#![allow(dead_code)] // each test binary uses its own subset

use accalloc::capi::info::accalloc_last_error_message;
use accalloc::capi::stats::{accalloc_get_device_stats, accalloc_memory_stat};
use accalloc::capi::{AccallocDeviceStats, AccallocStatus};
use std::ffi::{CStr, CString};

/// This thread's last error message.
pub fn last_error() -> String {
    unsafe { CStr::from_ptr(accalloc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// One flat statistic of this thread's current device.
pub fn stat(key: &str) -> i64 {
    let key = CString::new(key).unwrap();
    let mut value = 0;
    assert_eq!(
        unsafe { accalloc_memory_stat(-1, key.as_ptr(), &mut value) },
        AccallocStatus::ACCALLOC_OK
    );
    value
}

/// Every statistic of `device` (-1: current).
pub fn stats(device: i32) -> AccallocDeviceStats {
    let mut out = AccallocDeviceStats {
        struct_size: std::mem::size_of::<AccallocDeviceStats>(),
        ..Default::default()
    };
    assert_eq!(
        unsafe { accalloc_get_device_stats(device, &mut out) },
        AccallocStatus::ACCALLOC_OK
    );
    out
}

/// accalloc_malloc (`device_type` None) or accalloc_malloc_on of `size` bytes on `device` (-1:
/// current), default stream: the status and the address.
pub fn try_malloc(device_type: Option<i32>, device: i32, size: usize) -> (AccallocStatus, usize) {
    use accalloc::capi::memory::{accalloc_malloc, accalloc_malloc_on};
    let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
    let null = std::ptr::null_mut();
    // SAFETY: &mut ptr is a valid out-pointer.
    let status = unsafe {
        match device_type {
            Some(t) => accalloc_malloc_on(t, &mut ptr, size, device, null),
            None => accalloc_malloc(&mut ptr, size, device, null),
        }
    };
    (status, ptr as usize)
}

/// try_malloc, which must succeed: the address.
pub fn malloc(device_type: Option<i32>, device: i32, size: usize) -> usize {
    let (status, ptr) = try_malloc(device_type, device, size);
    assert_eq!(status, AccallocStatus::ACCALLOC_OK, "{}", last_error());
    ptr
}

/// accalloc_free of an address (it checks its pointer).
pub fn free(ptr: usize) -> AccallocStatus {
    unsafe { accalloc::capi::memory::accalloc_free(ptr as *mut std::ffi::c_void) }
}

/// Where FarBackend's addresses start: past every address a user-space mmap can return, so its
/// segments never meet the host's.
pub const FAR: usize = 1 << 47;

/// A one-device SimulatedBackend (fake addresses, no memory touched) moved up by FAR, running
/// `before_alloc` at the start of every raw_alloc. Its events and stream synchronization are the
/// SimulatedBackend's; it has no virtual memory (reservations would not be moved up).
pub struct FarBackend {
    pub name: &'static str,
    pub inner: accalloc::backend::simulated::SimulatedBackend,
    pub before_alloc: fn(),
}

impl accalloc::backend::Wrapper for FarBackend {
    fn inner(&self) -> &dyn accalloc::backend::Backend {
        &self.inner
    }
    fn name(&self) -> &str {
        self.name
    }
    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: accalloc::backend::StreamId,
    ) -> Result<usize, accalloc::backend::BackendError> {
        use accalloc::backend::Backend;
        (self.before_alloc)();
        Ok(self.inner.raw_alloc(device, size, stream)? + FAR)
    }
    fn raw_free(
        &self,
        device: usize,
        ptr: usize,
        size: usize,
    ) -> Result<(), accalloc::backend::BackendError> {
        use accalloc::backend::Backend;
        self.inner.raw_free(device, ptr - FAR, size)
    }
    fn vm_granularity(&self, _device: usize) -> Option<usize> {
        None
    }
}
