//! The CUDA backend on a CUDA driver: a real GPU (scripts/gpu-check.sh), or the strict model of the
//! driver (scripts/test-all.sh runs these with LD_LIBRARY_PATH=$(scripts/cuda-model.sh)). Without
//! one the tests cannot run, so they are #[ignore]d and a plain `cargo test` reports them as
//! ignored; run explicitly (`-- --ignored`) where no CUDA driver answers, they fail, saying why.

#![cfg(feature = "cuda")]

use accalloc::backend::cuda::CudaBackend;
use accalloc::backend::Backend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::{CachingAllocator, CachingConfig, StatType};
use accalloc::error::ErrorKind;
use cuda_support::{capturing, stream};
use cudarc::driver::sys;
use std::sync::Arc;

mod cuda_support;

const ALL: usize = StatType::All as usize;

/// The CUDA backend; a test that asked for it fails when no CUDA driver answers.
fn gpu() -> Arc<CudaBackend> {
    match CudaBackend::detect() {
        Ok(backend) => Arc::new(backend),
        Err(why) => panic!(
            "no CUDA driver answers ({why}): these tests need a GPU, or the driver model \
             (LD_LIBRARY_PATH=$(scripts/cuda-model.sh), as scripts/test-all.sh runs them)"
        ),
    }
}

#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn malloc_free_and_the_cache_on_a_gpu() {
    let gpu = gpu();
    let mut a = CachingAllocator::new(gpu.clone(), 0, CachingConfig::default()).unwrap();
    let p = a.malloc(1000, 0).unwrap();
    assert_eq!(p % 512, 0);
    let s = a.stats();
    assert_eq!(
        (
            s.allocated_bytes[ALL].current,
            s.reserved_bytes[ALL].current
        ),
        (1024, 2 << 20)
    );
    a.free(p).unwrap();
    assert_eq!(a.malloc(1000, 0).unwrap(), p, "cached block reused");
    let big = a.malloc(100 << 20, 0).unwrap();
    a.free(big).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    assert!(gpu.mem_get_info(0).unwrap().total > 0);
}

#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn streams_and_events_on_a_gpu() {
    let gpu = gpu();
    let mut a = CachingAllocator::new(gpu.clone(), 0, CachingConfig::default()).unwrap();
    let (s1, s2) = (stream(), stream());
    let p = a.malloc(4096, s1).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(4096, s2).unwrap();
    assert_ne!(p, q, "a block is reused only on its own stream");
    a.record_stream(q, s1).unwrap();
    a.free(q).unwrap();
    // The event on s1 completes at once (nothing queued); the next malloc returns the block.
    gpu.synchronize_stream(0, s1).unwrap();
    assert_eq!(a.malloc(4096, s2).unwrap(), q);
}

#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn expandable_segments_on_a_gpu() {
    let gpu = gpu();
    // A device without virtual memory management fails here rather than passing with expandable
    // segments untested.
    assert!(
        gpu.vm_granularity(0).is_some(),
        "device 0 reports no virtual-memory granularity: expandable segments cannot be tested"
    );
    let config = parse_settings("expandable_segments:True", &CachingConfig::default()).unwrap();
    let mut a = CachingAllocator::new(gpu, 0, config).unwrap();
    let p = a.malloc(5 << 20, 0).unwrap();
    let q = a.malloc(30 << 20, 0).unwrap();
    assert_eq!(q, p + (5 << 20), "the segment grew in place");
    assert_eq!(a.stats().reserved_bytes[ALL].current, 40 << 20);
    a.free(p).unwrap();
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn out_of_memory_at_the_cards_real_capacity() {
    let gpu = gpu();
    let total = gpu.mem_get_info(0).unwrap().total;
    let mut a = CachingAllocator::new(gpu, 0, CachingConfig::default()).unwrap();
    // Two blocks of 60% of the card cannot both be had.
    let first = a.malloc(total / 10 * 6, 0).unwrap();
    let err = a.malloc(total / 10 * 6, 0).unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutOfMemory);
    assert!(
        err.message
            .starts_with("cuda out of memory. Tried to allocate"),
        "{}",
        err.message
    );
    let s = a.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (1, 1));
    a.free(first).unwrap();
}

