//! A strict model of the CUDA driver API, built as `libcuda.so.1`, so that accalloc's CUDA backend
//! runs, unchanged, in every test on a machine without a GPU. It is stricter than the driver:
//! - nothing works before cuInit (CUDA_ERROR_NOT_INITIALIZED), and every call that acts on a device
//!   wants a current context on the calling thread (CUDA_ERROR_INVALID_CONTEXT), the one that owns
//!   the pointer, stream or event it is given;
//! - device memory is host address space kept PROT_NONE unless allocated, or mapped and granted
//!   access (memory.rs), so a stray host access faults;
//! - streams are asynchronous (streams.rs): `accallocModelLaunch` enqueues work that uses a range
//!   for a while, and memory handed out, launched over, freed or unmapped while another stream's
//!   work still uses it is a violation: the process aborts (or, with
//!   ACCALLOC_CUDA_MODEL_ON_VIOLATION=count, counts it for `accallocModelViolations`);
//! - pinned host memory (pinned.rs, host.rs) is host address space of its own, limited in all, and
//!   freeing it while a stream's queued copy still uses it is a violation like device memory's;
//! - faults are injected per entry point (faults.rs), sticky ones poisoning the context;
//! - during a stream capture, allocating, freeing, synchronizing and event calls are refused as the
//!   driver refuses them, by the threads' capture modes (capture.rs), and the capture is
//!   invalidated.
//!
//! Knobs: ACCALLOC_CUDA_MODEL_DEVICES (2), ACCALLOC_CUDA_MODEL_CAPACITY (16G a device),
//! ACCALLOC_CUDA_MODEL_PINNED_CAPACITY (4G in all), ACCALLOC_CUDA_MODEL_FAIL,
//! ACCALLOC_CUDA_MODEL_ON_VIOLATION. Every entry point catches panics.

#![allow(non_snake_case, clippy::missing_safety_doc)]

mod capture;
mod codes;
mod config;
mod faults;
mod host;
mod memory;
mod pinned;
mod streams;

use codes::*;
use config::{Config, GRANULARITY};
use faults::Faults;
use memory::{Memory, Range};
use pinned::Pinned;
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use streams::{Stream, Use};

type CUdevice = c_int;
type CUcontext = *mut c_void;
type CUdeviceptr = c_ulonglong;
type CUstream = *mut c_void;
type CUevent = *mut c_void;
type CUmemGenericAllocationHandle = c_ulonglong;

#[repr(C)]
pub struct CUmemLocation {
    kind: c_int,
    id: c_int,
}

#[repr(C)]
pub struct CUmemAllocationProp {
    kind: c_uint,
    requested_handle_types: c_uint,
    location: CUmemLocation,
    win32_handle_meta_data: *mut c_void,
    alloc_flags: [u8; 8],
}

#[repr(C)]
pub struct CUmemAccessDesc {
    location: CUmemLocation,
    flags: c_uint,
}

const DRIVER_VERSION: c_int = 12060;
const ALLOCATION_PINNED: c_uint = 1;
const LOCATION_DEVICE: c_int = 1;

struct Device {
    /// The primary context's handle: the address of a word the model owns.
    context: usize,
    retains: u32,
    /// A sticky error: every call on the context returns it until the context is released.
    poisoned: Option<CuResult>,
    default_stream: Option<Arc<Stream>>,
}

struct Event {
    device: usize,
    /// The stream and the queue position it waits for, once recorded.
    recorded: Option<(Arc<Stream>, u64)>,
}

struct Model {
    config: Config,
    devices: Mutex<Vec<Device>>,
    memory: Mutex<Memory>,
    /// Locked after `memory` where both are.
    pinned: Mutex<Pinned>,
    streams: Mutex<HashMap<usize, Arc<Stream>>>,
    events: Mutex<HashMap<usize, Event>>,
    /// Stream and event handles are never reused, so a stale one is always caught.
    next_handle: AtomicUsize,
}

static MODEL: OnceLock<Model> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());
static FAULTS: Mutex<Option<Faults>> = Mutex::new(None);
static VIOLATIONS: Mutex<(u64, String)> = Mutex::new((0, String::new()));
static ABORT_ON_VIOLATION: AtomicBool = AtomicBool::new(true);

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// A lock that a panicking holder did not break (the entry points catch panics).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn violation(message: String) {
    eprintln!("accalloc CUDA driver model: VIOLATION: {message}");
    let mut v = lock(&VIOLATIONS);
    v.0 += 1;
    v.1 = message;
    if ABORT_ON_VIOLATION.load(Ordering::Relaxed) {
        std::process::abort();
    }
}

