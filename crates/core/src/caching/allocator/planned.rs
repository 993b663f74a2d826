//! planned_placement in the allocator: malloc asks the planner (`planning::online`) for an address
//! and serves the request there when the range is free (`alloc_at`), mapping the pages under it;
//! otherwise, and for every request off the plan, the policy serves it as usual (with
//! expandable_trim's rules at the plans' line, a plan in force or not: `trimming`). Planned
//! blocks are ordinary blocks of the segment the plan lies in: they split, merge, free, show in
//! snapshots and count in every statistic as any block there does (a request of over 1 MiB planned
//! in the small pool's segment counts in the small pool, where it lies, and one under 1 MiB in the
//! large pool's, in the large). At the line, the policy may serve a large request from the small
//! pool's free range as well (`borrow_from_small_pool`, allocator/expandable.rs). A plan that
//! replaces its step's plan has the pages it touches mapped when it is put in force, a call per
//! run (`map_plan_pages`); any other maps them as its first pass comes to each.

use super::*;
use crate::planning::online::{
    Candidate, PlanJob, PlannedStep, PlannerCounters, Region, PASS_KEEP_SLACK, PLAN_SLACK,
};
use std::sync::Arc;

/// Steps of this many blocks or more are placed off the request path (`PlanInMaking`): a
/// placement's cost grows with its blocks (tens of milliseconds at a few thousand, hundreds at
/// ten thousand), and the request that found the step would wait that long.
pub(super) const PLAN_OFF_PATH_FROM: usize = 2048;

/// A large step's plan being placed on a thread of its own, put in force at allocation `at`: the
/// same point of the next step as the one it was found at, where the same blocks are live. Until
/// then the plan in force (or the policy) serves on and no request waits for the placement.
pub(super) struct PlanInMaking {
    /// What is being placed, and the step it was taken from.
    job: Arc<PlanJob>,
    candidate: Candidate,
    placing: Placing,
    at: usize,
    /// Whether this is the second placement off the path for the step (the job changed once).
    again: bool,
}

/// The placement on its thread, or done already (no thread could be started).
enum Placing {
    Thread(Worker),
    Done(PlannedStep),
}

/// The placement's thread. A placement no one wants any more (its job changed, planned_placement
/// turned off) is retired: kept until its thread has finished (`reap_workers`), so that no request
/// waits for it. Dropped unjoined (the allocator dropped), it is joined, so that no thread of the
/// library outlives its allocator; in a child process it is not there (fork copies only the
/// forking thread) and is let be.
pub(super) struct Worker {
    handle: Option<std::thread::JoinHandle<PlannedStep>>,
    /// The process that started it.
    process: u32,
}

impl Worker {
    /// Whether its thread has finished (joining it then costs nothing).
    fn finished(&self) -> bool {
        self.handle
            .as_ref()
            .is_none_or(|handle| handle.is_finished())
    }

    /// The placement, waiting for it if it is not done; None in a child process.
    fn join(mut self) -> Option<PlannedStep> {
        self.wait()
            .map(|placed| placed.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    }

    /// Wait for the thread, once; None when already waited for, or in a child process, where its
    /// handle names a thread of the parent: neither joined nor detached there.
    fn wait(&mut self) -> Option<std::thread::Result<PlannedStep>> {
        let handle = self.handle.take()?;
        if self.process != std::process::id() {
            std::mem::forget(handle);
            return None;
        }
        Some(handle.join())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Its placement is no one's: only its end is waited for.
        let _ = self.wait();
    }
}

/// The default pool and the index of the expandable segment a plan lies in.
type PlanSegment = (PoolKind, usize);

impl CachingAllocator {
    /// What the planner has done on this device (None: planned_placement is off).
    pub fn planner_counters(&self) -> Option<PlannerCounters> {
        self.planner.as_ref().map(|p| p.counters())
    }

