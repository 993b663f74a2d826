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

// The planner's work, a file each: learning the step (the log and the stretch matcher), making a
// plan from it, and serving requests by the plan in force. This file holds the types they share.
mod learning;
mod making;
mod serving;
#[cfg(test)]
mod tests;

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
}

/// Whether a request of `asked` bytes at a position planned for `planned` is that position's in a
/// step of another shape: the two differ, by no more than `SHAPE_FACTOR` (a batch or sequence
/// length that changed; further apart, it is another tensor).
fn another_shape(planned: usize, asked: usize) -> bool {
    planned != asked
        && asked <= planned.saturating_mul(SHAPE_FACTOR)
        && planned <= asked.saturating_mul(SHAPE_FACTOR)
}
