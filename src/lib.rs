//! accalloc: one caching device-memory allocator for every accelerator, with PyTorch-compatible
//! statistics behind a stable C ABI.
//!
//! Layers, top to bottom: `capi` (extern "C"), `runtime` (accelerators, devices, current device),
//! then the caching core from the `accalloc-core` crate (crates/core), re-exported here: `caching`
//! (the allocator, over a `Backend`) and `backend` (raw device memory). The tools (the `accalloc`
//! command) are the `accalloc-tools` crate (crates/tools), over this one.

pub mod capi;
/// accalloc as ONNX Runtime's allocator (the `ort` feature).
#[cfg(feature = "ort")]
pub mod ort;
pub mod runtime;

// The caching core (crates/core) under the names the library has always had.
pub use accalloc_core::{backend, caching, error, pinned, trace, units};
pub use accalloc_core::{Error, ErrorKind, Result};
