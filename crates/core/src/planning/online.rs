//! Planning while the program runs (the `planned_placement` setting). The planner sees every
//! allocation and free of a device, finds the step of a training loop, plans offsets for the blocks
//! of one step, and from then on says where each request goes. It holds no memory and makes no
//! device call: the allocator asks it for advice, serves the request at the advised address when
//! that range is free, and otherwise serves it as it always does. A wrong plan costs memory, never
//! correctness.
//!
//! - **The step.** `StretchMatcher` says where the latest `WINDOW` allocations were asked for
//!   before, in the same order: an allocation `q` back. The `period` allocations since `q` are a
//!   template of what comes next. The layers of a model repeat too, and are found first; a plan for
//!   a layer stops matching where the layer stack ends and is dropped, its length never tried again,
//!   and a longer period replaces a shorter one while the program leaves the shorter's plan.
//! - **Lifetimes.** A block of the template lives as long as it did, or, still live, as its instance
//!   one period before did (the nearest allocation of its size then: the first step may have asked
//!   for more). Blocks that live a period or longer (weights, optimizer states) are not planned:
//!   the policy serves them, and where they lie they are obstacles. A live block with no earlier
//!   instance (the first backward's gradients) stays an obstacle, and its next instance is planned
//!   where it is. Every other live block keeps its place (pinned), its next instances too, so that
//!   a plan fits around what is there and its first pass meets nothing in its way.
//! - **Placement.** `placement::place_cyclic_pinned`, the best of its orders, refined
//!   (`placement::refine_cyclic_pinned`) where that saves a page: offsets in one
//!   expandable segment of the stream (the allocator's choice: where most live bytes are), counted
//!   from the page of the lowest live block, around the obstacles. A stretch whose blocks mostly
//!   outlive it (a layer of the forward pass) is no step, and a plan whose pages come to more than
//!   the most ever allocated and `PLAN_SLACK` is not made (the allocator checks the same with the
//!   pages mapped outside the plan counted too).
//! - **Serving.** Each request moves a cursor through the template: the next position with the same
//!   size and stream, within `LOOKAHEAD` (the first step makes the optimizer's states, which later
//!   steps skip). A request matching no position is off the plan. A pass through the template that
//!   skipped, missed or conflicted (the first pass aside), or a plan that left positions unplanned
//!   and placed more than the one before, asks for a new plan, made at its quiet position (where
//!   the fewest planned bytes are live, so that the fewest are pinned) from the last period like
//!   it (the step just seen, exact once the first step's extras are gone). A pass a tenth of which
//!   was off the plan drops it: the shapes change from step to step.
//! - **Shapes.** A step of another shape (batch and sequence length that change what its tensors
//!   weigh, not the order it asks for them in) keeps to the plan's positions: a request at the
//!   cursor unlike the position's size (within `SHAPE_FACTOR`, the same stream) is taken for it
//!   once the request after it keeps to the plan (until then it is tentative, and undone, off the
//!   plan, when that one does not). It is served at the planned address when it fits the bytes
//!   placed there; a larger one goes to the policy, and the pass asks for a new plan in which
//!   each position has the most it has been asked for (`asked_at`): one layout serves every shape
//!   seen, its pages mapped once.

use super::log::{Entry, Log, LIVE};
use super::period::StretchMatcher;
use super::placement::{
    best_of_orders, place_cyclic_pinned, refine_cyclic_pinned, Lifetime, LiveBytes, Placement,
};
use std::collections::{HashMap, HashSet};

type StreamId = usize;

/// Allocations a stretch must repeat before it counts as a match.
const WINDOW: usize = 32;
/// The longest step planned, in allocations.
const MAX_PERIOD: usize = 1 << 15;
/// Allocations kept in the log, at most: four periods of the longest step (a plan reads at most
/// three, and the matcher's catching up one).
const LOG_KEPT: usize = 4 * MAX_PERIOD;
/// The oldest allocations leave the log this many at a time, when it holds `LOG_KEPT`: a ring that
/// never outgrows `LOG_KEPT` (a power of two, as the ring's room grows), so that the entries a
/// planned request writes come round in half the memory that dropping half the log at a time
/// takes. The log holds at least `LOG_KEPT - LOG_DRAINED` allocations once it has that many.
const LOG_DRAINED: usize = MAX_PERIOD / 8;
/// How far ahead of the cursor a request is looked for.
const LOOKAHEAD: usize = 1024;
/// A request found within this many positions of the cursor counts as on the plan.
const CLOSE: usize = 8;
/// Of the last 64 requests, fewer than this on the plan drops it.
const MIN_ON_PLAN: u32 = 32;
/// How far apart a request's size and its position's may be for the request to be taken for the
/// position in a step of another shape: attention scores grow with the square of the sequence
/// length, so a bucket four times as long asks 16 times the bytes there (and the batch moves
/// too). On the recorded traces 32 is the best of 8 to 256: 16 leaves the bucketed GPT-2's
/// 2x256 steps off the plan at a few positions, 64 takes a Llama request of the first steps for
/// one (docs/PERFORMANCE.md).
const SHAPE_FACTOR: usize = 32;
/// How far above the most ever allocated a plan may reach and still be put in force.
pub const PLAN_SLACK: f64 = 0.02;
/// How far above the most the last two passes of a plan allocated the device may hold at a pass's
/// end and keep its free pages outside the plan mapped for the next pass: expandable_trim's
/// default line (docs/PERFORMANCE.md has the figures).
pub const PASS_KEEP_SLACK: f64 = 0.05;

/// A period found: the template is the `period` allocations from number `from` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    from: usize,
    period: usize,
}

impl Candidate {
    /// Allocations in one step.
    pub fn period(&self) -> usize {
        self.period
    }

    /// The same stretch `steps` steps later.
    pub fn later(&self, steps: usize) -> Candidate {
        Candidate {
            from: self.from + steps * self.period,
            period: self.period,
        }
    }
}

/// Where a plan may go: the stream's large expandable segment and what is live in it now.
#[derive(Clone, Debug)]
pub struct Region {
    pub stream: StreamId,
    pub base: usize,
    pub size: usize,
    /// Allocated blocks in the range: (address, block size).
    pub live: Vec<(usize, usize)>,
    /// The most bytes the device has had allocated.
    pub peak_allocated: usize,
    /// The segment's page size.
    pub page: usize,
}

/// The plan in force.
#[derive(Clone, Debug)]
struct Plan {
    /// (rounded size, stream) of each position of the template.
    keys: Vec<(usize, StreamId)>,
    /// The bytes placed at each position: its key's size, or more where a step of another shape
    /// asked for more there before; a request at a position that fits them is served there.
    sizes: Vec<usize>,
    /// The most asked for at each position so far (`advise`): what the next plan places.
    asked: Vec<usize>,
    /// The requests just taken for their positions in a step of another shape, (position,
    /// size), until the request after them keeps to the plan or does not (`advise`).
    resized: Vec<(usize, usize)>,
    /// A position was asked for more than its bytes this pass (`advance`): the first pass too
    /// asks for a new plan.
    grown: bool,
    /// The plan, or the one it replaced (of a period within a 32nd of its own), went once through
    /// its step: requests of another shape are looked for at their positions (before, a request
    /// unlike the position's is more often one of the first step's, which the template lacks).
    steady: bool,
    /// Requests were taken for positions of another shape and undone since the last request at
    /// the cursor kept to the plan: none is taken so until one does.
    undone: bool,
    /// The planned address of each position; None: served by the policy.
    addresses: Vec<Option<usize>>,
    /// The latest allocation logged at the plan's next position, and that position: how a
    /// replacement's template lines up with this plan's positions (`asked_at`).
    latest: Option<(usize, usize)>,
    /// The next position expected.
    cursor: usize,
    /// Which of the last 64 requests were on the plan.
    recent: RecentRequests,
    /// This pass through the template: positions skipped, requests off the plan, planned requests
    /// whose range was taken.
    skipped: usize,
    missed: usize,
    conflicts: usize,
    /// A pass was not clean: replace the plan at the next similar match.
    rebuild_wanted: bool,
    /// Passes through the template ended.
    passes: usize,
    /// Positions with no address, and whether there are fewer than in the plan it replaced.
    unplanned: usize,
    improved: bool,
    /// The address range the plan's blocks lie in, and the pages they touch, as runs of adjacent
    /// pages: [start, end) addresses.
    range: (usize, usize),
    touched_runs: Vec<(usize, usize)>,
    /// The least any placement of its blocks needs: the most bytes they and the blocks around
    /// them (the obstacles) hold at once.
    floor: usize,

