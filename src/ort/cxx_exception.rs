//! Throwing a C++ `std::runtime_error` without linking a C++ runtime: the Itanium C++ ABI's entry
//! points (`__cxa_allocate_exception`, `__cxa_throw`) and the class's constructor, destructor and
//! type_info, from the C++ runtime ORT loaded (libstdc++ or libc++, both exporting these names).

use std::ffi::{c_char, c_void, CStr, CString};

/// Room for the exception object: std::runtime_error is 16 bytes in libstdc++ and libc++.
const EXCEPTION_SIZE: usize = 64;

/// The C++ runtimes that may already be loaded, first the one ORT's Linux wheels use.
const RUNTIMES: [&CStr; 3] = [c"libstdc++.so.6", c"libc++.so.1", c"libc++.1.dylib"];

/// Throw `std::runtime_error(message)` into the C++ caller; returns only when no C++ runtime is
/// loaded (or it lacks a symbol), having thrown nothing.
///
/// # Safety
/// The caller's frames up to a C++ handler all allow unwinding ("-unwind" ABIs, or C++).
pub(crate) unsafe fn throw_runtime_error(message: &str) {
    type Allocate = unsafe extern "C" fn(usize) -> *mut c_void;
    type Construct = unsafe extern "C" fn(*mut c_void, *const c_char);
    type Destroy = unsafe extern "C" fn(*mut c_void);
    type Throw = unsafe extern "C-unwind" fn(*mut c_void, *mut c_void, Destroy) -> !;
    let Some(runtime) = loaded_runtime() else {
        return;
    };
    let names = [
        c"__cxa_allocate_exception",
        c"__cxa_throw",
        c"_ZNSt13runtime_errorC1EPKc",
        c"_ZNSt13runtime_errorD1Ev",
        c"_ZTISt13runtime_error",
    ];
    // SAFETY: dlsym on a live handle with NUL-terminated names.
    let symbols = names.map(|name| unsafe { libc::dlsym(runtime, name.as_ptr()) });
    if symbols.iter().any(|p| p.is_null()) {
        return;
    }
    let [allocate, throw, construct, destroy, type_info] = symbols;
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // SAFETY: the symbols are the Itanium ABI's and std::runtime_error's, with these
    // signatures; the object is constructed in the runtime's own exception storage (the
    // constructor copies the text), and __cxa_throw takes it over and unwinds to ORT's handler.
    unsafe {
        let allocate: Allocate = std::mem::transmute(allocate);
        let construct: Construct = std::mem::transmute(construct);
        let destroy: Destroy = std::mem::transmute(destroy);
        let throw: Throw = std::mem::transmute(throw);
        let exception = allocate(EXCEPTION_SIZE);
        construct(exception, text.as_ptr());
        drop(text);
        throw(exception, type_info, destroy)
    }
}

/// A handle of a C++ runtime already in the process, never loading one.
fn loaded_runtime() -> Option<*mut c_void> {
    RUNTIMES.iter().find_map(|name| {
        // SAFETY: RTLD_NOLOAD only looks the library up. The reference it takes is kept: the
        // runtime stays loaded for the process anyway while ORT is.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        (!handle.is_null()).then_some(handle)
    })
}
