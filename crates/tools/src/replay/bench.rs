//! The hot-path benchmark: a cached accalloc_malloc + accalloc_free pair through the C ABI on the host backend,
//! against the C library's malloc + free of the same sizes, measured in the same run.

use crate::backend::host::{HostBackend, HostSettings};
use crate::backend::renamed::Renamed;
use crate::capi::memory::{accalloc_free, accalloc_malloc, accalloc_malloc_on};
use crate::capi::AccallocStatus;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

/// Request sizes measured, one row each, then all of them interleaved.
pub const SIZES: [usize; 5] = [512, 4 << 10, 64 << 10, 1 << 20, 16 << 20];

/// How many sizes the varying row cycles through.
pub const VARYING_COUNT: usize = 4096;

/// A framework-like mix where the size changes every call: 60% under 64 KiB, 30% from 64 KiB to
/// under 1 MiB, 10% from 1 MiB to 64 MiB, uniformly within each range. The same `count` sizes every
/// run (a fixed-seed xorshift), so both allocators see the same requests.
pub fn varying_sizes(count: usize) -> Vec<usize> {
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count)
        .map(|_| {
            let (low, high) = match next() % 10 {
                0..=5 => (1, 64 << 10),
                6..=8 => (64 << 10, 1 << 20),
                _ => (1 << 20, (64 << 20) + 1),
            };
            low + (next() % (high - low) as u64) as usize
        })
        .collect()
}

/// Median nanoseconds per malloc+free pair for one size pattern.
#[derive(Clone, Debug)]
pub struct BenchRow {
    pub label: String,
    pub accalloc_ns: f64,
    pub libc_ns: f64,
}

impl BenchRow {
    /// accalloc time / libc time: below 1 means accalloc is faster.
    pub fn ratio(&self) -> f64 {
        self.accalloc_ns / self.libc_ns
    }
}

/// The median of timing samples (the upper one of an even count); the benchmarks' one summary.
pub(crate) fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Time `batches` batches of `pairs` pairs cycling through `sizes`; median ns per pair.
fn measure(sizes: &[usize], batches: usize, pairs: usize, mut pair: impl FnMut(usize)) -> f64 {
    for &size in sizes {
        pair(size); // warm up: the first call fills the cache
    }
    median(
        (0..batches)
            .map(|_| batch(sizes, pairs, &mut pair))
            .collect(),
    )
}

/// ns per pair of one batch of `pairs` pairs cycling through `sizes`.
fn batch(sizes: &[usize], pairs: usize, pair: &mut impl FnMut(usize)) -> f64 {
    let start = Instant::now();
    for i in 0..pairs {
        pair(sizes[i % sizes.len()]);
    }
    start.elapsed().as_nanos() as f64 / pairs as f64
}

/// accalloc and libc on the same sizes, their batches taking turns so that a noisy neighbour slows
/// both alike: (accalloc, libc) median ns per pair.
fn measure_both(sizes: &[usize], batches: usize, pairs: usize) -> (f64, f64) {
    for &size in sizes {
        accalloc_pair(size);
        libc_pair(size);
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        ours.push(batch(sizes, pairs, &mut accalloc_pair));
        theirs.push(batch(sizes, pairs, &mut libc_pair));
    }
    (median(ours), median(theirs))
}

fn accalloc_pair(size: usize) {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: &mut ptr is a valid out-pointer; the block is freed at once.
    unsafe {
        let status = accalloc_malloc(&mut ptr, size, -1, std::ptr::null_mut());
        assert_eq!(
            status,
            AccallocStatus::ACCALLOC_OK,
            "accalloc_malloc failed during the benchmark"
        );
        std::hint::black_box(ptr);
        accalloc_free(ptr);
    }
}

fn libc_pair(size: usize) {
    // SAFETY: plain malloc/free of the C library; the block is freed at once.
    unsafe {
        let ptr = libc::malloc(size);
        assert!(!ptr.is_null(), "malloc failed during the benchmark");
        std::hint::black_box(ptr);
        libc::free(ptr);
    }
}

/// Run the benchmark: one row per size, then one with all sizes interleaved, then that again with
/// history recording on and with ACCALLOC_TRACE's recording on (their cost when on; off, each is
/// one branch), then the varying mix.
pub fn run(batches: usize, pairs: usize) -> Vec<BenchRow> {
    let mut rows = run_patterns(batches, pairs);
    crate::capi::inspect::accalloc_record_memory_history(1, 100_000);
    let with_history = measure(&SIZES, batches, pairs, accalloc_pair);
    crate::capi::inspect::accalloc_record_memory_history(0, 0);
    let libc_ns = rows.last().map_or(0.0, |r| r.libc_ns);
    rows.push(BenchRow {
        label: "mixed, history recording on".to_string(),
        accalloc_ns: with_history,
        libc_ns,
    });
    if let Some(with_trace) = with_trace_file(batches.min(11), pairs) {
        rows.push(BenchRow {
            label: "mixed, ACCALLOC_TRACE on".to_string(),
            accalloc_ns: with_trace,
            libc_ns,
        });
    }
    let (accalloc_ns, libc_ns) = measure_both(&varying_sizes(VARYING_COUNT), batches, pairs);
    rows.push(BenchRow {
        label: "varying (60% < 64 KiB, 30% < 1 MiB, 10% <= 64 MiB)".to_string(),
        accalloc_ns,
        libc_ns,
    });
    rows
}

