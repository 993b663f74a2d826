//! Types and constants of the C ABI.

use crate::caching::stats::{DeviceStats, Stat};
use crate::error::ErrorKind;

/// Version of the binary interface. It changes only when a program built against an older header
/// could misbehave with this library; accalloc_abi_version() returns the library's value.
pub const ACCALLOC_ABI_VERSION: u32 = 2;
/// Library version, major part (accalloc_version() gives the whole string).
pub const ACCALLOC_VERSION_MAJOR: u32 = 0;
/// Library version, minor part.
pub const ACCALLOC_VERSION_MINOR: u32 = 1;
/// Library version, patch part.
pub const ACCALLOC_VERSION_PATCH: u32 = 0;

/// The result of every fallible call. On failure, accalloc_last_error_message() says what went wrong.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccallocStatus {
    /// Success.
    ACCALLOC_OK = 0,
    /// A NULL out-pointer, a NULL or unknown key, a value out of range.
    ACCALLOC_ERROR_INVALID_ARGUMENT = 1,
    /// A device index that does not exist.
    ACCALLOC_ERROR_INVALID_DEVICE = 2,
    /// A pointer accalloc did not hand out, or one already freed.
    ACCALLOC_ERROR_INVALID_POINTER = 3,
    /// The device (or the memory fraction) has no room, even after releasing cached memory.
    ACCALLOC_ERROR_OUT_OF_MEMORY = 4,
    /// The backend (driver) failed; the message carries its name and code.
    ACCALLOC_ERROR_BACKEND = 5,
    /// The current accelerator cannot do this.
    ACCALLOC_ERROR_NOT_SUPPORTED = 6,
    /// A bad setting in the environment or a configuration string.
    ACCALLOC_ERROR_CONFIG = 7,
    /// An output buffer is too small; the length out-parameter says how much is needed.
    ACCALLOC_ERROR_BUFFER_TOO_SMALL = 8,
    /// A bug in accalloc (a panic was caught at the boundary).
    ACCALLOC_ERROR_INTERNAL = 9,
}

impl From<ErrorKind> for AccallocStatus {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidArgument => AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT,
            ErrorKind::InvalidDevice => AccallocStatus::ACCALLOC_ERROR_INVALID_DEVICE,
            ErrorKind::InvalidPointer => AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER,
            ErrorKind::OutOfMemory => AccallocStatus::ACCALLOC_ERROR_OUT_OF_MEMORY,
            ErrorKind::Backend => AccallocStatus::ACCALLOC_ERROR_BACKEND,
            ErrorKind::NotSupported => AccallocStatus::ACCALLOC_ERROR_NOT_SUPPORTED,
            ErrorKind::Config => AccallocStatus::ACCALLOC_ERROR_CONFIG,
            ErrorKind::BufferTooSmall => AccallocStatus::ACCALLOC_ERROR_BUFFER_TOO_SMALL,
            ErrorKind::Internal => AccallocStatus::ACCALLOC_ERROR_INTERNAL,
        }
    }
}

/// A kind of accelerator. Built-in values are ACCALLOC_DEVICE_HOST and ACCALLOC_DEVICE_CUDA.
pub type AccallocDeviceType = i32;
/// The host: memory from the operating system. Always available; the default without a GPU.
pub const ACCALLOC_DEVICE_HOST: AccallocDeviceType = 0;
/// NVIDIA GPUs through the CUDA driver.
pub const ACCALLOC_DEVICE_CUDA: AccallocDeviceType = 1;

/// Index of the aggregate slot in each AccallocStat[3] array of AccallocDeviceStats.
pub const ACCALLOC_STAT_ALL: usize = 0;
/// Index of the small-pool slot (blocks of at most 1 MiB).
pub const ACCALLOC_STAT_SMALL_POOL: usize = 1;
/// Index of the large-pool slot.
pub const ACCALLOC_STAT_LARGE_POOL: usize = 2;

