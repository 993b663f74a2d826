//! Device memory over host address space: every device pointer lies in a range the model reserved
//! PROT_NONE, so the host cannot touch it by accident; only live allocations and mapped ranges granted
//! access are readable and writable, and freeing or unmapping makes them PROT_NONE again (their pages
//! dropped). cuMemAlloc takes from one window per device, so devices' pointers are disjoint; the VMM
//! reservations come from one more window of their own. Pinned host memory (pinned.rs) takes a
//! window of the same kind.

use crate::codes::*;
use crate::config::GRANULARITY;
use std::collections::{BTreeMap, HashMap};

pub const PAGE: usize = 4096;

pub fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|n| n / to * to)
}

/// A PROT_NONE span of address space handed out first-fit.
pub struct Window {
    base: usize,
    size: usize,
    /// start -> length of each range taken.
    taken: BTreeMap<usize, usize>,
}

impl Window {
    pub fn new(size: usize) -> Result<Window, String> {
        // SAFETY: a fresh anonymous mapping that nothing else refers to; NORESERVE, so untouched
        // pages cost nothing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("could not reserve {size} bytes of address space"));
        }
        Ok(Window {
            base: base as usize,
            size,
            taken: BTreeMap::new(),
        })
    }

    /// The highest free start aligned to `align` with `len` bytes free after it: top-down, as
    /// Linux places mmap's mappings. The driver's placement is unspecified; this one gives segments
    /// the same relative order as the host backend's (one mmap each), and PyTorch's pools break
    /// ties between equal free blocks by address, so the two backends' figures compare exactly.
    pub fn take(&mut self, len: usize, align: usize) -> Option<usize> {
        let mut gap_end = self.base + self.size;
        let mut found = None;
        for (&start, &taken) in self
            .taken
            .iter()
            .rev()
            .chain(std::iter::once((&self.base, &0)))
        {
            let gap_start = start + taken;
            if let Some(top) = gap_end.checked_sub(len) {
                let candidate = top / align * align;
                if candidate >= gap_start && candidate >= self.base {
                    found = Some(candidate);
                    break;
                }
            }
            gap_end = start;
        }
        let start = found?;
        self.taken.insert(start, len);
        Some(start)
    }

    pub fn give_back(&mut self, start: usize) -> Option<usize> {
        self.taken.remove(&start)
    }

    /// Whether [start, end) meets the window.
    pub fn meets(&self, start: usize, end: usize) -> bool {
        start < self.base + self.size && self.base < end
    }
}

/// Make [start, start + len) readable and writable, or inaccessible with its contents dropped.
pub fn protect(start: usize, len: usize, accessible: bool) {
    let protection = if accessible {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_NONE
    };
    // SAFETY: the range lies in a window this module mapped and owns.
    unsafe {
        libc::mprotect(start as *mut libc::c_void, len, protection);
        if !accessible {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED);
        }
    }
}

struct Allocation {
    device: usize,
    size: usize,
    footprint: usize,
}

struct Mapping {
    size: usize,
    handle: u64,
    device: usize,
    accessible: bool,
}

struct Handle {
    device: usize,
    size: usize,
    mappings: usize,
    released: bool,
}

pub struct Memory {
    capacity: usize,
    windows: Vec<Window>,
    in_use: Vec<usize>,
    allocations: BTreeMap<usize, Allocation>,
    reservations: Window,
    mappings: BTreeMap<usize, Mapping>,
    handles: HashMap<u64, Handle>,
    next_handle: u64,
}

/// A range a call gives up or hands out, for the check against work still using it.
pub type Range = (usize, usize);