/// The mixed pattern through the one-device shortcut and through the general path (the shortcut
/// suspended), their batches taking turns on the same device: (shortcut, general) median ns per
/// pair. None when there is no shortcut to compare with (several devices already in use).
pub fn general_path(batches: usize, pairs: usize) -> Option<(f64, f64)> {
    for &size in &SIZES {
        accalloc_pair(size);
    }
    if !crate::runtime::shortcut_taken() {
        return None;
    }
    let (mut shortcut, mut general) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        shortcut.push(batch(&SIZES, pairs, &mut accalloc_pair));
        general.push(crate::runtime::with_shortcut_suspended(|| {
            batch(&SIZES, pairs, &mut accalloc_pair)
        }));
    }
    Some((median(shortcut), median(general)))
}

/// How many devices hold memory in the rows of `several_devices`.
pub const DEVICES_IN_USE: [usize; 2] = [2, 4];

/// The mixed pattern of the current device once 2, then 4 devices hold memory (DEVICES_IN_USE):
/// the other devices are those of a backend registered for it, each given a cached segment. The
/// one-device shortcut is then given up for good, so this runs last: (devices in use, median ns
/// per pair). Empty when the backend cannot be registered (a process that used up its slots).
pub fn several_devices(batches: usize, pairs: usize) -> Vec<(usize, f64)> {
    let others = DEVICES_IN_USE.iter().max().copied().unwrap_or(1) - 1;
    // Host memory under another name ("host" is taken).
    let backend = Renamed::new(
        "bench-devices",
        HostBackend::new(HostSettings {
            capacity: 64 << 20,
            devices: others,
            fail: None,
            event_fail: None,
        }),
    );
    let Ok(runtime) = crate::runtime::runtime() else {
        return Vec::new();
    };
    let Ok(device_type) = runtime.register(Arc::new(backend)) else {
        return Vec::new();
    };
    let mut in_use = 1;
    let mut rows = Vec::new();
    for devices in DEVICES_IN_USE {
        while in_use < devices {
            let mut ptr: *mut c_void = std::ptr::null_mut();
            // SAFETY: &mut ptr is a valid out-pointer; the block is freed at once (its segment
            // stays cached on that device, which is what puts the device in use).
            unsafe {
                let status = accalloc_malloc_on(
                    device_type,
                    &mut ptr,
                    4096,
                    (in_use - 1) as i32,
                    std::ptr::null_mut(),
                );
                if status != AccallocStatus::ACCALLOC_OK {
                    return rows;
                }
                accalloc_free(ptr);
            }
            in_use += 1;
        }
        rows.push((devices, measure(&SIZES, batches, pairs, accalloc_pair)));
    }
    rows
}

/// The mixed pattern with every operation written to a trace file (as ACCALLOC_TRACE does), in a
/// temporary file removed afterwards; None when recording was on already or no file can be made.
fn with_trace_file(batches: usize, pairs: usize) -> Option<f64> {
    if std::env::var_os(crate::runtime::trace_log::TRACE_VAR).is_some() {
        return None;
    }
    let path = std::env::temp_dir().join(format!("accalloc-bench-{}.jsonl", std::process::id()));
    crate::runtime::trace_log::start(path.to_str()?).ok()?;
    let ns = measure(&SIZES, batches, pairs, accalloc_pair);
    let _ = crate::runtime::trace_log::stop();
    let _ = std::fs::remove_file(&path);
    Some(ns)
}

fn run_patterns(batches: usize, pairs: usize) -> Vec<BenchRow> {
    let mut patterns: Vec<(String, Vec<usize>)> = SIZES
        .iter()
        .map(|&s| (crate::units::format_size(s as u64), vec![s]))
        .collect();
    patterns.push(("mixed".to_string(), SIZES.to_vec()));
    patterns
        .into_iter()
        .map(|(label, sizes)| {
            let (accalloc_ns, libc_ns) = measure_both(&sizes, batches, pairs);
            BenchRow {
                label,
                accalloc_ns,
                libc_ns,
            }
        })
        .collect()
}

/// The rows as a Markdown table.
pub fn table(rows: &[BenchRow]) -> String {
    let mut out = String::from(
        "| sizes | accalloc malloc+free (ns) | libc malloc+free (ns) | accalloc / libc |\n|---|---:|---:|---:|\n",
    );
    for row in rows {
        out.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2} |\n",
            row.label,
            row.accalloc_ns,
            row.libc_ns,
            row.ratio()
        ));
    }
    out
}

/// Wall-clock nanoseconds per malloc+free pair with `threads` threads doing `pairs` pairs each on
/// `device_of(thread)` (the mixed sizes), best of three runs.
pub fn threaded(threads: usize, pairs: usize, device_of: fn(usize) -> i32) -> f64 {
    let run = || {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for t in 0..threads {
                scope.spawn(move || {
                    let device = device_of(t);
                    for i in 0..pairs {
                        let mut ptr: *mut c_void = std::ptr::null_mut();
                        // SAFETY: &mut ptr is a valid out-pointer; the block is freed at once.
                        unsafe {
                            let status = accalloc_malloc(
                                &mut ptr,
                                SIZES[i % SIZES.len()],
                                device,
                                std::ptr::null_mut(),
                            );
                            assert_eq!(
                                status,
                                AccallocStatus::ACCALLOC_OK,
                                "accalloc_malloc failed during the benchmark"
                            );
                            accalloc_free(ptr);
                        }
                    }
                });
            }
        });
        start.elapsed().as_nanos() as f64 / (threads * pairs) as f64
    };
    run();
    (0..3).map(|_| run()).fold(f64::INFINITY, f64::min)
}
