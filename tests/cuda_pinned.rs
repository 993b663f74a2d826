//! Pinned host memory through the CUDA backend, on the strict model of the CUDA driver (cuda_model/):
//! cuMemHostAlloc and cuMemFreeHost, the model's limit on pinned bytes, its refusals of misuse,
//! injected faults, and its use-after-free check extended to pinned memory that a queued copy still
//! uses. They cannot run without the model, so each is #[ignore]d: scripts/test-all.sh runs them with
//! LD_LIBRARY_PATH=$(scripts/cuda-model.sh) and `-- --include-ignored`; run explicitly without the
//! model, they fail, saying why.

#![cfg(feature = "cuda")]

mod cuda_model_support;
use cuda_model_support::{Model, NEEDS_MODEL};

use accalloc::backend::{Backend, BackendError};
use accalloc_core::pinned::PinnedHostCache;
use cudarc::driver::sys::{self, CUresult};
use std::ffi::c_void;

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

/// Faults and violations are process-wide in the model, and the tests read its pinned bytes: one
/// test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The model, this test's turn, and no fault rules left by a test before.
fn model() -> (Model, std::sync::MutexGuard<'static, ()>) {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = cuda_model_support::model();
    model.set_faults("");
    assert!(
        pinned()[2] >= 16 << 20,
        "the tests want 16M of pinned memory or more (ACCALLOC_CUDA_MODEL_PINNED_CAPACITY; 4G unset)"
    );
    (model, turn)
}

/// The model's pinned host memory: [live allocations, bytes pinned (whole pages), the limit].
fn pinned() -> [u64; 3] {
    // SAFETY: NOLOAD only finds the libcuda already loaded (model() checked it is the model); the
    // symbol has this type (cuda_model/src/host.rs).
    unsafe {
        let mut handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if handle.is_null() {
            handle = libc::dlopen(c"libcuda.so".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        }
        let f = libc::dlsym(handle, c"accallocModelPinnedCounts".as_ptr());
        assert!(
            !f.is_null(),
            "{NEEDS_MODEL}: the model loaded has no accallocModelPinnedCounts (rebuild it)"
        );
        let counts: unsafe extern "C" fn(*mut u64) -> u32 = std::mem::transmute(f);
        let mut out = [0u64; 3];
        assert_eq!(counts(out.as_mut_ptr()), 0);
        out
    }
}

fn htod(model: &Model, device: usize, dst: usize, src: usize, bytes: usize, s: usize) -> CUresult {
    model.make_current(device);
    // SAFETY: the model checks every argument.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst as _, src as *const c_void, bytes, s as _) }
}

fn dtoh(model: &Model, device: usize, dst: usize, src: usize, bytes: usize, s: usize) -> CUresult {
    model.make_current(device);
    // SAFETY: the model checks every argument.
    unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src as _, bytes, s as _) }
}

fn stream_idle(model: &Model, device: usize, s: usize) -> bool {
    model.make_current(device);
    // SAFETY: a stream of the current context's device.
    let rc = unsafe { sys::cuStreamQuery(s as _) };
    assert!(matches!(
        rc,
        CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_NOT_READY
    ));
    rc == CUresult::CUDA_SUCCESS
}

