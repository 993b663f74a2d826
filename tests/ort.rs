//! ONNX Runtime allocating through accalloc: real ORT (dlopened from ACCALLOC_ORT_LIBRARY) runs the
//! models of python/tests/make_ort_models.py (from ACCALLOC_ORT_MODELS) with accalloc's allocator
//! registered as the environment's CPU allocator, and gets ORT's own results; accalloc's books show
//! ORT's tensors and come back to where they were; a device without room fails the run with ORT's
//! error and accalloc's message; GetStats tells what accalloc's statistics tell; a backend
//! registered from C serves ORT too.
//!
//! The tests that need ORT are #[ignore]d, so that a plain `cargo test` reports them as ignored
//! rather than passed: scripts/test-ort.sh sets both variables and runs them with
//! `-- --include-ignored`. Run explicitly without ACCALLOC_ORT_LIBRARY, they fail, saying why. The
//! argument checks that come before any call into ORT run everywhere.
//!
//! One accalloc runtime and one ORT environment serve the whole process, so the tests that touch
//! them take TEST_LOCK in turn.
#![cfg(feature = "ort")]

use accalloc::capi::backend_table::AccallocBackendVTable;
use accalloc::capi::device::{
    accalloc_mem_get_info_on, accalloc_register_backend, accalloc_set_memory_fraction_on,
};
use accalloc::capi::memory::accalloc_empty_cache_on;
use accalloc::capi::ort::{accalloc_ort_allocator_create, accalloc_ort_allocator_destroy};
use accalloc::capi::stats::accalloc_get_device_stats_on;
use accalloc::capi::{
    AccallocDeviceStats, AccallocDeviceType, AccallocStatus, ACCALLOC_BACKEND_OK,
    ACCALLOC_BACKEND_OUT_OF_MEMORY, ACCALLOC_DEVICE_HOST, ACCALLOC_STAT_ALL,
};
use ort_sys::*;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

mod common;
use common::last_error;

const OK: AccallocStatus = AccallocStatus::ACCALLOC_OK;
const ALL: usize = ACCALLOC_STAT_ALL;

static TEST_LOCK: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    // One failing test must not fail the others through a poisoned lock.
    TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// ORT, loaded at run time.

/// The loaded ORT: its API table and one environment for the process.
struct Ort {
    api: &'static OrtApi,
    env: *mut OrtEnv,
    models: std::path::PathBuf,
}

// SAFETY: ORT's API table and environment are thread-safe; the tests use them under TEST_LOCK.
unsafe impl Send for Ort {}
// SAFETY: as above.
unsafe impl Sync for Ort {}

/// What the tests that need ORT need: said when one is run without it.
const NEEDS_ORT: &str = "needs ONNX Runtime: scripts/test-ort.sh sets ACCALLOC_ORT_LIBRARY and \
                         ACCALLOC_ORT_MODELS and runs these tests with -- --include-ignored";

/// ORT, loaded once. A test that needs it was asked for explicitly (it is #[ignore]d): without
/// ACCALLOC_ORT_LIBRARY it fails, saying why, rather than passing without running.
fn ort() -> &'static Ort {
    static ORT: OnceLock<Result<Ort, String>> = OnceLock::new();
    let loaded = ORT.get_or_init(|| {
        let Ok(library) = std::env::var("ACCALLOC_ORT_LIBRARY") else {
            return Err(format!("ACCALLOC_ORT_LIBRARY is not set ({NEEDS_ORT})"));
        };
        let Ok(models) = std::env::var("ACCALLOC_ORT_MODELS") else {
            return Err(format!(
                "ACCALLOC_ORT_MODELS must name the folder make_ort_models.py wrote ({NEEDS_ORT})"
            ));
        };
        Ok(unsafe { load(&library, models.into()) })
    });
    match loaded {
        Ok(ort) => ort,
        Err(why) => panic!("{why}"),
    }
}

