//! Each thread's last answers of the segment index: the ranges of the segments it found lately and
//! their owners. A free of an address in one of them tries that device first. The guess needs no
//! lock: a stale one (the segment went back and its addresses were handed to another device since)
//! only costs a look that finds no live block, because no two devices ever hold the same address at
//! once.

use super::ownership::Owner;
use std::cell::Cell;

/// Segments remembered per thread: a thread's frees alternate between a few segments at most (the
/// small pool's 2 MiB ones and a large one or two), and a look through four ranges costs less than
/// one read lock.
const REMEMBERED: usize = 4;

type Recent = ([(usize, usize, Owner); REMEMBERED], usize);

thread_local! {
    // Copy cells with no destructor, usable from TLS destructors and atexit handlers too.
    static RECENT: Cell<Recent> = const { Cell::new(([(0, 0, (0, 0)); REMEMBERED], 0)) };
}

/// The owner of a segment this thread found lately, if `ptr` lies in one.
#[inline]
pub fn guess(ptr: usize) -> Option<Owner> {
    RECENT
        .try_with(|recent| {
            let (ranges, _) = recent.get();
            ranges
                .iter()
                .find(|&&(start, end, _)| start <= ptr && ptr < end)
                .map(|&(_, _, owner)| owner)
        })
        .ok()
        .flatten()
}

/// Remember that [start, end) was `owner`'s, in place of the oldest range remembered.
#[inline]
pub fn remember(start: usize, end: usize, owner: Owner) {
    let _ = RECENT.try_with(|recent| {
        let (mut ranges, next) = recent.get();
        ranges[next] = (start, end, owner);
        recent.set((ranges, (next + 1) % REMEMBERED));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_newest_four_ranges() {
        for k in 0..5 {
            remember(k << 20, (k << 20) + 4096, (0, k));
        }
        // The first range was replaced by the fifth.
        assert_eq!(guess(100), None);
        for k in 1..5 {
            assert_eq!(guess((k << 20) + 100), Some((0, k)));
            assert_eq!(guess((k << 20) + 4096), None);
        }
    }
}
