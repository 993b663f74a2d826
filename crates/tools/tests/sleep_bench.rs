//! The sleep-and-wake benchmark (accalloc_tools::replay::sleep_bench) leaves nothing behind: its
//! timings cannot be checked, but after it host device 0 (where it runs, whatever the current
//! accelerator) holds no allocation and, once the cache is emptied, no memory, and every row was
//! measured. A process of its own (the runtime is global).

use accalloc::capi::memory::accalloc_empty_cache_on;
use accalloc::capi::stats::accalloc_memory_stat_on;
use accalloc::capi::{AccallocStatus, ACCALLOC_DEVICE_HOST as HOST};
use accalloc_tools::replay::sleep_bench::{run, table};

fn stat(key: &str) -> i64 {
    let key = std::ffi::CString::new(key).unwrap();
    let mut value = -1;
    // SAFETY: a NUL-terminated key and a valid out-pointer.
    let status = unsafe { accalloc_memory_stat_on(HOST, 0, key.as_ptr(), &mut value) };
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    value
}

#[test]
fn the_benchmark_measures_every_row_and_gives_everything_back() {
    let rows = run(8 << 20, 2).unwrap();
    assert_eq!(rows.len(), 5);
    assert!(rows
        .iter()
        .all(|r| r.ms_per_gib.is_finite() && r.ms_per_gib >= 0.0));
    assert_eq!(table(&rows).lines().count(), 2 + rows.len());
    assert_eq!(stat("allocated_bytes.all.current"), 0);
    assert_eq!(accalloc_empty_cache_on(HOST), AccallocStatus::ACCALLOC_OK);
    assert_eq!(stat("reserved_bytes.all.current"), 0);
}
