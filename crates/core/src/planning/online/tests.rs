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
