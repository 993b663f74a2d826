//! The planned-request benchmark: the requests of a training step, repeated, through the core's
//! allocator on a simulated device, with planned_placement on (every request served at its planned
//! address once the plan is in force) against the default policy (every request served from the
//! cache once the first step has filled it), the two taking turns in the same run. The device is
//! simulated so that neither side maps or touches memory: what is timed is the allocator's own
//! work per request.

use super::bench::median;
use crate::backend::simulated::SimulatedBackend;
use crate::caching::{settings::parse_settings, CachingAllocator, CachingConfig};
use crate::planning::placement::{best_of_orders_on, place_cyclic, Lifetime};
use std::sync::Arc;
use std::time::Instant;

/// Layers of the step: each makes activations kept for the backward pass and temporaries.
const LAYERS: usize = 12;

/// Steps run before timing: the plan made, and the planner's log of requests (a quarter of a
/// million allocations at most, then its older half dropped) at its full size, as in a long run.
const WARM_UP_STEPS: usize = 2_500;

/// One request of the step: allocate `size` bytes, or free the block of request `index`.
#[derive(Clone, Copy, Debug)]
enum Request {
    Alloc(usize),
    Free(usize),
}

/// A transformer-like step: per layer, four activations held until the layer's backward and
/// three temporaries freed at once; per layer backward, two gradients' temporaries, then the
/// layer's activations go. 108 allocations of 1 to 4 MiB (the large pool: a plan lies in one
/// pool's segment, and is put in force only where the other holds nothing).
fn step() -> Vec<Request> {
    step_of(LAYERS)
}

/// `step` with `layers` layers.
fn step_of(layers: usize) -> Vec<Request> {
    let mut requests = Vec::new();
    let mut allocations = 0;
    let mut alloc = |requests: &mut Vec<Request>, size: usize| {
        requests.push(Request::Alloc(size));
        allocations += 1;
        allocations - 1
    };
    let mut held = Vec::new();
    for layer in 0..layers {
        let mut kept = Vec::new();
        for (i, size) in [3 << 20, 1 << 20, 2 << 20, 1 << 20].into_iter().enumerate() {
            kept.push(alloc(&mut requests, size + (layer * 3 + i) * 4096));
        }
        for size in [2 << 20, 1 << 20, 4 << 20] {
            let t = alloc(&mut requests, size);
            requests.push(Request::Free(t));
        }
        held.push(kept);
    }
    for kept in held.into_iter().rev() {
        for size in [1 << 20, 2 << 20] {
            let t = alloc(&mut requests, size);
            requests.push(Request::Free(t));
        }
        for k in kept {
            requests.push(Request::Free(k));
        }
    }
    requests
}

/// The allocations among `requests`.
fn allocations(requests: &[Request]) -> usize {
    requests
        .iter()
        .filter(|r| matches!(r, Request::Alloc(_)))
        .count()
}

/// Run `steps` steps of `requests` on `allocator`; ns per allocation (its malloc and its free).
fn run_steps(allocator: &mut CachingAllocator, requests: &[Request], steps: usize) -> f64 {
    let allocations = allocations(requests);
    let mut blocks = vec![0usize; allocations];
    let start = Instant::now();
    for _ in 0..steps {
        let mut next = 0;
        for request in requests {
            match *request {
                Request::Alloc(size) => {
                    blocks[next] = allocator
                        .malloc(size, 0)
                        .expect("the simulated device has room for the step");
                    next += 1;
                }
                Request::Free(index) => allocator
                    .free(blocks[index])
                    .expect("the step frees what it allocated"),
            }
        }
    }
    start.elapsed().as_nanos() as f64 / (steps * allocations) as f64
}

/// What the benchmark measured.
#[derive(Clone, Debug)]
pub struct PlannedBench {
    /// Median ns per request (allocation and its free), default policy (from the cache).
    pub cached_ns: f64,
    /// The same with planned_placement, plan in force.
    pub planned_ns: f64,
    /// Allocations per step, and how many of the last step's the plan gave an address to.
    pub per_step: usize,
    pub advised_last_step: u64,
}

impl PlannedBench {
    /// planned / cached: at most 1 means a planned request costs no more than a cached one.
    pub fn ratio(&self) -> f64 {
        self.planned_ns / self.cached_ns
    }
}

