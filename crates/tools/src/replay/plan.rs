//! What planned placement could reach on a trace (issue 33), per device: the floor (the most bytes
//! live at once, sizes rounded as the allocator rounds them), the best offline placement of the
//! whole trace (accalloc_core::planning::placement: every block's lifetime known), and the
//! trace's steady period (its iteration), if it has one. The online mode's target is to come close
//! to the offline placement; no allocator needs less than the floor.
//!
//! Beside them, the growth floor: the fewest map calls any allocator can make on the trace while
//! it keeps a utilization at every point, mapping 2 MiB pages. An allocator does not know where a
//! trace ends, and every prefix of a trace (the program stopped there, its memory freed) is a
//! trace of its own, whose peak reserved is what the allocator had mapped by then; so pages mapped
//! ahead of the most allocated so far count against that prefix's utilization. At each request
//! that finds too few pages mapped, the most an allocator may then hold is the prefix's most
//! allocated over the utilization, in whole pages; mapping all of it at once (what `growth_calls`
//! counts) makes the fewest calls, even with every block packed without a gap and one reservation
//! for all (a real allocator's pools and streams only add calls). Unmaps are not counted.

use crate::caching::policy::round_size;
use crate::caching::CachingConfig;
use crate::replay::TraceOp;
use accalloc_core::planning::period::{events_of, steady_period, Request};
use accalloc_core::planning::placement::{best, floor, Lifetime, Order};
use std::collections::HashMap;

/// The page expandable segments and planned placement map (a CUDA device's granularity).
pub const GROWTH_PAGE: usize = 2 << 20;

/// The utilizations the growth floor is worked out for: issue 33's targets for fixed-shape and
/// varying-shape training.
pub const GROWTH_UTILIZATIONS: [f64; 2] = [0.99, 0.97];

/// The growth floor at one utilization, worked out request by request (see the module's comment).
#[derive(Clone, Copy, Debug)]
struct Growth {
    utilization: f64,
    /// Pages mapped, and the map calls that mapped them.
    pages: usize,
    calls: usize,
}

impl Growth {
    /// A request has brought `allocated` bytes live, `most` the most ever: map if they do not fit.
    fn request(&mut self, allocated: usize, most: usize) {
        if allocated <= self.pages * GROWTH_PAGE {
            return;
        }
        // The most the prefix ending here may have reserved, in whole pages, and at least what it
        // needs now.
        let allowed = (most as f64 / self.utilization) as usize / GROWTH_PAGE;
        self.pages = allowed.max(allocated.div_ceil(GROWTH_PAGE));
        self.calls += 1;
    }
}

/// One device's bound.
#[derive(Clone, Debug)]
pub struct PlanBound {
    pub device: usize,
    /// Allocations placed.
    pub blocks: usize,
    /// The most bytes live at once.
    pub floor: usize,
    /// The best offline placement's size, and its order.
    pub placed: usize,
    pub order: Order,
    /// The steady period in events and how many times in a row it repeats, if any.
    pub period: Option<(usize, usize)>,
    /// The growth floor at each of GROWTH_UTILIZATIONS: (utilization, fewest map calls).
    pub growth_calls: Vec<(f64, usize)>,
}

impl PlanBound {
    /// floor / placed: 1.0 when the offline placement needs no byte more than the floor.
    pub fn utilization(&self) -> f64 {
        self.floor as f64 / self.placed.max(1) as f64
    }
}

