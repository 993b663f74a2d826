//! Sequences of C API calls with hostile arguments: foreign, interior and freed pointers, huge sizes,
//! negative and missing devices, NULL out-pointers, bad keys, fractions and settings strings, and a
//! hostile registered backend whose every callback may lie (error codes, out of memory, NULL,
//! misaligned, repeated, overlapping or wrapping addresses, capacities up to 2^64, failing events
//! and stream synchronizations), driven by the input's last bytes. Every call must return a status
//! (never ACCALLOC_ERROR_INTERNAL, which would mean a caught panic), and after freeing what it got,
//! each input leaves nothing allocated.
#![no_main]

use accalloc::capi::device::*;
use accalloc::capi::memory::*;
use accalloc::capi::pinned_host::*;
use accalloc::capi::pool_checkpoint::*;
use accalloc::capi::pools::*;
use accalloc::capi::planned::{accalloc_planner_stats, AccallocPlannerStats};
use accalloc::capi::settings::{accalloc_set_allocator_settings, accalloc_set_allocator_settings_on};
use accalloc::capi::sleep::*;
use accalloc::capi::stats::*;
use accalloc::capi::*;
use libfuzzer_sys::fuzz_target;
use std::collections::VecDeque;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What the hostile backend's callbacks answer next: one byte per answer, honest when none is left.
static LIES: Mutex<VecDeque<u8>> = Mutex::new(VecDeque::new());
/// The hostile backend's next fake address, and the last one it gave.
static NEXT: AtomicUsize = AtomicUsize::new(0x4000_0000_0000_0000);
static LAST: AtomicUsize = AtomicUsize::new(0);

fn lie() -> u8 {
    LIES.lock().unwrap().pop_front().unwrap_or(0)
}

/// A status: mostly OK, sometimes out of memory or an error code of the backend's own.
fn status(lie: u8) -> i32 {
    match lie % 8 {
        6 => ACCALLOC_BACKEND_OUT_OF_MEMORY,
        7 => lie as i32 + 3,
        _ => ACCALLOC_BACKEND_OK,
    }
}

/// An address for a segment or reservation of `size` bytes: fresh, or a lie.
fn address(lie: u8, size: usize) -> usize {
    let fresh = NEXT.fetch_add(size.next_multiple_of(2 << 20) + (2 << 20), Ordering::Relaxed);
    let ptr = match lie / 8 % 8 {
        1 => 0,
        2 => fresh + 8,
        3 => LAST.load(Ordering::Relaxed),
        4 => LAST.load(Ordering::Relaxed) + 4096,
        5 => 0usize.wrapping_sub(2 << 20),
        _ => fresh,
    };
    LAST.store(ptr, Ordering::Relaxed);
    ptr
}

unsafe extern "C" fn h_device_count(_: *mut c_void, out: *mut i32) -> i32 {
    *out = 2;
    ACCALLOC_BACKEND_OK
}
unsafe extern "C" fn h_raw_alloc(_: *mut c_void, _: i32, size: usize, _: *mut c_void, out: *mut *mut c_void) -> i32 {
    let l = lie();
    *out = address(l, size) as *mut c_void;
    status(l)
}
unsafe extern "C" fn h_free(_: *mut c_void, _: i32, _: *mut c_void, _: usize) -> i32 {
    status(lie())
}
unsafe extern "C" fn h_mem_get_info(_: *mut c_void, _: i32, free: *mut u64, total: *mut u64) -> i32 {
    let l = lie();
    let capacity = match l / 8 % 4 {
        1 => u64::MAX,
        2 => 1 << 62,
        3 => 0,
        _ => 1 << 30,
    };
    *free = capacity / 2;
    *total = capacity;
    status(l)
}
unsafe extern "C" fn h_event_create(_: *mut c_void, _: i32, out: *mut *mut c_void) -> i32 {
    *out = 1usize as *mut c_void;
    status(lie())
}
unsafe extern "C" fn h_event(_: *mut c_void, _: i32, _: *mut c_void) -> i32 {
    status(lie())
}
unsafe extern "C" fn h_event_record(_: *mut c_void, _: i32, _: *mut c_void, _: *mut c_void) -> i32 {
    status(lie())
}
unsafe extern "C" fn h_event_query(_: *mut c_void, _: i32, _: *mut c_void, complete: *mut i32) -> i32 {
    let l = lie();
    *complete = (l % 2 == 0) as i32;
    status(l)
}
unsafe extern "C" fn h_granularity(_: *mut c_void, _: i32, out: *mut usize) -> i32 {
    let l = lie();
    *out = [2 << 20, 4096, 0, 3 << 20][(l / 8 % 4) as usize];
    status(l)
}
unsafe extern "C" fn h_vm_reserve(_: *mut c_void, _: i32, size: usize, out: *mut *mut c_void) -> i32 {
    let l = lie();
    *out = address(l, size) as *mut c_void;
    status(l)
}