    /// malloc_cached with a planner: the request the plan expects next, served from the block
    /// parked at its planned address (the steady state of a planned step), or None, nothing
    /// changed, for `malloc_with_plan` to serve. The same as that path in this case, with a plain
    /// address for an answer.
    pub(super) fn malloc_parked(&mut self, size: usize, stream: StreamId) -> Option<usize> {
        // Events and deferred frees are processed on the full path.
        if !self.pending_events.is_empty() || !self.private_pools.deferred_frees.is_empty() {
            return None;
        }
        let rounded = self.plannable_size(size, stream)?;
        let address = self.planner.as_ref()?.expected_address(rounded, stream)?;
        let id = self
            .parked_at(address, stream)
            .filter(|&id| self.parked_serves(id, address + rounded))?;
        let planner = self.planner.as_mut().expect("planning");
        let advice = planner.advise_expected();
        debug_assert_eq!(advice, Some(address));
        debug_assert!(!planner.pass_ended(), "no pass ends before the step's end");
        let (id, ptr) = self.take_parked(id, rounded, size);
        self.planned_allocation(rounded, stream, ptr, id);
        self.verify("malloc");
        #[cfg(test)]
        {
            self.served_parked_first += 1;
        }
        Some(ptr)
    }

    /// The rounded size of a request the planner sees; None for one it never sees: captures and
    /// private pools keep their own rules, unplanned and unlogged, and a request of 0 bytes (or
    /// too large to round) has no block to plan.
    #[inline(always)]
    fn plannable_size(&self, size: usize, stream: StreamId) -> Option<usize> {
        let routed_away =
            self.capturing || (self.routing && self.private_pools.route(stream) != DEFAULT_POOLS);
        if routed_away || size == 0 {
            return None;
        }
        round_size(size, &self.config)
    }

    /// malloc_begin with a planner: the planned address first, then the policy.
    pub(super) fn malloc_with_plan(&mut self, size: usize, stream: StreamId) -> Result<MallocStep> {
        let Some(rounded) = self.plannable_size(size, stream) else {
            // A capture's requests on other streams may come to the default pools.
            self.unpark_all();
            return self.malloc_begin_unchecked(size, stream);
        };
        let planner = self
            .planner
            .as_mut()
            .expect("malloc_with_plan has a planner");
        let advice = planner.advise(rounded, stream);
        if planner.take_pass_end() && !self.keeps_pages_at_pass_end() {
            // Best effort: pages the device would not unmap stay mapped and counted.
            let _ = self.trim_for_plan(true);
        }
        if let Some(address) = advice {
            if !self.private_pools.deferred_frees.is_empty() {
                self.insert_deferred_events()?;
            }
            if !self.pending_events.is_empty() {
                self.process_events()?;
            }
            match self.alloc_at(address, rounded, size, stream)? {
                Some((id, ptr)) => {
                    self.planned_allocation(rounded, stream, ptr, id);
                    return Ok(MallocStep::Done(ptr));
                }
                None => self.planner.as_mut().expect("still planning").conflict(),
            }
        }
        // The policy sees free memory merged, as it would be without parking.
        self.unpark_all();
        let step = self.malloc_begin_unchecked(size, stream)?;
        if let MallocStep::Done(ptr) = step {
            let id = *self.active.get(&ptr).expect("just handed out");
            self.planned_allocation(rounded, stream, ptr, id);
        }
        Ok(step)
    }

    /// Tell the planner of allocation `id` at `ptr`; make the plan it asks for, and put in force
    /// the one made off the request path when its allocation has come.
    /// Never fails: the request is served already, and a plan that cannot be made (the device
    /// refused the segment's reservation) is only memory not saved.
    #[inline]
    fn planned_allocation(&mut self, rounded: usize, stream: StreamId, ptr: usize, id: BlockId) {
        let allocated = self.stats.allocated_bytes.current_all() as usize;
        self.pass_allocated_peaks[0] = self.pass_allocated_peaks[0].max(allocated);
        let planner = self.planner.as_mut().expect("planning");
        if let Some(candidate) = planner.allocated(rounded, stream, ptr, id as usize) {
            if self.make_plan(candidate).is_err() {
                self.planner
                    .as_mut()
                    .expect("planning")
                    .give_up(candidate.period());
            }
        }
        if !self.retired_workers.is_empty() {
            self.reap_workers();
        }
        if let Some(at) = self.plan_in_making.as_ref().map(|making| making.at) {
            if self.planner.as_ref().expect("planning").allocations() >= at {
                self.adopt_plan_in_making();
            }
        }
    }

