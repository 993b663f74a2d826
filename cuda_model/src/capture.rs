//! Stream capture (what CUDA graphs and `torch.cuda.graph` are built on), as the driver states it:
//! while a capture is under way, "potentially unsafe" calls (allocating, freeing, synchronizing the
//! device) are refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the capture is invalidated,
//! so that cuStreamEndCapture then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. Which thread
//! is refused depends on the calling thread's capture mode (cuThreadExchangeStreamCaptureMode,
//! global by default) and on the modes the captures were begun with:
//! - global: refused while this thread has a capture not begun relaxed, or another thread has one
//!   begun global;
//! - thread-local: refused while this thread has a capture not begun relaxed;
//! - relaxed: never refused.
//!
//! The model keeps no graph: cuStreamEndCapture hands out a handle that only says the capture held,
//! which cuGraphDestroy takes once. A context with a stream being captured is never synchronized, and
//! a destroyed stream's capture ends with it.

use crate::codes::*;
use crate::{driver, lock, put, CUstream};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

// The modes: global, thread-local (1) and relaxed.
const MODE_GLOBAL: c_int = 0;
const MODE_RELAXED: c_int = 2;

const STATUS_NONE: c_int = 0;
const STATUS_ACTIVE: c_int = 1;
const STATUS_INVALIDATED: c_int = 2;

/// The entry points the driver refuses during a capture that concerns the calling thread (an H200's
/// driver refused cuStreamSynchronize of an uncaptured stream on another thread during a global
/// capture; the event calls are refused likewise, as PyTorch's loader threads met).
const UNSAFE_DURING_CAPTURE: [&str; 15] = [
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventQuery",
    "cuEventSynchronize",
];

struct Capture {
    mode: c_int,
    thread: u64,
    device: usize,
    invalidated: bool,
}

/// The streams being captured, by handle.
static CAPTURES: Mutex<Option<HashMap<usize, Capture>>> = Mutex::new(None);
/// The graphs captures made and not yet destroyed.
static GRAPHS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
static NEXT_GRAPH: AtomicU64 = AtomicU64::new(0x6000);

thread_local! {
    static THREAD: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    static MODE: Cell<c_int> = const { Cell::new(MODE_GLOBAL) };
}

/// Invalidate every capture `refuses` (stream handle, capture) and refuse the call when there was
/// one: a call the driver refuses during a capture loses the capture.
fn refuse_where(refuses: impl Fn(usize, &Capture) -> bool) -> Result<(), CuResult> {
    let mut refused = false;
    for (&stream, capture) in lock(&CAPTURES).iter_mut().flat_map(|c| c.iter_mut()) {
        if refuses(stream, capture) {
            capture.invalidated = true;
            refused = true;
        }
    }
    if refused {
        Err(STREAM_CAPTURE_UNSUPPORTED)
    } else {
        Ok(())
    }
}

/// Refuse `entry` when a capture concerns the calling thread (called by `driver` before every
/// entry point's body).
pub fn refuse_during_capture(entry: &str) -> Result<(), CuResult> {
    if !UNSAFE_DURING_CAPTURE.contains(&entry) {
        return Ok(());
    }
    let mode = MODE.with(Cell::get);
    if mode == MODE_RELAXED {
        return Ok(());
    }
    let me = THREAD.with(|t| *t);
    refuse_where(|_, capture| {
        if capture.thread == me {
            capture.mode != MODE_RELAXED
        } else {
            mode == MODE_GLOBAL && capture.mode == MODE_GLOBAL
        }
    })
}

/// Refuse to synchronize a context one of whose streams is being captured.
pub fn refuse_sync_of_device(device: usize) -> Result<(), CuResult> {
    refuse_where(|_, capture| capture.device == device)
}

/// Refuse to synchronize a stream being captured.
pub fn refuse_sync_of(stream: CUstream) -> Result<(), CuResult> {
    refuse_where(|captured, _| captured == stream as usize)
}

/// A destroyed stream's capture, if any, is gone with it.
pub fn forget(stream: CUstream) {
    if let Some(captures) = lock(&CAPTURES).as_mut() {
        captures.remove(&(stream as usize));
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> CuResult {
    driver("cuThreadExchangeStreamCaptureMode", |_| {
        let wanted = *mode.as_ref().ok_or(INVALID_VALUE)?;
        if !(MODE_GLOBAL..=MODE_RELAXED).contains(&wanted) {
            return Err(INVALID_VALUE);
        }
        put(mode, MODE.with(|m| m.replace(wanted)))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CuResult {
    driver("cuStreamBeginCapture_v2", |m| {
        let device = m.current()?;
        if !(MODE_GLOBAL..=MODE_RELAXED).contains(&mode) {
            return Err(INVALID_VALUE);
        }
        // The legacy default stream cannot be captured.
        if (stream as usize) <= 1 {
            return Err(STREAM_CAPTURE_UNSUPPORTED);
        }
        m.stream(device, stream)?;
        let mut captures = lock(&CAPTURES);
        let captures = captures.get_or_insert_with(HashMap::new);
        if captures.contains_key(&(stream as usize)) {
            return Err(ILLEGAL_STATE);
        }
        let thread = THREAD.with(|t| *t);
        let capture = Capture {
            mode,
            thread,
            device,
            invalidated: false,
        };
        captures.insert(stream as usize, capture);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut *mut c_void) -> CuResult {
    driver("cuStreamEndCapture", |m| {
        let device = m.current()?;
        m.stream(device, stream)?;
        if graph.is_null() {
            return Err(INVALID_VALUE);
        }
        let mut captures = lock(&CAPTURES);
        let captures = captures.get_or_insert_with(HashMap::new);
        let capture = captures.get(&(stream as usize)).ok_or(ILLEGAL_STATE)?;
        if capture.mode != MODE_RELAXED && capture.thread != THREAD.with(|t| *t) {
            // Refused, and the capture ends all the same (an H200's driver: the stream then says it
            // is not capturing, and a second end is ILLEGAL_STATE): no graph.
            captures.remove(&(stream as usize));
            put(graph, std::ptr::null_mut())?;
            return Err(STREAM_CAPTURE_WRONG_THREAD);
        }
        let invalidated = captures
            .remove(&(stream as usize))
            .is_some_and(|c| c.invalidated);
        if invalidated {
            put(graph, std::ptr::null_mut())?;
            return Err(STREAM_CAPTURE_INVALIDATED);
        }
        let made = NEXT_GRAPH.fetch_add(0x10, Ordering::Relaxed) as usize;
        lock(&GRAPHS).get_or_insert_with(HashSet::new).insert(made);
        put(graph, made as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CuResult {
    driver("cuStreamIsCapturing", |m| {
        let device = m.current()?;
        m.stream(device, stream)?;
        let captures = lock(&CAPTURES);
        let found = captures
            .as_ref()
            .and_then(|c| c.get(&(stream as usize)))
            .map(|c| c.invalidated);
        put(
            status,
            match found {
                None => STATUS_NONE,
                Some(false) => STATUS_ACTIVE,
                Some(true) => STATUS_INVALIDATED,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: *mut c_void) -> CuResult {
    driver("cuGraphDestroy", |_| {
        // Only a graph a capture made, once.
        let known = lock(&GRAPHS)
            .as_mut()
            .is_some_and(|graphs| graphs.remove(&(graph as usize)));
        if known {
            Ok(())
        } else {
            Err(INVALID_VALUE)
        }
    })
}
