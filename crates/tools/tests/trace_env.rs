//! ACCALLOC_TRACE: a running program's operations, recorded through the C ABI in a child process, make
//! a trace that replays with the figures the program saw.

use accalloc::backend::host::{HostBackend, HostSettings};
use accalloc::caching::CachingConfig;
use accalloc::capi::memory::{accalloc_empty_cache, accalloc_free, accalloc_malloc};
use accalloc::capi::AccallocStatus;
use accalloc::trace::PoolCall;
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

/// `size` bytes on the current device, which must be had.
fn malloc(size: usize) -> *mut c_void {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    let status = unsafe { accalloc_malloc(&mut ptr, size, -1, std::ptr::null_mut()) };
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    ptr
}

/// Free `ptr`, which must be live.
fn free(ptr: *mut c_void) {
    assert_eq!(unsafe { accalloc_free(ptr) }, AccallocStatus::ACCALLOC_OK);
}

/// A program with a private pool: allocations in and out of it, the pool released while a tensor
/// of it lives, empty_cache around. Prints its statistics.
fn pool_program() {
    use accalloc::capi::pools::*;
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

/// A program that puts a pool checkpoint back (as CUDA graph trees do): a block taken in the pool,
/// checkpointed, freed, another taken in its place, the checkpoint put back, the restored block
/// freed later. Prints its statistics.
fn checkpoint_program() {
    use accalloc::capi::pool_checkpoint::*;
    use accalloc::capi::pools::*;
    let ok = |status| assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    let mut pool = AccallocPoolId {
        first: 0,
        second: 0,
    };
    ok(unsafe { accalloc_pool_create(-1, 0, 0, &mut pool) });
    ok(accalloc_pool_begin(
        -1,
        pool,
        ACCALLOC_ROUTE_THREAD,
        std::ptr::null_mut(),
    ));
    let first = malloc(1000);
    let kept = malloc(3 << 20);
    let mut checkpoint: *mut AccallocPoolCheckpoint = std::ptr::null_mut();
    ok(unsafe { accalloc_pool_checkpoint(-1, pool, &mut checkpoint) });
    free(first);
    let later = malloc(2000);
    ok(accalloc_pool_end(-1, pool));
    let outside = malloc(5000);
    let (mut freed, mut made) = ([std::ptr::null_mut(); 2], [std::ptr::null_mut(); 2]);
    let mut sizes = [0usize; 2];
    let (mut freed_count, mut made_count) = (0, 0);
    ok(unsafe {
        accalloc_pool_checkpoint_restore(
            checkpoint,
            freed.as_mut_ptr(),
            2,
            &mut freed_count,
            made.as_mut_ptr(),
            sizes.as_mut_ptr(),
            2,
            &mut made_count,
        )
    });
    assert_eq!((freed_count, made_count), (2, 2));
    let sorted = |mut pair: [*mut c_void; 2]| {
        pair.sort();
        pair
    };
    assert_eq!(sorted(freed), sorted([later, kept]));
    assert_eq!(sorted(made), sorted([first, kept]));
    ok(unsafe { accalloc_pool_checkpoint_destroy(checkpoint) });
    free(first); // handed out again by the restore: the program's to free
    print_stats();
    free(kept);
    free(outside);
    ok(accalloc_pool_release(-1, pool));
    ok(accalloc_pool_release(-1, pool));
    ok(accalloc_empty_cache());
}

#[test]
fn a_checkpoint_put_back_is_recorded_as_the_frees_and_allocations_it_made() {
    if std::env::var(CHILD).is_ok() {
        checkpoint_program();
        return;
    }
    let (seen, text) = record_and_read(
        "a_checkpoint_put_back_is_recorded_as_the_frees_and_allocations_it_made",
        "checkpoint_program.jsonl",
    );
    // Ids: 0 first, 1 kept, 2 later, 3 outside; the restore frees 1 and 2 and hands out 4 and 5
    // (1 KiB and 3 MiB, in the order of their segments' addresses), routed to the pool.
    let ops = parse_trace(&text).unwrap();
    let pool = |call| TraceOp::Pool {
        pool: (0, 1),
        device: 0,
        call,
    };
    let begin = ops
        .iter()
        .rposition(|op| *op == pool(PoolCall::Begin { stream: None }))
        .unwrap();
    let mut frees: Vec<&TraceOp> = ops[begin - 2..begin].iter().collect();
    frees.sort_by_key(|op| format!("{op}"));
    assert_eq!(
        frees,
        [&TraceOp::Free { id: 1 }, &TraceOp::Free { id: 2 }],
        "{text}"
    );
    let mut allocs: Vec<(u64, usize)> = ops[begin + 1..begin + 3]
        .iter()
        .map(|op| match *op {
            TraceOp::Alloc { id, size, .. } => (id, size),
            ref other => panic!("{other:?} where a restored block was expected: {text}"),
        })
        .collect();
    allocs.sort();
    assert_eq!(allocs.iter().map(|a| a.0).collect::<Vec<_>>(), [4, 5]);
    let mut sizes: Vec<usize> = allocs.iter().map(|a| a.1).collect();
    sizes.sort();
    assert_eq!(sizes, [1024, 3 << 20]);
    assert_eq!(ops[begin + 3], pool(PoolCall::End));
    assert_eq!(ops[begin + 4], pool(PoolCall::Release));
    // Replayed up to the figures the program printed (after it freed its first restored block),
    // the trace holds what the program held (placement, the counts of blocks handed out and the
    // peaks may differ: the replay serves the restored blocks by its policy, where the restore,
    // as PyTorch's, handed out and freed the checkpoint's free blocks too, the pool's whole 20 MiB
    // segment at once).
    let cut = begin + 5;
    assert!(matches!(ops[cut], TraceOp::Free { id: 4 | 5 }), "{text}");
    let replayed = replayed_stats(&ops[..=cut]);
    for key in [
        "allocated_bytes.all.current",
        "allocation.all.current",
        "active_bytes.all.current",
        "segment.all.current",
        "reserved_bytes.all.current",
    ] {
        assert_eq!(replayed[key], seen[key], "{key}");
    }
    assert_eq!(seen["allocated_bytes.all.current"], (3 << 20) + 5120);
    // The peak: the 20 MiB segment handed out whole beside `outside`, and `first` too when its
    // segment was put back before (segments go in address order).
    let peak = seen["allocated_bytes.all.peak"];
    assert!(
        ((20 << 20) + 5120..=(20 << 20) + 6144).contains(&peak),
        "{peak}"
    );
}
