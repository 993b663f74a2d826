//! accalloc's caching core, the bottom layers of accalloc, with no C ABI and no process-wide state:
//!
//! - `backend`: raw device memory behind the `Backend` trait (the host's memory mappings, CUDA through
//!   the driver API loaded at run time, a framework's C table of functions, a simulated device);
//! - `caching`: the caching allocator over one `Backend`, PyTorch's rules and its 122 statistics;
//! - `trace`: accalloc's trace format (one JSON object a line), written and read;
//! - `units` (sizes as people write them) and `error`.
//!
//! The C library (`accalloc`: the runtime, the C ABI) and the tools (`accalloc-tools`) build on it.

pub mod backend;
pub mod caching;
pub mod error;
pub mod pinned;
pub mod planning;
pub mod trace;
pub mod units;

pub use error::{Error, ErrorKind, Result};
