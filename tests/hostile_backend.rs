//! Backends registered through the C ABI that lie: device counts no process can hold, segments and
//! reservations that are NULL, misaligned, wrapping or overlapping another's, capacities near 2^64,
//! and callbacks that call back into accalloc for their own device type. Each lie is answered with a
//! status and a message naming the backend, whatever was handed out is handed back, and the books
//! stay exact (debug builds recount them after every operation). Nothing aborts or hangs.

use accalloc::capi::device::*;
use accalloc::capi::memory::*;
use accalloc::capi::settings::accalloc_set_allocator_settings_on;
use accalloc::capi::stats::{accalloc_memory_allocated_on, accalloc_memory_reserved_on};
use accalloc::capi::*;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_void, CString};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Mutex;

mod common;
use common::last_error;

const MIB: usize = 1 << 20;
const OK: AccallocStatus = AccallocStatus::ACCALLOC_OK;
const BACKEND: AccallocStatus = AccallocStatus::ACCALLOC_ERROR_BACKEND;

/// When a callback calls back into accalloc.
#[derive(Clone, Copy, PartialEq)]
enum Reenter {
    FromRawAlloc,
    FromMemGetInfo,
}

/// A fake accelerator whose answers the test chooses. Addresses are fake (nothing is touched).
struct Liar {
    devices: i32,
    total: u64,
    next: AtomicUsize,
    forced_alloc: Mutex<VecDeque<usize>>,
    forced_reserve: Mutex<VecDeque<usize>>,
    /// Segments and reservations handed out and not given back, by address.
    live: Mutex<BTreeMap<usize, usize>>,
    /// raw_free and vm_release calls.
    given_back: Mutex<Vec<(usize, usize)>>,
    reservations: AtomicUsize,
    reenter: Mutex<Option<Reenter>>,
    device_type: AtomicI32,
    /// What the calls back into accalloc got: (own type, host).
    reentry_answers: Mutex<Vec<(AccallocStatus, String, AccallocStatus)>>,
}

fn liar(base: usize, devices: i32, total: u64) -> &'static Liar {
    Box::leak(Box::new(Liar {
        devices,
        total,
        next: AtomicUsize::new(base),
        forced_alloc: Mutex::default(),
        forced_reserve: Mutex::default(),
        live: Mutex::default(),
        given_back: Mutex::default(),
        reservations: AtomicUsize::new(0),
        reenter: Mutex::new(None),
        device_type: AtomicI32::new(-1),
        reentry_answers: Mutex::default(),
    }))
}

unsafe fn of(ctx: *mut c_void) -> &'static Liar {
    &*(ctx as *const Liar)
}

impl Liar {
    fn hand_out(&self, forced: &Mutex<VecDeque<usize>>, size: usize) -> usize {
        let ptr = forced.lock().unwrap().pop_front().unwrap_or_else(|| {
            self.next
                .fetch_add(size.next_multiple_of(2 * MIB) + 2 * MIB, Ordering::Relaxed)
        });
        if ptr != 0 {
            self.live.lock().unwrap().insert(ptr, size);
        }
        ptr
    }

    fn give_back(&self, ptr: usize, size: usize) {
        self.given_back.lock().unwrap().push((ptr, size));
        self.live.lock().unwrap().remove(&ptr);
    }

    /// Call into accalloc for this backend's own type, and for the host, from inside a callback.
    fn maybe_reenter(&self, at: Reenter) {
        if *self.reenter.lock().unwrap() != Some(at) {
            return;
        }
        *self.reenter.lock().unwrap() = None;
        let own = self.device_type.load(Ordering::Relaxed);
        let mut p = null_mut();
        let mut value = 0;
        let status = unsafe {
            match at {
                Reenter::FromRawAlloc => accalloc_malloc_on(own, &mut p, 4096, 0, null_mut()),
                Reenter::FromMemGetInfo => accalloc_memory_allocated_on(own, 0, &mut value),
            }
        };
        let message = last_error();
        let mut host = null_mut();
        let host_status = unsafe {
            let status = accalloc_malloc_on(ACCALLOC_DEVICE_HOST, &mut host, 4096, 0, null_mut());
            assert_eq!(accalloc_free(host), OK);
            status
        };
        self.reentry_answers
            .lock()
            .unwrap()
            .push((status, message, host_status));
    }
}

