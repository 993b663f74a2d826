//! A private pool's layout checkpointed and put back: what CUDA graph trees (torch.compile's
//! mode="reduce-overhead") ask of PyTorch's allocator as getCheckpointState and
//! setCheckpointPoolState, for any accelerator.

use super::guard::{current_type, guard, on, out_ptr};
use super::pools::AccallocPoolId;
use super::types::{AccallocDeviceType, AccallocStatus};
use crate::error::{Error, Result};
use accalloc_core::caching::PoolCheckpoint;
use std::ffi::c_void;

/// A private pool's layout at one moment (its segments, and which blocks were handed out), taken
/// by accalloc_pool_checkpoint_on and freed by accalloc_pool_checkpoint_destroy. Opaque.
pub struct AccallocPoolCheckpoint {
    device_type: AccallocDeviceType,
    device: i32,
    checkpoint: PoolCheckpoint,
}

/// The checkpoint a C caller passed (NULL refused).
fn checkpoint_arg<'a>(
    checkpoint: *const AccallocPoolCheckpoint,
) -> Result<&'a AccallocPoolCheckpoint> {
    // SAFETY: a non-NULL checkpoint is one accalloc_pool_checkpoint_on made (the header's contract).
    unsafe { checkpoint.as_ref() }.ok_or_else(|| Error::invalid_argument("checkpoint is NULL"))
}

/// Take a checkpoint of `pool` on `device` into `*out`: accalloc_pool_checkpoint_on on the current
/// accelerator.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_checkpoint(
    device: i32,
    pool: AccallocPoolId,
    out: *mut *mut AccallocPoolCheckpoint,
) -> AccallocStatus {
    accalloc_pool_checkpoint_on(current_type(), device, pool, out)
}

/// Take a checkpoint of `pool` on `device` of the accelerator of `device_type` into `*out`, to put
/// back later with accalloc_pool_checkpoint_restore (PyTorch's getCheckpointState). Nothing in the
/// pool changes.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out is NULL; the pool does not exist, is paused, or has
/// a freed block still waiting for another stream's work: synchronize first),
/// ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_checkpoint_on(
    device_type: AccallocDeviceType,
    device: i32,
    pool: AccallocPoolId,
    out: *mut *mut AccallocPoolCheckpoint,
) -> AccallocStatus {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let checkpoint = on(device_type)?.pool_checkpoint(device, (pool.first, pool.second))?;
        *out = Box::into_raw(Box::new(AccallocPoolCheckpoint {
            device_type,
            device,
            checkpoint,
        }));
        Ok(())
    })
}

/// Store in `*count` how many blocks `checkpoint` holds as handed out: how many
/// accalloc_pool_checkpoint_restore hands out again.
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (checkpoint or count is NULL).
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_checkpoint_allocations(
    checkpoint: *const AccallocPoolCheckpoint,
    count: *mut usize,
) -> AccallocStatus {
    guard(|| {
        let count = out_ptr(count, "count")?;
        let checkpoint = checkpoint_arg(checkpoint)?;
        *count = checkpoint.checkpoint.allocations().count();
        Ok(())
    })
}

/// Put `checkpoint` back into its pool (PyTorch's setCheckpointPoolState): the pool's live
/// allocations are freed, and the blocks handed out at the checkpoint are handed out again at their
/// addresses, now the caller's to free. Statistics move as PyTorch's: the frees, then each
/// checkpointed block handed out (its size asked for) and those free at the checkpoint freed again;
/// no segment is taken or given back.
///
/// The addresses freed go to `freed` (room for `freed_capacity`; their number to `*freed_count`), the
/// blocks handed out to `allocated` and their sizes to `allocated_sizes` (room for
/// `allocated_capacity` each; their number to `*allocated_count`). An address may be in both lists.
/// With accalloc_pool_live_allocations_on and accalloc_pool_checkpoint_allocations the caller knows
/// the room needed; with too little, nothing changes.
///
/// Refused with nothing changed, ACCALLOC_ERROR_INVALID_ARGUMENT: a required pointer is NULL (an
/// array may be NULL with a capacity of 0), too little room, the pool is gone, released (no use
/// left) or paused, one of its blocks is used by or waits for another stream (synchronize and free it
/// first), or a checkpointed segment is no longer the pool's as it was. ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_checkpoint_restore(
    checkpoint: *const AccallocPoolCheckpoint,
    freed: *mut *mut c_void,
    freed_capacity: usize,
    freed_count: *mut usize,
    allocated: *mut *mut c_void,
    allocated_sizes: *mut usize,
    allocated_capacity: usize,
    allocated_count: *mut usize,
) -> AccallocStatus {
    guard(|| {
        let checkpoint = checkpoint_arg(checkpoint)?;
        let freed_count = out_ptr(freed_count, "freed_count")?;
        let allocated_count = out_ptr(allocated_count, "allocated_count")?;
        for (array, name, capacity) in [
            (freed.is_null(), "freed", freed_capacity),
            (allocated.is_null(), "allocated", allocated_capacity),
            (
                allocated_sizes.is_null(),
                "allocated_sizes",
                allocated_capacity,
            ),
        ] {
            if array && capacity > 0 {
                return Err(Error::invalid_argument(format!(
                    "{name} is NULL with a capacity of {capacity}"
                )));
            }
        }
        let restored = on(checkpoint.device_type)?.restore_pool_checkpoint(
            checkpoint.device,
            &checkpoint.checkpoint,
            freed_capacity,
            allocated_capacity,
        )?;
        // SAFETY (the writes below): the runtime refused more entries than the capacities, and
        // each array holds its capacity (the header's contract).
        for (i, &address) in restored.freed.iter().enumerate() {
            unsafe { *freed.add(i) = address as *mut c_void };
        }
        for (i, &(address, size)) in restored.allocated.iter().enumerate() {
            unsafe {
                *allocated.add(i) = address as *mut c_void;
                *allocated_sizes.add(i) = size;
            }
        }
        *freed_count = restored.freed.len();
        *allocated_count = restored.allocated.len();
        Ok(())
    })
}

/// Free a checkpoint accalloc_pool_checkpoint_on made (NULL: nothing to do). Its pool is not
/// touched.
#[no_mangle]
pub unsafe extern "C" fn accalloc_pool_checkpoint_destroy(
    checkpoint: *mut AccallocPoolCheckpoint,
) -> AccallocStatus {
    guard(|| {
        if !checkpoint.is_null() {
            // SAFETY: made by accalloc_pool_checkpoint_on with Box::into_raw, freed once (the
            // header's contract).
            drop(unsafe { Box::from_raw(checkpoint) });
        }
        Ok(())
    })
}
