//! A free tries the device this thread last found an address range on before asking the segment
//! index (runtime/owner_guess.rs). The guess can go stale: here a segment goes back to the backend
//! and the same addresses come back as another device's. The free must still reach the new owner.

mod common;

use accalloc::backend::{Backend, BackendError, MemInfo, StreamId};
use accalloc::capi::AccallocStatus;
use accalloc::runtime::runtime;
use common::{free, malloc};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// Fake addresses (no memory is touched) far above user space.
const BASE: usize = common::FAR;
const SLOT: usize = 1 << 30;

/// Two devices sharing one address space: each segment gets the lowest free 1 GiB slot, so an
/// address given back is the next one handed out, to either device.
#[derive(Default)]
struct SharedAddresses {
    live: Mutex<BTreeSet<usize>>,
}

impl Backend for SharedAddresses {
    fn name(&self) -> &str {
        "shared_addresses"
    }
    fn device_count(&self) -> usize {
        2
    }
    fn raw_alloc(&self, _: usize, size: usize, _: StreamId) -> Result<usize, BackendError> {
        if size > SLOT {
            return Err(BackendError::OutOfMemory);
        }
        let mut live = self.live.lock().unwrap();
        let slot = (0..).find(|k| !live.contains(k)).unwrap();
        live.insert(slot);
        Ok(BASE + slot * SLOT)
    }
    fn raw_free(&self, _: usize, ptr: usize, _: usize) -> Result<(), BackendError> {
        self.live.lock().unwrap().remove(&((ptr - BASE) / SLOT));
        Ok(())
    }
    fn mem_get_info(&self, _: usize) -> Result<MemInfo, BackendError> {
        Ok(MemInfo {
            free: 16 * SLOT,
            total: 16 * SLOT,
        })
    }
    // No streams of its own: neither events nor stream synchronization, and no virtual memory.
    fn events_supported(&self) -> bool {
        false
    }
    fn stream_synchronize_supported(&self) -> bool {
        false
    }
    fn pinned_host_supported(&self) -> bool {
        false
    }
    fn copies_supported(&self) -> bool {
        false
    }

    fn vm_granularity(&self, _: usize) -> Option<usize> {
        None
    }
}

#[test]
fn a_stale_guess_gives_way_to_the_segment_index() {
    let runtime = runtime().unwrap();
    let t = runtime
        .register(Arc::new(SharedAddresses::default()))
        .unwrap();
    let accelerator = runtime.accelerator(t).unwrap();
    let allocated =
        |device: i32| accelerator.device_stats(device).unwrap().allocated_bytes[0].current;

    // Device 0's segment: freed twice from this thread, so the guess now names device 0.
    let first = malloc(Some(t), 0, 4096);
    assert_eq!(first, BASE);
    assert_eq!(free(first), AccallocStatus::ACCALLOC_OK);
    assert_eq!(malloc(Some(t), 0, 4096), first);
    assert_eq!(free(first), AccallocStatus::ACCALLOC_OK);

    // The segment goes back, and the same addresses become device 1's.
    accelerator.empty_cache().unwrap();
    let second = malloc(Some(t), 1, 4096);
    assert_eq!(second, first, "the backend reuses the address");
    assert_eq!((allocated(0), allocated(1)), (0, 4096));
    assert_eq!(free(second), AccallocStatus::ACCALLOC_OK);
    assert_eq!((allocated(0), allocated(1)), (0, 0));

    // A double free still reads as one, from the device that owns the range now.
    assert_eq!(free(second), AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
}