unsafe fn load(library: &str, models: std::path::PathBuf) -> Ort {
    let path = CString::new(library).unwrap();
    let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
    assert!(
        !handle.is_null(),
        "dlopen {library}: {:?}",
        CStr::from_ptr(libc::dlerror())
    );
    let symbol = libc::dlsym(handle, c"OrtGetApiBase".as_ptr());
    assert!(!symbol.is_null(), "{library} has no OrtGetApiBase");
    let get_api_base: unsafe extern "system" fn() -> *const OrtApiBase =
        std::mem::transmute(symbol);
    let base = &*get_api_base();
    let api = (base.GetApi)(ORT_API_VERSION);
    assert!(
        !api.is_null(),
        "ORT {:?} does not serve API version {ORT_API_VERSION}",
        CStr::from_ptr((base.GetVersionString)())
    );
    let api = &*api;
    let mut env = null_mut();
    check(
        api,
        (api.CreateEnv)(
            // ORT logs the failed run of the out-of-memory test as an error; its status says it all.
            OrtLoggingLevel::ORT_LOGGING_LEVEL_FATAL,
            c"accalloc-test".as_ptr(),
            &mut env,
        ),
    );
    Ort { api, env, models }
}

/// Panic with ORT's message on an error status.
fn check(api: &OrtApi, status: OrtStatusPtr) {
    if let Err(message) = status_result(api, status) {
        panic!("ORT failed: {message}");
    }
}

fn status_result(api: &OrtApi, status: OrtStatusPtr) -> Result<(), String> {
    // SAFETY: every status handed here is NULL or fresh from `api`.
    unsafe { accalloc::ort::take_status(api, status) }
}

/// One model: its file and an input shape.
#[derive(Clone, Copy)]
struct Model {
    file: &'static str,
    shape: &'static [i64],
}

const MLP: Model = Model {
    file: "mlp.onnx",
    shape: &[8, 64],
};
const TRANSFORMER: Model = Model {
    file: "transformer.onnx",
    shape: &[2, 32, 64],
};
/// The MLP on a batch whose activations (4096 x 256 floats, 4 MiB each) need fresh large segments.
const BIG_MLP: Model = Model {
    file: "mlp.onnx",
    shape: &[4096, 64],
};

/// A fixed input: a sine, so that every run gets the same numbers.
fn input_for(shape: &[i64]) -> Vec<f32> {
    let n: i64 = shape.iter().product();
    (0..n).map(|i| (i as f32 * 0.01).sin()).collect()
}

struct Session<'a> {
    ort: &'a Ort,
    session: *mut OrtSession,
}

impl Ort {
    /// A session of `model`; with `env_allocators`, its tensors come from the environment's
    /// registered allocator. ORT's CPU arena is off and one thread runs the kernels, so that every
    /// tensor is one Alloc of the session's allocator, on the thread that calls Run.
    fn session(&self, model: Model, env_allocators: bool) -> Session<'_> {
        let api = self.api;
        unsafe {
            let mut options = null_mut();
            check(api, (api.CreateSessionOptions)(&mut options));
            check(api, (api.DisableCpuMemArena)(options));
            check(api, (api.SetIntraOpNumThreads)(options, 1));
            if env_allocators {
                check(
                    api,
                    (api.AddSessionConfigEntry)(
                        options,
                        c"session.use_env_allocators".as_ptr(),
                        c"1".as_ptr(),
                    ),
                );
            }
            let path = CString::new(self.models.join(model.file).to_str().unwrap()).unwrap();
            let mut session = null_mut();
            let created = (api.CreateSession)(self.env, path.as_ptr(), options, &mut session);
            (api.ReleaseSessionOptions)(options);
            check(api, created);
            Session { ort: self, session }
        }
    }

    /// Register `allocator` (an OrtAllocator*) as the environment's allocator for its memory.
    fn register(&self, allocator: *mut c_void) {
        unsafe {
            check(
                self.api,
                (self.api.RegisterAllocator)(self.env, allocator.cast()),
            )
        };
    }

    fn unregister(&self, allocator: *mut c_void) {
        let allocator = allocator as *const OrtAllocator;
        unsafe {
            let info = ((*allocator).Info.unwrap())(allocator);
            check(self.api, (self.api.UnregisterAllocator)(self.env, info));
        }
    }
}

/// An output tensor, released on drop.
struct Output<'a> {
    api: &'a OrtApi,
    value: *mut OrtValue,
}

