//! The repeating sequence in a stream of requests: a training iteration asks for the same sizes on
//! the same streams in the same order, and frees them in the same order, every time. Requests are
//! events (an allocation's size and stream; a free, by how many allocations ago its block was made),
//! each reduced to a key; the finder watches the keys and reports a period `p` once the last `p`
//! events repeat the `p` before them.
//!
//! It costs O(K) per event, K the positions remembered per key (a key: the last eight events): a
//! period `p` is a candidate only while every key so far has matched the one `p` before it, so
//! candidates come from the earlier positions of the current key. Inner repetitions (the layers of a model, the same sizes
//! several times in an iteration) repeat too, and are found first; they end where the iteration
//! moves on, and a period that ended once is never reported again, so the iteration's own period
//! wins by its second repetition.

use std::collections::{HashMap, HashSet};

/// One request, as the finder compares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// An allocation of `size` bytes (as rounded) on `stream`.
    Alloc { size: usize, stream: usize },
    /// The free of the block allocated `back` allocations before this free's latest allocation
    /// (0: the latest one).
    Free { back: usize },
}

/// A period found: the last `length` events repeat the `length` before them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Period {
    /// Events in one repetition.
    pub length: usize,
    /// The index of the event that completed the last repetition counted.
    pub at: usize,
    /// Repetitions in a row up to `at` (at least 2).
    pub repeats: usize,
}

/// Finds periods in a stream of events, one event at a time.
pub struct PeriodFinder {
    /// The shortest period reported (shorter ones are the same few requests over and over).
    min_length: usize,
    /// The longest period looked for.
    max_length: usize,
    /// Earlier positions of each key (the hash of the last CONTEXT events), newest last, at most
    /// POSITIONS_PER_KEY.
    positions: HashMap<u64, Vec<usize>>,
    /// The hashes of the last CONTEXT events, oldest first.
    recent: std::collections::VecDeque<u64>,
    /// Candidate period -> how many latest events matched the one a period before.
    runs: HashMap<usize, usize>,
    /// Periods that repeated fully and then ended: not reported again.
    ended: HashSet<usize>,
    /// Events seen.
    count: usize,
}

const POSITIONS_PER_KEY: usize = 64;
/// Events a key stands for: a free of the latest block or a 512-byte allocation comes hundreds of
/// times an iteration, so one event alone would remember none of its positions an iteration back;
/// eight in a row are rare enough.
const CONTEXT: usize = 8;

impl PeriodFinder {
    pub fn new(min_length: usize, max_length: usize) -> Self {
        PeriodFinder {
            min_length: min_length.max(1),
            max_length,
            positions: HashMap::new(),
            recent: std::collections::VecDeque::with_capacity(CONTEXT),
            runs: HashMap::new(),
            ended: HashSet::new(),
            count: 0,
        }
    }

