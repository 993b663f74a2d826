//! Address space reserved up front for one host device, handed out top-down, first fit.
//!
//! Why: PyTorch's pools break ties between equal free blocks by address, so the statistics of a
//! replay depend on the order of its segments' addresses. Left to mmap, that order depends on
//! whatever else the process has mapped (libraries, Python, the trace being read), and the same
//! trace could give other figures in another process. Inside a window of its own, a device's
//! segments land where the allocation sequence alone puts them: the same figures everywhere, and
//! the same order a GPU driver that places top-down gives (the CUDA driver model does), so host and
//! CUDA replays compare exactly. Sizes from 2 MiB up are 2 MiB-aligned, as Linux aligns such
//! anonymous mappings and the CUDA driver large allocations.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// 2 MiB: the alignment of large segments.
pub const LARGE_ALIGNMENT: usize = 2 << 20;

pub struct AddressWindow {
    base: usize,
    size: usize,
    /// start -> length of each range handed out.
    taken: Mutex<BTreeMap<usize, usize>>,
}

impl AddressWindow {
    /// Reserve `size` bytes of inaccessible address space (no memory is committed), or None when
    /// the system refuses (callers then map anywhere, as before).
    pub fn reserve(size: usize) -> Option<AddressWindow> {
        reserve_inaccessible(size).map(|base| AddressWindow {
            base,
            size,
            taken: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn contains(&self, ptr: usize) -> bool {
        ptr >= self.base && ptr - self.base < self.size
    }

    /// The highest free start (aligned) with `len` bytes free after it, now taken; None when no
    /// gap fits.
    pub fn take(&self, len: usize) -> Option<usize> {
        let align = if len >= LARGE_ALIGNMENT {
            LARGE_ALIGNMENT
        } else {
            page_size()
        };
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let mut gap_end = self.base + self.size;
        let mut found = None;
        let below = taken.iter().rev().map(|(&s, &l)| (s, l));
        for (start, length) in below.chain(std::iter::once((self.base, 0))) {
            if let Some(top) = gap_end.checked_sub(len) {
                let candidate = top / align * align;
                if candidate >= start + length && candidate >= self.base {
                    found = Some(candidate);
                    break;
                }
            }
            gap_end = start;
        }
        let start = found?;
        taken.insert(start, len);
        Some(start)
    }

    /// Make a range from `take` inaccessible reservation again (its pages dropped) and hand it back;
    /// false, with the range still taken, when the system refuses.
    ///
    /// # Safety
    /// [start, start + len) came from `take` and nothing uses it any more.
    pub unsafe fn unmap(&self, start: usize, len: usize) -> bool {
        // SAFETY: a range of this window that the caller no longer uses.
        let back = unsafe { map_anonymous(Some(start), len, libc::PROT_NONE) }.is_some();
        if back {
            self.give_back(start);
        }
        back
    }

    pub fn give_back(&self, start: usize) {
        self.taken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&start);
    }
}

/// `size` bytes of fresh inaccessible address space anywhere (NORESERVE: nothing committed), or None
/// when the system refuses.
pub fn reserve_inaccessible(size: usize) -> Option<usize> {
    // SAFETY: no fixed address: a fresh mapping that nothing refers to yet.
    unsafe { map_anonymous(None, size, libc::PROT_NONE) }
}

/// An anonymous private NORESERVE mapping of `size` bytes with `protection`, at `at` (MAP_FIXED,
/// replacing what is mapped there) or anywhere; None when the system refuses.
///
/// # Safety
/// A given `at` starts a range the caller owns and nothing else uses (a range of a window it took,
/// or a segment it gives back).
pub unsafe fn map_anonymous(at: Option<usize>, size: usize, protection: i32) -> Option<usize> {
    let fixed = if at.is_some() { libc::MAP_FIXED } else { 0 };
    // SAFETY: anywhere, or over a range the caller owns (see above).
    let base = unsafe {
        libc::mmap(
            at.unwrap_or(0) as *mut libc::c_void,
            size,
            protection,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | fixed,
            -1,
            0,
        )
    };
    (base != libc::MAP_FAILED).then_some(base as usize)
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: usize = 1 << 20;

    #[test]
    fn top_down_first_fit_reuses_the_highest_gap() {
        let w = AddressWindow::reserve(64 * MIB).unwrap();
        let top = w.base + 64 * MIB;
        let a = w.take(20 * MIB).unwrap();
        assert_eq!(a, top - 20 * MIB);
        let b = w.take(2 * MIB).unwrap();
        assert_eq!(b, a - 2 * MIB);
        let small = w.take(4096).unwrap();
        assert_eq!(small, b - 4096, "small ranges are page-aligned");
        w.give_back(a);
        assert_eq!(
            w.take(4 * MIB).unwrap(),
            top - 4 * MIB,
            "the freed gap at the top comes first"
        );
        assert_eq!(w.take(50 * MIB), None, "nothing that large is left");
        assert!(w.contains(small) && !w.contains(top));
    }
}
