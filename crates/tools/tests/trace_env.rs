//! ACCALLOC_TRACE: a running program's operations, recorded through the C ABI in a child process, make
//! a trace that replays with the figures the program saw.

use accalloc::backend::host::{HostBackend, HostSettings};
use accalloc::caching::CachingConfig;
use accalloc::capi::memory::{accalloc_empty_cache, accalloc_free, accalloc_malloc};
use accalloc::capi::AccallocStatus;
use accalloc_tools::replay::{parse_trace, replay, TraceOp};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::process::Command;
use std::sync::Arc;

const CHILD: &str = "ACCALLOC_TRACE_TEST_CHILD";

/// The program: a few rounds of mixed sizes, a request too large for the device, an empty_cache,
/// and blocks left live at the end (the exit writes out what is buffered). Prints its statistics.
fn program() {
    let malloc = |size: usize| {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let status = unsafe { accalloc_malloc(&mut ptr, size, -1, std::ptr::null_mut()) };
        (status, ptr)
    };
    let mut live = Vec::new();
    for round in 0..20usize {
        for size in [
            512,
            3000 + round * 100,
            1 << 20,
            (5 << 20) + round * 4096,
            25 << 20,
        ] {
            let (status, ptr) = malloc(size);
            assert_eq!(status, AccallocStatus::ACCALLOC_OK);
            live.push(ptr);
        }
        // Free all but every third block of the round.
        for (i, ptr) in live.split_off(live.len() - 5).into_iter().enumerate() {
            if i % 3 == 0 {
                live.push(ptr);
            } else {
                assert_eq!(unsafe { accalloc_free(ptr) }, AccallocStatus::ACCALLOC_OK);
            }
        }
        if round == 10 {
            assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
        }
    }
    let (status, _) = malloc(3 << 30);
    assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_OUT_OF_MEMORY);
    for ptr in live.drain(..live.len() / 2) {
        assert_eq!(unsafe { accalloc_free(ptr) }, AccallocStatus::ACCALLOC_OK);
    }
    print_stats();
}

/// Print device 0's statistics for the parent (record_and_read reads them).
fn print_stats() {
    let stats = accalloc::runtime::runtime()
        .unwrap()
        .current()
        .device_stats(0)
        .unwrap()
        .flat();
    let stats: BTreeMap<String, i64> = stats.into_iter().collect();
    println!("STATS {}", serde_json::to_string(&stats).unwrap());
}