    /// Take the next event; Some when it completes a second repetition of a period not reported
    /// before (the shortest, if several do at once).
    pub fn push(&mut self, event: Event) -> Option<Period> {
        let now = self.count;
        self.count += 1;
        if self.recent.len() == CONTEXT {
            self.recent.pop_front();
        }
        self.recent.push_back(hash_of(&event));
        let key = self.recent.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &e| {
            (h ^ e).wrapping_mul(0x100_0000_01b3)
        });
        let earlier = self.positions.entry(key).or_default();
        let mut runs = HashMap::with_capacity(earlier.len());
        for &position in earlier.iter() {
            let length = now - position;
            if length > self.max_length {
                continue;
            }
            runs.insert(length, self.runs.get(&length).copied().unwrap_or(0) + 1);
        }
        if earlier.len() == POSITIONS_PER_KEY {
            earlier.remove(0);
        }
        earlier.push(now);
        // A period that had repeated fully and now breaks has ended.
        for (&length, &run) in &self.runs {
            if run >= length && !runs.contains_key(&length) {
                self.ended.insert(length);
            }
        }
        self.runs = runs;
        let found = self
            .runs
            .iter()
            .filter(|&(&length, &run)| {
                run == length
                    && length >= self.min_length
                    && !self.ended.contains(&length)
                    && !self.repeats_shorter(length)
            })
            .map(|(&length, _)| length)
            .min()?;
        Some(Period {
            length: found,
            at: now,
            repeats: 2,
        })
    }

    /// Whether the last `length` events are a shorter period repeated (a multiple of a period is
    /// no period of its own).
    fn repeats_shorter(&self, length: usize) -> bool {
        self.runs.iter().any(|(&shorter, &run)| {
            shorter < length && length.is_multiple_of(shorter) && run >= length
        })
    }

    /// Whether `length` repeated fully and has ended since.
    pub fn has_ended(&self, length: usize) -> bool {
        self.ended.contains(&length)
    }

    /// How many of the latest events matched the event `length` before them.
    pub fn run(&self, length: usize) -> usize {
        self.runs.get(&length).copied().unwrap_or(0)
    }
}

/// Finds where the latest `window` allocations were asked for before, in the same order: in a
/// training loop, the start of step 2 matches the start of step 1, and what followed then is a
/// prediction of what follows now. Only allocations count (their size and stream): frees name
/// their blocks by distance, which an allocation made in one step and not the next (an optimizer
/// making its states) changes. O(1) per allocation: it is on the planned request's path.
pub struct StretchMatcher {
    window: usize,
    /// The hashes of the last `window` allocations, a ring: the oldest at `oldest` once full.
    recent: Vec<u64>,
    oldest: usize,
    /// Their rolling hash, sum of hash x ROLL^(age), and ROLL^(window - 1).
    rolling: u64,
    oldest_weight: u64,
    /// The latest allocation index at which each window of hashes ended.
    ended_at: WindowEnds,
    count: usize,
    /// Allocations counted by `skip` whose windows are owed.
    skipped: usize,
}

/// An odd multiplier for the rolling hash.
const ROLL: u64 = 0x9E37_79B9_7F4A_7C15;

/// The hash of an allocation of `size` bytes on `stream`: one multiply and a shift per word, where
/// the standard hasher (SipHash) costs several times more.
fn alloc_hash(size: usize, stream: usize) -> u64 {
    let mix = |h: u64, x: u64| {
        let mixed = (h ^ x).wrapping_mul(ROLL);
        mixed ^ (mixed >> 29)
    };
    mix(mix(0x51_7cc1_b727_220a, size as u64), stream as u64)
}

/// A map from a window's rolling hash to the latest index it ended at: open addressing with
/// linear probing, indexed by the hash's top bits (a rolling hash's product terms mix upwards, so
/// those are its best ones). An insertion that finds its key, the steady state of a repeating
/// program, touches one slot; the standard map probes by control groups and costs about twice
/// as much on the planned request's path.
struct WindowEnds {
    /// (key, index + 1); 0 in the second field: an empty slot.
    slots: Vec<(u64, usize)>,
    /// log2 of the slot count.
    bits: u32,
    len: usize,
}

impl WindowEnds {
    const INITIAL_BITS: u32 = 6;

    fn new() -> Self {
        WindowEnds {
            slots: vec![(0, 0); 1 << Self::INITIAL_BITS],
            bits: Self::INITIAL_BITS,
            len: 0,
        }
    }

    fn home(&self, key: u64) -> usize {
        (key >> (64 - self.bits)) as usize
    }

    /// Set `key`'s index to `index`; the index it had, if any.
    #[inline]
    fn insert(&mut self, key: u64, index: usize) -> Option<usize> {
        let mask = self.slots.len() - 1;
        let mut slot = self.home(key);
        loop {
            let (k, stored) = &mut self.slots[slot];
            if *stored == 0 {
                break;
            }
            if *k == key {
                return Some(std::mem::replace(stored, index + 1) - 1);
            }
            slot = (slot + 1) & mask;
        }
        self.slots[slot] = (key, index + 1);
        self.len += 1;
        if 2 * self.len > self.slots.len() {
            self.grow();
        }
        None
    }