#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn pinned_host_memory_round_trips_through_a_gpu() {
    let gpu = gpu();
    assert!(gpu.pinned_host_supported());
    let size = (1 << 20) + 3;
    let (from, to) = (
        gpu.pinned_host_alloc(size).unwrap(),
        gpu.pinned_host_alloc(size).unwrap(),
    );
    assert!(from.page_locked && to.page_locked);
    assert_eq!(from.ptr % 4096, 0, "page-aligned");
    // SAFETY: two live allocations of `size` bytes each, host memory the host reads and writes.
    let (source, back) = unsafe {
        (
            std::slice::from_raw_parts_mut(from.ptr as *mut u8, size),
            std::slice::from_raw_parts_mut(to.ptr as *mut u8, size),
        )
    };
    for (i, byte) in source.iter_mut().enumerate() {
        *byte = (i % 251) as u8;
    }
    back.fill(0);
    let device = gpu.raw_alloc(0, 2 << 20, 0).unwrap();
    let s = stream();
    // SAFETY: a device allocation and pinned memory of `size` bytes each, a stream of device 0,
    // whose context the backend made current on this thread.
    unsafe {
        let rc = sys::cuMemcpyHtoDAsync_v2(device as _, from.ptr as _, size, s as _);
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
        let rc = sys::cuMemcpyDtoHAsync_v2(to.ptr as _, device as _, size, s as _);
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    }
    gpu.synchronize_stream(0, s).unwrap();
    assert!(source == back, "the bytes came back through the device");
    // SAFETY: the stream this test created, its work done.
    let rc = unsafe { sys::cuStreamDestroy_v2(s as _) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    gpu.pinned_host_free(from.ptr, size).unwrap();
    gpu.pinned_host_free(to.ptr, size).unwrap();
    gpu.raw_free(0, device, 2 << 20).unwrap();
}

#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn pools_map_their_own_pages_and_take_segments_from_their_own_allocator_on_a_gpu() {
    use accalloc::caching::observers::{SegmentAction, SegmentEvent};
    use accalloc::caching::pools::Route;
    use std::sync::Mutex;

    let device = gpu();
    let config = parse_settings("expandable_segments:True", &CachingConfig::default()).unwrap();
    let mut a = CachingAllocator::new(device, 0, config).unwrap();
    let seen: Arc<Mutex<Vec<SegmentEvent>>> = Arc::default();
    let log = seen.clone();
    a.set_segment_observer(Some(Box::new(move |e: &SegmentEvent| {
        log.lock().unwrap().push(*e)
    })));
    let this_thread = || Route::Thread(std::thread::current().id());
    let (mapped, own) = ((0, 1), (0, 2));

    // A pool with no allocator of its own maps pages of a range of its own (cuMemMap).
    a.create_pool(mapped, false, false).unwrap();
    a.begin_allocate_to_pool(mapped, this_thread()).unwrap();
    let p = a.malloc(5 << 20, 0).unwrap();
    a.end_allocate_to_pool(mapped).unwrap();
    let q = a.malloc(5 << 20, 0).unwrap();
    assert!(
        q.abs_diff(p) >= 20 << 20,
        "the default pools' page is in another range"
    );

    // A pool whose allocator is another handle on the driver: its segments come from there
    // (with virtual memory, as pages of its own range too).
    a.create_pool_with_allocator(own, false, false, gpu())
        .unwrap();
    a.begin_allocate_to_pool(own, this_thread()).unwrap();
    let r = a.malloc(1000, 0).unwrap();
    a.end_allocate_to_pool(own).unwrap();
    let s = a.stats();
    assert_eq!(
        (s.reserved_bytes[ALL].current, s.segment[ALL].current),
        (42 << 20, 0),
        "two 20 MiB pages and one 2 MiB page, no ordinary segment"
    );
    assert_eq!(
        a.pool_reserved_bytes(mapped).unwrap()[ALL].current,
        20 << 20
    );
    assert_eq!(a.pool_reserved_bytes(own).unwrap()[ALL].current, 2 << 20);
    for ptr in [p, q, r] {
        a.free(ptr).unwrap();
    }
    a.empty_live_pool(mapped).unwrap();
    a.empty_live_pool(own).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
    let events = seen.lock().unwrap();
    let pools: Vec<_> = events
        .iter()
        .filter(|e| e.action == SegmentAction::Map)
        .map(|e| (e.pool, e.size))
        .collect();
    assert_eq!(
        pools,
        vec![(mapped, 20 << 20), ((0, 0), 20 << 20), (own, 2 << 20)]
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| e.action == SegmentAction::Unmap)
            .count(),
        3
    );
}

