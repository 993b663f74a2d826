//! Offsets for blocks with known lifetimes (dynamic storage allocation, offline). Every planner here
//! is greedy: it takes the blocks in an order of its own and puts each at the lowest offset where it
//! overlaps no block already placed that lives at the same time (first fit over the block's
//! lifetime). The size a placement needs is at least the floor, the most bytes live at once; on
//! training traces the largest-first order reaches it or comes close. A placement above the floor
//! is refined (`refine`): the blocks that ended above it go first in another round. `best` keeps
//! the smallest of the orders, each refined.

/// A block to place: `size` bytes live over events [start, end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub size: usize,
    pub start: usize,
    pub end: usize,
}

impl Lifetime {
    /// Whether the two live at the same time.
    pub fn overlaps(&self, other: &Lifetime) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The order in which a greedy planner takes the blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Largest first (ties: longest-lived, then earliest): the big blocks shape the layout.
    LargestFirst,
    /// Longest-lived first (ties: largest): blocks that outlive the others sit at the bottom.
    LongestFirst,
    /// Largest area (size times lifetime) first.
    LargestAreaFirst,
    /// In time order: what an online first-fit allocator that never moves a block would do.
    EarliestFirst,
}

impl Order {
    pub const ALL: [Order; 4] = [
        Order::LargestFirst,
        Order::LongestFirst,
        Order::LargestAreaFirst,
        Order::EarliestFirst,
    ];

    /// The blocks' indices in this order.
    pub fn sorted(self, blocks: &[Lifetime]) -> Vec<usize> {
        let mut by: Vec<usize> = (0..blocks.len()).collect();
        let length = |b: &Lifetime| b.end.saturating_sub(b.start);
        match self {
            Order::LargestFirst => by.sort_by_key(|&i| {
                let b = &blocks[i];
                (
                    std::cmp::Reverse(b.size),
                    std::cmp::Reverse(length(b)),
                    b.start,
                )
            }),
            Order::LongestFirst => by.sort_by_key(|&i| {
                let b = &blocks[i];
                (
                    std::cmp::Reverse(length(b)),
                    std::cmp::Reverse(b.size),
                    b.start,
                )
            }),
            Order::LargestAreaFirst => by.sort_by_key(|&i| {
                let b = &blocks[i];
                (
                    std::cmp::Reverse(b.size as u128 * length(b) as u128),
                    b.start,
                )
            }),
            Order::EarliestFirst => by.sort_by_key(|&i| (blocks[i].start, i)),
        }
        by
    }

    pub fn name(self) -> &'static str {
        match self {
            Order::LargestFirst => "largest first",
            Order::LongestFirst => "longest first",
            Order::LargestAreaFirst => "largest area first",
            Order::EarliestFirst => "earliest first",
        }
    }
}

/// Where each block goes (its offset, in the blocks' order) and the bytes the range needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub offsets: Vec<usize>,
    pub size: usize,
}

/// The floor: the most bytes live at once (no placement needs less).
pub fn floor(blocks: &[Lifetime]) -> usize {
    // A straight stretch of time: no lifetime runs past the end of a cycle this long.
    let lived: Vec<Lifetime> = blocks.iter().filter(|b| b.end > b.start).copied().collect();
    LiveBytes::cyclic(&lived, usize::MAX).most()
}

/// The bytes live over one repetition of blocks that repeat every `cycle` events: those live at
/// time 0 (the blocks whose lifetime runs past the cycle's end wrap round to it) and the changes
/// in time order (at one instant the ends before the starts: lifetimes are half open).
pub struct LiveBytes {
    pub at_zero: i64,
    pub changes: Vec<(usize, i64)>,
}

impl LiveBytes {
    pub fn cyclic(blocks: &[Lifetime], cycle: usize) -> LiveBytes {
        let mut changes: Vec<(usize, i64)> = Vec::with_capacity(blocks.len() * 2);
        let mut at_zero = 0i64;
        for b in blocks {
            changes.push((b.start, b.size as i64));
            if b.end <= cycle {
                changes.push((b.end, -(b.size as i64)));
            } else {
                at_zero += b.size as i64;
                changes.push((b.end - cycle, -(b.size as i64)));
            }
        }
        changes.sort_unstable();
        LiveBytes { at_zero, changes }
    }

