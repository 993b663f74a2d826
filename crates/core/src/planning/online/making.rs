//! Making a plan: a candidate's template taken from the log (`job_for`: the step's blocks, their
//! lifetimes, what is pinned and what is in the way), placed (`PlanJob::run`, on a thread of its
//! own for a large step), and put in force (`install`); a plan that fails or does not pay backs
//! the planner off.

use super::*;

impl OnlinePlanner {
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

    /// Not now: a later step may give a better plan. Each failure in a row waits twice as long
    /// (up to 64 periods), so that a program whose plans never pay does not pay for making them.
    /// A row is of periods alike (within a factor of two of the one before): a period unlike the
    /// last failed one starts the count again, so that the failed plans of a layer do not hold
    /// back the step's (BERT's three layer plans made its step wait 16 periods, past its run).
    pub(super) fn back_off(&mut self, period: usize) {
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
    pub(super) fn asked_at(&self, candidate: &Candidate, template: &[Entry]) -> Vec<usize> {
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
