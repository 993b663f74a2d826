//! The table of a backend written in C, as accalloc_register_backend takes it. Every function gets the
//! table's context first and returns ACCALLOC_BACKEND_OK on success, ACCALLOC_BACKEND_OUT_OF_MEMORY when
//! the device has no room, or any other value as its own error code. The backend layer never sees this
//! struct: `AccallocBackendVTable::functions` checks it and hands backend/custom.rs its Rust view.

use crate::backend::custom::{
    self, CopyFunctions, EventFunctions, Functions, PinnedHostFunctions, SegmentFunctions,
    VirtualMemoryFunctions,
};
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
/// to ordinary segments; without host_alloc and host_free, pinned host memory (accalloc_host_malloc) is
/// ACCALLOC_ERROR_NOT_SUPPORTED; without copy_to_host and copy_from_host, a pause with a backup is. A
/// table from a caller built against an older header, whose struct_size ends before host_alloc (or
/// copy_to_host), is read up to its struct_size and lacks what follows. The functions may be called
/// from any thread, and with the same context concurrently for different devices. They may call
/// accalloc for other device types (the host, say), but not for their own: such a call returns ACCALLOC_ERROR_NOT_SUPPORTED, since the device is
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
    /// Optional: allocate `size` bytes of pinned (page-locked) host memory, usable for asynchronous
    /// copies with every device of the backend, into *out.
    pub host_alloc: Option<
        unsafe extern "C" fn(context: *mut c_void, size: usize, out: *mut *mut c_void) -> i32,
    >,
    /// Optional: free what host_alloc returned (`size` as asked for).
    pub host_free:
        Option<unsafe extern "C" fn(context: *mut c_void, ptr: *mut c_void, size: usize) -> i32>,
    /// Optional: copy `size` bytes of `device` memory at `src` to host memory at `dst`, done when it
    /// returns (the backups of accalloc_pool_pause; without both copy entries a pause with a backup
    /// is ACCALLOC_ERROR_NOT_SUPPORTED).
    pub copy_to_host: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            dst: *mut c_void,
            src: *const c_void,
            size: usize,
        ) -> i32,
    >,
    /// Optional: copy `size` bytes of host memory at `src` to `device` memory at `dst`, done when it
    /// returns (accalloc_pool_resume puts the backups back with it).
    pub copy_from_host: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            device: i32,
            dst: *mut c_void,
            src: *const c_void,
            size: usize,
        ) -> i32,
    >,
}

/// The struct_size of the first table layout (up to vm_release): the smallest a caller may pass.
pub const FIRST_TABLE_SIZE: usize = std::mem::offset_of!(AccallocBackendVTable, host_alloc);

// The backend layer reads return codes by its own names for the same values.
const _: () = assert!(custom::BACKEND_OK == ACCALLOC_BACKEND_OK);
const _: () = assert!(custom::BACKEND_OUT_OF_MEMORY == ACCALLOC_BACKEND_OUT_OF_MEMORY);

impl AccallocBackendVTable {
    /// A copy of the caller's table, reading only its struct_size bytes (a table from an older
    /// header is shorter than this struct); entries past them are NULL.
    ///
    /// # Safety
    /// `table` is NULL or readable for its struct_size bytes (at least the size of its first field).
    pub unsafe fn read(table: *const AccallocBackendVTable) -> Option<AccallocBackendVTable> {
        if table.is_null() {
            return None;
        }
        // SAFETY: struct_size is the table's first field, readable by the caller's promise.
        let declared = unsafe { std::ptr::read_unaligned(table as *const usize) };
        let mut copy = std::mem::MaybeUninit::<AccallocBackendVTable>::zeroed();
        let readable = declared.min(std::mem::size_of::<AccallocBackendVTable>());
        // SAFETY: `readable` bytes of the caller's table are readable; the copy is that large. An
        // all-zero table is a valid one: a NULL context and every entry None.
        unsafe {
            std::ptr::copy_nonoverlapping(
                table as *const u8,
                copy.as_mut_ptr() as *mut u8,
                readable,
            );
            Some(copy.assume_init())
        }
    }

