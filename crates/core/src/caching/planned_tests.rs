//! planned_placement (allocator/planned.rs over planning::online), on the simulated device: a
//! repeating step is learned and served at planned addresses, requests off the plan are served by
//! the policy, and the books balance after every operation whatever the program does.

use super::*;
use crate::backend::simulated::SimulatedBackend;
use proptest::prelude::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;
const ALL: usize = StatType::All as usize;

fn planned() -> CachingAllocator {
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
    let config = settings::parse_settings("planned_placement:True", &CachingConfig::default())
        .expect("the setting parses");
    CachingAllocator::new(backend, 0, config).unwrap()
}

/// One step of a chain: 40 blocks, block i of 2 MiB + i x 4 KiB (every step asks for the same 40
/// sizes in the same order), each freed once the next is made, the last at the step's end. At
/// most two live at once: the floor is blocks 38 and 39, 4 MiB + 77 x 4 KiB, three 2 MiB pages.
fn chain_step(a: &mut CachingAllocator) -> Vec<usize> {
    chain_step_watched(a, |_| {})
}

/// A planned allocator that has run five chain steps: a plan of the step is in force.
fn planned_after_chain_steps() -> CachingAllocator {
    let mut a = planned();
    for _ in 0..5 {
        chain_step(&mut a);
    }
    a
}

/// The size of block i of a chain step.
fn chain_size(i: usize) -> usize {
    2 * MIB + i * 4096
}

/// chain_step, `watch` called after each block is made and the one before freed.
fn chain_step_watched(
    a: &mut CachingAllocator,
    watch: impl FnMut(&CachingAllocator),
) -> Vec<usize> {
    chain_of(a, chain_size, watch)
}

/// A chain step of blocks of `size(i)` bytes, `watch` called after each block is made and the one
/// before freed; the blocks' addresses.
fn chain_of(
    a: &mut CachingAllocator,
    size: impl Fn(usize) -> usize,
    mut watch: impl FnMut(&CachingAllocator),
) -> Vec<usize> {
    let mut addresses = Vec::new();
    let mut previous = None;
    for i in 0..40 {
        let ptr = a.malloc(size(i), 0).unwrap();
        addresses.push(ptr);
        if let Some(p) = previous.replace(ptr) {
            a.free(p).unwrap();
        }
        watch(a);
    }
    a.free(previous.unwrap()).unwrap();
    addresses
}

#[test]
fn the_setting_implies_expandable_segments_and_is_echoed() {
    let a = planned();
    assert!(a.config().planned_placement);
    assert!(a.config().expandable_segments);
    assert_eq!(
        a.config().to_settings_string(),
        "expandable_segments:True,planned_placement:True"
    );
    assert!(a.planner_counters().is_some());
    let plain = CachingAllocator::new(
        Arc::new(SimulatedBackend::new(1, 1 << 30)),
        0,
        CachingConfig::default(),
    )
    .unwrap();
    assert_eq!(plain.planner_counters(), None);
}

#[test]
fn a_repeating_step_is_served_at_planned_addresses_at_the_floor() {
    let mut a = planned_after_chain_steps();
    let counters = a.planner_counters().unwrap();
    assert!(counters.plans >= 1, "{counters:?}");
    let (before, conflicts_before) = (counters.advised, counters.conflicts);
    // The first steps were the policy's (it mapped more); from here on the plan's.
    a.reset_peak_stats();
    let last = chain_step(&mut a);
    let counters = a.planner_counters().unwrap();
    // Every request of the last step was given its address and served there.
    assert_eq!(counters.advised - before, 40, "{counters:?}");
    assert_eq!(counters.conflicts, conflicts_before);
    // Served the same way every step: the next step's addresses are this step's.
    assert_eq!(chain_step(&mut a), last);
    // The snapshot shows where: the segment holding the step's blocks says which part of it the
    // plan spans (at most its height, counted from the segment's reservation), every block of the
    // step inside.
    let (low, high) = last
        .iter()
        .enumerate()
        .fold((usize::MAX, 0), |(low, high), (i, &ptr)| {
            (low.min(ptr), high.max(ptr + 2 * MIB + i * 4096))
        });
    let segments = a.segments();
    let planned: Vec<_> = segments.iter().filter_map(|s| s.planned_range).collect();
    assert_eq!(planned.len(), 1, "{segments:?}");
    let (start, end) = planned[0];
    assert!(
        start <= low && high <= end,
        "{planned:?} against {low:#x}..{high:#x}"
    );
    assert!(end - start <= a.planner_counters().unwrap().height as usize);
    let json = segments
        .iter()
        .find(|s| s.planned_range.is_some())
        .unwrap()
        .to_json(0);
    assert_eq!(json["planned_range"], serde_json::json!([start, end]));
    let stats = a.stats();
    assert_eq!(
        stats.allocated_bytes[ALL].peak,
        (4 * MIB + 77 * 4096) as i64
    );
    assert_eq!(stats.reserved_bytes[ALL].peak, 6 * MIB as i64);
    // The plan's floor is that peak, the least any placement of the step needs; its height, from
    // the segment's start, is at least that.
    let counters = a.planner_counters().unwrap();
    assert_eq!(counters.floor, (4 * MIB + 77 * 4096) as u64, "{counters:?}");
    assert!(counters.floor <= counters.height, "{counters:?}");
    assert_eq!(stats.allocated_bytes[ALL].current, 0);
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

/// The chain in another shape (a batch twice as large, say, for one tensor of the step): block 20
/// weighs 4 MiB + 80 KiB, twice its 2 MiB + 80 KiB.
fn wide_chain_size(i: usize) -> usize {
    if i == 20 {
        4 * MIB + i * 4096
    } else {
        chain_size(i)
    }
}

#[test]
fn steps_of_two_shapes_are_served_by_one_plan_of_the_most_each_position_asked() {
    let mut a = planned_after_chain_steps();
    // The wide step asks more at position 20 than the plan placed there: the policy serves that
    // request, and the pass asks for a plan that places 4 MiB + 80 KiB there; the narrow steps'
    // requests at position 20 fit it.
    for _ in 0..2 {
        chain_of(&mut a, wide_chain_size, |_| {});
        chain_step(&mut a);
    }
    let stats = a.stats();
    let calls = (stats.num_device_alloc, stats.num_device_free);
    let counters = a.planner_counters().unwrap();
    a.reset_peak_stats();
    let wide = chain_of(&mut a, wide_chain_size, |_| {});
    let narrow = chain_step(&mut a);
    let wide_again = chain_of(&mut a, wide_chain_size, |_| {});
    // Every request of the three steps was given its address and served there, the narrow step's
    // where the wide steps' were: one layout for both shapes, and no device call.
    let now = a.planner_counters().unwrap();
    assert_eq!(now.advised - counters.advised, 3 * 40, "{now:?}");
    assert_eq!(now.conflicts, counters.conflicts, "{now:?}");
    assert_eq!(now.plans, counters.plans, "{now:?}");
    assert_eq!((&narrow, &wide_again), (&wide, &wide));
    let stats = a.stats();
    assert_eq!((stats.num_device_alloc, stats.num_device_free), calls);
    // The most live at once: blocks 20 and 21 of the wide step, 4 MiB + 80 KiB and 2 MiB + 84 KiB;
    // reserved is that in 2 MiB pages, four.
    assert_eq!(
        stats.allocated_bytes[ALL].peak,
        (6 * MIB + 41 * 4096) as i64
    );
    assert_eq!(stats.reserved_bytes[ALL].peak, 8 * MIB as i64);
    free_all_and_empty(&mut a, []);
}

#[test]
fn a_plan_that_replaces_its_steps_plan_maps_its_pages_at_once() {
    let mut a = planned_after_chain_steps();
    // Another shape doubles blocks 10 to 13 (a tenth of the step: the plan stays): the policy
    // serves them, and the plan made again at the next step's quiet position places them doubled.
    let wide = |i: usize| {
        if (10..14).contains(&i) {
            4 * MIB + i * 4096
        } else {
            chain_size(i)
        }
    };
    chain_of(&mut a, wide, |_| {});
    let (plans, maps) = (
        a.planner_counters().unwrap().plans,
        a.stats().num_device_alloc,
    );
    chain_step(&mut a);
    // The new plan's pages are mapped when it is put in force, in one call: the wide step's floor,
    // blocks 12 and 13 (8 MiB + 100 KiB), in 2 MiB pages, five. Its first pass, the wide step that
    // follows, then maps nothing (mapping its pages as its blocks came took a call there too).
    let stats = a.stats();
    assert_eq!(a.planner_counters().unwrap().plans, plans + 1);
    assert_eq!(stats.num_device_alloc, maps + 1);
    assert_eq!(stats.reserved_bytes[ALL].current, 10 * MIB as i64);
    let calls = (stats.num_device_alloc, stats.num_device_free);
    chain_of(&mut a, wide, |_| {});
    chain_step(&mut a);
    let stats = a.stats();
    assert_eq!((stats.num_device_alloc, stats.num_device_free), calls);
    assert_eq!(stats.reserved_bytes[ALL].peak, 10 * MIB as i64);
    free_all_and_empty(&mut a, []);
}

/// A step of the chain after 40 MiB mapped once, on a device whose reservations start `offset`
/// bytes past the 2 MiB grid (a host reservation need not be aligned to the page size).
fn pages_past_the_plan_go_back(offset: usize) {
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30).elsewhere(offset));
    let config = settings::parse_settings("planned_placement:True", &CachingConfig::default())
        .expect("the setting parses");
    let mut a = CachingAllocator::new(backend, 0, config).unwrap();
    // 40 MiB once, before the loop: the policy maps them and keeps them (under its line) as one
    // free block, in which the first steps' chain is placed; the plan lies at its bottom, and the
    // free block runs on past the plan's end.
    let big = a.malloc(40 * MIB, 0).unwrap();
    a.free(big).unwrap();
    for _ in 0..5 {
        chain_step(&mut a);
    }
    assert!(a.planner_counters().unwrap().plans >= 1);
    a.reset_peak_stats();
    chain_step(&mut a);
    let stats = a.stats();
    // Only the plan's pages stay: its blocks lie from the segment's start to its height (where
    // the first steps' blocks were, pinned there), in 2 MiB pages; the 40 MiB went back.
    let height = a.planner_counters().unwrap().height as usize;
    assert!(height < 8 * MIB, "{height}");
    assert_eq!(
        stats.reserved_bytes[ALL].peak,
        height.next_multiple_of(2 * MIB) as i64
    );
    a.check_invariants().unwrap();
    // And every page can go back: none is left shared by two free blocks.
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn pages_the_policy_mapped_past_the_plan_are_given_back() {
    pages_past_the_plan_go_back(0);
}