    /// Plan `candidate` in an expandable segment of its stream (`plan_region`). A step of
    /// `PLAN_OFF_PATH_FROM` blocks or more is placed on a thread of its own and put in force one
    /// step later (`PlanInMaking`); a smaller one at once.
    fn make_plan(&mut self, candidate: Candidate) -> Result<()> {
        // The blocks parked for the plan in force are no one's now.
        self.unpark_all();
        let (segment, region) = self.plan_region(&candidate)?;
        let planner = self.planner.as_mut().expect("planning");
        let Some(job) = planner.prepare(candidate, &region) else {
            return Ok(());
        };
        if job.blocks() < self.plan_off_path_from {
            self.put_plan_in_force(job.run(), segment);
            return Ok(());
        }
        self.place_off_path(job, candidate, false);
        Ok(())
    }

    /// Place `job` (the plan of `candidate`) on a thread of its own, to be put in force one step
    /// later; on the calling thread if no thread can be started (or the tests say so).
    fn place_off_path(&mut self, job: PlanJob, candidate: Candidate, again: bool) {
        let planner = self.planner.as_mut().expect("planning");
        let at = planner.allocations() + candidate.period();
        planner.making_plan();
        let job = Arc::new(job);
        let worker_job = Arc::clone(&job);
        #[cfg(test)]
        let on_thread = !self.plan_off_path_inline;
        #[cfg(not(test))]
        let on_thread = true;
        let spawned = on_thread
            .then(|| {
                std::thread::Builder::new()
                    .name("accalloc-plan".into())
                    .spawn(move || worker_job.run())
                    .ok()
            })
            .flatten();
        let placing = match spawned {
            Some(handle) => Placing::Thread(Worker {
                handle: Some(handle),
                process: std::process::id(),
            }),
            // No thread to be had: placed here, put in force all the same one step later.
            None => Placing::Done(job.run()),
        };
        self.plan_in_making = Some(Box::new(PlanInMaking {
            job,
            candidate,
            placing,
            at,
            again,
        }));
    }

    /// Let the plan being placed off the path go (planned_placement turned off): its thread is let
    /// finish.
    pub(super) fn let_go_plan_in_making(&mut self) {
        if let Some(making) = self.plan_in_making.take() {
            self.retire(making.placing);
        }
    }

    /// Keep a placement no one wants until its thread has finished.
    fn retire(&mut self, placing: Placing) {
        if let Placing::Thread(worker) = placing {
            self.retired_workers.push(worker);
        }
        self.reap_workers();
    }

    /// Join the retired placements whose threads have finished.
    fn reap_workers(&mut self) {
        self.retired_workers.retain(|worker| !worker.finished());
    }

    /// Where `candidate`'s plan goes: the expandable segment of its stream that holds the most
    /// live bytes (the blocks that outlive a step are there, and the plan fills the gaps between
    /// them), the large pool's when neither holds any (reserved now if there is none). The
    /// segment (pool, index, range), and the region the planner places in.
    fn plan_region(&mut self, candidate: &Candidate) -> Result<(PlanSegment, Region)> {
        let stream = self
            .planner
            .as_ref()
            .expect("planning")
            .stream_of(candidate);
        // The live blocks of each of the stream's two segments, (address, size), in one pass.
        let small = self.reservation_of(PoolKind::Small, stream);
        let large = self.reservation_of(PoolKind::Large, stream);
        let (mut small_live, mut large_live) = (Vec::new(), Vec::new());
        for &id in self.active.values() {
            let block = &self.blocks[id];
            let segment = block.expandable.map(|s| s as usize);
            if segment.is_some() && segment == small {
                small_live.push((block.ptr, block.size));
            } else if segment.is_some() && segment == large {
                large_live.push((block.ptr, block.size));
            }
        }
        let bytes = |live: &[(usize, usize)]| live.iter().map(|&(_, size)| size).sum::<usize>();
        let (pool, index, live) = match (small, large) {
            (Some(index), large) if large.is_none() || bytes(&small_live) > bytes(&large_live) => {
                (PoolKind::Small, index, small_live)
            }
            (_, Some(index)) => (PoolKind::Large, index, large_live),
            _ => {
                let id = self.find_expandable_block(DEFAULT_POOLS, PoolKind::Large, stream, 0)?;
                let index = self.blocks[id].expandable.expect("a reservation") as usize;
                (PoolKind::Large, index, Vec::new())
            }
        };
        let (base, size) = self.expandable[index].range();
        let region = Region {
            stream,
            base,
            size,
            live,
            peak_allocated: self.stats.allocated_bytes.peak_all() as usize,
            page: self.expandable[index].page,
        };
        Ok(((pool, index), region))
    }

