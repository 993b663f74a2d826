//! Pinned host memory from many threads at once: allocations, frees, stream uses, empties and
//! statistics interleave, every block is handed to one holder at a time, and the books balance.

use accalloc::capi::pinned_host::{
    accalloc_host_empty_cache, accalloc_host_free, accalloc_host_is_pinned, accalloc_host_malloc,
    accalloc_host_memory_stat, accalloc_host_record_stream,
};
use accalloc::capi::AccallocStatus;
use std::collections::HashSet;
use std::ffi::{c_void, CStr};
use std::sync::Mutex;

/// More threads than this machine's two cores.
const THREADS: usize = 6;
const ROUNDS: usize = 2_000;

fn stat(key: &CStr) -> i64 {
    let mut value = -1;
    assert_eq!(
        unsafe { accalloc_host_memory_stat(key.as_ptr(), &mut value) },
        AccallocStatus::ACCALLOC_OK
    );
    value
}

#[test]
fn threads_share_the_pinned_cache_and_the_books_balance() {
    std::env::set_var("ACCALLOC_HOST_DEVICES", "2");
    // Every block handed out, by address: a block handed to two holders at once is a failure.
    static HELD: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
    *HELD.lock().unwrap() = Some(HashSet::new());
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let mut mine: Vec<(usize, usize)> = Vec::new();
                let mut state = t as u64 * 7919 + 1;
                for round in 0..ROUNDS {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let pick = (state >> 33) as usize;
                    if !pick.is_multiple_of(3) || mine.is_empty() {
                        let size = 1 + pick % 200_000;
                        let mut p: *mut c_void = std::ptr::null_mut();
                        let status = unsafe { accalloc_host_malloc(&mut p, size) };
                        assert_eq!(status, AccallocStatus::ACCALLOC_OK);
                        let p = p as usize;
                        assert!(
                            HELD.lock().unwrap().as_mut().unwrap().insert(p),
                            "{p:#x} handed out twice"
                        );
                        // The whole request is the holder's: write its ends.
                        unsafe {
                            *(p as *mut u8) = t as u8;
                            *((p + size - 1) as *mut u8) = round as u8;
                        }
                        mine.push((p, size));
                    } else {
                        let (p, size) = mine.swap_remove(pick % mine.len());
                        assert_eq!(
                            unsafe { *(p as *const u8) },
                            t as u8,
                            "another holder wrote here"
                        );
                        let mut pinned = false;
                        unsafe {
                            accalloc_host_is_pinned((p + size - 1) as *const c_void, &mut pinned)
                        };
                        assert!(pinned);
                        if pick.is_multiple_of(5) {
                            let mut recorded = false;
                            let stream = (1 + pick % 3) as *mut c_void;
                            let status = unsafe {
                                accalloc_host_record_stream(
                                    p as *const c_void,
                                    (pick % 2) as i32,
                                    stream,
                                    &mut recorded,
                                )
                            };
                            assert_eq!(status, AccallocStatus::ACCALLOC_OK);
                            assert!(recorded);
                        }
                        HELD.lock().unwrap().as_mut().unwrap().remove(&p);
                        assert_eq!(
                            unsafe { accalloc_host_free(p as *mut c_void) },
                            AccallocStatus::ACCALLOC_OK
                        );
                    }
                    if pick.is_multiple_of(97) {
                        assert_eq!(accalloc_host_empty_cache(), AccallocStatus::ACCALLOC_OK);
                        assert!(stat(c"active_requests.current") >= 0);
                    }
                }
                for (p, _) in mine {
                    HELD.lock().unwrap().as_mut().unwrap().remove(&p);
                    assert_eq!(
                        unsafe { accalloc_host_free(p as *mut c_void) },
                        AccallocStatus::ACCALLOC_OK
                    );
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    // The host's events complete when recorded: after an empty, nothing is active and nothing held.
    assert_eq!(accalloc_host_empty_cache(), AccallocStatus::ACCALLOC_OK);
    assert_eq!(stat(c"active_requests.current"), 0);
    assert_eq!(stat(c"allocations.current"), 0);
    assert_eq!(stat(c"allocated_bytes.current"), 0);
    assert_eq!(
        stat(c"active_requests.allocated"),
        stat(c"active_requests.freed")
    );
    assert_eq!(stat(c"num_host_alloc"), stat(c"num_host_free"));
    assert!(
        stat(c"num_host_alloc") < (THREADS * ROUNDS) as i64 / 2,
        "blocks were reused"
    );
}
