//! Model-based property test: random sequences of malloc (1 B to hundreds of MiB, several streams),
//! free, record_stream, stream completion, empty_cache, resets, settings changes, memory fractions
//! and private pools (begun for this thread or a stream, ended, emptied live or not), run through the
//! allocator over a simulated device, against a simple model of what must hold:
//! - the books balance after every operation (debug builds recount them: see invariants.rs);
//! - a malloc either succeeds with a 512-byte aligned block that overlaps no live one, or is out of
//!   memory; nothing else;
//! - allocation.all.current is the number of live allocations, allocated bytes cover what was asked,
//!   and reserved bytes are exactly what the device holds;
//! - at the end, with everything freed, the streams done and the pools released, nothing is left
//!   anywhere and no pool is left.
//!
//! A failing case is shrunk to a minimal sequence by proptest.

use accalloc::backend::simulated::SimulatedBackend;
use accalloc::backend::Backend;
use accalloc::caching::pools::Route;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::{CachingAllocator, CachingConfig, StatType};
use accalloc::error::ErrorKind;
use proptest::prelude::*;
use std::sync::Arc;

const ALL: usize = StatType::All as usize;
const CAPACITY: usize = 1 << 30;
const SETTINGS: [&str; 6] = [
    "",
    "max_split_size_mb:20",
    "roundup_power2_divisions:4",
    "expandable_segments:True",
    "expandable_segments:True,expandable_trim:True",
    "garbage_collection_threshold:0.5,max_non_split_rounding_mb:40",
];

#[derive(Clone, Debug)]
enum Op {
    Malloc {
        size: usize,
        stream: usize,
    },
    Free {
        pick: usize,
    },
    RecordStream {
        pick: usize,
        stream: usize,
    },
    CompleteStream {
        stream: usize,
    },
    EmptyCache,
    ResetPeak,
    ResetAccumulated,
    Settings {
        choice: usize,
    },
    Fraction {
        percent: u8,
    },
    /// Begin pool (0, 1 + pool) for this thread (stream None) or a stream.
    PoolBegin {
        pool: u64,
        stream: Option<usize>,
    },
    PoolEnd {
        pool: u64,
    },
    PoolEmpty {
        pool: u64,
        live: bool,
    },
    /// Pause (with a backup or not) or resume pool (0, 1), which is sleepable.
    Pause {
        backup: bool,
    },
    Resume,
}