impl Output<'_> {
    fn data(&self) -> Vec<f32> {
        let api = self.api;
        unsafe {
            let mut shape_info = null_mut();
            check(
                api,
                (api.GetTensorTypeAndShape)(self.value, &mut shape_info),
            );
            let mut count = 0;
            check(
                api,
                (api.GetTensorShapeElementCount)(shape_info, &mut count),
            );
            (api.ReleaseTensorTypeAndShapeInfo)(shape_info);
            let mut data = null_mut();
            check(api, (api.GetTensorMutableData)(self.value, &mut data));
            std::slice::from_raw_parts(data as *const f32, count).to_vec()
        }
    }

    fn address(&self) -> usize {
        let mut data = null_mut();
        unsafe {
            check(
                self.api,
                (self.api.GetTensorMutableData)(self.value, &mut data),
            )
        };
        data as usize
    }
}

impl Drop for Output<'_> {
    fn drop(&mut self) {
        unsafe { (self.api.ReleaseValue)(self.value) };
    }
}

impl Session<'_> {
    /// Run on the fixed input of `shape`: the output, or ORT's error message.
    fn try_run(&self, shape: &[i64]) -> Result<Output<'_>, String> {
        let api = self.ort.api;
        let mut input = input_for(shape);
        unsafe {
            let mut info = null_mut();
            check(
                api,
                (api.CreateCpuMemoryInfo)(
                    OrtAllocatorType::OrtDeviceAllocator,
                    OrtMemType::OrtMemTypeDefault,
                    &mut info,
                ),
            );
            let mut value = null_mut();
            let made = (api.CreateTensorWithDataAsOrtValue)(
                info,
                input.as_mut_ptr().cast(),
                input.len() * 4,
                shape.as_ptr(),
                shape.len(),
                ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                &mut value,
            );
            (api.ReleaseMemoryInfo)(info);
            check(api, made);
            let names_in = [c"input".as_ptr()];
            let names_out = [c"output".as_ptr()];
            let inputs = [value as *const OrtValue];
            let mut output = null_mut();
            let ran = (api.Run)(
                self.session,
                null(),
                names_in.as_ptr(),
                inputs.as_ptr(),
                1,
                names_out.as_ptr(),
                1,
                &mut output,
            );
            (api.ReleaseValue)(value);
            status_result(api, ran)?;
            Ok(Output { api, value: output })
        }
    }

    fn run(&self, shape: &[i64]) -> Output<'_> {
        self.try_run(shape)
            .unwrap_or_else(|e| panic!("Run failed: {e}"))
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        unsafe { (self.ort.api.ReleaseSession)(self.session) };
    }
}

/// The model's output with ORT's own allocator.
fn reference(ort: &Ort, model: Model) -> Vec<f32> {
    ort.session(model, false).run(model.shape).data()
}

fn assert_same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: output sizes differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{what}: output {i} is {g}, ORT's own allocator gave {w}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// accalloc's side.

fn stats(device_type: AccallocDeviceType, device: i32) -> AccallocDeviceStats {
    let mut out = AccallocDeviceStats {
        struct_size: std::mem::size_of::<AccallocDeviceStats>(),
        ..Default::default()
    };
    let status = unsafe { accalloc_get_device_stats_on(device_type, device, &mut out) };
    assert_eq!(status, OK, "{}", last_error());
    out
}

/// accalloc's ORT allocator on `device` of `device_type`, registered with the environment while it
/// lives, then unregistered and destroyed.
struct Registered<'a> {
    ort: &'a Ort,
    allocator: *mut c_void,
}

impl<'a> Registered<'a> {
    fn new(ort: &'a Ort, device_type: AccallocDeviceType, device: i32) -> Self {
        let mut allocator = null_mut();
        let status = unsafe {
            accalloc_ort_allocator_create(
                (ort.api as *const OrtApi).cast(),
                ORT_API_VERSION,
                device_type,
                device,
                &mut allocator,
            )
        };
        assert_eq!(status, OK, "{}", last_error());
        ort.register(allocator);
        Registered { ort, allocator }
    }