#[test]
fn pages_past_the_plan_go_back_from_a_reservation_off_the_page_grid() {
    pages_past_the_plan_go_back((1 << 20) + 4096);
}

#[test]
fn before_any_plan_the_policy_keeps_to_the_line_plans_are_held_to() {
    let mut a = planned();
    // 100 MiB and no step yet: the line is the most allocated + 2% (PLAN_SLACK), 102 MiB, so one
    // 2 MiB page is mapped ahead. expandable_trim's own line (+5%) maps two.
    let p = a.malloc(100 * MIB, 0).unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 102 * MIB as i64);
    let trim_config = settings::parse_settings(
        "expandable_segments:True,expandable_trim:True",
        &CachingConfig::default(),
    )
    .unwrap();
    let mut trim =
        CachingAllocator::new(Arc::new(SimulatedBackend::new(1, 1 << 30)), 0, trim_config).unwrap();
    let t = trim.malloc(100 * MIB, 0).unwrap();
    assert_eq!(trim.stats().reserved_bytes[ALL].current, 104 * MIB as i64);
    trim.free(t).unwrap();
    // The page ahead serves 2 MiB; then 104 MiB cannot follow p's free 100 (q is in the way), and
    // 102 + 104 passes the line (106 + 2%): p's pages go first, and only the 104 are mapped.
    let q = a.malloc(2 * MIB, 0).unwrap();
    assert_eq!(q, p + 100 * MIB);
    a.free(p).unwrap();
    let r = a.malloc(104 * MIB, 0).unwrap();
    let stats = a.stats();
    assert_eq!(stats.reserved_bytes[ALL].current, 106 * MIB as i64);
    assert_eq!(stats.reserved_bytes[ALL].peak, 106 * MIB as i64);
    assert_eq!(stats.allocated_bytes[ALL].current, 106 * MIB as i64);
    a.free(q).unwrap();
    a.free(r).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn a_plan_in_force_keeps_to_its_line_when_a_request_leaves_it() {
    let mut a = planned_after_chain_steps();
    let counters = a.planner_counters().unwrap();
    assert!(counters.in_force, "{counters:?}");
    // Between steps the plan's three pages stay mapped, all free, for its next pass.
    assert_eq!(a.stats().reserved_bytes[ALL].current, 6 * MIB as i64);
    let floor = 4 * MIB + 77 * 4096;
    assert_eq!(a.stats().allocated_bytes[ALL].peak, floor as i64);
    // A request off the plan (a small block, a 64th of the step's: the small pool's first page).
    // The line is the most ever allocated + 2%, 4.39 MiB; 6 MiB + the new page would pass it by
    // 3.6 MiB, so the plan's free pages go back first, in one call: only the new page stays.
    let unmaps = a.stats().num_device_free;
    let small = a.malloc(32 * 1024, 0).unwrap();
    let stats = a.stats();
    assert_eq!(stats.reserved_bytes[ALL].current, 2 * MIB as i64);
    assert_eq!(stats.num_device_free, unmaps + 1);
    a.free(small).unwrap();
    // The next step: the plan maps its pages again, each where its blocks come; before its third
    // page, the small pool's free page goes back. Reserved never passes 6 MiB (8 MiB without the
    // line: the plan's pages and the small page).
    let advised = a.planner_counters().unwrap().advised;
    let mut most = 0;
    chain_step_watched(&mut a, |a| {
        most = most.max(a.stats().reserved_bytes[ALL].current)
    });
    assert_eq!(most, 6 * MIB as i64);
    // And the plan served the whole step.
    assert_eq!(a.planner_counters().unwrap().advised - advised, 40);
    a.check_invariants().unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

/// Four 1 MiB blocks in the small pool's segment (two 2 MiB pages), the middle two freed: a free
/// range of 2 MiB that holds no whole page, which no trim can give back. Returns the allocator and
/// the two blocks still held.
fn small_pool_with_a_free_range_across_pages(config: &str) -> (CachingAllocator, [usize; 2]) {
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
    let config = settings::parse_settings(config, &CachingConfig::default()).unwrap();
    let mut a = CachingAllocator::new(backend, 0, config).unwrap();
    let blocks: Vec<usize> = (0..4).map(|_| a.malloc(MIB, 0).unwrap()).collect();
    a.free(blocks[1]).unwrap();
    a.free(blocks[2]).unwrap();
    let stats = a.stats();
    assert_eq!(
        stats.reserved_bytes[StatType::SmallPool as usize].current,
        4 * MIB as i64
    );
    assert_eq!(stats.allocated_bytes[ALL].peak, 4 * MIB as i64);
    (a, [blocks[0], blocks[3]])
}

#[test]
fn a_large_request_at_the_line_takes_a_free_range_of_the_small_pool() {
    // The line is the most ever allocated (4 MiB, more than 2 MiB held + the request) + 2%:
    // 4.08 MiB. A request of 1.5 MiB would map a large-pool page, 6 MiB in all; no free page can
    // be given back (the free range covers halves of two pages). So it takes the small pool's
    // free range, mapped already: no device call, 4 MiB reserved.
    let (mut a, held) = small_pool_with_a_free_range_across_pages("planned_placement:True");
    let maps = a.stats().num_device_alloc;
    let large = a.malloc(3 * MIB / 2, 0).unwrap();
    let stats = a.stats();
    assert_eq!(large, held[0] + MIB, "where blocks 1 and 2 were");
    assert_eq!(stats.reserved_bytes[ALL].current, 4 * MIB as i64);
    assert_eq!(stats.num_device_alloc, maps);
    // It counts in the small pool, where it lies; the large pool holds nothing.
    let small = StatType::SmallPool as usize;
    assert_eq!(
        stats.allocated_bytes[small].current,
        (2 * MIB + 3 * MIB / 2) as i64
    );
    assert_eq!(
        stats.reserved_bytes[StatType::LargePool as usize].current,
        0
    );
    a.check_invariants().unwrap();
    // The rest of the range (0.5 MiB) stays a free block of the small pool, for small requests.
    let rest = a.malloc(MIB / 2, 0).unwrap();
    assert_eq!(rest, large + 3 * MIB / 2);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 4 * MIB as i64);
    free_all_and_empty(&mut a, [rest, large].into_iter().chain(held));
}

#[test]
fn the_trim_line_alone_keeps_the_pools_apart() {
    // expandable_trim without planned_placement keeps PyTorch's pools: the same request maps a
    // large-pool page past the line (no free page to give back).
    let config = "expandable_segments:True,expandable_trim:True";
    let (mut a, _) = small_pool_with_a_free_range_across_pages(config);
    a.malloc(3 * MIB / 2, 0).unwrap();
    let stats = a.stats();
    assert_eq!(stats.reserved_bytes[ALL].current, 6 * MIB as i64);
    assert_eq!(
        stats.reserved_bytes[StatType::LargePool as usize].current,
        2 * MIB as i64
    );
}