    /// The position before which the fewest planned bytes are live: a new plan is made there,
    /// where the fewest blocks are in its way.
    quiet: usize,
    /// For each position, how far back the stretch matcher finds the `WINDOW` allocations ending
    /// there in a program that keeps to the template (0: it reports none): what it answers once a
    /// period and a window have kept to the plan, so that it need not be asked (`allocated`).
    window_back: Vec<u32>,
}

/// Which of the last 64 requests were on the plan, with their count kept as they come: the request
/// path asks it at every request, and the baseline x86-64 target has no popcount instruction.
#[derive(Clone, Copy, Debug, Default)]
struct RecentRequests {
    /// 1 where on the plan, the latest in the lowest bit.
    bits: u64,
    /// Requests seen, up to 64, and how many of those were on the plan.
    seen: u32,
    on_plan: u32,
}

impl RecentRequests {
    #[inline]
    fn push(&mut self, on_plan: bool) {
        // The oldest of 64 leaves (the top bit is 0 before 64 have come).
        self.on_plan = self.on_plan - (self.bits >> 63) as u32 + on_plan as u32;
        self.bits = (self.bits << 1) | on_plan as u64;
        self.seen = (self.seen + 1).min(64);
        debug_assert_eq!(self.on_plan, self.bits.count_ones());
    }

    /// How many of the last `seen` requests were on the plan.
    #[inline]
    fn on_plan(&self) -> u32 {
        self.on_plan
    }

    #[inline]
    fn seen(&self) -> u32 {
        self.seen
    }
}

/// What the planner has done: for tools, tests and the C ABI's accalloc_planner_stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlannerCounters {
    /// Plans made (each replaces the one before).
    pub plans: u64,
    /// Plans tried: made, or not made because they would not pay.
    pub attempts: u64,
    /// Plans dropped because requests stopped matching them.
    pub dropped: u64,
    /// Requests given an address by a plan.
    pub advised: u64,
    /// Of them, those whose range was taken, served by the policy instead.
    pub conflicts: u64,
    /// Of them, those served from the block parked at their address (freed there by the plan's
    /// request before): the fast path (caching/allocator/parking.rs).
    pub from_parked: u64,
    /// Bytes the latest plan spans in its segment (0 before the first).
    pub height: u64,
    /// The least the latest plan could span: the most bytes its step's blocks and the long-lived
    /// blocks around them hold at once (`height` over it is what packing around those costs; 0
    /// before the first).
    pub floor: u64,
    /// Whether a plan is in force now and the program keeps to it (`planning`).
    pub in_force: bool,
}

/// The planner of one device.
pub struct OnlinePlanner {
    /// The latest allocations; its `next` is the number of allocations so far.
    log: Log,
    /// Events (allocations and frees) so far: the planner's clock.
    time: usize,
    /// The allocation number of each live logged block, by the allocator's slot for it (its block
    /// id: small and dense, so a vector indexed by it costs no hash on the request path); LIVE where
    /// no logged block lives.
    live: Vec<usize>,
    matcher: StretchMatcher,
    /// The allocation number the matcher counts from.
    matcher_base: usize,
    plan: Option<Plan>,
    /// Periods whose plans were dropped (layers, mostly): never tried again.
    banned: HashSet<usize>,
    counters: PlannerCounters,
    /// A pass through the template ended since `take_pass_end` was last asked.
    pass_ended: bool,
    /// No candidate is taken before this many allocations (a plan just failed).
    quiet_until: usize,
    /// The latest period the matcher reported that is like the plan's.
    similar_period: Option<usize>,
    /// The plan the one in force replaced, until the allocator accepts it.
    replaced: Option<Box<Plan>>,
    /// Plans that failed or were rejected in a row, of periods alike (`back_off`), and the period
    /// of the latest.
    failures: u32,
    failed_period: usize,
    /// The plan wants replacing and its quiet position has come: replace it at this allocation.
    rebuild_now: bool,
    /// A plan is being made off the request path (the allocator puts it in force when its
    /// allocation comes): no other is tried before.
    making: bool,
    /// What the latest `advise` said of the request it was asked about, until `allocated` logs it.
    advised: Advised,
    /// Allocations in a row, the latest last, logged at the plan's next position (each at the
    /// cursor, one after the other) since the plan was put in force and the matcher started:
    /// from a period and a window on, the matcher's answer is the plan's `window_back` and the
    /// matcher is not asked (about a tenth of a planned request's cost); the windows it owes
    /// are caught up with when the program leaves the plan.
    kept: usize,
    /// The period of the plan kept to while the matcher skipped.
    owed_period: usize,
    /// Ask the matcher at every allocation (tests compare the two).
    #[cfg(test)]
    always_match: bool,
    /// What the matcher answered, allocation by allocation, and how often it was skipped and
    /// caught up with.
    #[cfg(test)]
    pub(crate) matcher_record: MatcherRecord,
}

/// `OnlinePlanner::matcher_record`.
#[cfg(test)]
#[derive(Clone, Debug, Default)]
pub(crate) struct MatcherRecord {
    pub matches: Vec<Option<usize>>,
    /// The latest period like the plan's after each allocation (what a plan is replaced from).
    pub similar: Vec<Option<usize>>,
    pub skipped: usize,
    pub caught_up: usize,
}

/// What `advise` said of the request it was last asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Advised {
    /// Nothing since the last allocation logged.
    Nothing,
    /// The request is the plan's next position, this one.
    Next(usize),
    /// The position at the cursor, in a step of another shape (`advise`).
    Resized(usize),
    /// Another position, or none.
    Elsewhere,
}

/// How a request comes to a plan position (`OnlinePlanner::advance`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    /// Its size and stream are the position's.
    Exact,
    /// Of another shape, no larger than the bytes placed there: served there.
    Smaller,
    /// Of another shape, larger: served by the policy.
    Larger,
}

impl Default for OnlinePlanner {
    fn default() -> Self {
        Self::new()
    }
}

impl OnlinePlanner {
    pub fn new() -> Self {
        OnlinePlanner {
            log: Log::new(LOG_KEPT, LOG_DRAINED),
            time: 0,
            live: Vec::new(),
            matcher: StretchMatcher::new(WINDOW),
            matcher_base: 0,
            plan: None,
            banned: HashSet::new(),
            counters: PlannerCounters::default(),
            pass_ended: false,
            quiet_until: 0,
            similar_period: None,
            replaced: None,
            failures: 0,
            failed_period: 0,
            rebuild_now: false,
            making: false,
            advised: Advised::Nothing,
            kept: 0,
            owed_period: 0,
            #[cfg(test)]
            always_match: false,
            #[cfg(test)]
            matcher_record: MatcherRecord::default(),
        }
    }

    pub fn counters(&self) -> PlannerCounters {
        PlannerCounters {
            in_force: self.planning(),
            ..self.counters
        }
    }

    /// Whether a plan is in force and the program keeps to it (this pass has so far missed less
    /// than a tenth of the step, the share that drops the plan at the pass's end).
    pub fn planning(&self) -> bool {
        self.plan
            .as_ref()
            .is_some_and(|p| p.missed * 10 <= p.keys.len())
    }

    /// The address planned for the next request, of `size` bytes (rounded) on `stream`, if the plan
    /// has one; moves the cursor past the request's position.
    pub fn advise(&mut self, size: usize, stream: StreamId) -> Option<usize> {
        self.advise_from_cursor(size, stream, true)
    }

    /// `advise`; `may_resize`: the request may be taken for the position at the cursor in a step
    /// of another shape.
    fn advise_from_cursor(
        &mut self,
        size: usize,
        stream: StreamId,
        may_resize: bool,
    ) -> Option<usize> {
        let Some(plan) = self.plan.as_mut() else {
            self.note_advised(Advised::Elsewhere);
            return None;
        };
        let length = plan.keys.len();
        let found = (0..LOOKAHEAD.min(length))
            .find(|&step| plan.keys[(plan.cursor + step) % length] == (size, stream));
        let (at_cursor, stream_at_cursor) = plan.keys[plan.cursor];
        // The request is one a position taken just now expected: the run of positions taken for
        // another shape began with a request that was none of theirs.
        let in_run = plan
            .resized
            .iter()
            .any(|&(position, _)| plan.keys[position] == (size, stream));
        match found {
            // The request the plan expects next.
            Some(0) => self.advance(0, Fit::Exact),
            _ if in_run => self.undo_resized(size, stream),
            // The position the plan expects, in a step of another shape: batch and sequence
            // length change what a tensor weighs, not the order the step asks for them in. Taken
            // so until the request after such a run keeps to the plan (`advance`), or does not
            // (below); never for a step's last position, so that no such run ends a pass.
            _ if may_resize
                && plan.steady
                && !plan.undone
                && stream_at_cursor == stream
                && another_shape(at_cursor, size)
                && plan.resized.len() < CLOSE
                && plan.cursor + 1 < length =>
            {
                let position = plan.cursor;
                plan.resized.push((position, size));
                let fit = if size <= plan.sizes[position] {
                    Fit::Smaller
                } else {
                    Fit::Larger
                };
                self.advance(0, fit)
            }
            // The requests taken for positions of another shape were not theirs: the one after
            // them is not the next position's. They were off the plan, and this one is looked for
            // again from the first one's position.
            _ if !plan.resized.is_empty() => self.undo_resized(size, stream),
            // A few positions on (the step left out a few of the template's: the first step's
            // extras), or further.
            Some(step) => self.advance(step, Fit::Exact),
            None => {
                plan.missed += 1;
                self.note(false);
                self.note_advised(Advised::Elsewhere);
                None
            }
        }
    }

