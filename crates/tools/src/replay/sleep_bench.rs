//! The sleep-and-wake benchmark: pause and resume of a sleepable pool through the C ABI on the host
//! accelerator, in milliseconds per GiB, against a plain copy of the same bytes into fresh host
//! memory (what a backup is), measured in the same run, the two taking turns.

use super::bench::median;
use crate::capi::memory::{accalloc_free, accalloc_malloc_on};
use crate::capi::pools::{
    accalloc_pool_begin_on, accalloc_pool_create_on, accalloc_pool_end_on,
    accalloc_pool_release_on, AccallocPoolId, ACCALLOC_ROUTE_THREAD,
};
use crate::capi::sleep::{
    accalloc_pool_pause_on, accalloc_pool_resume_on, accalloc_pool_set_sleepable_on,
};
use crate::capi::{AccallocStatus, ACCALLOC_DEVICE_HOST as HOST};
use std::ffi::c_void;
use std::time::Instant;

/// One row: what was timed and its median milliseconds per GiB.
pub struct SleepRow {
    pub what: &'static str,
    pub ms_per_gib: f64,
}

fn ok(status: AccallocStatus, call: &str) -> Result<(), String> {
    match status {
        AccallocStatus::ACCALLOC_OK => Ok(()),
        other => {
            // SAFETY: the thread's last error message, a NUL-terminated string it owns.
            let message = unsafe {
                std::ffi::CStr::from_ptr(crate::capi::info::accalloc_last_error_message())
            };
            Err(format!("{call}: {other:?}: {}", message.to_string_lossy()))
        }
    }
}

/// Pause and resume `bytes` of a pool on host device 0 (whatever the current accelerator: the bytes
/// are written from the CPU) `rounds` times with a
/// backup, then without, each round beside a plain copy of the same bytes (to fresh memory, as a
/// backup takes, and back). The rows: plain copy, pause with backup, resume with backup, pause
/// without, resume without; each the median over the rounds, in ms per GiB.
pub fn run(bytes: usize, rounds: usize) -> Result<Vec<SleepRow>, String> {
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let per_gib = |t: Instant| t.elapsed().as_secs_f64() * 1e3 / gib;
    let mut pool = AccallocPoolId {
        first: 0,
        second: 0,
    };
    // SAFETY: a valid out-pointer.
    ok(
        unsafe { accalloc_pool_create_on(HOST, 0, 0, 0, &mut pool) },
        "accalloc_pool_create",
    )?;
    ok(
        accalloc_pool_set_sleepable_on(HOST, 0, pool),
        "accalloc_pool_set_sleepable",
    )?;
    ok(
        accalloc_pool_begin_on(HOST, 0, pool, ACCALLOC_ROUTE_THREAD, std::ptr::null_mut()),
        "accalloc_pool_begin",
    )?;
    let mut weights: *mut c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let allocated =
        unsafe { accalloc_malloc_on(HOST, &mut weights, bytes, 0, std::ptr::null_mut()) };
    ok(accalloc_pool_end_on(HOST, 0, pool), "accalloc_pool_end")?;
    ok(
        accalloc_pool_release_on(HOST, 0, pool),
        "accalloc_pool_release",
    )?;
    ok(allocated, "accalloc_malloc")?;
    // SAFETY: `bytes` of host memory just allocated: every page made resident.
    let source = unsafe { std::slice::from_raw_parts_mut(weights as *mut u8, bytes) };
    source
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);

    let mut samples: [Vec<f64>; 5] = Default::default();
    let mut result = Ok(());
    for _ in 0..rounds {
        // The baseline: the bytes copied to fresh host memory and back.
        let t = Instant::now();
        let mut copy: Vec<u8> = Vec::with_capacity(bytes);
        copy.extend_from_slice(source);
        // Opaque to the optimizer, which would otherwise see the copy back as a no-op.
        let copy = std::hint::black_box(copy);
        source.copy_from_slice(&copy);
        drop(copy);
        samples[0].push(per_gib(t) / 2.0);
        for (backup, at) in [(1, 1), (0, 3)] {
            let t = Instant::now();
            result = ok(
                accalloc_pool_pause_on(HOST, 0, pool, backup),
                "accalloc_pool_pause",
            );
            samples[at].push(per_gib(t));
            let t = Instant::now();
            result = result.and(ok(
                accalloc_pool_resume_on(HOST, 0, pool),
                "accalloc_pool_resume",
            ));
            samples[at + 1].push(per_gib(t));
            if result.is_err() {
                break;
            }
        }
        // Resumed without a backup the pages are fresh: touch them again, as a KV cache's writer
        // would, so that every round pauses resident memory.
        source.iter_mut().for_each(|b| *b = 1);
        if result.is_err() {
            break;
        }
    }
    // SAFETY: what accalloc_malloc returned, freed once.
    ok(unsafe { accalloc_free(weights) }, "accalloc_free")?;
    ok(
        accalloc_pool_release_on(HOST, 0, pool),
        "accalloc_pool_release",
    )?;
    result?;
    let names = [
        "plain copy to fresh host memory (each way)",
        "pause with a backup",
        "resume with a backup",
        "pause without a backup",
        "resume without a backup",
    ];
    Ok(names
        .into_iter()
        .zip(samples)
        .map(|(what, samples)| SleepRow {
            what,
            ms_per_gib: median(samples),
        })
        .collect())
}

/// The rows as a markdown table, each against the plain copy.
pub fn table(rows: &[SleepRow]) -> String {
    let copy = rows.first().map_or(1.0, |r| r.ms_per_gib);
    let mut text = String::from("| what | ms per GiB | / plain copy |\n|---|---:|---:|\n");
    for row in rows {
        text.push_str(&format!(
            "| {} | {:.1} | {:.2} |\n",
            row.what,
            row.ms_per_gib,
            row.ms_per_gib / copy
        ));
    }
    text
}
