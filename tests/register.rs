//! Registering backends from many threads at once: each gets its own device type, names stay unique,
//! and the table of types fills up with a clear error.

use accalloc::backend::renamed::Renamed;
use accalloc::backend::simulated::SimulatedBackend;
use accalloc::backend::Backend;
use accalloc::runtime::{runtime, MAX_DEVICE_TYPES};
use std::collections::HashSet;
use std::sync::Arc;

fn named(name: &str) -> Arc<dyn Backend> {
    Arc::new(Renamed::new(name, SimulatedBackend::new(1, 64 << 20)))
}

#[test]
fn concurrent_registrations_get_distinct_types() {
    let runtime = runtime().unwrap();
    let types: Vec<i32> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|i| scope.spawn(move || runtime.register(named(&format!("accel{i}"))).unwrap()))
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let distinct: HashSet<i32> = types.iter().copied().collect();
    assert_eq!(distinct.len(), 8, "{types:?}");
    for (i, &device_type) in types.iter().enumerate() {
        let accelerator = runtime.accelerator(device_type).unwrap();
        assert_eq!(accelerator.name(), format!("accel{i}"));
        // Each has its own pools and statistics.
        let p = accelerator.alloc(4096, 0, 0).unwrap();
        assert_eq!(
            accelerator.device_stats(0).unwrap().allocation[0].current,
            1
        );
        runtime.free(p).unwrap();
        // The test backends all hand out the same fake addresses, and a segment overlapping one
        // held by another backend is refused: give this one back before the next allocates.
        accelerator.empty_cache().unwrap();
    }
    // The same name twice, from two threads: exactly one wins.
    let outcomes: Vec<bool> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| runtime.register(named("twice")).is_ok()))
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(outcomes.iter().filter(|&&ok| ok).count(), 1);
    // Fill the table: the next registration says why it cannot.
    let mut n = 0;
    let error = loop {
        match runtime.register(named(&format!("filler{n}"))) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(n < MAX_DEVICE_TYPES);
    assert!(
        error.message.contains("no room for another backend"),
        "{}",
        error.message
    );
}
