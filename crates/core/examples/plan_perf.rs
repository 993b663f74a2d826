use accalloc_core::backend::simulated::SimulatedBackend;
use accalloc_core::caching::{settings::parse_settings, CachingAllocator, CachingConfig};
use std::sync::Arc;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let settings = args.get(1).cloned().unwrap_or_default();
    let steps: usize = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(60000);
    let config = parse_settings(&settings, &CachingConfig::default()).unwrap();
    let mut a =
        CachingAllocator::new(Arc::new(SimulatedBackend::new(1, 16 << 30)), 0, config).unwrap();
    enum R {
        A(usize),
        F(usize),
    }
    let mut req = Vec::new();
    let mut n = 0;
    let mut held = Vec::new();
    for layer in 0..12 {
        let mut kept = Vec::new();
        for (i, s) in [3usize << 20, 1 << 20, 2 << 20, 1 << 20]
            .into_iter()
            .enumerate()
        {
            req.push(R::A(s + (layer * 3 + i) * 4096));
            kept.push(n);
            n += 1;
        }
        for s in [2usize << 20, 1 << 20, 4 << 20] {
            req.push(R::A(s));
            req.push(R::F(n));
            n += 1;
        }
        held.push(kept);
    }
    for kept in held.into_iter().rev() {
        for s in [1usize << 20, 2 << 20] {
            req.push(R::A(s));
            req.push(R::F(n));
            n += 1;
        }
        for k in kept {
            req.push(R::F(k));
        }
    }
    let mut blocks = vec![0usize; n];
    let t = std::time::Instant::now();
    for _ in 0..steps {
        let mut next = 0;
        for r in &req {
            match *r {
                R::A(s) => {
                    blocks[next] = a.malloc(s, 0).unwrap();
                    next += 1;
                }
                R::F(i) => a.free(blocks[i]).unwrap(),
            }
        }
    }
    println!(
        "{:.1} ns",
        t.elapsed().as_nanos() as f64 / (steps * n) as f64
    );
}
