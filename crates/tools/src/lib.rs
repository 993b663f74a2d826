//! The tools over accalloc (the `accalloc` command): replay of traces and PyTorch snapshots, the
//! settings search, comparisons, timelines and the benchmark. See `replay`.
//!
//! They use the core's allocator directly (fresh allocators over simulated or real backends) and the
//! C library's runtime and C ABI only where a tool measures the library itself (`bench`, `info`).

pub mod replay;

// The layers the tools stand on, under the names the tools' code uses.
pub(crate) use accalloc::{capi, runtime};
pub(crate) use accalloc_core::{backend, caching, error, planning, units};