    /// The most bytes live at once: for a cycle, a lifetime past its end counted at the start of
    /// the next (no cyclic placement needs less).
    pub fn most(&self) -> usize {
        let (mut live, mut peak) = (self.at_zero, self.at_zero);
        for &(_, change) in &self.changes {
            live += change;
            peak = peak.max(live);
        }
        peak.max(0) as usize
    }
}

/// Place `blocks` greedily in `order`, each at the lowest offset free over its whole lifetime.
pub fn place(blocks: &[Lifetime], order: Order) -> Placement {
    place_pieces(blocks, &straight_pieces(blocks), order, &[], &[])
}

/// Place blocks that repeat every `period` events (one step of a training loop): a block's lifetime
/// [start, end) may run past the period's end into the next repetition (end > period), where it
/// meets the blocks of the start of the step, so it occupies [start, period) and [0, end - period)
/// of the cycle. Refused (the block's index in the error) when a block starts outside the period or
/// lives longer than it: such a block overlaps its own next repetition and cannot have one offset.
pub fn place_cyclic(blocks: &[Lifetime], period: usize, order: Order) -> Result<Placement, usize> {
    place_cyclic_around(blocks, period, order, &[])
}

/// place_cyclic around `obstacles`: address ranges [start, end) taken at every moment (the blocks
/// that outlive every step, at the addresses they were given), which no block may overlap; the
/// blocks fill the gaps between them first. The placement's size covers the obstacles too.
pub fn place_cyclic_around(
    blocks: &[Lifetime],
    period: usize,
    order: Order,
    obstacles: &[(usize, usize)],
) -> Result<Placement, usize> {
    place_cyclic_pinned(blocks, period, order, obstacles, &[])
}

/// place_cyclic_around where some blocks already have their offset (`pinned[i]`, when Some: a block
/// live now at the address an earlier plan gave it, which its next instances keep): they are
/// placed first, where they are, and the others around them. Pinned blocks must not overlap each
/// other or the obstacles (blocks live at the same time never do).
pub fn place_cyclic_pinned(
    blocks: &[Lifetime],
    period: usize,
    order: Order,
    obstacles: &[(usize, usize)],
    pinned: &[Option<usize>],
) -> Result<Placement, usize> {
    let pieces = cyclic_pieces(blocks, period)?;
    Ok(place_pieces(blocks, &pieces, order, obstacles, pinned))
}

/// Each block's time as one piece: a straight stretch of time.
fn straight_pieces(blocks: &[Lifetime]) -> Vec<Pieces> {
    blocks
        .iter()
        .map(|b| Pieces {
            first: (b.start, b.end),
            second: NO_PIECE,
        })
        .collect()
}

/// Each block's pieces of time in a cycle of `period` (see place_cyclic); Err(index) for a block
/// that starts outside the period or lives longer than it.
fn cyclic_pieces(blocks: &[Lifetime], period: usize) -> Result<Vec<Pieces>, usize> {
    let mut pieces = Vec::with_capacity(blocks.len());
    for (i, b) in blocks.iter().enumerate() {
        if b.start >= period || b.end < b.start || b.end - b.start > period {
            return Err(i);
        }
        pieces.push(if b.end <= period {
            Pieces {
                first: (b.start, b.end),
                second: NO_PIECE,
            }
        } else {
            Pieces {
                first: (b.start, period),
                second: (0, b.end - period),
            }
        });
    }
    Ok(pieces)
}

/// The greedy placement, over each block's pieces of time (the blocks give sizes and the order),
/// around address ranges taken at all times and the blocks pinned where they are.
fn place_pieces(
    blocks: &[Lifetime],
    pieces: &[Pieces],
    order: Order,
    obstacles: &[(usize, usize)],
    pinned: &[Option<usize>],
) -> Placement {
    let mut sorted_obstacles = obstacles.to_vec();
    sorted_obstacles.sort_unstable();
    place_in_order(
        blocks,
        pieces,
        &order.sorted(blocks),
        &sorted_obstacles,
        pinned,
    )
}

