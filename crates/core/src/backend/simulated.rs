//! The simulated device: fake addresses handed out in rising order, a fixed capacity, counts of every
//! call, and events that complete only when the caller says so. No memory is touched, so it models
//! devices of any size: the tests' backend, and the device the tools replay on (`replay --simulate`,
//! `tune`, `compare`), where figures must not depend on the machine.

use super::{Backend, BackendError, EventId, MemInfo, PinnedHostAllocation, StreamId};
use std::collections::{BTreeMap, HashMap};
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
    next_reservation: usize,
    /// Mapped pages of reservations: address -> size.
    mapped: BTreeMap<usize, usize>,
    /// Reservations held: address -> size.
    reservations: BTreeMap<usize, usize>,
}

impl State {
    /// Whether `size` more bytes may be had: not when a failure is due or there is no room.
    fn check_room(&mut self, size: usize, capacity: usize) -> Result<(), BackendError> {
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return Err(BackendError::OutOfMemory);
        }
        if self.used + size > capacity {
            return Err(BackendError::OutOfMemory);
        }
        Ok(())
    }
}

/// Where pinned host memory starts, apart from every device's segments and reservations.
const PINNED_HOST_BASE: usize = 0x7000_0000_0000;

/// Where reservations start, far above segments.
const RESERVATION_OFFSET: usize = 1 << 39;

/// An event: the stream it was recorded on, and whether it has completed.
#[derive(Clone, Copy, Default)]
struct EventState {
    stream: Option<StreamId>,
    completed: bool,
}

/// A deterministic in-memory backend.
pub struct SimulatedBackend {
    devices: usize,
    capacity: usize,
    /// Virtual-memory granularity; None: no virtual memory.
    granularity: Option<usize>,
    state: Mutex<Vec<State>>,
    events: Mutex<(EventId, HashMap<EventId, EventState>)>,
    /// Calls made to fail, by name: (successes still to let through first, failures then).
    failing_calls: Mutex<HashMap<&'static str, (usize, usize)>>,
    /// Whether synchronize_stream is provided (as a backend without it would not).
    stream_sync: bool,
    /// Whether the event functions are provided.
    events_on: bool,
    /// Pinned host memory handed out and not yet freed: address -> size; and the next address.
    pinned: Mutex<(usize, BTreeMap<usize, usize>)>,
    /// Added to every segment and reservation address (see `elsewhere`).
    offset: usize,
}

impl SimulatedBackend {
    /// `devices` devices of `capacity` bytes each.
    pub fn new(devices: usize, capacity: usize) -> Self {
        SimulatedBackend {
            devices,
            capacity,
            granularity: Some(2 << 20),
            state: Mutex::new((0..devices).map(|_| State::default()).collect()),
            events: Mutex::new((1, HashMap::new())),
            failing_calls: Mutex::new(HashMap::new()),
            stream_sync: true,
            events_on: true,
            pinned: Mutex::new((PINNED_HOST_BASE, BTreeMap::new())),
            offset: 0,
        }
    }

    /// The same backend handing out addresses `offset` bytes higher: a second source of memory
    /// (a private pool's own allocator, say) whose ranges never meet the first's.
    pub fn elsewhere(mut self, offset: usize) -> Self {
        self.offset = offset;
        self
    }

    /// The same without events: blocks used by other streams are handled by stream_synchronize.
    pub fn without_events(devices: usize, capacity: usize) -> Self {
        SimulatedBackend {
            events_on: false,
            ..Self::new(devices, capacity)
        }
    }

    /// Make the next `times` calls of `call` fail with an error: "create_event", "record_event",
    /// "query_event", "synchronize_event", "destroy_event", "stream_synchronize", "raw_free",
    /// "vm_map", "vm_unmap", "vm_release", "pinned_host_alloc" (which then fails as out of memory) or
    /// "pinned_host_free".
    pub fn fail_calls(&self, call: &'static str, times: usize) {
        self.fail_calls_after(call, 0, times);
    }

    /// The same, after `successes` more calls of `call` succeed.
    pub fn fail_calls_after(&self, call: &'static str, successes: usize, times: usize) {
        self.failing_calls
            .lock()
            .unwrap()
            .insert(call, (successes, times));
    }

    /// Pinned host allocations held (pinned_host_alloc'd and not freed): address -> size.
    pub fn live_pinned_host(&self) -> Vec<(usize, usize)> {
        self.pinned
            .lock()
            .unwrap()
            .1
            .iter()
            .map(|(&a, &s)| (a, s))
            .collect()
    }