/// The bound of each device the trace allocates on, in device order. A block never freed lives to
/// the end of the trace; an allocation the allocator would refuse (0 bytes, too large) is skipped.
pub fn plan_bounds(ops: &[TraceOp], config: &CachingConfig) -> Vec<PlanBound> {
    // Per device: lifetimes, the requests in allocation numbers, and open allocations by trace id.
    struct Device {
        lifetimes: Vec<Lifetime>,
        requests: Vec<Request>,
        open: HashMap<u64, usize>,
        /// Bytes live, the most ever, and the growth floors.
        allocated: usize,
        most: usize,
        growth: Vec<Growth>,
    }
    let mut devices: Vec<Device> = Vec::new();
    let mut owner: HashMap<u64, usize> = HashMap::new();
    let mut time = 0usize;
    for op in ops {
        time += 1;
        match *op {
            TraceOp::Alloc {
                id,
                size,
                stream,
                device,
            } => {
                let Some(rounded) = round_size(size, config).filter(|_| size > 0) else {
                    continue;
                };
                while devices.len() <= device {
                    devices.push(Device {
                        lifetimes: Vec::new(),
                        requests: Vec::new(),
                        open: HashMap::new(),
                        allocated: 0,
                        most: 0,
                        growth: GROWTH_UTILIZATIONS
                            .iter()
                            .map(|&utilization| Growth {
                                utilization,
                                pages: 0,
                                calls: 0,
                            })
                            .collect(),
                    });
                }
                let d = &mut devices[device];
                d.open.insert(id, d.lifetimes.len());
                d.lifetimes.push(Lifetime {
                    size: rounded,
                    start: time,
                    end: usize::MAX,
                });
                d.requests.push(Request::Alloc {
                    size: rounded,
                    stream,
                });
                d.allocated += rounded;
                d.most = d.most.max(d.allocated);
                for growth in &mut d.growth {
                    growth.request(d.allocated, d.most);
                }
                owner.insert(id, device);
            }
            TraceOp::Free { id } => {
                let Some(device) = owner.remove(&id) else {
                    continue;
                };
                let d = &mut devices[device];
                if let Some(allocation) = d.open.remove(&id) {
                    d.allocated -= d.lifetimes[allocation].size;
                    d.lifetimes[allocation].end = time;
                    d.requests.push(Request::Free { allocation });
                }
            }
            _ => {}
        }
    }
    let end = time + 1;
    devices
        .into_iter()
        .enumerate()
        .filter(|(_, d)| !d.lifetimes.is_empty())
        .map(|(device, mut d)| {
            for lifetime in &mut d.lifetimes {
                lifetime.end = lifetime.end.min(end);
            }
            let (order, placement) = best(&d.lifetimes);
            let events = events_of(d.requests.iter().copied());
            let period = steady_period(&events, 4, events.len() / 2).map(|p| (p.length, p.repeats));
            PlanBound {
                device,
                blocks: d.lifetimes.len(),
                floor: floor(&d.lifetimes),
                placed: placement.size,
                order,
                period,
                growth_calls: d.growth.iter().map(|g| (g.utilization, g.calls)).collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::parse_trace;

    #[test]
    fn a_repeated_step_has_its_period_and_the_placement_reaches_the_floor() {
        // Three steps of: a (1 MiB) and b (3 MiB) live together, a freed, c (2 MiB) with b, all freed.
        let mut trace = String::new();
        let mut id = 0;
        for _ in 0..3 {
            let (a, b, c) = (id, id + 1, id + 2);
            id += 3;
            for (op, id, size) in [
                ("alloc", a, 1 << 20),
                ("alloc", b, 3 << 20),
                ("free", a, 0),
                ("alloc", c, 2 << 20),
                ("free", b, 0),
                ("free", c, 0),
            ] {
                if op == "alloc" {
                    trace.push_str(&format!(
                        "{{\"op\":\"alloc\",\"id\":{id},\"size\":{size}}}\n"
                    ));
                } else {
                    trace.push_str(&format!("{{\"op\":\"free\",\"id\":{id}}}\n"));
                }
            }
        }
        let ops = parse_trace(&trace).unwrap();
        let bounds = plan_bounds(&ops, &CachingConfig::default());
        assert_eq!(bounds.len(), 1);
        let bound = &bounds[0];
        assert_eq!((bound.blocks, bound.floor), (9, 5 << 20));
        assert_eq!(bound.placed, 5 << 20, "b at 0, a and c above it");
        assert_eq!(bound.utilization(), 1.0);
        // Six events a step, three steps.
        assert_eq!(bound.period, Some((6, 3)));
    }

    #[test]
    fn the_growth_floor_maps_what_each_prefix_allows_and_no_more() {
        // MiB sizes, 2 MiB pages. a 1 (1 page: the first call), b 1 (fits), c 3 (5 MiB live: 5 /
        // 0.99 or 0.97 is 2 pages, 3 needed: the second call, 3 pages); all freed; d 6 (fits), e
        // 0.5 (6.5 live, 6.5 / 0.99 or 0.97 is 3 pages, 4 needed: the third call); all freed; f 66
        // (66 / 0.99 = 66.7 MiB, 33 pages; 66 / 0.97 = 68.04 MiB, 34 pages: the fourth call either
        // way), g 2 (68 live: past 33 pages, a fifth call at 0.99; within 34 at 0.97).
        let mib = 1usize << 20;
        let mut trace = String::new();
        let alloc = |trace: &mut String, id: u32, size: usize| {
            trace.push_str(&format!(
                "{{\"op\":\"alloc\",\"id\":{id},\"size\":{size}}}\n"
            ))
        };
        let free = |trace: &mut String, id: u32| {
            trace.push_str(&format!("{{\"op\":\"free\",\"id\":{id}}}\n"))
        };
        for (id, size) in [(0, mib), (1, mib), (2, 3 * mib)] {
            alloc(&mut trace, id, size);
        }
        for id in 0..3 {
            free(&mut trace, id);
        }
        alloc(&mut trace, 3, 6 * mib);
        alloc(&mut trace, 4, mib / 2);
        free(&mut trace, 3);
        free(&mut trace, 4);
        alloc(&mut trace, 5, 66 * mib);
        alloc(&mut trace, 6, 2 * mib);
        let ops = parse_trace(&trace).unwrap();
        let bounds = plan_bounds(&ops, &CachingConfig::default());
        assert_eq!(bounds[0].growth_calls, vec![(0.99, 5), (0.97, 4)]);
        assert_eq!(bounds[0].floor, 68 * mib);
    }
}