    /// GetStats, called as ORT calls it (OrtApi::AllocatorGetStats), parsed.
    fn ort_stats(&self) -> BTreeMap<String, i64> {
        let api = self.ort.api;
        unsafe {
            let mut pairs = null_mut();
            check(
                api,
                (api.AllocatorGetStats)(self.allocator.cast(), &mut pairs),
            );
            let parsed = parse_pairs(api, pairs);
            (api.ReleaseKeyValuePairs)(pairs);
            parsed
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.ort.unregister(self.allocator);
        let status = unsafe { accalloc_ort_allocator_destroy(self.allocator) };
        assert_eq!(status, OK, "{}", last_error());
    }
}

unsafe fn parse_pairs(api: &OrtApi, pairs: *const OrtKeyValuePairs) -> BTreeMap<String, i64> {
    let (mut keys, mut values, mut count) = (null(), null(), 0);
    (api.GetKeyValuePairs)(pairs, &mut keys, &mut values, &mut count);
    (0..count)
        .map(|i| {
            let key = CStr::from_ptr(*keys.add(i)).to_str().unwrap().to_string();
            let value = CStr::from_ptr(*values.add(i)).to_str().unwrap();
            (key, value.parse().unwrap())
        })
        .collect()
}

/// Run both models through accalloc's allocator on `device` of `device_type` and check what a user
/// would: ORT's results, ORT's tensors in accalloc's books while alive, and the books back where
/// they were once sessions and values are released, with empty_cache returning every segment.
fn models_run_on(ort: &Ort, device_type: AccallocDeviceType, device: i32) {
    for model in [MLP, TRANSFORMER] {
        let want = reference(ort, model);
        let before = stats(device_type, device);
        {
            let _registered = Registered::new(ort, device_type, device);
            let session = ort.session(model, true);
            let after_load = stats(device_type, device);
            let output = session.run(model.shape);
            let running = stats(device_type, device);
            assert_same(&output.data(), &want, model.file);
            assert!(
                running.allocation[ALL].allocated > after_load.allocation[ALL].allocated,
                "{}: Run allocated nothing through accalloc",
                model.file
            );
            // The output tensor is one of accalloc's live blocks.
            let output_bytes = output.data().len() as i64 * 4;
            assert!(
                running.allocated_bytes[ALL].current
                    >= before.allocated_bytes[ALL].current + output_bytes,
                "{}: the output is not in accalloc's allocated bytes",
                model.file
            );
            assert!(
                running.active[ALL].current > before.active[ALL].current,
                "{}: no live block while ORT holds tensors (output at {:#x})",
                model.file,
                output.address()
            );
        }
        let released = stats(device_type, device);
        assert_eq!(
            released.allocated_bytes[ALL].current, before.allocated_bytes[ALL].current,
            "{}: ORT's memory was not all freed",
            model.file
        );
        assert_eq!(
            released.allocation[ALL].current,
            before.allocation[ALL].current
        );
    }
    assert_eq!(accalloc_empty_cache_on(device_type), OK);
    assert_eq!(stats(device_type, device).reserved_bytes[ALL].current, 0);
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[test]
#[ignore = "needs ONNX Runtime (ACCALLOC_ORT_LIBRARY): run by scripts/test-ort.sh"]
fn models_run_through_accalloc_with_ort_own_results() {
    let ort = ort();
    let _serial = serial();
    models_run_on(ort, ACCALLOC_DEVICE_HOST, 0);
}

#[test]
#[ignore = "needs ONNX Runtime (ACCALLOC_ORT_LIBRARY): run by scripts/test-ort.sh"]
fn two_sessions_share_one_allocator() {
    let ort = ort();
    let _serial = serial();
    let (want_mlp, want_transformer) = (reference(ort, MLP), reference(ort, TRANSFORMER));
    let start = stats(ACCALLOC_DEVICE_HOST, 0).allocated_bytes[ALL].current;
    let registered = Registered::new(ort, ACCALLOC_DEVICE_HOST, 0);
    let mlp = ort.session(MLP, true);
    let with_one = stats(ACCALLOC_DEVICE_HOST, 0).allocated_bytes[ALL].current;
    let transformer = ort.session(TRANSFORMER, true);
    let with_two = stats(ACCALLOC_DEVICE_HOST, 0).allocated_bytes[ALL].current;
    // Each session's initializers live in accalloc's blocks.
    assert!(
        with_one > start,
        "the first session's weights are not in accalloc"
    );
    assert!(
        with_two > with_one,
        "the second session's weights are not in accalloc"
    );
    let allocs_before = registered.ort_stats()["NumAllocs"];
    for _ in 0..3 {
        assert_same(&mlp.run(MLP.shape).data(), &want_mlp, "mlp");
        assert_same(
            &transformer.run(TRANSFORMER.shape).data(),
            &want_transformer,
            "transformer",
        );
    }
    assert!(registered.ort_stats()["NumAllocs"] > allocs_before);
    drop(mlp);
    let with_transformer = stats(ACCALLOC_DEVICE_HOST, 0).allocated_bytes[ALL].current;
    assert!(with_transformer > start && with_transformer < with_two);
    drop(transformer);
    assert_eq!(
        stats(ACCALLOC_DEVICE_HOST, 0).allocated_bytes[ALL].current,
        start
    );
}

/// Restores the host device's memory fraction when dropped, also when the test fails.
struct FractionGuard;

impl FractionGuard {
    fn set(fraction: f64) -> FractionGuard {
        let status = accalloc_set_memory_fraction_on(ACCALLOC_DEVICE_HOST, fraction, 0);
        assert_eq!(status, OK, "{}", last_error());
        FractionGuard
    }
}

impl Drop for FractionGuard {
    fn drop(&mut self) {
        accalloc_set_memory_fraction_on(ACCALLOC_DEVICE_HOST, 1.0, 0);
    }
}

#[test]
#[ignore = "needs ONNX Runtime (ACCALLOC_ORT_LIBRARY): run by scripts/test-ort.sh"]
fn a_device_without_room_fails_run_with_ort_error_then_recovers() {
    let ort = ort();
    let _serial = serial();
    let want = reference(ort, BIG_MLP);
    let _registered = Registered::new(ort, ACCALLOC_DEVICE_HOST, 0);
    let session = ort.session(BIG_MLP, true);
    // Cached segments could serve the run without a new one: give them back first. Then a memory
    // fraction of 0 leaves no room for any new segment, and the 4 MiB activations need new ones.
    assert_eq!(accalloc_empty_cache_on(ACCALLOC_DEVICE_HOST), OK);
    let limit = FractionGuard::set(0.0);
    let ooms_before = stats(ACCALLOC_DEVICE_HOST, 0).num_ooms;
    let error = match session.try_run(BIG_MLP.shape) {
        Ok(_) => panic!("Run succeeded on a device without room"),
        Err(message) => message,
    };
    println!("ORT's error: {error}");
    println!("accalloc's message: {}", last_error());
    // accalloc's message reaches the caller inside ORT's status.
    assert!(
        error.contains("Tried to allocate"),
        "ORT's error does not carry accalloc's message: {error}"
    );
    // ORT's kernels ran on this thread (one intra-op thread), so accalloc's message is here.
    assert!(
        last_error().contains("Tried to allocate"),
        "accalloc's message is not reachable: {:?}",
        last_error()
    );
    assert!(stats(ACCALLOC_DEVICE_HOST, 0).num_ooms > ooms_before);
    drop(limit);
    // With room again, the same session runs and gets ORT's results.
    assert_same(
        &session.run(BIG_MLP.shape).data(),
        &want,
        "mlp after the limit",
    );
}

#[test]
#[ignore = "needs ONNX Runtime (ACCALLOC_ORT_LIBRARY): run by scripts/test-ort.sh"]
fn get_stats_agrees_with_accalloc_statistics() {
    let ort = ort();
    let _serial = serial();
    let registered = Registered::new(ort, ACCALLOC_DEVICE_HOST, 0);
    let session = ort.session(TRANSFORMER, true);
    let output = session.run(TRANSFORMER.shape);
    let via_ort = registered.ort_stats();
    let device = stats(ACCALLOC_DEVICE_HOST, 0);
    let keys: Vec<&str> = via_ort.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "InUse",
            "Limit",
            "MaxAllocSize",
            "MaxInUse",
            "NumAllocs",
            "NumArenaExtensions",
            "NumArenaShrinkages",
            "NumReserves",
            "RequestedInUse",
            "TotalAllocated"
        ]
    );
    let (mut free, mut total) = (0, 0);
    assert_eq!(
        unsafe { accalloc_mem_get_info_on(ACCALLOC_DEVICE_HOST, 0, &mut free, &mut total) },
        OK
    );
    assert_eq!(via_ort["Limit"], total as i64);
    assert_eq!(via_ort["InUse"], device.allocated_bytes[ALL].current);
    assert_eq!(
        via_ort["RequestedInUse"],
        device.requested_bytes[ALL].current
    );
    assert_eq!(
        via_ort["TotalAllocated"],
        device.reserved_bytes[ALL].current
    );
    assert_eq!(via_ort["MaxInUse"], device.allocated_bytes[ALL].peak);
    assert_eq!(via_ort["NumAllocs"], device.allocation[ALL].allocated);
    assert_eq!(via_ort["NumArenaExtensions"], device.num_device_alloc);
    assert_eq!(via_ort["NumArenaShrinkages"], device.num_device_free);
    // The largest tensor ORT asked for is at least the output.
    assert!(via_ort["MaxAllocSize"] >= output.data().len() as i64 * 4);
    assert!(via_ort["InUse"] > 0 && via_ort["InUse"] <= via_ort["TotalAllocated"]);
    // The same answer straight from the struct's GetStats, as a framework holding the pointer calls
    // it; a memory fraction shows as the Limit.
    let limit = FractionGuard::set(0.5);
    let direct = unsafe {
        let allocator = registered.allocator as *const OrtAllocator;
        let mut pairs = null_mut();
        check(
            ort.api,
            ((*allocator).GetStats.unwrap())(allocator, &mut pairs),
        );
        let parsed = parse_pairs(ort.api, pairs);
        (ort.api.ReleaseKeyValuePairs)(pairs);
        parsed
    };
    drop(limit);
    assert_eq!(direct["Limit"], (0.5 * total as f64) as i64);
    assert_eq!(direct["InUse"], via_ort["InUse"]);
    // A NULL out-pointer is ORT's invalid-argument status, not a crash.
    unsafe {
        let allocator = registered.allocator as *const OrtAllocator;
        let status = ((*allocator).GetStats.unwrap())(allocator, null_mut());
        let message = status_result(ort.api, status).unwrap_err();
        assert!(message.contains("out is NULL"), "{message}");
    }
}