    /// Put the plan made off the request path in force: its allocation has come, one step after
    /// the step it was taken from. The plan is the one a planner placing at once would make now:
    /// the stretch since is checked to be the same step (the same sizes in the same order), and the
    /// job is taken again from the log and the device as they are now. When it is the same as the
    /// one placed (the step and its blocks' places repeated), the thread's placement is put in
    /// force (waiting for the thread if it has not finished: no figure depends on its speed). When
    /// it changed (the first steps' blocks often lie elsewhere in the next), it is placed off the
    /// path once more, and the second time at once. In a child process the thread is not there
    /// (fork copies only the forking thread): the job is placed here.
    fn adopt_plan_in_making(&mut self) {
        let making = *self.plan_in_making.take().expect("a plan in making");
        let candidate = making.candidate.later(1);
        // The step did not come again, or its segment is not there: no plan (the planner backs
        // off), and the placement is no one's.
        let repeats = self
            .planner
            .as_ref()
            .expect("planning")
            .repeats(&making.candidate, &candidate);
        let region = repeats
            .then(|| {
                self.unpark_all();
                self.plan_region(&candidate).ok()
            })
            .flatten();
        let Some((segment, region)) = region else {
            self.planner
                .as_mut()
                .expect("planning")
                .give_up(candidate.period());
            self.retire(making.placing);
            return;
        };
        let planner = self.planner.as_mut().expect("planning");
        let step = match planner.job_for(candidate, &region) {
            None => {
                self.retire(making.placing);
                PlannedStep::none(candidate.period())
            }
            Some(job) if job != *making.job && !making.job.repeats_now(&job) => {
                self.retire(making.placing);
                if !making.again {
                    self.place_off_path(job, candidate, true);
                    return;
                }
                job.run()
            }
            Some(job) => {
                #[cfg(test)]
                {
                    self.plans_placed_off_path_used += matches!(
                        &making.placing,
                        Placing::Thread(w) if w.process == std::process::id()
                    ) as usize
                        + matches!(&making.placing, Placing::Done(_)) as usize;
                }
                let step = match making.placing {
                    Placing::Done(step) => step,
                    // In a child process the parent's thread is not there: placed here.
                    Placing::Thread(worker) => worker.join().unwrap_or_else(|| job.run()),
                };
                // The same job but that its step has now repeated exactly: a plan made stands
                // (it paid without that), none made may now be refined into one that pays, and
                // the job is placed once more. (A job placed again was taken here, its step
                // repeated: only a first placement can differ so.)
                if step.made() || job == *making.job {
                    step
                } else {
                    debug_assert!(!making.again, "a job placed again had repeated already");
                    self.place_off_path(job, candidate, true);
                    return;
                }
            }
        };
        self.put_plan_in_force(step, segment);
    }

    /// Put the plan `step` made in `segment` (pool, index) in force, if it was made and pays: the
    /// pages it and the rest of the device would hold come within the line.
    fn put_plan_in_force(&mut self, step: PlannedStep, segment: PlanSegment) {
        let (pool, index) = segment;
        self.unpark_all();
        self.pool_mut(DEFAULT_POOLS, pool).index_addresses();
        if !self.planner.as_mut().expect("planning").install(step) {
            return;
        }
        // A plan rejected below puts the one before back, in its own pool.
        let previous_pool = std::mem::replace(&mut self.plan_pool, pool);
        // Best effort, as at a pass's end.
        let _ = self.trim_for_plan(true);
        // The plan pays only if its range and what stays mapped outside it (the other pool's
        // pages, which long-lived blocks keep) come near the most ever allocated.
        let planner = self.planner.as_mut().expect("planning");
        let (start, end) = planner.range().expect("a plan in force");
        let segment = &self.expandable[index];
        let inside = (start..end)
            .step_by(segment.page)
            .filter(|&address| segment.page_mapped(address))
            .count()
            * segment.page;
        let touched = planner.touched().expect("a plan in force");
        // The plan's mapped pages are reserved: the books count every page the device holds.
        debug_assert!(inside <= self.reserved_total);
        let needed = touched + self.reserved_total.saturating_sub(inside);
        // Pages are the unit: the line is the most ever allocated and the slack, in pages.
        let peak = self.stats.allocated_bytes.peak_all() as f64;
        let line = ((peak * (1.0 + PLAN_SLACK)) as usize).next_multiple_of(segment.page);
        if needed > line {
            planner.reject_plan();
            self.plan_pool = previous_pool;
            return;
        }
        // Its pages are mapped now, a call per run of them, rather than one by one as its first
        // pass comes to each, as far as the device stays within the most it has held (the first
        // pass would map them all by the step's peak, but gives back pages elsewhere first where
        // it must). Best effort: the pages not mapped now are mapped where a request comes to
        // them, as before.
        if planner.replaces_a_steady_plan() {
            let runs = planner.touched_runs().to_vec();
            let _ = self.map_plan_pages(index, &runs);
        }
    }