    /// The requests taken for positions of another shape (`Plan::resized`) were not theirs: they
    /// were off the plan, and none is taken so again before a request keeps to the plan (a program
    /// that left the plan, its sizes like the plan's, is off it, and drops it), and the request of
    /// `size` on `stream` is looked for again from the first one's position.
    fn undo_resized(&mut self, size: usize, stream: StreamId) -> Option<usize> {
        let plan = self.plan.as_mut().expect("a plan with taken positions");
        let run = plan.resized.len();
        plan.cursor = plan.resized[0].0;
        plan.missed += run;
        plan.undone = true;
        plan.resized.clear();
        plan.latest = None;
        self.advise_from_cursor(size, stream, false)
    }

    /// `advise` for the request `expected_address` just answered: `advance(0, Fit::Exact)` where
    /// what `expected_address` checked holds (the position at the cursor, not the step's last,
    /// with an address; no position taken for another shape; half the last 64 on the plan), so
    /// that no pass ends and the plan is not dropped: what is left of `advance` is moving the
    /// cursor and counting.
    #[inline]
    pub fn advise_expected(&mut self) -> Option<usize> {
        let plan = self.plan.as_mut().expect("expected_address answered");
        let position = plan.cursor;
        debug_assert!(position + 1 < plan.keys.len() && plan.resized.is_empty());
        debug_assert!(plan.recent.on_plan() >= MIN_ON_PLAN);
        plan.undone = false;
        plan.cursor = position + 1;
        if plan.quiet == position && plan.rebuild_wanted {
            self.rebuild_now = true;
        }
        // One more on the plan keeps half of the last 64 on it (`note` drops nothing).
        plan.recent.push(true);
        let address = plan.addresses[position];
        debug_assert!(address.is_some());
        self.counters.advised += 1;
        self.note_advised(Advised::Next(position));
        address
    }

    /// The request at `step` positions past the cursor came: the cursor moves past it, a pass
    /// ends at the step's last position; its address, if the plan has one and the request `fit`s
    /// there.
    #[inline]
    fn advance(&mut self, step: usize, fit: Fit) -> Option<usize> {
        let plan = self.plan.as_mut()?;
        if fit == Fit::Exact && step == 0 {
            plan.undone = false;
        }
        if fit == Fit::Exact && !plan.resized.is_empty() {
            // The requests before this one were their positions' in a step of another shape: a
            // position asked for more than its bytes is off the plan this pass (a pass with any
            // asks for a new plan, in which the position has the most it was asked for; a pass
            // with a tenth drops the plan, as a pass of requests it never saw does).
            for (position, size) in std::mem::take(&mut plan.resized) {
                if size > plan.sizes[position] {
                    plan.asked[position] = plan.asked[position].max(size);
                    plan.missed += 1;
                    plan.grown = true;
                }
            }
        }
        let length = plan.keys.len();
        // Positions and steps are below the length (LOOKAHEAD at most, the cursor a position), so
        // every sum below is under twice the length and wraps with a subtraction, not a division.
        debug_assert!(step < length && plan.cursor < length && plan.quiet < length);
        let wrap = |n: usize| if n < length { n } else { n - length };
        let position = wrap(plan.cursor + step);
        self.note_advised(match fit {
            Fit::Exact if step == 0 => Advised::Next(position),
            Fit::Exact => Advised::Elsewhere,
            Fit::Smaller | Fit::Larger => Advised::Resized(position),
        });
        let plan = self.plan.as_mut().expect("the plan just read");
        plan.skipped += step;
        if plan.cursor + step + 1 >= length && step <= CLOSE {
            // A pass through the template ends here (a far jump across the end is the program
            // wandering through the template, not a step done).
            // The first pass may meet what the policy placed before the plan: not a reason.
            if (plan.passes > 0 && plan.skipped + plan.missed + plan.conflicts > 0)
                || (plan.unplanned > 0 && plan.improved)
                || std::mem::take(&mut plan.grown)
            {
                plan.rebuild_wanted = true;
            }
            plan.passes += 1;
            plan.steady = true;
            if plan.passes == 1 {
                // A new plan went once through its step: it stands.
                self.failures = 0;
                self.replaced = None;
            }
            let missed = plan.missed;
            (plan.skipped, plan.missed, plan.conflicts) = (0, 0, 0);
            self.pass_ended = true;
            if missed * 10 > length {
                // A tenth of the step was off the plan: the shapes change from step to step (or
                // the program moved on), and a plan of one step's sizes holds memory the next
                // does not use. The policy serves until a step repeats again.
                self.abandon();
                self.quiet_until = self.log.next() + length;
                return None;
            }
        }
        let passed_quiet = wrap(plan.quiet + length - plan.cursor) <= step;
        plan.cursor = wrap(position + 1);
        let address = plan.addresses[position].filter(|_| fit != Fit::Larger);
        if passed_quiet && plan.rebuild_wanted {
            self.rebuild_now = true;
        }
        self.note(step <= CLOSE);
        if address.is_some() {
            self.counters.advised += 1;
        }
        address
    }

    /// What `advise` said of a request: a request advised before and never logged (its device
    /// allocation failed) breaks the run of allocations kept to the plan.
    fn note_advised(&mut self, advised: Advised) {
        if self.advised != Advised::Nothing {
            self.kept = 0;
        }
        self.advised = advised;
    }

    /// The address `advise` gives the next request of `size` bytes (rounded) on `stream` when it
    /// is the one the plan expects next and has an address, and `advise` neither ends a pass (the
    /// step's last position) nor drops the plan: the request path's common case. Changes nothing;
    /// None: ask `advise`.
    pub fn expected_address(&self, size: usize, stream: StreamId) -> Option<usize> {
        let plan = self.plan.as_ref()?;
        // With half the last 64 on the plan already, one more on it keeps at least half.
        let expected = plan.cursor + 1 < plan.keys.len()
            && plan.keys[plan.cursor] == (size, stream)
            && plan.resized.is_empty()
            && plan.recent.on_plan() >= MIN_ON_PLAN;
        expected.then(|| plan.addresses[plan.cursor]).flatten()
    }

    /// The address range [start, end) the plan in force lies in (its pages stay mapped between
    /// passes).
    pub fn range(&self) -> Option<(usize, usize)> {
        self.plan.as_ref().map(|p| p.range)
    }

    /// The bytes of the pages the plan in force touches (its blocks' and its obstacles').
    pub fn touched(&self) -> Option<usize> {
        self.plan
            .as_ref()
            .map(|p| p.touched_runs.iter().map(|(start, end)| end - start).sum())
    }

    /// Whether the plan in force replaced one of its step that went through a pass (`Plan::steady`
    /// before its own first pass ends).
    pub fn replaces_a_steady_plan(&self) -> bool {
        self.plan.as_ref().is_some_and(|p| p.steady)
    }

    /// The address ranges of the pages the plan in force touches, runs of adjacent pages in
    /// address order (empty without a plan).
    pub fn touched_runs(&self) -> &[(usize, usize)] {
        self.plan.as_ref().map_or(&[], |p| &p.touched_runs)
    }

    /// Whether a pass through the template ended since the last call (the allocator then gives
    /// back what the pass left free outside the plan).
    pub fn take_pass_end(&mut self) -> bool {
        std::mem::take(&mut self.pass_ended)
    }

    /// Whether a pass through the template ended that `take_pass_end` has not yet been asked about.
    pub fn pass_ended(&self) -> bool {
        self.pass_ended
    }

    /// The advised request was served from the block parked at its address.
    pub fn took_parked(&mut self) {
        self.counters.from_parked += 1;
    }

    /// The advised range was taken: the request went to the policy.
    pub fn conflict(&mut self) {
        if let Some(plan) = &mut self.plan {
            plan.conflicts += 1;
            self.counters.conflicts += 1;
        }
    }