// A backend registered from C whose memory is host memory: a vendor's device serving ORT.

/// The bytes the registered backend holds now, to check that everything goes back.
static VENDOR_HELD: AtomicI64 = AtomicI64::new(0);
const VENDOR_CAPACITY: u64 = 1 << 30;

unsafe extern "C" fn vendor_device_count(_context: *mut c_void, out: *mut i32) -> i32 {
    *out = 1;
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn vendor_alloc(
    _context: *mut c_void,
    _device: i32,
    size: usize,
    _stream: *mut c_void,
    out: *mut *mut c_void,
) -> i32 {
    if VENDOR_HELD.load(Ordering::Relaxed) + size as i64 > VENDOR_CAPACITY as i64 {
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    }
    let mut ptr = null_mut();
    if libc::posix_memalign(&mut ptr, 4096, size) != 0 {
        return ACCALLOC_BACKEND_OUT_OF_MEMORY;
    }
    VENDOR_HELD.fetch_add(size as i64, Ordering::Relaxed);
    *out = ptr;
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn vendor_free(
    _context: *mut c_void,
    _device: i32,
    ptr: *mut c_void,
    size: usize,
) -> i32 {
    libc::free(ptr);
    VENDOR_HELD.fetch_sub(size as i64, Ordering::Relaxed);
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn vendor_mem_get_info(
    _context: *mut c_void,
    _device: i32,
    free: *mut u64,
    total: *mut u64,
) -> i32 {
    *total = VENDOR_CAPACITY;
    *free = VENDOR_CAPACITY - VENDOR_HELD.load(Ordering::Relaxed) as u64;
    ACCALLOC_BACKEND_OK
}

/// The vendor backend's device type, registered once for the process through the C table.
fn vendor_device_type() -> AccallocDeviceType {
    static TYPE: OnceLock<AccallocDeviceType> = OnceLock::new();
    *TYPE.get_or_init(|| {
        let table = AccallocBackendVTable {
            struct_size: std::mem::size_of::<AccallocBackendVTable>(),
            context: null_mut(),
            device_count: Some(vendor_device_count),
            raw_alloc: Some(vendor_alloc),
            raw_free: Some(vendor_free),
            mem_get_info: Some(vendor_mem_get_info),
            event_create: None,
            event_record: None,
            event_query: None,
            event_synchronize: None,
            event_destroy: None,
            stream_synchronize: None,
            vm_granularity: None,
            vm_reserve: None,
            vm_map: None,
            vm_unmap: None,
            vm_release: None,
            host_alloc: None,
            host_free: None,
            copy_to_host: None,
            copy_from_host: None,
        };
        let mut device_type = -1;
        let status =
            unsafe { accalloc_register_backend(c"ort_vendor".as_ptr(), &table, &mut device_type) };
        assert_eq!(status, OK, "{}", last_error());
        device_type
    })
}

#[test]
#[ignore = "needs ONNX Runtime (ACCALLOC_ORT_LIBRARY): run by scripts/test-ort.sh"]
fn a_backend_registered_from_c_serves_ort() {
    let ort = ort();
    let _serial = serial();
    let vendor = vendor_device_type();
    let before = stats(vendor, 0).num_device_alloc;
    models_run_on(ort, vendor, 0);
    let after = stats(vendor, 0);
    assert!(
        after.num_device_alloc > before,
        "ORT's memory did not come from the registered backend"
    );
    assert_eq!(
        VENDOR_HELD.load(Ordering::Relaxed),
        0,
        "segments not given back"
    );
}

fn create(
    api: *const c_void,
    version: u32,
    device_type: AccallocDeviceType,
    device: i32,
) -> (AccallocStatus, String, *mut c_void) {
    let mut allocator = null_mut();
    let status =
        unsafe { accalloc_ort_allocator_create(api, version, device_type, device, &mut allocator) };
    (status, last_error(), allocator)
}

/// The checks that come before any call into ORT: they need no ORT, and run everywhere.
#[test]
fn bad_arguments_return_an_error_status_before_any_call_into_ort() {
    let invalid = AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT;
    let (status, message, allocator) = create(null(), ORT_API_VERSION, ACCALLOC_DEVICE_HOST, 0);
    assert_eq!((status, allocator), (invalid, null_mut()));
    assert!(message.contains("ort_api is NULL"), "{message}");
    let status = unsafe {
        accalloc_ort_allocator_create(null(), ORT_API_VERSION, ACCALLOC_DEVICE_HOST, 0, null_mut())
    };
    assert_eq!(status, invalid);
    assert!(
        last_error().contains("out_allocator is NULL"),
        "{}",
        last_error()
    );
    assert_eq!(unsafe { accalloc_ort_allocator_destroy(null_mut()) }, OK);
    let mut not_an_allocator = 0u64;
    assert_eq!(
        unsafe { accalloc_ort_allocator_destroy((&mut not_an_allocator as *mut u64).cast()) },
        AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER
    );
}

/// The checks that need ORT's API table: versions it does not serve, devices and device types that
/// do not exist, and the version field of the allocator made for each version asked.
#[test]
#[ignore = "needs ONNX Runtime (ACCALLOC_ORT_LIBRARY): run by scripts/test-ort.sh"]
fn bad_arguments_with_ort_api_table_return_an_error_status() {
    let invalid = AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT;
    let ort = ort();
    let _serial = serial();
    let api = (ort.api as *const OrtApi).cast::<c_void>();
    for version in [0, 5000] {
        let (status, message, _) = create(api, version, ACCALLOC_DEVICE_HOST, 0);
        assert_eq!(status, invalid, "version {version}");
        assert!(message.contains("is not one ORT serves"), "{message}");
    }
    let (status, message, _) = create(api, ORT_API_VERSION, ACCALLOC_DEVICE_HOST, 99);
    assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INVALID_DEVICE);
    assert!(message.contains("device 99 does not exist"), "{message}");
    let (status, message, _) = create(api, ORT_API_VERSION, 60, 0);
    assert_eq!(status, invalid);
    assert!(
        message.contains("device type 60 does not exist"),
        "{message}"
    );

    // The version field never exceeds what the caller's table serves nor what this build knows,
    // and the fields a version does not read stay unset.
    for (asked, field, with_stats) in [
        (17, 17, false),
        (ORT_API_VERSION, ORT_API_VERSION, true),
        (40, ORT_API_VERSION, true),
    ] {
        let (status, message, allocator) = create(api, asked, ACCALLOC_DEVICE_HOST, -1);
        assert_eq!(status, OK, "{message}");
        let ort_allocator = unsafe { &*(allocator as *const OrtAllocator) };
        assert_eq!(ort_allocator.version, field);
        assert_eq!(ort_allocator.GetStats.is_some(), with_stats);
        assert_eq!(ort_allocator.AllocOnStream.is_some(), with_stats);
        assert!(ort_allocator.Alloc.is_some() && ort_allocator.Info.is_some());
        assert_eq!(unsafe { accalloc_ort_allocator_destroy(allocator) }, OK);
        // Destroyed once: a second destroy is refused, not a double free.
        assert_eq!(
            unsafe { accalloc_ort_allocator_destroy(allocator) },
            AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER
        );
    }
}

/// Alloc, Reserve, AllocOnStream and Free called as ORT calls them: each allocation is one block of
/// accalloc's books, Reserve counts in NumReserves, and an allocation that cannot be served is NULL
/// with accalloc's message on this thread.
#[test]
#[ignore = "needs ONNX Runtime (ACCALLOC_ORT_LIBRARY): run by scripts/test-ort.sh"]
fn callbacks_allocate_and_free_through_accalloc() {
    let ort = ort();
    let _serial = serial();
    let vendor = vendor_device_type();
    let (status, message, allocator) = create(
        (ort.api as *const OrtApi).cast(),
        ORT_API_VERSION,
        vendor,
        0,
    );
    assert_eq!(status, OK, "{message}");
    let this = allocator as *mut OrtAllocator;
    unsafe {
        let table = &*this;
        let start = stats(vendor, 0);
        let a = (table.Alloc.unwrap())(this, 1000);
        let r = (table.Reserve.unwrap())(this, 3 << 20);
        let s = (table.AllocOnStream.unwrap())(this, 512, null_mut());
        assert!(!a.is_null() && !r.is_null() && !s.is_null());
        assert_eq!(a as usize % 512, 0);
        let held = stats(vendor, 0);
        assert_eq!(
            held.allocation[ALL].current - start.allocation[ALL].current,
            3
        );
        let mut pairs = null_mut();
        check(ort.api, (table.GetStats.unwrap())(this, &mut pairs));
        let reported = parse_pairs(ort.api, pairs);
        (ort.api.ReleaseKeyValuePairs)(pairs);
        assert_eq!(reported["NumReserves"], 1);
        assert_eq!(reported["MaxAllocSize"], 3 << 20);
        for p in [a, r, s] {
            (table.Free.unwrap())(this, p);
        }
        assert_eq!(
            stats(vendor, 0).allocated_bytes[ALL].current,
            start.allocated_bytes[ALL].current
        );
        // More than the device holds, asked through ORT's C API (which catches what the allocator
        // throws, as ORT's sessions do): ORT's error status with accalloc's reason, which is also
        // on this thread.
        let mut too_big = null_mut();
        let status = (ort.api.AllocatorAlloc)(this, 2 << 30, &mut too_big);
        let message = status_result(ort.api, status).unwrap_err();
        assert!(message.contains("Tried to allocate 2.00 GiB"), "{message}");
        assert!(
            last_error().contains("Tried to allocate"),
            "{}",
            last_error()
        );
        // A pointer accalloc never handed out: nothing happens, and the reason is kept.
        let mut local = 0u64;
        (table.Free.unwrap())(this, (&mut local as *mut u64).cast());
        assert!(
            last_error().contains("not allocated by accalloc"),
            "{}",
            last_error()
        );
        let info = (table.Info.unwrap())(this);
        let mut name: *const c_char = null();
        check(ort.api, (ort.api.MemoryInfoGetName)(info, &mut name));
        assert_eq!(CStr::from_ptr(name).to_str(), Ok("Cpu"));
    }
    assert_eq!(unsafe { accalloc_ort_allocator_destroy(allocator) }, OK);
    assert_eq!(accalloc_empty_cache_on(vendor), OK);
}
