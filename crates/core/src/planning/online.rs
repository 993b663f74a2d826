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
//!   and a longer period always replaces a shorter one.
//! - **Lifetimes.** A block of the template lives as long as it did (or as its instance one
//!   period before did, when it is still live). Blocks that live a period or longer (weights,
//!   gradients, optimizer states) are not planned: the policy serves them, and where they lie they
//!   are obstacles to the plan.
//! - **Placement.** `placement::place_cyclic_around`, the best of its orders: offsets in one
//!   expandable segment of the stream (the allocator's choice: where most live bytes are), around
//!   the obstacles.
//! - **Serving.** Each request moves a cursor through the template: the next position with the same
//!   size and stream, within `LOOKAHEAD` (the first step makes the optimizer's states, which later
//!   steps skip). A request matching no position is off the plan. A pass through the template that
//!   skipped, missed or conflicted asks for a new plan, made at the next match of a similar period
//!   (from the step just seen, which is exact once the first step's extras are gone).

use super::period::StretchMatcher;
use super::placement::{place_cyclic_around, Lifetime, Order};
use std::collections::{HashMap, HashSet};

type StreamId = usize;

/// Allocations a stretch must repeat before it counts as a match.
const WINDOW: usize = 32;
/// The longest step planned, in allocations.
const MAX_PERIOD: usize = 1 << 15;
/// Allocations kept in the log (at least two periods of the longest step).
const LOG_KEPT: usize = 4 * MAX_PERIOD;
/// How far ahead of the cursor a request is looked for.
const LOOKAHEAD: usize = 1024;
/// A request found within this many positions of the cursor counts as on the plan.
const CLOSE: usize = 8;
/// Of the last 64 requests, fewer than this on the plan drops it.
const MIN_ON_PLAN: u32 = 32;
/// Not freed yet.
const LIVE: usize = usize::MAX;

/// One allocation as the log keeps it: its rounded size and stream, when it was made and freed
/// (in events: allocations and frees), and its address.
#[derive(Clone, Copy, Debug)]
struct Entry {
    size: usize,
    stream: StreamId,
    start: usize,
    end: usize,
    ptr: usize,
}

/// A period found: the template is the `period` allocations from number `from` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    from: usize,
    period: usize,
}

/// Where a plan may go: the stream's large expandable segment and what is live in it now.
#[derive(Clone, Debug)]
pub struct Region {
    pub stream: StreamId,
    pub base: usize,
    pub size: usize,
    /// Allocated blocks in the range: (address, block size).
    pub live: Vec<(usize, usize)>,
}

/// The plan in force.
#[derive(Clone, Debug)]
struct Plan {
    /// (rounded size, stream) of each position of the template.
    keys: Vec<(usize, StreamId)>,
    /// The planned address of each position; None: served by the policy.
    addresses: Vec<Option<usize>>,
    /// The next position expected.
    cursor: usize,
    /// The last 64 requests, 1 where on the plan; `seen` of them so far.
    recent: u64,
    seen: u32,
    /// This pass through the template: positions skipped, requests off the plan, planned requests
    /// whose range was taken.
    skipped: usize,
    missed: usize,
    conflicts: usize,
    /// A pass was not clean: replace the plan at the next similar match.
    rebuild_wanted: bool,
    /// Passes through the template ended.
    passes: usize,
}

/// What the planner has done, for tools and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlannerCounters {
    /// Plans made (each replaces the one before).
    pub plans: u64,
    /// Plans dropped because requests stopped matching them.
    pub dropped: u64,
    /// Requests given an address by a plan.
    pub advised: u64,
    /// Of them, those whose range was taken, served by the policy instead.
    pub conflicts: u64,
    /// Bytes the latest plan spans in its segment (0 before the first).
    pub height: u64,
}

/// The planner of one device.
pub struct OnlinePlanner {
    log: Vec<Entry>,
    /// The allocation number of log[0].
    first: usize,
    /// Allocations so far.
    allocations: usize,
    /// Events (allocations and frees) so far: the planner's clock.
    time: usize,
    /// Live blocks: address -> allocation number.
    live: HashMap<usize, usize>,
    matcher: StretchMatcher,
    /// The allocation number the matcher counts from.
    matcher_base: usize,
    plan: Option<Plan>,
    /// Periods whose plans were dropped (layers, mostly): never tried again.
    banned: HashSet<usize>,
    counters: PlannerCounters,
    /// A pass through the template ended since `take_pass_end` was last asked.
    pass_ended: bool,
}