    /// Map what is unmapped of `runs` (address ranges of pages) in expandable segment `index`, a
    /// call per unmapped block under a run, while reserved stays within its peak.
    fn map_plan_pages(&mut self, index: usize, runs: &[(usize, usize)]) -> Result<()> {
        let segment = &self.expandable[index];
        let (stream, pool, (base, size)) = (segment.stream, segment.pool, segment.range());
        let (page, peak) = (segment.page, self.stats.reserved_bytes.peak_all() as usize);
        for &(start, end) in runs {
            let (start, end) = (start.max(base), end.min(base + size));
            loop {
                // The first unmapped block of the segment under [start, end).
                let blocks = &self.blocks;
                let found = self
                    .block_pool(DEFAULT_POOLS, pool)
                    .unmapped
                    .range((stream, base)..(stream, end))
                    .map(|(_, &id)| id)
                    .find(|&id| {
                        let block = &blocks[id];
                        block.expandable == Some(index as u32) && block.ptr + block.size > start
                    });
                let Some(id) = found else { break };
                let block = self.blocks[id];
                let (from, to) = (block.ptr.max(start), end.min(block.ptr + block.size));
                if self.reserved_total + (to - from).next_multiple_of(page) > peak {
                    return Ok(());
                }
                let mapped = self.map_part(id, from, to, to);
                if !matches!(mapped, Ok(bytes) if bytes > 0) {
                    return mapped.map(|_| ());
                }
            }
        }
        Ok(())
    }

    /// Map [from, to) of unmapped block `id` (`from` a page boundary inside it: the part before it
    /// is cut off and stays unmapped), as `map_block` does, [from, required_to) at least (a device
    /// out of memory past it keeps what it mapped); when nothing was mapped, the block is made
    /// whole again.
    fn map_part(
        &mut self,
        id: BlockId,
        from: usize,
        to: usize,
        required_to: usize,
    ) -> Result<usize> {
        let split = from > self.blocks[id].ptr;
        let id = if split {
            self.split_unmapped(id, from)
        } else {
            id
        };
        let mapped = self.map_block(id, to - from, required_to - from);
        if split && !matches!(mapped, Ok(bytes) if bytes > 0) {
            let front = self.blocks[id].prev.expect("the front just cut");
            self.try_merge(front, Some(id));
        }
        mapped
    }

    /// Place the plans of steps of `blocks` blocks or more off the request path (the default is
    /// `PLAN_OFF_PATH_FROM`; usize::MAX places every plan at once): for benchmarks and tests.
    pub fn set_plan_off_path_from(&mut self, blocks: usize) {
        self.plan_off_path_from = blocks;
    }

    /// Place every plan of `blocks` blocks or more off the request path, on a thread of its own
    /// or (`inline`) on the calling thread, put in force one step later all the same.
    #[cfg(test)]
    pub(crate) fn place_plans_off_path(&mut self, blocks: usize, inline: bool) {
        self.plan_off_path_from = blocks;
        self.plan_off_path_inline = inline;
    }

    /// How many placements made off the request path were put in force as placed (the job
    /// unchanged, in this process).
    #[cfg(test)]
    pub(crate) fn plans_placed_off_path_used(&self) -> usize {
        self.plans_placed_off_path_used
    }

    /// The planner (tests look into it).
    #[cfg(test)]
    pub(crate) fn planner_mut(&mut self) -> Option<&mut crate::planning::online::OnlinePlanner> {
        self.planner.as_deref_mut()
    }

    /// Requests served by `malloc_parked`, ahead of `malloc_begin`.
    #[cfg(test)]
    pub(crate) fn served_parked_first(&self) -> usize {
        self.served_parked_first
    }

