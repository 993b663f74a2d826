//! accalloc: one caching device-memory allocator for every accelerator, with PyTorch-compatible
//! statistics behind a stable C ABI.
//!
//! Layers, top to bottom: `capi` (extern "C"), `runtime` (accelerators, devices, current device),
//! `caching` (the allocator, over a `Backend`), `backend` (raw device memory).

pub mod backend;
pub mod caching;
pub mod capi;
pub mod error;
/// accalloc as ONNX Runtime's allocator (the `ort` feature).
#[cfg(feature = "ort")]
pub mod ort;
pub mod replay;
pub mod runtime;
pub mod units;

pub use error::{Error, ErrorKind, Result};