/// A placement of place_cyclic_pinned (`greedy`, of `order`) refined where it is above `floor`
/// (`refine`; the most the blocks, `LiveBytes::cyclic`, and the obstacles hold at once):
/// Some(smaller placement) where a round found one.
pub fn refine_cyclic_pinned(
    blocks: &[Lifetime],
    period: usize,
    order: Order,
    obstacles: &[(usize, usize)],
    pinned: &[Option<usize>],
    greedy: &Placement,
    floor: usize,
) -> Result<Option<Placement>, usize> {
    let pieces = cyclic_pieces(blocks, period)?;
    let mut sorted_obstacles = obstacles.to_vec();
    sorted_obstacles.sort_unstable();
    let by = order.sorted(blocks);
    Ok(refine(
        blocks,
        &pieces,
        by,
        &sorted_obstacles,
        pinned,
        greedy,
        floor,
    ))
}

/// Rounds of `refine` at most: each is one more greedy placement.
const REFINE_ROUNDS: usize = 12;

/// Rounds in a row that give no smaller placement after which `refine` stops.
const REFINE_PATIENCE: usize = 3;

/// Refine a greedy placement (`greedy`, of the order `by`) that is above `floor` (the most bytes
/// live at once, the obstacles' included): the blocks that ended above the floor are placed
/// first in the next round (in the order they had), the others after them as before, so that
/// the blocks that found no room below it take theirs before blocks that had a choice. Where a
/// short-lived block ends on top because the blocks placed before it filled every hole of its
/// lifetime, placing it first sends those elsewhere: on a GPT-2 step, 2.4 MiB over the floor
/// becomes 1.4. The smallest placement of the rounds, where one is smaller than `greedy`.
fn refine(
    blocks: &[Lifetime],
    pieces: &[Pieces],
    mut by: Vec<usize>,
    obstacles: &[(usize, usize)],
    pinned: &[Option<usize>],
    greedy: &Placement,
    target: usize,
) -> Option<Placement> {
    let (mut best, mut latest): (Option<Placement>, Vec<usize>) = (None, greedy.offsets.clone());
    let (mut smallest, mut idle) = (greedy.size, 0);
    for _ in 0..REFINE_ROUNDS {
        if smallest <= target || idle == REFINE_PATIENCE {
            break;
        }
        let (mut first, rest): (Vec<usize>, Vec<usize>) = by
            .iter()
            .partition(|&&i| latest[i] + blocks[i].size > target);
        first.extend(rest);
        if first == by {
            // Nothing above the floor, or the same order again: the same placement would follow.
            break;
        }
        by = first;
        let next = place_in_order(blocks, pieces, &by, obstacles, pinned);
        latest.clone_from(&next.offsets);
        if next.size < smallest {
            smallest = next.size;
            best = Some(next);
            idle = 0;
        } else {
            idle += 1;
        }
    }
    best
}