    /// Count a request on or off the plan; drop a plan that most recent requests missed.
    fn note(&mut self, on_plan: bool) {
        let Some(plan) = &mut self.plan else { return };
        plan.recent.push(on_plan);
        if plan.recent.seen() == 64 && plan.recent.on_plan() < MIN_ON_PLAN {
            self.banned.insert(plan.keys.len());
            self.abandon();
        }
    }

    /// Drop the plan in force; its pages go back as a pass's do.
    fn abandon(&mut self) {
        self.plan = None;
        self.kept = 0;
        self.counters.dropped += 1;
        self.pass_ended = true;
    }

    /// An allocation of `size` bytes (rounded) on `stream` was served at `ptr`, in the allocator's
    /// `slot` (a small number that names it until it is freed: `freed` gets the same). Some when a
    /// plan should be made now (the allocator then calls `build`).
    #[inline]
    pub fn allocated(
        &mut self,
        size: usize,
        stream: StreamId,
        ptr: usize,
        slot: usize,
    ) -> Option<Candidate> {
        let candidate = match self.kept_to_plan() {
            Some(position) => {
                self.allocated_on_plan(size, stream, ptr, slot, position);
                None
            }
            None => self.allocated_off_plan(size, stream, ptr, slot),
        };
        #[cfg(test)]
        self.matcher_record.similar.push(self.similar_period);
        candidate
    }

    /// `allocated` for any allocation but one kept to the plan.
    #[inline(never)]
    fn allocated_off_plan(
        &mut self,
        size: usize,
        stream: StreamId,
        ptr: usize,
        slot: usize,
    ) -> Option<Candidate> {
        let number = self.log.next();
        self.log.push(Entry {
            size,
            stream,
            start: self.time,
            end: LIVE,
            ptr,
        });
        self.time += 1;
        if slot >= self.live.len() {
            self.live.resize((slot + 1).next_power_of_two(), LIVE);
        }
        self.live[slot] = number;
        if let (Advised::Next(position) | Advised::Resized(position), Some(plan)) =
            (self.advised, self.plan.as_mut())
        {
            plan.latest = Some((number, position));
        }
        if self.matcher_base + 2 * LOG_KEPT < number {
            // The matcher remembers every distinct stretch; start it again now and then.
            self.matcher = StretchMatcher::new(WINDOW);
            self.matcher_base = number;
            self.kept = 0;
        }
        let matched = self.match_stretch(number, size, stream);
        #[cfg(test)]
        self.matcher_record.matches.push(matched);
        if let (Some(q), Some(plan)) = (matched, &self.plan) {
            let (period, current) = (number - q, plan.keys.len());
            // No step longer than MAX_PERIOD is planned: the log keeps a few of those only.
            if 2 * period >= current && period <= 2 * current && period <= MAX_PERIOD {
                self.similar_period = Some(period);
            }
        }
        if self.making {
            // The plan being made comes first.
            return None;
        }
        if std::mem::take(&mut self.rebuild_now) && number >= self.quiet_until {
            // The plan in force wants replacing and its quiet position has come: the last period
            // like it, ending here.
            if let Some(period) = self.similar_period {
                if number + 1 >= self.log.first() + period {
                    return Some(Candidate {
                        from: number + 1 - period,
                        period,
                    });
                }
            }
        }
        let q = matched?;
        let period = number - q;
        let candidate = Candidate {
            from: q + 1,
            period,
        };
        // With no plan, any step found; with one, only a longer one while the program leaves
        // the plan (the plan in force is a layer's, and the step goes on past the layers): one
        // found while every recent request keeps to the plan is a run of its steps (steps of
        // several shapes repeat as a run only). A plan is replaced by its like at its quiet
        // position (above).
        // The hash of `banned` last: while a plan is kept to, every allocation gets here with
        // the plan's own period.
        let wanted = period <= MAX_PERIOD
            && number >= self.quiet_until
            && self.plan.as_ref().is_none_or(|plan| {
                period > 2 * plan.keys.len() && plan.recent.on_plan() < plan.recent.seen()
            })
            && candidate.from >= self.log.first()
            && !self.banned.contains(&period);
        wanted.then_some(candidate)
    }

    /// The position of the allocation being logged when it is the plan's next one (`advise` said
    /// so) and the allocations before it kept to the plan for a period and a window: the matcher's
    /// answer is then the plan's `window_back` (`match_stretch`), and nothing else `allocated` does
    /// can come of it but the latest period like the plan's. `allocated_on_plan` does that.
    #[inline]
    fn kept_to_plan(&self) -> Option<usize> {
        #[cfg(test)]
        if self.always_match {
            return None;
        }
        match (self.advised, &self.plan) {
            (Advised::Next(position), Some(plan))
                if self.kept + 1 >= plan.keys.len() + WINDOW
                    && !self.rebuild_now
                    && self.matcher_base + 2 * LOG_KEPT >= self.log.next() =>
            {
                Some(position)
            }
            _ => None,
        }
    }

    /// `allocated` for an allocation `kept_to_plan` found at `position`: logged, its matcher
    /// window skipped, and the period the matcher would find noted as `similar_period`. No
    /// candidate comes of it: with no plan rebuild due, only a period over twice the plan's is one,
    /// and the plan's `window_back` is at most its period.
    #[inline]
    fn allocated_on_plan(
        &mut self,
        size: usize,
        stream: StreamId,
        ptr: usize,
        slot: usize,
        position: usize,
    ) {
        let number = self.log.next();
        self.log.push(Entry {
            size,
            stream,
            start: self.time,
            end: LIVE,
            ptr,
        });
        self.time += 1;
        if slot >= self.live.len() {
            self.live.resize((slot + 1).next_power_of_two(), LIVE);
        }
        self.live[slot] = number;
        self.advised = Advised::Nothing;
        self.kept += 1;
        self.matcher.skip();
        let plan = self.plan.as_mut().expect("kept_to_plan");
        plan.latest = Some((number, position));
        let period = plan.keys.len();
        self.owed_period = period;
        let back = plan.window_back[position] as usize;
        debug_assert!(back <= period);
        #[cfg(test)]
        {
            self.matcher_record
                .matches
                .push((back > 0).then(|| number - back));
            self.matcher_record.skipped += 1;
        }
        if back > 0 && 2 * back >= period && back <= MAX_PERIOD {
            self.similar_period = Some(back);
        }
    }

    /// Where the stretch matcher finds the last `WINDOW` allocations, allocation `number` (of
    /// `size` on `stream`) the latest, asked before (`StretchMatcher::push`, as an allocation
    /// number). While the program keeps to the plan, the plan knows the answer: for a period and a
    /// window of allocations at the plan's positions one after the other, the stretch ending at
    /// position p is the one ending there a pass before, and the nearest earlier instance of it
    /// lies within those (`window_back`). The matcher then only counts the allocation; when the
    /// program leaves the plan, it takes the windows of the last period skipped, all that it would
    /// remember of them (the earlier ones are the same windows again).
    fn match_stretch(&mut self, number: usize, size: usize, stream: StreamId) -> Option<usize> {
        let advised = std::mem::replace(&mut self.advised, Advised::Nothing);
        let position = match (advised, &self.plan) {
            (Advised::Next(position), Some(_)) => Some(position),
            _ => None,
        };
        self.kept = if position.is_some() { self.kept + 1 } else { 0 };
        #[cfg(test)]
        if self.always_match {
            self.kept = 0;
        }
        if let (Some(position), Some(plan)) = (position, &self.plan) {
            let period = plan.keys.len();
            if self.kept >= period + WINDOW {
                self.matcher.skip();
                self.owed_period = period;
                #[cfg(test)]
                {
                    self.matcher_record.skipped += 1;
                }
                let back = plan.window_back[position] as usize;
                return (back > 0).then(|| number - back);
            }
        }
        let skipped = self.matcher.skipped();
        if skipped > 0 {
            // Left the plan: the windows of the last period skipped (a period is at least a
            // window long, and every plan's window_back was made for its own period, so the
            // plan that was kept to is the one whose period this is: `install` ends a run).
            let owed = skipped.min(self.owed_period);
            let log = &self.log;
            let keys = log
                .range(number + 1 - WINDOW - owed, WINDOW + owed - 1)
                .map(|e| (e.size, e.stream));
            self.matcher.catch_up(keys, owed);
            #[cfg(test)]
            {
                self.matcher_record.caught_up += 1;
            }
        }
        self.matcher
            .push(size, stream)
            .map(|q| self.matcher_base + q)
    }

    /// Ask the stretch matcher at every allocation, as if no program kept to a plan.
    #[cfg(test)]
    pub(crate) fn always_match(&mut self) {
        self.always_match = true;
    }