/// One statistic, as PyTorch keeps it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccallocStat {
    /// Value now.
    pub current: i64,
    /// Highest value since the last accalloc_reset_peak_memory_stats.
    pub peak: i64,
    /// Total added since the last accalloc_reset_accumulated_memory_stats.
    pub allocated: i64,
    /// Total removed since the last accalloc_reset_accumulated_memory_stats.
    pub freed: i64,
}

/// Every statistic of one device: PyTorch's DeviceStats. Arrays are indexed by ACCALLOC_STAT_ALL,
/// ACCALLOC_STAT_SMALL_POOL and ACCALLOC_STAT_LARGE_POOL.
///
/// Set struct_size to sizeof(AccallocDeviceStats) before calling accalloc_get_device_stats: the library fills
/// that many bytes at most, so a program built against this header keeps working when later versions
/// add fields at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccallocDeviceStats {
    /// Size of this struct as the caller knows it; set by the caller, rewritten with the bytes filled.
    pub struct_size: usize,
    /// Allocations handed out (count).
    pub allocation: [AccallocStat; 3],
    /// Segments held from the device (count).
    pub segment: [AccallocStat; 3],
    /// Blocks in use, including those freed but waiting on stream events (count).
    pub active: [AccallocStat; 3],
    /// Free blocks that are part of a split segment (count).
    pub inactive_split: [AccallocStat; 3],
    /// Bytes handed out (rounded sizes).
    pub allocated_bytes: [AccallocStat; 3],
    /// Bytes of segments held from the device.
    pub reserved_bytes: [AccallocStat; 3],
    /// Bytes of active blocks.
    pub active_bytes: [AccallocStat; 3],
    /// Bytes of free blocks in split segments.
    pub inactive_split_bytes: [AccallocStat; 3],
    /// Bytes the callers asked for (before rounding).
    pub requested_bytes: [AccallocStat; 3],
    /// Allocations of at least max_split_size.
    pub oversize_allocations: AccallocStat,
    /// Segments of at least max_split_size.
    pub oversize_segments: AccallocStat,
    /// Retries after releasing cached memory on device out-of-memory.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors returned.
    pub num_ooms: i64,
    /// Synchronizations of all streams (on retry and empty_cache).
    pub num_sync_all_streams: i64,
    /// Segments asked of the device.
    pub num_device_alloc: i64,
    /// Segments given back to the device.
    pub num_device_free: i64,
    /// The configured max_split_size in bytes, -1 when unset.
    pub max_split_size: i64,
}

pub(crate) fn stat(s: &Stat) -> AccallocStat {
    AccallocStat {
        current: s.current,
        peak: s.peak,
        allocated: s.allocated,
        freed: s.freed,
    }
}

impl From<&DeviceStats> for AccallocDeviceStats {
    fn from(s: &DeviceStats) -> Self {
        let array = |a: &[Stat; 3]| [stat(&a[0]), stat(&a[1]), stat(&a[2])];
        AccallocDeviceStats {
            struct_size: std::mem::size_of::<AccallocDeviceStats>(),
            allocation: array(&s.allocation),
            segment: array(&s.segment),
            active: array(&s.active),
            inactive_split: array(&s.inactive_split),
            allocated_bytes: array(&s.allocated_bytes),
            reserved_bytes: array(&s.reserved_bytes),
            active_bytes: array(&s.active_bytes),
            inactive_split_bytes: array(&s.inactive_split_bytes),
            requested_bytes: array(&s.requested_bytes),
            oversize_allocations: stat(&s.oversize_allocations),
            oversize_segments: stat(&s.oversize_segments),
            num_alloc_retries: s.num_alloc_retries,
            num_ooms: s.num_ooms,
            num_sync_all_streams: s.num_sync_all_streams,
            num_device_alloc: s.num_device_alloc,
            num_device_free: s.num_device_free,
            max_split_size: s.max_split_size,
        }
    }
}