/// The hostile backend's device type (registered once per process).
fn hostile() -> AccallocDeviceType {
    static TYPE: std::sync::OnceLock<AccallocDeviceType> = std::sync::OnceLock::new();
    *TYPE.get_or_init(|| {
        let table = AccallocBackendVTable {
            struct_size: std::mem::size_of::<AccallocBackendVTable>(),
            context: std::ptr::null_mut(),
            device_count: Some(h_device_count),
            raw_alloc: Some(h_raw_alloc),
            raw_free: Some(h_free),
            mem_get_info: Some(h_mem_get_info),
            event_create: Some(h_event_create),
            event_record: Some(h_event_record),
            event_query: Some(h_event_query),
            event_synchronize: Some(h_event),
            event_destroy: Some(h_event),
            stream_synchronize: Some(h_event),
            vm_granularity: Some(h_granularity),
            vm_reserve: Some(h_vm_reserve),
            vm_map: Some(h_free),
            vm_unmap: Some(h_free),
            vm_release: Some(h_free),
            host_alloc: None,
            host_free: None,
            copy_to_host: None,
            copy_from_host: None,
        };
        let mut device_type = -1;
        let status = unsafe { accalloc_register_backend(c"hostile".as_ptr(), &table, &mut device_type) };
        assert_eq!(status, AccallocStatus::ACCALLOC_OK);
        device_type
    })
}

fn ok_or_expected(status: AccallocStatus) {
    assert_ne!(status, AccallocStatus::ACCALLOC_ERROR_INTERNAL, "a panic reached the boundary");
}

