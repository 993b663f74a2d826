//! A backend written in C: a table of function pointers a framework registers with
//! accalloc_register_backend. Every function gets the table's context first and returns 0 on success,
//! ACCALLOC_BACKEND_OUT_OF_MEMORY when the device has no room, or any other value as its own error code.

use super::{Backend, BackendError, EventId, MemInfo, StreamId};
use std::ffi::c_void;

/// What a backend function returns on success.
pub const ACCALLOC_BACKEND_OK: i32 = 0;
/// What a backend function returns when the device has no room: accalloc releases cached memory
/// and retries, as for a device out-of-memory error.
pub const ACCALLOC_BACKEND_OUT_OF_MEMORY: i32 = 2;

/// The functions of an accelerator backend, for accalloc_register_backend. Set struct_size to
/// sizeof(AccallocBackendVTable) (later versions may add entries at the end). The first four entries are
/// required; a NULL optional entry turns its feature off: without the five event functions,
/// accalloc_record_stream falls back to stream_synchronize when there is one and is otherwise
/// ACCALLOC_ERROR_NOT_SUPPORTED; without the five virtual-memory functions, expandable segments fall back
/// to ordinary segments. The functions may be called from any thread, and with the same context
/// concurrently for different devices. They may call accalloc for other device types (the host,
/// say), but not for their own: such a call returns ACCALLOC_ERROR_NOT_SUPPORTED, since the device is
/// locked or being set up while they run. What they hand back is checked: a segment or reservation
/// that is NULL, not aligned (512 bytes; reservations also to vm_granularity), wraps around the
/// address space or overlaps one accalloc holds is refused with ACCALLOC_ERROR_BACKEND and given back
/// with raw_free / vm_release; device_count must be 1 to 1024.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AccallocBackendVTable {
    /// sizeof(AccallocBackendVTable) as the caller knows it.
    pub struct_size: usize,
    /// Passed as the first argument of every function.
    pub context: *mut c_void,
    /// Required: how many devices the backend drives (at least 1).
    pub device_count: Option<unsafe extern "C" fn(context: *mut c_void, out: *mut i32) -> i32>,
    /// Required: allocate `size` bytes on `device` for `stream`, address 512-byte aligned, into *out.
    pub raw_alloc: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            size: usize,
            stream: *mut c_void,
            out: *mut *mut c_void,
        ) -> i32,
    >,
    /// Required: free what raw_alloc returned (`size` as allocated).
    pub raw_free: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            ptr: *mut c_void,
            size: usize,
        ) -> i32,
    >,
    /// Required: free and total bytes of `device`.
    pub mem_get_info: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            free: *mut u64,
            total: *mut u64,
        ) -> i32,
    >,
    /// Optional: create an event into *out.
    pub event_create: Option<
        unsafe extern "C" fn(context: *mut c_void, device: i32, out: *mut *mut c_void) -> i32,
    >,
    /// Optional: record `event` on `stream`.
    pub event_record: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            event: *mut c_void,
            stream: *mut c_void,
        ) -> i32,
    >,
    /// Optional: set *complete to 1 when `event` has completed, 0 when not yet.
    pub event_query: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            event: *mut c_void,
            complete: *mut i32,
        ) -> i32,
    >,
    /// Optional: wait until `event` completes.
    pub event_synchronize:
        Option<unsafe extern "C" fn(context: *mut c_void, device: i32, event: *mut c_void) -> i32>,
    /// Optional: destroy `event`.
    pub event_destroy:
        Option<unsafe extern "C" fn(context: *mut c_void, device: i32, event: *mut c_void) -> i32>,
    /// Optional: wait until the work queued on `stream` is done.
    pub stream_synchronize:
        Option<unsafe extern "C" fn(context: *mut c_void, device: i32, stream: *mut c_void) -> i32>,
    /// Optional: the mapping granularity of `device` in bytes, into *out.
    pub vm_granularity:
        Option<unsafe extern "C" fn(context: *mut c_void, device: i32, out: *mut usize) -> i32>,
    /// Optional: reserve `size` bytes of address space into *out.
    pub vm_reserve: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            size: usize,
            out: *mut *mut c_void,
        ) -> i32,
    >,
    /// Optional: back `size` bytes at `ptr` (inside a reservation) with memory.
    pub vm_map: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            ptr: *mut c_void,
            size: usize,
        ) -> i32,
    >,
    /// Optional: give back the memory behind `size` bytes at `ptr`, keeping the addresses.
    pub vm_unmap: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            ptr: *mut c_void,
            size: usize,
        ) -> i32,
    >,
    /// Optional: release a whole reservation.
    pub vm_release: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            ptr: *mut c_void,
            size: usize,
        ) -> i32,
    >,
}