/// Run one entry point: the model must be initialized, injected faults come first, panics become
/// CUDA_ERROR_UNKNOWN.
fn driver(
    entry: &'static str,
    body: impl FnOnce(&'static Model) -> Result<(), CuResult>,
) -> CuResult {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let model = MODEL.get().ok_or(NOT_INITIALIZED)?;
        let fault = lock(&FAULTS).as_mut().and_then(|f| f.check(entry));
        if let Some(fault) = fault {
            if fault.sticky {
                if let Some(device) = model.device_of_context(CURRENT.with(Cell::get)) {
                    lock(&model.devices)[device].poisoned = Some(fault.code);
                }
            }
            return Err(fault.code);
        }
        capture::refuse_during_capture(entry)?;
        body(model)
    }));
    match result {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// Write through an out-pointer the caller gave, or refuse a null one.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CuResult> {
    if out.is_null() {
        return Err(INVALID_VALUE);
    }
    out.write(value);
    Ok(())
}

impl Model {
    fn device_count(&self) -> usize {
        self.config.devices
    }

    fn device_of_context(&self, context: usize) -> Option<usize> {
        lock(&self.devices)
            .iter()
            .position(|d| d.context == context && context != 0)
    }

    fn ordinal(&self, device: CUdevice) -> Result<usize, CuResult> {
        usize::try_from(device)
            .ok()
            .filter(|&d| d < self.device_count())
            .ok_or(INVALID_DEVICE)
    }

    /// The device of the calling thread's current context, which must be live and unpoisoned.
    fn current(&self) -> Result<usize, CuResult> {
        let device = self
            .device_of_context(CURRENT.with(Cell::get))
            .ok_or(INVALID_CONTEXT)?;
        let devices = lock(&self.devices);
        if devices[device].retains == 0 {
            return Err(INVALID_CONTEXT);
        }
        match devices[device].poisoned {
            Some(code) => Err(code),
            None => Ok(device),
        }
    }

    fn new_handle(&self) -> usize {
        self.next_handle.fetch_add(0x10, Ordering::Relaxed)
    }

    /// A stream of `device`: 0, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are its default
    /// stream (the model gives the legacy stream no implicit synchronization: stricter).
    fn stream(&self, device: usize, handle: CUstream) -> Result<Arc<Stream>, CuResult> {
        let handle = handle as usize;
        if handle <= 2 {
            let mut devices = lock(&self.devices);
            let slot = &mut devices[device].default_stream;
            return Ok(slot
                .get_or_insert_with(|| Stream::start(handle, device))
                .clone());
        }
        match lock(&self.streams).get(&handle) {
            Some(s) if s.device == device => Ok(s.clone()),
            _ => Err(INVALID_HANDLE),
        }
    }

    fn streams_of(&self, device: usize) -> Vec<Arc<Stream>> {
        let mut all: Vec<Arc<Stream>> = lock(&self.streams)
            .values()
            .filter(|s| s.device == device)
            .cloned()
            .collect();
        all.extend(lock(&self.devices)[device].default_stream.clone());
        all
    }

    /// A violation when work on another stream of `device` still uses `range` in a way `access`
    /// conflicts with, unless it is work that `launching` (the stream of a launch or copy) waited
    /// for.
    fn check_unused(
        &self,
        device: usize,
        range: Range,
        launching: Option<&Stream>,
        access: Use,
        what: &str,
    ) {
        for stream in self.streams_of(device) {
            if launching.is_some_and(|l| std::ptr::eq(l, &*stream)) {
                continue;
            }
            if let Some(((s, e), seq)) = stream.using(range.0, range.1, access) {
                if launching.is_some_and(|l| l.comes_after(&stream, seq)) {
                    continue;
                }
                violation(format!(
                    "{what} [{:#x}, {:#x}) on device {device} while work on stream {:#x} still uses \
                     [{s:#x}, {e:#x}): memory reused before the work using it finished (use after free)",
                    range.0, range.1, stream.handle
                ));
            }
        }
    }
}