/// The greedy placement with the order given: each block of `by` in turn at the lowest offset
/// free over its lifetime, around the obstacles (sorted) and the pinned blocks.
fn place_in_order(
    blocks: &[Lifetime],
    pieces: &[Pieces],
    by: &[usize],
    obstacles: &[(usize, usize)],
    pinned: &[Option<usize>],
) -> Placement {
    let mut index = TimeIndex::new(pieces);
    let mut offsets = vec![0usize; blocks.len()];
    let mut size = obstacles.iter().map(|&(_, end)| end).max().unwrap_or(0);
    let mut taken: Vec<(usize, usize)> = Vec::new();
    let pinned_at = |i: usize| pinned.get(i).copied().flatten();
    for (i, block) in blocks.iter().enumerate() {
        if let Some(offset) = pinned_at(i) {
            offsets[i] = offset;
            size = size.max(offset + block.size);
            index.insert(i);
        }
    }
    for &i in by {
        let block = blocks[i];
        if block.size == 0 || block.end <= block.start || pinned_at(i).is_some() {
            continue;
        }
        // The address ranges of the placed blocks that live at the same time, lowest first; the
        // obstacles (sorted once) are walked beside them rather than copied in for every block.
        taken.clear();
        index.for_each_overlapping(i, |j| {
            taken.push((offsets[j], offsets[j] + blocks[j].size));
        });
        // By start alone: of two ranges that start together, either may come first (the walk
        // below ends up past both), and the key is cheaper to sort by than the pair.
        taken.sort_unstable_by_key(|&(low, _)| low);
        let (mut placed, mut fixed) = (taken.iter().peekable(), obstacles.iter().peekable());
        let mut offset = 0usize;
        loop {
            let next = match (placed.peek(), fixed.peek()) {
                (Some(&&p), Some(&&f)) if f < p => fixed.next().copied(),
                (Some(_), _) => placed.next().copied(),
                (None, _) => fixed.next().copied(),
            };
            let Some((low, high)) = next else { break };
            if low >= offset + block.size {
                break;
            }
            offset = offset.max(high);
        }
        offsets[i] = offset;
        size = size.max(offset + block.size);
        index.insert(i);
    }
    Placement { offsets, size }
}

/// The smallest placement of every order, each refined (`refine`), with its order: the best
/// offline placement known here.
pub fn best(blocks: &[Lifetime]) -> (Order, Placement) {
    let (pieces, floor) = (straight_pieces(blocks), floor(blocks));
    best_of_orders(blocks.len(), |order| {
        let by = order.sorted(blocks);
        let greedy = place_in_order(blocks, &pieces, &by, &[], &[]);
        Some(refine(blocks, &pieces, by, &[], &[], &greedy, floor).unwrap_or(greedy))
    })
    .expect("there are orders")
}

/// Blocks below which the orders are placed one after the other: starting a thread costs more
/// than placing a few hundred blocks.
const PARALLEL_FROM: usize = 512;

/// The smallest of `place`'s placements over every order (None where it has none), with its order;
/// on a tie the earlier order in `Order::ALL`, so that the choice never depends on which thread
/// ends first. With PARALLEL_FROM or more `blocks` to place and more than one core, each order
/// runs on a thread of its own: the orders are independent, and a long step's placement is the planner's longest
/// work (tens of milliseconds for a few thousand blocks). Where a thread cannot be started, its
/// order runs here.
pub fn best_of_orders<F>(blocks: usize, place: F) -> Option<(Order, Placement)>
where
    F: Fn(Order) -> Option<Placement> + Sync,
{
    let threaded = blocks >= PARALLEL_FROM
        && std::thread::available_parallelism().is_ok_and(|cores| cores.get() > 1);
    best_of_orders_on(threaded, place)
}

/// best_of_orders with the choice of threads made by the caller (the benchmark times both).
pub fn best_of_orders_on<F>(threaded: bool, place: F) -> Option<(Order, Placement)>
where
    F: Fn(Order) -> Option<Placement> + Sync,
{
    let results: Vec<Option<Placement>> = if !threaded {
        Order::ALL.iter().map(|&order| place(order)).collect()
    } else {
        std::thread::scope(|scope| {
            let place = &place;
            let started: Vec<_> = Order::ALL[1..]
                .iter()
                .map(|&order| {
                    let thread = std::thread::Builder::new()
                        .name("accalloc-plan".into())
                        .spawn_scoped(scope, move || place(order));
                    (order, thread)
                })
                .collect();
            let mut results = vec![place(Order::ALL[0])];
            for (order, thread) in started {
                results.push(match thread {
                    Ok(handle) => handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    Err(_) => place(order),
                });
            }
            results
        })
    };
    Order::ALL
        .into_iter()
        .zip(results)
        .filter_map(|(order, placement)| placement.map(|p| (order, p)))
        .min_by_key(|(_, placement)| placement.size)
}

/// A block's time: one piece, or two for a cyclic lifetime that wraps past the period's end.
/// An empty piece (`NO_PIECE`) stands for none, rather than an Option: a None leaves its payload
/// uninitialised, and the written-out `overlaps` below, compiled, reads it before the tag (harmless,
/// but valgrind sees a branch on uninitialised memory).
#[derive(Clone, Copy, Debug)]
struct Pieces {
    first: (usize, usize),
    second: (usize, usize),
}

