//! Sleep and wake under threads on one host device: a sleeper pauses (with a backup) and resumes a
//! tag's pool over and over while other threads allocate and free outside it, and a watcher asks
//! which pool a pointer's memory is paused in. Every answer is consistent (a pointer of the tag is
//! paused exactly while the tag is, a pointer outside it never is), the tag's bytes survive every
//! pause, and the books balance at the end. The debug build recounts the books after every call.

mod common;
use common::stat;

use accalloc::capi::memory::{accalloc_empty_cache, accalloc_free, accalloc_malloc};
use accalloc::capi::pools::*;
use accalloc::capi::sleep::*;
use accalloc::capi::AccallocStatus;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const OK: AccallocStatus = AccallocStatus::ACCALLOC_OK;
const WORKERS: usize = 3;
const ROUNDS: usize = 2_000;
const TAG_BYTES: usize = 3 << 20;

fn paused_at(ptr: usize, size: usize) -> AccallocPoolId {
    let mut at = AccallocPoolId {
        first: 9,
        second: 9,
    };
    assert_eq!(
        unsafe { accalloc_pool_paused_at(0, ptr as *const c_void, size, &mut at) },
        OK
    );
    at
}

#[test]
fn pause_and_resume_while_other_threads_allocate_keep_the_books_and_the_bytes() {
    let mut tag = AccallocPoolId {
        first: 0,
        second: 0,
    };
    assert_eq!(unsafe { accalloc_pool_create(0, 0, 0, &mut tag) }, OK);
    assert_eq!(accalloc_pool_set_sleepable(0, tag), OK);
    assert_eq!(
        accalloc_pool_begin(0, tag, ACCALLOC_ROUTE_THREAD, std::ptr::null_mut()),
        OK
    );
    let mut weights: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        unsafe { accalloc_malloc(&mut weights, TAG_BYTES, 0, std::ptr::null_mut()) },
        OK
    );
    assert_eq!(accalloc_pool_end(0, tag), OK);
    assert_eq!(accalloc_pool_release(0, tag), OK);
    let weights = weights as usize;
    // SAFETY: TAG_BYTES of host memory just handed out.
    unsafe { std::ptr::write_bytes(weights as *mut u8, 0x5a, TAG_BYTES) };

    static DONE: AtomicBool = AtomicBool::new(false);
    static PAUSES: AtomicUsize = AtomicUsize::new(0);
    // Odd while the sleeper holds the tag paused (made odd after its pause, even before its
    // resume): a query that starts and ends on the same odd value ran while the tag was paused.
    static EPOCH: AtomicUsize = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for round in 0..200 {
                assert_eq!(accalloc_pool_pause(0, tag, (round % 2 == 0) as i32), OK);
                EPOCH.fetch_add(1, Ordering::SeqCst);
                PAUSES.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
                EPOCH.fetch_add(1, Ordering::SeqCst);
                assert_eq!(accalloc_pool_resume(0, tag), OK);
                if round % 2 == 0 {
                    // Resumed from the backup: the bytes are back.
                    let bytes =
                        unsafe { std::slice::from_raw_parts(weights as *const u8, TAG_BYTES) };
                    assert!(bytes.iter().all(|&b| b == 0x5a), "the backup came back");
                } else {
                    // No backup: undefined contents; write them again for the next round.
                    unsafe { std::ptr::write_bytes(weights as *mut u8, 0x5a, TAG_BYTES) };
                }
            }
            DONE.store(true, Ordering::SeqCst);
        });
        scope.spawn(|| {
            while !DONE.load(Ordering::SeqCst) {
                let before = EPOCH.load(Ordering::SeqCst);
                let at = paused_at(weights + 4096, 64);
                let after = EPOCH.load(Ordering::SeqCst);
                let named = (at.first, at.second) == (tag.first, tag.second);
                assert!(named || (at.first, at.second) == (0, 0));
                if before == after && before % 2 == 1 {
                    assert!(named, "asked while the sleeper held the tag paused");
                }
                std::thread::yield_now();
            }
        });
        for t in 0..WORKERS {
            scope.spawn(move || {
                let mut mine: Vec<usize> = Vec::new();
                let mut state = t as u64 * 7919 + 1;
                for _ in 0..ROUNDS {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let pick = (state >> 33) as usize;
                    if !pick.is_multiple_of(3) || mine.is_empty() {
                        let mut p: *mut c_void = std::ptr::null_mut();
                        let size = 1 + pick % (2 << 20);
                        let status =
                            unsafe { accalloc_malloc(&mut p, size, 0, std::ptr::null_mut()) };
                        assert_eq!(status, OK);
                        assert_eq!(
                            paused_at(p as usize, size),
                            AccallocPoolId {
                                first: 0,
                                second: 0
                            }
                        );
                        mine.push(p as usize);
                    } else {
                        let p = mine.swap_remove(pick % mine.len());
                        assert_eq!(unsafe { accalloc_free(p as *mut c_void) }, OK);
                    }
                }
                for p in mine {
                    assert_eq!(unsafe { accalloc_free(p as *mut c_void) }, OK);
                }
            });
        }
    });
    assert_eq!(PAUSES.load(Ordering::Relaxed), 200);
    assert_eq!(unsafe { accalloc_free(weights as *mut c_void) }, OK);
    assert_eq!(accalloc_pool_release(0, tag), OK);
    assert_eq!(accalloc_empty_cache(), OK);
    assert_eq!(stat("allocated_bytes.all.current"), 0);
    assert_eq!(
        stat("reserved_bytes.all.current"),
        0,
        "the tag's range went too"
    );
    assert_eq!(stat("num_device_alloc"), stat("num_device_free"));
}
