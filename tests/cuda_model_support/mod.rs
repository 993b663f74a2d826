//! The model's own entry points (cuda_model/), for the tests that run the CUDA backend on it. The
//! tests find the model in the libcuda cudarc loaded. They cannot run without it, so each is
//! #[ignore]d and scripts/test-all.sh runs them with `-- --include-ignored`
//! and LD_LIBRARY_PATH=$(scripts/cuda-model.sh); run explicitly without the model (no
//! LD_LIBRARY_PATH to it, or a real GPU's driver loaded first), model() fails the test, saying why.
#![allow(dead_code)] // each test binary uses its own subset

use accalloc::backend::cuda::CudaBackend;
use accalloc::backend::Backend;
use cudarc::driver::sys;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

/// Why a test on the model that was asked for explicitly fails without it.
pub const NEEDS_MODEL: &str = "the CUDA driver model is not loaded: scripts/test-all.sh runs these \
                               tests with LD_LIBRARY_PATH=$(scripts/cuda-model.sh) -- --include-ignored";

pub struct Model {
    pub backend: Arc<CudaBackend>,
    launch: unsafe extern "C" fn(*mut c_void, u64, u64, usize) -> u32,
    violations: unsafe extern "C" fn(*mut c_char, usize) -> u64,
    set_faults: unsafe extern "C" fn(*const c_char) -> u32,
    on_violation: extern "C" fn(i32),
    counts: unsafe extern "C" fn(*mut u64) -> u32,
    faults_fired: extern "C" fn() -> u64,
}

/// What is alive in the model's driver.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct Counts {
    pub events: u64,
    pub streams: u64,
    pub handles: u64,
    pub reservations: u64,
    pub allocations: u64,
}

unsafe fn symbol<T>(handle: *mut c_void, name: &CStr) -> Option<T> {
    let f = libc::dlsym(handle, name.as_ptr());
    (!f.is_null()).then(|| std::mem::transmute_copy(&f))
}

/// The CUDA backend on the model. A test that asked for it fails when the model is not what
/// loaded: it cannot run, and must not pass.
pub fn model() -> Model {
    let backend = match CudaBackend::detect() {
        Ok(b) => Arc::new(b),
        Err(why) => panic!("{NEEDS_MODEL}: {why}"),
    };
    // SAFETY: NOLOAD only finds the libcuda cudarc already opened; the symbols have these types
    // (cuda_model/src/lib.rs).
    unsafe {
        let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        let handle = if handle.is_null() {
            libc::dlopen(c"libcuda.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD)
        } else {
            handle
        };
        assert!(!handle.is_null(), "{NEEDS_MODEL}: no libcuda is loaded");
        let found = (|| {
            Some(Model {
                backend: backend.clone(),
                launch: symbol(handle, c"accallocModelLaunch")?,
                violations: symbol(handle, c"accallocModelViolations")?,
                set_faults: symbol(handle, c"accallocModelSetFaults")?,
                on_violation: symbol(handle, c"accallocModelOnViolation")?,
                counts: symbol(handle, c"accallocModelCounts")?,
                faults_fired: symbol(handle, c"accallocModelFaultsFired")?,
            })
        })();
        found.unwrap_or_else(|| panic!("{NEEDS_MODEL}: the libcuda loaded is a real driver"))
    }
}

impl Model {
    /// Make `device`'s primary context current on this thread, as a framework would.
    pub fn make_current(&self, device: usize) {
        assert!(
            self.try_make_current(device),
            "device {device}'s context could not be made current"
        );
    }

    /// make_current, which may fail under injected faults: whether it worked.
    pub fn try_make_current(&self, device: usize) -> bool {
        let (mut ctx, mut dev) = (std::ptr::null_mut(), 0);
        // SAFETY: valid out-pointers; the model is initialized (detect called cuInit).
        unsafe {
            sys::cuDeviceGet(&mut dev, device as i32) == sys::CUresult::CUDA_SUCCESS
                && sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) == sys::CUresult::CUDA_SUCCESS
                && sys::cuCtxSetCurrent(ctx) == sys::CUresult::CUDA_SUCCESS
        }
    }

    /// A new non-blocking stream on `device` (its context made current).
    pub fn stream(&self, device: usize) -> usize {
        self.make_current(device);
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer, a context current.
        let rc = unsafe { sys::cuStreamCreate(&mut stream, 1) };
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
        stream as usize
    }

    /// Wait for `stream`'s work, then destroy it.
    pub fn destroy_stream(&self, device: usize, stream: usize) {
        self.make_current(device);
        // SAFETY: a stream this file created on `device`.
        unsafe {
            assert_eq!(
                sys::cuStreamSynchronize(stream as sys::CUstream),
                sys::CUresult::CUDA_SUCCESS
            );
            assert_eq!(
                sys::cuStreamDestroy_v2(stream as sys::CUstream),
                sys::CUresult::CUDA_SUCCESS
            );
        }
    }

    /// Work on `stream` (of `device`) that uses [ptr, ptr + bytes) for `micros`: the CUresult.
    pub fn launch(
        &self,
        device: usize,
        stream: usize,
        micros: u64,
        ptr: usize,
        bytes: usize,
    ) -> u32 {
        // Under injected faults making the context current may fail: so does the launch.
        if !self.try_make_current(device) {
            return sys::CUresult::CUDA_ERROR_UNKNOWN as u32;
        }
        // SAFETY: the model checks every argument.
        unsafe { (self.launch)(stream as *mut c_void, micros, ptr as u64, bytes) }
    }

    /// The number of violations so far and the last one's message.
    pub fn violations(&self) -> (u64, String) {
        let mut buf = vec![0 as c_char; 1024];
        // SAFETY: buf holds 1024 bytes.
        let n = unsafe { (self.violations)(buf.as_mut_ptr(), buf.len()) };
        let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        (n, text)
    }

    /// Abort at a violation (true, the model's default) or count it.
    pub fn abort_on_violation(&self, abort: bool) {
        (self.on_violation)(abort as i32)
    }

    /// Replace the fault rules ("" for none).
    pub fn set_faults(&self, spec: &str) {
        let spec = std::ffi::CString::new(spec).unwrap();
        // SAFETY: a NUL-terminated string.
        assert_eq!(
            unsafe { (self.set_faults)(spec.as_ptr()) },
            0,
            "fault rules refused"
        );
    }

    /// How many calls the current fault rules have failed.
    pub fn faults_fired(&self) -> u64 {
        (self.faults_fired)()
    }

    pub fn counts(&self) -> Counts {
        let mut out = [0u64; 5];
        // SAFETY: out holds the five counts.
        assert_eq!(unsafe { (self.counts)(out.as_mut_ptr()) }, 0);
        Counts {
            events: out[0],
            streams: out[1],
            handles: out[2],
            reservations: out[3],
            allocations: out[4],
        }
    }

    /// The model's free bytes on `device`.
    pub fn free_bytes(&self, device: usize) -> usize {
        self.backend.mem_get_info(device).unwrap().free
    }

    pub fn capacity(&self, device: usize) -> usize {
        self.backend.mem_get_info(device).unwrap().total
    }
}
