//! Learning the step: every allocation is logged (its size, stream, address and lifetime), the
//! stretch matcher says where the latest allocations were asked for before, and a period found
//! is a candidate for a plan. While the program keeps to the plan, the plan answers for the
//! matcher (`kept_to_plan`), the request path's common case.

use super::*;

impl OnlinePlanner {
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

    /// Log an allocation (its number the log's next) and name it by its slot until it is freed;
    /// its number.
    #[inline(always)]
    fn log_allocation(&mut self, size: usize, stream: StreamId, ptr: usize, slot: usize) -> usize {
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
        number
    }

    /// `allocated` for any allocation but one kept to the plan.
    #[inline(never)]
    pub(super) fn allocated_off_plan(
        &mut self,
        size: usize,
        stream: StreamId,
        ptr: usize,
        slot: usize,
    ) -> Option<Candidate> {
        let number = self.log_allocation(size, stream, ptr, slot);
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
        self.note_match(number, matched);
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
    pub(super) fn kept_to_plan(&self) -> Option<usize> {
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
    pub(super) fn allocated_on_plan(
        &mut self,
        size: usize,
        stream: StreamId,
        ptr: usize,
        slot: usize,
        position: usize,
    ) {
        let number = self.log_allocation(size, stream, ptr, slot);
        self.advised = Advised::Nothing;
        self.kept += 1;
        self.plan.as_mut().expect("kept_to_plan").latest = Some((number, position));
        let matched = self.match_from_plan(number, position);
        self.note_match(number, matched);
    }

    /// What the stretch matcher answers for allocation `number` at `position` of the plan kept to:
    /// the plan's `window_back` there; the matcher only counts the allocation.
    #[inline]
    fn match_from_plan(&mut self, number: usize, position: usize) -> Option<usize> {
        let plan = self.plan.as_ref().expect("a plan kept to");
        let period = plan.keys.len();
        self.matcher.skip();
        self.owed_period = period;
        #[cfg(test)]
        {
            self.matcher_record.skipped += 1;
        }
        let back = plan.window_back[position] as usize;
        debug_assert!(back <= period);
        (back > 0).then(|| number - back)
    }

    /// The matcher found allocation `number`'s stretch at `matched`: a period like the plan's is
    /// the one a replacement plan is made from.
    #[inline]
    fn note_match(&mut self, number: usize, matched: Option<usize>) {
        #[cfg(test)]
        self.matcher_record.matches.push(matched);
        if let (Some(q), Some(plan)) = (matched, &self.plan) {
            let (period, current) = (number - q, plan.keys.len());
            // No step longer than MAX_PERIOD is planned: the log keeps a few of those only.
            if 2 * period >= current && period <= 2 * current && period <= MAX_PERIOD {
                self.similar_period = Some(period);
            }
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
    pub(super) fn match_stretch(
        &mut self,
        number: usize,
        size: usize,
        stream: StreamId,
    ) -> Option<usize> {
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
            if self.kept >= plan.keys.len() + WINDOW {
                return self.match_from_plan(number, position);
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
    pub(super) fn earlier_instance(&self, number: usize, period: usize) -> Option<Entry> {
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
    pub(super) fn logged(&self, candidate: &Candidate) -> bool {
        candidate.from >= self.log.first() && candidate.from + candidate.period <= self.log.next()
    }

    pub(super) fn template(&self, candidate: &Candidate) -> impl Iterator<Item = &Entry> + '_ {
        self.log.range(candidate.from, candidate.period)
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
}