    /// Whether a plan is being placed off the request path.
    #[cfg(test)]
    pub(crate) fn plan_in_making(&self) -> bool {
        self.plan_in_making.is_some()
    }

    /// Make the plan being placed look as if its thread was started by another process.
    #[cfg(test)]
    pub(crate) fn pretend_plan_in_making_forked(&mut self) {
        if let Some(PlanInMaking {
            placing: Placing::Thread(worker),
            ..
        }) = self.plan_in_making.as_deref_mut()
        {
            worker.process = worker.process.wrapping_add(1);
        }
    }

    /// At a pass's end, whether the free pages outside the plan stay mapped: while the device holds
    /// no more than PASS_KEEP_SLACK over the most the pass just ended and the one before allocated.
    /// The next pass (of the same step, or of another shape where a few alternate) most often
    /// needs them again, and giving them back only to map them again costs two device calls a
    /// page; above that, after a larger step or a larger shape, they go. Starts the next pass's
    /// count.
    fn keeps_pages_at_pass_end(&mut self) -> bool {
        let allocated = self.stats.allocated_bytes.current_all() as usize;
        let [pass, before] = self.pass_allocated_peaks;
        self.pass_allocated_peaks = [allocated, pass];
        let needed = pass.max(before);
        let line = needed.saturating_add((needed as f64 * PASS_KEEP_SLACK) as usize);
        self.reserved_total <= line
    }