/// ns per request of `steps` steps of the benchmark's step on a fresh allocator, planned or from the
/// cache, and nothing else: what a profiler or an instruction counter is pointed at
/// (`crates/tools/examples/planned_steps.rs`; the first steps make the plan and fill the cache, so
/// compare two step counts).
pub fn steps_alone(planned: bool, steps: usize) -> f64 {
    let settings = if planned {
        "planned_placement:True"
    } else {
        ""
    };
    run_steps(&mut allocator(settings), &step(), steps)
}

fn allocator(settings: &str) -> CachingAllocator {
    let config = parse_settings(settings, &CachingConfig::default()).expect("a known setting");
    CachingAllocator::new(Arc::new(SimulatedBackend::new(1, 16 << 30)), 0, config)
        .expect("a simulated device")
}

/// `batches` batches of `steps` steps each, default and planned taking turns, after
/// WARM_UP_STEPS steps.
pub fn run(batches: usize, steps: usize) -> PlannedBench {
    run_after(WARM_UP_STEPS, batches, steps)
}

fn run_after(warm_up: usize, batches: usize, steps: usize) -> PlannedBench {
    let requests = step();
    let mut cached = allocator("");
    let mut planned = allocator("planned_placement:True");
    run_steps(&mut cached, &requests, warm_up);
    run_steps(&mut planned, &requests, warm_up);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..batches {
        theirs.push(run_steps(&mut cached, &requests, steps));
        ours.push(run_steps(&mut planned, &requests, steps));
    }
    let before = planned.planner_counters().unwrap_or_default().advised;
    run_steps(&mut planned, &requests, 1);
    let advised_last_step = planned.planner_counters().unwrap_or_default().advised - before;
    PlannedBench {
        cached_ns: median(theirs),
        planned_ns: median(ours),
        per_step: allocations(&requests),
        advised_last_step,
    }
}

/// Layers of the step whose plan is timed: 9,900 allocations, a large model's step.
const PLANNING_LAYERS: usize = 1_100;

/// The allocations of `requests` as lifetimes in requests (one event each), and the step's length.
fn lifetimes(requests: &[Request]) -> (Vec<Lifetime>, usize) {
    let mut blocks = Vec::new();
    for (time, request) in requests.iter().enumerate() {
        match *request {
            Request::Alloc(size) => blocks.push(Lifetime {
                size,
                start: time,
                end: time,
            }),
            Request::Free(index) => blocks[index].end = time,
        }
    }
    (blocks, requests.len())
}

/// What the planning benchmark measured: making the placement of a step's blocks, every order one
/// after the other on the calling thread against the orders on threads of their own (what the
/// planner does for a step of 512 blocks or more on a machine with more than one core).
#[derive(Clone, Debug)]
pub struct PlanningBench {
    pub blocks: usize,
    /// Median ms per placement.
    pub one_thread_ms: f64,
    pub threaded_ms: f64,
    /// The cores the threads could use.
    pub cores: usize,
    /// The same order and offsets both ways, every round (the choice does not depend on the
    /// threads).
    pub same_placement: bool,
}

impl PlanningBench {
    /// threaded / one thread: under 1 means the threads save time.
    pub fn ratio(&self) -> f64 {
        self.threaded_ms / self.one_thread_ms
    }
}

/// Place a PLANNING_LAYERS step `rounds` times each way, in turns.
pub fn planning(rounds: usize) -> PlanningBench {
    let (blocks, cycle) = lifetimes(&step_of(PLANNING_LAYERS));
    let place = |threaded: bool| {
        let start = Instant::now();
        let best = best_of_orders_on(threaded, |order| place_cyclic(&blocks, cycle, order).ok())
            .expect("a step's blocks can be placed");
        (start.elapsed().as_secs_f64() * 1e3, best)
    };
    let (mut one, mut threaded, mut same) = (Vec::new(), Vec::new(), true);
    for _ in 0..rounds {
        let (ms, alone) = place(false);
        one.push(ms);
        let (ms, spread) = place(true);
        threaded.push(ms);
        same &= alone == spread;
    }
    PlanningBench {
        blocks: blocks.len(),
        one_thread_ms: median(one),
        threaded_ms: median(threaded),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        same_placement: same,
    }
}

/// Layers of the step whose plan is made while the program runs: 3,600 allocations.
const STALL_LAYERS: usize = 400;

