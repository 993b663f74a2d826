//! The `Allocator`: ORT's `OrtAllocator` struct of callbacks over one accalloc device, its
//! `OrtMemoryInfo` and its statistics.

use super::cxx_exception;
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::last_error::set_last_error;
use crate::runtime::{runtime, DeviceType, DEVICE_TYPE_CUDA};
use ort_sys::{
    OrtAllocator, OrtAllocatorType, OrtApi, OrtErrorCode, OrtKeyValuePairs, OrtMemType,
    OrtMemoryInfo, OrtStatusPtr, OrtSyncStream,
};
use std::ffi::{c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

/// The newest `OrtAllocator` layout this build knows (ort-sys's ORT_API_VERSION): the version field is
/// never set above it, so ORT never reads a field this struct lacks.
pub const ORT_API_VERSION: u32 = ort_sys::ORT_API_VERSION;
/// The first ORT API version whose `OrtAllocator` has GetStats and AllocOnStream.
pub const ORT_API_VERSION_WITH_STATS: u32 = 23;
/// Versions above this are refused as a mistake (ORT counts one version per release, about 25 by
/// 2025): a garbage number would otherwise pass for "newer than this build".
pub const MAX_PLAUSIBLE_ORT_API_VERSION: u32 = 1000;

/// An `OrtAllocator` over one accalloc device.
///
/// `#[repr(C)]` with ORT's struct first, so the `OrtAllocator*` ORT passes to each callback is this
/// struct's address. It must outlive every use by ORT: unregister it (`UnregisterAllocator`) or
/// release the environment, and release the sessions and values holding its memory, before dropping
/// it. Dropping it releases its `OrtMemoryInfo`; memory ORT still holds stays allocated.
#[repr(C)]
pub struct Allocator {
    ort: OrtAllocator,
    api: *const OrtApi,
    /// The version the caller obtained its `OrtApi` with: which of the table's functions exist.
    api_version: u32,
    device_type: DeviceType,
    /// A resolved index (never -1), so that the allocator keeps its device whatever the current
    /// device of the thread ORT calls from.
    device: i32,
    /// Created with the caller's `OrtApi`; returned by Info, released on drop.
    memory_info: *mut OrtMemoryInfo,
    /// Successful Reserve calls (ORT's NumReserves).
    reserves: AtomicI64,
    /// The largest request served (ORT's MaxAllocSize).
    max_request: AtomicUsize,
}

// SAFETY: the OrtApi table and the memory info are immutable after creation and ORT's functions on
// them are thread-safe; the counters are atomics. ORT calls the callbacks from any thread.
unsafe impl Send for Allocator {}
// SAFETY: as for Send: nothing is mutated except through atomics.
unsafe impl Sync for Allocator {}

/// The figures GetStats reports, in ORT's AllocatorStats terms. Device-wide figures are the
/// device's own books: they count everything allocated on that device (ORT's tensors, and PyTorch's
/// or anyone else's when they share it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrtAllocatorStats {
    /// "Limit": the bytes reserved memory may grow to: the memory fraction's share when one is set,
    /// else the device's total memory.
    pub limit: i64,
    /// "InUse": bytes handed out now (allocated_bytes.all.current).
    pub in_use: i64,
    /// "RequestedInUse": bytes asked for by the live allocations, before rounding
    /// (requested_bytes.all.current).
    pub requested_in_use: i64,
    /// "TotalAllocated": bytes held from the device, in use or cached (reserved_bytes.all.current),
    /// as ORT's arena reports the memory it holds.
    pub total_allocated: i64,
    /// "MaxInUse": peak of bytes handed out (allocated_bytes.all.peak).
    pub max_in_use: i64,
    /// "NumAllocs": allocations made since the last accumulated reset (allocation.all.allocated).
    pub num_allocs: i64,
    /// "NumReserves": successful Reserve calls through this allocator.
    pub num_reserves: i64,
    /// "NumArenaExtensions": segments asked of the device (num_device_alloc).
    pub num_arena_extensions: i64,
    /// "NumArenaShrinkages": segments given back to the device (num_device_free).
    pub num_arena_shrinkages: i64,
    /// "MaxAllocSize": the largest request this allocator served.
    pub max_alloc_size: i64,
}