#[test]
fn a_free_page_goes_back_before_a_large_request_takes_the_small_pool() {
    // Six 1 MiB blocks (three pages), the middle three freed: their range holds a whole page,
    // which the trim gives back first (6 MiB + a new page would pass the line, 6.12 MiB); then the
    // new page comes within the line and the large pool grows: 4 MiB small, 2 MiB large, as the
    // trim line alone would do.
    let mut a = planned();
    let blocks: Vec<usize> = (0..6).map(|_| a.malloc(MIB, 0).unwrap()).collect();
    for &ptr in &blocks[1..4] {
        a.free(ptr).unwrap();
    }
    let unmaps = a.stats().num_device_free;
    a.malloc(3 * MIB / 2, 0).unwrap();
    let stats = a.stats();
    assert_eq!(stats.num_device_free, unmaps + 1);
    assert_eq!(
        stats.reserved_bytes[StatType::SmallPool as usize].current,
        4 * MIB as i64
    );
    assert_eq!(
        stats.reserved_bytes[StatType::LargePool as usize].current,
        2 * MIB as i64
    );
    a.check_invariants().unwrap();
}

#[test]
fn requests_off_the_plan_are_served_by_the_policy_and_the_plan_is_dropped() {
    let mut a = planned_after_chain_steps();
    assert!(a.planner_counters().unwrap().plans >= 1);
    // Another program: sizes the plan never saw, held in a different pattern.
    let mut held = Vec::new();
    for i in 0..200 {
        held.push(a.malloc(MIB / 2 + i * 512, 0).unwrap());
        if i % 3 == 0 {
            a.free(held.remove(0)).unwrap();
        }
    }
    a.check_invariants().unwrap();
    let counters = a.planner_counters().unwrap();
    assert!(counters.dropped >= 1, "{counters:?}");
    free_all_and_empty(&mut a, held);
}

#[test]
fn the_address_index_finds_the_free_block_at_or_below_an_address() {
    let mut pool = block::BlockPool::default();
    pool.insert_key((0, 4096, 0x1000), 1);
    pool.insert_key((0, 512, 0x9000), 2);
    assert_eq!(pool.free_at_or_below(0, 0x2000), None, "not indexed yet");
    pool.index_addresses();
    pool.insert_key((1, 512, 0x3000), 3);
    assert_eq!(pool.free_at_or_below(0, 0x2000), Some(1));
    assert_eq!(pool.free_at_or_below(0, 0x9000), Some(2));
    assert_eq!(pool.free_at_or_below(0, 0x800), None);
    assert_eq!(pool.free_at_or_below(1, 0x9000), Some(3), "by stream");
    assert_eq!(pool.take_lower_bound(0, 4096, |_| true), Some(1));
    assert_eq!(pool.free_at_or_below(0, 0x2000), None);
    pool.remove_key(&(0, 512, 0x9000));
    assert_eq!(pool.free_at_or_below(0, 0xa000), None);
    assert!(pool.address_index_agrees());
}

/// A step of `sizes` (each freed `lives` allocations later), with the program's deviations: an
/// extra block now and then, held a while, and requests skipped.
/// Free the blocks of `list` ((address, free at allocation count)) that are due by `count`,
/// recounting the invariants after each free.
fn free_due(a: &mut CachingAllocator, list: &mut Vec<(usize, usize)>, count: usize) {
    let (due, keep): (Vec<_>, Vec<_>) = list.iter().partition(|(_, at)| *at <= count);
    for (ptr, _) in due {
        a.free(ptr).unwrap();
        a.check_invariants().unwrap();
    }
    *list = keep;
}

/// Free every block still held, empty the cache: nothing allocated, active or reserved is left.
fn free_all_and_empty(a: &mut CachingAllocator, held: impl IntoIterator<Item = usize>) {
    for ptr in held {
        a.free(ptr).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    let stats = a.stats();
    assert_eq!(stats.allocated_bytes[ALL].current, 0);
    assert_eq!(stats.active[ALL].current, 0);
    assert_eq!(stats.reserved_bytes[ALL].current, 0);
}

fn run_with_deviations(
    steps: usize,
    sizes: &[usize],
    lives: &[usize],
    deviations: &[(usize, usize)],
) {
    let mut a = planned();
    let mut live: Vec<(usize, usize)> = Vec::new(); // (address, free at allocation count)
    let mut count = 0usize;
    let mut extra: Vec<(usize, usize)> = Vec::new();
    for step in 0..steps {
        for (i, (&size, &life)) in sizes.iter().zip(lives).enumerate() {
            let deviation = deviations[(step * sizes.len() + i) % deviations.len()];
            match deviation.0 % 8 {
                0 => continue,
                1 => extra.push((a.malloc(deviation.1, 0).unwrap(), count + 7)),
                _ => {}
            }
            count += 1;
            live.push((a.malloc(size, 0).unwrap(), count + life));
            free_due(&mut a, &mut live, count);
            free_due(&mut a, &mut extra, count);
        }
    }
    free_all_and_empty(&mut a, live.into_iter().chain(extra).map(|(ptr, _)| ptr));
}

/// `steps` steps of `sizes` (block i freed `lives[i]` allocations after it is made), and after the
/// fourth (a plan in force by then) bursts off the plan: (position in the step, blocks, size,
/// life): that many blocks of about `size` (under 1 MiB: the small pool, beside a plan in the
/// large one) made at once and held for `life` allocations. The invariants are recounted after
/// every request, and the books come back to zero.
fn run_with_bursts(
    steps: usize,
    sizes: &[usize],
    lives: &[usize],
    bursts: &[(usize, usize, usize, usize)],
) {
    let mut a = planned();
    let mut live: Vec<(usize, usize)> = Vec::new(); // (address, free at allocation count)
    let mut count = 0usize;
    for step in 0..steps {
        for (i, (&size, &life)) in sizes.iter().zip(lives).enumerate() {
            for &(at, blocks, burst_size, burst_life) in bursts {
                if step >= 4 && at % sizes.len() == i {
                    for b in 0..blocks {
                        let ptr = a.malloc(burst_size + b * 512, 0).unwrap();
                        a.check_invariants().unwrap();
                        live.push((ptr, count + burst_life));
                    }
                }
            }
            count += 1;
            live.push((a.malloc(size, 0).unwrap(), count + life));
            a.check_invariants().unwrap();
            free_due(&mut a, &mut live, count);
        }
    }
    free_all_and_empty(&mut a, live.into_iter().map(|(ptr, _)| ptr));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Requests off a plan in force (a step of another shape) make the line give back free pages,
    /// the plan's among them, and the plan map them again: nothing is handed out twice and the
    /// books balance whatever the bursts.
    #[test]
    fn bursts_off_the_plan_keep_the_books(
        sizes in proptest::collection::vec(1usize..(6 * MIB), 36..60),
        lives in proptest::collection::vec(1usize..40, 60),
        bursts in proptest::collection::vec((0usize..60, 1usize..12, 512usize..MIB, 1usize..80), 1..6),
    ) {
        let lives = &lives[..sizes.len()];
        run_with_bursts(10, &sizes, lives, &bursts);
    }

    /// Whatever the program does around its step, planned serving never hands out a byte twice
    /// (the invariants check that live blocks never overlap, after every request) and the books
    /// come back to zero.
    #[test]
    fn planned_serving_keeps_the_books_whatever_the_program_does(
        sizes in proptest::collection::vec(1usize..(6 * MIB), 36..60),
        lives in proptest::collection::vec(1usize..40, 60),
        deviations in proptest::collection::vec((0usize..64, 1usize..(4 * MIB)), 1..50),
    ) {
        let lives = &lives[..sizes.len()];
        run_with_deviations(8, &sizes, lives, &deviations);
    }
}

/// A device that refuses maps, unmaps or reservations now and then, under a program whose step is
/// planned: a request either gets a block or an error, never a block the caller does not hold, and
/// the books balance after every request. (The capi fuzz target's hostile backend once had a
/// request served and then reported failed, because making a plan after it failed; making a plan
/// no longer fails a request.)
#[test]
fn a_failing_device_never_loses_a_planned_block() {
    for call in ["vm_map", "vm_unmap", "vm_reserve"] {
        for after in [0, 5, 10, 15, 20, 25, 40] {
            let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
            let config =
                settings::parse_settings("planned_placement:True", &CachingConfig::default())
                    .unwrap();
            let mut a = CachingAllocator::new(backend.clone(), 0, config).unwrap();
            backend.fail_calls_after(call, after, if call == "vm_unmap" { 1000 } else { 4 });
            let mut held: Vec<usize> = Vec::new();
            // chain_step's requests, each of which the device may fail.
            for step in 0..8 {
                for i in 0..40 {
                    if let Ok(ptr) = a.malloc(2 * MIB + i * 4096, 0) {
                        held.push(ptr);
                    }
                    if held.len() > 1 {
                        let _ = a.free(held.remove(0));
                    }
                    a.check_invariants().unwrap();
                    assert_eq!(
                        a.stats().allocation[ALL].current,
                        held.len() as i64,
                        "{call} after {after}, step {step}: a block the caller does not hold"
                    );
                }
                for ptr in held.drain(..) {
                    a.free(ptr).unwrap();
                }
            }
            for ptr in held {
                a.free(ptr).unwrap();
            }
            while a.empty_cache().is_err() {}
            let stats = a.stats();
            assert_eq!(stats.allocated_bytes[ALL].current, 0);
            assert_eq!(stats.reserved_bytes[ALL].current, 0);
        }
    }
}

/// A planned program with requests off the plan now and then, from a seed: a step of `len` blocks
/// of 0.5 to 3 MiB (both pools), each freed a few allocations on, and after the fourth step, at
/// random, extra blocks of up to 8 MiB held for up to 30 allocations. The invariants are
/// recounted after every request. With `failing_unmaps`, the device refuses every unmap after
/// its first `failing_unmaps` (a refused request is skipped: its block is not held).
fn run_seeded(seed: u64, failing_unmaps: Option<usize>) {
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
    if let Some(after) = failing_unmaps {
        backend.fail_calls_after("vm_unmap", after, 1_000_000);
    }
    let config = settings::parse_settings("planned_placement:True", &CachingConfig::default())
        .expect("the setting parses");
    let mut a = CachingAllocator::new(backend.clone(), 0, config).unwrap();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n) as usize
    };
    let steps = 10 + next(10);
    let len = 10 + next(40);
    let sizes: Vec<usize> = (0..len)
        .map(|_| (1 + next(6)) * MIB / 2 + next(64) * 4096)
        .collect();
    let lives: Vec<usize> = (0..len).map(|_| 1 + next(6)).collect();
    // (address, free at allocation count): the step's blocks, and those off the plan.
    let mut live: Vec<(usize, usize)> = Vec::new();
    let mut extra: Vec<(usize, usize)> = Vec::new();
    let mut count = 0;
    for step in 0..steps {
        for i in 0..len {
            if step >= 4 && next(12) == 0 {
                let (size, life) = (1 + next(8 * MIB as u64), next(30));
                if let Ok(ptr) = a.malloc(size, 0) {
                    extra.push((ptr, count + life));
                }
                a.check_invariants().unwrap();
            }
            count += 1;
            if let Ok(ptr) = a.malloc(sizes[i], 0) {
                live.push((ptr, count + lives[i]));
            }
            a.check_invariants().unwrap();
            free_due(&mut a, &mut live, count);
            free_due(&mut a, &mut extra, count);
        }
    }
    // The device unmaps again: every page goes back.
    backend.fail_calls_after("vm_unmap", 0, 0);
    free_all_and_empty(&mut a, live.into_iter().chain(extra).map(|(ptr, _)| ptr));
}