/// A byte slice over pinned memory.
fn bytes<'a>(ptr: usize, len: usize) -> &'a mut [u8] {
    // SAFETY: the callers pass live pinned allocations of at least `len` bytes.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn pinned_host_memory_is_written_read_copied_and_freed_once() {
    let (model, _turn) = model();
    let gpu = &model.backend;
    let before = pinned();
    assert!(gpu.pinned_host_supported());
    let size = MIB + 3;
    let (from, to) = (
        gpu.pinned_host_alloc(size).unwrap(),
        gpu.pinned_host_alloc(size).unwrap(),
    );
    assert!(from.page_locked && from.ptr.is_multiple_of(PAGE));
    let footprint = 2 * (MIB + PAGE) as u64;
    assert_eq!(
        pinned(),
        [before[0] + 2, before[1] + footprint, before[2]],
        "counted in whole pages"
    );
    for (i, byte) in bytes(from.ptr, size).iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    assert_eq!(bytes(from.ptr, size)[MIB + 2], ((MIB + 2) % 251) as u8);
    // Through device memory and back, on a stream.
    let device = gpu.raw_alloc(0, 2 * MIB, 0).unwrap();
    let s = model.stream(0);
    assert_eq!(
        htod(&model, 0, device, from.ptr, size, s),
        CUresult::CUDA_SUCCESS
    );
    assert_eq!(
        dtoh(&model, 0, to.ptr, device, size, s),
        CUresult::CUDA_SUCCESS
    );
    gpu.synchronize_stream(0, s).unwrap();
    assert!(bytes(from.ptr, size) == bytes(to.ptr, size));
    model.destroy_stream(0, s);
    gpu.raw_free(0, device, 2 * MIB).unwrap();
    gpu.pinned_host_free(from.ptr, size).unwrap();
    gpu.pinned_host_free(to.ptr, size).unwrap();
    assert_eq!(pinned(), before, "nothing left pinned");
    match gpu.pinned_host_free(from.ptr, size) {
        Err(BackendError::Failed { code, message }) => {
            assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE as i64);
            assert_eq!(
                message,
                "cuMemFreeHost failed with CUDA_ERROR_INVALID_VALUE"
            );
        }
        other => panic!("a second free must be refused: {other:?}"),
    }
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn the_models_pinned_limit_exhausted_is_out_of_memory() {
    let (model, _turn) = model();
    let gpu = &model.backend;
    let [_, used, limit] = pinned();
    assert!(
        limit - used >= PAGE as u64,
        "the model has no pinned memory left (ACCALLOC_CUDA_MODEL_PINNED_CAPACITY={limit})"
    );
    let rest = (limit - used) as usize;
    // The whole limit (address space only: pages are not touched, so nothing is committed).
    let all = gpu.pinned_host_alloc(rest).unwrap();
    assert_eq!(gpu.pinned_host_alloc(1), Err(BackendError::OutOfMemory));
    gpu.pinned_host_free(all.ptr, rest).unwrap();
    let one = gpu.pinned_host_alloc(1).unwrap();
    gpu.pinned_host_free(one.ptr, 1).unwrap();
    assert_eq!(
        gpu.pinned_host_alloc(limit as usize + 1),
        Err(BackendError::OutOfMemory),
        "more than the limit at once"
    );
    assert_eq!(pinned()[1], used);
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn failing_pinned_host_calls_leave_nothing_pinned() {
    let (model, _turn) = model();
    let gpu = &model.backend;
    let before = pinned();
    model.set_faults("cuMemHostAlloc:every=2");
    let results: Vec<_> = (0..6).map(|_| gpu.pinned_host_alloc(PAGE)).collect();
    model.set_faults("");
    let held: Vec<usize> = results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|a| a.ptr)
        .collect();
    assert_eq!(held.len(), 3);
    assert!(results
        .iter()
        .all(|r| r.is_ok() || r == &Err(BackendError::OutOfMemory)));
    model.set_faults("cuMemFreeHost:after=0");
    let refused = gpu.pinned_host_free(held[0], PAGE).unwrap_err();
    model.set_faults("");
    assert_eq!(
        refused,
        BackendError::Failed {
            code: CUresult::CUDA_ERROR_UNKNOWN as i64,
            message: "cuMemFreeHost failed with CUDA_ERROR_UNKNOWN".into()
        }
    );
    for ptr in held {
        gpu.pinned_host_free(ptr, PAGE).unwrap();
    }
    assert_eq!(pinned(), before, "a refused free is retried");
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn the_model_refuses_misuse_of_pinned_host_memory() {
    let (model, _turn) = model();
    let gpu = &model.backend;
    let before = pinned();
    let portable = sys::CU_MEMHOSTALLOC_PORTABLE;
    let invalid = CUresult::CUDA_ERROR_INVALID_VALUE;
    let mut p: *mut c_void = std::ptr::null_mut();
    model.make_current(0);
    // SAFETY: the model checks every argument; these are refused before anything is written.
    unsafe {
        assert_eq!(
            sys::cuMemHostAlloc(std::ptr::null_mut(), PAGE, portable),
            invalid
        );
        assert_eq!(sys::cuMemHostAlloc(&mut p, 0, portable), invalid, "size 0");
        assert_eq!(
            sys::cuMemHostAlloc(&mut p, PAGE, 8),
            invalid,
            "a flag unknown"
        );
    }
    let a = gpu.pinned_host_alloc(2 * PAGE).unwrap();
    let device = gpu.raw_alloc(0, MIB, 0).unwrap();
    // A thread without a current context.
    let ptr = a.ptr;
    std::thread::spawn(move || {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: as above; no context is current on this new thread.
        unsafe {
            let none = CUresult::CUDA_ERROR_INVALID_CONTEXT;
            assert_eq!(sys::cuMemHostAlloc(&mut p, PAGE, portable), none);
            assert_eq!(sys::cuMemFreeHost(ptr as *mut c_void), none);
        }
    })
    .join()
    .unwrap();
    let heap = Box::new([0u8; 64]);
    model.make_current(0);
    // SAFETY: each pointer is refused by the model, nothing is freed.
    unsafe {
        assert_eq!(
            sys::cuMemFreeHost((a.ptr + 8) as *mut c_void),
            invalid,
            "inside"
        );
        assert_eq!(
            sys::cuMemFreeHost(device as *mut c_void),
            invalid,
            "device memory"
        );
        assert_eq!(
            sys::cuMemFreeHost(heap.as_ptr() as *mut c_void),
            invalid,
            "malloc's"
        );
        assert_eq!(
            sys::cuMemFree_v2(a.ptr as _),
            invalid,
            "pinned host memory to cuMemFree"
        );
    }
    // Copies: a device pointer as the host side, past the pinned allocation's end, host memory as
    // the device side.
    assert_eq!(htod(&model, 0, device, device, 64, 0), invalid);
    assert_eq!(dtoh(&model, 0, device, device, 64, 0), invalid);
    assert_eq!(htod(&model, 0, device, a.ptr, 2 * PAGE + 1, 0), invalid);
    assert_eq!(htod(&model, 0, a.ptr, a.ptr, 64, 0), invalid);
    assert_eq!(
        htod(&model, 0, device, a.ptr, 2 * PAGE, 0),
        CUresult::CUDA_SUCCESS
    );
    gpu.synchronize_stream(0, 0).unwrap();
    gpu.pinned_host_free(a.ptr, 2 * PAGE).unwrap();
    assert_eq!(htod(&model, 0, device, a.ptr, 64, 0), invalid, "freed");
    gpu.raw_free(0, device, MIB).unwrap();
    assert_eq!(pinned(), before);
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn freeing_pinned_memory_a_queued_copy_still_uses_is_a_use_after_free() {
    let (model, _turn) = model();
    let gpu = &model.backend;
    assert!(
        gpu.device_count() >= 2,
        "wants a second model device (ACCALLOC_CUDA_MODEL_DEVICES=2 or more; scripts/test-all.sh gives 8)"
    );
    let before = pinned();
    let (s0, s1) = (model.stream(0), model.stream(1));
    let (d0, d1) = (
        gpu.raw_alloc(0, 2 * MIB, 0).unwrap(),
        gpu.raw_alloc(1, 2 * MIB, 0).unwrap(),
    );
    // All allocated first: one handed out where a queued copy still reads would be a violation too.
    let (a, b, c) = (
        gpu.pinned_host_alloc(MIB).unwrap(),
        gpu.pinned_host_alloc(MIB).unwrap(),
        gpu.pinned_host_alloc(MIB).unwrap(),
    );
    model.abort_on_violation(false);
    let violations = model.violations().0;
    // A copy from pinned memory queued behind work on stream 0, freed before the stream gets there.
    assert_eq!(model.launch(0, s0, 300_000, d0, MIB), 0);
    assert_eq!(
        htod(&model, 0, d0 + MIB, a.ptr, MIB, s0),
        CUresult::CUDA_SUCCESS
    );
    assert!(
        !stream_idle(&model, 0, s0),
        "the copy waits behind the launch"
    );
    gpu.pinned_host_free(a.ptr, MIB).unwrap();
    let (after_htod, message) = model.violations();
    // Into pinned memory, on device 1's stream: the backend's memory is portable, pinned there too.
    assert_eq!(model.launch(1, s1, 300_000, d1, MIB), 0);
    assert_eq!(
        dtoh(&model, 1, b.ptr, d1 + MIB, MIB, s1),
        CUresult::CUDA_SUCCESS
    );
    gpu.pinned_host_free(b.ptr, MIB).unwrap();
    let after_dtoh = model.violations().0;
    // Once the stream's work is done, freeing is fine.
    assert_eq!(htod(&model, 0, d0, c.ptr, MIB, s0), CUresult::CUDA_SUCCESS);
    gpu.synchronize_stream(0, s0).unwrap();
    gpu.pinned_host_free(c.ptr, MIB).unwrap();
    let after_synchronized = model.violations().0;
    model.destroy_stream(0, s0);
    model.destroy_stream(1, s1);
    model.abort_on_violation(true);
    gpu.raw_free(0, d0, 2 * MIB).unwrap();
    gpu.raw_free(1, d1, 2 * MIB).unwrap();
    assert_eq!(
        after_htod,
        violations + 1,
        "the model caught the copy's source freed"
    );
    assert!(
        message.contains("cuMemFreeHost freed pinned host memory")
            && message.contains("use after free"),
        "{message}"
    );
    assert_eq!(
        after_dtoh,
        after_htod + 1,
        "and the copy's destination freed"
    );
    assert_eq!(
        after_synchronized, after_dtoh,
        "a free after the work is no violation"
    );
    assert_eq!(pinned(), before);
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn memory_pinned_without_portable_is_pageable_to_other_devices() {
    let (model, _turn) = model();
    let gpu = &model.backend;
    assert!(
        gpu.device_count() >= 2,
        "wants a second model device (ACCALLOC_CUDA_MODEL_DEVICES=2 or more; scripts/test-all.sh gives 8)"
    );
    let s1 = model.stream(1);
    let d1 = gpu.raw_alloc(1, 2 * MIB, 0).unwrap();
    let mut own: *mut c_void = std::ptr::null_mut();
    model.make_current(0);
    // SAFETY: a valid out-pointer, device 0's context current.
    assert_eq!(
        unsafe { sys::cuMemHostAlloc(&mut own, MIB, 0) },
        CUresult::CUDA_SUCCESS
    );
    bytes(own as usize, MIB).fill(7);
    // To device 1 it is pageable: the copy waits for the stream and is made before the call returns.
    assert_eq!(model.launch(1, s1, 100_000, d1, MIB), 0);
    assert_eq!(
        htod(&model, 1, d1 + MIB, own as usize, MIB, s1),
        CUresult::CUDA_SUCCESS
    );
    assert!(stream_idle(&model, 1, s1), "a pageable copy is synchronous");
    assert!(bytes(d1 + MIB, MIB).iter().all(|&b| b == 7));
    model.make_current(0);
    // SAFETY: what cuMemHostAlloc returned, freed once.
    assert_eq!(unsafe { sys::cuMemFreeHost(own) }, CUresult::CUDA_SUCCESS);
    // The backend's memory is portable: the same copy is queued on device 1's stream.
    let a = gpu.pinned_host_alloc(MIB).unwrap();
    assert_eq!(model.launch(1, s1, 300_000, d1, MIB), 0);
    assert_eq!(
        htod(&model, 1, d1 + MIB, a.ptr, MIB, s1),
        CUresult::CUDA_SUCCESS
    );
    assert!(
        !stream_idle(&model, 1, s1),
        "a copy from portable pinned memory is asynchronous"
    );
    model.destroy_stream(1, s1);
    gpu.pinned_host_free(a.ptr, MIB).unwrap();
    gpu.raw_free(1, d1, 2 * MIB).unwrap();
}

/// How long the work that holds a stream back lasts: far longer than the few calls the tests make
/// while it runs. The model has no gate a test opens (its streams are held only by
/// accallocModelLaunch's timed work, or by waits on events behind it), so each test also checks,
/// after its last step that needs the stream busy, that it still was: too slow a machine fails the
/// test rather than passing it by chance.
const HOLD_MICROS: u64 = 500_000;

/// What `reuse_while_a_copy_is_pending` saw.
#[derive(Debug)]
struct Reuse {
    /// The block the copy reads, and the one the cache handed out next while the copy was pending.
    first: usize,
    second: usize,
    /// The stream the copy waits on.
    held: usize,
    /// The copy's stream was still busy after the reuse's last step.
    held_throughout: bool,
    /// Violations the model counted during the sequence, and the last one's message.
    violations: u64,
    message: String,
    /// The held-back copy delivered the first block's bytes as written before it was queued.
    copy_delivered_original: bool,
    /// What the copy delivered instead (the first byte), where it did not.
    delivered: u8,
    /// The block allocated once the streams were done.
    after_streams_done: usize,
    num_host_alloc: i64,
}

/// The bytes written into the first block before its copy is queued, into the block handed out
/// next by the test's own hand, and into that block by a copy from device memory.
const ORIGINAL: u8 = 1;
const OVERWRITTEN: u8 = 2;
const FROM_DEVICE: u8 = 3;

/// The sequence of issue 31's requirement, on `device` of the model, through a PinnedHostCache over
/// the CUDA backend: a pinned block is copied from on a stream held back by earlier work, its use
/// by that stream recorded (`record`) or not, the block freed and a block of the same size
/// allocated at once; that block is written by the test and by a copy from device memory queued on
/// a second stream. Then the streams finish and a third allocation is made.
fn reuse_while_a_copy_is_pending(model: &Model, device: usize, record: bool) -> Reuse {
    let gpu = &model.backend;
    let before = (pinned(), model.counts());
    let (held, other) = (model.stream(device), model.stream(device));
    // [0, 1M): the holding work; [1M, 2M): the held-back copy's destination; [2M, 3M): the source
    // of the copy into the block handed out next.
    let d = gpu.raw_alloc(device, 4 * MIB, 0).unwrap();
    bytes(d + 2 * MIB, MIB).fill(FROM_DEVICE);
    let mut cache = PinnedHostCache::new(gpu.clone()).unwrap();
    model.abort_on_violation(false);
    let violations = model.violations().0;

    let first = cache.allocate(MIB).unwrap();
    bytes(first, MIB).fill(ORIGINAL);
    assert_eq!(model.launch(device, held, HOLD_MICROS, d, MIB), 0);
    assert_eq!(
        htod(model, device, d + MIB, first, MIB, held),
        CUresult::CUDA_SUCCESS
    );
    if record {
        assert!(cache.record_stream(first, device, held).unwrap());
    }
    cache.free(first).unwrap();
    let second = cache.allocate(MIB).unwrap();
    // The reuse: the caller writes what it was handed, and a copy from the device into it is
    // queued on the other stream and made.
    bytes(second, MIB).fill(OVERWRITTEN);
    assert_eq!(
        dtoh(model, device, second, d + 2 * MIB, MIB, other),
        CUresult::CUDA_SUCCESS
    );
    gpu.synchronize_stream(device, other).unwrap();
    let held_throughout = !stream_idle(model, device, held);
    let (during, message) = model.violations();

    gpu.synchronize_stream(device, held).unwrap();
    let delivered = bytes(d + MIB, MIB);
    let copy_delivered_original = delivered.iter().all(|&b| b == ORIGINAL);
    let delivered = delivered[0];
    assert!(
        bytes(second, MIB).iter().all(|&b| b == FROM_DEVICE),
        "the copy into the block handed out next was made"
    );
    let (after_streams_done, num_host_alloc) = if first == second {
        (first, cache.stats().num_host_alloc)
    } else {
        let third = cache.allocate(MIB).unwrap();
        cache.check_invariants().unwrap();
        cache.free(third).unwrap();
        (third, cache.stats().num_host_alloc)
    };
    cache.free(second).unwrap();
    cache.check_invariants().unwrap();
    cache.empty_cache().unwrap();
    let after = model.violations().0;
    model.abort_on_violation(true);
    drop(cache);
    model.destroy_stream(device, held);
    model.destroy_stream(device, other);
    gpu.raw_free(device, d, 4 * MIB).unwrap();
    assert_eq!(
        (pinned(), model.counts()),
        before,
        "nothing left pinned, no event or stream left in the driver"
    );
    assert_eq!(after, during, "nothing after the streams were done");
    Reuse {
        first,
        second,
        held,
        held_throughout,
        violations: during - violations,
        message,
        copy_delivered_original,
        delivered,
        after_streams_done,
        num_host_alloc,
    }
}

fn wants_two_devices(model: &Model) {
    assert!(
        model.backend.device_count() >= 2,
        "wants a second model device (ACCALLOC_CUDA_MODEL_DEVICES=2 or more; scripts/test-all.sh gives 8)"
    );
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn the_cache_holds_a_recorded_block_back_until_the_streams_copy_is_done() {
    let (model, _turn) = model();
    wants_two_devices(&model);
    // Device 0's stream, and device 1's: the pinned memory is allocated in device 0's context, the
    // event recorded at the free in the stream's.
    for device in [0, 1] {
        let seen = reuse_while_a_copy_is_pending(&model, device, true);
        assert!(
            seen.held_throughout,
            "device {device}: the stream finished before the reuse was done (a machine too slow \
             for {HOLD_MICROS}us of held-back work): {seen:?}"
        );
        assert_ne!(
            seen.second, seen.first,
            "device {device}: a block whose copy is pending is not handed out again"
        );
        assert_eq!(
            seen.violations, 0,
            "device {device}: the model saw no block reused under its copy: {}",
            seen.message
        );
        assert!(
            seen.copy_delivered_original,
            "device {device}: the copy read the bytes written before it was queued"
        );
        assert_eq!(
            seen.after_streams_done, seen.first,
            "device {device}: once the stream's event completed, the first block is reused"
        );
        assert_eq!(seen.num_host_alloc, 2, "device {device}: two blocks only");
    }
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn without_record_stream_the_cache_reuses_the_block_at_once_and_the_model_catches_it() {
    let (model, _turn) = model();
    wants_two_devices(&model);
    for device in [0, 1] {
        let seen = reuse_while_a_copy_is_pending(&model, device, false);
        assert!(
            seen.held_throughout,
            "device {device}: the stream finished before the reuse was done (a machine too slow \
             for {HOLD_MICROS}us of held-back work): {seen:?}"
        );
        assert_eq!(
            seen.second, seen.first,
            "device {device}: unrecorded, the block is free at once and handed out again"
        );
        assert_eq!(
            seen.violations, 1,
            "device {device}: the model caught the copy into the block its pending copy reads"
        );
        assert!(
            seen.message.contains("a copy used pinned host memory")
                && seen.message.contains(&format!(
                    "device {device} while work on stream {:#x}",
                    seen.held
                ))
                && seen.message.contains("use after free"),
            "{}",
            seen.message
        );
        assert!(
            !seen.copy_delivered_original,
            "device {device}: the pending copy read what the reuse wrote"
        );
        assert_eq!(seen.delivered, FROM_DEVICE, "device {device}");
        assert_eq!(seen.num_host_alloc, 1, "device {device}: one block only");
    }
}
