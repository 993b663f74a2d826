//! The production CUDA backend on the strict model of the CUDA driver (cuda_model/): the sample
//! traces give the host backend's statistics, expandable segments go through the VMM calls, threads
//! work across eight devices, and record_stream keeps a block from reuse while another stream's
//! asynchronous work still uses it, which the model's own use-after-free check proves both ways.
//! They cannot run without the model, so each is #[ignore]d: scripts/test-all.sh runs them with
//! LD_LIBRARY_PATH=$(scripts/cuda-model.sh), ACCALLOC_CUDA_MODEL_DEVICES=8 and
//! `-- --include-ignored`; run explicitly without the model, they fail, saying why.

#![cfg(feature = "cuda")]

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/cuda_model_support/mod.rs"]
mod cuda_model_support;
use cuda_model_support::Model;

use accalloc::backend::Backend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::{CachingAllocator, CachingConfig, StatType};
use accalloc::capi::device::accalloc_set_device_on;
use accalloc::capi::memory::{
    accalloc_empty_cache_on, accalloc_free, accalloc_malloc_on, accalloc_record_stream,
};
use accalloc::capi::{AccallocStatus, ACCALLOC_DEVICE_CUDA};
use std::ffi::c_void;
use std::process::Command;

const ALL: usize = StatType::All as usize;
const MIB: usize = 1 << 20;

/// The tests read whole devices' figures (the model's free memory), so they run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn model() -> (Model, std::sync::MutexGuard<'static, ()>) {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    (cuda_model_support::model(), turn)
}

/// model(), for the tests that take a device each of eight (scripts/test-all.sh gives eight).
fn model_of_eight_devices() -> (Model, std::sync::MutexGuard<'static, ()>) {
    let (model, turn) = model();
    let devices = model.backend.device_count();
    assert!(
        devices >= 8,
        "run with ACCALLOC_CUDA_MODEL_DEVICES=8 (the model has {devices})"
    );
    (model, turn)
}

fn replay(trace: &str, cuda: bool, config: &str) -> serde_json::Value {
    let mut command = Command::new(env!("CARGO_BIN_EXE_accalloc"));
    command
        .args(["replay", trace, "--json"])
        .env("ACCALLOC_HOST_CAPACITY", "16GiB");
    if cuda {
        command.arg("--cuda");
    }
    if !config.is_empty() {
        command.args(["--config", config]);
    }
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{trace} {config}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn every_sample_trace_gives_the_host_backends_statistics() {
    let (model, _turn) = model();
    assert!(
        model.capacity(0) >= 16 << 30,
        "the traces want a 16 GiB model device"
    );
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/traces");
    let mut traces: Vec<String> = Vec::new();
    for folder in [dir.to_string(), format!("{dir}/real")] {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "jsonl") {
                traces.push(path.to_string_lossy().into_owned());
            }
        }
    }
    traces.sort();
    // 3 generated traces and 12 real ones (6 with shapes changing between steps, 5 fixed, 1 in
    // three bucketed shapes).
    assert_eq!(traces.len(), 15, "{traces:?}");
    for trace in &traces {
        // planned_placement too: its plans, alloc_at and the pages it maps and unmaps go through
        // the VMM calls.
        for config in ["", "expandable_segments:True", "planned_placement:True"] {
            let (host, cuda) = std::thread::scope(|s| {
                let host = s.spawn(|| replay(trace, false, config));
                (host.join().unwrap(), replay(trace, true, config))
            });
            let stats = host["stats"].as_object().unwrap();
            assert_eq!(stats.len(), 122, "PyTorch's 122 statistics");
            assert_eq!(
                host["stats"], cuda["stats"],
                "{trace} {config}: the model's figures differ"
            );
            for key in [
                "device_allocs",
                "device_frees",
                "ooms",
                "peak_reserved_bytes",
            ] {
                assert_eq!(host[key], cuda[key], "{trace} {config}: {key}");
            }
        }
    }
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn expandable_segments_go_through_the_vmm_calls() {
    let (model, _turn) = model();
    let device = 1;
    assert_eq!(model.backend.vm_granularity(device), Some(2 * MIB));
    let before = (model.free_bytes(device), model.counts());
    let config = parse_settings("expandable_segments:True", &CachingConfig::default()).unwrap();
    let mut a = CachingAllocator::new(model.backend.clone(), device, config).unwrap();
    let p = a.malloc(5 * MIB, 0).unwrap();
    let q = a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(q, p + 5 * MIB, "the segment grew in place");
    assert_eq!(a.stats().reserved_bytes[ALL].current, 40 << 20);
    let counts = model.counts();
    assert!(
        counts.handles > before.1.handles,
        "cuMemCreate made the memory: {counts:?}"
    );
    assert!(
        counts.reservations > before.1.reservations,
        "cuMemAddressReserve: {counts:?}"
    );
    assert_eq!(counts.allocations, before.1.allocations, "no cuMemAlloc");
    assert!(
        before.0 - model.free_bytes(device) >= 40 * MIB,
        "the model counts the mapped memory"
    );
    // The model keeps mapped memory PROT_NONE until cuMemSetAccess: a launch over it succeeds only
    // because the backend granted access.
    let stream = model.stream(device);
    assert_eq!(model.launch(device, stream, 10, q, 30 * MIB), 0);
    a.record_stream(q, stream).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    model.destroy_stream(device, stream);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    assert_eq!(
        (model.free_bytes(device), model.counts()),
        before,
        "unmapped, released, freed"
    );
}

