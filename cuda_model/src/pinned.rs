//! Page-locked host memory (cuMemHostAlloc, cuMemFreeHost) in a window of its own, reserved
//! PROT_NONE like the devices' (memory.rs): only live allocations are readable and writable, and
//! memory freed is inaccessible again, so a stray host access faults rather than reading memory
//! handed out since. What is pinned is counted in whole pages against one limit for all contexts
//! (ACCALLOC_CUDA_MODEL_PINNED_CAPACITY, 4G): past it, CUDA_ERROR_OUT_OF_MEMORY, as when the host
//! can lock no more. Without CU_MEMHOSTALLOC_PORTABLE the memory is pinned for the allocating
//! context's device only; to another device it is pageable memory, as in the driver.

use crate::codes::*;
use crate::memory::{protect, round_up, Range, Window, PAGE};
use std::collections::BTreeMap;

/// CU_MEMHOSTALLOC_PORTABLE.
pub const PORTABLE: u32 = 1;
/// PORTABLE, DEVICEMAP and WRITECOMBINED: the flags the driver defines.
pub const FLAGS: u32 = 0x7;

struct Allocation {
    size: usize,
    footprint: usize,
    /// The device it is pinned for, or None for every device (portable).
    device: Option<usize>,
}

/// What a host pointer given to a copy is, for a device.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Host {
    /// Inside one live allocation pinned for the device: its copies run asynchronously.
    Pinned,
    /// Ordinary memory (or memory pinned for another device): its copies are synchronous.
    Pageable,
    /// Pinned host memory's address space outside any live allocation: freed, or past the end.
    Invalid,
}

pub struct Pinned {
    limit: usize,
    in_use: usize,
    window: Window,
    allocations: BTreeMap<usize, Allocation>,
}

impl Pinned {
    pub fn new(limit: usize) -> Result<Pinned, String> {
        // Twice the limit in address space, as for a device, so fragmentation never runs it out.
        let window = round_up(limit, PAGE).unwrap_or(limit).saturating_mul(2);
        Ok(Pinned {
            limit,
            in_use: 0,
            window: Window::new(window.max(PAGE))?,
            allocations: BTreeMap::new(),
        })
    }

    /// cuMemHostAlloc by a context of `device`: page-aligned, the flags the driver defines.
    pub fn alloc(&mut self, device: usize, size: usize, flags: u32) -> Result<usize, CuResult> {
        if size == 0 || flags & !FLAGS != 0 {
            return Err(INVALID_VALUE);
        }
        let footprint = round_up(size, PAGE).ok_or(OUT_OF_MEMORY)?;
        if footprint > self.limit - self.in_use {
            return Err(OUT_OF_MEMORY);
        }
        let start = self.window.take(footprint, PAGE).ok_or(OUT_OF_MEMORY)?;
        self.in_use += footprint;
        protect(start, footprint, true);
        let device = (flags & PORTABLE == 0).then_some(device);
        let allocation = Allocation {
            size,
            footprint,
            device,
        };
        self.allocations.insert(start, allocation);
        Ok(start)
    }

    /// cuMemFreeHost: only an allocation's own base pointer, once.
    pub fn free(&mut self, ptr: usize) -> Result<Range, CuResult> {
        let allocation = self.allocations.remove(&ptr).ok_or(INVALID_VALUE)?;
        protect(ptr, allocation.footprint, false);
        self.window.give_back(ptr);
        self.in_use -= allocation.footprint;
        Ok((ptr, ptr + allocation.size))
    }

    /// What [ptr, ptr + bytes) is to `device`.
    pub fn classify(&self, device: usize, ptr: usize, bytes: usize) -> Host {
        let Some(end) = ptr.checked_add(bytes) else {
            return Host::Invalid;
        };
        if !self.window.meets(ptr, end) {
            return Host::Pageable;
        }
        match self.allocations.range(..=ptr).next_back() {
            Some((&start, a)) if end <= start + a.size => match a.device {
                Some(d) if d != device => Host::Pageable,
                _ => Host::Pinned,
            },
            _ => Host::Invalid,
        }
    }

    /// Live allocations, bytes pinned (whole pages) and the limit.
    pub fn counts(&self) -> [usize; 3] {
        [self.allocations.len(), self.in_use, self.limit]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_counted_in_pages_up_to_the_limit_and_freed_once() {
        let mut p = Pinned::new(64 << 10).unwrap();
        assert_eq!(p.alloc(0, 0, PORTABLE), Err(INVALID_VALUE));
        assert_eq!(
            p.alloc(0, 8, 8),
            Err(INVALID_VALUE),
            "a flag the driver lacks"
        );
        let a = p.alloc(0, 5000, PORTABLE).unwrap();
        assert_eq!(a % PAGE, 0);
        // SAFETY: a live allocation of 5000 bytes is readable and writable.
        unsafe {
            (a as *mut u8).add(4999).write(7);
            assert_eq!((a as *const u8).add(4999).read(), 7);
        }
        assert_eq!(p.counts(), [1, 2 * PAGE, 64 << 10], "whole pages");
        assert_eq!(p.alloc(0, (64 << 10) - PAGE, 0), Err(OUT_OF_MEMORY));
        let b = p.alloc(1, (64 << 10) - 2 * PAGE, 0).unwrap();
        assert_eq!(
            p.alloc(0, 1, PORTABLE),
            Err(OUT_OF_MEMORY),
            "the limit reached"
        );
        assert_eq!(p.free(a + 8), Err(INVALID_VALUE), "not a base pointer");
        assert_eq!(p.free(a), Ok((a, a + 5000)));
        assert_eq!(p.free(a), Err(INVALID_VALUE), "a double free is refused");
        assert_eq!(p.free(0x1000), Err(INVALID_VALUE), "never allocated");
        p.free(b).unwrap();
        assert_eq!(p.counts(), [0, 0, 64 << 10]);
    }

    #[test]
    fn copies_see_pinned_pageable_or_invalid_memory() {
        let mut p = Pinned::new(1 << 20).unwrap();
        let portable = p.alloc(0, 4096, PORTABLE).unwrap();
        let own = p.alloc(0, 4096, 0).unwrap();
        assert_eq!(p.classify(1, portable, 4096), Host::Pinned);
        assert_eq!(p.classify(0, own + 8, 8), Host::Pinned);
        assert_eq!(
            p.classify(1, own, 4096),
            Host::Pageable,
            "not portable: pinned for device 0 only"
        );
        assert_eq!(p.classify(0, own, 4097), Host::Invalid, "past the end");
        let elsewhere = [0u8; 64];
        assert_eq!(
            p.classify(0, elsewhere.as_ptr() as usize, 64),
            Host::Pageable
        );
        p.free(portable).unwrap();
        assert_eq!(p.classify(0, portable, 8), Host::Invalid, "freed");
        assert_eq!(Pinned::new(0).unwrap().alloc(0, 1, 0), Err(OUT_OF_MEMORY));
    }
}
