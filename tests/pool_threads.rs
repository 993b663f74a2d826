//! Private pools from many threads at once on one device: each thread routes its own allocations to a
//! pool of its own (use_mem_pool) while others allocate outside any pool, and puts back checkpoints
//! of its pool (as CUDA graph trees do); every block is handed out once, each pool's blocks stay in
//! its segments, and the books balance after.

mod common;
use accalloc::capi::memory::{accalloc_empty_cache, accalloc_free, accalloc_malloc};
use accalloc::capi::pool_checkpoint::*;
use accalloc::capi::pools::*;
use accalloc::capi::AccallocStatus;
use common::stat;
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Mutex;

const THREADS: usize = 6;
const ROUNDS: usize = 1_500;

#[test]
fn threads_in_and_out_of_pools_keep_exact_books() {
    static HELD: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
    *HELD.lock().unwrap() = Some(HashSet::new());
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let in_pool = t % 2 == 0;
                let mut pool = AccallocPoolId {
                    first: 0,
                    second: 0,
                };
                if in_pool {
                    assert_eq!(
                        unsafe { accalloc_pool_create(0, 0, (t % 4 == 0) as i32, &mut pool) },
                        AccallocStatus::ACCALLOC_OK
                    );
                }
                let mut mine: Vec<usize> = Vec::new();
                let mut checkpoint: *mut AccallocPoolCheckpoint = std::ptr::null_mut();
                let mut state = t as u64 * 7919 + 1;
                for round in 0..ROUNDS {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let pick = (state >> 33) as usize;
                    // Pool threads enter and leave their pool every 100 rounds, as code around
                    // use_mem_pool blocks would.
                    if in_pool && round % 100 == 0 {
                        let status = accalloc_pool_begin(
                            0,
                            pool,
                            ACCALLOC_ROUTE_THREAD,
                            std::ptr::null_mut(),
                        );
                        assert_eq!(status, AccallocStatus::ACCALLOC_OK);
                    }
                    if !pick.is_multiple_of(3) || mine.is_empty() {
                        let mut p: *mut c_void = std::ptr::null_mut();
                        let size = 1 + pick % (3 << 20);
                        let status =
                            unsafe { accalloc_malloc(&mut p, size, 0, std::ptr::null_mut()) };
                        assert_eq!(status, AccallocStatus::ACCALLOC_OK);
                        assert!(HELD.lock().unwrap().as_mut().unwrap().insert(p as usize));
                        mine.push(p as usize);
                    } else {
                        let p = mine.swap_remove(pick % mine.len());
                        HELD.lock().unwrap().as_mut().unwrap().remove(&p);
                        assert_eq!(
                            unsafe { accalloc_free(p as *mut c_void) },
                            AccallocStatus::ACCALLOC_OK
                        );
                    }
                    if in_pool && round % 100 == 40 {
                        assert_eq!(
                            unsafe { accalloc_pool_checkpoint(0, pool, &mut checkpoint) },
                            AccallocStatus::ACCALLOC_OK
                        );
                    }
                    if in_pool && round % 100 == 80 {
                        // The pool's blocks live now go, those live at the checkpoint come back:
                        // none of them anyone else's.
                        let restored = restore(checkpoint, pool);
                        let mut held = HELD.lock().unwrap();
                        let held = held.as_mut().unwrap();
                        for p in restored.0 {
                            assert!(held.remove(&p), "a freed block was this thread's");
                            mine.retain(|&q| q != p);
                        }
                        for p in restored.1 {
                            assert!(held.insert(p), "a restored block was live elsewhere");
                            mine.push(p);
                        }
                        unsafe { accalloc_pool_checkpoint_destroy(checkpoint) };
                    }
                    if in_pool && round % 100 == 99 {
                        assert_eq!(accalloc_pool_end(0, pool), AccallocStatus::ACCALLOC_OK);
                        assert_eq!(accalloc_pool_release(0, pool), AccallocStatus::ACCALLOC_OK);
                    }
                    if pick.is_multiple_of(211) {
                        assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
                    }
                }
                for p in mine {
                    HELD.lock().unwrap().as_mut().unwrap().remove(&p);
                    assert_eq!(
                        unsafe { accalloc_free(p as *mut c_void) },
                        AccallocStatus::ACCALLOC_OK
                    );
                }
                if in_pool {
                    let (mut uses, mut segments) = (0, 0);
                    unsafe { accalloc_pool_info(0, pool, &mut uses, &mut segments) };
                    assert_eq!(uses, 1, "created, and every begin released");
                    assert_eq!(accalloc_pool_release(0, pool), AccallocStatus::ACCALLOC_OK);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(accalloc_empty_cache(), AccallocStatus::ACCALLOC_OK);
    assert_eq!(stat("allocated_bytes.all.current"), 0);
    assert_eq!(
        stat("reserved_bytes.all.current"),
        0,
        "every pool freeable, emptied and gone"
    );
    assert_eq!(stat("segment.all.current"), 0);
    assert_eq!(stat("num_device_alloc"), stat("num_device_free"));
}

/// Put `checkpoint` back into `pool` of device 0: (the addresses freed, those handed out again).
fn restore(
    checkpoint: *mut AccallocPoolCheckpoint,
    pool: AccallocPoolId,
) -> (Vec<usize>, Vec<usize>) {
    let (mut live, mut held) = (0, 0);
    unsafe {
        accalloc_pool_live_allocations(0, pool, std::ptr::null_mut(), 0, &mut live);
        accalloc_pool_checkpoint_allocations(checkpoint, &mut held);
    }
    let mut freed = vec![std::ptr::null_mut(); live];
    let (mut made, mut sizes) = (vec![std::ptr::null_mut(); held], vec![0; held]);
    let (mut freed_count, mut made_count) = (0, 0);
    let status = unsafe {
        accalloc_pool_checkpoint_restore(
            checkpoint,
            freed.as_mut_ptr(),
            live,
            &mut freed_count,
            made.as_mut_ptr(),
            sizes.as_mut_ptr(),
            held,
            &mut made_count,
        )
    };
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    let addresses = |list: &[*mut c_void]| list.iter().map(|&p| p as usize).collect();
    (
        addresses(&freed[..freed_count]),
        addresses(&made[..made_count]),
    )
}
