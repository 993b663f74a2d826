//! A backend written in C: the functions of the table a framework registers with
//! accalloc_register_backend (capi checks the C table and hands over this Rust view of it). Every
//! function gets the context first and returns 0 on success, 2 when the device has no room, or any
//! other value as its own error code.

use super::{Backend, BackendError, EventId, MemInfo, PinnedHostAllocation, StreamId, Wrapper};
use std::ffi::c_void;
use std::sync::Arc;

/// What a backend function returns on success (ACCALLOC_BACKEND_OK in the C ABI).
pub const BACKEND_OK: i32 = 0;
/// What a backend function returns when the device has no room (ACCALLOC_BACKEND_OUT_OF_MEMORY):
/// accalloc releases cached memory and retries, as for a device out-of-memory error.
pub const BACKEND_OUT_OF_MEMORY: i32 = 2;

/// How many devices the backend drives, into *out.
pub type DeviceCountFn = unsafe extern "C" fn(context: *mut c_void, out: *mut i32) -> i32;
/// Allocate `size` bytes on `device` for `stream`, 512-byte aligned, into *out.
pub type RawAllocFn = unsafe extern "C" fn(
    context: *mut c_void,
    device: i32,
    size: usize,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> i32;
/// Free, or in the virtual-memory group map, unmap or release, `size` bytes at `ptr`.
pub type RangeFn =
    unsafe extern "C" fn(context: *mut c_void, device: i32, ptr: *mut c_void, size: usize) -> i32;
/// Free and total bytes of `device`.
pub type MemGetInfoFn =
    unsafe extern "C" fn(context: *mut c_void, device: i32, free: *mut u64, total: *mut u64) -> i32;
/// Create an event into *out.
pub type EventCreateFn =
    unsafe extern "C" fn(context: *mut c_void, device: i32, out: *mut *mut c_void) -> i32;
/// Record `event` on `stream`.
pub type EventRecordFn = unsafe extern "C" fn(
    context: *mut c_void,
    device: i32,
    event: *mut c_void,
    stream: *mut c_void,
) -> i32;
/// Set *complete to 1 when `event` has completed, 0 when not yet.
pub type EventQueryFn = unsafe extern "C" fn(
    context: *mut c_void,
    device: i32,
    event: *mut c_void,
    complete: *mut i32,
) -> i32;
/// Act on one handle of `device`: wait for or destroy an event, or wait for a stream.
pub type HandleFn =
    unsafe extern "C" fn(context: *mut c_void, device: i32, handle: *mut c_void) -> i32;
/// The mapping granularity of `device` in bytes, into *out.
pub type GranularityFn =
    unsafe extern "C" fn(context: *mut c_void, device: i32, out: *mut usize) -> i32;
/// Reserve `size` bytes of address space into *out.
pub type ReserveFn = unsafe extern "C" fn(
    context: *mut c_void,
    device: i32,
    size: usize,
    out: *mut *mut c_void,
) -> i32;

/// The functions of a C backend: the four required ones, and each optional group whole or not at
/// all (a backend without events falls back to stream_synchronize when it has one; one without
/// virtual memory gets ordinary segments instead of expandable ones).
#[derive(Clone, Copy)]
pub struct Functions {
    /// Passed as the first argument of every function.
    pub context: *mut c_void,
    pub device_count: DeviceCountFn,
    pub raw_alloc: RawAllocFn,
    pub raw_free: RangeFn,
    pub mem_get_info: MemGetInfoFn,
    pub events: Option<EventFunctions>,
    pub stream_synchronize: Option<HandleFn>,
    pub virtual_memory: Option<VirtualMemoryFunctions>,
    pub pinned_host: Option<PinnedHostFunctions>,
    pub copies: Option<CopyFunctions>,
}

/// Allocate `size` bytes of pinned host memory into *out.
pub type HostAllocFn =
    unsafe extern "C" fn(context: *mut c_void, size: usize, out: *mut *mut c_void) -> i32;
/// Free pinned host memory from the HostAllocFn.
pub type HostFreeFn =
    unsafe extern "C" fn(context: *mut c_void, ptr: *mut c_void, size: usize) -> i32;

/// Copy `size` bytes from `src` to `dst` (device to host, or host to device), finished on return.
pub type CopyFn = unsafe extern "C" fn(
    context: *mut c_void,
    device: i32,
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
) -> i32;

/// The two copy functions (sleep's backups).
#[derive(Clone, Copy)]
pub struct CopyFunctions {
    pub to_host: CopyFn,
    pub from_host: CopyFn,
}

/// The two pinned host memory functions.
#[derive(Clone, Copy)]
pub struct PinnedHostFunctions {
    pub alloc: HostAllocFn,
    pub free: HostFreeFn,
}

/// The five event functions.
#[derive(Clone, Copy)]
pub struct EventFunctions {
    pub create: EventCreateFn,
    pub record: EventRecordFn,
    pub query: EventQueryFn,
    pub synchronize: HandleFn,
    pub destroy: HandleFn,
}

/// The five virtual-memory functions.
#[derive(Clone, Copy)]
pub struct VirtualMemoryFunctions {
    pub granularity: GranularityFn,
    pub reserve: ReserveFn,
    pub map: RangeFn,
    pub unmap: RangeFn,
    pub release: RangeFn,
}

/// Why the range [ptr, ptr + size) a backend handed out cannot be used, if it cannot: NULL,
/// not aligned to `alignment`, or running past the end of the address space.
fn unusable_range(ptr: usize, size: usize, alignment: usize) -> Option<String> {
    if ptr == 0 {
        Some("NULL with success".into())
    } else if !ptr.is_multiple_of(alignment) {
        Some(format!("not a {alignment}-byte aligned address"))
    } else if ptr.checked_add(size).is_none() {
        Some("a range that wraps around the end of the address space".into())
    } else {
        None
    }
}

/// The error for a refused answer of `call`.
fn refused(call: &str, ptr: usize, size: usize, why: &str) -> BackendError {
    let handed_back = if ptr == 0 {
        ""
    } else {
        "; accalloc handed it back"
    };
    BackendError::Failed {
        code: -1,
        message: format!("{call} returned {ptr:#x} for {size} bytes, {why}{handed_back}"),
    }
}

/// A registered C backend.
pub struct CustomBackend {
    name: String,
    functions: Functions,
    devices: usize,
}

// SAFETY: the registering framework promises (in the table's documentation) that its functions and
// context may be used from any thread.
unsafe impl Send for CustomBackend {}
unsafe impl Sync for CustomBackend {}

impl CustomBackend {
    /// Ask the backend for its device count. The error says what is wrong with its answer.
    ///
    /// # Safety
    /// The function pointers must be valid functions with the documented signatures, and the
    /// context valid for them, for as long as the process runs.
    pub unsafe fn new(name: &str, functions: Functions) -> Result<CustomBackend, String> {
        let mut count = 0;
        let rc = (functions.device_count)(functions.context, &mut count);
        if rc != BACKEND_OK || count < 1 || count as usize > super::MAX_DEVICES {
            return Err(format!(
                "device_count returned {rc} with {count} device(s); 1 to {} are supported",
                super::MAX_DEVICES
            ));
        }
        Ok(CustomBackend {
            name: name.to_string(),
            functions,
            devices: count as usize,
        })
    }

    fn check(&self, call: &str, rc: i32) -> Result<(), BackendError> {
        match rc {
            BACKEND_OK => Ok(()),
            BACKEND_OUT_OF_MEMORY => Err(BackendError::OutOfMemory),
            code => Err(BackendError::Failed {
                code: code as i64,
                message: format!("{call} returned error code {code}"),
            }),
        }
    }

    /// Call `function` (named `name` in messages; None when the backend lacks it) with the context
    /// and turn its return code into a result.
    fn call<F: Copy>(
        &self,
        name: &str,
        function: Option<F>,
        invoke: impl FnOnce(F, *mut c_void) -> i32,
    ) -> Result<(), BackendError> {
        let function = function.ok_or_else(|| Self::missing(name))?;
        self.check(name, invoke(function, self.functions.context))
    }

    /// One of the two copies, `size` bytes from `src` to `dst`.
    fn copy(
        &self,
        name: &str,
        function: Option<CopyFn>,
        device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        // SAFETY: the registering framework's function, with the caller's ranges (Backend's contract).
        self.call(name, function, |f, ctx| unsafe {
            f(
                ctx,
                device as i32,
                dst as *mut c_void,
                src as *const c_void,
                size,
            )
        })
    }

    fn missing(call: &str) -> BackendError {
        BackendError::Failed {
            code: -1,
            message: format!("{call} is not provided by this backend"),
        }
    }

    fn events(&self) -> Option<&EventFunctions> {
        self.functions.events.as_ref()
    }

    fn virtual_memory(&self) -> Option<&VirtualMemoryFunctions> {
        self.functions.virtual_memory.as_ref()
    }
}

// SAFETY (every `unsafe` call below): the functions follow the documented contract, which the
// registering framework promised.
impl Backend for CustomBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn device_count(&self) -> usize {
        self.devices
    }

    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError> {
        let mut out: *mut c_void = std::ptr::null_mut();
        self.call(
            "raw_alloc",
            Some(self.functions.raw_alloc),
            |f, ctx| unsafe { f(ctx, device as i32, size, stream as *mut c_void, &mut out) },
        )?;
        let ptr = out as usize;
        if let Some(why) = unusable_range(ptr, size, 512) {
            // Whatever the backend handed out goes back, so that a refused segment costs nothing.
            if ptr != 0 {
                let _ = self.raw_free(device, ptr, size);
            }
            return Err(refused("raw_alloc", ptr, size, &why));
        }
        Ok(ptr)
    }

    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.call("raw_free", Some(self.functions.raw_free), |f, ctx| unsafe {
            f(ctx, device as i32, ptr as *mut c_void, size)
        })
    }

    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        let (mut free, mut total) = (0u64, 0u64);
        self.call(
            "mem_get_info",
            Some(self.functions.mem_get_info),
            |f, ctx| unsafe { f(ctx, device as i32, &mut free, &mut total) },
        )?;
        Ok(MemInfo {
            free: free as usize,
            total: total as usize,
        })
    }

    fn events_supported(&self) -> bool {
        self.functions.events.is_some()
    }

    fn create_event(&self, device: usize) -> Result<EventId, BackendError> {
        let mut out: *mut c_void = std::ptr::null_mut();
        let create = self.events().map(|e| e.create);
        self.call("event_create", create, |f, ctx| unsafe {
            f(ctx, device as i32, &mut out)
        })?;
        Ok(out as EventId)
    }

    fn record_event(
        &self,
        device: usize,
        event: EventId,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let record = self.events().map(|e| e.record);
        self.call("event_record", record, |f, ctx| unsafe {
            f(
                ctx,
                device as i32,
                event as *mut c_void,
                stream as *mut c_void,
            )
        })
    }

    fn query_event(&self, device: usize, event: EventId) -> Result<bool, BackendError> {
        let mut complete = 0;
        let query = self.events().map(|e| e.query);
        self.call("event_query", query, |f, ctx| unsafe {
            f(ctx, device as i32, event as *mut c_void, &mut complete)
        })?;
        Ok(complete != 0)
    }

    fn synchronize_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        let synchronize = self.events().map(|e| e.synchronize);
        self.call("event_synchronize", synchronize, |f, ctx| unsafe {
            f(ctx, device as i32, event as *mut c_void)
        })
    }

    fn destroy_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        let destroy = self.events().map(|e| e.destroy);
        self.call("event_destroy", destroy, |f, ctx| unsafe {
            f(ctx, device as i32, event as *mut c_void)
        })
    }

    fn stream_synchronize_supported(&self) -> bool {
        self.functions.stream_synchronize.is_some()
    }

    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        self.call(
            "stream_synchronize",
            self.functions.stream_synchronize,
            |f, ctx| unsafe { f(ctx, device as i32, stream as *mut c_void) },
        )
    }

    fn pinned_host_supported(&self) -> bool {
        self.functions.pinned_host.is_some()
    }

    fn copies_supported(&self) -> bool {
        self.functions.copies.is_some()
    }

    fn copy_to_host(
        &self,
        device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        let to_host = self.functions.copies.map(|f| f.to_host);
        self.copy("copy_to_host", to_host, device, dst, src, size)
    }

    fn copy_from_host(
        &self,
        device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        let from_host = self.functions.copies.map(|f| f.from_host);
        self.copy("copy_from_host", from_host, device, dst, src, size)
    }

    fn pinned_host_alloc(&self, size: usize) -> Result<PinnedHostAllocation, BackendError> {
        let mut out: *mut c_void = std::ptr::null_mut();
        let alloc = self.functions.pinned_host.map(|f| f.alloc);
        self.call("host_alloc", alloc, |f, ctx| unsafe {
            f(ctx, size, &mut out)
        })?;
        let ptr = out as usize;
        // Pinned host memory of the caching layer needs no alignment beyond what a C allocator
        // gives (16 bytes); NULL or a range past the end of the address space is refused.
        if let Some(why) = unusable_range(ptr, size, 16) {
            if ptr != 0 {
                let _ = self.pinned_host_free(ptr, size);
            }
            return Err(refused("host_alloc", ptr, size, &why));
        }
        Ok(PinnedHostAllocation {
            ptr,
            page_locked: true,
        })
    }

    fn pinned_host_free(&self, ptr: usize, size: usize) -> Result<(), BackendError> {
        let free = self.functions.pinned_host.map(|f| f.free);
        self.call("host_free", free, |f, ctx| unsafe {
            f(ctx, ptr as *mut c_void, size)
        })
    }

    fn vm_granularity(&self, device: usize) -> Option<usize> {
        let mut out = 0usize;
        let granularity = self.virtual_memory().map(|v| v.granularity);
        self.call("vm_granularity", granularity, |f, ctx| unsafe {
            f(ctx, device as i32, &mut out)
        })
        .ok()
        .filter(|_| out > 0)
        .map(|_| out)
    }

    fn vm_reserve(&self, device: usize, size: usize) -> Result<usize, BackendError> {
        let mut out: *mut c_void = std::ptr::null_mut();
        let reserve = self.virtual_memory().map(|v| v.reserve);
        self.call("vm_reserve", reserve, |f, ctx| unsafe {
            f(ctx, device as i32, size, &mut out)
        })?;
        let ptr = out as usize;
        let alignment = self.vm_granularity(device).unwrap_or(1).max(512);
        if let Some(why) = unusable_range(ptr, size, alignment) {
            if ptr != 0 {
                let _ = self.vm_release(device, ptr, size);
            }
            return Err(refused("vm_reserve", ptr, size, &why));
        }
        Ok(ptr)
    }

    fn vm_map(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        let map = self.virtual_memory().map(|v| v.map);
        self.call("vm_map", map, |f, ctx| unsafe {
            f(ctx, device as i32, ptr as *mut c_void, size)
        })
    }

    fn vm_unmap(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        let unmap = self.virtual_memory().map(|v| v.unmap);
        self.call("vm_unmap", unmap, |f, ctx| unsafe {
            f(ctx, device as i32, ptr as *mut c_void, size)
        })
    }

    fn vm_release(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        let release = self.virtual_memory().map(|v| v.release);
        self.call("vm_release", release, |f, ctx| unsafe {
            f(ctx, device as i32, ptr as *mut c_void, size)
        })
    }
}