/// A pass's end cuts a free block that runs past the plan and unmaps the part above; where that
/// part held no whole page, it stayed mapped, a free block beside the one below, never merged
/// (seed 90 here; found in review). Only a part with a page is cut now.
#[test]
fn requests_off_the_plan_leave_no_free_blocks_side_by_side() {
    for seed in 1..200 {
        run_seeded(seed, None);
    }
}

/// The same where the device stops unmapping part way (a cut made to unmap the part above the plan
/// is undone when the unmap is refused): the books stay exact, and once the device unmaps again
/// everything goes back.
#[test]
fn a_device_that_refuses_unmaps_leaves_the_planned_books_exact() {
    for seed in 1..60 {
        for after in [0, 3, 10] {
            run_seeded(seed, Some(after));
        }
    }
}

// Parking (allocator/parking.rs): a block handed out at its planned address parks when freed, and
// the plan's next request at that address takes it; nothing outside sees the difference.

/// No two free blocks side by side in any segment of the snapshot: parked blocks show merged.
fn assert_snapshot_merged(a: &CachingAllocator) {
    for segment in a.segments() {
        for pair in segment.blocks.windows(2) {
            assert!(
                !(pair[0].state == BlockState::Inactive && pair[1].state == BlockState::Inactive),
                "free blocks side by side in the snapshot: {segment:?}"
            );
        }
        let free: usize = segment
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .sum();
        let used: usize = segment
            .blocks
            .iter()
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| b.size)
            .sum();
        assert_eq!(free + used, segment.total_size);
    }
}

#[test]
fn a_freed_planned_block_parks_and_the_next_step_takes_it_where_it_lies() {
    let mut a = planned_after_chain_steps();
    let first = chain_step(&mut a);
    // The step's blocks are free, parked where the plan put them (in the large pool: 2 MiB and
    // more), and the snapshot shows the free memory as merging would have left it.
    assert!(a.parked_blocks() > 0);
    assert_eq!(a.stats().allocated_bytes[ALL].current, 0);
    assert_snapshot_merged(&a);
    let slab = a.blocks_in_slab();
    // Step after step, the same addresses, and no block made or lost on the way.
    for _ in 0..3 {
        let mut parked_during = 0;
        let addresses = chain_step_watched(&mut a, |a| {
            parked_during = parked_during.max(a.parked_blocks());
            assert_snapshot_merged(a);
        });
        assert_eq!(addresses, first);
        assert!(parked_during > 0);
        assert_eq!(a.blocks_in_slab(), slab);
    }
    let stats = a.stats();
    assert_eq!(stats.reserved_bytes[ALL].current, 6 * MIB as i64);
    assert_eq!(stats.active_bytes[ALL].current, 0);
    assert_eq!(stats.requested_bytes[ALL].current, 0);
    assert_eq!(stats.inactive_split[ALL].current, 0);
}

#[test]
fn parked_blocks_are_free_memory_to_the_policy_and_to_empty_cache() {
    let mut a = planned_after_chain_steps();
    chain_step(&mut a);
    assert!(a.parked_blocks() > 0);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 6 * MIB as i64);
    // A request off the plan (no step asks for 5 MiB) fits the 6 MiB mapped, all of it free: the
    // policy finds it there, parked blocks and all, and maps nothing.
    let off_plan = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(a.parked_blocks(), 0);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 6 * MIB as i64);
    a.free(off_plan).unwrap();
    // Parked again by the next step, then given back by empty_cache.
    chain_step(&mut a);
    assert!(a.parked_blocks() > 0);
    a.empty_cache().unwrap();
    assert_eq!(a.parked_blocks(), 0);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn a_planned_block_used_by_another_stream_does_not_park() {
    let mut a = planned_after_chain_steps();
    let mut first = None;
    let mut addresses = Vec::new();
    for i in 0..40 {
        let ptr = a.malloc(2 * MIB + i * 4096, 0).unwrap();
        addresses.push(ptr);
        if i == 0 {
            // Block 0 waits on stream 1's event when freed: it returns once the event completes,
            // merged as any block, and never parks.
            a.record_stream(ptr, 1).unwrap();
            first = Some(ptr);
        }
        if i > 0 {
            a.free(addresses[i - 1]).unwrap();
        }
    }
    a.free(addresses[39]).unwrap();
    assert_eq!(a.stats().allocated_bytes[ALL].current, 0);
    assert!(first.is_some());
    // empty_cache waits for the event, returns block 0 and gives every free page back.
    a.empty_cache().unwrap();
    assert_eq!(a.stats().active_bytes[ALL].current, 0);
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn a_parked_block_freed_again_is_refused_and_the_books_stay_exact() {
    let mut a = planned_after_chain_steps();
    let mut addresses = Vec::new();
    for i in 0..40 {
        addresses.push(a.malloc(2 * MIB + i * 4096, 0).unwrap());
        if i > 0 {
            a.free(addresses[i - 1]).unwrap();
            assert!(a.parked_blocks() > 0);
            // The block just parked, freed again, and an address inside it: both refused.
            let again = a.free(addresses[i - 1]).unwrap_err();
            assert_eq!(
                again.kind,
                crate::error::ErrorKind::InvalidPointer,
                "{again}"
            );
            assert!(a.free(addresses[i - 1] + 4096).is_err());
            a.check_invariants().unwrap();
        }
    }
    a.free(addresses[39]).unwrap();
    assert_eq!(a.stats().allocated_bytes[ALL].current, 0);
    assert_eq!(a.stats().active[ALL].current, 0);
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

/// A chain step whose last two blocks make 6 MiB exactly: the plan ends on a page boundary.
fn aligned_step(a: &mut CachingAllocator) {
    let mut previous = None;
    for i in 0..40 {
        let size = if i == 39 {
            4 * MIB - 38 * 4096
        } else {
            2 * MIB + i * 4096
        };
        let ptr = a.malloc(size, 0).unwrap();
        if let Some(p) = previous.replace(ptr) {
            a.free(p).unwrap();
        }
    }
    a.free(previous.unwrap()).unwrap();
}

/// A planned allocator after eight aligned steps: a plan in force, the last step's blocks parked.
fn planned_after_aligned_steps() -> CachingAllocator {
    let mut a = planned();
    for _ in 0..8 {
        aligned_step(&mut a);
    }
    assert!(a.parked_blocks() > 0);
    a
}

#[test]
fn a_request_during_a_capture_finds_the_parked_memory_free() {
    let mut a = planned_after_aligned_steps();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 6 * MIB as i64);
    // Stream 1 is captured; stream 0's requests still go to the default pools, by the policy,
    // which finds the step's free memory there, parked or not, and maps nothing.
    a.begin_allocate_to_pool((1, 1), crate::caching::pools::Route::Stream(1))
        .unwrap();
    let p = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 6 * MIB as i64);
    a.free(p).unwrap();
    a.end_allocate_to_pool((1, 1)).unwrap();
    aligned_step(&mut a);
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 0);
}

