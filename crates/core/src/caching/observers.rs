//! What the allocator tells observers: the segment events a framework registers memory with a network
//! library from (NCCL, RDMA), and the report of each out-of-memory failure (PyTorch's OOM observers).
//!
//! The core calls the segment observer itself, in order, while it holds the device (the runtime's
//! device lock): a segment's free is told before its alloc can be told again, whichever thread does
//! what. Announcements of going away (free, unmap) come before the backend call, so that a network
//! library deregisters memory that still exists; if the backend then refuses, the memory stays and
//! is announced again (alloc, map). OOM reports are only queued here: the runtime hands them to its
//! observers after it has let go of the device, as PyTorch does.

use super::pools::MempoolId;
use crate::backend::StreamId;

/// What happened to a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentAction {
    /// A new segment came from the backend (PyTorch's SEGMENT_ALLOC).
    Alloc,
    /// A segment is about to go back to the backend (SEGMENT_FREE).
    Free,
    /// Pages of an expandable segment were mapped (SEGMENT_MAP).
    Map,
    /// Pages of an expandable segment are about to be unmapped (SEGMENT_UNMAP).
    Unmap,
}

/// One segment event of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentEvent {
    pub action: SegmentAction,
    pub device: usize,
    /// The pool the memory belongs to: (0, 0) for the default pools.
    pub pool: MempoolId,
    /// The range: a whole segment (alloc, free) or the pages mapped or unmapped.
    pub address: usize,
    pub size: usize,
    pub stream: StreamId,
}

/// Called for every segment event of a device, in order.
pub type SegmentObserver = Box<dyn FnMut(&SegmentEvent) + Send>;

/// One out-of-memory failure, with PyTorch's OOM observer's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomReport {
    pub device: usize,
    /// The segment size that could not be had.
    pub alloc_size: usize,
    /// The memory fraction's limit where one is set, else the device's total memory.
    pub limit_or_total: usize,
    /// The device's free memory at the failure (0 when the backend could not say).
    pub device_free: usize,
}

/// How many OOM reports wait for the runtime at most; older ones make room (nobody was listening).
pub const OOM_REPORTS_KEPT: usize = 16;