    /// The block in `slot` was freed (logged or not).
    pub fn freed(&mut self, slot: usize) {
        if let Some(number) = self.live.get_mut(slot).map(|n| std::mem::replace(n, LIVE)) {
            if number != LIVE && number >= self.log.first() {
                self.log.get_mut(number).end = self.time;
            }
        }
        self.time += 1;
    }

    /// The slots of the live blocks the log still holds, and the address each was logged at (for
    /// the allocator's invariants).
    pub fn logged_live(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.live
            .iter()
            .enumerate()
            .filter(|&(_, &number)| number != LIVE && number >= self.log.first())
            .map(|(slot, &number)| (slot, self.log.get(number).ptr))
    }

    /// The allocator renumbered its slots: `renumbered[old]` is the new number of each (slots
    /// with no block are not asked for).
    pub fn renumber(&mut self, renumbered: &[u32]) {
        let mut live = vec![LIVE; self.live.len().min(renumbered.len()).next_power_of_two()];
        for (old, &number) in self.live.iter().enumerate() {
            if number != LIVE {
                // A live block's slot is never vacant; were it so, its entry would be no one's.
                debug_assert!(
                    renumbered[old] != u32::MAX,
                    "a live slot renumbered as vacant"
                );
                if renumbered[old] == u32::MAX {
                    continue;
                }
                let new = renumbered[old] as usize;
                if new >= live.len() {
                    live.resize((new + 1).next_power_of_two(), LIVE);
                }
                live[new] = number;
            }
        }
        self.live = live;
    }

    /// The instance one period before allocation `number`: the allocation of the same size and
    /// stream nearest to `number - period`, within a thirty-second of a period (the step before
    /// may have asked for a little more; further off, a block of the same size is too often
    /// another tensor, whose lifetime misleads the plan), that has been freed.
    fn earlier_instance(&self, number: usize, period: usize) -> Option<Entry> {
        let key = {
            let e = self.log.get(number);
            (e.size, e.stream)
        };
        let center = number.checked_sub(period)?;
        let reach = period / 32;
        let found = |n: usize| {
            (n >= self.log.first() && n < number)
                .then(|| *self.log.get(n))
                .filter(|e| (e.size, e.stream) == key && e.end != LIVE)
        };
        // Nearest first: center, then center - d before center + d.
        (0..=reach).find_map(|d| {
            center
                .checked_sub(d)
                .and_then(found)
                .or_else(|| (d > 0).then(|| found(center + d)).flatten())
        })
    }

    /// The stream a candidate's plan is for: the one most of its allocations are on.
    pub fn stream_of(&self, candidate: &Candidate) -> StreamId {
        let mut counts: HashMap<StreamId, usize> = HashMap::new();
        for entry in self.template(candidate) {
            *counts.entry(entry.stream).or_default() += 1;
        }
        counts
            .into_iter()
            .max_by_key(|&(stream, count)| (count, std::cmp::Reverse(stream)))
            .map_or(0, |(stream, _)| stream)
    }

    /// Whether the log holds the whole of `candidate`'s stretch.
    fn logged(&self, candidate: &Candidate) -> bool {
        candidate.from >= self.log.first() && candidate.from + candidate.period <= self.log.next()
    }

    fn template(&self, candidate: &Candidate) -> impl Iterator<Item = &Entry> + '_ {
        self.log.range(candidate.from, candidate.period)
    }

    /// Make the plan for `candidate` in `region` and put it in force (the one before is kept
    /// aside, for `reject_plan`). False, the plan in force unchanged, when there is nothing to plan
    /// or the plan would not pay.
    pub fn build(&mut self, candidate: Candidate, region: &Region) -> bool {
        match self.prepare(candidate, region) {
            Some(job) => self.install(job.run()),
            None => false,
        }
    }

    /// The first half of `build`: what the placement of `candidate` in `region` needs, taken from
    /// the log (cheap). None, backed off, when the stretch is no step. The placement itself
    /// (`PlanJob::run`, the costly half) needs nothing of the planner's: the allocator runs a
    /// large step's on a thread of its own and puts it in force (`install`) one step later.
    pub fn prepare(&mut self, candidate: Candidate, region: &Region) -> Option<PlanJob> {
        self.counters.attempts += 1;
        let job = self.job_for(candidate, region);
        if job.is_none() {
            self.back_off(candidate.period);
        }
        job
    }

    /// Put the plan `step` made in force (the one before is kept aside, for `reject_plan`); false,
    /// backed off, when it was not made or would not pay. Ends a plan's making (`making_plan`).
    pub fn install(&mut self, step: PlannedStep) -> bool {
        // A replacement the plan in force wanted is this one.
        (self.making, self.rebuild_now) = (false, false);
        match step.plan {
            Some((mut plan, height)) => {
                // A plan that places more of its step than the one before may be bettered again
                // by the next step (lifetimes the log did not have yet); one that does not, is not.
                let before = self.plan.as_ref().map_or(usize::MAX, |p| p.unplanned);
                plan.improved = plan.unplanned < before;
                plan.steady = self.plan.as_ref().is_some_and(|p| {
                    p.steady && p.keys.len().abs_diff(plan.keys.len()) * 32 <= plan.keys.len()
                });
                self.counters.floor = plan.floor as u64;
                self.replaced = self.plan.replace(*plan).map(Box::new);
                self.kept = 0;
                self.counters.plans += 1;
                self.counters.height = height as u64;
                true
            }
            None => {
                self.back_off(step.period);
                false
            }
        }
    }

    /// A plan is being made off the request path, to be put in force one step later (the
    /// allocator keeps when): no other is tried before, until `install` or `give_up`.
    pub fn making_plan(&mut self) {
        self.making = true;
    }

    /// Whether stretch `later` asked for the sizes `earlier` did, on the same streams, in the same
    /// order (both still in the log).
    pub fn repeats(&self, earlier: &Candidate, later: &Candidate) -> bool {
        earlier.period == later.period
            && self.logged(earlier)
            && self.logged(later)
            && self
                .template(earlier)
                .zip(self.template(later))
                .all(|(a, b)| (a.size, a.stream) == (b.size, b.stream))
    }

    /// Allocations logged so far.
    pub fn allocations(&self) -> usize {
        self.log.next()
    }

    /// Not now: a later step may give a better plan. Each failure in a row waits twice as long
    /// (up to 64 periods), so that a program whose plans never pay does not pay for making them.
    /// A row is of periods alike (within a factor of two of the one before): a period unlike the
    /// last failed one starts the count again, so that the failed plans of a layer do not hold
    /// back the step's (BERT's three layer plans made its step wait 16 periods, past its run).
    fn back_off(&mut self, period: usize) {
        let alike = period <= 2 * self.failed_period && self.failed_period <= 2 * period;
        if !alike {
            self.failures = 0;
        }
        self.failed_period = period;
        self.failures = (self.failures + 1).min(6);
        self.quiet_until = self.log.next() + (period << self.failures);
        if let Some(plan) = &mut self.plan {
            plan.rebuild_wanted = false;
        }
    }

    /// What `prepare` would return for `candidate` in `region`, with nothing counted or backed off
    /// (the allocator checks with it that a plan placed off the request path still fits when it is
    /// put in force).
    pub fn job_for(&self, candidate: Candidate, region: &Region) -> Option<PlanJob> {
        if !self.logged(&candidate) {
            return None;
        }
        // A copy: the log is a ring (its oldest entries go without moving the rest), and a plan is
        // made far less often than a request is logged.
        let template: Vec<Entry> = self.template(&candidate).copied().collect();
        let period = candidate.period;
        let t0 = template[0].start;
        // The step's length in events: from the instance of position 0 one period before, when the
        // log has it, and at least the template's own span (up to now).
        let now = self.time - t0;
        let cycle = match candidate.from.checked_sub(period) {
            Some(earlier) if earlier >= self.log.first() => t0 - self.log.get(earlier).start,
            _ => now,
        }
        .max(now);
        let in_region = |ptr: usize| ptr >= region.base && ptr < region.base + region.size;
        let asked = self.asked_at(&candidate, &template);
        let mut blocks = Vec::new();
        let mut positions = Vec::new();
        let mut transient_live = HashSet::new();
        let mut addresses_kept = Vec::new();
        let mut pinned = Vec::new();
        for (k, entry) in template.iter().enumerate() {
            let start = entry.start - t0;
            let lifetime = if entry.end != LIVE {
                Some(entry.end - entry.start)
            } else {
                self.earlier_instance(candidate.from + k, period)
                    .map(|e| e.end - e.start)
            };
            if entry.end == LIVE
                && lifetime.is_none()
                && in_region(entry.ptr)
                && entry.stream == region.stream
            {
                // Live, and nothing says when it goes (its step is the first the log has, such as
                // the gradients the first backward made): it stays where it is as an obstacle,
                // and its next instance is planned at the same address, which it will have left
                // by then if it goes within a step.
                addresses_kept.push((k, entry.ptr));
            }
            let Some(lifetime) = lifetime.filter(|&d| d > 0 && d < cycle) else {
                continue;
            };
            // Where a step of another shape asked for more at this position, the most asked for.
            let mut size = asked[k];
            if entry.stream != region.stream || size > region.size {
                continue;
            }
            let mut lifetime = lifetime;
            let mut at = None;
            if entry.end == LIVE && in_region(entry.ptr) {
                // Where it is, it stays, and its next instances go there too: the plan fits
                // around what is live now (plans are replaced where little is), and it lives
                // until now at least.
                lifetime = lifetime.max(now - start);
                if lifetime >= cycle {
                    continue;
                }
                at = Some(entry.ptr - region.base);
                transient_live.insert(entry.ptr);
                // Its own size where it lies (the next instance may ask more, and be planned
                // anew).
                size = entry.size;
            }
            blocks.push(Lifetime {
                size,
                start,
                end: start + lifetime,
            });
            positions.push(k);
            pinned.push(at);
        }
        // A step frees within itself most of what it makes; a stretch whose blocks mostly outlive
        // it (a layer of the forward pass, whose activations wait for the backward) is no step.
        let planned_bytes: usize = blocks.iter().map(|b| b.size).sum();
        let template_bytes: usize = template.iter().map(|e| e.size).sum();
        if blocks.is_empty() || planned_bytes * 4 < template_bytes * 3 {
            return None;
        }
        let mut obstacles: Vec<(usize, usize)> = region
            .live
            .iter()
            .filter(|(ptr, _)| !transient_live.contains(ptr) && in_region(*ptr))
            .map(|&(ptr, size)| (ptr - region.base, ptr - region.base + size))
            .collect();
        obstacles.sort_unstable();
        // Offsets count from the page of the lowest block live now (the policy may have left
        // everything high in the segment): the plan goes where those are, not at the
        // segment's start, so that it maps pages beside them rather than pages of its own.
        let low = pinned
            .iter()
            .flatten()
            .copied()
            .chain(obstacles.iter().map(|&(start, _)| start))
            .min()
            .map_or(0, |low| low / region.page * region.page);
        let shift = |(start, end): (usize, usize)| (start - low, end - low);
        let obstacles: Vec<(usize, usize)> = obstacles.into_iter().map(shift).collect();
        let pinned: Vec<Option<usize>> = pinned.iter().map(|p| p.map(|at| at - low)).collect();
        Some(PlanJob {
            period,
            blocks,
            positions,
            pinned,
            obstacles,
            addresses_kept,
            keys: template.iter().map(|e| (e.size, e.stream)).collect(),
            asked,
            starts: template.iter().map(|e| e.start - t0).collect(),
            cycle,
            low,
            base: region.base,
            size: region.size,
            page: region.page,
            peak_allocated: region.peak_allocated,
            repeated: candidate.from >= period
                && self.repeats(
                    &Candidate {
                        from: candidate.from - period,
                        period,
                    },
                    &candidate,
                ),
        })
    }

    /// The allocator could not make the plan for a candidate of `period` (the device refused the
    /// segment's reservation, or a plan made off the request path could not be put in force): the
    /// plan in force stays, and none is tried for a while.
    pub fn give_up(&mut self, period: usize) {
        self.making = false;
        self.back_off(period);
    }

    /// The bytes each position of `candidate`'s `template` is to be planned with: its own size, or,
    /// where the template replaces the plan in force (the same period, lined up with its
    /// positions by the latest allocation logged at one), the most the plan's position was asked
    /// for when that is more (a step of another shape asked it: the next plan holds every shape).
    fn asked_at(&self, candidate: &Candidate, template: &[Entry]) -> Vec<usize> {
        let period = candidate.period;
        let mut asked: Vec<usize> = template.iter().map(|e| e.size).collect();
        let Some(plan) = self.plan.as_ref().filter(|p| p.keys.len() == period) else {
            return asked;
        };
        let Some((number, position)) = plan.latest else {
            return asked;
        };
        // The plan position of the template's last allocation.
        let last = candidate.from + period - 1;
        let last_position = if last >= number {
            (position + (last - number)) % period
        } else {
            (position + period - (number - last) % period) % period
        };
        for (k, entry) in template.iter().enumerate() {
            let p = (last_position + 1 + k) % period;
            let (key, stream) = plan.keys[p];
            if stream == entry.stream && (key == entry.size || another_shape(key, entry.size)) {
                asked[k] = asked[k].max(plan.asked[p]);
            }
        }
        asked
    }

    /// The plan just made would hold more than it saves (the allocator's judgement, from what is
    /// mapped): forget it, put back the one it replaced, and back off.
    pub fn reject_plan(&mut self) {
        if let Some(plan) = self.plan.take() {
            self.counters.plans -= 1;
            self.plan = self.replaced.take().map(|p| *p);
            self.kept = 0;
            self.back_off(plan.keys.len());
        }
    }
}

