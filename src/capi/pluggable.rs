//! PyTorch's pluggable allocator interface: torch.cuda.memory.CUDAPluggableAllocator(path,
//! "accalloc_pluggable_malloc", "accalloc_pluggable_free") loads these by name. PyTorch keeps no statistics for
//! a pluggable allocator; the Python package reads accalloc's through ctypes instead
//! (`accalloc.memory_stats()`, python/accalloc/__init__.py).
//! They act on the current accelerator (CUDA when a GPU is present).

use super::device::accalloc_set_memory_fraction;
use super::guard::last_error_ptr;
use super::memory::{accalloc_empty_cache, accalloc_free, accalloc_malloc, accalloc_record_stream};
use super::types::AccallocStatus;
use std::ffi::{c_void, CStr};

/// PyTorch cannot see accalloc_last_error_message: a failure is also written to standard error.
fn report(what: &str, status: AccallocStatus) {
    if status != AccallocStatus::ACCALLOC_OK {
        // SAFETY: the last error is a NUL-terminated string owned by this thread.
        let message = unsafe { CStr::from_ptr(last_error_ptr()) }.to_string_lossy();
        eprintln!("accalloc: {what}: {message}");
    }
}

/// Allocate `size` bytes on `device` for `stream` (a cudaStream_t); NULL on failure, with the
/// reason written to standard error and kept in accalloc_last_error_message().
#[no_mangle]
pub unsafe extern "C" fn accalloc_pluggable_malloc(
    size: usize,
    device: i32,
    stream: *mut c_void,
) -> *mut c_void {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: &mut ptr is a valid out-pointer.
    let status = unsafe { accalloc_malloc(&mut ptr, size, device, stream) };
    report("accalloc_pluggable_malloc", status);
    ptr
}

/// Free what accalloc_pluggable_malloc returned (`size`, `device` and `stream` are as PyTorch passes them;
/// accalloc knows them already).
#[no_mangle]
pub unsafe extern "C" fn accalloc_pluggable_free(
    ptr: *mut c_void,
    _size: usize,
    _device: i32,
    _stream: *mut c_void,
) {
    // SAFETY: accalloc_free checks the pointer itself.
    report("accalloc_pluggable_free", unsafe { accalloc_free(ptr) });
}

/// PyTorch's init hook: accalloc initialises itself on first use, so this only checks that it can.
#[no_mangle]
pub extern "C" fn accalloc_pluggable_init(_device_count: i32) {
    let status = match crate::runtime::runtime() {
        Ok(_) => AccallocStatus::ACCALLOC_OK,
        Err(error) => {
            super::guard::set_last_error(&error.message);
            error.kind.into()
        }
    };
    report("accalloc_pluggable_init", status);
}

/// PyTorch's reset hook, called by torch.cuda.empty_cache().
#[no_mangle]
pub extern "C" fn accalloc_pluggable_empty_cache() {
    report("accalloc_pluggable_empty_cache", accalloc_empty_cache());
}

/// PyTorch's memory_fraction hook, called by torch.cuda.set_per_process_memory_fraction().
#[no_mangle]
pub extern "C" fn accalloc_pluggable_set_memory_fraction(fraction: f64, device: i32) {
    report(
        "accalloc_pluggable_set_memory_fraction",
        accalloc_set_memory_fraction(fraction, device),
    );
}

/// PyTorch's record_stream hook, called by Tensor.record_stream().
#[no_mangle]
pub unsafe extern "C" fn accalloc_pluggable_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    // SAFETY: accalloc_record_stream checks the pointer itself.
    report("accalloc_pluggable_record_stream", unsafe {
        accalloc_record_stream(ptr, stream)
    });
}