/// Why the range [ptr, ptr + size) a backend handed out cannot be used, if it cannot: NULL,
/// not aligned to `alignment`, or running past the end of the address space.
fn unusable_range(ptr: usize, size: usize, alignment: usize) -> Option<String> {
    if ptr == 0 {
        Some("NULL with success".into())
    } else if ptr % alignment != 0 {
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
    table: AccallocBackendVTable,
    devices: usize,
    events: bool,
    virtual_memory: bool,
}

// SAFETY: the registering framework promises (in the table's documentation) that its functions and
// context may be used from any thread.
unsafe impl Send for CustomBackend {}
unsafe impl Sync for CustomBackend {}

impl CustomBackend {
    /// Check a table and ask it for its device count. Errors say what is wrong with the table.
    ///
    /// # Safety
    /// The table's function pointers must be valid functions with the documented signatures, and the
    /// context valid for them, for as long as the process runs.
    pub unsafe fn new(name: &str, table: &AccallocBackendVTable) -> Result<CustomBackend, String> {
        if table.struct_size < std::mem::size_of::<AccallocBackendVTable>() {
            return Err(format!(
                "the table's struct_size is {}, expected {} (sizeof(AccallocBackendVTable))",
                table.struct_size,
                std::mem::size_of::<AccallocBackendVTable>()
            ));
        }
        for (entry, present) in [
            ("device_count", table.device_count.is_some()),
            ("raw_alloc", table.raw_alloc.is_some()),
            ("raw_free", table.raw_free.is_some()),
            ("mem_get_info", table.mem_get_info.is_some()),
        ] {
            if !present {
                return Err(format!("the required entry {entry} is NULL"));
            }
        }
        let mut count = 0;
        let rc = (table.device_count.unwrap())(table.context, &mut count);
        if rc != ACCALLOC_BACKEND_OK || count < 1 || count as usize > super::MAX_DEVICES {
            return Err(format!(
                "device_count returned {rc} with {count} device(s); 1 to {} are supported",
                super::MAX_DEVICES
            ));
        }
        let events = table.event_create.is_some()
            && table.event_record.is_some()
            && table.event_query.is_some()
            && table.event_synchronize.is_some()
            && table.event_destroy.is_some();
        let virtual_memory = table.vm_granularity.is_some()
            && table.vm_reserve.is_some()
            && table.vm_map.is_some()
            && table.vm_unmap.is_some()
            && table.vm_release.is_some();
        Ok(CustomBackend {
            name: name.to_string(),
            table: *table,
            devices: count as usize,
            events,
            virtual_memory,
        })
    }

    fn check(&self, call: &str, rc: i32) -> Result<(), BackendError> {
        match rc {
            ACCALLOC_BACKEND_OK => Ok(()),
            ACCALLOC_BACKEND_OUT_OF_MEMORY => Err(BackendError::OutOfMemory),
            code => Err(BackendError::Failed {
                code: code as i64,
                message: format!("{call} returned error code {code}"),
            }),
        }
    }

    /// Call table entry `entry` (named `name` in messages) with the table's context and turn its
    /// return code into a result; a NULL entry is reported as missing.
    fn call<F: Copy>(
        &self,
        name: &str,
        entry: Option<F>,
        invoke: impl FnOnce(F, *mut c_void) -> i32,
    ) -> Result<(), BackendError> {
        let function = entry.ok_or_else(|| Self::missing(name))?;
        self.check(name, invoke(function, self.table.context))
    }

    fn missing(call: &str) -> BackendError {
        BackendError::Failed {
            code: -1,
            message: format!("{call} is not provided by this backend"),
        }
    }
}

// SAFETY (every `unsafe` call below): the table's entries follow the documented contract, which the
// registering framework promised; the required ones were checked at registration.
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
        self.call("raw_alloc", self.table.raw_alloc, |f, ctx| unsafe {
            f(ctx, device as i32, size, stream as *mut c_void, &mut out)
        })?;
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
        self.call("raw_free", self.table.raw_free, |f, ctx| unsafe {
            f(ctx, device as i32, ptr as *mut c_void, size)
        })
    }

    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        let (mut free, mut total) = (0u64, 0u64);
        self.call("mem_get_info", self.table.mem_get_info, |f, ctx| unsafe {
            f(ctx, device as i32, &mut free, &mut total)
        })?;
        Ok(MemInfo {
            free: free as usize,
            total: total as usize,
        })
    }

    fn events_supported(&self) -> bool {
        self.events
    }

    fn create_event(&self, device: usize) -> Result<EventId, BackendError> {
        let mut out: *mut c_void = std::ptr::null_mut();
        let create = self.table.event_create.filter(|_| self.events);
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
        self.call("event_record", self.table.event_record, |f, ctx| unsafe {
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
        self.call("event_query", self.table.event_query, |f, ctx| unsafe {
            f(ctx, device as i32, event as *mut c_void, &mut complete)
        })?;
        Ok(complete != 0)
    }

    fn synchronize_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        self.call(
            "event_synchronize",
            self.table.event_synchronize,
            |f, ctx| unsafe { f(ctx, device as i32, event as *mut c_void) },
        )
    }

    fn destroy_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        self.call("event_destroy", self.table.event_destroy, |f, ctx| unsafe {
            f(ctx, device as i32, event as *mut c_void)
        })
    }

    fn stream_synchronize_supported(&self) -> bool {
        self.table.stream_synchronize.is_some()
    }

    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        self.call(
            "stream_synchronize",
            self.table.stream_synchronize,
            |f, ctx| unsafe { f(ctx, device as i32, stream as *mut c_void) },
        )
    }

    fn vm_granularity(&self, device: usize) -> Option<usize> {
        let mut out = 0usize;
        let entry = self.table.vm_granularity.filter(|_| self.virtual_memory);
        self.call("vm_granularity", entry, |f, ctx| unsafe {
            f(ctx, device as i32, &mut out)
        })
        .ok()
        .filter(|_| out > 0)
        .map(|_| out)
    }

    fn vm_reserve(&self, device: usize, size: usize) -> Result<usize, BackendError> {
        let mut out: *mut c_void = std::ptr::null_mut();
        self.call("vm_reserve", self.table.vm_reserve, |f, ctx| unsafe {
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
        self.call("vm_map", self.table.vm_map, |f, ctx| unsafe {
            f(ctx, device as i32, ptr as *mut c_void, size)
        })
    }

    fn vm_unmap(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.call("vm_unmap", self.table.vm_unmap, |f, ctx| unsafe {
            f(ctx, device as i32, ptr as *mut c_void, size)
        })
    }

    fn vm_release(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.call("vm_release", self.table.vm_release, |f, ctx| unsafe {
            f(ctx, device as i32, ptr as *mut c_void, size)
        })
    }
}