#[test]
fn turning_the_plan_off_leaves_no_block_parked() {
    let mut a = planned_after_aligned_steps();
    let config = settings::parse_settings(
        "expandable_segments:True,expandable_trim:True",
        &CachingConfig::default(),
    )
    .unwrap();
    a.set_config(config);
    assert_eq!(a.parked_blocks(), 0);
    let p = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(a.stats().reserved_bytes[ALL].current, 6 * MIB as i64);
    a.free(p).unwrap();
}

/// How `seeded_program` runs its program.
#[derive(Clone, Copy)]
struct ProgramRun {
    /// Blocks freed at their planned address park (the default) or go back to the pools.
    parking: bool,
    /// Every plan placed off the request path, on a thread (Some(false)) or on the calling thread
    /// (Some(true)), and put in force one step later; None: as the allocator decides.
    off_path: Option<bool>,
    /// Requests go through `malloc` (which tries `malloc_parked` first, the default) or straight
    /// to `malloc_begin`.
    parked_first: bool,
}

impl Default for ProgramRun {
    fn default() -> Self {
        ProgramRun {
            parking: true,
            off_path: None,
            parked_first: true,
        }
    }
}

/// A request through `malloc`, or through `malloc_begin` and `malloc_finish` only.
fn malloc_by(
    a: &mut CachingAllocator,
    backend: &SimulatedBackend,
    size: usize,
    stream: crate::backend::StreamId,
    parked_first: bool,
) -> crate::Result<usize> {
    use crate::backend::Backend;
    if parked_first {
        return a.malloc(size, stream);
    }
    match a.malloc_begin(size, stream)? {
        MallocStep::Done(ptr) => Ok(ptr),
        MallocStep::NeedSegment(mut request) => loop {
            let raw = backend.raw_alloc(0, request.size, request.stream);
            match a.malloc_finish(request, raw)? {
                MallocStep::Done(ptr) => return Ok(ptr),
                MallocStep::NeedSegment(next) => request = next,
            }
        },
    }
}

/// One seeded program on a planned allocator: a step of random sizes and
/// lifetimes repeated, with, now and then past the first steps, empty_cache, a capture of stream 1
/// begun or ended (`mode` 1 and 3), the plan turned off or on (`mode` 2 and 3), a stream use, an
/// event completed, or a request off the plan (`mode` 4 and 5: sizes in whole pages, so that plans
/// end on a page). What every operation returned, the statistics and the snapshot, after each,
/// run as `run` says.
fn seeded_program(seed: u64, mode: u32, run: ProgramRun) -> Vec<String> {
    seeded_program_counted(seed, mode, run).0
}

/// `seeded_program`, and how many requests `malloc_parked` served.
fn seeded_program_counted(seed: u64, mode: u32, run: ProgramRun) -> (Vec<String>, usize) {
    let ProgramRun {
        parking,
        off_path,
        parked_first,
    } = run;
    use crate::caching::pools::Route;
    let backend = Arc::new(SimulatedBackend::new(1, 1 << 30));
    let settings_of = |planned: bool| {
        let text = if planned {
            "planned_placement:True"
        } else {
            "expandable_segments:True,expandable_trim:True"
        };
        settings::parse_settings(text, &CachingConfig::default()).unwrap()
    };
    let mut a = CachingAllocator::new(backend.clone(), 0, settings_of(true)).unwrap();
    if !parking {
        a.turn_parking_off();
    }
    if let Some(inline) = off_path {
        a.place_plans_off_path(1, inline);
    }
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let length = 5 + next(30);
    let pages = mode >= 4;
    let sizes: Vec<usize> = (0..length)
        .map(|_| match pages {
            true => (1 + next(3)) * 2 * MIB,
            false => (1 + next(6)) * MIB / 2 + next(64) * 4096,
        })
        .collect();
    let lifetimes: Vec<usize> = (0..length).map(|_| 1 + next(6)).collect();
    let (mut log, mut live) = (Vec::new(), Vec::new());
    let (mut count, mut capturing, mut planned_on) = (0, false, true);
    for step in 0..12 + next(8) {
        for i in 0..length {
            if step >= 5 && next(10) == 0 {
                match (mode, next(12)) {
                    (_, 0) => log.push(format!("empty_cache {:?}", a.empty_cache())),
                    (1 | 3, 1) if !capturing => {
                        a.begin_allocate_to_pool((1, 1), Route::Stream(1)).unwrap();
                        capturing = true;
                    }
                    (1 | 3, 2) if capturing => {
                        a.end_allocate_to_pool((1, 1)).unwrap();
                        capturing = false;
                    }
                    (2 | 3, 3) => {
                        planned_on = !planned_on;
                        a.set_config(settings_of(planned_on));
                        if !parking {
                            a.turn_parking_off();
                        }
                    }
                    (_, 4) if !live.is_empty() => {
                        let (ptr, _) = live[next(live.len())];
                        log.push(format!("record_stream {:?}", a.record_stream(ptr, 2)));
                    }
                    (_, 5) => backend.complete_stream(2),
                    (_, 6..=9) => {
                        let size = match mode {
                            5 => (1 + next(4)) * 2 * MIB + 4096 * next(2),
                            _ => 1 + next(8 * MIB),
                        };
                        let stream = if next(3) == 0 { 1 } else { 0 };
                        let served = malloc_by(&mut a, &backend, size, stream, parked_first);
                        log.push(format!("off the plan {size} on {stream}: {served:x?}"));
                        if let Ok(ptr) = served {
                            live.push((ptr, count + next(30)));
                        }
                    }
                    _ => {}
                }
            }
            count += 1;
            let served = malloc_by(&mut a, &backend, sizes[i], 0, parked_first);
            log.push(format!("{}: {served:x?}", sizes[i]));
            if let Ok(ptr) = served {
                live.push((ptr, count + lifetimes[i]));
            }
            let (due, kept): (Vec<_>, Vec<_>) = live.iter().partition(|&&(_, end)| end <= count);
            for (ptr, _) in due {
                log.push(format!("free {ptr:#x}: {:?}", a.free(ptr)));
            }
            live = kept;
            log.push(format!("{:?}", a.stats()));
            log.push(format!("{:?}", a.segments()));
        }
    }
    if capturing {
        a.end_allocate_to_pool((1, 1)).unwrap();
    }
    backend.complete_stream(2);
    for (ptr, _) in live {
        a.free(ptr).unwrap();
    }
    a.empty_cache().unwrap();
    log.push(format!("{:?}", a.stats()));
    // What the planner did (from_parked aside: parking's own count).
    let counters = a.planner_counters();
    log.push(format!(
        "planner {:?}",
        counters.map(|c| (
            c.plans,
            c.attempts,
            c.dropped,
            c.advised,
            c.conflicts,
            c.height
        ))
    ));
    log.push(format!(
        "placed off the path and used {}",
        a.plans_placed_off_path_used()
    ));
    (log, a.served_parked_first())
}

