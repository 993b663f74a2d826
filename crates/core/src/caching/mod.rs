//! The caching allocator itself: pure logic over a `Backend`, no FFI and no globals.
//!
//! - `policy`: rounding, pools, segment sizes, split rule (PyTorch's constants)
//! - `config`: the policy's settings; `settings`: parsing them from a configuration string
//! - `block`: blocks, their slab, the free pools and the live-pointer map
//! - `stats`: DeviceStats and the flat memory_stats() keys
//! - `observers`: segment events and out-of-memory reports for observers
//! - `pools`: private pools (MemPool, graph pools) and the routing of allocations to them
//! - `allocator`: malloc / free / empty_cache of one device

pub mod allocator;
pub mod block;
pub mod config;
pub mod observers;
pub mod policy;
pub mod pools;
pub mod settings;
pub mod snapshot;
pub mod stats;
pub mod summary;

pub use allocator::{
    CachingAllocator, CheckpointBlock, CheckpointSegment, MallocStep, PoolCheckpoint, Restored,
    SegmentRequest,
};
pub use config::CachingConfig;
pub use policy::PoolKind;
pub use snapshot::{BlockInfo, BlockState, SegmentInfo};
pub use stats::{DeviceStats, Stat, StatType};

#[cfg(test)]
mod observer_tests;
#[cfg(test)]
mod planned_tests;
#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod sleep_tests;
#[cfg(test)]
mod tests;