/// A CUDA graph being captured whose pool needs new memory: the driver refuses allocating calls on
/// the capturing thread unless that thread relaxed its capture mode, and then the capture is lost.
/// A segment (cuMemAlloc) and an expandable segment's first page (cuMemAddressReserve, cuMemCreate,
/// cuMemMap, cuMemSetAccess) are taken and the capture still ends with a graph. The capture is
/// thread-local: a global one (as `torch.cuda.graph` begins, which scripts/gpu/graph_capture.py
/// checks) also refuses the other test threads' synchronizations, and fails when one comes.
#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn a_graph_being_captured_gets_new_memory_for_its_pool_on_a_gpu() {
    use accalloc::caching::pools::Route;
    for setting in ["expandable_segments:False", "expandable_segments:True"] {
        let config = parse_settings(setting, &CachingConfig::default()).unwrap();
        let mut a = CachingAllocator::new(gpu(), 0, config).unwrap();
        let side = stream();
        // Begun as a graph's capture begins it (the pool made, its use count 1), released as the
        // graph's reset releases it.
        let graph_pool = (0, 1);
        a.begin_allocate_to_pool(graph_pool, Route::Stream(side))
            .unwrap();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        let (taken, ended) = capturing(side, mode, || a.malloc(5 << 20, side));
        let p = taken.unwrap_or_else(|e| panic!("{setting}: malloc during the capture: {e}"));
        assert_eq!(
            ended,
            sys::CUresult::CUDA_SUCCESS,
            "{setting}: the capture held"
        );
        a.end_allocate_to_pool(graph_pool).unwrap();
        assert_eq!(
            a.pool_reserved_bytes(graph_pool).unwrap()[ALL].current,
            20 << 20,
            "{setting}: the graph's pool holds the new memory"
        );
        a.free(p).unwrap();
        a.release_pool(graph_pool).unwrap();
        a.empty_cache().unwrap();
        assert_eq!(a.stats().reserved_bytes[ALL].current, 0, "{setting}");
    }
}

#[test]
#[ignore = "needs a CUDA driver (a GPU, or the model): run by scripts/test-all.sh and scripts/gpu-check.sh"]
fn a_sleepable_pool_pauses_and_resumes_at_the_same_addresses_on_a_gpu() {
    use accalloc::caching::pools::Route;

    let gpu = gpu();
    // The last device: the other tests use device 0 at the same time, and its free memory with it.
    let device = gpu.device_count() - 1;
    let mut a = CachingAllocator::new(gpu.clone(), device, CachingConfig::default()).unwrap();
    let tag = (0, 3);
    a.create_pool(tag, false, false).unwrap();
    a.make_pool_sleepable(tag).unwrap();
    a.begin_allocate_to_pool(tag, Route::Thread(std::thread::current().id()))
        .unwrap();
    let p = a.malloc(25 << 20, 0).unwrap();
    a.end_allocate_to_pool(tag).unwrap();
    // The block's bytes, written through the driver (cuMemcpyHtoD).
    let weights: Vec<u8> = (0..25usize << 20).map(|i| (i * 7 + 3) as u8).collect();
    gpu.copy_from_host(device, p, weights.as_ptr() as usize, weights.len())
        .unwrap();
    let running = gpu.mem_get_info(device).unwrap().free;
    for backup in [true, false] {
        a.pause_pool(tag, backup).unwrap();
        assert_eq!(a.pool_paused_bytes(tag), Some(40 << 20));
        assert_eq!(
            gpu.mem_get_info(device).unwrap().free - running,
            40 << 20,
            "cuMemGetInfo's free rose by the paused bytes"
        );
        a.resume_pool(tag).unwrap();
        assert_eq!(gpu.mem_get_info(device).unwrap().free, running);
        if backup {
            // The backup came back: the same bytes at the same address (cuMemcpyDtoH).
            let mut back = vec![0u8; weights.len()];
            gpu.copy_to_host(device, back.as_mut_ptr() as usize, p, back.len())
                .unwrap();
            assert!(back == weights, "the contents came back with the pages");
        }
    }
    // The same address serves the block: freeing it and allocating again in the tag finds it.
    a.free(p).unwrap();
    a.begin_allocate_to_pool(tag, Route::Thread(std::thread::current().id()))
        .unwrap();
    assert_eq!(a.malloc(25 << 20, 0).unwrap(), p);
    a.end_allocate_to_pool(tag).unwrap();
    a.free(p).unwrap();
    a.empty_live_pool(tag).unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}