    /// Twice the slots, every entry placed again (at most half full: probes stay short).
    fn grow(&mut self) {
        let old = std::mem::replace(&mut self.slots, vec![(0, 0); 2 << self.bits]);
        self.bits += 1;
        let mask = self.slots.len() - 1;
        for (key, stored) in old.into_iter().filter(|&(_, stored)| stored != 0) {
            let mut slot = self.home(key);
            while self.slots[slot].1 != 0 {
                slot = (slot + 1) & mask;
            }
            self.slots[slot] = (key, stored);
        }
    }
}

impl StretchMatcher {
    pub fn new(window: usize) -> Self {
        let window = window.max(1);
        StretchMatcher {
            window,
            recent: Vec::with_capacity(window),
            oldest: 0,
            rolling: 0,
            oldest_weight: (1..window).fold(1u64, |w, _| w.wrapping_mul(ROLL)),
            ended_at: WindowEnds::new(),
            count: 0,
            skipped: 0,
        }
    }

    /// Take the next allocation (its index is the number taken before it); Some(q) when the last
    /// `window` allocations equal those that ended at allocation q (the latest such q, at least a
    /// window back).
    #[inline]
    pub fn push(&mut self, size: usize, stream: usize) -> Option<usize> {
        debug_assert_eq!(self.skipped, 0, "catch_up owed before a push");
        let now = self.count;
        self.count += 1;
        let key = self.slide(alloc_hash(size, stream))?;
        let earlier = self.ended_at.insert(key, now);
        earlier.filter(|&q| now - q >= self.window)
    }

    /// The next allocation's hash joins the window: the window's rolling hash once it is full.
    #[inline]
    fn slide(&mut self, hash: u64) -> Option<u64> {
        if self.recent.len() < self.window {
            self.recent.push(hash);
            self.rolling = self.rolling.wrapping_mul(ROLL).wrapping_add(hash);
            return (self.recent.len() == self.window).then_some(self.rolling);
        }
        let oldest = std::mem::replace(&mut self.recent[self.oldest], hash);
        self.oldest = if self.oldest + 1 == self.window {
            0
        } else {
            self.oldest + 1
        };
        self.rolling = self
            .rolling
            .wrapping_sub(oldest.wrapping_mul(self.oldest_weight))
            .wrapping_mul(ROLL)
            .wrapping_add(hash);
        Some(self.rolling)
    }

    /// Count the next allocation without looking it up, for a caller that knows what `push` would
    /// answer (a program keeping to a plan: see `OnlinePlanner`); its window is owed until
    /// `catch_up`.
    #[inline]
    pub fn skip(&mut self) {
        self.count += 1;
        self.skipped += 1;
    }

    /// Allocations skipped and not caught up with.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Take the windows owed by `skip`, as `push` would have, when only the last `owed` of them
    /// matter (the caller knows that the earlier ones repeat among those). `keys` are the last
    /// `window - 1 + owed` allocations taken, oldest first, ending with the last skipped one.
    pub fn catch_up(&mut self, keys: impl ExactSizeIterator<Item = (usize, usize)>, owed: usize) {
        debug_assert!(owed >= 1 && owed <= self.skipped);
        debug_assert_eq!(keys.len(), self.window - 1 + owed);
        self.recent.clear();
        (self.oldest, self.rolling) = (0, 0);
        let first = self.count - owed;
        for (k, (size, stream)) in keys.enumerate() {
            if let Some(key) = self.slide(alloc_hash(size, stream)) {
                self.ended_at.insert(key, first + k + 1 - self.window);
            }
        }
        self.skipped = 0;
    }
}