fn malloc_on(device: usize, size: usize, stream: usize) -> usize {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let status = unsafe {
        accalloc_malloc_on(
            ACCALLOC_DEVICE_CUDA,
            &mut p,
            size,
            device as i32,
            stream as *mut c_void,
        )
    };
    assert_eq!(
        status,
        AccallocStatus::ACCALLOC_OK,
        "{}",
        common::last_error()
    );
    p as usize
}

fn free(p: usize) {
    // SAFETY: p came from accalloc_malloc_on.
    assert_eq!(
        unsafe { accalloc_free(p as *mut c_void) },
        AccallocStatus::ACCALLOC_OK
    );
}

fn allocated(device: usize) -> i64 {
    let mut out = 0;
    // SAFETY: a valid out-pointer.
    let status = unsafe {
        accalloc::capi::stats::accalloc_memory_allocated_on(
            ACCALLOC_DEVICE_CUDA,
            device as i32,
            &mut out,
        )
    };
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    out
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn threads_across_eight_devices_some_never_setting_a_context() {
    let (model, _turn) = model_of_eight_devices();
    let capacity: Vec<usize> = (0..8).map(|d| model.capacity(d)).collect();
    let workers: Vec<_> = (0..16)
        .map(|t| {
            std::thread::spawn(move || {
                let device = t % 8;
                // Half the threads choose their device through accalloc; the other half never
                // touch a CUDA context and name the device per call. No thread sets a context.
                if t < 8 {
                    assert_eq!(
                        accalloc_set_device_on(ACCALLOC_DEVICE_CUDA, device as i32),
                        AccallocStatus::ACCALLOC_OK
                    );
                }
                let mut held = Vec::new();
                let mut state = t as u64 * 7919 + 1;
                for round in 0..400 {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let size = 1 + (state >> 33) as usize % (24 << 20);
                    held.push(malloc_on(device, size, 0));
                    if round % 3 != 0 {
                        free(held.swap_remove((state >> 20) as usize % held.len()));
                    }
                }
                held.into_iter().for_each(free);
            })
        })
        .collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    // A thread whose current context is another device's still allocates where it asks.
    model.make_current(0);
    let p = malloc_on(5, 40 * MIB, 0);
    assert!(
        model.free_bytes(5) <= capacity[5] - 40 * MIB,
        "the segment is device 5's"
    );
    free(p);
    for device in 0..8 {
        assert_eq!(allocated(device), 0, "device {device}");
    }
    assert_eq!(
        accalloc_empty_cache_on(ACCALLOC_DEVICE_CUDA),
        AccallocStatus::ACCALLOC_OK
    );
    let free: Vec<usize> = (0..8).map(|d| model.free_bytes(d)).collect();
    assert_eq!(free, capacity, "every segment went back to the driver");
}

/// A block of `device` allocated on stream A and used by a long launch on stream B, then freed:
/// whether the next allocation on A gets it while the launch still runs.
/// The block, the next allocation on A, and streams A and B.
fn reuse_while_another_stream_works(
    model: &Model,
    device: usize,
    record: bool,
) -> (usize, usize, usize, usize) {
    let (a, b) = (model.stream(device), model.stream(device));
    let p = malloc_on(device, MIB, a);
    assert_eq!(
        model.launch(device, b, 300_000, p, MIB),
        0,
        "300 ms of work on stream B"
    );
    if record {
        // SAFETY: p is live.
        assert_eq!(
            unsafe { accalloc_record_stream(p as *mut c_void, b as *mut c_void) },
            AccallocStatus::ACCALLOC_OK
        );
    }
    free(p);
    let q = malloc_on(device, MIB, a);
    assert_eq!(model.launch(device, a, 10, q, MIB), 0);
    free(q);
    (p, q, a, b)
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn record_stream_keeps_a_block_until_the_other_streams_work_has_ended() {
    let (model, _turn) = model_of_eight_devices();
    let device = 6;
    let violations = model.violations().0;
    let (p, q, a, b) = reuse_while_another_stream_works(&model, device, true);
    assert_ne!(p, q, "the block waited for stream B's work");
    assert_eq!(
        model.violations().0,
        violations,
        "the model saw no reuse of memory in use"
    );
    // Once the work is done the block comes back (the next allocation finds its event complete).
    std::thread::sleep(std::time::Duration::from_millis(400));
    let back = malloc_on(device, MIB, a);
    assert_eq!(
        back, p,
        "the block is free again once stream B's work ended"
    );
    assert_eq!(model.launch(device, a, 10, back, MIB), 0);
    free(back);
    assert_eq!(allocated(device), 0);
    model.destroy_stream(device, a);
    model.destroy_stream(device, b);
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn without_record_stream_the_models_use_after_free_check_fires() {
    let (model, _turn) = model_of_eight_devices();
    let device = 7;
    model.abort_on_violation(false);
    let violations = model.violations().0;
    let (p, q, a, b) = reuse_while_another_stream_works(&model, device, false);
    let (count, message) = model.violations();
    // Stream B's work ends before the cached segment could go back to the driver under it.
    model.destroy_stream(device, a);
    model.destroy_stream(device, b);
    model.abort_on_violation(true);
    assert_eq!(
        p, q,
        "without record_stream the block is handed out again at once"
    );
    assert_eq!(count, violations + 1, "the model caught it");
    assert!(message.contains("use after free"), "{message}");
}

fn info(env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_accalloc"));
    command.arg("info").env_remove("ACCALLOC_DEVICE");
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn accalloc_info_lists_the_models_devices() {
    let (model, _turn) = model();
    let (ok, out, err) = info(&[]);
    assert!(ok, "{err}");
    let devices = model.backend.device_count();
    assert!(out.contains("accelerator: cuda"), "{out}");
    assert!(out.contains(&format!("devices: {devices}")), "{out}");
    assert!(out.contains("capacity 16.00 GiB"), "{out}");
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn a_failing_driver_at_detection_means_the_host_and_a_reason() {
    let (_model, _turn) = model();
    for call in [
        "cuInit",
        "cuDeviceGetCount",
        "cuDeviceGet",
        "cuDevicePrimaryCtxRetain",
    ] {
        let fail = format!("{call}:after=0");
        let (ok, out, err) = info(&[("ACCALLOC_CUDA_MODEL_FAIL", &fail)]);
        assert!(
            ok && out.contains("accelerator: host"),
            "{call}: {out}{err}"
        );
        let (ok, _, err) = info(&[
            ("ACCALLOC_CUDA_MODEL_FAIL", &fail),
            ("ACCALLOC_DEVICE", "cuda"),
        ]);
        assert!(!ok, "{call}");
        assert!(
            err.contains("ACCALLOC_DEVICE=cuda but CUDA is not available") && err.contains(call),
            "{call}: {err}"
        );
    }
    // Without the granularity there is no virtual memory: expandable segments are off, saying so,
    // and the figures are the defaults' own, as PyTorch's where the platform lacks them.
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/traces/varying_sizes.jsonl"
    );
    let run = |fail: &str, config: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_accalloc"))
            .args(["replay", trace, "--json", "--cuda", "--config", config])
            .env("ACCALLOC_CUDA_MODEL_FAIL", fail)
            .output()
            .unwrap();
        assert!(out.status.success());
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            json["stats"].clone(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (without_vmm, warning) = run(
        "cuMemGetAllocationGranularity:from=0",
        "expandable_segments:True",
    );
    assert!(warning.contains("no virtual memory calls"), "{warning}");
    assert_eq!(without_vmm, run("", "").0);
}

#[test]
#[ignore = "needs the CUDA driver model: run by scripts/test-all.sh (LD_LIBRARY_PATH=$(scripts/cuda-model.sh))"]
fn a_stream_that_waits_for_the_others_event_may_use_its_memory() {
    let (model, _turn) = model();
    let device = 4 % model.backend.device_count();
    let (a, b, c) = (
        model.stream(device),
        model.stream(device),
        model.stream(device),
    );
    let p = model.backend.raw_alloc(device, 2 * MIB, 0).unwrap();
    assert_eq!(model.launch(device, b, 200_000, p, 2 * MIB), 0);
    let event = model.backend.create_event(device).unwrap();
    model.backend.record_event(device, event, b).unwrap();
    model.make_current(device);
    // SAFETY: a stream and an event of the current context's device.
    let rc = unsafe { cudarc::driver::sys::cuStreamWaitEvent(a as _, event as _, 0) };
    assert_eq!(rc, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    model.abort_on_violation(false);
    let violations = model.violations().0;
    assert_eq!(model.launch(device, a, 10, p, 2 * MIB), 0);
    let ordered = model.violations().0 - violations;
    // A third stream that did not wait is ordered behind neither B's work nor A's (held behind B).
    assert_eq!(model.launch(device, c, 10, p, 2 * MIB), 0);
    let unordered = model.violations().0 - violations - ordered;
    for s in [a, b, c] {
        model.destroy_stream(device, s);
    }
    model.abort_on_violation(true);
    assert_eq!(ordered, 0, "stream A waited for B's event");
    assert_eq!(
        unordered, 2,
        "stream C waited for nothing: it races B's and A's work"
    );
    model.backend.destroy_event(device, event).unwrap();
    model.backend.raw_free(device, p, 2 * MIB).unwrap();
}
