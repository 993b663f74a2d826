//! Driver-level faults on the CUDA backend, on the strict model of the driver (cuda_model/): every
//! call kind the backend makes fails now and then while a workload runs (default and expandable
//! segments, events pending on a second stream), and afterwards the books are exact, everything can
//! be freed, and the driver holds nothing: no memory, event, physical allocation or reservation.
//! A sticky error poisons a device: accalloc reports it and keeps its books. The faults that hit
//! detection are in crates/tools/tests/cuda_model.rs. The tests cannot run without the model, so they are
//! #[ignore]d: scripts/test-all.sh runs them with LD_LIBRARY_PATH=$(scripts/cuda-model.sh) and
//! `-- --include-ignored`; run explicitly without the model, they fail, saying why.

#![cfg(feature = "cuda")]

mod cuda_model_support;
use cuda_model_support::Model;

use accalloc::backend::cuda::REQUIRED_SYMBOLS;
use accalloc::backend::Backend;
use accalloc::caching::pools::Route;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::{CachingAllocator, CachingConfig, StatType};
use accalloc::error::ErrorKind;

const ALL: usize = StatType::All as usize;
/// The workload's sleepable pool.
const SLEEPER: (u64, u64) = (0, 9);
const MIB: usize = 1 << 20;
/// More than any model device holds (the model allows at most 1 TiB).
const CAPACITY_PAST_ANY_MODEL_DEVICE: usize = (1 << 40) + 1;

/// The driver calls detection makes (crates/tools/tests/cuda_model.rs fails them at start-up): the others are
/// the calls the backend makes while it works.
const AT_DETECTION: [&str; 5] = [
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuMemGetAllocationGranularity",
];

/// The pinned host memory calls, which the caching allocator never makes: tests/cuda_pinned.rs
/// fails them.
const PINNED_HOST: [&str; 2] = ["cuMemHostAlloc", "cuMemFreeHost"];

/// Faults are process-wide in the model: one test at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The model, this test's turn, and no fault rules left by a test before.
fn model() -> (Model, std::sync::MutexGuard<'static, ()>) {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = cuda_model_support::model();
    model.set_faults("");
    (model, turn)
}

/// A workload under the current fault rules: allocations of every size class on two streams, some
/// used by work on the second stream and recorded there, frees, cache releases, and the books
/// recounted after every step. What is still allocated at the end (frees refused by a fault stay
/// allocated, to be freed again).
fn workload(model: &Model, a: &mut CachingAllocator, device: usize, side: usize) -> Vec<usize> {
    let sizes = [500, 3 * MIB, 25 * MIB, 1024, 12 * MIB, 2 * MIB + 5];
    let mut held = Vec::new();
    // A sleepable pool (its pages always from the virtual-memory calls) takes every fifth
    // allocation, and pauses with a backup and resumes now and then: each call kind of sleep fails
    // under the faults too, and every page must end paused or running with the books exact.
    a.create_pool(SLEEPER, false, false).unwrap();
    a.make_pool_sleepable(SLEEPER).unwrap();
    for i in 0..48 {
        let size = sizes[i % sizes.len()];
        let in_pool = i % 5 == 2;
        if in_pool {
            a.begin_allocate_to_pool(SLEEPER, Route::Thread(std::thread::current().id()))
                .unwrap();
        }
        let result = a.malloc(size, if i % 4 == 1 { side } else { 0 });
        if in_pool {
            a.end_allocate_to_pool(SLEEPER).unwrap();
            a.release_pool(SLEEPER).unwrap();
        }
        if i % 8 == 7 {
            sleep_and_wake(a);
        }
        match result {
            Ok(p) => {
                if i % 3 == 0 {
                    // A launch refused by a poisoned context is the caller's business, not ours.
                    let _ = model.launch(device, side, 2_000, p, size);
                    let _ = a.record_stream(p, side);
                }
                held.push(p);
            }
            // The sleeping pool stays paused when a resume was refused: it refuses allocations.
            Err(e) => assert!(
                matches!(e.kind, ErrorKind::OutOfMemory | ErrorKind::Backend)
                    || (in_pool && e.message.contains("paused")),
                "{e:?}"
            ),
        }
        if i % 2 == 1 && !held.is_empty() {
            let p = held.remove(0);
            if a.free(p).is_err() {
                held.push(p);
            }
        }
        if i % 12 == 11 {
            let _ = a.empty_cache();
            // What a user asks now and then: the device's memory, a request that cannot fit
            // (its message reads the device's free memory), a wait for a stream.
            let _ = a.mem_get_info();
            assert!(a.malloc(CAPACITY_PAST_ANY_MODEL_DEVICE, 0).is_err());
            let _ = model.backend.synchronize_stream(device, side);
        }
        a.check_invariants().unwrap();
    }
    // Everything is given back under the same faults: a refused free is retried, and so is the
    // release of the cache; the sleeping pool wakes first (a refused resume is retried), then its
    // creation's use goes, so that empty_cache may give its pages back.
    for _ in 0..4 {
        if a.pool_paused_bytes(SLEEPER).unwrap_or(0) > 0 {
            let _ = a.resume_pool(SLEEPER);
            a.check_invariants().unwrap();
        }
    }
    a.release_pool(SLEEPER).unwrap();
    for _ in 0..4 {
        held.retain(|&p| a.free(p).is_err());
        let _ = a.empty_cache();
        a.check_invariants().unwrap();
    }
    held
}