// ---- initialization, devices, contexts ----

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CuResult {
    if MODEL.get().is_some() {
        return driver("cuInit", |m| init_again(m, flags));
    }
    let first = catch_unwind(|| -> Result<(), CuResult> {
        let _once = lock(&INIT);
        if let Some(m) = MODEL.get() {
            return init_again(m, flags);
        }
        let config = Config::from_env().map_err(|why| {
            eprintln!("accalloc CUDA driver model: {why}");
            INVALID_VALUE
        })?;
        {
            let mut faults = lock(&FAULTS);
            if faults.is_none() {
                *faults = Some(Faults::parse(&config.faults).map_err(|why| {
                    eprintln!("accalloc CUDA driver model: ACCALLOC_CUDA_MODEL_FAIL: {why}");
                    INVALID_VALUE
                })?);
            }
            if let Some(fault) = faults.as_mut().and_then(|f| f.check("cuInit")) {
                return Err(fault.code);
            }
        }
        if flags != 0 {
            return Err(INVALID_VALUE);
        }
        let memory = Memory::new(config.devices, config.capacity).map_err(|why| {
            eprintln!("accalloc CUDA driver model: {why}");
            OUT_OF_MEMORY
        })?;
        let pinned = Pinned::new(config.pinned_capacity).map_err(|why| {
            eprintln!("accalloc CUDA driver model: {why}");
            OUT_OF_MEMORY
        })?;
        if let Some(abort) = config.abort_on_violation {
            ABORT_ON_VIOLATION.store(abort, Ordering::Relaxed);
        }
        let devices = (0..config.devices)
            .map(|_| Device {
                context: Box::leak(Box::new(0u64)) as *mut u64 as usize,
                retains: 0,
                poisoned: None,
                default_stream: None,
            })
            .collect();
        let count = config.devices;
        let _ = MODEL.set(Model {
            config,
            devices: Mutex::new(devices),
            memory: Mutex::new(memory),
            pinned: Mutex::new(pinned),
            streams: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            next_handle: AtomicUsize::new(0x5000),
        });
        if count == 0 {
            return Err(NO_DEVICE);
        }
        Ok(())
    });
    match first {
        Ok(result) => result.err().unwrap_or(SUCCESS),
        Err(_) => UNKNOWN,
    }
}