fn hash_of(event: &Event) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    event.hash(&mut hasher);
    hasher.finish()
}

/// The events of a request stream given as (is_alloc, size or allocation index, stream): allocations
/// are numbered in order, and a free names the number of the allocation it frees.
pub fn events_of(requests: impl IntoIterator<Item = Request>) -> Vec<Event> {
    let mut allocations = 0usize;
    requests
        .into_iter()
        .map(|request| match request {
            Request::Alloc { size, stream } => {
                allocations += 1;
                Event::Alloc { size, stream }
            }
            Request::Free { allocation } => Event::Free {
                back: allocations.saturating_sub(allocation + 1),
            },
        })
        .collect()
}

/// A request by allocation number, as a trace has them.
#[derive(Clone, Copy, Debug)]
pub enum Request {
    Alloc {
        size: usize,
        stream: usize,
    },
    /// The free of allocation number `allocation` (counted from 0).
    Free {
        allocation: usize,
    },
}

/// The period of `events` that repeats over the most events (at least twice), with at least
/// `min_length` events and at most `max_length`: a training loop's iteration, whatever comes before
/// its first step (the optimizer making its states) and after its last (the model let go); its
/// inner repetitions (layers) repeat over fewer events, its multiples too. Exhaustive over the
/// lengths, O(events x max_length): for traces and for a learning window, not for every request.
/// `at` is where its longest run of repetitions ended.
pub fn steady_period(events: &[Event], min_length: usize, max_length: usize) -> Option<Period> {
    // Each distinct event as a small number: comparing them is the whole cost.
    let mut ids: HashMap<Event, u32> = HashMap::new();
    let keys: Vec<u32> = events
        .iter()
        .map(|e| {
            let next = ids.len() as u32;
            *ids.entry(*e).or_insert(next)
        })
        .collect();
    let longest = max_length.min(keys.len() / 2);
    let mut best: Option<(usize, Period)> = None;
    for length in min_length.max(1)..=longest {
        let (mut run, mut most, mut most_at) = (0usize, 0usize, 0usize);
        for at in length..keys.len() {
            if keys[at] == keys[at - length] {
                run += 1;
                if run > most {
                    (most, most_at) = (run, at);
                }
            } else {
                run = 0;
            }
        }
        // Repeated at least twice: the last `length` events equal the `length` before them.
        if most >= length && best.is_none_or(|(m, _)| most > m) {
            let repeats = most / length + 1;
            best = Some((
                most,
                Period {
                    length,
                    at: most_at,
                    repeats,
                },
            ));
        }
    }
    best.map(|(_, period)| period)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(size: usize) -> Request {
        Request::Alloc { size, stream: 0 }
    }

    /// A training-like stream: `layers` identical layers (each allocates two activations and frees
    /// its scratch), then a loss and an optimizer step that free everything of the iteration.
    fn iteration(first: usize, layers: usize) -> Vec<Request> {
        let mut out = Vec::new();
        let mut next = first;
        let mut activations = Vec::new();
        for _ in 0..layers {
            out.push(alloc(4096));
            activations.push(next);
            out.push(alloc(1024)); // scratch
            out.push(Request::Free {
                allocation: next + 1,
            });
            next += 2;
        }
        out.push(alloc(512)); // the loss
        out.push(alloc(8192)); // the optimizer's buffer
        out.push(Request::Free { allocation: next });
        out.push(Request::Free {
            allocation: next + 1,
        });
        for a in activations.into_iter().rev() {
            out.push(Request::Free { allocation: a });
        }
        out
    }

    fn stream(iterations: usize, layers: usize) -> Vec<Event> {
        let per_iteration = 2 * layers + 2;
        events_of((0..iterations).flat_map(|i| iteration(i * per_iteration, layers)))
    }

    #[test]
    fn an_iteration_repeated_is_found_at_the_end_of_its_second_run() {
        // 4 layers: 3 + 3 + 3 + 3 + 4 + 4 = 20 events an iteration.
        let events = stream(3, 4);
        assert_eq!(events.len(), 60);
        let mut finder = PeriodFinder::new(8, 1000);
        let found: Vec<Period> = events.iter().filter_map(|&e| finder.push(e)).collect();
        // The layers (3 events) are too short to report; the iteration is found once its second
        // run completes (event 39) and the keys of eight events have caught up, at event 46.
        assert_eq!(
            found,
            vec![Period {
                length: 20,
                at: 46,
                repeats: 2
            }]
        );
        let steady = steady_period(&events, 8, 1000).unwrap();
        assert_eq!((steady.length, steady.repeats, steady.at), (20, 3, 59));
    }

    #[test]
    fn inner_repetitions_are_found_first_and_then_passed_over() {
        // With no minimum, the layers' 3 events repeat from the second layer on: found, then they
        // end where the loss comes; the iteration is still found, and it is the steady one.
        let events = stream(4, 6);
        let mut finder = PeriodFinder::new(1, 1000);
        let lengths: Vec<usize> = events
            .iter()
            .filter_map(|&e| finder.push(e))
            .map(|p| p.length)
            .collect();
        assert_eq!(lengths.first(), Some(&3), "the layers first");
        // Two layers' 6 events are the layers' period twice over: not reported on their own.
        assert_eq!(
            lengths,
            vec![3, 28],
            "then the iteration (6 x 3 + 4 + 6 events)"
        );
        assert!(finder.has_ended(3));
        assert_eq!(steady_period(&events, 1, 1000).map(|p| p.length), Some(28));
    }

    #[test]
    fn the_start_of_a_step_matches_the_start_of_the_one_before() {
        // Step 1 makes two extra blocks at its end (an optimizer's states); steps are otherwise
        // 6 allocations: sizes 1..=6 KiB.
        let step: Vec<usize> = (1..=6).map(|k| k << 10).collect();
        let mut stream: Vec<usize> = step.clone();
        stream.extend([100 << 10, 200 << 10]);
        stream.extend(&step);
        stream.extend(&step);
        let mut matcher = StretchMatcher::new(4);
        let found: Vec<(usize, usize)> = stream
            .iter()
            .enumerate()
            .filter_map(|(i, &size)| matcher.push(size, 0).map(|q| (i, q)))
            .collect();
        // Allocation 11 (the 4th of step 2) ends the window 1..4 KiB, which ended at allocation
        // 3 in step 1: step 2 follows step 1 from there on, 8 allocations later. Step 3 matches
        // step 2, 6 later.
        assert_eq!(found[0], (11, 3));
        assert_eq!(found.iter().filter(|(i, q)| i - q == 8).count(), 3);
        assert!(found.iter().any(|&(i, q)| i == 17 && q == 11));
    }

    #[test]
    fn frees_name_their_blocks_by_distance_so_iterations_compare_equal() {
        let events = stream(2, 1);
        // Iteration 1: alloc 4096 (#0), alloc 1024 (#1), free #1 (back 0), alloc 512 (#2),
        // alloc 8192 (#3), free #2 (back 1), free #3 (back 0), free #0 (back 3).
        assert_eq!(events[2], Event::Free { back: 0 });
        assert_eq!(events[5], Event::Free { back: 1 });
        assert_eq!(events[7], Event::Free { back: 3 });
        assert_eq!(events[..8], events[8..]);
    }

    #[test]
    fn no_period_in_a_stream_that_does_not_repeat_or_is_cut_short() {
        let events: Vec<Event> = (0..200)
            .map(|i| Event::Alloc {
                size: i * 512,
                stream: 0,
            })
            .collect();
        assert_eq!(steady_period(&events, 1, 1000), None);
        // A period longer than the longest looked for is not found.
        assert_eq!(steady_period(&stream(3, 4), 8, 19), None);
        // Three iterations and then something else (the model let go): the iteration still.
        let mut events = stream(3, 4);
        events.extend((0..30).map(|i| Event::Alloc {
            size: 100_000 + i,
            stream: 0,
        }));
        assert_eq!(steady_period(&events, 8, 1000).map(|p| p.length), Some(20));
    }

    #[test]
    fn the_window_table_keeps_the_latest_index_of_every_key_as_a_map_does() {
        // Keys that share their top bits land on one home slot and probe past each other; the
        // table grows several times.
        let mut table = WindowEnds::new();
        let mut map = HashMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for index in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = match index % 3 {
                0 => x,
                1 => (x % 37) << 40,
                _ => x % 500,
            };
            assert_eq!(
                table.insert(key, index),
                map.insert(key, index),
                "key {key:#x}"
            );
        }
        assert_eq!(table.len, map.len());
        assert!(2 * table.len <= table.slots.len());
    }

    #[test]
    fn a_stretch_matches_where_it_was_last_asked_for_at_least_a_window_back() {
        let mut matcher = StretchMatcher::new(4);
        // 1 2 3 4 5 | 1 2 3 4 5 | 1 2 3 4 ...: the window 1 2 3 4 first ends at index 3 and again
        // at index 8; from there on each window ended five allocations before.
        let sizes: Vec<usize> = (0..15).map(|i| i % 5 + 1).collect();
        let found: Vec<Option<usize>> = sizes.iter().map(|&s| matcher.push(s, 0)).collect();
        assert_eq!(found[..8], [None; 8]);
        assert_eq!(
            found[8..],
            [
                Some(3),
                Some(4),
                Some(5),
                Some(6),
                Some(7),
                Some(8),
                Some(9)
            ]
        );
        // The same sizes on another stream are another stretch.
        let mut other = StretchMatcher::new(4);
        let found: Vec<Option<usize>> = (0..10).map(|i| other.push(i % 5 + 1, i / 5)).collect();
        assert_eq!(found, [None; 10]);
        // A window that repeats within itself (7 7 7 7 ...) was last asked for one allocation
        // back, less than a window: never a stretch.
        let mut same = StretchMatcher::new(4);
        assert!((0..50).all(|_| same.push(7, 0).is_none()));
    }

    #[test]
    fn a_matcher_caught_up_with_the_last_period_skipped_answers_as_one_never_skipped() {
        // A step of 10 allocations (one size twice, so that a window repeats within the step),
        // repeated; windows of 4. After 2 steps and a window pushed, any number of further
        // allocations skipped, then caught up with the last period's windows (`owed`): from
        // there on, another stretch and the step again, every answer as the matcher's that took
        // them all.
        let step = [1, 2, 3, 1, 2, 3, 4, 5, 6, 7];
        let key = |n: usize| step[n % step.len()];
        for skipped in [1, 3, 9, 10, 11, 25, 64] {
            let (mut all, mut caught) = (StretchMatcher::new(4), StretchMatcher::new(4));
            let pushed = 2 * step.len() + 4;
            for n in 0..pushed {
                assert_eq!(all.push(key(n), 0), caught.push(key(n), 0));
            }
            for n in pushed..pushed + skipped {
                all.push(key(n), 0);
                caught.skip();
            }
            assert_eq!(caught.skipped(), skipped);
            let owed = skipped.min(step.len());
            let end = pushed + skipped;
            caught.catch_up((end + 1 - 4 - owed..end).map(|n| (key(n), 0)), owed);
            assert_eq!(caught.skipped(), 0);
            let after = (0..30)
                .map(|i| 100 + i % 7)
                .chain((0..40).map(|i| key(end + i)));
            for (i, size) in after.enumerate() {
                assert_eq!(
                    all.push(size, 0),
                    caught.push(size, 0),
                    "{skipped} skipped, {i}"
                );
            }
        }
    }
}
