//! The trace reader and replay: any text is either a trace that replays through the allocator (with
//! every invariant checked after every operation, as debug assertions are on), under the default
//! policy and under planned placement, or an error naming a line; nothing panics and the simulated
//! device gets all its memory back.
#![no_main]

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::backend::Backend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::CachingConfig;
use accalloc_tools::replay::{parse_trace, replay, TraceOp};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(ops) = parse_trace(text) else { return };
    if ops.len() > 2000 || ops.iter().any(|op| matches!(op, TraceOp::Alloc { device, .. } if *device > 1)) {
        return;
    }
    // The default policy, and planned placement (plans, alloc_at, pins) over the same requests.
    let planned = parse_settings("planned_placement:True", &CachingConfig::default()).unwrap();
    for config in [CachingConfig::default(), planned] {
        let backend = Arc::new(SimulatedBackend::new(2, 256 << 20));
        let report = replay(&ops, backend.clone(), &config).expect("a parsed trace replays");
        assert!(report.ooms <= report.allocs);
        for device in 0..2 {
            assert!(backend.live_segments(device).is_empty(), "memory left behind on device {device}");
            assert_eq!(backend.mem_get_info(device).unwrap().free, 256 << 20);
        }
    }
});