/// Two runs' logs, line by line: the first line that differs is named.
fn assert_same_log(first: &[String], second: &[String], what: &str) {
    if let Some((i, (a, b))) = first
        .iter()
        .zip(second)
        .enumerate()
        .find(|(_, (a, b))| a != b)
    {
        panic!("{what}, line {i}:\n{a}\n{b}");
    }
    assert_eq!(first.len(), second.len(), "{what}");
}

#[test]
fn parking_changes_no_figure() {
    // Addresses, statistics and snapshots after every operation, with parking and without, over
    // programs that leave the plan, capture, turn the plan off and on and use other streams.
    for mode in 0..6 {
        for seed in 1..=25 {
            assert_same_log(
                &seeded_program(seed, mode, ProgramRun::default()),
                &seeded_program(
                    seed,
                    mode,
                    ProgramRun {
                        parking: false,
                        ..ProgramRun::default()
                    },
                ),
                &format!("seed {seed}, mode {mode}: parked / not parked"),
            );
        }
    }
}

#[test]
fn the_parked_block_first_changes_no_figure() {
    // `malloc` serves the request the plan expects from the block parked at its address before
    // `malloc_begin` is asked: every address, statistic and snapshot as `malloc_begin`'s alone.
    let mut served = 0;
    for mode in 0..6 {
        for seed in 1..=25 {
            let (first, count) = seeded_program_counted(seed, mode, ProgramRun::default());
            let begin_only = ProgramRun {
                parked_first: false,
                ..ProgramRun::default()
            };
            let (begun, none) = seeded_program_counted(seed, mode, begin_only);
            assert_same_log(
                &first,
                &begun,
                &format!("seed {seed}, mode {mode}: parked first / malloc_begin"),
            );
            assert_eq!(none, 0);
            served += count;
        }
    }
    assert!(served > 1000, "{served} requests served parked first");
}

/// A step of forty blocks (2 MiB + i x 4 KiB), all live together, then all freed.
fn all_live_step(a: &mut CachingAllocator) -> Vec<usize> {
    let held: Vec<usize> = (0..40)
        .map(|i| a.malloc(2 * MIB + i * 4096, 0).unwrap())
        .collect();
    for &ptr in &held {
        a.free(ptr).unwrap();
    }
    held
}

#[test]
fn each_request_of_a_steady_step_takes_the_block_parked_at_its_address() {
    let mut a = planned();
    for _ in 0..6 {
        all_live_step(&mut a);
    }
    let before = a.planner_counters().unwrap();
    assert!(before.in_force, "{before:?}");
    let first = all_live_step(&mut a);
    // Live together, the forty blocks never share an address: each one's block waits, parked,
    // where the step before freed it, and each request of the next step takes its own whole.
    for _ in 0..3 {
        let step_before = a.planner_counters().unwrap();
        assert_eq!(all_live_step(&mut a), first);
        let after = a.planner_counters().unwrap();
        assert_eq!(after.advised - step_before.advised, 40, "{after:?}");
        assert_eq!(after.from_parked - step_before.from_parked, 40, "{after:?}");
    }
}

/// Steps of a chain with, twice, a burst of 1,100 small blocks mostly freed and an empty_cache,
/// which compacts the slab (renumbering every block: the parked blocks' hints go stale): what
/// each operation returned, the statistics and the snapshot after each, and whether the slab was
/// compacted.
fn program_with_compactions(parking: bool) -> (Vec<String>, bool) {
    let mut a = planned();
    if !parking {
        a.turn_parking_off();
    }
    let (mut log, mut compacted) = (Vec::new(), false);
    for _ in 0..2 {
        for _ in 0..6 {
            log.push(format!("{:x?}", chain_step(&mut a)));
        }
        let burst: Vec<usize> = (0..1100)
            .map(|i| a.malloc(512 + i % 7 * 512, 0).unwrap())
            .collect();
        for (i, &ptr) in burst.iter().enumerate() {
            if i % 50 != 0 {
                a.free(ptr).unwrap();
            }
        }
        // With parking the slab holds more blocks (parked ones stay apart): only whether it
        // shrank is noted, not its size.
        let metadata = a.metadata_bytes();
        a.empty_cache().unwrap();
        compacted |= a.metadata_bytes() < metadata;
        for ptr in burst.into_iter().step_by(50) {
            a.free(ptr).unwrap();
        }
        log.push(format!("{:?}", a.stats()));
        log.push(format!("{:?}", a.segments()));
    }
    for _ in 0..3 {
        log.push(format!("{:x?}", chain_step(&mut a)));
    }
    log.push(format!("{:?}", a.stats()));
    (log, compacted)
}

#[test]
fn parking_changes_no_figure_across_slab_compactions() {
    let ((with, compacted), (without, _)) = (
        program_with_compactions(true),
        program_with_compactions(false),
    );
    assert!(compacted, "the slab was never compacted");
    for (i, (a, b)) in with.iter().zip(&without).enumerate() {
        assert_eq!(a, b, "line {i}");
    }
    assert_eq!(with.len(), without.len());
}

#[test]
fn a_plan_placed_off_the_request_path_is_put_in_force_one_step_later() {
    // The chain's plan, found at the same allocation both ways: made at once, or placed off the
    // request path and taken again when the step has come round to the same point (40 later).
    // The chain's blocks lie elsewhere from step to step in its first steps (the policy's): the
    // job changed both times, so it was placed off the path once more and then at once, two
    // steps (80 allocations) after the step was found. (`a_plan_placed_on_a_thread_is_the_one_
    // put_in_force` has a step whose job repeats.)
    let first_plan = |off_path: bool| {
        let mut a = planned();
        if off_path {
            a.place_plans_off_path(1, false);
        }
        let (mut allocation, mut tried, mut made) = (0, None, None);
        for _ in 0..8 {
            chain_step_watched(&mut a, |a| {
                allocation += 1;
                let counters = a.planner_counters().unwrap();
                if counters.attempts > 0 && tried.is_none() {
                    tried = Some(allocation);
                }
                if counters.plans > 0 && made.is_none() {
                    made = Some(allocation);
                }
            });
        }
        let counters = a.planner_counters().unwrap();
        (
            tried.expect("tried"),
            made.unwrap_or_else(|| panic!("{counters:?}")),
            a,
        )
    };
    let (tried_at_once, made_at_once, _) = first_plan(false);
    let (tried, made, mut a) = first_plan(true);
    assert_eq!(tried, tried_at_once);
    assert_eq!(made_at_once, tried_at_once);
    assert_eq!(made, tried + 80);
    assert_eq!(a.plans_placed_off_path_used(), 0);
    // In force and kept to: every request of a step at its planned address, none taken.
    let before = a.planner_counters().unwrap();
    let addresses = chain_step(&mut a);
    let after = a.planner_counters().unwrap();
    assert_eq!(after.advised - before.advised, 40, "{after:?}");
    assert_eq!(after.conflicts, before.conflicts);
    assert_eq!(chain_step(&mut a), addresses);
}

#[test]
fn planning_off_the_request_path_does_not_depend_on_the_thread() {
    // Every plan placed off the request path, on a thread of its own or on the calling thread:
    // every address, statistic and snapshot the same, whenever the thread finishes.
    let (mut made, mut used) = (0, 0);
    for mode in 0..6 {
        for seed in 1..=12 {
            let threaded = seeded_program(
                seed,
                mode,
                ProgramRun {
                    off_path: Some(false),
                    ..ProgramRun::default()
                },
            );
            assert_same_log(
                &threaded,
                &seeded_program(
                    seed,
                    mode,
                    ProgramRun {
                        off_path: Some(true),
                        ..ProgramRun::default()
                    },
                ),
                &format!("seed {seed}, mode {mode}: on a thread / here"),
            );
            made += !threaded[threaded.len() - 2].starts_with("planner Some((0,") as usize;
            used += !threaded.last().unwrap().ends_with(" 0") as usize;
        }
    }
    // Layered steps (a model's), now and then with a block off the plan that lives a step: there
    // the placements made off the path are put in force as placed.
    let layered = |seed: usize, inline: bool| {
        let mut a = planned();
        a.place_plans_off_path(1, inline);
        let mut log = Vec::new();
        let mut extra: Option<usize> = None;
        for step in 0..8 + seed % 4 {
            if seed % 2 == 1 && step % (2 + seed % 3) == 1 {
                if let Some(ptr) = extra.take() {
                    a.free(ptr).unwrap();
                }
                extra = Some(a.malloc((1 + seed % 5) * MIB + step * 4096, 0).unwrap());
            }
            layered_step(&mut a, 4 + seed % 17);
            log.push(format!("{:?}", a.stats()));
            log.push(format!("{:?}", a.segments()));
            log.push(format!("{:?}", a.planner_counters()));
        }
        (log, a.plans_placed_off_path_used())
    };
    for seed in 0..12 {
        let ((threaded, used_here), (here, _)) = (layered(seed, false), layered(seed, true));
        assert_eq!(threaded, here, "layered program {seed}");
        used += used_here;
    }
    // Not vacuous: plans were made, and placements made off the path put in force as placed.
    assert!(
        made >= 12 && used >= 6,
        "{made} made a plan, {used} used one placed off the path"
    );
}

