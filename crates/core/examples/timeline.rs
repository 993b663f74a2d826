// Print, at each change of reserved memory, the op, reserved and allocated per pool, and the planner.
use accalloc_core::backend::simulated::SimulatedBackend;
use accalloc_core::caching::{settings::parse_settings, CachingAllocator, CachingConfig};
use std::collections::HashMap;
use std::sync::Arc;
fn field(l: &str, k: &str) -> Option<usize> {
    let p = l.find(&format!("\"{k}\":"))? + k.len() + 3;
    let rest = &l[p..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let config = parse_settings(&args[2], &CachingConfig::default()).unwrap();
    let mut a =
        CachingAllocator::new(Arc::new(SimulatedBackend::new(1, 16 << 30)), 0, config).unwrap();
    let text = std::fs::read_to_string(&args[1]).unwrap();
    let mut ptrs = HashMap::new();
    let mb = |x: i64| x as f64 / 1048576.0;
    let mut last = (0, 0);
    let mut lastc = (0, 0, 0, false);
    for (i, l) in text.lines().enumerate() {
        if l.contains("\"op\":\"alloc\"") {
            let p = a
                .malloc(field(l, "size").unwrap(), field(l, "stream").unwrap_or(0))
                .unwrap();
            ptrs.insert(field(l, "id").unwrap(), p);
        } else if l.contains("\"op\":\"free\"") {
            a.free(ptrs.remove(&field(l, "id").unwrap()).unwrap())
                .unwrap();
        } else {
            continue;
        }
        let c = a.planner_counters().unwrap();
        let cc = (c.plans, c.attempts, c.dropped, c.in_force);
        if cc != lastc {
            let s = a.stats();
            println!("{i:5} PLANNER plans {} attempts {} dropped {} in_force {} height {:.2} floor {:.2} | alloc {:.3}", c.plans, c.attempts, c.dropped, c.in_force, c.height as f64 / 1048576.0, c.floor as f64 / 1048576.0, s.allocated_bytes[0].current as f64 / 1048576.0);
            lastc = cc;
        }
        let s = a.stats();
        let r = (s.reserved_bytes[1].current, s.reserved_bytes[2].current);
        if r != last {
            let c = a.planner_counters().unwrap();
            println!("{i:5} {} small res {:.2} alloc {:.3} | large res {:.2} alloc {:.3} | all alloc {:.3} peak {:.3} | plan {} size {}",
                if l.contains("alloc\"") { "A" } else { "F" }, mb(r.0), mb(s.allocated_bytes[1].current), mb(r.1), mb(s.allocated_bytes[2].current),
                mb(s.allocated_bytes[0].current), mb(s.allocated_bytes[0].peak), c.in_force, field(l, "size").unwrap_or(0));
            last = r;
        }
    }
}
