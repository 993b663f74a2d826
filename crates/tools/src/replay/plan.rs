//! What planned placement could reach on a trace (issue 33), per device: the floor (the most bytes
//! live at once, sizes rounded as the allocator rounds them), the best offline placement of the
//! whole trace (accalloc_core::planning::placement: every block's lifetime known), and the
//! trace's steady period (its iteration), if it has one. The online mode's target is to come close
//! to the offline placement; no allocator needs less than the floor.

use crate::caching::policy::round_size;
use crate::caching::CachingConfig;
use crate::replay::TraceOp;
use accalloc_core::planning::period::{events_of, steady_period, Request};
use accalloc_core::planning::placement::{best, floor, Lifetime, Order};
use std::collections::HashMap;

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
                owner.insert(id, device);
            }
            TraceOp::Free { id } => {
                let Some(device) = owner.remove(&id) else {
                    continue;
                };
                let d = &mut devices[device];
                if let Some(allocation) = d.open.remove(&id) {
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
}
