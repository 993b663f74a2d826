//! Backends hand out raw device memory. They know nothing of caching: the caching layer asks them for
//! whole segments and gives whole segments back.

pub mod address_window;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod custom;
pub mod host;
pub mod renamed;
pub mod simulated;
pub mod wrapper;

pub use wrapper::Wrapper;

use std::fmt;

/// The most devices one backend may drive (a backend reporting more is refused): PyTorch's device
/// indices are 8-bit, so this leaves room to spare while bounding what per-device tables cost.
pub const MAX_DEVICES: usize = 1024;

/// An opaque stream handle (`void*` at the C boundary); 0 is the default stream.
pub type StreamId = usize;

/// An event handle of a backend (a cudaEvent_t for CUDA).
pub type EventId = usize;

/// Why a backend call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// The device has no room: the caching layer releases cached memory and retries.
    OutOfMemory,
    /// Any other failure, with the backend's own code and words.
    Failed { code: i64, message: String },
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::OutOfMemory => f.write_str("out of memory"),
            BackendError::Failed { code, message } => write!(f, "{message} (code {code})"),
        }
    }
}

/// Free and total bytes of a device, as `cudaMemGetInfo` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    pub free: usize,
    pub total: usize,
}

/// What every accelerator must provide to sit under the caching allocator.
///
/// Calls may come from any thread; a backend guards its own state. `device` is always a valid index
/// below `device_count()` (the caching layer checks it).
///
/// Beyond the five memory calls, a backend has five optional groups: events, stream
/// synchronization, virtual memory, pinned host memory and copies to and from the host. Each
/// backend states which it has: `events_supported`, `stream_synchronize_supported`,
/// `vm_granularity`, `pinned_host_supported` and `copies_supported` have no default, so no implementation can
/// claim a group, or lose one, by omission. The calls of a group default to failing with "not
/// provided", never to succeeding: a backend that forgets one gets an error, not an event that
/// reads as complete while its stream still uses the memory. A backend that wraps another one
/// implements [`Wrapper`] instead of this trait, and forwards every call in that one place.
pub trait Backend: Send + Sync {
    /// Short lowercase name used in messages ("host", "cuda", ...).
    fn name(&self) -> &str;
    /// How many devices this backend drives.
    fn device_count(&self) -> usize;
    /// Allocate one segment of `size` bytes (a multiple of 512) on `device`; the address is at least
    /// 512-byte aligned.
    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError>;
    /// Give back a segment exactly as `raw_alloc` returned it.
    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError>;
    /// The device's free and total memory.
    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError>;

    // Events mark the point a stream has reached; a block freed while other streams still use it
    // returns to the pool only when their events complete. A backend whose work is synchronous (the
    // host) says so by answering that its events complete at once.

    /// Whether the event functions below work (false: blocks used by other streams are handled by
    /// synchronizing those streams, or record_stream is not supported). No default: every backend
    /// states it.
    fn events_supported(&self) -> bool;
    /// Create an event on `device`.
    fn create_event(&self, _device: usize) -> Result<EventId, BackendError> {
        Err(not_provided("create_event"))
    }
    /// Record `event` on `stream`: it completes when the stream's work so far is done.
    fn record_event(
        &self,
        _device: usize,
        _event: EventId,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        Err(not_provided("record_event"))
    }
    /// Whether `event` has completed, without waiting.
    fn query_event(&self, _device: usize, _event: EventId) -> Result<bool, BackendError> {
        Err(not_provided("query_event"))
    }
    /// Wait until `event` completes.
    fn synchronize_event(&self, _device: usize, _event: EventId) -> Result<(), BackendError> {
        Err(not_provided("synchronize_event"))
    }
    /// Release an event created by `create_event`.
    fn destroy_event(&self, _device: usize, _event: EventId) -> Result<(), BackendError> {
        Err(not_provided("destroy_event"))
    }