/// cuInit once the model is up: the flags are still checked, and no device is still an error.
fn init_again(m: &Model, flags: c_uint) -> Result<(), CuResult> {
    if flags != 0 {
        Err(INVALID_VALUE)
    } else if m.device_count() == 0 {
        Err(NO_DEVICE)
    } else {
        Ok(())
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    put(version, DRIVER_VERSION).err().unwrap_or(SUCCESS)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: CuResult, out: *mut *const c_char) -> CuResult {
    error_text(code, out, codes::name)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: CuResult, out: *mut *const c_char) -> CuResult {
    error_text(code, out, codes::description)
}

unsafe fn error_text(
    code: CuResult,
    out: *mut *const c_char,
    text: fn(CuResult) -> Option<&'static str>,
) -> CuResult {
    match text(code) {
        Some(t) => put(out, t.as_ptr() as *const c_char)
            .err()
            .unwrap_or(SUCCESS),
        None => {
            let _ = put(out, std::ptr::null());
            INVALID_VALUE
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    driver("cuDeviceGetCount", |m| {
        put(count, m.device_count() as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CuResult {
    driver("cuDeviceGet", |m| {
        put(device, m.ordinal(ordinal)? as CUdevice)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(
    name: *mut c_char,
    len: c_int,
    device: CUdevice,
) -> CuResult {
    driver("cuDeviceGetName", |m| {
        let ordinal = m.ordinal(device)?;
        if name.is_null() || len <= 0 {
            return Err(INVALID_VALUE);
        }
        let text = format!("accalloc CUDA driver model (device {ordinal})");
        let n = text.len().min(len as usize - 1);
        std::ptr::copy_nonoverlapping(text.as_ptr(), name as *mut u8, n);
        *name.add(n) = 0;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> CuResult {
    driver("cuDeviceTotalMem_v2", |m| {
        m.ordinal(device)?;
        put(bytes, m.config.capacity)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    context: *mut CUcontext,
    device: CUdevice,
) -> CuResult {
    driver("cuDevicePrimaryCtxRetain", |m| {
        let ordinal = m.ordinal(device)?;
        if context.is_null() {
            return Err(INVALID_VALUE);
        }
        let mut devices = lock(&m.devices);
        devices[ordinal].retains += 1;
        put(context, devices[ordinal].context as CUcontext)
    })
}

/// The last release makes the context inactive, its sticky error gone with it (memory it held is
/// not reclaimed: the model keeps it, to be freed or reported).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(device: CUdevice) -> CuResult {
    driver("cuDevicePrimaryCtxRelease_v2", |m| {
        let ordinal = m.ordinal(device)?;
        let mut devices = lock(&m.devices);
        let d = &mut devices[ordinal];
        if d.retains == 0 {
            return Err(INVALID_CONTEXT);
        }
        d.retains -= 1;
        if d.retains == 0 {
            d.poisoned = None;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(context: CUcontext) -> CuResult {
    driver("cuCtxSetCurrent", |m| {
        let context = context as usize;
        if context != 0 && m.device_of_context(context).is_none() {
            return Err(INVALID_CONTEXT);
        }
        CURRENT.with(|c| c.set(context));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut CUcontext) -> CuResult {
    driver("cuCtxGetCurrent", |_| {
        put(context, CURRENT.with(Cell::get) as CUcontext)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CuResult {
    driver("cuCtxGetDevice", |m| put(device, m.current()? as CUdevice))
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CuResult {
    driver("cuCtxSynchronize", |m| {
        let device = m.current()?;
        // Never while one of the context's streams is captured, whatever the thread's mode.
        capture::refuse_sync_of_device(device)?;
        m.streams_of(device).iter().for_each(|s| s.synchronize());
        Ok(())
    })
}

// ---- memory ----

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut CUdeviceptr, size: usize) -> CuResult {
    driver("cuMemAlloc_v2", |m| {
        let device = m.current()?;
        if ptr.is_null() {
            return Err(INVALID_VALUE);
        }
        let start = lock(&m.memory).alloc(device, size)?;
        let range = (start, start + size);
        m.check_unused(device, range, None, Use::Write, "cuMemAlloc handed out");
        put(ptr, start as CUdeviceptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CuResult {
    driver("cuMemFree_v2", |m| {
        let device = m.current()?;
        let range = lock(&m.memory).free(device, ptr as usize)?;
        m.check_unused(device, range, None, Use::Write, "cuMemFree freed");
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    driver("cuMemGetInfo_v2", |m| {
        let device = m.current()?;
        let memory = lock(&m.memory);
        put(free, memory.free_bytes(device))?;
        put(total, memory.capacity())
    })
}

/// The device an allocation property names: pinned device memory of one of the model's devices.
unsafe fn prop_device(m: &Model, prop: *const CUmemAllocationProp) -> Result<usize, CuResult> {
    let prop = prop.as_ref().ok_or(INVALID_VALUE)?;
    if prop.kind != ALLOCATION_PINNED || prop.location.kind != LOCATION_DEVICE {
        return Err(INVALID_VALUE);
    }
    m.ordinal(prop.location.id).map_err(|_| INVALID_DEVICE)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: c_uint,
) -> CuResult {
    driver("cuMemGetAllocationGranularity", |m| {
        prop_device(m, prop)?;
        if option > 1 {
            return Err(INVALID_VALUE);
        }
        put(granularity, GRANULARITY)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CuResult {
    driver("cuMemAddressReserve", |m| {
        m.current()?;
        if ptr.is_null() || flags != 0 {
            return Err(INVALID_VALUE);
        }
        let start = lock(&m.memory).reserve(size, alignment, addr as usize)?;
        put(ptr, start as CUdeviceptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CuResult {
    driver("cuMemAddressFree", |m| {
        m.current()?;
        lock(&m.memory).free_reservation(ptr as usize, size)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CuResult {
    driver("cuMemCreate", |m| {
        m.current()?;
        let device = prop_device(m, prop)?;
        if handle.is_null() || flags != 0 {
            return Err(INVALID_VALUE);
        }
        let h = lock(&m.memory).create(device, size)?;
        put(handle, h)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CuResult {
    driver("cuMemRelease", |m| {
        m.current()?;
        lock(&m.memory).release(handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CuResult {
    driver("cuMemMap", |m| {
        m.current()?;
        if flags != 0 {
            return Err(INVALID_VALUE);
        }
        lock(&m.memory).map(ptr as usize, size, offset, handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CuResult {
    driver("cuMemSetAccess", |m| {
        m.current()?;
        if desc.is_null() || count == 0 || count > 64 {
            return Err(INVALID_VALUE);
        }
        let grants: Vec<(i32, i32, u32)> = std::slice::from_raw_parts(desc, count)
            .iter()
            .map(|d| (d.location.kind, d.location.id, d.flags))
            .collect();
        lock(&m.memory).set_access(ptr as usize, size, &grants, m.device_count())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CuResult {
    driver("cuMemUnmap", |m| {
        m.current()?;
        let (range, device) = {
            let mut memory = lock(&m.memory);
            let device = memory.device_of(ptr as usize);
            (memory.unmap(ptr as usize, size)?, device)
        };
        if let Some(device) = device {
            m.check_unused(device, range, None, Use::Write, "cuMemUnmap unmapped");
        }
        Ok(())
    })
}

// ---- streams and events ----

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CuResult {
    driver("cuStreamCreate", |m| {
        let device = m.current()?;
        if stream.is_null() || flags > 1 {
            return Err(INVALID_VALUE);
        }
        let handle = m.new_handle();
        lock(&m.streams).insert(handle, Stream::start(handle, device));
        put(stream, handle as CUstream)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CuResult {
    driver("cuStreamDestroy_v2", |m| {
        let device = m.current()?;
        let mut streams = lock(&m.streams);
        match streams.get(&(stream as usize)) {
            Some(s) if s.device == device => s.close(),
            _ => return Err(INVALID_HANDLE),
        }
        streams.remove(&(stream as usize));
        // A capture under way on it ends with it.
        capture::forget(stream);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: CUstream) -> CuResult {
    driver("cuStreamSynchronize", |m| {
        let synchronized = m.stream(m.current()?, stream)?;
        capture::refuse_sync_of(stream)?;
        synchronized.synchronize();
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamQuery(stream: CUstream) -> CuResult {
    driver("cuStreamQuery", |m| {
        if m.stream(m.current()?, stream)?.idle() {
            Ok(())
        } else {
            Err(NOT_READY)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CuResult {
    driver("cuEventCreate", |m| {
        let device = m.current()?;
        // CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS
        if event.is_null() || flags & !0x7 != 0 {
            return Err(INVALID_VALUE);
        }
        let handle = m.new_handle();
        lock(&m.events).insert(
            handle,
            Event {
                device,
                recorded: None,
            },
        );
        put(event, handle as CUevent)
    })
}

/// The event's stream and position, checking that it is the current context's.
fn recorded(m: &Model, event: CUevent) -> Result<Option<(Arc<Stream>, u64)>, CuResult> {
    let device = m.current()?;
    match lock(&m.events).get(&(event as usize)) {
        Some(e) if e.device == device => Ok(e.recorded.clone()),
        Some(_) => Err(INVALID_CONTEXT),
        None => Err(INVALID_HANDLE),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> CuResult {
    driver("cuEventRecord", |m| {
        recorded(m, event)?;
        let stream = m.stream(m.current()?, stream)?;
        let mark = stream.mark();
        if let Some(e) = lock(&m.events).get_mut(&(event as usize)) {
            e.recorded = Some((stream, mark));
        }
        Ok(())
    })
}

/// Work enqueued on `stream` from now on waits until `event`'s work is done (an event never
/// recorded: no wait). The model takes events of the stream's own device only.
#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(
    stream: CUstream,
    event: CUevent,
    flags: c_uint,
) -> CuResult {
    driver("cuStreamWaitEvent", |m| {
        if flags != 0 {
            return Err(INVALID_VALUE);
        }
        let waiting = m.stream(m.current()?, stream)?;
        if let Some((on, seq)) = recorded(m, event)? {
            waiting.wait(on, seq);
        }
        Ok(())
    })
}

/// An event never recorded is complete, as in the driver.
#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(event: CUevent) -> CuResult {
    driver("cuEventQuery", |m| match recorded(m, event)? {
        Some((stream, seq)) if !stream.reached(seq) => Err(NOT_READY),
        _ => Ok(()),
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CuResult {
    driver("cuEventSynchronize", |m| {
        if let Some((stream, seq)) = recorded(m, event)? {
            stream.wait_for(seq);
        }
        Ok(())
    })
}

/// Destroying an event whose work is pending is allowed: the work goes on.
#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: CUevent) -> CuResult {
    driver("cuEventDestroy_v2", |m| {
        recorded(m, event)?;
        lock(&m.events).remove(&(event as usize));
        Ok(())
    })
}

// ---- the model's own entry points, for tests ----

/// Enqueue work on `stream` that uses [ptr, ptr + bytes) for `microseconds`, as a kernel would.
/// The range must be memory of the current context's device that it may access, or the launch
/// fails with CUDA_ERROR_ILLEGAL_ADDRESS and poisons the context. Work still running on another
/// stream over the same bytes is a violation.
#[no_mangle]
pub unsafe extern "C" fn accallocModelLaunch(
    stream: CUstream,
    microseconds: c_ulonglong,
    ptr: CUdeviceptr,
    bytes: usize,
) -> CuResult {
    driver("accallocModelLaunch", |m| {
        let device = m.current()?;
        let stream = m.stream(device, stream)?;
        if bytes == 0 {
            return Err(INVALID_VALUE);
        }
        if !lock(&m.memory).accessible(device, ptr as usize, bytes) {
            lock(&m.devices)[device].poisoned = Some(ILLEGAL_ADDRESS);
            return Err(ILLEGAL_ADDRESS);
        }
        let range = (ptr as usize, ptr as usize + bytes);
        m.check_unused(device, range, Some(&stream), Use::Write, "a launch used");
        stream.launch(microseconds, range);
        Ok(())
    })
}

/// How many violations the model has seen; the last one's message is copied into `last` (up to
/// `capacity` bytes with the NUL) when it is not null.
#[no_mangle]
pub unsafe extern "C" fn accallocModelViolations(
    last: *mut c_char,
    capacity: usize,
) -> c_ulonglong {
    catch_unwind(|| {
        let v = lock(&VIOLATIONS);
        if !last.is_null() && capacity > 0 {
            let n = v.1.len().min(capacity - 1);
            std::ptr::copy_nonoverlapping(v.1.as_ptr(), last as *mut u8, n);
            *last.add(n) = 0;
        }
        v.0
    })
    .unwrap_or(u64::MAX)
}

/// Replace the fault rules (faults.rs's syntax; null or "" for none): CUDA_ERROR_INVALID_VALUE
/// when they do not parse.
#[no_mangle]
pub unsafe extern "C" fn accallocModelSetFaults(spec: *const c_char) -> CuResult {
    catch_unwind(|| {
        let text = if spec.is_null() {
            ""
        } else {
            CStr::from_ptr(spec).to_str().map_err(|_| INVALID_VALUE)?
        };
        *lock(&FAULTS) = Some(Faults::parse(text).map_err(|why| {
            eprintln!("accalloc CUDA driver model: {why}");
            INVALID_VALUE
        })?);
        Ok(())
    })
    .map_or(UNKNOWN, |r: Result<(), CuResult>| {
        r.err().unwrap_or(SUCCESS)
    })
}

/// What is alive in the driver, for leak checks: out[0] events, out[1] streams created (not the
/// default ones), out[2] physical allocations (cuMemCreate, until freed), out[3] address
/// reservations, out[4] cuMemAlloc allocations. CUDA_ERROR_NOT_INITIALIZED before cuInit.
#[no_mangle]
pub unsafe extern "C" fn accallocModelCounts(out: *mut c_ulonglong) -> CuResult {
    catch_unwind(|| {
        let m = MODEL.get().ok_or(NOT_INITIALIZED)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        let memory = lock(&m.memory);
        let (handles, reservations) = memory.vmm_objects();
        let counts = [
            lock(&m.events).len(),
            lock(&m.streams).len(),
            handles,
            reservations,
            memory.allocation_count(),
        ];
        for (i, n) in counts.iter().enumerate() {
            *out.add(i) = *n as c_ulonglong;
        }
        Ok(())
    })
    .map_or(UNKNOWN, |r: Result<(), CuResult>| {
        r.err().unwrap_or(SUCCESS)
    })
}

/// How many calls the current fault rules have failed so far.
#[no_mangle]
pub extern "C" fn accallocModelFaultsFired() -> c_ulonglong {
    lock(&FAULTS).as_ref().map_or(0, |f| f.fired)
}

/// Abort on a violation (nonzero, the default) or only count it (0).
#[no_mangle]
pub extern "C" fn accallocModelOnViolation(abort: c_int) {
    ABORT_ON_VIOLATION.store(abort != 0, Ordering::Relaxed);
}