const POOLS: u64 = 2;

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => 1usize..4096,
        3 => 4096usize..(1 << 20),
        2 => (1usize << 20)..(12 << 20),
        1 => (12usize << 20)..(300 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size(), 0usize..3).prop_map(|(size, stream)| Op::Malloc { size, stream }),
        7 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0usize..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        2 => (0usize..3).prop_map(|stream| Op::CompleteStream { stream }),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeak),
        1 => Just(Op::ResetAccumulated),
        1 => (0..SETTINGS.len()).prop_map(|choice| Op::Settings { choice }),
        1 => (30u8..=100).prop_map(|percent| Op::Fraction { percent }),
        2 => (0..POOLS, prop::option::of(0usize..3))
            .prop_map(|(pool, stream)| Op::PoolBegin { pool, stream }),
        2 => (0..POOLS).prop_map(|pool| Op::PoolEnd { pool }),
        1 => (0..POOLS, any::<bool>()).prop_map(|(pool, live)| Op::PoolEmpty { pool, live }),
        1 => any::<bool>().prop_map(|backup| Op::Pause { backup }),
        1 => Just(Op::Resume),
    ]
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let backend = Arc::new(SimulatedBackend::new(1, CAPACITY));
    let mut a = CachingAllocator::new(backend.clone(), 0, CachingConfig::default()).unwrap();
    // The model: live allocations as (address, size asked for).
    let mut live: Vec<(usize, usize)> = Vec::new();
    // The model of the pools: which are begun.
    let mut begun = [false; POOLS as usize];
    let id = |pool: u64| (0, 1 + pool);
    // Pool (0, 1) is a tag's: sleepable from the start (one use, released at the end).
    a.create_pool(id(0), false, false).unwrap();
    a.make_pool_sleepable(id(0)).unwrap();
    let mut paused = false;
    for op in ops {
        match *op {
            Op::Malloc { size, stream } => match a.malloc(size, stream) {
                Ok(ptr) => {
                    prop_assert_eq!(ptr % 512, 0);
                    for &(other, other_size) in &live {
                        prop_assert!(ptr + size <= other || other + other_size <= ptr, "overlap");
                    }
                    live.push((ptr, size));
                }
                // A request routed to the paused tag is refused; any other fails only for room.
                Err(e) if paused && e.message.contains("paused") => {
                    prop_assert_eq!(e.kind, ErrorKind::InvalidArgument)
                }
                Err(e) => prop_assert_eq!(e.kind, ErrorKind::OutOfMemory, "{}", e.message),
            },
            Op::Free { pick } if !live.is_empty() => {
                let (ptr, _) = live.swap_remove(pick % live.len());
                prop_assert!(a.free(ptr).is_ok());
                prop_assert_eq!(a.free(ptr).unwrap_err().kind, ErrorKind::InvalidPointer);
            }
            Op::RecordStream { pick, stream } if !live.is_empty() => {
                let (ptr, _) = live[pick % live.len()];
                prop_assert!(a.record_stream(ptr, stream).is_ok());
            }
            Op::CompleteStream { stream } => backend.complete_stream(stream),
            Op::EmptyCache => prop_assert!(a.empty_cache().is_ok()),
            Op::ResetPeak => a.reset_peak_stats(),
            Op::ResetAccumulated => a.reset_accumulated_stats(),
            Op::Settings { choice } => {
                a.set_config(parse_settings(SETTINGS[choice], a.config()).unwrap());
            }
            Op::Fraction { percent } => {
                prop_assert!(a.set_memory_fraction(percent as f64 / 100.0).is_ok())
            }
            Op::PoolBegin { pool, stream } => {
                let route = match stream {
                    None => Route::Thread(std::thread::current().id()),
                    Some(stream) => Route::Stream(stream),
                };
                let result = a.begin_allocate_to_pool(id(pool), route);
                prop_assert_eq!(result.is_ok(), !begun[pool as usize], "{:?}", result);
                begun[pool as usize] = true;
            }
            Op::PoolEnd { pool } => {
                let result = a.end_allocate_to_pool(id(pool));
                prop_assert_eq!(result.is_ok(), begun[pool as usize]);
                begun[pool as usize] = false;
            }
            Op::PoolEmpty { pool, live: true } => {
                let exists = a.pool_use_count(id(pool)).is_some();
                prop_assert_eq!(a.empty_live_pool(id(pool)).is_ok(), exists);
            }
            Op::PoolEmpty { pool, live: false } => {
                prop_assert!(a.empty_pool_cache(id(pool)).is_ok())
            }
            Op::Pause { backup } => {
                prop_assert!(a.pause_pool(id(0), backup).is_ok());
                paused = a.pool_paused_bytes(id(0)).is_some_and(|b| b > 0);
            }
            Op::Resume => {
                // Others may have taken the memory meanwhile: then the rest stays paused.
                if let Err(e) = a.resume_pool(id(0)) {
                    prop_assert_eq!(e.kind, ErrorKind::OutOfMemory, "{}", e.message);
                }
                paused = a.pool_paused_bytes(id(0)).is_some_and(|b| b > 0);
            }
            _ => {}
        }
        let s = a.stats();
        prop_assert_eq!(s.allocation[ALL].current as usize, live.len());
        let asked: usize = live.iter().map(|&(_, size)| size).sum();
        prop_assert!(s.allocated_bytes[ALL].current as usize >= asked);
        prop_assert!(s.active[ALL].current as usize >= live.len());
        // The device holds what is reserved, less what a pause gave back.
        let paused_bytes = a.pool_paused_bytes(id(0)).unwrap_or(0);
        prop_assert_eq!(
            s.reserved_bytes[ALL].current as usize - paused_bytes,
            CAPACITY - backend.mem_get_info(0).unwrap().free
        );
    }
    for (ptr, _) in live {
        prop_assert!(a.free(ptr).is_ok());
    }
    for stream in 0..3 {
        backend.complete_stream(stream);
    }
    // The tag resumed (the cache emptied first: the device has room again); every pool ended and
    // released as often as it was begun: freeable, emptied and forgotten.
    prop_assert!(a.empty_cache().is_ok());
    prop_assert!(a.resume_pool(id(0)).is_ok());
    for pool in 0..POOLS {
        if begun[pool as usize] {
            prop_assert!(a.end_allocate_to_pool(id(pool)).is_ok());
        }
        while a.pool_use_count(id(pool)).is_some_and(|uses| uses > 0) {
            prop_assert!(a.release_pool(id(pool)).is_ok());
        }
    }
    prop_assert!(a.empty_cache().is_ok());
    for pool in 0..POOLS {
        prop_assert_eq!(a.pool_use_count(id(pool)), None, "pool {} is left", pool);
    }
    let s = a.stats();
    for (name, value) in [
        ("allocation", s.allocation[ALL].current),
        ("active", s.active[ALL].current),
        ("allocated_bytes", s.allocated_bytes[ALL].current),
        ("requested_bytes", s.requested_bytes[ALL].current),
        ("reserved_bytes", s.reserved_bytes[ALL].current),
        ("segment", s.segment[ALL].current),
        ("inactive_split", s.inactive_split[ALL].current),
    ] {
        prop_assert_eq!(value, 0, "{} is left at the end", name);
    }
    prop_assert_eq!(backend.live_events(), 0);
    prop_assert!(backend.live_segments(0).is_empty());
    prop_assert_eq!(backend.mapped_bytes(0), 0);
    Ok(())
}

proptest! {
    // 96 cases by default (PROPTEST_CASES to run more).
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(96),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_allocator_keeps_its_books_under_any_sequence(ops in prop::collection::vec(op(), 1..160)) {
        run(&ops)?;
    }
}