#[test]
fn a_plan_in_making_is_let_go_when_the_mode_is_turned_off_or_the_allocator_dropped() {
    let in_making = || {
        let mut a = planned();
        a.place_plans_off_path(1, false);
        let mut held = Vec::new();
        while !a.plan_in_making() {
            chain_step(&mut a);
            held.push(a.malloc(MIB, 0).unwrap());
            assert!(held.len() < 8, "no plan was placed off the path");
        }
        (a, held)
    };
    // Turned off: the placement's thread is waited for, its plan is no one's, and the policy
    // serves on with the books exact.
    let (mut a, held) = in_making();
    a.set_config(CachingConfig {
        planned_placement: false,
        ..a.config().clone()
    });
    assert!(!a.plan_in_making());
    assert_eq!(a.planner_counters(), None);
    chain_step(&mut a);
    for ptr in held {
        a.free(ptr).unwrap();
    }
    assert_eq!(a.stats().allocated_bytes[ALL].current, 0);
    // Dropped while the thread places: it is waited for, not left running.
    let (a, _) = in_making();
    drop(a);
}

#[test]
fn a_part_cut_off_a_parked_block_gets_no_index_entry_unless_an_address_is_looked_up() {
    // A step of 40 blocks, each freed before the next is made, alternately about 2 MiB and 1 MiB
    // (less 4 KiB a block): the plan puts them all at one address, so that each request there
    // takes the block parked there and cuts it (a 1 MiB one after a 2 MiB one) or takes in the
    // part cut off before (a 2 MiB one after a 1 MiB one).
    let step = |a: &mut CachingAllocator| {
        for i in 0..40 {
            let size = if i % 2 == 0 { 2 * MIB } else { MIB } - i * 4096;
            let ptr = a.malloc(size, 0).unwrap();
            a.free(ptr).unwrap();
        }
    };
    let mut a = planned();
    for _ in 0..6 {
        step(&mut a);
    }
    let (entries, _) = a.index_entries_made();
    let before = a.planner_counters().unwrap();
    step(&mut a);
    let after = a.planner_counters().unwrap();
    // Every request of the step took the block parked at its address ...
    assert_eq!(after.from_parked - before.from_parked, 40, "{after:?}");
    // ... and the cut parts were made, with no address index entry for any of them.
    let (entries_after, unindexed) = a.index_entries_made();
    assert_eq!(entries_after, entries);
    assert!(unindexed > 0);
    // A snapshot sees the free memory as merging would have left it: one free block per range.
    assert_snapshot_merged(&a);
    // The policy looks at free memory: every parked block, cut parts included, is unparked.
    a.malloc(64 * MIB, 0).unwrap();
    assert_eq!(a.parked_blocks(), 0);
    assert_eq!(a.index_entries_made().1, 0);
}

/// A layered step, as a model's: `layers` layers each make four activations kept for the backward
/// pass (sizes that differ from layer to layer) and three temporaries freed at once; then, layer
/// by layer backwards, two temporaries and the layer's activations go. Everything it makes goes
/// within the step.
fn layered_step(a: &mut CachingAllocator, layers: usize) {
    wandering_step(a, layers, None, false);
}

#[test]
fn a_plan_placed_on_a_thread_is_the_one_put_in_force() {
    // A step that repeats with its blocks in the same places: the job taken again one step later
    // is the one placed, and the thread's placement is what is put in force: the same plan,
    // addresses and figures as one placed on the calling thread, and as one a forked child
    // places itself.
    let run = |inline: bool, forked: bool| {
        let mut a = planned();
        a.place_plans_off_path(1, inline);
        let mut pretended = false;
        for _ in 0..5 {
            layered_step(&mut a, 20);
            if forked && !pretended && a.plan_in_making() {
                a.pretend_plan_in_making_forked();
                pretended = true;
            }
        }
        assert!(pretended || !forked, "no plan was placed off the path");
        let counters = a.planner_counters().unwrap();
        assert!(counters.in_force && counters.plans == 1, "{counters:?}");
        assert_eq!(a.plans_placed_off_path_used(), (!forked) as usize);
        (counters, a.stats(), a.segments())
    };
    let here = run(true, false);
    assert_eq!(run(false, false), here);
    assert_eq!(run(false, true), here);
}

#[test]
fn a_stretch_that_did_not_come_again_is_not_planned_off_the_path() {
    // A step twice, then a stretch as long with other sizes: the plan placed off the path for
    // the step is not put in force over the stretch, nor is the stretch placed in its stead.
    let mut a = planned();
    a.place_plans_off_path(1, false);
    for _ in 0..2 {
        layered_step(&mut a, 8);
    }
    let mut steps = 0;
    while !a.plan_in_making() {
        layered_step(&mut a, 8);
        steps += 1;
        assert!(steps < 4, "no plan was placed off the path");
    }
    let before = a.planner_counters().unwrap();
    // The same shape of step, every size 8 KiB more.
    let mut kept = Vec::new();
    for layer in 0..8 {
        let held: Vec<usize> = [3 * MIB, MIB, 2 * MIB, MIB]
            .iter()
            .enumerate()
            .map(|(i, size)| a.malloc(size + (layer * 4 + i) * 4096 + 8192, 0).unwrap())
            .collect();
        for size in [2 * MIB, MIB, 4 * MIB] {
            let t = a.malloc(size + 8192, 0).unwrap();
            a.free(t).unwrap();
        }
        kept.push(held);
    }
    for held in kept.into_iter().rev() {
        for size in [MIB, 2 * MIB] {
            let t = a.malloc(size + 8192, 0).unwrap();
            a.free(t).unwrap();
        }
        for ptr in held {
            a.free(ptr).unwrap();
        }
    }
    let after = a.planner_counters().unwrap();
    assert!(!a.plan_in_making());
    assert_eq!(after.plans, before.plans, "{after:?}");
    assert_eq!(a.stats().allocated_bytes[ALL].current, 0);
}

/// `layered_step`, now and then leaving the plan: a request of a size the step never asks for
/// before allocation `extra_at` of the step (held to the step's end), and one layer's temporaries
/// `grown` by a page.
fn wandering_step(a: &mut CachingAllocator, layers: usize, extra_at: Option<usize>, grown: bool) {
    let mut count = 0;
    let mut extra = None;
    let mut malloc = |a: &mut CachingAllocator, size: usize| {
        if extra_at == Some(count) {
            extra = Some(a.malloc(5 * MIB + 4096, 0).unwrap());
        }
        count += 1;
        a.malloc(size, 0).unwrap()
    };
    let mut kept = Vec::new();
    for layer in 0..layers {
        let sizes = [3 * MIB, MIB, 2 * MIB, MIB];
        let held: Vec<usize> = sizes
            .iter()
            .enumerate()
            .map(|(i, size)| malloc(a, size + (layer * 4 + i) * 4096))
            .collect();
        for size in [2 * MIB, MIB, 4 * MIB] {
            let size = if grown && layer == 1 {
                size + 4096
            } else {
                size
            };
            let t = malloc(a, size);
            a.free(t).unwrap();
        }
        kept.push(held);
    }
    for held in kept.into_iter().rev() {
        for size in [MIB, 2 * MIB] {
            let t = malloc(a, size);
            a.free(t).unwrap();
        }
        for ptr in held {
            a.free(ptr).unwrap();
        }
    }
    if let Some(ptr) = extra {
        a.free(ptr).unwrap();
    }
}

