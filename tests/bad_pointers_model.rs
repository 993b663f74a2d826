//! Property test: random bad pointers (the pointer map's empty key and its neighbours among them,
//! interior addresses, one past a block's end, addresses already freed) interleaved with real
//! allocations and frees on two host devices, through the C ABI. After every step each device's
//! allocation count and requested bytes equal the model's live set (and debug builds recount every
//! device's books after every call: see caching/allocator/invariants.rs).
//!
//! Bursts of a thousand and more small blocks, mostly freed again, make empty_cache compact the
//! block slab and shrink the pointer map, so that the bad pointers after it meet renumbered blocks.
//!
//! The first phase keeps to device 0, so it runs on the one-device shortcut; the second uses both,
//! on the general path. This binary is its own process: the shortcut's state is this test's alone.

mod common;

use accalloc::capi::memory::{accalloc_empty_cache, accalloc_record_stream};
use accalloc::capi::AccallocStatus::{ACCALLOC_ERROR_INVALID_POINTER, ACCALLOC_OK};
use accalloc::runtime::DEVICE_TYPE_HOST;
use common::{free, malloc, stats};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::ffi::c_void;

#[derive(Clone, Debug)]
enum Op {
    Malloc {
        device: i32,
        size: usize,
    },
    Free {
        pick: usize,
    },
    /// An address derived from a block (live or freed) that may or may not be a live block's start.
    FreeNear {
        pick: usize,
        offset: isize,
    },
    /// One of the fixed addresses no block can start at.
    FreeFixed {
        which: usize,
    },
    RecordStreamNear {
        pick: usize,
        offset: isize,
    },
    EmptyCache,
    /// A peak of `count` 512-byte blocks on `device`, all freed but every `keep`-th: the next
    /// empty_cache compacts the device's slab and shrinks its pointer map, renumbering the blocks
    /// kept (and the addresses freed are fodder for bad frees after it).
    Burst {
        device: i32,
        count: usize,
        keep: usize,
    },
}

/// usize::MAX is the pointer map's empty key; the rest surround it or the top of the address space.
const FIXED: [usize; 7] = [
    1,
    511,
    usize::MAX,
    usize::MAX - 511,
    usize::MAX - 512,
    0xffff_8000_0000_0000,
    1 << 47,
];

fn op(devices: i32) -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        6 => 1usize..4096,
        3 => 4096usize..(2 << 20),
        1 => (2usize << 20)..(24 << 20),
    ];
    let offset = prop_oneof![
        Just(0isize),
        Just(1),
        Just(512),
        Just(-512),
        Just(4096),
        -8192isize..8192,
    ];
    prop_oneof![
        64 => (0..devices, size).prop_map(|(device, size)| Op::Malloc { device, size }),
        40 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        32 => (any::<usize>(), offset.clone()).prop_map(|(pick, offset)| Op::FreeNear { pick, offset }),
        24 => (0..FIXED.len()).prop_map(|which| Op::FreeFixed { which }),
        16 => (any::<usize>(), offset).prop_map(|(pick, offset)| Op::RecordStreamNear { pick, offset }),
        12 => Just(Op::EmptyCache),
        1 => (0..devices, 1100usize..1300, 40usize..400)
            .prop_map(|(device, count, keep)| Op::Burst { device, count, keep }),
    ]
}

/// The model: live blocks as (address, device, size asked for), and every address handed out so far.
#[derive(Default)]
struct Model {
    live: Vec<(usize, i32, usize)>,
    seen: Vec<(usize, usize)>,
}

impl Model {
    fn position(&self, ptr: usize) -> Option<usize> {
        self.live.iter().position(|&(p, _, _)| p == ptr)
    }

    /// An address near a block ever handed out (so often one already freed).
    fn near(&self, pick: usize, offset: isize) -> usize {
        if self.seen.is_empty() {
            return FIXED[pick % FIXED.len()];
        }
        let (ptr, size) = self.seen[pick % self.seen.len()];
        match offset {
            4096 => ptr + size, // one past the end of what was asked
            _ => ptr.wrapping_add_signed(offset),
        }
    }

    /// free(ptr) through the C ABI: OK exactly when the model holds a block there.
    fn free(&mut self, ptr: usize) -> Result<(), TestCaseError> {
        let expected = match self.position(ptr) {
            Some(at) => {
                self.live.swap_remove(at);
                ACCALLOC_OK
            }
            None if ptr == 0 => ACCALLOC_OK,
            None => ACCALLOC_ERROR_INVALID_POINTER,
        };
        prop_assert_eq!(free(ptr), expected, "free({:#x})", ptr);
        Ok(())
    }