/// The placement of one step, prepared by `OnlinePlanner::prepare`: the step's blocks (offsets
/// counted from `low`), the obstacles and the pinned, and what a plan is built of. It owns all it
/// needs, so that a large step's may run on a thread of its own. Two jobs that are equal give the
/// same plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanJob {
    period: usize,
    blocks: Vec<Lifetime>,
    /// The template position of each block, and where it is pinned (counted from `low`).
    positions: Vec<usize>,
    pinned: Vec<Option<usize>>,
    /// The live blocks the plan goes around, counted from `low`.
    obstacles: Vec<(usize, usize)>,
    /// Positions planned where their live instance is (template position, address).
    addresses_kept: Vec<(usize, usize)>,
    /// (rounded size, stream) of each template position, the bytes it is planned with (`asked_at`),
    /// and its start (events from the first).
    keys: Vec<(usize, StreamId)>,
    asked: Vec<usize>,
    starts: Vec<usize>,
    cycle: usize,
    /// The page the offsets count from, the region's range and page, and the most ever allocated.
    low: usize,
    base: usize,
    size: usize,
    page: usize,
    peak_allocated: usize,
    /// The stretch before the template asked for the same sizes in the same order: a step that
    /// repeated exactly.
    repeated: bool,
}

/// A step's plan, made (`plan`: the plan and its height) or not (None: it did not fit or would
/// not pay), for `OnlinePlanner::install`.
pub struct PlannedStep {
    period: usize,
    plan: Option<(Box<Plan>, usize)>,
}

impl PlannedStep {
    /// No plan for a step of `period` allocations (the stretch is no step now).
    pub fn none(period: usize) -> PlannedStep {
        PlannedStep { period, plan: None }
    }

    /// Whether a plan was made.
    pub fn made(&self) -> bool {
        self.plan.is_some()
    }
}

impl PlanJob {
    /// `later`, taken one step after this job, is this one but that its step has since repeated
    /// exactly: a plan this job made is `later`'s too (it paid without that).
    pub fn repeats_now(&self, later: &PlanJob) -> bool {
        !self.repeated
            && later.repeated
            && *later
                == PlanJob {
                    repeated: true,
                    ..self.clone()
                }
    }

    /// Blocks to place: what the placement's cost grows with.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// The costly half of a plan: the placement, the best of its orders (refined where that saves a
    /// page).
    pub fn run(&self) -> PlannedStep {
        PlannedStep {
            period: self.period,
            plan: self.place().map(|(plan, height)| (Box::new(plan), height)),
        }
    }

    /// A placement counted from the region's start, with the pages it maps (under every planned
    /// block and every obstacle), where it fits the region and pays (near the floor).
    fn fitted(&self, mut placement: Placement) -> Option<(Placement, Vec<usize>)> {
        let low = self.low;
        for offset in &mut placement.offsets {
            *offset += low;
        }
        placement.size += low;
        if placement.size > self.size {
            return None;
        }
        let mut pages: Vec<usize> = self
            .blocks
            .iter()
            .zip(&placement.offsets)
            .map(|(b, &offset)| (offset, offset + b.size))
            .chain(
                self.obstacles
                    .iter()
                    .map(|&(start, end)| (start + low, end + low)),
            )
            .flat_map(|(low, high)| low / self.page..high.div_ceil(self.page))
            .collect();
        pages.sort_unstable();
        pages.dedup();
        let touched = pages.len() * self.page;
        if touched as f64 > self.peak_allocated as f64 * (1.0 + PLAN_SLACK) + self.page as f64 {
            return None;
        }
        Some((placement, pages))
    }

