//! Helpers of the tests that drive the CUDA driver directly beside the CUDA backend (tests/cuda.rs,
//! tests/cuda_capture.rs): on a GPU or on the driver model alike.

use cudarc::driver::sys;

/// A new non-blocking stream of device 0, whose context the backend made current on this thread.
pub fn stream() -> usize {
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: device 0's context is current on this thread; a valid out-pointer.
    let rc = unsafe { sys::cuStreamCreate(&mut stream, 1) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    stream as usize
}

/// Begin capturing `stream` in `mode`, run `during`, end the capture: (what `during` gave, how the
/// capture ended), the graph destroyed when there is one.
pub fn capturing<T>(
    stream: usize,
    mode: sys::CUstreamCaptureMode,
    during: impl FnOnce() -> T,
) -> (T, sys::CUresult) {
    // SAFETY: a stream of device 0, whose context is current on this thread.
    let begun = unsafe { sys::cuStreamBeginCapture_v2(stream as sys::CUstream, mode) };
    assert_eq!(begun, sys::CUresult::CUDA_SUCCESS);
    let result = during();
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: the stream being captured; a valid out-pointer.
    let ended = unsafe { sys::cuStreamEndCapture(stream as sys::CUstream, &mut graph) };
    if ended == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the graph the capture made, destroyed once.
        assert_eq!(
            unsafe { sys::cuGraphDestroy(graph) },
            sys::CUresult::CUDA_SUCCESS
        );
    }
    (result, ended)
}
