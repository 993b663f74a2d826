//! Stream capture (CUDA graphs) across threads, on a CUDA driver: a real GPU (scripts/gpu-check.sh)
//! or the driver model (scripts/test-all.sh). Alone in its own test binary, since a global capture
//! refuses every other thread's synchronizations, which would break tests running beside it.

#![cfg(feature = "cuda")]

use accalloc::backend::cuda::CudaBackend;
use accalloc::backend::{Backend, BackendError};
use cuda_support::{capturing, stream};
use cudarc::driver::sys;
use std::sync::Arc;

mod cuda_support;

/// This thread's capture mode, read by setting `mode` and setting back what it was.
fn thread_mode() -> sys::CUstreamCaptureMode {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a valid in-out pointer, twice.
    unsafe {
        assert_eq!(
            sys::cuThreadExchangeStreamCaptureMode(&mut mode),
            sys::CUresult::CUDA_SUCCESS
        );
        let mut back = mode;
        assert_eq!(
            sys::cuThreadExchangeStreamCaptureMode(&mut back),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    mode
}

fn capture_status(stream: usize) -> sys::CUstreamCaptureStatus {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a stream of device 0, whose context is current; a valid out-pointer.
    let rc = unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    status
}

/// One test, its parts in turn: a global capture would refuse a test running beside it.
#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn stream_capture_with_the_cuda_backend() {
    let gpu = match CudaBackend::detect() {
        Ok(backend) => Arc::new(backend),
        Err(why) => {
            panic!("no CUDA driver answers ({why}): this test needs a GPU or the driver model")
        }
    };
    gpu.mem_get_info(0).unwrap(); // device 0's context current on this thread
    the_capturing_thread_takes_memory_and_a_global_capture_refuses_other_threads_synchronizations(
        &gpu,
    );
    a_capture_keeps_the_drivers_rules(&gpu);
}

/// The capturing thread takes memory (device and pinned host memory) in every capture mode, the
/// backend relaxing its own mode and giving it back; another thread's event query (the caches
/// query on every request) is served during any capture; another thread's stream synchronization
/// is refused during a global capture, which it invalidates, as an H200's driver did, and not
/// during a thread-local one.
fn the_capturing_thread_takes_memory_and_a_global_capture_refuses_other_threads_synchronizations(
    gpu: &Arc<CudaBackend>,
) {
    let (side, other) = (stream(), stream());
    let event = gpu.create_event(0).unwrap();
    gpu.record_event(0, event, other).unwrap();
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
        let before = thread_mode();
        let ((taken, pinned, queried, synchronized), ended) = capturing(side, mode, || {
            let taken = gpu.raw_alloc(0, 2 << 20, side);
            let pinned = gpu.pinned_host_alloc(4096);
            let beside = gpu.clone();
            let (queried, synchronized) = std::thread::spawn(move || {
                (
                    beside.query_event(0, event),
                    beside.synchronize_stream(0, other),
                )
            })
            .join()
            .unwrap();
            (taken, pinned, queried, synchronized)
        });
        assert_eq!(
            thread_mode(),
            before,
            "{mode:?}: the backend gave the thread its mode back"
        );
        let p =
            taken.unwrap_or_else(|e| panic!("{mode:?}: cuMemAlloc on the capturing thread: {e}"));
        gpu.raw_free(0, p, 2 << 20).unwrap();
        let pinned = pinned.unwrap_or_else(|e| panic!("{mode:?}: cuMemHostAlloc: {e}"));
        gpu.pinned_host_free(pinned.ptr, 4096).unwrap();
        queried.unwrap_or_else(|e| panic!("{mode:?}: another thread's event query: {e}"));
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
    gpu.destroy_event(0, event).unwrap();
}

/// The driver's rules for a capture, which the driver model keeps as an H200's driver showed them:
/// the legacy stream is not captured; a stream is captured once at a time; a global capture ended
/// by another thread is refused and over all the same (no longer capturing, a second end is
/// ILLEGAL_STATE, the stream synchronizes again); synchronizing the stream being captured is
/// refused, whatever the thread's mode, and invalidates the capture, whose end then says so.
fn a_capture_keeps_the_drivers_rules(gpu: &Arc<CudaBackend>) {
    let global = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    let side = stream();
    // SAFETY (each call below): streams of device 0, whose context is current on this thread.
    let legacy = unsafe { sys::cuStreamBeginCapture_v2(std::ptr::null_mut(), global) };
    assert_eq!(legacy, sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    let begun = unsafe { sys::cuStreamBeginCapture_v2(side as sys::CUstream, global) };
    assert_eq!(begun, sys::CUresult::CUDA_SUCCESS);
    let again = unsafe { sys::cuStreamBeginCapture_v2(side as sys::CUstream, global) };
    assert_eq!(again, sys::CUresult::CUDA_ERROR_ILLEGAL_STATE);
    assert_eq!(
        capture_status(side),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    let beside = gpu.clone();
    let ended_elsewhere = std::thread::spawn(move || {
        beside.mem_get_info(0).unwrap(); // the context current on that thread
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { sys::cuStreamEndCapture(side as sys::CUstream, &mut graph) }
    })
    .join()
    .unwrap();
    assert_eq!(
        ended_elsewhere,
        sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    );
    assert_eq!(
        capture_status(side),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
        "a capture ended by the wrong thread is over"
    );
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let ended_twice = unsafe { sys::cuStreamEndCapture(side as sys::CUstream, &mut graph) };
    assert_eq!(ended_twice, sys::CUresult::CUDA_ERROR_ILLEGAL_STATE);
    gpu.synchronize_stream(0, side).unwrap();

    for mode in [
        global,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    ] {
        let begun = unsafe { sys::cuStreamBeginCapture_v2(side as sys::CUstream, mode) };
        assert_eq!(begun, sys::CUresult::CUDA_SUCCESS);
        synchronizing_the_captured_stream_invalidates_its_capture(gpu, side);
    }
}

fn synchronizing_the_captured_stream_invalidates_its_capture(gpu: &Arc<CudaBackend>, side: usize) {
    let synchronized = gpu.synchronize_stream(0, side);
    assert!(
        matches!(synchronized, Err(BackendError::Failed { code: 900, .. })),
        "{synchronized:?}"
    );
    assert_eq!(
        capture_status(side),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: a stream of device 0, whose context is current on this thread; a valid out-pointer.
    let ended = unsafe { sys::cuStreamEndCapture(side as sys::CUstream, &mut graph) };
    assert_eq!(ended, sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_eq!(
        capture_status(side),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    );
}