    fn place(&self) -> Option<(Plan, usize)> {
        let (blocks, cycle, period) = (&self.blocks, self.cycle, self.period);
        let (obstacles, pinned) = (&self.obstacles, &self.pinned);
        let (order, greedy) = best_of_orders(blocks.len(), |order| {
            place_cyclic_pinned(blocks, cycle, order, obstacles, pinned).ok()
        })?;
        // The most the step's blocks and the obstacles hold at once: no plan maps fewer pages than
        // those bytes fill.
        let live = LiveBytes::cyclic(blocks, cycle);
        let floor = live.most()
            + obstacles
                .iter()
                .map(|&(start, end)| end - start)
                .sum::<usize>();
        // Refined (its best order only: the others' refined placements came to the same pages on
        // every committed trace), counted from the region's start, where it fits and pays.
        let refined = || {
            refine_cyclic_pinned(blocks, cycle, order, obstacles, pinned, &greedy, floor)
                .ok()
                .flatten()
                .and_then(|refined| self.fitted(refined))
        };
        // A plan pays only near the floor: one that needs more than the most ever allocated and a
        // little (PLAN_SLACK) would hold more than the policy does (a plan from the first step,
        // whose lifetimes are partly unknown, or from a stretch that is no step). The policy
        // serves on, and the next step may give a better one.
        let (placement, pages) = match self.fitted(greedy.clone()) {
            // One that pays is refined where it maps more pages than the floor fills, and the
            // refined one taken where it maps fewer: a page is what a plan costs, and a layout
            // moved for nothing only changes which live blocks the plan meets (on Llama fixed, a
            // plan 0.2 MiB smaller in the same pages took the whole trace from 0.992 to 0.969).
            Some(fitted) if fitted.1.len() > floor.div_ceil(self.page) => match refined() {
                Some(refined) if refined.1.len() < fitted.1.len() => refined,
                _ => fitted,
            },
            Some(fitted) => fitted,
            // One that does not is refined into one that does only for a step that repeated
            // exactly (the stretch before it asked for the same sizes in the same order): any
            // other stretch is most likely no step (on the transformer trace, refining those put
            // plans in force that were dropped: 648 calls to 821).
            None if self.repeated => refined()?,
            None => return None,
        };
        let mut touched_runs: Vec<(usize, usize)> = Vec::new();
        for &page in &pages {
            let (start, end) = (
                self.base + page * self.page,
                self.base + (page + 1) * self.page,
            );
            match touched_runs.last_mut() {
                Some(run) if run.1 == start => run.1 = end,
                _ => touched_runs.push((start, end)),
            }
        }
        let mut addresses = vec![None; period];
        for (i, &k) in self.positions.iter().enumerate() {
            addresses[k] = Some(self.base + placement.offsets[i]);
        }
        for &(k, ptr) in &self.addresses_kept {
            addresses[k] = Some(ptr);
        }
        let quiet = quiet_position(&live, &self.starts);
        // Placed: a pinned block's own size, else the bytes asked.
        let mut sizes: Vec<usize> = self.keys.iter().map(|&(size, _)| size).collect();
        for (block, &k) in blocks.iter().zip(&self.positions) {
            sizes[k] = block.size;
        }
        let plan = Plan {
            keys: self.keys.clone(),
            sizes,
            asked: self.asked.clone(),
            addresses,
            latest: None,
            resized: Vec::new(),
            grown: false,
            steady: false,
            undone: false,
            cursor: 0,
            recent: RecentRequests::default(),
            skipped: 0,
            missed: 0,
            conflicts: 0,
            rebuild_wanted: false,
            passes: 0,
            unplanned: period - self.positions.len() - self.addresses_kept.len(),
            improved: false,
            range: (self.base, self.base + placement.size),
            touched_runs,
            floor,
            quiet,
            window_back: window_back(&self.keys),
        };
        Some((plan, placement.size))
    }
}

/// Whether a request of `asked` bytes at a position planned for `planned` is that position's in a
/// step of another shape: the two differ, by no more than `SHAPE_FACTOR` (a batch or sequence
/// length that changed; further apart, it is another tensor).
fn another_shape(planned: usize, asked: usize) -> bool {
    planned != asked
        && asked <= planned.saturating_mul(SHAPE_FACTOR)
        && planned <= asked.saturating_mul(SHAPE_FACTOR)
}

/// For each position of a template, what the stretch matcher answers there in a program that has
/// kept to the template for a period and a window: how far back the `WINDOW` allocations ending
/// there were last asked for, 0 when less than a window back (the matcher then reports none).
/// The matcher itself run over three passes through the template: the third's answers.
fn window_back(keys: &[(usize, StreamId)]) -> Vec<u32> {
    let mut matcher = StretchMatcher::new(WINDOW);
    let period = keys.len();
    let mut back = vec![0; period];
    for (n, &(size, stream)) in keys.iter().cycle().take(3 * period).enumerate() {
        let found = matcher.push(size, stream);
        if n >= 2 * period {
            back[n - 2 * period] = found.map_or(0, |q| (n - q) as u32);
        }
    }
    back
}