/// The empty piece: meets nothing.
const NO_PIECE: (usize, usize) = (0, 0);

impl Pieces {
    fn each(&self) -> impl Iterator<Item = (usize, usize)> {
        [self.first, self.second]
            .into_iter()
            .filter(|(start, end)| end > start)
    }

    /// Written out rather than over `each`: this is the planner's innermost test.
    #[inline]
    fn overlaps(&self, other: &Pieces) -> bool {
        #[inline(always)]
        fn meet((s, e): (usize, usize), (os, oe): (usize, usize)) -> bool {
            s < e && os < oe && s < oe && os < e
        }
        // An empty piece meets nothing (`meet` checks both are non-empty).
        meet(self.first, other.first)
            || meet(self.first, other.second)
            || meet(self.second, other.first)
            || meet(self.second, other.second)
    }
}

/// The placed blocks by time bucket, so that a block is checked only against those that may live
/// at the same time (a long-lived block is listed in every bucket it spans).
struct TimeIndex<'a> {
    pieces: &'a [Pieces],
    width: usize,
    buckets: Vec<Vec<u32>>,
    /// The last query that saw each block, so that one listed in several buckets counts once.
    seen: Vec<u32>,
    query: u32,
    /// Every block inserted: a block that spans more buckets than there are blocks is checked
    /// against these instead (a long lifetime would visit the same blocks bucket after bucket).
    inserted: Vec<u32>,
    /// Entries in all buckets.
    listed: usize,
}

impl<'a> TimeIndex<'a> {
    const BUCKETS: usize = 4096;

    fn new(pieces: &'a [Pieces]) -> Self {
        let end = pieces
            .iter()
            .flat_map(|p| p.each())
            .map(|(_, end)| end)
            .max()
            .unwrap_or(0);
        let width = end.div_ceil(Self::BUCKETS).max(1);
        TimeIndex {
            pieces,
            width,
            buckets: vec![Vec::new(); end / width + 1],
            seen: vec![0; pieces.len()],
            query: 0,
            inserted: Vec::new(),
            listed: 0,
        }
    }

    /// The buckets block `i` spans: one range per piece (an empty range for no second piece).
    /// Ranges, not a collected list: this runs for every block placed and every query.
    fn buckets_of(&self, i: usize) -> [std::ops::Range<usize>; 2] {
        let width = self.width;
        let span = |(start, end): (usize, usize)| {
            if end > start {
                start / width..(end - 1) / width + 1
            } else {
                0..0
            }
        };
        let pieces = &self.pieces[i];
        [span(pieces.first), span(pieces.second)]
    }

    fn insert(&mut self, i: usize) {
        for range in self.buckets_of(i) {
            self.listed += range.len();
            for bucket in range {
                self.buckets[bucket].push(i as u32);
            }
        }
        self.inserted.push(i as u32);
    }