impl Memory {
    pub fn new(devices: usize, capacity: usize) -> Result<Memory, String> {
        // Twice the capacity in address space, so fragmentation alone never runs a window out.
        let window = round_up(capacity, GRANULARITY)
            .unwrap_or(capacity)
            .saturating_mul(2);
        let windows = (0..devices)
            .map(|_| Window::new(window))
            .collect::<Result<_, _>>()?;
        // Expandable segments reserve up to a device's whole memory per segment.
        let reserved = window
            .saturating_mul(8)
            .saturating_mul(devices.max(1))
            .min(16 << 40);
        Ok(Memory {
            capacity,
            windows,
            in_use: vec![0; devices],
            allocations: BTreeMap::new(),
            reservations: Window::new(reserved)?,
            mappings: BTreeMap::new(),
            handles: HashMap::new(),
            next_handle: 1,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn allocation_count(&self) -> usize {
        self.allocations.len()
    }

    pub fn free_bytes(&self, device: usize) -> usize {
        self.capacity - self.in_use[device]
    }

    fn charge(&mut self, device: usize, size: usize) -> Result<(), CuResult> {
        if size > self.capacity - self.in_use[device] {
            return Err(OUT_OF_MEMORY);
        }
        self.in_use[device] += size;
        Ok(())
    }

    /// cuMemAlloc: 2 MiB-aligned from 2 MiB up, as the driver places large allocations (and as
    /// Linux aligns anonymous mappings of such sizes), page-aligned below.
    pub fn alloc(&mut self, device: usize, size: usize) -> Result<usize, CuResult> {
        if size == 0 {
            return Err(INVALID_VALUE);
        }
        let footprint = round_up(size, PAGE).ok_or(OUT_OF_MEMORY)?;
        self.charge(device, size)?;
        let align = if size >= GRANULARITY {
            GRANULARITY
        } else {
            PAGE
        };
        let Some(start) = self.windows[device].take(footprint, align) else {
            self.in_use[device] -= size;
            return Err(OUT_OF_MEMORY);
        };
        protect(start, footprint, true);
        self.allocations.insert(
            start,
            Allocation {
                device,
                size,
                footprint,
            },
        );
        Ok(start)
    }

    /// cuMemFree: only an allocation's own base pointer, on its own device's context (the driver
    /// would take any context; the model wants the right one).
    pub fn free(&mut self, device: usize, ptr: usize) -> Result<Range, CuResult> {
        let Some(allocation) = self.allocations.get(&ptr) else {
            return Err(INVALID_VALUE);
        };
        if allocation.device != device {
            return Err(INVALID_CONTEXT);
        }
        let Allocation {
            size, footprint, ..
        } = self.allocations.remove(&ptr).unwrap();
        protect(ptr, footprint, false);
        self.windows[device].give_back(ptr);
        self.in_use[device] -= size;
        Ok((ptr, ptr + size))
    }

    /// Whether the device may touch [ptr, ptr + bytes): inside one live allocation of its own, or
    /// across contiguous mappings of its own memory, each granted access.
    pub fn accessible(&self, device: usize, ptr: usize, bytes: usize) -> bool {
        let Some(end) = ptr.checked_add(bytes) else {
            return false;
        };
        if let Some((&start, a)) = self.allocations.range(..=ptr).next_back() {
            if a.device == device && end <= start + a.size {
                return true;
            }
        }
        let mut at = ptr;
        let Some((&first, _)) = self.mappings.range(..=ptr).next_back() else {
            return false;
        };
        for (&start, m) in self.mappings.range(first..) {
            if start > at || m.device != device || !m.accessible {
                return false;
            }
            at = start + m.size;
            if at >= end {
                return true;
            }
        }
        false
    }

    pub fn reserve(
        &mut self,
        size: usize,
        alignment: usize,
        hint: usize,
    ) -> Result<usize, CuResult> {
        let aligned = |n: usize| n.is_multiple_of(GRANULARITY);
        if size == 0 || !aligned(size) || !aligned(alignment) || !aligned(hint) {
            return Err(INVALID_VALUE);
        }
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(INVALID_VALUE);
        }
        // The hint is only a hint (the driver may ignore it); the model always does.
        self.reservations
            .take(size, alignment.max(GRANULARITY))
            .ok_or(OUT_OF_MEMORY)
    }

    /// cuMemAddressFree: a whole reservation, with nothing mapped in it.
    pub fn free_reservation(&mut self, ptr: usize, size: usize) -> Result<(), CuResult> {
        if self.reservations.taken.get(&ptr) != Some(&size) {
            return Err(INVALID_VALUE);
        }
        if self.mappings.range(ptr..ptr + size).next().is_some() {
            return Err(INVALID_VALUE);
        }
        self.reservations.give_back(ptr);
        Ok(())
    }

    pub fn create(&mut self, device: usize, size: usize) -> Result<u64, CuResult> {
        if size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(INVALID_VALUE);
        }
        self.charge(device, size)?;
        let handle = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(
            handle,
            Handle {
                device,
                size,
                mappings: 0,
                released: false,
            },
        );
        Ok(handle)
    }

    /// cuMemRelease: the handle goes at once; its memory once nothing maps it any more.
    pub fn release(&mut self, handle: u64) -> Result<(), CuResult> {
        match self.handles.get_mut(&handle) {
            Some(h) if !h.released => h.released = true,
            _ => return Err(INVALID_VALUE),
        }
        self.drop_if_unused(handle);
        Ok(())
    }

    fn drop_if_unused(&mut self, handle: u64) {
        if let Some(h) = self.handles.get(&handle) {
            if h.released && h.mappings == 0 {
                self.in_use[h.device] -= h.size;
                self.handles.remove(&handle);
            }
        }
    }

    fn reservation_holding(&self, ptr: usize, size: usize) -> bool {
        self.reservations
            .taken
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&start, &len)| ptr + size <= start + len)
    }

    /// cuMemMap: the whole handle (offset 0) at a granularity-aligned range of one reservation
    /// that nothing maps yet. The range stays inaccessible until cuMemSetAccess.
    pub fn map(
        &mut self,
        ptr: usize,
        size: usize,
        offset: usize,
        handle: u64,
    ) -> Result<(), CuResult> {
        if !ptr.is_multiple_of(GRANULARITY)
            || size == 0
            || !size.is_multiple_of(GRANULARITY)
            || !offset.is_multiple_of(GRANULARITY)
        {
            return Err(INVALID_VALUE);
        }
        let Some(end) = ptr.checked_add(size) else {
            return Err(INVALID_VALUE);
        };
        let device = match self.handles.get(&handle) {
            Some(h) if !h.released && offset.checked_add(size).is_some_and(|e| e <= h.size) => {
                h.device
            }
            _ => return Err(INVALID_VALUE),
        };
        if !self.reservation_holding(ptr, size) {
            return Err(INVALID_VALUE);
        }
        let overlaps = self
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&s, m)| s + m.size > ptr);
        if overlaps {
            return Err(ALREADY_MAPPED);
        }
        self.handles.get_mut(&handle).unwrap().mappings += 1;
        self.mappings.insert(
            ptr,
            Mapping {
                size,
                handle,
                device,
                accessible: false,
            },
        );
        Ok(())
    }

    /// The mappings exactly covering [ptr, ptr + size), or None when the range starts or ends
    /// inside one or passes over a hole.
    fn covering(&self, ptr: usize, size: usize) -> Option<Vec<usize>> {
        let end = ptr.checked_add(size)?;
        let mut starts = Vec::new();
        let mut at = ptr;
        for (&start, m) in self.mappings.range(ptr..end) {
            if start != at {
                return None;
            }
            starts.push(start);
            at = start + m.size;
        }
        (at == end && !starts.is_empty()).then_some(starts)
    }

    /// cuMemSetAccess with one descriptor per device: the model's devices are the only locations,
    /// and read-write is what makes the range usable.
    pub fn set_access(
        &mut self,
        ptr: usize,
        size: usize,
        grants: &[(i32, i32, u32)],
        devices: usize,
    ) -> Result<(), CuResult> {
        const LOCATION_DEVICE: i32 = 1;
        const READWRITE: u32 = 3;
        if grants.is_empty() {
            return Err(INVALID_VALUE);
        }
        let starts = self.covering(ptr, size).ok_or(INVALID_VALUE)?;
        for &(kind, id, flags) in grants {
            if kind != LOCATION_DEVICE || id < 0 || id as usize >= devices || flags > READWRITE {
                return Err(INVALID_VALUE);
            }
        }
        for start in starts {
            let m = self.mappings.get_mut(&start).unwrap();
            let granted = grants
                .iter()
                .any(|&(_, id, flags)| id as usize == m.device && flags == READWRITE);
            m.accessible = granted;
            protect(start, m.size, granted);
        }
        Ok(())
    }

    /// cuMemUnmap: whole mappings only.
    pub fn unmap(&mut self, ptr: usize, size: usize) -> Result<Range, CuResult> {
        let starts = self.covering(ptr, size).ok_or(INVALID_VALUE)?;
        for start in starts {
            let m = self.mappings.remove(&start).unwrap();
            protect(start, m.size, false);
            self.handles.get_mut(&m.handle).unwrap().mappings -= 1;
            self.drop_if_unused(m.handle);
        }
        Ok((ptr, ptr + size))
    }

    /// Live physical allocations (handles not yet freed) and address reservations.
    pub fn vmm_objects(&self) -> (usize, usize) {
        (self.handles.len(), self.reservations.taken.len())
    }

    /// Whether [ptr, ptr + bytes) meets address space of the devices' (a device pointer, live or
    /// not, where a host pointer belongs).
    pub fn holds(&self, ptr: usize, bytes: usize) -> bool {
        let end = ptr.saturating_add(bytes);
        self.reservations.meets(ptr, end) || self.windows.iter().any(|w| w.meets(ptr, end))
    }

    /// The device whose memory is mapped or allocated at ptr, if any.
    pub fn device_of(&self, ptr: usize) -> Option<usize> {
        if let Some((&start, a)) = self.allocations.range(..=ptr).next_back() {
            if ptr < start + a.size {
                return Some(a.device);
            }
        }
        let (&start, m) = self.mappings.range(..=ptr).next_back()?;
        (ptr < start + m.size).then_some(m.device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const G: usize = GRANULARITY;

    #[test]
    fn allocations_are_disjoint_counted_and_inaccessible_once_freed() {
        let mut m = Memory::new(2, 64 << 20).unwrap();
        let a = m.alloc(0, 1000).unwrap();
        let b = m.alloc(1, 1000).unwrap();
        assert!(
            a.abs_diff(b) >= 128 << 20,
            "each device has its window of twice its capacity"
        );
        assert_eq!((m.device_of(a), m.device_of(b)), (Some(0), Some(1)));
        let host = [0u8; 8];
        assert!(m.holds(a - 4096, 8) && !m.holds(host.as_ptr() as usize, 8));
        assert_eq!(m.free_bytes(0), (64 << 20) - 1000);
        assert!(m.accessible(0, a, 1000) && !m.accessible(0, a, 1001) && !m.accessible(1, a, 8));
        assert_eq!(m.alloc(0, 64 << 20), Err(OUT_OF_MEMORY));
        assert_eq!(m.free(1, a), Err(INVALID_CONTEXT));
        assert_eq!(m.free(0, a + 8), Err(INVALID_VALUE));
        assert_eq!(m.free(0, a), Ok((a, a + 1000)));
        assert_eq!(m.free(0, a), Err(INVALID_VALUE), "a double free is refused");
        assert!(!m.accessible(0, a, 8));
        assert_eq!(m.free_bytes(0), 64 << 20);
    }

    #[test]
    fn the_virtual_memory_rules() {
        let mut m = Memory::new(1, 64 << 20).unwrap();
        assert_eq!(m.reserve(G + 1, 0, 0), Err(INVALID_VALUE));
        let r = m.reserve(8 * G, 0, 0).unwrap();
        assert_eq!(m.create(0, G / 2), Err(INVALID_VALUE));
        let h = m.create(0, 2 * G).unwrap();
        assert_eq!(m.map(r + 1, 2 * G, 0, h), Err(INVALID_VALUE));
        assert_eq!(
            m.map(r + 7 * G, 2 * G, 0, h),
            Err(INVALID_VALUE),
            "past the reservation"
        );
        m.map(r, 2 * G, 0, h).unwrap();
        assert!(!m.accessible(0, r, 8), "mapped is not yet accessible");
        let h2 = m.create(0, 2 * G).unwrap();
        assert_eq!(m.map(r + G, 2 * G, 0, h2), Err(ALREADY_MAPPED));
        m.map(r + 2 * G, 2 * G, 0, h2).unwrap();
        assert_eq!(
            m.set_access(r, 3 * G, &[(1, 0, 3)], 1),
            Err(INVALID_VALUE),
            "half a mapping"
        );
        m.set_access(r, 4 * G, &[(1, 0, 3)], 1).unwrap();
        assert!(m.accessible(0, r + G, 2 * G), "across two mappings");
        assert_eq!(
            m.free_reservation(r, 8 * G),
            Err(INVALID_VALUE),
            "still mapped"
        );
        m.release(h).unwrap();
        assert_eq!(
            m.free_bytes(0),
            (64 << 20) - 4 * G,
            "released but mapped: still held"
        );
        assert_eq!(m.unmap(r, G), Err(INVALID_VALUE), "part of a mapping");
        m.unmap(r, 2 * G).unwrap();
        assert_eq!(m.free_bytes(0), (64 << 20) - 2 * G);
        m.unmap(r + 2 * G, 2 * G).unwrap();
        m.release(h2).unwrap();
        assert_eq!(m.release(h2), Err(INVALID_VALUE));
        m.free_reservation(r, 8 * G).unwrap();
        assert_eq!(m.free_bytes(0), 64 << 20);
    }
}