    /// A new plan lays the blocks out afresh: the free pages of the default pools are unmapped, so
    /// that what came before does not add to what the plan maps. At the end of a pass, those
    /// outside the plan's range (`keep_plan_range`), which the policy mapped during the pass: the
    /// plan's own stay mapped for the next pass.
    fn trim_for_plan(&mut self, keep_plan_range: bool) -> Result<()> {
        let planned = self
            .planner
            .as_ref()
            .and_then(|p| p.range())
            .filter(|_| keep_plan_range);
        if planned.is_none() {
            self.unpark_all();
        }
        for pool in [PoolKind::Large, PoolKind::Small] {
            let blocks = &self.blocks;
            let parked = |neighbour: Option<BlockId>| neighbour.is_some_and(|n| blocks[n].parked);
            // The plan's own range keeps its pages: the next pass maps them again otherwise. A
            // free block beside a parked one (which lies in the plan) is part of the plan's free
            // block that merging would have made.
            let in_plan = |id: BlockId| {
                let block = &blocks[id];
                pool == self.plan_pool
                    && planned.is_some_and(|(start, end)| {
                        (block.ptr < end && block.ptr + block.size > start)
                            || parked(block.prev)
                            || parked(block.next)
                    })
            };
            let (free, across): (Vec<BlockId>, Vec<BlockId>) = self
                .block_pool(DEFAULT_POOLS, pool)
                .entries()
                .map(|(_, id)| id)
                .filter(|&id| blocks[id].expandable.is_some())
                .partition(|&id| !in_plan(id));
            for id in free {
                self.unmap_block(id)?;
            }
            // A free block that runs past the plan's end: its pages above the plan go too.
            let Some((_, end)) = planned else { continue };
            for id in across {
                let block = self.blocks[id];
                let segment = &self.expandable[block.expandable.expect("expandable") as usize];
                // The first page boundary of the segment at or after the plan's end (a reservation
                // need not be aligned to its page size): cut anywhere else, the page there would
                // be held by two free blocks, neither of which could give it back.
                let (base, _) = segment.range();
                let cut = segment.page_address((end - base).div_ceil(segment.page));
                // Only where a whole page lies above the cut: a part with none would stay mapped,
                // a free block beside the one below it, the two never merged.
                if block.ptr >= cut {
                    // Wholly above the plan's last page: beside a parked block at the plan's end,
                    // it is the part above the cut of the free block merging would have made.
                    self.unmap_block(id)?;
                } else if block.ptr < cut && block.ptr + block.size >= cut + segment.page {
                    self.pool_mut(DEFAULT_POOLS, pool).remove(&block);
                    let above = self.split_free_front(id, cut);
                    self.cache_block(above);
                    if let Err(e) = self.unmap_block(above) {
                        // The device kept the pages: the two parts are one free block again.
                        self.merge_with_free_front(above);
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// The default pools' expandable segment of `pool` and `stream` (the first, if there are
    /// several).
    fn reservation_of(&self, pool: PoolKind, stream: StreamId) -> Option<usize> {
        self.expandable.iter().position(|s| {
            s.range().1 > 0 && s.owner == DEFAULT_POOLS && s.pool == pool && s.stream == stream
        })
    }

    /// The free (cached or parked) or unmapped block of the plan's pool of `stream` that holds
    /// `address`.
    fn block_holding(&self, stream: StreamId, address: usize) -> Option<BlockId> {
        let pool = self.block_pool(DEFAULT_POOLS, self.plan_pool);
        let holds = |id: BlockId| {
            let block = &self.blocks[id];
            block.ptr <= address && block.ptr + block.size > address
        };
        // Free first: where the plan's pages stay mapped between passes (its steady state), the
        // free block found is the one; blocks do not overlap, so no unmapped one can hold it too.
        if let Some(free) = pool
            .free_at_or_below(stream, address)
            .filter(|&id| holds(id))
        {
            return Some(free);
        }
        pool.unmapped
            .range((stream, 0)..=(stream, address))
            .next_back()
            .map(|(_, &id)| id)
            .filter(|&id| holds(id))
    }

    /// The blocks from `start` that lie under [address, end), and the bytes of the pages under the
    /// range that are not mapped yet.
    fn unmapped_under(&self, start: BlockId, address: usize, end: usize) -> (Vec<BlockId>, usize) {
        let (mut under, mut new_bytes) = (Vec::new(), 0);
        let mut cursor = Some(start);
        while let Some(id) = cursor {
            let block = &self.blocks[id];
            if block.ptr >= end {
                break;
            }
            under.push(id);
            if let (false, Some(index)) = (block.mapped, block.expandable) {
                let segment = &self.expandable[index as usize];
                let from = address.max(block.ptr);
                let (first, last) =
                    segment.pages_covering(from, end.min(block.ptr + block.size) - from);
                new_bytes += (last - first) * segment.page;
            }
            cursor = block.next;
        }
        (under, new_bytes)
    }

    /// Hand out [address, address + rounded) of the plan's expandable segment of `stream`, when
    /// every byte of it is free or unmapped (mapping what is not): the block and its address, or
    /// None (nothing changed but pages mapped) when some of it is taken or the device has no room.
    pub(super) fn alloc_at(
        &mut self,
        address: usize,
        rounded: usize,
        requested: usize,
        stream: StreamId,
    ) -> Result<Option<(BlockId, usize)>> {
        let end = address + rounded;
        // The block parked here, found by its hint (the steady state) or, when the hint missed,
        // by the address index, the parts cut off parked blocks entered first.
        let start = match self.parked_at(address, stream) {
            Some(id) => id,
            None => {
                self.index_rests();
                let Some(id) = self.block_holding(stream, address) else {
                    return Ok(None);
                };
                id
            }
        };
        let first = self.blocks[start];
        if first.parked && first.ptr == address && self.parked_serves(start, end) {
            return Ok(Some(self.take_parked(start, rounded, requested)));
        }
        let segment = first.expandable;
        // Every block under the range must be free with no event pending, in the same segment.
        let mut cursor = Some(start);
        let mut covered = first.ptr;
        let (mut all_mapped, mut parked_under) = (true, false);
        while covered < end {
            match self.allocatable(cursor) {
                Some(id) if self.blocks[id].expandable == segment => {
                    covered = self.blocks[id].ptr + self.blocks[id].size;
                    cursor = self.blocks[id].next;
                    all_mapped &= self.blocks[id].mapped;
                    parked_under |= self.blocks[id].parked;
                }
                _ => return Ok(None),
            }
        }
        if parked_under || (!all_mapped && self.any_parked()) {
            // Parked blocks under the range become ordinary free blocks (all of them when pages
            // are to be mapped: the line's trim looks at every free page), then the range is
            // served as without parking.
            if all_mapped {
                let (mut under, _) = self.unmapped_under(start, address, end);
                under.retain(|&id| self.blocks[id].parked);
                for id in under {
                    self.unpark(id);
                }
            } else {
                self.unpark_all();
            }
            return self.alloc_at(address, rounded, requested, stream);
        }
        if !all_mapped {
            // The line holds for the plan's pages too: before they are mapped, free pages
            // elsewhere go back where the device would otherwise cross it (a step of another
            // shape left them). Best effort: pages the device would not unmap stay mapped and
            // counted.
            let (under, new_bytes) = self.unmapped_under(start, address, end);
            let _ = self.give_back_over_line(rounded, new_bytes, &under);
        }
        // Map the unmapped blocks under the range, one at a time (each map merges with its free
        // neighbours, so the chain is walked again from the block holding `address`). The blocks
        // under the range are free and in the address index: nothing is parked when pages are to
        // be mapped (unparked above), and nothing parked lies under the range.
        debug_assert!(all_mapped || !self.any_parked());
        loop {
            let mut cursor = self.block_holding(stream, address);
            let mut unmapped = None;
            while let Some(id) = cursor {
                let block = &self.blocks[id];
                if block.ptr >= end {
                    break;
                }
                if !block.mapped {
                    unmapped = Some(id);
                    break;
                }
                cursor = block.next;
            }
            let Some(id) = unmapped else { break };
            let index = segment.expect("expandable") as usize;
            let page = self.expandable[index].page;
            let base = self.expandable[index].range().0;
            let block = self.blocks[id];
            let from = base + (address.max(block.ptr) - base) / page * page;
            // The request's own pages are required; those ahead of them only wanted.
            let required_to = end.min(block.ptr + block.size);
            let to = self
                .plan_run_ahead(from, required_to, rounded, page)
                .min(block.ptr + block.size);
            let mapped = self.map_part(id, from, to, required_to);
            if !matches!(mapped, Ok(bytes) if bytes > 0) {
                return mapped.map(|_| None);
            }
        }
        let id = if all_mapped {
            start
        } else {
            self.block_holding(stream, address)
                .expect("the range is mapped and free")
        };
        let block = self.blocks[id];
        debug_assert!(block.mapped && !block.allocated && block.ptr + block.size >= end);
        self.pool_mut(DEFAULT_POOLS, block.pool).remove(&block);
        let id = if block.ptr < address {
            self.split_free_front(id, address)
        } else {
            id
        };
        let split = self.blocks[id].size > rounded;
        let (handed, ptr) = self.hand_out_block(id, rounded, requested, split);
        self.hold_planned(handed);
        Ok(Some((handed, ptr)))
    }

    /// Where a planned request maps [from, to): on to the end of the run of the plan's pages it
    /// lies in, as far as the line leaves room. The pass maps those pages as its blocks come to
    /// them anyway, a call each; mapped with the first, they cost one call, and within the line
    /// no peak moves (on the recorded traces no utilization moved; the bucketed GPT-2's calls
    /// fell from 148 to 109, llama_train's from 99 to 90). Only `to` moves.
    fn plan_run_ahead(&self, from: usize, to: usize, rounded: usize, page: usize) -> usize {
        let Some(run_end) = self.planner.as_ref().and_then(|planner| {
            planner
                .touched_runs()
                .iter()
                .find(|&&(start, end)| start < to && to <= end)
                .map(|&(_, end)| end)
        }) else {
            return to;
        };
        let needed = (to - from).next_multiple_of(page);
        let room = self.pages_ahead_within_line(rounded, needed, page);
        run_end.min(from + needed + room).max(to)
    }

    /// Cut unmapped block `id` at `at` (a page boundary inside it): the front stays unmapped as a
    /// block of its own; returns `id`, now starting at `at`.
    fn split_unmapped(&mut self, id: BlockId, at: usize) -> BlockId {
        let front = self.cut_front(id, at);
        let block = self.blocks[front];
        let pool = self.pool_mut(block.private, block.pool);
        pool.unmapped.insert((block.stream, block.ptr), front);
        pool.unmapped.insert((block.stream, at), id);
        id
    }

    /// Cut free block `id` (out of its pool) at `at`: the front goes back to the pool as a free
    /// block of its own; returns `id`, now starting at `at`.
    fn split_free_front(&mut self, id: BlockId, at: usize) -> BlockId {
        let front = self.cut_front(id, at);
        self.cache_block(front);
        id
    }

    /// Undo split_free_front: free cached block `id` and the free cached block before it become
    /// one, cached.
    fn merge_with_free_front(&mut self, id: BlockId) {
        let front = self.blocks[id].prev.expect("the front just cut");
        let block = self.blocks[front];
        self.pool_mut(DEFAULT_POOLS, block.pool).remove(&block);
        self.try_merge(front, Some(id));
        self.cache_block(front);
    }
}
