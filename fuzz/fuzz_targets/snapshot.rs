//! The snapshot reader (pickle and JSON, chosen by content) and replay of what it reads: any bytes
//! are either a trace that replays through the allocator (with every invariant checked after every
//! operation, as debug assertions are on) or an error; nothing panics and the simulated devices get
//! all their memory back.
#![no_main]

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::backend::Backend;
use accalloc::caching::CachingConfig;
use accalloc_tools::replay::{read_workload, replay, SnapshotOptions, TraceOp};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the options, the rest is the file.
    let Some((&choice, bytes)) = data.split_first() else { return };
    let options = SnapshotOptions {
        device: (choice & 1 == 1).then_some(usize::from(choice >> 1 & 1)),
        segment_free_as_empty_cache: choice & 4 == 4,
    };
    let Ok(workload) = read_workload(bytes, &options) else { return };
    let ops = workload.ops;
    let too_big = ops.iter().any(|op| {
        matches!(op, TraceOp::Alloc { device, size, .. } if *device > 1 || *size > 1 << 30)
    });
    if ops.len() > 2000 || too_big {
        return;
    }
    let backend = Arc::new(SimulatedBackend::new(2, 256 << 20));
    let report = replay(&ops, backend.clone(), &CachingConfig::default()).expect("a snapshot read replays");
    assert!(report.ooms <= report.allocs);
    for device in 0..2 {
        assert!(backend.live_segments(device).is_empty(), "memory left behind on device {device}");
        assert_eq!(backend.mem_get_info(device).unwrap().free, 256 << 20);
    }
});