    /// Reservations held on `device` (vm_reserve'd and not released).
    pub fn live_reservations(&self, device: usize) -> usize {
        self.state.lock().unwrap()[device].reservations.len()
    }

    /// Err unless [ptr, ptr + size) lies in one segment or in mapped pages of `device`.
    fn check_held(
        &self,
        device: usize,
        ptr: usize,
        size: usize,
        call: &str,
    ) -> Result<(), BackendError> {
        let states = self.state.lock().unwrap();
        let state = &states[device];
        let in_segment = state
            .live
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&a, &s)| ptr + size <= a + s);
        let mut covered = ptr;
        for (&a, &s) in state.mapped.range(..ptr + size) {
            if a <= covered && covered < a + s {
                covered = a + s;
            }
        }
        if in_segment || covered >= ptr + size {
            return Ok(());
        }
        Err(BackendError::Failed {
            code: 5,
            message: format!("{call}: {ptr:#x}+{size} is not memory of device {device}"),
        })
    }

    /// Err when a failure of `call` is due.
    fn injected(&self, call: &'static str) -> Result<(), BackendError> {
        let mut failing = self.failing_calls.lock().unwrap();
        match failing.get_mut(call) {
            Some((skip, _)) if *skip > 0 => {
                *skip -= 1;
                Ok(())
            }
            Some((_, left)) if *left > 0 => {
                *left -= 1;
                Err(BackendError::Failed {
                    code: 9,
                    message: format!("{call} failed (injected)"),
                })
            }
            _ => Ok(()),
        }
    }

    /// Complete every event recorded so far on `stream`, as if its queued work had finished.
    pub fn complete_stream(&self, stream: StreamId) {
        let mut events = self.events.lock().unwrap();
        for event in events.1.values_mut().filter(|e| e.stream == Some(stream)) {
            event.completed = true;
        }
    }

    /// Events created and not yet destroyed.
    pub fn live_events(&self) -> usize {
        self.events.lock().unwrap().1.len()
    }

    /// The same without virtual memory (expandable segments fall back to ordinary ones).
    pub fn without_virtual_memory(devices: usize, capacity: usize) -> Self {
        SimulatedBackend {
            granularity: None,
            ..Self::new(devices, capacity)
        }
    }

    /// Bytes mapped in reservations on `device`.
    pub fn mapped_bytes(&self, device: usize) -> usize {
        self.state.lock().unwrap()[device].mapped.values().sum()
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

impl Backend for SimulatedBackend {
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
        state.check_room(size, self.capacity)?;
        let address = BASE_ADDRESS + self.offset + (device << 40) + state.next_address;
        // Leave a 2 MiB gap so neighbouring segments never look contiguous.
        state.next_address += size.next_multiple_of(2 << 20) + (2 << 20);
        state.used += size;
        state.allocs += 1;
        state.live.insert(address, size);
        Ok(address)
    }

    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.injected("raw_free")?;
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

    fn vm_granularity(&self, _device: usize) -> Option<usize> {
        self.granularity
    }

    fn vm_reserve(&self, device: usize, size: usize) -> Result<usize, BackendError> {
        let mut states = self.state.lock().unwrap();
        let state = &mut states[device];
        let address = BASE_ADDRESS
            + self.offset
            + (device << 40)
            + RESERVATION_OFFSET
            + state.next_reservation;
        state.next_reservation += size.next_multiple_of(2 << 20) + (2 << 20);
        state.reservations.insert(address, size);
        Ok(address)
    }

    fn vm_map(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.injected("vm_map")?;
        let mut states = self.state.lock().unwrap();
        let state = &mut states[device];
        state.check_room(size, self.capacity)?;
        if state.mapped.range(ptr..ptr + size).next().is_some() {
            return Err(BackendError::Failed {
                code: 3,
                message: format!("{ptr:#x} is mapped already"),
            });
        }
        state.used += size;
        state.mapped.insert(ptr, size);
        Ok(())
    }

    fn vm_unmap(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.injected("vm_unmap")?;
        let mut states = self.state.lock().unwrap();
        let state = &mut states[device];
        // Unmap whole mappings covering exactly [ptr, ptr + size).
        let covered: Vec<(usize, usize)> = state
            .mapped
            .range(ptr..ptr + size)
            .map(|(&a, &s)| (a, s))
            .collect();
        let total: usize = covered.iter().map(|&(_, s)| s).sum();
        if total != size || covered.iter().any(|&(a, s)| a + s > ptr + size) {
            return Err(BackendError::Failed {
                code: 4,
                message: format!("{ptr:#x}+{size} is not mapped"),
            });
        }
        for (address, bytes) in covered {
            state.mapped.remove(&address);
            state.used -= bytes;
        }
        Ok(())
    }

    fn vm_release(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.injected("vm_release")?;
        let mut states = self.state.lock().unwrap();
        if states[device]
            .mapped
            .range(ptr..ptr + size)
            .next()
            .is_some()
        {
            return Err(BackendError::Failed {
                code: 5,
                message: "release of a mapped reservation".into(),
            });
        }
        if states[device].reservations.remove(&ptr) != Some(size) {
            return Err(BackendError::Failed {
                code: 6,
                message: format!("release of an unknown reservation {ptr:#x}+{size}"),
            });
        }
        Ok(())
    }

    fn pinned_host_supported(&self) -> bool {
        true
    }

    fn copies_supported(&self) -> bool {
        true
    }

    // The simulated device holds no bytes: a copy checks that the device range is memory the device
    // holds (a segment, or mapped pages), and counts.
    fn copy_to_host(
        &self,
        device: usize,
        _dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        self.injected("copy_to_host")?;
        self.check_held(device, src, size, "copy_to_host")
    }

    fn copy_from_host(
        &self,
        device: usize,
        dst: usize,
        _src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        self.injected("copy_from_host")?;
        self.check_held(device, dst, size, "copy_from_host")
    }

    fn pinned_host_alloc(&self, size: usize) -> Result<PinnedHostAllocation, BackendError> {
        if self.injected("pinned_host_alloc").is_err() {
            return Err(BackendError::OutOfMemory);
        }
        let mut pinned = self.pinned.lock().unwrap();
        let ptr = pinned.0;
        // Rounded to pages, with a page between allocations, so none ever looks contiguous.
        pinned.0 += size.next_multiple_of(4096) + 4096;
        pinned.1.insert(ptr, size);
        Ok(PinnedHostAllocation {
            ptr,
            page_locked: true,
        })
    }

    fn pinned_host_free(&self, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.injected("pinned_host_free")?;
        let mut pinned = self.pinned.lock().unwrap();
        if pinned.1.get(&ptr) != Some(&size) {
            return Err(BackendError::Failed {
                code: 7,
                message: format!("pinned_host_free of an unknown allocation {ptr:#x}+{size}"),
            });
        }
        pinned.1.remove(&ptr);
        Ok(())
    }

    fn events_supported(&self) -> bool {
        self.events_on
    }

    fn stream_synchronize_supported(&self) -> bool {
        self.stream_sync
    }

    fn synchronize_stream(&self, _device: usize, stream: StreamId) -> Result<(), BackendError> {
        self.injected("stream_synchronize")?;
        self.complete_stream(stream);
        Ok(())
    }

    fn create_event(&self, _device: usize) -> Result<EventId, BackendError> {
        self.injected("create_event")?;
        let mut events = self.events.lock().unwrap();
        let id = events.0;
        events.0 += 1;
        events.1.insert(id, EventState::default());
        Ok(id)
    }

    fn record_event(
        &self,
        _device: usize,
        event: EventId,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.injected("record_event")?;
        let mut events = self.events.lock().unwrap();
        let state = events
            .1
            .get_mut(&event)
            .ok_or_else(|| unknown_event(event))?;
        *state = EventState {
            stream: Some(stream),
            completed: false,
        };
        Ok(())
    }

    fn query_event(&self, _device: usize, event: EventId) -> Result<bool, BackendError> {
        self.injected("query_event")?;
        let events = self.events.lock().unwrap();
        Ok(events
            .1
            .get(&event)
            .ok_or_else(|| unknown_event(event))?
            .completed)
    }

    fn synchronize_event(&self, _device: usize, event: EventId) -> Result<(), BackendError> {
        self.injected("synchronize_event")?;
        let mut events = self.events.lock().unwrap();
        events
            .1
            .get_mut(&event)
            .ok_or_else(|| unknown_event(event))?
            .completed = true;
        Ok(())
    }

    fn destroy_event(&self, _device: usize, event: EventId) -> Result<(), BackendError> {
        self.injected("destroy_event")?;
        let mut events = self.events.lock().unwrap();
        events
            .1
            .remove(&event)
            .map(|_| ())
            .ok_or_else(|| unknown_event(event))
    }
}

fn unknown_event(event: EventId) -> BackendError {
    BackendError::Failed {
        code: 2,
        message: format!("unknown event {event}"),
    }
}
