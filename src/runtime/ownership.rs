//! Which device owns an address. `accalloc_free` gets only a pointer; this index of every segment held from
//! any backend answers "whose is it?" without locking any device.

use super::reentry::CallbackScope;
use crate::backend::{Backend, BackendError, StreamId};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The owner of a segment: (device type, device index).
pub type Owner = (i32, usize);

/// Address ranges of all live segments, by start address.
pub struct SegmentIndex {
    ranges: spin::RwLock<Ranges>,
    /// Called under the index's lock when a second device's segment is recorded, before that
    /// segment can hold a block (the runtime gives its one-device shortcut up there).
    on_several_owners: fn(),
}

impl Default for SegmentIndex {
    /// An index that tells nobody when a second device's segment comes.
    fn default() -> Self {
        SegmentIndex::new(|| {})
    }
}

#[derive(Default)]
struct Ranges {
    by_start: BTreeMap<usize, (usize, Owner)>,
    /// Who has held segments so far.
    owners: Owners,
}

/// Whether every segment ever recorded was one device's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Owners {
    #[default]
    None,
    One(Owner),
    Several,
}

impl SegmentIndex {
    /// An empty index that calls `on_several_owners` when a second device's segment is recorded.
    pub fn new(on_several_owners: fn()) -> Self {
        SegmentIndex {
            ranges: spin::RwLock::new(Ranges::default()),
            on_several_owners,
        }
    }

    /// The device whose segment contains `ptr`.
    pub fn owner_of(&self, ptr: usize) -> Option<Owner> {
        self.segment_of(ptr).map(|(_, _, owner)| owner)
    }

    /// The segment containing `ptr`: (start, end, owner).
    pub fn segment_of(&self, ptr: usize) -> Option<(usize, usize, Owner)> {
        let ranges = self.ranges.read();
        let (&start, &(end, owner)) = ranges.by_start.range(..=ptr).next_back()?;
        (ptr < end).then_some((start, end, owner))
    }

    /// Who has held segments so far: nobody, one device, or several (for good).
    pub fn owners(&self) -> Owners {
        self.ranges.read().owners
    }

    /// Record [start, start + size) as `owner`'s, unless it wraps around the address space or
    /// overlaps a range held already (by any backend): then Err says why and nothing is recorded.
    fn insert(&self, start: usize, size: usize, owner: Owner) -> Result<(), String> {
        let end = start
            .checked_add(size)
            .filter(|_| start != 0)
            .ok_or("a range that wraps around the address space (or starts at NULL)")?;
        let mut ranges = self.ranges.write();
        if let Some((&held, &(held_end, (device_type, device)))) =
            ranges.by_start.range(..end).next_back()
        {
            if held_end > start {
                return Err(format!(
                    "a range overlapping one already held ({held:#x}, {} bytes, of device type \
                     {device_type} device {device})",
                    held_end - held
                ));
            }
        }
        ranges.owners = match ranges.owners {
            Owners::None => Owners::One(owner),
            Owners::One(first) if first == owner => Owners::One(owner),
            Owners::One(_) | Owners::Several => {
                // Before this segment can hold a block, whose pointer could reach a free.
                (self.on_several_owners)();
                Owners::Several
            }
        };
        ranges.by_start.insert(start, (end, owner));
        Ok(())
    }

    /// Give the range starting at `ptr` back through `release`, the range leaving the index first:
    /// once the backend has the addresses back, another device may be handed them at once, and its
    /// range must not be refused as overlapping this one. If `release` fails, the range is recorded
    /// again, as the caching layer still holds it: its addresses were never released, so no other
    /// range can have taken them meanwhile, and its owner is one seen before (the owners stay).
    fn release_range(
        &self,
        ptr: usize,
        release: impl FnOnce() -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let held = self.ranges.write().by_start.remove(&ptr);
        let result = release();
        if let (Err(_), Some(held)) = (&result, held) {
            self.ranges.write().by_start.insert(ptr, held);
        }
        result
    }
}

/// A backend adaptor that records each segment in a `SegmentIndex` as it comes and goes.
pub struct IndexedBackend {
    inner: Arc<dyn Backend>,
    device_type: i32,
    index: Arc<SegmentIndex>,
}

