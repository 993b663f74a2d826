//! Stream capture (CUDA graphs) across threads, on a CUDA driver: a real GPU (scripts/gpu-check.sh)
//! or the driver model (scripts/test-all.sh). Alone in its own test binary, since a global capture
//! refuses every other thread's synchronizations, which would break tests running beside it.

#![cfg(feature = "cuda")]

use accalloc::backend::cuda::CudaBackend;
use accalloc::backend::{Backend, BackendError};
use cudarc::driver::sys;
use std::sync::Arc;

/// Begin capturing `stream` in `mode`, run `during`, end the capture: (what `during` gave, how the
/// capture ended), the graph destroyed when there is one.
fn capturing<T>(
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

fn stream() -> usize {
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: device 0's context is current on this thread; a valid out-pointer.
    let rc = unsafe { sys::cuStreamCreate(&mut stream, 1) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    stream as usize
}

/// The capturing thread takes memory in every capture mode (the backend relaxes its own), while a
/// global capture refuses another thread's stream synchronization and is lost by it, as an H200's
/// driver did; a thread-local capture leaves the other thread alone.
#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn the_capturing_thread_takes_memory_and_a_global_capture_refuses_other_threads_synchronizations() {
    let gpu = match CudaBackend::detect() {
        Ok(backend) => Arc::new(backend),
        Err(why) => {
            panic!("no CUDA driver answers ({why}): this test needs a GPU or the driver model")
        }
    };
    gpu.mem_get_info(0).unwrap(); // device 0's context current on this thread
    let (side, other) = (stream(), stream());
    for (mode, refused) in [
        (
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            true,
        ),
        (
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            false,
        ),
    ] {
        let ((taken, synchronized), ended) = capturing(side, mode, || {
            let taken = gpu.raw_alloc(0, 2 << 20, side);
            let beside = gpu.clone();
            let synchronized = std::thread::spawn(move || beside.synchronize_stream(0, other))
                .join()
                .unwrap();
            (taken, synchronized)
        });
        let p =
            taken.unwrap_or_else(|e| panic!("{mode:?}: cuMemAlloc on the capturing thread: {e}"));
        gpu.raw_free(0, p, 2 << 20).unwrap();
        if refused {
            assert!(
                matches!(synchronized, Err(BackendError::Failed { code: 900, .. })),
                "{mode:?}: {synchronized:?}"
            );
            assert_eq!(
                ended,
                sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                "{mode:?}"
            );
        } else {
            synchronized.unwrap();
            assert_eq!(ended, sys::CUresult::CUDA_SUCCESS, "{mode:?}");
        }
    }
}