/// PyTorch's pluggable pair over the heap, for pools with an allocator of their own.
unsafe extern "C" fn heap_alloc(size: usize, _device: i32, _stream: *mut c_void) -> *mut c_void {
    match std::alloc::Layout::from_size_align(size.max(1), 512) {
        Ok(layout) => std::alloc::alloc(layout) as *mut c_void,
        Err(_) => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn heap_free(ptr: *mut c_void, size: usize, _device: i32, _stream: *mut c_void) {
    std::alloc::dealloc(ptr as *mut u8, std::alloc::Layout::from_size_align(size.max(1), 512).unwrap());
}

/// A pool made (or refused): kept with the device it is on, whatever the current device becomes, and
/// its creation's use.
unsafe fn remember_pool(pools: &mut Vec<(i32, AccallocPoolId, u32, bool)>, status: AccallocStatus, device: i32, id: AccallocPoolId) {
    ok_or_expected(status);
    if status == AccallocStatus::ACCALLOC_OK {
        let mut on = device;
        if on < 0 {
            assert_eq!(accalloc_current_device(&mut on), AccallocStatus::ACCALLOC_OK);
        }
        pools.push((on, id, 1, false));
    }
}

/// A pool filter that takes stream 1.
unsafe extern "C" fn stream_one(stream: *mut c_void, _context: *mut c_void) -> i32 {
    (stream as usize == 1) as i32
}

fuzz_target!(|data: &[u8]| {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        std::env::set_var("ACCALLOC_HOST_CAPACITY", "512MiB");
        std::env::set_var("ACCALLOC_HOST_DEVICES", "2");
    });
    let hostile = hostile();
    // The last quarter of the input is what the hostile backend answers.
    let (data, lies) = data.split_at(data.len() - data.len() / 4);
    LIES.lock().unwrap().extend(lies.iter().copied());
    let mut live: Vec<usize> = Vec::new();
    let mut hostile_live: Vec<usize> = Vec::new();
    let mut pinned_live: Vec<usize> = Vec::new();
    // Pools made here: (device, id, uses this input holds, begun).
    let mut pools: Vec<(i32, AccallocPoolId, u32, bool)> = Vec::new();
    let mut bytes = data.chunks(9);
    unsafe {
        while let Some(chunk) = bytes.next() {
            let op = chunk[0];
            let arg = chunk.iter().skip(1).fold(0u64, |acc, &b| (acc << 8) | b as u64);
            let device = (arg as i32 % 4) - 1; // -1 .. 2: current, two devices, one that does not exist
            match op % 17 {
                12 => {
                    // The hostile backend: any size, its settings, its streams.
                    let mut p: *mut c_void = std::ptr::null_mut();
                    let size = (arg % (48 << 20)) as usize;
                    let stream = ((arg >> 40) % 3) as usize as *mut c_void;
                    let status = accalloc_malloc_on(hostile, &mut p, size, device, stream);
                    ok_or_expected(status);
                    if status == AccallocStatus::ACCALLOC_OK && !p.is_null() {
                        assert_eq!(p as usize % 512, 0);
                        assert!(!live.contains(&(p as usize)) && !hostile_live.contains(&(p as usize)));
                        hostile_live.push(p as usize);
                    }
                }
                13 => {
                    let conf = [c"expandable_segments:True", c"", c"release_lock_on_malloc:True", c"max_split_size_mb:20", c"planned_placement:True"];
                    ok_or_expected(accalloc_set_allocator_settings_on(hostile, conf[(arg % 5) as usize].as_ptr()));
                    if let Some(&p) = hostile_live.get(arg as usize % hostile_live.len().max(1)) {
                        ok_or_expected(accalloc_record_stream(p as *mut c_void, (arg % 5) as usize as *mut c_void));
                    }
                    ok_or_expected(accalloc_set_memory_fraction_on(hostile, (arg % 3) as f64 / 2.0, device));
                    ok_or_expected(accalloc_empty_cache_on(hostile));
                }
                16 => {
                    // Private pools: made, begun (this thread or a stream), ended, released and
                    // emptied in any order; misuse must be refused, never panic or lose a block.
                    let pick = (arg >> 8) as usize;
                    match arg % 8 {
                        0 => {
                            let mut id = AccallocPoolId { first: 0, second: 0 };
                            let status = accalloc_pool_create(device, (arg >> 16) as i32 & 1, (arg >> 17) as i32 & 1, &mut id);
                            remember_pool(&mut pools, status, device, id);
                        }
                        1 if !pools.is_empty() => {
                            let at = pick % pools.len();
                            let entry = &mut pools[at];
                            let route = ((arg >> 24) % 3) as i32; // 2: not a route
                            let status = accalloc_pool_begin(entry.0, entry.1, route, ((arg >> 40) % 3) as usize as *mut c_void);
                            ok_or_expected(status);
                            if status == AccallocStatus::ACCALLOC_OK {
                                assert!(!entry.3, "a begun pool was begun again");
                                entry.2 += 1;
                                entry.3 = true;
                            }
                        }
                        2 if !pools.is_empty() => {
                            let at = pick % pools.len();
                            let entry = &mut pools[at];
                            let status = accalloc_pool_end(entry.0, entry.1);
                            assert_eq!(status == AccallocStatus::ACCALLOC_OK, entry.3);
                            entry.3 = false;
                        }
                        3 if !pools.is_empty() => {
                            let at = pick % pools.len();
                            let entry = &mut pools[at];
                            let status = accalloc_pool_release(entry.0, entry.1);
                            ok_or_expected(status);
                            if status == AccallocStatus::ACCALLOC_OK {
                                entry.2 -= 1;
                            }
                        }
                        4 if !pools.is_empty() => {
                            // Emptied, or slept and woken (made sleepable, paused with or without
                            // a backup, resumed, asked about any address): a paused pool refuses
                            // its allocations and keeps its books.
                            let entry = pools[pick % pools.len()];
                            match (arg >> 16) % 6 {
                                0 => ok_or_expected(accalloc_pool_empty_cache(entry.0, entry.1, (arg >> 19) as i32 & 1)),
                                1 => ok_or_expected(accalloc_pool_set_sleepable(entry.0, entry.1)),
                                2 => ok_or_expected(accalloc_pool_pause(entry.0, entry.1, (arg >> 19) as i32 & 1)),
                                3 => ok_or_expected(accalloc_pool_resume(entry.0, entry.1)),
                                4 => {
                                    let mut bytes = 0;
                                    ok_or_expected(accalloc_pool_paused_bytes(entry.0, entry.1, &mut bytes));
                                }
                                _ => {
                                    let p = live.get((arg >> 20) as usize % live.len().max(1)).map_or(arg as usize, |&p| p);
                                    let mut at = AccallocPoolId { first: 0, second: 0 };
                                    ok_or_expected(accalloc_pool_paused_at(device, p as *const c_void, (arg >> 24) as usize, &mut at));
                                }
                            }
                        }
                        7 if !pools.is_empty() => {
                            // A checkpoint of a pool, put back after the program moved on (a block
                            // freed or not), with room for what it frees or one short of it (then
                            // refused, nothing changed): the blocks it frees leave `live`, those it
                            // hands out again join it, never one that is live already.
                            let entry = pools[pick % pools.len()];
                            let mut checkpoint: *mut AccallocPoolCheckpoint = std::ptr::null_mut();
                            let status = accalloc_pool_checkpoint(entry.0, entry.1, &mut checkpoint);
                            ok_or_expected(status);
                            if status == AccallocStatus::ACCALLOC_OK {
                                if (arg >> 16) & 1 == 1 && !live.is_empty() {
                                    let p = live.swap_remove(pick % live.len());
                                    ok_or_expected(accalloc_free(p as *mut c_void));
                                }
                                let (mut now_live, mut held) = (0usize, 0usize);
                                ok_or_expected(accalloc_pool_live_allocations(entry.0, entry.1, std::ptr::null_mut(), 0, &mut now_live));
                                ok_or_expected(accalloc_pool_checkpoint_allocations(checkpoint, &mut held));
                                let mut freed = vec![std::ptr::null_mut(); now_live];
                                let (mut made, mut sizes) = (vec![std::ptr::null_mut(); held], vec![0usize; held]);
                                let room = now_live.saturating_sub(((arg >> 17) & 1) as usize);
                                let (mut freed_count, mut made_count) = (usize::MAX, usize::MAX);
                                let status = accalloc_pool_checkpoint_restore(checkpoint, freed.as_mut_ptr(), room, &mut freed_count, made.as_mut_ptr(), sizes.as_mut_ptr(), held, &mut made_count);
                                ok_or_expected(status);
                                if status == AccallocStatus::ACCALLOC_OK {
                                    for &p in &freed[..freed_count] {
                                        live.retain(|&q| q != p as usize);
                                    }
                                    for &p in &made[..made_count] {
                                        assert!(!live.contains(&(p as usize)), "a block handed out twice");
                                        live.push(p as usize);
                                    }
                                } else {
                                    assert_eq!((freed_count, made_count), (usize::MAX, usize::MAX), "a refusal wrote");
                                }
                                ok_or_expected(accalloc_pool_checkpoint_destroy(checkpoint));
                            }
                        }
                        5 => {
                            // A pool whose segments come from PyTorch's pluggable pair (the heap).
                            let mut id = AccallocPoolId { first: 0, second: 0 };
                            let status = accalloc_pool_create_with_functions(device, 0, (arg >> 17) as i32 & 1, Some(heap_alloc), Some(heap_free), &mut id);
                            remember_pool(&mut pools, status, device, id);
                        }
                        6 if !pools.is_empty() => {
                            // One more use, the flags, or a route by a filter (a capture or not).
                            let at = pick % pools.len();
                            let entry = &mut pools[at];
                            match (arg >> 16) % 3 {
                                0 => {
                                    let status = accalloc_pool_retain(entry.0, entry.1);
                                    ok_or_expected(status);
                                    if status == AccallocStatus::ACCALLOC_OK {
                                        entry.2 += 1;
                                    }
                                }
                                1 => ok_or_expected(accalloc_pool_set_flags(entry.0, entry.1, ((arg >> 20) % 3) as i32 - 1, (arg >> 22) as i32 & 1)),
                                _ => {
                                    let status = accalloc_pool_begin_filtered(entry.0, entry.1, Some(stream_one), std::ptr::null_mut(), None, (arg >> 20) as i32 & 1);
                                    ok_or_expected(status);
                                    if status == AccallocStatus::ACCALLOC_OK {
                                        assert!(!entry.3, "a begun pool was begun again");
                                        entry.2 += 1;
                                        entry.3 = true;
                                    }
                                }
                            }
                        }
                        _ => {
                            // Any other id (never one made above: those are {0, n}), any device.
                            let id = AccallocPoolId { first: (arg >> 32) | 1 << 63, second: arg & 0xff };
                            ok_or_expected(accalloc_pool_release(device, id));
                            ok_or_expected(accalloc_pool_end(device, id));
                            let (mut uses, mut segments) = (0, 0);
                            ok_or_expected(accalloc_pool_info(device, id, &mut uses, &mut segments));
                        }
                    }
                }
                14 => {
                    // Pinned host memory: any size (0 gives NULL), then a free of one held, twice.
                    let mut p: *mut c_void = std::ptr::null_mut();
                    let size = if arg % 7 == 0 { arg as usize } else { (arg % (4 << 20)) as usize };
                    let status = accalloc_host_malloc(&mut p, size);
                    ok_or_expected(status);
                    if status == AccallocStatus::ACCALLOC_OK && !p.is_null() {
                        assert!(!pinned_live.contains(&(p as usize)));
                        pinned_live.push(p as usize);
                    }
                    if (arg >> 32) % 2 == 1 && !pinned_live.is_empty() {
                        let p = pinned_live.swap_remove((arg >> 8) as usize % pinned_live.len());
                        assert_eq!(accalloc_host_free(p as *mut c_void), AccallocStatus::ACCALLOC_OK);
                        assert_eq!(accalloc_host_free(p as *mut c_void), AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
                    }
                }
                15 => {
                    // A stream's use of a pinned block (or of any address), the cache emptied, the
                    // statistics read and reset, an interior pointer freed.
                    let p = pinned_live.get(arg as usize % pinned_live.len().max(1)).map_or(arg as usize, |&p| p + (arg as usize >> 48) % 64);
                    let mut recorded = false;
                    ok_or_expected(accalloc_host_record_stream(p as *const c_void, device, ((arg >> 40) % 3) as usize as *mut c_void, &mut recorded));
                    let mut pinned = false;
                    ok_or_expected(accalloc_host_is_pinned(p as *const c_void, &mut pinned));
                    if pinned_live.contains(&p) {
                        assert!(pinned);
                    } else if !pinned {
                        // Not pinned memory: refused (NULL is a no-op).
                        let want = if p == 0 { AccallocStatus::ACCALLOC_OK } else { AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER };
                        assert_eq!(accalloc_host_free(p as *mut c_void), want);
                    }
                    ok_or_expected(accalloc_host_empty_cache());
                    let mut value = 0;
                    let key = CString::new(chunk.iter().skip(1).map(|&b| b.max(1)).collect::<Vec<u8>>()).unwrap();
                    ok_or_expected(accalloc_host_memory_stat(key.as_ptr(), &mut value));
                    ok_or_expected(accalloc_host_reset_peak_memory_stats());
                }
                0 | 1 | 2 => {
                    let size = match op % 3 {
                        0 => (arg % 4096) as usize,
                        1 => (arg % (64 << 20)) as usize,
                        _ => arg as usize, // anything, including sizes no device can hold
                    };
                    let mut p: *mut c_void = std::ptr::null_mut();
                    let status = accalloc_malloc(&mut p, size, device, ((arg >> 40) % 3) as usize as *mut c_void);
                    ok_or_expected(status);
                    if status == AccallocStatus::ACCALLOC_OK && !p.is_null() {
                        assert_eq!(p as usize % 512, 0);
                        live.push(p as usize);
                    }
                }
                3 if !live.is_empty() => {
                    let p = live.swap_remove(arg as usize % live.len());
                    assert_eq!(accalloc_free(p as *mut c_void), AccallocStatus::ACCALLOC_OK);
                    // A double free and an interior pointer are reported and change nothing.
                    assert_eq!(accalloc_free(p as *mut c_void), AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
                }
                4 => {
                    // Often an interior pointer of a live block, sometimes the start of a neighbour.
                    let p = match live.first() {
                        Some(&p) => p + 512 * (1 + arg as usize % 8),
                        None => arg as usize | 1,
                    };
                    let status = accalloc_free(p as *mut c_void);
                    match live.iter().position(|&q| q == p) {
                        Some(i) => {
                            assert_eq!(status, AccallocStatus::ACCALLOC_OK);
                            live.swap_remove(i);
                        }
                        None if p != 0 => assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER),
                        None => assert_eq!(status, AccallocStatus::ACCALLOC_OK),
                    }
                }
                5 if !live.is_empty() => {
                    let p = live[arg as usize % live.len()];
                    ok_or_expected(accalloc_record_stream(p as *mut c_void, (arg % 5) as usize as *mut c_void));
                    // A live block's size as memory_allocated counts it: whole 512-byte units.
                    let (mut size, mut at) = (0u64, -1i32);
                    let status = accalloc_allocation_info(p as *const c_void, &mut size, std::ptr::null_mut(), &mut at);
                    ok_or_expected(status);
                    if status == AccallocStatus::ACCALLOC_OK {
                        assert!(size >= 512 && size % 512 == 0 && at >= 0, "{size} on {at}");
                    }
                    let status = accalloc_allocation_info((p + 1) as *const c_void, &mut size, std::ptr::null_mut(), std::ptr::null_mut());
                    assert_ne!(status, AccallocStatus::ACCALLOC_OK);
                }
                6 => ok_or_expected(accalloc_empty_cache()),
                7 => ok_or_expected(accalloc_set_memory_fraction(f64::from_bits(arg), device)),
                8 => {
                    let key = CString::new(chunk.iter().skip(1).map(|&b| b.max(1)).collect::<Vec<u8>>()).unwrap();
                    let mut value = 0;
                    ok_or_expected(accalloc_memory_stat(device, key.as_ptr(), &mut value));
                    ok_or_expected(accalloc_memory_stat(device, std::ptr::null(), &mut value));
                }
                9 => {
                    let text = CString::new(chunk.iter().skip(1).map(|&b| b.max(1)).collect::<Vec<u8>>()).unwrap();
                    ok_or_expected(accalloc_set_allocator_settings(text.as_ptr()));
                }
                10 => {
                    ok_or_expected(accalloc_reset_peak_memory_stats(device));
                    ok_or_expected(accalloc_reset_accumulated_memory_stats(device));
                    ok_or_expected(accalloc_malloc(std::ptr::null_mut(), 64, device, std::ptr::null_mut()));
                }
                _ => {
                    let mut stats = AccallocDeviceStats { struct_size: (arg % 2048) as usize, ..Default::default() };
                    ok_or_expected(accalloc_get_device_stats(device, &mut stats));
                    let mut planner = AccallocPlannerStats { struct_size: (arg % 128) as usize, ..Default::default() };
                    ok_or_expected(accalloc_planner_stats(device, &mut planner));
                    ok_or_expected(accalloc_set_device(device));
                }
            }
        }
        for p in live {
            assert_eq!(accalloc_free(p as *mut c_void), AccallocStatus::ACCALLOC_OK);
        }
        // Every pool ended and released: freeable, so empty_cache below gives its segments back.
        for (device, id, uses, begun) in pools {
            if begun {
                assert_eq!(accalloc_pool_end(device, id), AccallocStatus::ACCALLOC_OK);
            }
            for _ in 0..uses {
                assert_eq!(accalloc_pool_release(device, id), AccallocStatus::ACCALLOC_OK);
            }
        }
        // The hostile backend turns honest once its answers are used up: every free then succeeds.
        for p in hostile_live {
            let mut status = accalloc_free(p as *mut c_void);
            while status == AccallocStatus::ACCALLOC_ERROR_BACKEND {
                status = accalloc_free(p as *mut c_void);
            }
            assert_eq!(status, AccallocStatus::ACCALLOC_OK);
        }
        for p in pinned_live {
            assert_eq!(accalloc_host_free(p as *mut c_void), AccallocStatus::ACCALLOC_OK);
        }
        // Every pinned block is reusable again (the host's events complete when recorded) and
        // goes back: nothing handed out, nothing held.
        assert_eq!(accalloc_host_empty_cache(), AccallocStatus::ACCALLOC_OK);
        for key in [c"active_requests.current", c"allocations.current", c"allocated_bytes.current"] {
            let mut value = -1;
            assert_eq!(accalloc_host_memory_stat(key.as_ptr(), &mut value), AccallocStatus::ACCALLOC_OK);
            assert_eq!(value, 0, "pinned books not back to zero: {key:?}");
        }
        LIES.lock().unwrap().clear();
        for device in 0..2 {
            let mut allocated = -1;
            assert_eq!(accalloc_memory_allocated_on(hostile, device, &mut allocated), AccallocStatus::ACCALLOC_OK);
            assert_eq!(allocated, 0, "hostile allocations lost on device {device}");
        }
        accalloc_set_allocator_settings_on(hostile, c"".as_ptr());
        accalloc_set_memory_fraction_on(hostile, 1.0, 0);
        accalloc_set_memory_fraction_on(hostile, 1.0, 1);
        while accalloc_empty_cache_on(hostile) == AccallocStatus::ACCALLOC_ERROR_BACKEND {}
        // Allow the pending (record_stream) blocks to return, then check nothing is left allocated,
        // and, the cache emptied, nothing reserved: every pool was freeable.
        assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
        for device in 0..2 {
            let mut allocated = -1;
            assert_eq!(accalloc_memory_allocated(device, &mut allocated), AccallocStatus::ACCALLOC_OK);
            assert_eq!(allocated, 0, "allocations lost on device {device}");
            let mut reserved = -1;
            assert_eq!(accalloc_memory_reserved(device, &mut reserved), AccallocStatus::ACCALLOC_OK);
            assert_eq!(reserved, 0, "segments left on device {device} (a pool not emptied?)");
        }
        accalloc_set_allocator_settings(c"".as_ptr());
        accalloc_empty_cache();
    }
});