/// What the stall benchmark measured: the longest single request of a run of training steps in
/// which the step's plan is found and made, the plan made at once (in the request that found the
/// step) against made off the request path (on a thread of its own, put in force one step later).
#[derive(Clone, Debug)]
pub struct StallBench {
    pub allocations_per_step: usize,
    /// The time each step spends away from the allocator (its kernels, on a device).
    pub step_ms: f64,
    /// The longest request, in ms, each way; whether a plan was in force at the end each way.
    pub at_once_ms: f64,
    pub off_path_ms: f64,
    pub planned_both_ways: bool,
}

/// Run four steps of a step of `layers` layers with `step_ms` between steps, on a planned
/// allocator whose plans are made at once or off the request path; the longest request in ms and
/// whether a plan was in force at the end.
fn longest_request(layers: usize, off_path: bool, step_ms: u64) -> (f64, bool) {
    let requests = step_of(layers);
    let mut allocator = CachingAllocator::new(
        Arc::new(SimulatedBackend::new(1, 1 << 40)),
        0,
        parse_settings("planned_placement:True", &CachingConfig::default())
            .expect("a known setting"),
    )
    .expect("a simulated device");
    allocator.set_plan_off_path_from(if off_path { 1 } else { usize::MAX });
    let mut blocks = vec![0usize; allocations(&requests)];
    let mut longest = 0f64;
    for _ in 0..4 {
        let mut next = 0;
        for request in &requests {
            match *request {
                Request::Alloc(size) => {
                    let start = Instant::now();
                    blocks[next] = allocator
                        .malloc(size, 0)
                        .expect("the simulated device has room for the step");
                    longest = longest.max(start.elapsed().as_secs_f64() * 1e3);
                    next += 1;
                }
                Request::Free(index) => allocator
                    .free(blocks[index])
                    .expect("the step frees what it allocated"),
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(step_ms));
    }
    let in_force = allocator.planner_counters().is_some_and(|c| c.in_force);
    (longest, in_force)
}

/// The longest request with the plan made at once and off the request path, each step spending
/// `step_ms` away from the allocator (more than the placement takes, as a step of this many
/// allocations does on a device).
pub fn stall(step_ms: u64) -> StallBench {
    stall_of(STALL_LAYERS, step_ms)
}

fn stall_of(layers: usize, step_ms: u64) -> StallBench {
    let (at_once_ms, at_once_planned) = longest_request(layers, false, step_ms);
    let (off_path_ms, off_path_planned) = longest_request(layers, true, step_ms);
    StallBench {
        allocations_per_step: allocations(&step_of(layers)),
        step_ms: step_ms as f64,
        at_once_ms,
        off_path_ms,
        planned_both_ways: at_once_planned && off_path_planned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_frees_all_it_allocates_and_the_plan_serves_all_of_it() {
        let requests = step();
        let allocations = allocations(&requests);
        let frees = requests.len() - allocations;
        assert_eq!((allocations, frees), (LAYERS * 9, LAYERS * 9));
        let bench = run_after(8, 1, 2);
        assert_eq!(bench.per_step, 108);
        // The benchmark times what it says: every request of a step at a planned address.
        assert_eq!(bench.advised_last_step, 108);
        assert!(bench.cached_ns > 0.0 && bench.planned_ns > 0.0);
    }

    #[test]
    fn the_stall_benchmark_makes_the_plan_both_ways() {
        // What is timed is what the row says: the step's plan made, at once and off the path.
        let bench = stall_of(20, 0);
        assert_eq!(bench.allocations_per_step, 20 * 9);
        assert!(bench.planned_both_ways, "{bench:?}");
        assert!(bench.at_once_ms > 0.0 && bench.off_path_ms > 0.0);
    }

    #[test]
    fn a_step_is_placed_alike_on_threads_and_on_one() {
        // 3 layers: 27 allocations, every one freed within the step.
        let (blocks, cycle) = lifetimes(&step_of(3));
        assert_eq!((blocks.len(), cycle), (27, 54));
        assert!(blocks.iter().all(|b| b.start < b.end && b.end <= cycle));
        let place = |threaded: bool| {
            best_of_orders_on(threaded, |order| place_cyclic(&blocks, cycle, order).ok())
        };
        let (alone, spread) = (place(false).unwrap(), place(true).unwrap());
        assert_eq!(alone, spread);
        // No placement needs less than the most bytes live at once.
        assert!(alone.1.size >= crate::planning::placement::floor(&blocks));
    }
}
