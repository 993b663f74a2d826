//! Types and constants of the C ABI.

use crate::caching::stats::{DeviceStats, Stat};
use crate::error::ErrorKind;

/// Version of the binary interface. It changes only when a program built against an older header
/// could misbehave with this library; acc_abi_version() returns the library's value.
pub const ACC_ABI_VERSION: u32 = 1;
/// Library version, major part (acc_version() gives the whole string).
pub const ACC_VERSION_MAJOR: u32 = 0;
/// Library version, minor part.
pub const ACC_VERSION_MINOR: u32 = 1;
/// Library version, patch part.
pub const ACC_VERSION_PATCH: u32 = 0;

/// The result of every fallible call. On failure, acc_last_error_message() says what went wrong.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccStatus {
    /// Success.
    ACC_OK = 0,
    /// A NULL out-pointer, a NULL or unknown key, a value out of range.
    ACC_ERROR_INVALID_ARGUMENT = 1,
    /// A device index that does not exist.
    ACC_ERROR_INVALID_DEVICE = 2,
    /// A pointer accalloc did not hand out, or one already freed.
    ACC_ERROR_INVALID_POINTER = 3,
    /// The device (or the memory fraction) has no room, even after releasing cached memory.
    ACC_ERROR_OUT_OF_MEMORY = 4,
    /// The backend (driver) failed; the message carries its name and code.
    ACC_ERROR_BACKEND = 5,
    /// The current accelerator cannot do this.
    ACC_ERROR_NOT_SUPPORTED = 6,
    /// A bad setting in the environment or a configuration string.
    ACC_ERROR_CONFIG = 7,
    /// An output buffer is too small; the length out-parameter says how much is needed.
    ACC_ERROR_BUFFER_TOO_SMALL = 8,
    /// A bug in accalloc (a panic was caught at the boundary).
    ACC_ERROR_INTERNAL = 9,
}

impl From<ErrorKind> for AccStatus {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::InvalidArgument => AccStatus::ACC_ERROR_INVALID_ARGUMENT,
            ErrorKind::InvalidDevice => AccStatus::ACC_ERROR_INVALID_DEVICE,
            ErrorKind::InvalidPointer => AccStatus::ACC_ERROR_INVALID_POINTER,
            ErrorKind::OutOfMemory => AccStatus::ACC_ERROR_OUT_OF_MEMORY,
            ErrorKind::Backend => AccStatus::ACC_ERROR_BACKEND,
            ErrorKind::NotSupported => AccStatus::ACC_ERROR_NOT_SUPPORTED,
            ErrorKind::Config => AccStatus::ACC_ERROR_CONFIG,
            ErrorKind::BufferTooSmall => AccStatus::ACC_ERROR_BUFFER_TOO_SMALL,
            ErrorKind::Internal => AccStatus::ACC_ERROR_INTERNAL,
        }
    }
}

/// A kind of accelerator. Built-in values are ACC_DEVICE_HOST and ACC_DEVICE_CUDA.
pub type AccDeviceType = i32;
/// The host: memory from the operating system. Always available; the default without a GPU.
pub const ACC_DEVICE_HOST: AccDeviceType = 0;
/// NVIDIA GPUs through the CUDA driver.
pub const ACC_DEVICE_CUDA: AccDeviceType = 1;

/// Index of the aggregate slot in each AccStat[3] array of AccDeviceStats.
pub const ACC_STAT_ALL: usize = 0;
/// Index of the small-pool slot (blocks of at most 1 MiB).
pub const ACC_STAT_SMALL_POOL: usize = 1;
/// Index of the large-pool slot.
pub const ACC_STAT_LARGE_POOL: usize = 2;

/// One statistic, as PyTorch keeps it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccStat {
    /// Value now.
    pub current: i64,
    /// Highest value since the last acc_reset_peak_memory_stats.
    pub peak: i64,
    /// Total added since the last acc_reset_accumulated_memory_stats.
    pub allocated: i64,
    /// Total removed since the last acc_reset_accumulated_memory_stats.
    pub freed: i64,
}

/// Every statistic of one device: PyTorch's DeviceStats. Arrays are indexed by ACC_STAT_ALL,
/// ACC_STAT_SMALL_POOL and ACC_STAT_LARGE_POOL.
///
/// Set struct_size to sizeof(AccDeviceStats) before calling acc_get_device_stats: the library fills
/// that many bytes at most, so a program built against this header keeps working when later versions
/// add fields at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccDeviceStats {
    /// Size of this struct as the caller knows it; set by the caller, rewritten with the bytes filled.
    pub struct_size: usize,
    /// Allocations handed out (count).
    pub allocation: [AccStat; 3],
    /// Segments held from the device (count).
    pub segment: [AccStat; 3],
    /// Blocks in use, including those freed but waiting on stream events (count).
    pub active: [AccStat; 3],
    /// Free blocks that are part of a split segment (count).
    pub inactive_split: [AccStat; 3],
    /// Bytes handed out (rounded sizes).
    pub allocated_bytes: [AccStat; 3],
    /// Bytes of segments held from the device.
    pub reserved_bytes: [AccStat; 3],
    /// Bytes of active blocks.
    pub active_bytes: [AccStat; 3],
    /// Bytes of free blocks in split segments.
    pub inactive_split_bytes: [AccStat; 3],
    /// Bytes the callers asked for (before rounding).
    pub requested_bytes: [AccStat; 3],
    /// Allocations of at least max_split_size.
    pub oversize_allocations: AccStat,
    /// Segments of at least max_split_size.
    pub oversize_segments: AccStat,
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

fn stat(s: &Stat) -> AccStat {
    AccStat {
        current: s.current,
        peak: s.peak,
        allocated: s.allocated,
        freed: s.freed,
    }
}

impl From<&DeviceStats> for AccDeviceStats {
    fn from(s: &DeviceStats) -> Self {
        let array = |a: &[Stat; 3]| [stat(&a[0]), stat(&a[1]), stat(&a[2])];
        AccDeviceStats {
            struct_size: std::mem::size_of::<AccDeviceStats>(),
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