impl Default for OnlinePlanner {
    fn default() -> Self {
        Self::new()
    }
}

impl OnlinePlanner {
    pub fn new() -> Self {
        OnlinePlanner {
            log: Vec::new(),
            first: 0,
            allocations: 0,
            time: 0,
            live: HashMap::new(),
            matcher: StretchMatcher::new(WINDOW),
            matcher_base: 0,
            plan: None,
            banned: HashSet::new(),
            counters: PlannerCounters::default(),
            pass_ended: false,
        }
    }

    pub fn counters(&self) -> PlannerCounters {
        self.counters
    }

    /// Whether a plan is in force.
    pub fn planning(&self) -> bool {
        self.plan.is_some()
    }

    /// The address planned for the next request, of `size` bytes (rounded) on `stream`, if the plan
    /// has one; moves the cursor past the request's position.
    pub fn advise(&mut self, size: usize, stream: StreamId) -> Option<usize> {
        let plan = self.plan.as_mut()?;
        let length = plan.keys.len();
        let found = (0..LOOKAHEAD.min(length))
            .find(|&step| plan.keys[(plan.cursor + step) % length] == (size, stream));
        let Some(step) = found else {
            plan.missed += 1;
            self.note(false);
            return None;
        };
        let position = (plan.cursor + step) % length;
        plan.skipped += step;
        if plan.cursor + step + 1 >= length {
            // A pass through the template ends here.
            // The first pass may meet what the policy placed before the plan: not a reason.
            if plan.passes > 0 && plan.skipped + plan.missed + plan.conflicts > 0 {
                plan.rebuild_wanted = true;
            }
            plan.passes += 1;
            (plan.skipped, plan.missed, plan.conflicts) = (0, 0, 0);
            self.pass_ended = true;
        }
        plan.cursor = (position + 1) % length;
        let address = plan.addresses[position];
        self.note(step <= CLOSE);
        if address.is_some() {
            self.counters.advised += 1;
        }
        address
    }

    /// Whether a pass through the template ended since the last call (the allocator then gives
    /// back what the pass left free outside the plan).
    pub fn take_pass_end(&mut self) -> bool {
        std::mem::take(&mut self.pass_ended)
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
        plan.recent = (plan.recent << 1) | on_plan as u64;
        plan.seen = (plan.seen + 1).min(64);
        if plan.seen == 64 && plan.recent.count_ones() < MIN_ON_PLAN {
            self.banned.insert(plan.keys.len());
            self.plan = None;
            self.counters.dropped += 1;
        }
    }

    /// An allocation of `size` bytes (rounded) on `stream` was served at `ptr`. Some when a plan
    /// should be made now (the allocator then calls `build`).
    pub fn allocated(&mut self, size: usize, stream: StreamId, ptr: usize) -> Option<Candidate> {
        let number = self.allocations;
        self.allocations += 1;
        self.log.push(Entry {
            size,
            stream,
            start: self.time,
            end: LIVE,
            ptr,
        });
        self.time += 1;
        self.live.insert(ptr, number);
        if self.log.len() > 2 * LOG_KEPT {
            self.log.drain(..LOG_KEPT);
            self.first += LOG_KEPT;
        }
        if self.matcher_base + 2 * LOG_KEPT < number {
            // The matcher remembers every distinct stretch; start it again now and then.
            self.matcher = StretchMatcher::new(WINDOW);
            self.matcher_base = number;
        }
        let q = self.matcher_base + self.matcher.push(size, stream)?;
        let period = number - q;
        let candidate = Candidate {
            from: q + 1,
            period,
        };
        let wanted = period <= MAX_PERIOD
            && !self.banned.contains(&period)
            && candidate.from >= self.first
            && match &self.plan {
                None => true,
                Some(plan) => {
                    let current = plan.keys.len();
                    period > 2 * current || (plan.rebuild_wanted && 2 * period >= current)
                }
            };
        wanted.then_some(candidate)
    }