impl IndexedBackend {
    pub fn new(inner: Arc<dyn Backend>, device_type: i32, index: Arc<SegmentIndex>) -> Self {
        IndexedBackend {
            inner,
            device_type,
            index,
        }
    }
}

/// Every call runs inside a CallbackScope of the device type (so a callback into accalloc from the
/// backend's own code is refused instead of deadlocking); segments and reservations are recorded in
/// the index as they come and go. Everything else, events and virtual memory included, is the inner
/// backend's, forwarded by `Wrapper` (named by path: in scope, it would make every call on an
/// IndexedBackend name two methods).
impl crate::backend::Wrapper for IndexedBackend {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    fn around<T>(&self, call: &'static str, forward: impl FnOnce() -> T) -> T {
        let _inside = CallbackScope::enter(self.device_type, call);
        forward()
    }

    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError> {
        self.around("raw_alloc", || {
            let ptr = self.inner.raw_alloc(device, size, stream)?;
            if let Err(why) = self.index.insert(ptr, size, (self.device_type, device)) {
                // Refused: the backend gets its segment back (what it does with it is its business).
                let _ = self.inner.raw_free(device, ptr, size);
                return Err(refused_range("raw_alloc", ptr, size, &why));
            }
            Ok(ptr)
        })
    }

    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.around("raw_free", || {
            self.index
                .release_range(ptr, || self.inner.raw_free(device, ptr, size))
        })
    }

    fn vm_reserve(&self, device: usize, size: usize) -> Result<usize, BackendError> {
        self.around("vm_reserve", || {
            let ptr = self.inner.vm_reserve(device, size)?;
            if let Err(why) = self.index.insert(ptr, size, (self.device_type, device)) {
                let _ = self.inner.vm_release(device, ptr, size);
                return Err(refused_range("vm_reserve", ptr, size, &why));
            }
            Ok(ptr)
        })
    }

    fn vm_release(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.around("vm_release", || {
            self.index
                .release_range(ptr, || self.inner.vm_release(device, ptr, size))
        })
    }
}