impl OrtAllocatorStats {
    /// The figures under ORT's keys (AllocatorStats::ToKeyValuePairs's names), in its order.
    pub fn key_values(&self) -> [(&'static CStr, i64); 10] {
        [
            (c"Limit", self.limit),
            (c"InUse", self.in_use),
            (c"RequestedInUse", self.requested_in_use),
            (c"TotalAllocated", self.total_allocated),
            (c"MaxInUse", self.max_in_use),
            (c"NumAllocs", self.num_allocs),
            (c"NumReserves", self.num_reserves),
            (c"NumArenaExtensions", self.num_arena_extensions),
            (c"NumArenaShrinkages", self.num_arena_shrinkages),
            (c"MaxAllocSize", self.max_alloc_size),
        ]
    }
}

impl Allocator {
    /// An allocator on `device` (-1: this thread's current device, fixed now) of `device_type`.
    /// `api_version` is the version `api` was obtained with (GetApi's argument): the struct's version
    /// field is the lower of it and ORT_API_VERSION, and only the callbacks that version reads are
    /// set (GetStats and AllocOnStream from 23).
    ///
    /// Info reports "Cpu" memory (device 0, OrtDeviceAllocator, OrtMemTypeDefault), what ORT's CPU
    /// execution provider allocates, for the host and for registered backends (whose memory must then
    /// be host-accessible); CUDA devices report "Cuda" memory of their index.
    ///
    /// # Safety
    /// `api` is NULL or an `OrtApi` table of at least version `api_version` that stays valid for the
    /// life of the allocator.
    pub unsafe fn new(
        api: *const OrtApi,
        api_version: u32,
        device_type: DeviceType,
        device: i32,
    ) -> Result<Box<Allocator>> {
        // SAFETY: the caller promises a non-NULL `api` is a valid table.
        let table =
            unsafe { api.as_ref() }.ok_or_else(|| Error::invalid_argument("ort_api is NULL"))?;
        if !(1..=MAX_PLAUSIBLE_ORT_API_VERSION).contains(&api_version) {
            return Err(Error::invalid_argument(format!(
                "ORT API version {api_version} is not one ORT serves: give the version passed to \
                 OrtGetApiBase()->GetApi (1 to {MAX_PLAUSIBLE_ORT_API_VERSION}; this build knows up \
                 to {ORT_API_VERSION})"
            )));
        }
        let accelerator = runtime()?.accelerator(device_type)?;
        let index = accelerator.resolve(device)? as i32;
        let memory_info = create_memory_info(table, device_type, index)?;
        let version = api_version.min(ORT_API_VERSION);
        let with_stats = version >= ORT_API_VERSION_WITH_STATS;
        // The allocating callbacks may throw ORT's C++ exception, so they are "system-unwind"
        // functions; ort-sys types the fields "system". accalloc never calls through these fields, and
        // the two ABIs pass arguments alike: only the unwinding contract differs, which ORT (C++,
        // expecting allocators to throw) meets.
        type AllocFn = unsafe extern "system" fn(*mut OrtAllocator, usize) -> *mut c_void;
        type ReserveFn = unsafe extern "system" fn(*const OrtAllocator, usize) -> *mut c_void;
        type OnStreamFn =
            unsafe extern "system" fn(*mut OrtAllocator, usize, *mut OrtSyncStream) -> *mut c_void;
        // SAFETY: same signatures and calling convention; see above for the unwinding contract.
        let (alloc, reserve, alloc_on_stream) = unsafe {
            (
                std::mem::transmute::<AllocUnwindFn, AllocFn>(alloc),
                std::mem::transmute::<ReserveUnwindFn, ReserveFn>(reserve),
                std::mem::transmute::<OnStreamUnwindFn, OnStreamFn>(alloc_on_stream),
            )
        };
        let ort = OrtAllocator {
            version,
            Alloc: Some(alloc),
            Free: Some(free),
            Info: Some(info),
            Reserve: Some(reserve),
            GetStats: if with_stats { Some(get_stats) } else { None },
            AllocOnStream: if with_stats {
                Some(alloc_on_stream)
            } else {
                None
            },
        };
        Ok(Box::new(Allocator {
            ort,
            api,
            api_version,
            device_type,
            device: index,
            memory_info,
            reserves: AtomicI64::new(0),
            max_request: AtomicUsize::new(0),
        }))
    }

    /// The `OrtAllocator*` to hand to ORT (RegisterAllocator, or any API taking an allocator).
    pub fn as_ort_allocator(&self) -> *mut OrtAllocator {
        // ORT's callbacks take a mutable pointer but this allocator changes only atomics through it.
        self as *const Allocator as *mut OrtAllocator
    }