#[test]
fn the_stretch_matcher_skipped_while_a_plan_is_kept_to_answers_as_if_asked() {
    // While the program keeps to the plan, the planner answers for the stretch matcher from the
    // plan and catches it up when the program leaves: every answer of the matcher, address,
    // statistic and snapshot as when the matcher is asked at every allocation, over programs that
    // leave the plan at seeded points (an extra request, a grown layer, a longer step, the plan
    // turned off and on, empty_cache).
    let run = |seed: u64, always: bool| {
        let mut a = planned();
        if always {
            a.planner_mut().unwrap().always_match();
        }
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let layers = 3 + next(4) as usize;
        let (mut log, mut records) = (Vec::new(), Vec::new());
        for _ in 0..60 {
            let (extra_at, grown, longer) = match next(24) {
                0 => (Some(next(30) as usize), false, false),
                1 => (None, true, false),
                2 => (None, false, true),
                3 => {
                    log.push(format!("{:?}", a.empty_cache()));
                    (None, false, false)
                }
                4 => {
                    records.push(a.planner_mut().unwrap().matcher_record.clone());
                    let off = "expandable_segments:True,expandable_trim:True";
                    a.set_config(settings::parse_settings(off, &CachingConfig::default()).unwrap());
                    a.set_config(
                        settings::parse_settings(
                            "planned_placement:True",
                            &CachingConfig::default(),
                        )
                        .unwrap(),
                    );
                    if always {
                        a.planner_mut().unwrap().always_match();
                    }
                    (None, false, false)
                }
                _ => (None, false, false),
            };
            wandering_step(&mut a, layers + longer as usize, extra_at, grown);
            log.push(format!("{:?}", a.stats()));
            log.push(format!("{:?}", a.segments()));
            log.push(format!("{:?}", a.planner_counters()));
        }
        records.push(a.planner_mut().unwrap().matcher_record.clone());
        (log, records)
    };
    let (mut skipped, mut caught_up) = (0, 0);
    for seed in 1..=16 {
        let (log, records) = run(seed, false);
        let (asked_log, asked) = run(seed, true);
        assert_same_log(&log, &asked_log, &format!("seed {seed}: skipped / asked"));
        assert_eq!(records.len(), asked.len());
        for (record, asked) in records.iter().zip(&asked) {
            assert_eq!(record.matches, asked.matches, "seed {seed}");
            assert_eq!(record.similar, asked.similar, "seed {seed}");
            assert_eq!((asked.skipped, asked.caught_up), (0, 0));
            skipped += record.skipped;
            caught_up += record.caught_up;
        }
    }
    // Not vacuous: most requests of the kept steps skipped the matcher, and it was caught up
    // with at every leaving.
    assert!(
        skipped > 5_000 && caught_up > 30,
        "skipped {skipped}, caught up {caught_up}"
    );
}

/// A step of two held blocks and two passing ones (events from the step's start): B, `held`
/// bytes over [0, 4); A1, `passing` bytes over [1, 2); C, `held` over [3, 7); A2, `passing` over
/// [5, 6); then 30 blocks of 2 MiB, each freed at once (the stretch matcher wants a step of 32
/// allocations or more; alone, they sit anywhere). At most `held + passing` live: B and A1, or C
/// and A2. With `passing` the larger, largest first puts A1 and A2 at 0 (they never meet), B
/// above A1 at `passing`, and C, which meets B and A2, at `held + passing`: a greedy plan of
/// `2 held + passing` bytes, every order leaving one block there. Refined, C goes first: C at 0,
/// A1 at 0 (gone before C comes), A2 above C at `held`, B above A1 and C at `passing`: the floor.
fn step_of_two_pairs(a: &mut CachingAllocator, held: usize, passing: usize) {
    let b = a.malloc(held, 0).unwrap();
    let a1 = a.malloc(passing, 0).unwrap();
    a.free(a1).unwrap();
    let c = a.malloc(held, 0).unwrap();
    a.free(b).unwrap();
    let a2 = a.malloc(passing, 0).unwrap();
    a.free(a2).unwrap();
    a.free(c).unwrap();
    for _ in 0..30 {
        let pad = a.malloc(2 * MIB, 0).unwrap();
        a.free(pad).unwrap();
    }
}

/// Twelve steps of two pairs; then a plan is in force at the floor, `held + passing` (its height
/// the floor too), and the peaks are reset. The requests advised so far.
fn planned_at_the_floor_of_two_pairs(a: &mut CachingAllocator, held: usize, passing: usize) -> u64 {
    for _ in 0..12 {
        step_of_two_pairs(a, held, passing);
    }
    let counters = a.planner_counters().unwrap();
    assert!(counters.in_force, "{counters:?}");
    assert_eq!(counters.floor, (held + passing) as u64, "{counters:?}");
    assert_eq!(counters.height, (held + passing) as u64, "{counters:?}");
    a.reset_peak_stats();
    counters.advised
}

#[test]
fn a_step_that_repeats_exactly_gets_the_refined_plan_when_the_greedy_one_would_not_pay() {
    // B and C of 6 MiB, A1 and A2 of 8: the greedy plan is 20 MiB (offsets from the plan's first
    // page), 10 pages where a plan pays only within the most ever allocated (15 MiB, the state
    // below counted) and 2% and a page (17.3 MiB): refused. Refined: C and A1 at 0, A2 at 6, B at
    // 8: 14 MiB, the floor, 7 pages. The step repeated exactly, so the refined plan is taken.
    // Placed at once, and off the request path (on a thread, and inline): there the first job,
    // taken before the step had repeated (the first step asks for one request more), places no
    // plan that pays, and the job taken again a step later is placed once more, refined.
    for off_path in [None, Some(false), Some(true)] {
        let mut a = planned();
        if let Some(inline) = off_path {
            a.place_plans_off_path(1, inline);
        }
        // The first step differs (an optimizer making its states, say: one request more).
        let state = a.malloc(MIB, 0).unwrap();
        let advised = planned_at_the_floor_of_two_pairs(&mut a, 6 * MIB, 8 * MIB);
        step_of_two_pairs(&mut a, 6 * MIB, 8 * MIB);
        // Every request of the step at its planned address, and the device holds the floor.
        assert_eq!(a.planner_counters().unwrap().advised - advised, 34);
        let stats = a.stats();
        assert_eq!(stats.allocated_bytes[ALL].peak, 15 * MIB as i64);
        assert_eq!(stats.reserved_bytes[ALL].peak, 16 * MIB as i64);
        a.free(state).unwrap();
        a.check_invariants().unwrap();
    }
}

#[test]
fn a_paying_plan_a_page_over_its_floor_is_refined_to_it() {
    // B and C of 2 MiB, A1 and A2 of 4: the greedy plan is 8 MiB, 4 pages, within what pays (6
    // MiB and 2% and a page). Refined: C and A1 at 0, A2 at 2, B at 4: 6 MiB, the floor, 3
    // pages: taken, as it maps a page fewer.
    let mut a = planned();
    planned_at_the_floor_of_two_pairs(&mut a, 2 * MIB, 4 * MIB);
    step_of_two_pairs(&mut a, 2 * MIB, 4 * MIB);
    let stats = a.stats();
    assert_eq!(stats.allocated_bytes[ALL].peak, 6 * MIB as i64);
    assert_eq!(stats.reserved_bytes[ALL].peak, 6 * MIB as i64);
    a.check_invariants().unwrap();
}

/// A chain step of 2 MiB blocks (each freed once the next is made: two live at once, two pages)
/// with `beside` blocks of 2 MiB on stream 1 made after the 20th and freed after the 30th: the
/// plan is of stream 0's blocks, and the policy serves stream 1's in a segment of its own.
fn chain_step_beside_another_stream(a: &mut CachingAllocator, beside: usize) {
    let mut previous = None;
    let mut held = Vec::new();
    for i in 0..40 {
        let ptr = a.malloc(2 * MIB, 0).unwrap();
        if let Some(p) = previous.replace(ptr) {
            a.free(p).unwrap();
        }
        if i == 20 {
            held = (0..beside).map(|_| a.malloc(2 * MIB, 1).unwrap()).collect();
        }
        if i == 30 {
            for p in held.drain(..) {
                a.free(p).unwrap();
            }
        }
    }
    a.free(previous.unwrap()).unwrap();
}

#[test]
fn a_pass_keeps_the_free_pages_outside_the_plan_that_the_passes_needed() {
    let mut a = planned();
    for _ in 0..6 {
        chain_step_beside_another_stream(&mut a, 1);
    }
    assert!(a.planner_counters().unwrap().in_force);
    // Each step: at most two chain blocks and stream 1's live at once, 6 MiB, on the plan's two
    // pages and stream 1's one: 6 MiB mapped, within 5% of what the passes allocated, so stream
    // 1's page stays mapped at each pass's end (it used to go, and come back in the next step: a
    // map and an unmap a step).
    let before = a.stats();
    for _ in 0..3 {
        chain_step_beside_another_stream(&mut a, 1);
        let stats = a.stats();
        assert_eq!(stats.allocated_bytes[ALL].current, 0);
        assert_eq!(stats.reserved_bytes[ALL].current, 6 * MIB as i64);
    }
    let after = a.stats();
    assert_eq!(
        (
            after.num_device_alloc - before.num_device_alloc,
            after.num_device_free - before.num_device_free
        ),
        (0, 0),
        "no page given back at a pass's end only to be mapped again in the next"
    );
    assert_eq!(after.allocated_bytes[ALL].peak, 6 * MIB as i64);
    a.check_invariants().unwrap();
}