    /// Whether `synchronize_stream` works. No default: every backend states it.
    fn stream_synchronize_supported(&self) -> bool;
    /// Wait until the work queued on `stream` is done.
    fn synchronize_stream(&self, _device: usize, _stream: StreamId) -> Result<(), BackendError> {
        Err(not_provided("stream_synchronize"))
    }

    // Virtual memory, for expandable segments: reserve an address range once, then map and unmap
    // physical memory inside it in whole pages. A backend without it returns None from
    // `vm_granularity`, and expandable segments fall back to ordinary ones.

    /// The mapping granularity in bytes, or None when virtual memory is not supported. No default:
    /// every backend states it.
    fn vm_granularity(&self, device: usize) -> Option<usize>;
    /// Reserve `size` bytes of address space (no memory behind it yet).
    fn vm_reserve(&self, _device: usize, _size: usize) -> Result<usize, BackendError> {
        Err(not_provided("vm_reserve"))
    }
    /// Back `size` bytes at `ptr` (inside a reservation, granularity-aligned) with memory;
    /// OutOfMemory when the device has no room.
    fn vm_map(&self, _device: usize, _ptr: usize, _size: usize) -> Result<(), BackendError> {
        Err(not_provided("vm_map"))
    }
    /// Give back the memory behind `size` bytes at `ptr`, keeping the addresses reserved.
    fn vm_unmap(&self, _device: usize, _ptr: usize, _size: usize) -> Result<(), BackendError> {
        Err(not_provided("vm_unmap"))
    }
    /// Release a whole reservation (everything in it unmapped).
    fn vm_release(&self, _device: usize, _ptr: usize, _size: usize) -> Result<(), BackendError> {
        Err(not_provided("vm_release"))
    }

    // Pinned host memory, for the host caching allocator (crate::pinned): host memory the device
    // copies from and to without staging, so that a copy can run asynchronously on a stream.

    /// Whether `pinned_host_alloc` and `pinned_host_free` work. No default: every backend states it.
    fn pinned_host_supported(&self) -> bool;
    /// Allocate `size` bytes of pinned host memory, usable with every device of this backend.
    fn pinned_host_alloc(&self, _size: usize) -> Result<PinnedHostAllocation, BackendError> {
        Err(not_provided("pinned_host_alloc"))
    }
    /// Give back what `pinned_host_alloc` returned, with the size it was asked for.
    fn pinned_host_free(&self, _ptr: usize, _size: usize) -> Result<(), BackendError> {
        Err(not_provided("pinned_host_free"))
    }

    // Copies between device and host memory, for the backups of sleep (a paused pool's contents
    // kept in host memory while its pages are unmapped). Both are done when they return.

    /// Whether `copy_to_host` and `copy_from_host` work. No default: every backend states it.
    fn copies_supported(&self) -> bool;
    /// Copy `size` bytes at `src` on `device` to host memory at `dst`.
    fn copy_to_host(
        &self,
        _device: usize,
        _dst: usize,
        _src: usize,
        _size: usize,
    ) -> Result<(), BackendError> {
        Err(not_provided("copy_to_host"))
    }
    /// Copy `size` bytes of host memory at `src` to `dst` on `device`.
    fn copy_from_host(
        &self,
        _device: usize,
        _dst: usize,
        _src: usize,
        _size: usize,
    ) -> Result<(), BackendError> {
        Err(not_provided("copy_from_host"))
    }
}

/// What `pinned_host_alloc` handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedHostAllocation {
    pub ptr: usize,
    /// The memory is page-locked (false: ordinary pageable memory, where the system refused to
    /// lock it; copies from it work but are staged, as with any pageable memory).
    pub page_locked: bool,
}

/// What an optional call a backend lacks answers.
fn not_provided(call: &str) -> BackendError {
    BackendError::Failed {
        code: -1,
        message: format!("{call} is not provided by this backend"),
    }
}