    /// The allocator behind an `OrtAllocator*` from `as_ort_allocator`.
    ///
    /// # Safety
    /// `ptr` came from `as_ort_allocator` of an allocator still alive for `'a`.
    pub unsafe fn from_ort_allocator<'a>(ptr: *const OrtAllocator) -> &'a Allocator {
        // SAFETY: `ort` is the first field of a repr(C) struct, so the addresses coincide.
        unsafe { &*(ptr as *const Allocator) }
    }

    /// The accalloc device type it allocates on.
    pub fn device_type(&self) -> DeviceType {
        self.device_type
    }

    /// The device index it allocates on.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// The version field ORT reads.
    pub fn version(&self) -> u32 {
        self.ort.version
    }

    /// The `OrtMemoryInfo` Info returns (owned by the allocator).
    pub fn memory_info(&self) -> *const OrtMemoryInfo {
        self.memory_info
    }

    /// Allocate `size` bytes on the allocator's device, default stream (what ORT's Alloc does).
    pub fn allocate(&self, size: usize) -> Result<*mut c_void> {
        let ptr = runtime()?.malloc_on(self.device_type, size, self.device, 0)?;
        self.max_request.fetch_max(size, Ordering::Relaxed);
        Ok(ptr as *mut c_void)
    }

    /// Return memory from `allocate` (NULL is a no-op).
    pub fn deallocate(&self, ptr: *mut c_void) -> Result<()> {
        runtime()?.free(ptr as usize)
    }

    /// What GetStats reports, as numbers (see OrtAllocatorStats for each figure's source).
    pub fn stats(&self) -> Result<OrtAllocatorStats> {
        let accelerator = runtime()?.accelerator(self.device_type)?;
        let device = accelerator.device(self.device)?;
        let stats = device.stats();
        let limit = match device.allowed_maximum() {
            Some(bytes) => bytes,
            None => device.mem_get_info()?.total,
        };
        drop(device);
        const ALL: usize = crate::caching::StatType::All as usize;
        Ok(OrtAllocatorStats {
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            in_use: stats.allocated_bytes[ALL].current,
            requested_in_use: stats.requested_bytes[ALL].current,
            total_allocated: stats.reserved_bytes[ALL].current,
            max_in_use: stats.allocated_bytes[ALL].peak,
            num_allocs: stats.allocation[ALL].allocated,
            num_reserves: self.reserves.load(Ordering::Relaxed),
            num_arena_extensions: stats.num_device_alloc,
            num_arena_shrinkages: stats.num_device_free,
            max_alloc_size: i64::try_from(self.max_request.load(Ordering::Relaxed))
                .unwrap_or(i64::MAX),
        })
    }

    fn table(&self) -> &OrtApi {
        // SAFETY: checked non-NULL at creation; the caller keeps it valid while the allocator lives.
        unsafe { &*self.api }
    }