/// Pause with a backup and resume the sleeping pool, each refused now and then by the faults;
/// the books are recounted after each.
fn sleep_and_wake(a: &mut CachingAllocator) {
    for result in [a.pause_pool(SLEEPER, true), a.resume_pool(SLEEPER)] {
        if let Err(e) = result {
            assert!(
                matches!(e.kind, ErrorKind::OutOfMemory | ErrorKind::Backend),
                "{e:?}"
            );
        }
        a.check_invariants().unwrap();
    }
}

/// Whether the workload under `config` makes `call` at all: segments come from cuMemAlloc, or
/// from the virtual-memory calls with expandable segments (the sleeping pool's always do).
fn makes(call: &str, config: &str) -> bool {
    let expandable = !config.is_empty();
    match call {
        "cuMemAlloc_v2" | "cuMemFree_v2" => !expandable,
        _ => true,
    }
}

fn settle(model: &Model, a: &mut CachingAllocator, held: Vec<usize>, what: &str) {
    for p in held {
        a.free(p)
            .unwrap_or_else(|e| panic!("{what}: the retried free failed: {e:?}"));
    }
    a.empty_cache()
        .unwrap_or_else(|e| panic!("{what}: empty_cache: {e:?}"));
    let s = a.stats();
    assert_eq!(
        (
            s.allocated_bytes[ALL].current,
            s.reserved_bytes[ALL].current
        ),
        (0, 0),
        "{what}"
    );
    a.check_invariants().unwrap();
    let _ = model;
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn every_call_kind_failing_leaves_exact_books_and_nothing_in_the_driver() {
    let (model, _turn) = model();
    let device = 0;
    let side = model.stream(device);
    let before = model.counts();
    let mut never = Vec::new();
    let calls = REQUIRED_SYMBOLS
        .iter()
        .filter(|c| !AT_DETECTION.contains(c) && !PINNED_HOST.contains(c));
    for &call in calls {
        for rule in ["every=3", "after=0", "after=2"] {
            for config in ["", "expandable_segments:True"] {
                let what = format!("{call}:{rule} {config}");
                let expected = makes(call, config);
                let config = parse_settings(config, &CachingConfig::default()).unwrap();
                let mut a = CachingAllocator::new(model.backend.clone(), device, config).unwrap();
                model.set_faults(&format!("{call}:{rule}"));
                let held = workload(&model, &mut a, device, side);
                let fired = model.faults_fired();
                model.set_faults("");
                print!("{what}: {fired} failed; ");
                if fired == 0 && expected {
                    never.push(what.clone());
                }
                settle(&model, &mut a, held, &what);
                assert_eq!(
                    model.free_bytes(device),
                    model.capacity(device),
                    "{what}: the driver still holds memory"
                );
                assert_eq!(
                    model.counts(),
                    before,
                    "{what}: the driver still holds objects"
                );
            }
        }
    }
    model.destroy_stream(device, side);
    println!();
    assert!(
        never.is_empty(),
        "the workload never made these calls fail: {never:?}"
    );
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn a_sticky_error_poisons_the_device_and_the_books_stay_exact() {
    let (model, _turn) = model();
    // The poisoned device stays poisoned for the process (accalloc never releases a primary
    // context), so this test takes the last device.
    let device = model.backend.device_count() - 1;
    assert!(
        device > 0,
        "wants a second model device (ACCALLOC_CUDA_MODEL_DEVICES=2 or more; scripts/test-all.sh gives 8)"
    );
    let mut a =
        CachingAllocator::new(model.backend.clone(), device, CachingConfig::default()).unwrap();
    let p = a.malloc(3 * MIB, 0).unwrap();
    let q = a.malloc(1000, 0).unwrap();
    let held = a.stats();
    model.set_faults("cuMemAlloc_v2:after=0:sticky");
    let e = a.malloc(30 * MIB, 0).unwrap_err();
    model.set_faults("");
    assert_eq!(e.kind, ErrorKind::Backend, "{e:?}");
    assert!(
        e.message.contains("CUDA_ERROR_LAUNCH_FAILED"),
        "{}",
        e.message
    );
    // Every later call on the device gets the same error: a new segment, a cache release.
    let e = a.malloc(30 * MIB, 0).unwrap_err();
    assert!(
        e.message.contains("CUDA_ERROR_LAUNCH_FAILED"),
        "{}",
        e.message
    );
    assert!(model.backend.mem_get_info(device).is_err());
    a.free(p).unwrap();
    a.free(q).unwrap();
    assert!(
        a.empty_cache().is_err(),
        "cuMemFree fails on a poisoned context"
    );
    let s = a.stats();
    assert_eq!(s.allocated_bytes[ALL].current, 0);
    assert_eq!(
        s.reserved_bytes[ALL].current, held.reserved_bytes[ALL].current,
        "the segments stay on the books while the driver cannot take them back"
    );
    a.check_invariants().unwrap();
    // Other devices are untouched.
    let other = CachingAllocator::new(model.backend.clone(), 0, CachingConfig::default());
    let mut other = other.unwrap();
    let r = other.malloc(1000, 0).unwrap();
    other.free(r).unwrap();
    other.empty_cache().unwrap();
}