    fn for_each_overlapping(&mut self, i: usize, mut f: impl FnMut(usize)) {
        self.query += 1;
        let ranges = self.buckets_of(i);
        let spanned: usize = ranges.iter().map(|r| r.len()).sum();
        // The entries in the block's buckets, estimated from the average, against one look at
        // every block.
        let average = self.listed / self.buckets.len().max(1);
        if spanned * average.max(1) > self.inserted.len() {
            for &j in &self.inserted {
                let j = j as usize;
                if self.pieces[j].overlaps(&self.pieces[i]) {
                    f(j);
                }
            }
            return;
        }
        for bucket in ranges.into_iter().flatten() {
            for &j in &self.buckets[bucket] {
                let j = j as usize;
                if self.seen[j] != self.query && self.pieces[j].overlaps(&self.pieces[i]) {
                    self.seen[j] = self.query;
                    f(j);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_block_stays_where_it_is_and_the_others_go_around_it() {
        // A (6 bytes) and B (4) live together, C (3) after A, with B. Unpinned, largest first
        // puts A at 0, B above it at 6, and C where A was, at 0. With B pinned at 0, A goes above
        // B, at 4, and C too, at 4, once A has gone: 10 bytes either way.
        let blocks = [block(6, 0, 5), block(4, 2, 9), block(3, 6, 9)];
        let free = place_cyclic_around(&blocks, 10, Order::LargestFirst, &[]).unwrap();
        assert_eq!(free.offsets, vec![0, 6, 0]);
        let pinned = [None, Some(0), None];
        let p = place_cyclic_pinned(&blocks, 10, Order::LargestFirst, &[], &pinned).unwrap();
        assert_eq!(p.offsets, vec![4, 0, 4]);
        assert_eq!(p.size, 10);
        check(&blocks, &p);
    }

    fn block(size: usize, start: usize, end: usize) -> Lifetime {
        Lifetime { size, start, end }
    }

    /// No two blocks that live at the same time share a byte, and all fit in the size.
    fn check(blocks: &[Lifetime], placement: &Placement) {
        for (i, a) in blocks.iter().enumerate() {
            assert!(placement.offsets[i] + a.size <= placement.size);
            for (j, b) in blocks.iter().enumerate().skip(i + 1) {
                let (x, y) = (placement.offsets[i], placement.offsets[j]);
                let apart = x + a.size <= y || y + b.size <= x;
                assert!(!a.overlaps(b) || apart, "blocks {i} and {j} collide");
            }
        }
    }

    #[test]
    fn the_floor_is_the_most_bytes_live_at_once() {
        // 100 over [0, 4), 50 over [1, 3), 70 over [3, 6): at time 1-2, 150; at 3, 170.
        let blocks = [block(100, 0, 4), block(50, 1, 3), block(70, 3, 6)];
        assert_eq!(floor(&blocks), 170);
        // Half open: one ends where the other starts, and they never live together.
        assert_eq!(floor(&[block(100, 0, 2), block(100, 2, 4)]), 100);
    }

    #[test]
    fn the_cyclic_floor_counts_a_lifetime_past_the_cycle_at_the_next_cycles_start() {
        // Every 10 events: 100 over [2, 6), 50 over [5, 9), and 70 over [8, 13), which runs 3
        // events into the next repetition, where it meets the 100 of [2, 6)? No: it ends at 3
        // of the next one, and the 100 starts at 2, so they meet over [2, 3): 170 there; the 50
        // and the 70 meet over [8, 9): 120; the 100 and the 50 over [5, 6): 150.
        let blocks = [block(100, 2, 6), block(50, 5, 9), block(70, 8, 13)];
        assert_eq!(LiveBytes::cyclic(&blocks, 10).most(), 170);
        // Without the wrap (a straight stretch of time) the 70 meets only the 50.
        assert_eq!(floor(&blocks), 150);
        // Half open across the wrap too: ending at 2 of the next repetition, it does not meet
        // the 100 that starts there.
        let ends_at_the_start = [block(100, 2, 6), block(70, 8, 12)];
        assert_eq!(LiveBytes::cyclic(&ends_at_the_start, 10).most(), 100);
    }

    #[test]
    fn largest_first_puts_each_block_at_the_lowest_free_offset_over_its_lifetime() {
        // Worked by hand: 100 [0,4) goes at 0; 70 [3,6) overlaps it, so at 100; 50 [1,3) overlaps
        // only the 100 (the 70 starts when it ends): the lowest gap is at 100, free over [1,3).
        let blocks = [block(100, 0, 4), block(50, 1, 3), block(70, 3, 6)];
        let p = place(&blocks, Order::LargestFirst);
        assert_eq!(p.offsets, vec![0, 100, 100]);
        assert_eq!(p.size, 170);
        check(&blocks, &p);
    }

    #[test]
    fn the_time_order_leaves_a_hole_that_largest_first_does_not() {
        // A (60, [0,2)) and B (40, [0,4)) first; at 2 A is gone and C (100, [2,4)) needs a hole
        // of 100. In time order A is at 0, B at 60, C above B at 100: 200. Largest first: C at 0,
        // B at 100, A at 0 (C is not live yet): 140, the floor.
        let blocks = [block(60, 0, 2), block(40, 0, 4), block(100, 2, 4)];
        let online = place(&blocks, Order::EarliestFirst);
        assert_eq!(
            (online.offsets.clone(), online.size),
            (vec![0, 60, 100], 200)
        );
        let (order, planned) = best(&blocks);
        assert_eq!(planned.size, 140);
        assert_eq!(planned.size, floor(&blocks));
        assert_ne!(order, Order::EarliestFirst);
        check(&blocks, &online);
        check(&blocks, &planned);
    }

    #[test]
    fn a_cyclic_lifetime_meets_the_start_of_the_next_step() {
        // A step of 10 events. A (100) lives [8, 13): to the end of the step and 3 events into the
        // next, where it meets B (50, [1, 5)); C (100, [4, 8)) meets B but not A, so: A at 0;
        // C shares A's bytes (A is gone from 3 to 8); B above both, at 100.
        let blocks = [block(100, 8, 13), block(50, 1, 5), block(100, 4, 8)];
        let p = place_cyclic(&blocks, 10, Order::LargestFirst).unwrap();
        assert_eq!((p.offsets.clone(), p.size), (vec![0, 100, 0], 150));
        // Placed as a straight line, A alone with B would not meet it (B ends before A starts):
        // the cycle is what keeps them apart.
        let pair = [block(100, 8, 13), block(50, 1, 5)];
        assert_eq!(place(&pair, Order::LargestFirst).size, 100);
        assert_eq!(
            place_cyclic(&pair, 10, Order::LargestFirst).unwrap().size,
            150
        );
        // A block longer than the step overlaps its own next repetition; one outside the step is
        // not of it.
        assert_eq!(
            place_cyclic(&[block(10, 2, 13)], 10, Order::LargestFirst),
            Err(0)
        );
        assert_eq!(
            place_cyclic(
                &[block(10, 1, 2), block(10, 10, 12)],
                10,
                Order::LargestFirst
            ),
            Err(1)
        );
    }

    #[test]
    fn blocks_fill_the_gaps_between_fixed_ones_first() {
        // Weights at [0, 100) and [300, 400), there for every step. A (200, [0, 5)) fits the gap
        // [100, 300); B (150, [2, 8)) meets A and goes above the weights, at 400; C (150, [6, 9))
        // does not meet A: the gap is its.
        let obstacles = [(0, 100), (300, 400)];
        let blocks = [block(200, 0, 5), block(150, 2, 8), block(150, 6, 9)];
        let p = place_cyclic_around(&blocks, 10, Order::LargestFirst, &obstacles).unwrap();
        assert_eq!((p.offsets.clone(), p.size), (vec![100, 400, 100], 550));
        // Nothing placed: the obstacles alone.
        assert_eq!(
            place_cyclic_around(&[], 10, Order::LargestFirst, &obstacles)
                .unwrap()
                .size,
            400
        );
    }

    #[test]
    fn a_block_that_ends_on_top_is_placed_first_and_the_placement_reaches_the_floor() {
        // A (6, [8, 10)), B, C and D (4 each; [0, 8), [2, 10), [3, 7)). The floor is 12 (B, C and
        // D over [3, 7)). Largest first: A at 0; B (as long as C, earlier) at 0, as A is not
        // live yet; C meets both, at 6; D meets B ([0, 4)) and C ([6, 10)), no gap of 4 below
        // 10: at 10, 14 bytes. Every order leaves one of them at 14.
        let blocks = [
            block(6, 8, 10),
            block(4, 0, 8),
            block(4, 2, 10),
            block(4, 3, 7),
        ];
        let greedy = place(&blocks, Order::LargestFirst);
        assert_eq!(
            (greedy.offsets.clone(), greedy.size),
            (vec![0, 0, 6, 10], 14)
        );
        for order in Order::ALL {
            assert_eq!(place(&blocks, order).size, 14, "{order:?}");
        }
        // Refined: D ended above the floor, so it goes first: D at 0, A at 0 (they never meet),
        // B above D at 4, C above A and B at 8: 12, the floor.
        let (_, refined) = best(&blocks);
        assert_eq!(
            (refined.offsets.clone(), refined.size),
            (vec![0, 4, 8, 0], 12)
        );
        assert_eq!(refined.size, floor(&blocks));
        check(&blocks, &refined);
        // As one step of 10 events (no lifetime wraps) the same.
        let step = place_cyclic(&blocks, 10, Order::LargestFirst).unwrap();
        let refined_step =
            refine_cyclic_pinned(&blocks, 10, Order::LargestFirst, &[], &[], &step, 12).unwrap();
        assert_eq!(refined_step, Some(refined));
    }

    #[test]
    fn empty_and_zero_sized_blocks_take_nothing() {
        assert_eq!(place(&[], Order::LargestFirst).size, 0);
        let blocks = [block(0, 0, 5), block(10, 3, 3), block(8, 1, 2)];
        let p = place(&blocks, Order::LargestFirst);
        assert_eq!((p.size, floor(&blocks)), (8, 8));
    }

    #[test]
    fn every_order_places_random_cyclic_lifetimes_without_collisions() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n) as usize
        };
        let period = 400;
        let pieces = |b: &Lifetime| Pieces {
            first: (b.start, b.end.min(period)),
            second: if b.end > period {
                (0, b.end - period)
            } else {
                NO_PIECE
            },
        };
        for _ in 0..20 {
            let blocks: Vec<Lifetime> = (0..150)
                .map(|_| {
                    let start = next(period as u64);
                    block(512 * (1 + next(64)), start, start + 1 + next(period as u64))
                })
                .collect();
            let floor = LiveBytes::cyclic(&blocks, period).most();
            // Every other round around two obstacles, the first block pinned above them.
            let around = next(2) == 1;
            let obstacles: &[(usize, usize)] = if around {
                &[(0, 3000), (9000, 10000)]
            } else {
                &[]
            };
            let pinned: Vec<Option<usize>> = (0..blocks.len())
                .map(|i| (around && i == 0).then_some(20_000))
                .collect();
            for order in Order::ALL {
                let greedy =
                    place_cyclic_pinned(&blocks, period, order, obstacles, &pinned).unwrap();
                let refined =
                    refine_cyclic_pinned(&blocks, period, order, obstacles, &pinned, &greedy, {
                        floor + obstacles.iter().map(|&(s, e)| e - s).sum::<usize>()
                    })
                    .unwrap()
                    .unwrap_or_else(|| greedy.clone());
                assert!(floor <= refined.size && refined.size <= greedy.size);
                for p in [greedy, refined] {
                    if around {
                        assert_eq!(p.offsets[0], 20_000, "{order:?}: the pinned block moved");
                    }
                    for (i, a) in blocks.iter().enumerate() {
                        let (x, end) = (p.offsets[i], p.offsets[i] + a.size);
                        assert!(
                            a.size == 0 || obstacles.iter().all(|&(s, e)| end <= s || e <= x),
                            "{order:?}: {i} on an obstacle"
                        );
                    }
                    for (i, a) in blocks.iter().enumerate() {
                        for (j, b) in blocks.iter().enumerate().skip(i + 1) {
                            let (x, y) = (p.offsets[i], p.offsets[j]);
                            let apart = x + a.size <= y || y + b.size <= x;
                            assert!(
                                !pieces(a).overlaps(&pieces(b)) || apart,
                                "{order:?}: {i} and {j}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_order_places_random_lifetimes_without_collisions() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n) as usize
        };
        for _ in 0..20 {
            let blocks: Vec<Lifetime> = (0..200)
                .map(|_| {
                    let start = next(1000);
                    block(512 * (1 + next(64)), start, start + 1 + next(200))
                })
                .collect();
            for order in Order::ALL {
                let p = place(&blocks, order);
                check(&blocks, &p);
                assert!(p.size >= floor(&blocks));
            }
            let (order, refined) = best(&blocks);
            check(&blocks, &refined);
            assert!(floor(&blocks) <= refined.size);
            assert!(refined.size <= place(&blocks, order).size);
        }
    }
}
