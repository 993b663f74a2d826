//! Serving a plan: each request moves the cursor through the template, and the planner says
//! whether it is the plan's next position (and where it goes), one a few positions on, one of
//! another shape taken for its position, or off the plan; a pass through the template ends at its
//! last position, and a plan most recent requests missed is dropped.

use super::*;

impl OnlinePlanner {
    /// The address planned for the next request, of `size` bytes (rounded) on `stream`, if the plan
    /// has one; moves the cursor past the request's position.
    pub fn advise(&mut self, size: usize, stream: StreamId) -> Option<usize> {
        self.advise_from_cursor(size, stream, true)
    }

    /// `advise`; `may_resize`: the request may be taken for the position at the cursor in a step
    /// of another shape.
    pub(super) fn advise_from_cursor(
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
    pub(super) fn undo_resized(&mut self, size: usize, stream: StreamId) -> Option<usize> {
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
    pub(super) fn advance(&mut self, step: usize, fit: Fit) -> Option<usize> {
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
    pub(super) fn note_advised(&mut self, advised: Advised) {
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
    pub(super) fn note(&mut self, on_plan: bool) {
        let Some(plan) = &mut self.plan else { return };
        plan.recent.push(on_plan);
        if plan.recent.seen() == 64 && plan.recent.on_plan() < MIN_ON_PLAN {
            self.banned.insert(plan.keys.len());
            self.abandon();
        }
    }

    /// Drop the plan in force; its pages go back as a pass's do.
    pub(super) fn abandon(&mut self) {
        self.plan = None;
        self.kept = 0;
        self.counters.dropped += 1;
        self.pass_ended = true;
    }
}