    /// The block at `ptr` was freed.
    pub fn freed(&mut self, ptr: usize) {
        if let Some(number) = self.live.remove(&ptr) {
            if number >= self.first {
                self.log[number - self.first].end = self.time;
            }
        }
        self.time += 1;
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

    fn template(&self, candidate: &Candidate) -> &[Entry] {
        let start = candidate.from - self.first;
        &self.log[start..start + candidate.period]
    }

    /// Make the plan for `candidate` in `region` and put it in force. False (and the period is not
    /// tried again) when there is nothing to plan or it does not fit the region.
    pub fn build(&mut self, candidate: Candidate, region: &Region) -> bool {
        match self.plan_for(candidate, region) {
            Some((plan, height)) => {
                self.plan = Some(plan);
                self.counters.plans += 1;
                self.counters.height = height as u64;
                true
            }
            None => {
                self.banned.insert(candidate.period);
                false
            }
        }
    }

    fn plan_for(&self, candidate: Candidate, region: &Region) -> Option<(Plan, usize)> {
        let template = self.template(&candidate);
        let period = candidate.period;
        let t0 = template[0].start;
        // The step's length in events: from the instance of position 0 one period before, when the
        // log has it, and at least the template's own span (up to now).
        let now = self.time - t0;
        let cycle = match candidate.from.checked_sub(period) {
            Some(earlier) if earlier >= self.first => t0 - self.log[earlier - self.first].start,
            _ => now,
        }
        .max(now);
        let in_region = |ptr: usize| ptr >= region.base && ptr < region.base + region.size;
        let mut blocks = Vec::new();
        let mut positions = Vec::new();
        let mut transient_live = HashSet::new();
        for (k, entry) in template.iter().enumerate() {
            let start = entry.start - t0;
            let lifetime = if entry.end != LIVE {
                Some(entry.end - entry.start)
            } else {
                let number = candidate.from + k;
                number
                    .checked_sub(period)
                    .filter(|&earlier| earlier >= self.first)
                    .map(|earlier| self.log[earlier - self.first])
                    .filter(|e| (e.size, e.stream) == (entry.size, entry.stream) && e.end != LIVE)
                    .map(|e| e.end - e.start)
            };
            let Some(lifetime) = lifetime.filter(|&d| d > 0 && d < cycle) else {
                continue;
            };
            if entry.stream != region.stream || entry.size > region.size {
                continue;
            }
            if entry.end == LIVE && in_region(entry.ptr) {
                // Live now in the region, where the policy put it: its next instance is planned
                // freely, and the block itself is left out of the obstacles (it goes within the
                // step). Where it is in the way of the first pass, the request meets a taken
                // range and goes to the policy once.
                transient_live.insert(entry.ptr);
            }
            blocks.push(Lifetime {
                size: entry.size,
                start,
                end: start + lifetime,
            });
            positions.push(k);
        }
        if blocks.is_empty() {
            return None;
        }
        let mut obstacles: Vec<(usize, usize)> = region
            .live
            .iter()
            .filter(|(ptr, _)| !transient_live.contains(ptr) && in_region(*ptr))
            .map(|&(ptr, size)| (ptr - region.base, ptr - region.base + size))
            .collect();
        obstacles.sort_unstable();
        let placement = Order::ALL
            .iter()
            .filter_map(|&order| place_cyclic_around(&blocks, cycle, order, &obstacles).ok())
            .min_by_key(|p| p.size)?;
        if placement.size > region.size {
            return None;
        }
        let mut addresses = vec![None; period];
        for (i, &k) in positions.iter().enumerate() {
            addresses[k] = Some(region.base + placement.offsets[i]);
        }
        let plan = Plan {
            keys: template.iter().map(|e| (e.size, e.stream)).collect(),
            addresses,
            cursor: 0,
            recent: 0,
            seen: 0,
            skipped: 0,
            missed: 0,
            conflicts: 0,
            rebuild_wanted: false,
            passes: 0,
        };
        Some((plan, placement.size))
    }

    /// Forget the plan in force (its region went away).
    pub fn drop_plan(&mut self) {
        if self.plan.take().is_some() {
            self.counters.dropped += 1;
        }
    }
}