/// The error for a range the index refused (the backend's name is added by the caller's message).
fn refused_range(call: &str, ptr: usize, size: usize, why: &str) -> BackendError {
    BackendError::Failed {
        code: -1,
        message: format!(
            "{call} returned {ptr:#x} for {size} bytes, {why}; accalloc refused it and handed it back"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::simulated::SimulatedBackend;
    use crate::backend::MemInfo;
    use crate::runtime::FIRST_REGISTERED_TYPE;
    use std::sync::Mutex;

    /// (events, stream synchronization, virtual memory) as `backend` answers them.
    fn capabilities(backend: &dyn Backend) -> (bool, bool, Option<usize>) {
        (
            backend.events_supported(),
            backend.stream_synchronize_supported(),
            backend.vm_granularity(0),
        )
    }

    #[test]
    fn keeps_the_inner_backends_events_and_virtual_memory() {
        let makers: [fn(usize, usize) -> SimulatedBackend; 3] = [
            SimulatedBackend::new,
            SimulatedBackend::without_events,
            SimulatedBackend::without_virtual_memory,
        ];
        for make in makers {
            let inner = Arc::new(make(1, 1 << 30));
            let backend = IndexedBackend::new(inner.clone(), 7, Arc::default());
            assert_eq!(capabilities(&backend), capabilities(&*inner));
        }

        // An event recorded through the index is pending for as long as the inner backend says.
        let inner = Arc::new(SimulatedBackend::new(1, 1 << 30));
        let backend = IndexedBackend::new(inner.clone(), 7, Arc::default());
        let event = backend.create_event(0).unwrap();
        backend.record_event(0, event, 3).unwrap();
        assert_eq!(backend.query_event(0, event), Ok(false));
        inner.complete_stream(3);
        assert_eq!(backend.query_event(0, event), Ok(true));
        backend.destroy_event(0, event).unwrap();
        assert_eq!(inner.live_events(), 0);
    }

    /// A SimulatedBackend that notes, for every call reaching it, whether the thread was inside a
    /// callback of device type FIRST_REGISTERED_TYPE.
    struct Probe {
        inner: SimulatedBackend,
        calls: Mutex<Vec<(&'static str, bool)>>,
    }

    impl crate::backend::Wrapper for Probe {
        fn inner(&self) -> &dyn Backend {
            &self.inner
        }
        fn around<T>(&self, call: &'static str, forward: impl FnOnce() -> T) -> T {
            let inside = super::super::reentry::inside(FIRST_REGISTERED_TYPE);
            self.calls.lock().unwrap().push((call, inside));
            forward()
        }
    }

    #[test]
    fn every_call_reaching_the_backend_runs_inside_its_callback_scope() {
        let probe = Arc::new(Probe {
            inner: SimulatedBackend::new(1, 1 << 30),
            calls: Mutex::default(),
        });
        let backend = IndexedBackend::new(probe.clone(), FIRST_REGISTERED_TYPE, Arc::default());
        let segment = backend.raw_alloc(0, 2 << 20, 0).unwrap();
        backend.raw_free(0, segment, 2 << 20).unwrap();
        let _: MemInfo = backend.mem_get_info(0).unwrap();
        let event = backend.create_event(0).unwrap();
        backend.record_event(0, event, 1).unwrap();
        backend.query_event(0, event).unwrap();
        backend.synchronize_event(0, event).unwrap();
        backend.destroy_event(0, event).unwrap();
        backend.synchronize_stream(0, 1).unwrap();
        let page = backend.vm_granularity(0).unwrap();
        let reserved = backend.vm_reserve(0, 4 * page).unwrap();
        backend.vm_map(0, reserved, page).unwrap();
        backend.vm_unmap(0, reserved, page).unwrap();
        backend.vm_release(0, reserved, 4 * page).unwrap();
        let calls = probe.calls.lock().unwrap().clone();
        assert_eq!(
            calls.iter().map(|&(call, _)| call).collect::<Vec<_>>(),
            [
                "raw_alloc",
                "raw_free",
                "mem_get_info",
                "create_event",
                "record_event",
                "query_event",
                "synchronize_event",
                "destroy_event",
                "stream_synchronize",
                "vm_granularity",
                "vm_reserve",
                "vm_map",
                "vm_unmap",
                "vm_release",
            ]
        );
        assert!(calls.iter().all(|&(_, inside)| inside), "{calls:?}");
        assert!(!super::super::reentry::inside(FIRST_REGISTERED_TYPE));
    }

    #[test]
    fn finds_the_owner_of_interior_addresses_only() {
        let index = Arc::new(SegmentIndex::default());
        let backend = IndexedBackend::new(
            Arc::new(SimulatedBackend::new(2, 1 << 30)),
            7,
            index.clone(),
        );
        let a = backend.raw_alloc(0, 2 << 20, 0).unwrap();
        let b = backend.raw_alloc(1, 4 << 20, 0).unwrap();
        assert_eq!(index.owner_of(a), Some((7, 0)));
        assert_eq!(index.owner_of(a + (2 << 20) - 1), Some((7, 0)));
        assert_eq!(index.owner_of(a + (2 << 20)), None);
        assert_eq!(index.owner_of(b + 4096), Some((7, 1)));
        assert_eq!(index.owner_of(a - 1), None);
        backend.raw_free(0, a, 2 << 20).unwrap();
        assert_eq!(index.owner_of(a), None);
    }

    #[test]
    fn a_range_leaves_the_index_before_release_and_returns_if_release_fails() {
        let index = Arc::new(SegmentIndex::default());
        let inner = Arc::new(SimulatedBackend::new(1, 1 << 30));
        let backend = IndexedBackend::new(inner.clone(), 7, index.clone());
        let reserved = backend.vm_reserve(0, 8 << 20).unwrap();
        inner.fail_calls("vm_release", 1);
        assert!(backend.vm_release(0, reserved, 8 << 20).is_err());
        // Still held, so still indexed.
        assert_eq!(index.owner_of(reserved + 4096), Some((7, 0)));
        backend.vm_release(0, reserved, 8 << 20).unwrap();
        assert_eq!(index.owner_of(reserved + 4096), None);
    }
}