/// Run test `test` as the recorded child, writing its trace to `file` in a folder of this process:
/// (the statistics it printed, the trace's text).
fn record_and_read(test: &str, file: &str) -> (BTreeMap<String, i64>, String) {
    let dir = std::env::temp_dir().join(format!("accalloc-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file);
    let out = run_child(test, &path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("STATS ").map(|(_, json)| json))
        .unwrap_or_else(|| panic!("the program printed no statistics: {stdout}"));
    (
        serde_json::from_str(line).unwrap(),
        std::fs::read_to_string(&path).unwrap(),
    )
}

/// Device 0's statistics after replaying `ops` on a 1 GiB host device.
fn replayed_stats(ops: &[TraceOp]) -> BTreeMap<String, i64> {
    let settings = HostSettings {
        capacity: 1 << 30,
        ..accalloc::runtime::Environment::read()
            .host_settings()
            .unwrap()
    };
    let report = replay(
        ops,
        Arc::new(HostBackend::new(settings)),
        &CachingConfig::default(),
    )
    .unwrap();
    report.device_stats[0].flat().into_iter().collect()
}

fn run_child(test: &str, trace: &std::path::Path) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("ACCALLOC_TRACE", trace)
        .env("ACCALLOC_HOST_CAPACITY", "1GiB")
        .env("ACCALLOC_DEVICE", "host")
        .output()
        .unwrap()
}

#[test]
fn a_recorded_program_replays_with_its_figures() {
    if std::env::var(CHILD).is_ok() {
        program();
        return;
    }
    let (seen, text) = record_and_read(
        "a_recorded_program_replays_with_its_figures",
        "program.jsonl",
    );
    let ops = parse_trace(&text).unwrap();
    // 100 allocations and 60 frees in the rounds, one empty_cache, the OOM as an allocation freed at
    // once, then the frees of half the 40 blocks kept: everything, up to the program's exit.
    let count = |f: fn(&TraceOp) -> bool| ops.iter().filter(|op| f(op)).count();
    assert_eq!(count(|op| matches!(op, TraceOp::Alloc { .. })), 101);
    assert_eq!(count(|op| matches!(op, TraceOp::Free { .. })), 60 + 1 + 20);
    assert_eq!(count(|op| *op == TraceOp::EmptyCache), 1);
    assert!(text.starts_with("{\"op\":\"alloc\",\"id\":0,\"size\":512,\"stream\":0}\n"));

    let replayed = replayed_stats(&ops);
    assert_eq!(
        replayed, seen,
        "the replay's 122 statistics are the program's"
    );
    assert_eq!(seen["num_ooms"], 1);
}

#[test]
fn an_unwritable_trace_file_is_a_configuration_error() {
    if std::env::var(CHILD).is_ok() {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let status = unsafe { accalloc_malloc(&mut ptr, 512, -1, std::ptr::null_mut()) };
        let message = unsafe {
            std::ffi::CStr::from_ptr(accalloc::capi::info::accalloc_last_error_message())
        }
        .to_string_lossy()
        .into_owned();
        println!("STATUS {status:?} {message}");
        return;
    }
    let out = run_child(
        "an_unwritable_trace_file_is_a_configuration_error",
        std::path::Path::new("/nonexistent-dir/trace.jsonl"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("STATUS ACCALLOC_ERROR_CONFIG ACCALLOC_TRACE: cannot create the trace file '/nonexistent-dir/trace.jsonl'"),
        "{stdout}"
    );
}

/// A program with a private pool: allocations in and out of it, the pool released while a tensor
/// of it lives, empty_cache around. Prints its statistics.
fn pool_program() {
    use accalloc::capi::pools::*;
    let malloc = |size: usize| {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let status = unsafe { accalloc_malloc(&mut ptr, size, -1, std::ptr::null_mut()) };
        assert_eq!(status, AccallocStatus::ACCALLOC_OK);
        ptr
    };
    let free = |ptr| assert_eq!(unsafe { accalloc_free(ptr) }, AccallocStatus::ACCALLOC_OK);
    let mut pool = AccallocPoolId {
        first: 0,
        second: 0,
    };
    assert_eq!(
        unsafe { accalloc_pool_create(-1, 0, 1, &mut pool) },
        AccallocStatus::ACCALLOC_OK
    );
    let begin = || accalloc_pool_begin(-1, pool, ACCALLOC_ROUTE_THREAD, std::ptr::null_mut());
    assert_eq!(begin(), AccallocStatus::ACCALLOC_OK);
    let in_pool: Vec<_> = [1000, 3 << 20, 4096].into_iter().map(malloc).collect();
    assert_eq!(accalloc_pool_end(-1, pool), AccallocStatus::ACCALLOC_OK);
    assert_eq!(accalloc_pool_release(-1, pool), AccallocStatus::ACCALLOC_OK);
    let outside = malloc(1000);
    free(in_pool[0]);
    free(in_pool[1]);
    assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
    assert_eq!(
        accalloc_pool_empty_cache(-1, pool, 1),
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(accalloc_pool_release(-1, pool), AccallocStatus::ACCALLOC_OK);
    free(in_pool[2]);
    free(outside);
    assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
    print_stats();
}

#[test]
fn a_recorded_program_with_a_pool_replays_with_its_figures() {
    if std::env::var(CHILD).is_ok() {
        pool_program();
        return;
    }
    let (seen, text) = record_and_read(
        "a_recorded_program_with_a_pool_replays_with_its_figures",
        "pool_program.jsonl",
    );
    assert!(
        text.contains(
            "{\"op\":\"pool_create\",\"pool\":[0,1],\"use_on_oom\":false,\"no_split\":true}\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("{\"op\":\"pool_empty\",\"pool\":[0,1],\"live\":true}\n"),
        "{text}"
    );
    let ops = parse_trace(&text).unwrap();
    let replayed = replayed_stats(&ops);
    assert_eq!(
        replayed, seen,
        "the replay's 122 statistics are the program's"
    );
    assert_eq!(
        seen["segment.all.allocated"], 4,
        "three no_split pool segments and a default one"
    );
    assert_eq!(seen["reserved_bytes.all.current"], 0);
}