/// The template position at which the fewest bytes of the planned blocks are live (`live_bytes`,
/// over the cycle; `starts`, when each position is allocated): the first position allocated at or
/// after the quietest moment of the cycle.
fn quiet_position(live_bytes: &LiveBytes, starts: &[usize]) -> usize {
    let at_zero = live_bytes.at_zero;
    let (mut live, mut least, mut when) = (at_zero, at_zero, 0usize);
    for &(time, change) in &live_bytes.changes {
        live += change;
        if live < least {
            (least, when) = (live, time);
        }
    }
    starts.iter().position(|&start| start >= when).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recent_requests_count_the_last_64_on_the_plan() {
        let mut recent = RecentRequests::default();
        // 40 on the plan, then 30 off: after 64, the oldest leave one by one.
        for n in 1..=40 {
            recent.push(true);
            assert_eq!((recent.seen(), recent.on_plan()), (n, n));
        }
        for n in 1..=24 {
            recent.push(false);
            assert_eq!((recent.seen(), recent.on_plan()), (40 + n, 40));
        }
        for n in 1..=6 {
            recent.push(false);
            assert_eq!((recent.seen(), recent.on_plan()), (64, 40 - n));
        }
        // The last 64: 34 on, then 30 off. 40 more on push out the 34 and 6 of the 30: 24 off,
        // then 40 on.
        for _ in 0..40 {
            recent.push(true);
        }
        assert_eq!((recent.seen(), recent.on_plan()), (64, 40));
    }

    #[test]
    fn a_free_ends_the_lifetime_logged_for_its_slot_across_a_renumbering() {
        let mut planner = OnlinePlanner::new();
        planner.allocated(1024, 0, 0x1000, 5); // allocation 0, at time 0
        planner.allocated(2048, 0, 0x2000, 9); // allocation 1, at time 1
        planner.freed(3); // a block the log never saw: only the clock moves (time 2)
        assert_eq!(
            (planner.log.get(0).end, planner.log.get(1).end),
            (LIVE, LIVE)
        );
        // The allocator compacts its slab: slot 9 becomes 0 and slot 5 becomes 1.
        let mut renumbered = vec![u32::MAX; 10];
        (renumbered[5], renumbered[9]) = (1, 0);
        planner.renumber(&renumbered);
        let mut live: Vec<(usize, usize)> = planner.logged_live().collect();
        live.sort_unstable();
        assert_eq!(live, [(0, 0x2000), (1, 0x1000)]);
        planner.freed(0); // time 3: the block at 0x2000
        assert_eq!((planner.log.get(0).end, planner.log.get(1).end), (LIVE, 3));
        planner.freed(1); // time 4: the block at 0x1000
        assert_eq!(planner.log.get(0).end, 4);
        assert_eq!(planner.logged_live().count(), 0);
        // A slot freed again ends nothing more.
        planner.freed(1);
        assert_eq!((planner.log.get(0).end, planner.log.get(1).end), (4, 3));
    }

    #[test]
    fn the_log_keeps_four_longest_steps_in_a_ring_that_never_outgrows_them() {
        let mut planner = OnlinePlanner::new();
        for n in 0..LOG_KEPT + 5 * LOG_DRAINED + 7 {
            planner.allocated(512 * (1 + n % 7), 0, 0x1000 + n, 0);
            planner.freed(0);
            if n + 1 >= LOG_KEPT {
                assert!((LOG_KEPT - LOG_DRAINED..LOG_KEPT).contains(&planner.log.len()));
            }
            assert_eq!(planner.log.first() + planner.log.len(), n + 1);
        }
        // The entries a request writes come round in LOG_KEPT entries' room, not twice that.
        assert!(
            planner.log.capacity() <= LOG_KEPT,
            "{}",
            planner.log.capacity()
        );
        // The latest allocation's entry is where its number says, and its free ended it.
        let last = planner.allocations() - 1;
        let entry = *planner.log.get(last);
        assert_eq!((entry.ptr, entry.end), (0x1000 + last, planner.time - 1));
    }

    /// Block i of the test's step: 1 MiB + i x 64 KiB, each freed once the next is made.
    fn step_size(i: usize) -> usize {
        MIB + i * 64 * 1024
    }
    const MIB: usize = 1 << 20;

    /// A planner that has seen steps of 40 blocks (`step_size`) until a plan of the step is in
    /// force, in a region of 1 GiB at 1 GiB, at a step's start; and the step's sizes and planned
    /// addresses from there, in the order the step asks for them.
    fn planner_of_a_step() -> (OnlinePlanner, Vec<usize>, Vec<Option<usize>>) {
        let region = Region {
            stream: 0,
            base: 1 << 30,
            size: 1 << 30,
            live: Vec::new(),
            peak_allocated: 1 << 30,
            page: 2 * MIB,
        };
        let mut planner = OnlinePlanner::new();
        for _ in 0..6 {
            for i in 0..40 {
                let size = step_size(i);
                let ptr = planner.advise(size, 0).unwrap_or(region.base + i * 4 * MIB);
                if let Some(candidate) = planner.allocated(size, 0, ptr, i % 2) {
                    planner.build(candidate, &region);
                }
                planner.freed((i + 1) % 2);
            }
            planner.freed(1);
        }
        let plan = planner.plan.as_ref().expect("a plan of the step");
        assert_eq!(plan.keys.len(), 40);
        assert!(plan.steady && planner.planning());
        // The template starts where the matcher found the step: the cursor is at the step's
        // start, wherever that is in the template.
        let at = |k: usize| (plan.cursor + k) % 40;
        let sizes: Vec<usize> = (0..40).map(|k| plan.keys[at(k)].0).collect();
        assert_eq!(sizes, (0..40).map(step_size).collect::<Vec<_>>());
        let addresses = (0..40).map(|k| plan.addresses[at(k)]).collect();
        (planner, sizes, addresses)
    }

    /// advise and log one request of `size` on stream 0 at slot 0.
    fn request(planner: &mut OnlinePlanner, size: usize) -> Option<usize> {
        let advice = planner.advise(size, 0);
        planner.allocated(size, 0, advice.unwrap_or(0x1000), 0);
        planner.freed(0);
        advice
    }

    #[test]
    fn a_request_of_another_shape_is_taken_for_its_position_once_the_next_keeps_to_the_plan() {
        let (mut planner, sizes, addresses) = planner_of_a_step();
        let start = planner.plan.as_ref().unwrap().cursor;
        assert!(addresses.iter().all(Option::is_some));
        assert_eq!(request(&mut planner, sizes[0]), addresses[0]);
        // Position 1 in a smaller shape: served at its planned address, and position 2 then
        // keeps to the plan: nothing was off it.
        assert_eq!(request(&mut planner, sizes[1] / 2), addresses[1]);
        assert_eq!(request(&mut planner, sizes[2]), addresses[2]);
        // Position 3 in a larger shape: the policy serves it (no address); position 4 keeps to
        // the plan, so the request counts as position 3's, off the plan this pass, and the next
        // plan places the most it asked.
        assert_eq!(request(&mut planner, 3 * sizes[3]), None);
        assert_eq!(request(&mut planner, sizes[4]), addresses[4]);
        let plan = planner.plan.as_ref().unwrap();
        assert_eq!(
            (plan.cursor, plan.missed, plan.skipped),
            ((start + 5) % 40, 1, 0)
        );
        assert_eq!(plan.asked[(start + 3) % 40], 3 * sizes[3]);
        assert_eq!(plan.asked[(start + 1) % 40], sizes[1]);
        assert!(plan.grown);
    }

    #[test]
    fn a_request_taken_for_a_position_of_another_shape_is_undone_when_the_next_keeps_to_none() {
        let (mut planner, sizes, addresses) = planner_of_a_step();
        let start = planner.plan.as_ref().unwrap().cursor;
        request(&mut planner, sizes[0]);
        // A request like position 1's, then one like nothing in the step (a 256th of any): the
        // first was not position 1's after all. Both are off the plan, the cursor is back at
        // position 1, and nothing was asked of it.
        request(&mut planner, sizes[1] / 2);
        assert_eq!(request(&mut planner, 4096), None);
        let plan = planner.plan.as_ref().unwrap();
        assert_eq!(
            (plan.cursor, plan.missed, plan.skipped),
            ((start + 1) % 40, 2, 0)
        );
        assert!(plan.resized.is_empty() && !plan.grown);
        assert_eq!(plan.asked[(start + 1) % 40], sizes[1]);
        // Position 1's own request comes next, served where the plan has it.
        assert_eq!(request(&mut planner, sizes[1]), addresses[1]);
    }

    proptest::proptest! {
        /// Whatever follows a plan of the step (requests of its sizes, of other shapes, of sizes
        /// it never saw, in any order), the planner gives only the plan's own addresses, the
        /// requests it holds as positions of another shape are the run just before the cursor,
        /// and a run is never longer than CLOSE.
        #[test]
        fn a_plan_keeps_its_cursor_and_its_runs_whatever_follows(
            requests in proptest::collection::vec((0usize..40, 0usize..4), 1..400),
        ) {
            let (mut planner, sizes, addresses) = planner_of_a_step();
            for (position, kind) in requests {
                // The step's own size, a smaller shape, a larger one, or one like nothing.
                let size = match kind {
                    0 => sizes[position],
                    1 => sizes[position] / 2,
                    2 => sizes[position] * 3,
                    _ => 4096,
                };
                let advice = request(&mut planner, size);
                proptest::prop_assert!(advice.is_none_or(|a| addresses.contains(&Some(a))));
                let Some(plan) = planner.plan.as_ref() else { continue };
                let length = plan.keys.len();
                proptest::prop_assert!(plan.cursor < length && plan.resized.len() <= CLOSE);
                for (k, &(taken, _)) in plan.resized.iter().enumerate() {
                    proptest::prop_assert_eq!(
                        (taken + plan.resized.len() - k) % length,
                        plan.cursor
                    );
                }
            }
        }
    }

    /// A job of one 8-byte block over [0, 2) of a 4-event step, `repeated` or not, its first
    /// block `pinned` where given.
    fn small_job(repeated: bool, pinned: Option<usize>) -> PlanJob {
        PlanJob {
            period: 1,
            blocks: vec![Lifetime {
                size: 8,
                start: 0,
                end: 2,
            }],
            positions: vec![0],
            pinned: vec![pinned],
            obstacles: Vec::new(),
            addresses_kept: Vec::new(),
            keys: vec![(8, 0)],
            asked: vec![8],
            starts: vec![0],
            cycle: 4,
            low: 0,
            base: 1 << 20,
            size: 1 << 20,
            page: 4096,
            peak_allocated: 8,
            repeated,
        }
    }

    #[test]
    fn a_job_repeats_now_only_when_its_step_has_repeated_since_and_nothing_else_moved() {
        let first = small_job(false, None);
        // The same job a step later, its step now repeated: a plan the first made is its too.
        assert!(first.repeats_now(&small_job(true, None)));
        // Not so for the same job again, one that repeated before already, or one whose block
        // lies elsewhere now.
        assert!(!first.repeats_now(&small_job(false, None)));
        assert!(!small_job(true, None).repeats_now(&small_job(true, None)));
        assert!(!first.repeats_now(&small_job(true, Some(64))));
    }

    #[test]
    fn failures_in_a_row_count_only_while_the_failing_periods_are_alike() {
        // No allocation logged: a back-off waits from allocation 0.
        let mut planner = OnlinePlanner::new();
        // A layer's plans fail three times in a row: each waits twice as long as the one before.
        for (failures, until) in [(1, 64), (2, 128), (3, 256)] {
            planner.give_up(32);
            assert_eq!((planner.failures, planner.quiet_until), (failures, until));
        }
        // A period within a factor of two of the last is one more of the row.
        planner.give_up(48);
        assert_eq!((planner.failures, planner.quiet_until), (4, 48 << 4));
        // The step's, seven times as long, starts the count again: two of its periods, not 32.
        planner.give_up(333);
        assert_eq!((planner.failures, planner.quiet_until), (1, 666));
        // A layer's again after it: unlike 333 too.
        planner.give_up(40);
        assert_eq!((planner.failures, planner.quiet_until), (1, 80));
        // The count stops at six: 64 periods at most.
        for _ in 0..8 {
            planner.give_up(40);
        }
        assert_eq!((planner.failures, planner.quiet_until), (6, 40 << 6));
    }
}
