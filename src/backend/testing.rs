//! A backend for tests: fake addresses handed out in rising order, a fixed capacity, and counts of
//! every call. No memory is touched, so tests can model devices of any size.

use super::{Backend, BackendError, MemInfo, StreamId};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Where the fake address space starts; segments are laid out upwards, 2 MiB aligned, with gaps.
const BASE_ADDRESS: usize = 0x7f00_0000_0000;

#[derive(Default)]
struct State {
    next_address: usize,
    live: BTreeMap<usize, usize>,
    used: usize,
    allocs: usize,
    frees: usize,
    fail_next: usize,
}

/// A deterministic in-memory backend.
pub struct TestBackend {
    devices: usize,
    capacity: usize,
    state: Mutex<Vec<State>>,
}

impl TestBackend {
    /// `devices` devices of `capacity` bytes each.
    pub fn new(devices: usize, capacity: usize) -> Self {
        TestBackend {
            devices,
            capacity,
            state: Mutex::new((0..devices).map(|_| State::default()).collect()),
        }
    }

    /// Raw allocations served so far on `device`.
    pub fn alloc_calls(&self, device: usize) -> usize {
        self.state.lock().unwrap()[device].allocs
    }

    /// Raw frees served so far on `device`.
    pub fn free_calls(&self, device: usize) -> usize {
        self.state.lock().unwrap()[device].frees
    }

    /// Segments currently held on `device`, as (address, size).
    pub fn live_segments(&self, device: usize) -> Vec<(usize, usize)> {
        self.state.lock().unwrap()[device]
            .live
            .iter()
            .map(|(&a, &s)| (a, s))
            .collect()
    }

    /// Make the next `count` raw allocations on `device` fail with out of memory.
    pub fn fail_next_allocs(&self, device: usize, count: usize) {
        self.state.lock().unwrap()[device].fail_next = count;
    }
}

impl Backend for TestBackend {
    fn name(&self) -> &str {
        "test"
    }

    fn device_count(&self) -> usize {
        self.devices
    }

    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        _stream: StreamId,
    ) -> Result<usize, BackendError> {
        let mut states = self.state.lock().unwrap();
        let state = &mut states[device];
        if state.fail_next > 0 {
            state.fail_next -= 1;
            return Err(BackendError::OutOfMemory);
        }
        if state.used + size > self.capacity {
            return Err(BackendError::OutOfMemory);
        }
        let address = BASE_ADDRESS + (device << 40) + state.next_address;
        // Leave a 2 MiB gap so neighbouring segments never look contiguous.
        state.next_address += size.next_multiple_of(2 << 20) + (2 << 20);
        state.used += size;
        state.allocs += 1;
        state.live.insert(address, size);
        Ok(address)
    }

    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        let mut states = self.state.lock().unwrap();
        let state = &mut states[device];
        match state.live.remove(&ptr) {
            Some(held) if held == size => {
                state.used -= size;
                state.frees += 1;
                Ok(())
            }
            _ => Err(BackendError::Failed {
                code: 1,
                message: format!("free of unknown segment {ptr:#x} ({size} bytes)"),
            }),
        }
    }

    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        let used = self.state.lock().unwrap()[device].used;
        Ok(MemInfo {
            free: self.capacity - used,
            total: self.capacity,
        })
    }
}