    /// The virtual-memory group, when all five of its entries are there.
    fn virtual_memory(&self) -> Option<VirtualMemoryFunctions> {
        match (
            self.vm_granularity,
            self.vm_reserve,
            self.vm_map,
            self.vm_unmap,
            self.vm_release,
        ) {
            (Some(granularity), Some(reserve), Some(map), Some(unmap), Some(release)) => {
                Some(VirtualMemoryFunctions {
                    granularity,
                    reserve,
                    map,
                    unmap,
                    release,
                })
            }
            _ => None,
        }
    }

    /// The table as a private pool's own allocator takes it (accalloc_pool_create_with_allocator):
    /// struct_size, raw_alloc and raw_free checked, the virtual-memory group when whole; the other
    /// entries are not used (the device's backend answers them) and may be NULL.
    pub fn segment_functions(&self) -> Result<SegmentFunctions, String> {
        if self.struct_size < FIRST_TABLE_SIZE {
            return Err(format!(
                "the table's struct_size is {}, expected {} (sizeof(AccallocBackendVTable))",
                self.struct_size,
                std::mem::size_of::<AccallocBackendVTable>()
            ));
        }
        let required = |entry: &str| format!("the required entry {entry} is NULL");
        Ok(SegmentFunctions {
            context: self.context,
            raw_alloc: self.raw_alloc.ok_or_else(|| required("raw_alloc"))?,
            raw_free: self.raw_free.ok_or_else(|| required("raw_free"))?,
            virtual_memory: self.virtual_memory(),
        })
    }

    /// The table as the backend layer takes it: struct_size and the four required entries checked
    /// (the error says what is wrong with the table), and each optional group present only when all
    /// of its entries are, so that a partial group turns its feature off.
    pub fn functions(&self) -> Result<Functions, String> {
        if self.struct_size < FIRST_TABLE_SIZE {
            return Err(format!(
                "the table's struct_size is {}, expected {} (sizeof(AccallocBackendVTable)), or at \
                 least {FIRST_TABLE_SIZE} from an older header",
                self.struct_size,
                std::mem::size_of::<AccallocBackendVTable>()
            ));
        }
        let required = |entry: &str| format!("the required entry {entry} is NULL");
        let device_count = self.device_count.ok_or_else(|| required("device_count"))?;
        let raw_alloc = self.raw_alloc.ok_or_else(|| required("raw_alloc"))?;
        let raw_free = self.raw_free.ok_or_else(|| required("raw_free"))?;
        let mem_get_info = self.mem_get_info.ok_or_else(|| required("mem_get_info"))?;
        let events = match (
            self.event_create,
            self.event_record,
            self.event_query,
            self.event_synchronize,
            self.event_destroy,
        ) {
            (Some(create), Some(record), Some(query), Some(synchronize), Some(destroy)) => {
                Some(EventFunctions {
                    create,
                    record,
                    query,
                    synchronize,
                    destroy,
                })
            }
            _ => None,
        };
        let virtual_memory = self.virtual_memory();
        // Entries past the caller's struct_size were never written by it: read() left them NULL.
        let pinned_host = match (self.host_alloc, self.host_free) {
            (Some(alloc), Some(free)) => Some(PinnedHostFunctions { alloc, free }),
            _ => None,
        };
        let copies = match (self.copy_to_host, self.copy_from_host) {
            (Some(to_host), Some(from_host)) => Some(CopyFunctions { to_host, from_host }),
            _ => None,
        };
        Ok(Functions {
            context: self.context,
            pinned_host,
            copies,
            device_count,
            raw_alloc,
            raw_free,
            mem_get_info,
            events,
            stream_synchronize: self.stream_synchronize,
            virtual_memory,
        })
    }
}