unsafe extern "C" fn device_count(ctx: *mut c_void, out: *mut i32) -> i32 {
    *out = of(ctx).devices;
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn raw_alloc(
    ctx: *mut c_void,
    _device: i32,
    size: usize,
    _stream: *mut c_void,
    out: *mut *mut c_void,
) -> i32 {
    let liar = of(ctx);
    liar.maybe_reenter(Reenter::FromRawAlloc);
    *out = liar.hand_out(&liar.forced_alloc, size) as *mut c_void;
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn raw_free(
    ctx: *mut c_void,
    _device: i32,
    ptr: *mut c_void,
    size: usize,
) -> i32 {
    of(ctx).give_back(ptr as usize, size);
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn mem_get_info(
    ctx: *mut c_void,
    _device: i32,
    free: *mut u64,
    total: *mut u64,
) -> i32 {
    let liar = of(ctx);
    liar.maybe_reenter(Reenter::FromMemGetInfo);
    *free = liar.total;
    *total = liar.total;
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn vm_granularity(_ctx: *mut c_void, _device: i32, out: *mut usize) -> i32 {
    *out = 2 * MIB;
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn vm_reserve(
    ctx: *mut c_void,
    _device: i32,
    size: usize,
    out: *mut *mut c_void,
) -> i32 {
    let liar = of(ctx);
    liar.reservations.fetch_add(1, Ordering::Relaxed);
    *out = liar.hand_out(&liar.forced_reserve, size) as *mut c_void;
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn vm_map(
    _ctx: *mut c_void,
    _device: i32,
    _ptr: *mut c_void,
    _size: usize,
) -> i32 {
    ACCALLOC_BACKEND_OK
}

unsafe extern "C" fn vm_release(
    ctx: *mut c_void,
    _device: i32,
    ptr: *mut c_void,
    size: usize,
) -> i32 {
    of(ctx).give_back(ptr as usize, size);
    ACCALLOC_BACKEND_OK
}

fn table(liar: &'static Liar, virtual_memory: bool) -> AccallocBackendVTable {
    let vm = |f| if virtual_memory { Some(f) } else { None };
    AccallocBackendVTable {
        struct_size: std::mem::size_of::<AccallocBackendVTable>(),
        context: liar as *const Liar as *mut c_void,
        device_count: Some(device_count),
        raw_alloc: Some(raw_alloc),
        raw_free: Some(raw_free),
        mem_get_info: Some(mem_get_info),
        event_create: None,
        event_record: None,
        event_query: None,
        event_synchronize: None,
        event_destroy: None,
        stream_synchronize: None,
        vm_granularity: if virtual_memory {
            Some(vm_granularity)
        } else {
            None
        },
        vm_reserve: if virtual_memory {
            Some(vm_reserve)
        } else {
            None
        },
        vm_map: vm(vm_map as unsafe extern "C" fn(_, _, _, _) -> i32),
        vm_unmap: vm(vm_map as unsafe extern "C" fn(_, _, _, _) -> i32),
        vm_release: vm(vm_release as unsafe extern "C" fn(_, _, _, _) -> i32),
        host_alloc: None,
        host_free: None,
        copy_to_host: None,
        copy_from_host: None,
    }
}

fn register(name: &str, liar: &'static Liar, virtual_memory: bool) -> AccallocDeviceType {
    let name = CString::new(name).unwrap();
    let mut device_type = -1;
    let status = unsafe {
        accalloc_register_backend(
            name.as_ptr(),
            &table(liar, virtual_memory),
            &mut device_type,
        )
    };
    assert_eq!(status, OK, "{}", last_error());
    liar.device_type.store(device_type, Ordering::Relaxed);
    device_type
}

fn malloc(device_type: AccallocDeviceType, size: usize) -> (AccallocStatus, usize) {
    let mut p = null_mut();
    let status = unsafe { accalloc_malloc_on(device_type, &mut p, size, 0, null_mut()) };
    (status, p as usize)
}

fn reserved(device_type: AccallocDeviceType) -> i64 {
    let mut value = -1;
    assert_eq!(
        unsafe { accalloc_memory_reserved_on(device_type, 0, &mut value) },
        OK
    );
    value
}

/// Free, empty the cache, and check the backend holds nothing.
fn finish(device_type: AccallocDeviceType, liar: &Liar, live: &[usize]) {
    for &p in live {
        assert_eq!(
            unsafe { accalloc_free(p as *mut c_void) },
            OK,
            "{}",
            last_error()
        );
    }
    assert_eq!(accalloc_empty_cache_on(device_type), OK, "{}", last_error());
    assert_eq!(reserved(device_type), 0);
    assert_eq!(
        *liar.live.lock().unwrap(),
        BTreeMap::new(),
        "everything went back"
    );
}

/// Each test's fake addresses lie in a region of their own, far from real mappings.
fn region(k: usize) -> usize {
    (16 + k) << 44
}

#[test]
fn device_counts_no_process_can_hold_are_refused_at_registration() {
    for (i, count) in [i32::MAX, 1_000_000, 1025, 0, -5].into_iter().enumerate() {
        let liar = liar(region(0), count, 1 << 30);
        let name = CString::new(format!("manydevices{i}")).unwrap();
        let mut device_type = -1;
        let status = unsafe {
            accalloc_register_backend(name.as_ptr(), &table(liar, false), &mut device_type)
        };
        assert_eq!(
            status,
            AccallocStatus::ACCALLOC_ERROR_INVALID_ARGUMENT,
            "{count}"
        );
        assert!(
            last_error().contains(&format!("{count} device(s); 1 to 1024 are supported")),
            "{}",
            last_error()
        );
        assert_eq!(device_type, -1);
    }
    // 1024 devices are fine, and cost nothing until used.
    let liar = liar(region(1), 1024, 1 << 30);
    let device_type = register("widebackend", liar, false);
    let mut count = 0;
    assert_eq!(
        unsafe { accalloc_device_count_on(device_type, &mut count) },
        OK
    );
    assert_eq!(count, 1024);
    let mut p = null_mut();
    assert_eq!(
        unsafe { accalloc_malloc_on(device_type, &mut p, 1000, 1023, null_mut()) },
        OK
    );
    assert_eq!(unsafe { accalloc_free(p) }, OK);
}

#[test]
fn null_and_misaligned_segments_are_refused_and_handed_back() {
    let liar = liar(region(2), 1, 1 << 30);
    let t = register("misaligned", liar, false);
    let base = region(2) + (64 << 30);
    liar.forced_alloc.lock().unwrap().extend([base + 8, 0]);
    assert_eq!(malloc(t, 1000).0, BACKEND);
    assert!(last_error().starts_with("misaligned backend: raw_alloc on device 0 failed"));
    assert!(last_error().contains("not a 512-byte aligned address; accalloc handed it back"));
    assert_eq!(
        *liar.given_back.lock().unwrap(),
        vec![(base + 8, 2 * MIB)],
        "no 2 MiB leak"
    );
    assert_eq!(malloc(t, 1000).0, BACKEND);
    assert!(
        last_error().contains("NULL with success"),
        "{}",
        last_error()
    );
    assert_eq!(reserved(t), 0);
    let (status, p) = malloc(t, 1000);
    assert_eq!(status, OK);
    assert_eq!(reserved(t), 2 * MIB as i64);
    finish(t, liar, &[p]);
}

#[test]
fn reservations_are_checked_as_segments_are() {
    let liar = liar(region(3), 1, 1 << 30);
    let t = register("badreserve", liar, true);
    let conf = CString::new("expandable_segments:True").unwrap();
    assert_eq!(
        unsafe { accalloc_set_allocator_settings_on(t, conf.as_ptr()) },
        OK
    );
    liar.forced_reserve.lock().unwrap().extend([0, 0x12345]);
    assert_eq!(malloc(t, 1000).0, BACKEND);
    assert!(last_error().starts_with("badreserve backend: vm_reserve on device 0 failed"));
    assert!(
        last_error().contains("NULL with success"),
        "{}",
        last_error()
    );
    assert_eq!(malloc(t, 1000).0, BACKEND);
    assert!(
        last_error().contains("returned 0x12345"),
        "{}",
        last_error()
    );
    assert!(
        last_error().contains("not a 2097152-byte aligned address"),
        "{}",
        last_error()
    );
    let reserve = liar.given_back.lock().unwrap().clone();
    assert_eq!(reserve.len(), 1);
    assert_eq!(
        reserve[0].0, 0x12345,
        "the misaligned reservation was released"
    );
    let (status, p) = malloc(t, 1000);
    assert_eq!(status, OK, "{}", last_error());
    assert_eq!(p % 512, 0);
    finish(t, liar, &[p]);
}

#[test]
fn overlapping_and_wrapping_segments_are_refused_and_handed_back() {
    let liar = liar(region(4), 1, 1 << 30);
    let t = register("overlapping", liar, false);
    let (status, first) = malloc(t, 1000);
    assert_eq!(status, OK);
    // The same range again, for a 5 MiB request's 20 MiB segment.
    liar.forced_alloc.lock().unwrap().push_back(first);
    assert_eq!(malloc(t, 5 * MIB).0, BACKEND);
    assert!(last_error().starts_with("overlapping backend: raw_alloc on device 0 failed"));
    assert!(
        last_error().contains("overlapping one already held"),
        "{}",
        last_error()
    );
    assert_eq!(
        liar.given_back.lock().unwrap().last(),
        Some(&(first, 20 * MIB))
    );
    // A range inside one of the host's segments: refused, and the host's pointer stays the host's.
    let mut host = null_mut();
    assert_eq!(
        unsafe { accalloc_malloc_on(ACCALLOC_DEVICE_HOST, &mut host, 1000, 0, null_mut()) },
        OK
    );
    liar.forced_alloc.lock().unwrap().push_back(host as usize);
    assert_eq!(malloc(t, 5 * MIB).0, BACKEND);
    assert!(
        last_error().contains("of device type 0 device 0"),
        "{}",
        last_error()
    );
    assert_eq!(unsafe { accalloc_free(host) }, OK, "{}", last_error());
    // A range running past the end of the address space.
    let top = 0usize.wrapping_sub(2 * MIB);
    liar.forced_alloc.lock().unwrap().push_back(top);
    assert_eq!(malloc(t, 5 * MIB).0, BACKEND);
    assert!(last_error().contains("wraps around"), "{}", last_error());
    assert_eq!(
        liar.given_back.lock().unwrap().last(),
        Some(&(top, 20 * MIB))
    );
    // The books hold only the first segment.
    assert_eq!(reserved(t), 2 * MIB as i64);
    let (status, second) = malloc(t, 5 * MIB);
    assert_eq!(status, OK);
    finish(t, liar, &[first, second]);
}

#[test]
fn capacities_near_two_to_the_64_are_checked() {
    // 2^62 bytes with expandable segments: no reservation that large; ordinary segments instead.
    let liar_a = liar(region(5), 1, 1 << 62);
    let t = register("hugevm", liar_a, true);
    let conf = CString::new("expandable_segments:True").unwrap();
    assert_eq!(
        unsafe { accalloc_set_allocator_settings_on(t, conf.as_ptr()) },
        OK
    );
    let (status, p) = malloc(t, MIB);
    assert_eq!(status, OK, "{}", last_error());
    assert_eq!(liar_a.reservations.load(Ordering::Relaxed), 0);
    finish(t, liar_a, &[p]);

    // UINT64_MAX bytes with a memory fraction: sums are checked, the device stays usable.
    let liar_b = liar(1 << 63, 1, u64::MAX);
    let t = register("hugetotal", liar_b, false);
    assert_eq!(accalloc_set_memory_fraction_on(t, 0.5, 0), OK);
    let (status, small) = malloc(t, 4096);
    assert_eq!(status, OK);
    for size in [usize::MAX - 4 * MIB, 1 << 63] {
        assert_eq!(
            malloc(t, size).0,
            AccallocStatus::ACCALLOC_ERROR_OUT_OF_MEMORY,
            "{size}"
        );
    }
    // No limit: segments of 2^61 bytes each, until the device would hold more than isize::MAX.
    assert_eq!(accalloc_set_memory_fraction_on(t, 1.0, 0), OK);
    let mut live = vec![small];
    for _ in 0..3 {
        let (status, p) = malloc(t, 1 << 61);
        assert_eq!(status, OK, "{}", last_error());
        live.push(p);
    }
    assert_eq!(
        malloc(t, 1 << 61).0,
        AccallocStatus::ACCALLOC_ERROR_OUT_OF_MEMORY
    );
    assert!(
        last_error().contains("hugetotal out of memory"),
        "{}",
        last_error()
    );
    // Reusing a cached 2^61-byte block over and over: the running totals pass i64::MAX and saturate.
    let mut block = live.pop().unwrap();
    for _ in 0..6 {
        assert_eq!(unsafe { accalloc_free(block as *mut c_void) }, OK);
        let (status, again) = malloc(t, 1 << 61);
        assert_eq!(status, OK, "{}", last_error());
        assert_eq!(again, block, "served from the cache");
        block = again;
    }
    live.push(block);
    let (status, p) = malloc(t, 4096);
    assert_eq!(status, OK, "{}", last_error());
    live.push(p);
    finish(t, liar_b, &live);
}

#[test]
fn callbacks_calling_back_for_their_own_device_type_are_refused() {
    for (k, at) in [Reenter::FromRawAlloc, Reenter::FromMemGetInfo]
        .into_iter()
        .enumerate()
    {
        let liar = liar(region(6 + k), 1, 1 << 30);
        *liar.reenter.lock().unwrap() = Some(at);
        let t = register(&format!("reentrant{k}"), liar, false);
        let (status, p) = malloc(t, 1000);
        assert_eq!(status, OK, "{}", last_error());
        let answers = liar.reentry_answers.lock().unwrap().clone();
        assert_eq!(answers.len(), 1, "the callback ran once");
        let (own, message, host) = &answers[0];
        assert_eq!(*own, AccallocStatus::ACCALLOC_ERROR_NOT_SUPPORTED);
        let call = if at == Reenter::FromRawAlloc {
            "raw_alloc"
        } else {
            "mem_get_info"
        };
        assert!(
            message.contains(&format!("from inside that backend's own {call} callback")),
            "{message}"
        );
        assert_eq!(*host, OK, "calls for another device type are allowed");
        // Nothing was left marked: the same thread calls for this type normally afterwards.
        let (status, q) = malloc(t, 1000);
        assert_eq!(status, OK, "{}", last_error());
        finish(t, liar, &[p, q]);
    }
}