    /// The stats as an OrtKeyValuePairs the caller releases with ReleaseKeyValuePairs.
    fn stats_key_values(&self) -> Result<*mut OrtKeyValuePairs> {
        if self.api_version < 22 {
            // CreateKeyValuePairs came with version 22; GetStats is not set below 23 anyway.
            return Err(Error::new(
                ErrorKind::NotSupported,
                "the OrtApi given has no key-value pairs (version 22 or later is needed)",
            ));
        }
        let stats = self.stats()?;
        let api = self.table();
        let mut pairs = std::ptr::null_mut();
        // SAFETY: a valid table of version >= 22, whose CreateKeyValuePairs writes a new object.
        unsafe { (api.CreateKeyValuePairs)(&mut pairs) };
        if pairs.is_null() {
            return Err(Error::new(
                ErrorKind::Internal,
                "ORT's CreateKeyValuePairs returned NULL",
            ));
        }
        for (key, value) in stats.key_values() {
            let value = CString::new(value.to_string()).expect("digits have no NUL");
            // SAFETY: `pairs` is live; ORT copies the strings.
            unsafe { (api.AddKeyValuePair)(pairs, key.as_ptr(), value.as_ptr()) };
        }
        Ok(pairs)
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        if !self.memory_info.is_null() {
            // SAFETY: created by this table's CreateCpuMemoryInfo / CreateMemoryInfo, released once.
            unsafe { (self.table().ReleaseMemoryInfo)(self.memory_info) };
        }
    }
}

/// The memory info Info reports (see Allocator::new).
fn create_memory_info(
    api: &OrtApi,
    device_type: DeviceType,
    device: i32,
) -> Result<*mut OrtMemoryInfo> {
    let mut info = std::ptr::null_mut();
    // SAFETY: a valid table (version 1 functions); `info` receives a new object.
    let status = unsafe {
        if device_type == DEVICE_TYPE_CUDA {
            (api.CreateMemoryInfo)(
                c"Cuda".as_ptr(),
                OrtAllocatorType::OrtDeviceAllocator,
                device,
                OrtMemType::OrtMemTypeDefault,
                &mut info,
            )
        } else {
            (api.CreateCpuMemoryInfo)(
                OrtAllocatorType::OrtDeviceAllocator,
                OrtMemType::OrtMemTypeDefault,
                &mut info,
            )
        }
    };
    // SAFETY: the status came from this table.
    unsafe { take_status(api, status) }.map_err(|message| {
        Error::new(
            ErrorKind::Backend,
            format!("ORT could not create the allocator's memory info: {message}"),
        )
    })?;
    if info.is_null() {
        return Err(Error::new(
            ErrorKind::Backend,
            "ORT could not create the allocator's memory info: it returned NULL",
        ));
    }
    Ok(info)
}

/// Ok for a NULL status, else its message; the status is released (for callers of the OrtApi
/// too: the tests read ORT's errors with it).
///
/// # Safety
/// `status` is NULL or a live status of `api`'s ORT.
pub unsafe fn take_status(api: &OrtApi, status: OrtStatusPtr) -> std::result::Result<(), String> {
    if status.0.is_null() {
        return Ok(());
    }
    // SAFETY: a live status: read its message, then release it once.
    unsafe {
        let message = CStr::from_ptr((api.GetErrorMessage)(status.0))
            .to_string_lossy()
            .into_owned();
        (api.ReleaseStatus)(status.0);
        Err(message)
    }
}

/// Allocate through `this`: the address (NULL for size 0), or the failure's message, also left on
/// this thread's last error.
///
/// # Safety
/// `this` is an OrtAllocator of an `Allocator`.
unsafe fn allocate_for_ort(
    this: *const OrtAllocator,
    size: usize,
) -> std::result::Result<*mut c_void, String> {
    let result = catch_unwind(AssertUnwindSafe(|| {
        if this.is_null() {
            return Err("ORT called accalloc's allocator with a NULL OrtAllocator".to_string());
        }
        // SAFETY: ORT passes the pointer it was given.
        let allocator = unsafe { Allocator::from_ort_allocator(this) };
        allocator.allocate(size).map_err(|e| e.message)
    }))
    .unwrap_or_else(|_| {
        Err("internal error in accalloc's ORT allocator (please report it): a panic".to_string())
    });
    if let Err(message) = &result {
        set_last_error(message);
    }
    result
}

/// The address, or, for a failure, ORT's kind of failure: a C++ exception (see the module's
/// documentation), NULL where no C++ runtime is loaded. Called outside any catch_unwind, which
/// would abort on a foreign exception.
fn answer_ort(result: std::result::Result<*mut c_void, String>) -> *mut c_void {
    match result {
        Ok(ptr) => ptr,
        Err(message) => {
            // SAFETY: called from a "system-unwind" callback whose caller is ORT's C++ code.
            unsafe { cxx_exception::throw_runtime_error(&message) };
            std::ptr::null_mut()
        }
    }
}

type AllocUnwindFn = unsafe extern "system-unwind" fn(*mut OrtAllocator, usize) -> *mut c_void;
type ReserveUnwindFn = unsafe extern "system-unwind" fn(*const OrtAllocator, usize) -> *mut c_void;
type OnStreamUnwindFn =
    unsafe extern "system-unwind" fn(*mut OrtAllocator, usize, *mut OrtSyncStream) -> *mut c_void;

unsafe extern "system-unwind" fn alloc(this: *mut OrtAllocator, size: usize) -> *mut c_void {
    // SAFETY: ORT passes the allocator it was given.
    answer_ort(unsafe { allocate_for_ort(this, size) })
}

/// ORT's Reserve asks for memory outside any arena growth policy; accalloc has one policy, so it is
/// an allocation like the others, counted in NumReserves.
unsafe extern "system-unwind" fn reserve(this: *const OrtAllocator, size: usize) -> *mut c_void {
    // SAFETY: ORT passes the allocator it was given.
    let result = unsafe { allocate_for_ort(this, size) };
    if result.is_ok() {
        // SAFETY: a success means `this` was checked non-NULL.
        unsafe { Allocator::from_ort_allocator(this) }
            .reserves
            .fetch_add(1, Ordering::Relaxed);
    }
    answer_ort(result)
}

/// AllocOnStream allocates on accalloc's default stream: an `OrtSyncStream` is ORT's object, not the
/// backend's stream handle, and ORT's CPU provider has no streams; ORT orders reuse on its side.
unsafe extern "system-unwind" fn alloc_on_stream(
    this: *mut OrtAllocator,
    size: usize,
    _stream: *mut OrtSyncStream,
) -> *mut c_void {
    // SAFETY: ORT passes the allocator it was given.
    answer_ort(unsafe { allocate_for_ort(this, size) })
}

unsafe extern "system" fn free(this: *mut OrtAllocator, ptr: *mut c_void) {
    let freed = catch_unwind(AssertUnwindSafe(|| {
        if this.is_null() {
            set_last_error("ORT called accalloc's allocator with a NULL OrtAllocator");
            return;
        }
        // SAFETY: ORT passes the allocator it was given.
        let allocator = unsafe { Allocator::from_ort_allocator(this) };
        if let Err(e) = allocator.deallocate(ptr) {
            set_last_error(&e.message);
        }
    }));
    if freed.is_err() {
        set_last_error("internal error in accalloc's ORT allocator (please report it): a panic");
    }
}

unsafe extern "system" fn info(this: *const OrtAllocator) -> *const OrtMemoryInfo {
    if this.is_null() {
        return std::ptr::null();
    }
    // SAFETY: ORT passes the allocator it was given.
    unsafe { Allocator::from_ort_allocator(this) }.memory_info
}

unsafe extern "system" fn get_stats(
    this: *const OrtAllocator,
    out: *mut *mut OrtKeyValuePairs,
) -> OrtStatusPtr {
    if this.is_null() {
        // There is no table to make an error status with (ORT never does this): answer no pairs.
        set_last_error("ORT called GetStats with a NULL OrtAllocator");
        // SAFETY: a non-NULL `out` is writable, as ORT's contract says.
        if let Some(out) = unsafe { out.as_mut() } {
            *out = std::ptr::null_mut();
        }
        return OrtStatusPtr(std::ptr::null_mut());
    }
    // SAFETY: ORT passes the allocator it was given.
    let allocator = unsafe { Allocator::from_ort_allocator(this) };
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: checked non-NULL before the write.
        let out = unsafe { out.as_mut() }.ok_or_else(|| Error::invalid_argument("out is NULL"))?;
        *out = allocator.stats_key_values()?;
        Ok(())
    }))
    .unwrap_or_else(|_| {
        Err(Error::new(
            ErrorKind::Internal,
            "internal error in accalloc's ORT allocator (please report it): a panic in GetStats",
        ))
    });
    match result {
        Ok(()) => OrtStatusPtr(std::ptr::null_mut()),
        Err(e) => {
            set_last_error(&e.message);
            let code = if e.kind == ErrorKind::InvalidArgument {
                OrtErrorCode::ORT_INVALID_ARGUMENT
            } else {
                OrtErrorCode::ORT_FAIL
            };
            let message = CString::new(e.message.replace('\0', " ")).unwrap_or_default();
            // SAFETY: a valid table; ORT copies the message.
            unsafe { (allocator.table().CreateStatus)(code, message.as_ptr()) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_use_ort_allocator_stats_key_names() {
        let stats = OrtAllocatorStats {
            limit: 1,
            in_use: 2,
            requested_in_use: 3,
            total_allocated: 4,
            max_in_use: 5,
            num_allocs: 6,
            num_reserves: 7,
            num_arena_extensions: 8,
            num_arena_shrinkages: 9,
            max_alloc_size: 10,
        };
        let pairs: Vec<(&str, i64)> = stats
            .key_values()
            .iter()
            .map(|(key, value)| (key.to_str().unwrap(), *value))
            .collect();
        assert_eq!(
            pairs,
            [
                ("Limit", 1),
                ("InUse", 2),
                ("RequestedInUse", 3),
                ("TotalAllocated", 4),
                ("MaxInUse", 5),
                ("NumAllocs", 6),
                ("NumReserves", 7),
                ("NumArenaExtensions", 8),
                ("NumArenaShrinkages", 9),
                ("MaxAllocSize", 10),
            ]
        );
    }

    #[test]
    fn a_null_api_or_an_absurd_version_is_refused_before_any_use() {
        // SAFETY: a NULL table is allowed and refused.
        let error = unsafe { Allocator::new(std::ptr::null(), 23, 0, 0) }
            .err()
            .unwrap();
        assert_eq!(error.kind, ErrorKind::InvalidArgument);
        assert!(
            error.message.contains("ort_api is NULL"),
            "{}",
            error.message
        );
    }
}
