//! Segment and OOM observers with many threads at once on one device: the observer's view of the
//! live segments (what a network library would hold registered) never overlaps and always matches
//! the books; calls back into accalloc from inside are refused, not deadlocked; and once remove
//! returns, the observer is not running and never runs again.

mod common;
use accalloc::capi::memory::{accalloc_empty_cache, accalloc_free, accalloc_malloc};
use accalloc::capi::observers::*;
use accalloc::capi::AccallocStatus;
use common::stat;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const THREADS: usize = 4;
const ROUNDS: usize = 1_000;

/// The mock network library: device 0's registered ranges, and what went wrong.
static REGISTERED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
static PROBLEMS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static REFUSED_CALLS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn register(event: *const AccallocSegmentEvent, _user: *mut c_void) {
    let e = unsafe { &*event };
    if e.device != 0 {
        return;
    }
    let (address, size) = (e.address as usize, e.size);
    let mut registered = REGISTERED.lock().unwrap();
    let problem = match e.action {
        AccallocSegmentAction::ACCALLOC_SEGMENT_ALLOC
        | AccallocSegmentAction::ACCALLOC_SEGMENT_MAP => {
            let before = registered.range(..address + size).next_back();
            if before.is_some_and(|(&a, &s)| a + s > address) {
                Some(format!("{address:#x}+{size} overlaps a registered range"))
            } else {
                registered.insert(address, size);
                None
            }
        }
        _ => match registered.remove(&address) {
            Some(held) if held == size => None,
            other => Some(format!("{address:#x}+{size} deregistered, held {other:?}")),
        },
    };
    drop(registered);
    if let Some(problem) = problem {
        PROBLEMS.lock().unwrap().push(problem);
    }
    // The device is held: calling back for it is refused.
    let mut p = std::ptr::null_mut();
    if unsafe { accalloc_malloc(&mut p, 64, 0, std::ptr::null_mut()) }
        == AccallocStatus::ACCALLOC_ERROR_NOT_SUPPORTED
    {
        REFUSED_CALLS.fetch_add(1, Ordering::Relaxed);
    }
}

static SLOW_RUNNING: AtomicBool = AtomicBool::new(false);
static SLOW_CALLS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn slow(_event: *const AccallocSegmentEvent, _user: *mut c_void) {
    SLOW_RUNNING.store(true, Ordering::SeqCst);
    SLOW_CALLS.fetch_add(1, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    SLOW_RUNNING.store(false, Ordering::SeqCst);
}

static OOMS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn count_oom(_t: i32, _d: i64, _a: usize, _l: usize, _f: usize, _u: *mut c_void) {
    OOMS.fetch_add(1, Ordering::SeqCst);
}

fn add_segment_observer(observer: AccallocSegmentObserver) -> u64 {
    let mut handle = 0;
    let status =
        unsafe { accalloc_segment_observer_add(observer, std::ptr::null_mut(), &mut handle) };
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    handle
}

#[test]
fn observers_keep_a_network_librarys_view_exact_under_threads() {
    let handle = add_segment_observer(Some(register));
    let mut oom_handle = 0;
    assert_eq!(
        unsafe {
            accalloc_oom_observer_add(Some(count_oom), std::ptr::null_mut(), &mut oom_handle)
        },
        AccallocStatus::ACCALLOC_OK
    );
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                let mut state = t as u64 * 104729 + 7;
                for round in 0..ROUNDS {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let pick = (state >> 33) as usize;
                    if pick.is_multiple_of(3) && !mine.is_empty() {
                        let ptr = mine.swap_remove(pick % mine.len());
                        assert_eq!(unsafe { accalloc_free(ptr) }, AccallocStatus::ACCALLOC_OK);
                        continue;
                    }
                    // Small and large requests, now and then one no device holds.
                    let size = match pick % 17 {
                        0 => 1 << 40,
                        1..=4 => (pick % 24 + 1) << 20,
                        _ => pick % 100_000 + 1,
                    };
                    let mut p = std::ptr::null_mut();
                    let status = unsafe { accalloc_malloc(&mut p, size, 0, std::ptr::null_mut()) };
                    if status == AccallocStatus::ACCALLOC_OK {
                        mine.push(p);
                    }
                    if t == 0 && round.is_multiple_of(50) {
                        assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
                    }
                }
                for ptr in mine {
                    assert_eq!(unsafe { accalloc_free(ptr) }, AccallocStatus::ACCALLOC_OK);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(*PROBLEMS.lock().unwrap(), Vec::<String>::new());
    let registered: usize = REGISTERED.lock().unwrap().values().sum();
    assert_eq!(
        registered as i64,
        stat("reserved_bytes.all.current"),
        "the observer's view is the books' reserved memory"
    );
    assert!(OOMS.load(Ordering::SeqCst) > 0);
    assert_eq!(
        OOMS.load(Ordering::SeqCst) as i64,
        stat("num_ooms"),
        "every out-of-memory failure was told once"
    );
    assert!(REFUSED_CALLS.load(Ordering::Relaxed) > 0);
    assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
    assert!(REGISTERED.lock().unwrap().is_empty());
    assert_eq!(
        accalloc_segment_observer_remove(handle),
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(
        accalloc_oom_observer_remove(oom_handle),
        AccallocStatus::ACCALLOC_OK
    );

    // Removing waits for a call under way on another thread, and no call comes after.
    let slow_handle = add_segment_observer(Some(slow));
    let allocating = std::thread::spawn(|| {
        let mut p = std::ptr::null_mut();
        assert_eq!(
            unsafe { accalloc_malloc(&mut p, 3 << 20, 0, std::ptr::null_mut()) },
            AccallocStatus::ACCALLOC_OK
        );
        p as usize
    });
    while !SLOW_RUNNING.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    assert_eq!(
        accalloc_segment_observer_remove(slow_handle),
        AccallocStatus::ACCALLOC_OK
    );
    assert!(
        !SLOW_RUNNING.load(Ordering::SeqCst),
        "remove returned while the observer ran"
    );
    let p = allocating.join().unwrap();
    assert_eq!(
        unsafe { accalloc_free(p as *mut c_void) },
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
    assert_eq!(SLOW_CALLS.load(Ordering::SeqCst), 1);
}
