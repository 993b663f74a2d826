//! The C ABI: thin `extern "C"` functions that check arguments, call the runtime inside a panic guard,
//! and return an `AccallocStatus` (the message goes to `accalloc_last_error_message`). No allocator logic here.
//! `include/accalloc.h` is generated from these files by build.rs.
//!
//! Safety contract of every `unsafe extern "C"` function here, stated once: each pointer argument is
//! either NULL (reported as ACCALLOC_ERROR_INVALID_ARGUMENT where it is required) or valid for the access
//! its documentation describes, for the duration of the call.
#![allow(clippy::missing_safety_doc)]

pub mod backend_table;
pub mod device;
pub(crate) mod guard;
pub mod info;
pub mod inspect;
pub mod memory;
pub mod observers;
pub mod ort;
pub mod pinned_host;
pub mod planned;
pub mod pluggable;
pub mod pool_checkpoint;
pub mod pools;
pub mod settings;
pub mod sleep;
pub mod stats;
pub mod types;

pub use backend_table::{
    AccallocBackendVTable, ACCALLOC_BACKEND_OK, ACCALLOC_BACKEND_OUT_OF_MEMORY,
};
pub use types::*;