    fn check(&self, devices: i32) -> Result<(), TestCaseError> {
        for device in 0..devices {
            let on_device = self.live.iter().filter(|&&(_, d, _)| d == device);
            let count = on_device.clone().count() as i64;
            let asked: usize = on_device.map(|&(_, _, size)| size).sum();
            let s = stats(device);
            prop_assert_eq!(s.allocation[0].current, count, "device {}", device);
            // A block freed after record_stream stays active (and requested) until its stream's
            // work is done, as in PyTorch.
            prop_assert!(
                s.requested_bytes[0].current >= asked as i64,
                "device {}",
                device
            );
            prop_assert!(
                s.allocated_bytes[0].current >= asked as i64,
                "device {}",
                device
            );
        }
        Ok(())
    }
}

/// One case; whatever it finds, the blocks the model holds are freed after it, so that the next
/// case (proptest shrinks a failure by running many) starts with empty books.
fn run(ops: &[Op], devices: i32) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    let result = steps(ops, devices, &mut model);
    for (ptr, _, _) in std::mem::take(&mut model.live) {
        prop_assert_eq!(free(ptr), ACCALLOC_OK);
    }
    result?;
    // Nothing left anywhere once the streams are waited for and the cache is emptied.
    prop_assert_eq!(accalloc_empty_cache(), ACCALLOC_OK);
    for device in 0..devices {
        let s = stats(device);
        prop_assert_eq!(s.allocation[0].current, 0, "device {}", device);
        prop_assert_eq!(s.active[0].current, 0, "device {}", device);
        prop_assert_eq!(s.requested_bytes[0].current, 0, "device {}", device);
        prop_assert_eq!(s.reserved_bytes[0].current, 0, "device {}", device);
    }
    Ok(())
}

fn steps(ops: &[Op], devices: i32, model: &mut Model) -> Result<(), TestCaseError> {
    for op in ops {
        match *op {
            Op::Malloc { device, size } => {
                let ptr = malloc(Some(DEVICE_TYPE_HOST), device, size);
                prop_assert!(model.position(ptr).is_none(), "{:#x} handed out twice", ptr);
                model.live.push((ptr, device, size));
                model.seen.push((ptr, size));
            }
            Op::Free { pick } if !model.live.is_empty() => {
                let ptr = model.live[pick % model.live.len()].0;
                model.free(ptr)?;
            }
            Op::Free { .. } => {}
            Op::FreeNear { pick, offset } => model.free(model.near(pick, offset))?,
            Op::FreeFixed { which } => model.free(FIXED[which])?,
            Op::RecordStreamNear { pick, offset } => {
                let ptr = model.near(pick, offset);
                let expected = if model.position(ptr).is_some() {
                    ACCALLOC_OK
                } else {
                    ACCALLOC_ERROR_INVALID_POINTER
                };
                let status =
                    unsafe { accalloc_record_stream(ptr as *mut c_void, 3usize as *mut c_void) };
                prop_assert_eq!(status, expected, "record_stream({:#x})", ptr);
            }
            Op::EmptyCache => prop_assert_eq!(accalloc_empty_cache(), ACCALLOC_OK),
            Op::Burst {
                device,
                count,
                keep,
            } => {
                let burst: Vec<usize> = (0..count)
                    .map(|_| malloc(Some(DEVICE_TYPE_HOST), device, 512))
                    .collect();
                for (i, &ptr) in burst.iter().enumerate() {
                    model.seen.push((ptr, 512));
                    if i % keep == 0 {
                        model.live.push((ptr, device, 512));
                    } else {
                        prop_assert_eq!(free(ptr), ACCALLOC_OK);
                    }
                }
            }
        }
        model.check(devices)?;
    }
    Ok(())
}

#[test]
fn bad_pointers_never_touch_the_books() {
    std::env::set_var("ACCALLOC_HOST_DEVICES", "2");
    std::env::set_var("ACCALLOC_HOST_CAPACITY", "4GiB");
    std::env::set_var("ACCALLOC_DEVICE", "host");
    let config = Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    };
    // Device 0 alone: the one-device shortcut. Then both: the general path.
    for devices in [1, 2] {
        let mut runner = TestRunner::new(config.clone());
        let ops = prop::collection::vec(op(devices), 1..160);
        if let Err(failure) = runner.run(&ops, |ops| run(&ops, devices)) {
            panic!("with {devices} device(s) in use: {failure}");
        }
    }
}
