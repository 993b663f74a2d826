//! accalloc as ONNX Runtime's allocator: an `OrtAllocator` (ORT's C struct of callbacks) whose memory
//! comes from one accalloc device, so that ORT's tensors are cached, counted and inspected like
//! PyTorch's (memory_stats, memory_summary, snapshots, ACCALLOC_TRACE, `accalloc tune`).
//!
//! ORT is not linked: the caller hands over the `OrtApi` table it obtained from its ORT
//! (`OrtGetApiBase()->GetApi(version)`) and the version it asked for; this module uses that table to
//! build the `OrtMemoryInfo` and statistics ORT expects. Register the allocator with
//! `OrtApi::RegisterAllocator(env, allocator.as_ort_allocator())` and set the session config entry
//! `session.use_env_allocators` to "1": the sessions of that environment then allocate through it.
//!
//! Every callback catches panics (nothing of Rust's unwinds into ORT). A failed allocation is reported
//! the way ORT's own allocators report one: by throwing a C++ exception, a `std::runtime_error` carrying
//! accalloc's message (PyTorch's "Tried to allocate" form), which ORT turns into the error status of
//! the call that allocated (Run, CreateSession). ORT does not check what Alloc returns: with ORT 1.32 a
//! NULL is written through by the kernel and the process crashes. The exception is built with the
//! C++ runtime already loaded in the process (ORT's libstdc++ or libc++, found with RTLD_NOLOAD, so
//! accalloc links none; a build with panic=abort aborts instead, as a foreign exception cannot cross
//! its frames); where none is loaded, Alloc returns NULL. The message is also kept on the
//! failing thread's last error (accalloc_last_error_message), which for ORT's sequential executor is
//! the thread that called Run.
//!
//! Here: `allocator.rs` (the OrtAllocator and its callbacks) and `cxx_exception.rs` (throwing ORT's
//! exception); the two C functions that hand the allocator to C are in `src/capi/ort.rs`, with the rest
//! of the C ABI the header is generated from.

mod allocator;
mod cxx_exception;

pub use allocator::*;
