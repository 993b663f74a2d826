//! The online planner's log of allocations: the latest ones, each found by its allocation number.
//! A ring of a fixed room (a power of two) indexed by the number's low bits: a request writes its
//! entry in place and the oldest leave by moving a number, with no memory moved and no wrap
//! arithmetic on the request path.

/// Not freed yet.
pub(super) const LIVE: usize = usize::MAX;

/// One allocation as the log keeps it: its rounded size and stream, when it was made and freed
/// (in events: allocations and frees), and its address.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub size: usize,
    pub stream: usize,
    pub start: usize,
    pub end: usize,
    pub ptr: usize,
}

/// Allocations `first..next`, in a ring of `room` entries.
pub(super) struct Log {
    entries: Vec<Entry>,
    /// The ring's room less one: a number's slot is `number & mask`.
    mask: usize,
    /// The oldest leave this many at a time, when the log holds `room` allocations.
    drained: usize,
    first: usize,
    next: usize,
}

impl Log {
    /// A log that holds at most `room` allocations (a power of two) and at least `room - drained`
    /// once it has had that many.
    pub fn new(room: usize, drained: usize) -> Log {
        assert!(room.is_power_of_two() && (1..=room).contains(&drained));
        Log {
            entries: Vec::new(),
            mask: room - 1,
            drained,
            first: 0,
            next: 0,
        }
    }

    /// Log the next allocation (number `next()`).
    #[inline]
    pub fn push(&mut self, entry: Entry) {
        let number = self.next;
        // The ring fills once, in order; from then on each entry takes the slot of one that left.
        match self.entries.get_mut(number & self.mask) {
            Some(slot) => *slot = entry,
            None => self.entries.push(entry),
        }
        self.next += 1;
        if self.next - self.first > self.mask {
            self.first += self.drained;
        }
    }

    /// The oldest allocation the log holds.
    pub fn first(&self) -> usize {
        self.first
    }

    /// The number the next allocation logged gets.
    pub fn next(&self) -> usize {
        self.next
    }

    /// How many allocations it holds.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.next - self.first
    }

    /// Whether allocation `number` is in the log.
    #[inline]
    pub fn holds(&self, number: usize) -> bool {
        number >= self.first && number < self.next
    }

    /// Allocation `number`'s entry, which the log holds.
    #[inline]
    pub fn get(&self, number: usize) -> &Entry {
        debug_assert!(
            self.holds(number),
            "{number} not in {}..{}",
            self.first,
            self.next
        );
        &self.entries[number & self.mask]
    }

    #[inline]
    pub fn get_mut(&mut self, number: usize) -> &mut Entry {
        debug_assert!(
            self.holds(number),
            "{number} not in {}..{}",
            self.first,
            self.next
        );
        &mut self.entries[number & self.mask]
    }

    /// The entries of allocations `from..from + count`, which the log holds.
    pub fn range(&self, from: usize, count: usize) -> impl ExactSizeIterator<Item = &Entry> + '_ {
        (from..from + count).map(move |number| self.get(number))
    }

    /// The entries' room taken (for tests: it never outgrows the ring).
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.entries.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: usize) -> Entry {
        Entry {
            size: 512 * (1 + n % 5),
            stream: n % 3,
            start: 2 * n,
            end: LIVE,
            ptr: 0x1000 + n,
        }
    }

    #[test]
    fn the_ring_holds_the_latest_allocations_by_number_and_drops_the_oldest_in_batches() {
        // Room for 8, the oldest 3 leaving at a time: after a push that fills the room, 5 remain.
        let mut log = Log::new(8, 3);
        for n in 0..7 {
            log.push(entry(n));
            assert_eq!((log.first(), log.len()), (0, n + 1));
        }
        log.push(entry(7));
        assert_eq!((log.first(), log.next()), (3, 8));
        for n in 8..40 {
            log.push(entry(n));
            assert!((5..8).contains(&log.len()), "{}", log.len());
            assert_eq!(log.next(), n + 1);
            // Every entry held is the one pushed with its number, whatever its slot.
            for held in log.first()..log.next() {
                assert_eq!(log.get(held).ptr, 0x1000 + held);
                assert_eq!(log.get(held).start, 2 * held);
            }
            assert!(!log.holds(log.first() - 1) && !log.holds(log.next()));
        }
        assert_eq!(log.capacity(), 8);
        let from = log.first() + 1;
        let sizes: Vec<usize> = log.range(from, 3).map(|e| e.size).collect();
        assert_eq!(
            sizes,
            (from..from + 3).map(|n| entry(n).size).collect::<Vec<_>>()
        );
        let last = log.next() - 1;
        log.get_mut(last).end = 99;
        assert_eq!(log.get(last).end, 99);
    }
}