/// The functions of a private pool's own allocator from C (MemPool(allocator=...)): raw_alloc and
/// raw_free, and the virtual-memory group when it is whole.
#[derive(Clone, Copy)]
pub struct SegmentFunctions {
    pub context: *mut c_void,
    pub raw_alloc: RawAllocFn,
    pub raw_free: RangeFn,
    pub virtual_memory: Option<VirtualMemoryFunctions>,
}

/// A private pool's own allocator: its segments (and, with virtual memory, its reservations and
/// pages) come from the caller's functions, checked as a registered backend's are; everything else
/// (device count, memory figures, events, streams) is the device's backend's.
pub struct PoolAllocator {
    device: Arc<dyn Backend>,
    own: CustomBackend,
    /// What the functions' context points into, when the caller's layer made it (kept alive with
    /// the pool).
    _context: Option<Box<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: the caller promises (in accalloc_pool_create_with_allocator's documentation) that its
// functions and context may be used from any thread.
unsafe impl Send for PoolAllocator {}
unsafe impl Sync for PoolAllocator {}

/// The table entries a pool allocator does not use: never called (the device's answer instead).
unsafe extern "C" fn unused_device_count(_: *mut c_void, _: *mut i32) -> i32 {
    -1
}
unsafe extern "C" fn unused_mem_get_info(_: *mut c_void, _: i32, _: *mut u64, _: *mut u64) -> i32 {
    -1
}

impl PoolAllocator {
    /// # Safety
    /// The function pointers must be valid functions with the documented signatures, and the
    /// context valid for them, for as long as the pool holds memory from them.
    pub unsafe fn new(
        device: Arc<dyn Backend>,
        functions: SegmentFunctions,
        context: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Self {
        let own = CustomBackend {
            name: format!("{}'s pool allocator", device.name()),
            functions: Functions {
                context: functions.context,
                device_count: unused_device_count,
                raw_alloc: functions.raw_alloc,
                raw_free: functions.raw_free,
                mem_get_info: unused_mem_get_info,
                events: None,
                stream_synchronize: None,
                virtual_memory: functions.virtual_memory,
                pinned_host: None,
                copies: None,
            },
            devices: device.device_count(),
        };
        PoolAllocator {
            device,
            own,
            _context: context,
        }
    }
}

impl Wrapper for PoolAllocator {
    fn inner(&self) -> &dyn Backend {
        &*self.device
    }
    fn name(&self) -> &str {
        self.own.name()
    }
    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError> {
        self.own.raw_alloc(device, size, stream)
    }
    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.own.raw_free(device, ptr, size)
    }
    fn vm_granularity(&self, device: usize) -> Option<usize> {
        self.own.vm_granularity(device)
    }
    fn vm_reserve(&self, device: usize, size: usize) -> Result<usize, BackendError> {
        self.own.vm_reserve(device, size)
    }
    fn vm_map(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.own.vm_map(device, ptr, size)
    }
    fn vm_unmap(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.own.vm_unmap(device, ptr, size)
    }
    fn vm_release(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.own.vm_release(device, ptr, size)
    }
}
