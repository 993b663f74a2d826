//! What planned_placement is doing (the setting of docs/CONFIGURATION.md): the planner's counters
//! of one device, for a program or a person checking that its training loop is served at planned
//! addresses.

use super::guard::{current_type, fill_sized, guard, on};
use super::types::{AccallocDeviceType, AccallocStatus};

/// planned_placement's planner on one device. Set struct_size to sizeof(AccallocPlannerStats)
/// before calling accalloc_planner_stats: the library fills that many bytes at most, so a program
/// built against this header keeps working when later versions add fields at the end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccallocPlannerStats {
    /// Size of this struct as the caller knows it; set by the caller, rewritten with the bytes filled.
    pub struct_size: usize,
    /// 1 when planned_placement is on for this device, 0 when it is off (the rest is then 0).
    pub enabled: i32,
    /// 1 when a plan is in force now and the program keeps to it.
    pub in_force: i32,
    /// Plans made (each replaces the one before).
    pub plans: i64,
    /// Plans tried: made, or not made because they would not pay.
    pub attempts: i64,
    /// Plans dropped because the requests stopped matching them.
    pub dropped: i64,
    /// Requests given an address by a plan.
    pub advised: i64,
    /// Of them, those whose range was taken, served by the ordinary policy instead.
    pub conflicts: i64,
    /// Bytes the latest plan spans in its segment (0 before the first plan).
    pub plan_height: i64,
    /// Of the requests given an address, those served from the block parked there (freed there
    /// by the plan's request before, kept unmerged for it): the fast path.
    pub from_parked: i64,
    /// The least the latest plan could span: the most bytes its step's blocks and the long-lived
    /// blocks around them hold at once (what plan_height spans over it is what packing around
    /// those costs; 0 before the first plan).
    pub plan_floor: i64,
}

/// Fill `*out` with what planned_placement's planner has done on `device` (-1: current).
///
/// Errors: ACCALLOC_ERROR_INVALID_ARGUMENT (out NULL or struct_size too small),
/// ACCALLOC_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn accalloc_planner_stats(
    device: i32,
    out: *mut AccallocPlannerStats,
) -> AccallocStatus {
    accalloc_planner_stats_on(current_type(), device, out)
}

/// accalloc_planner_stats on the accelerator of `device_type`.
#[no_mangle]
pub unsafe extern "C" fn accalloc_planner_stats_on(
    device_type: AccallocDeviceType,
    device: i32,
    out: *mut AccallocPlannerStats,
) -> AccallocStatus {
    guard(|| {
        // SAFETY: AccallocPlannerStats is repr(C) and starts with struct_size; `out` is the
        // caller's (the contract stated in capi/mod.rs).
        unsafe {
            fill_sized(out, "AccallocPlannerStats", || {
                let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                let counters = on(device_type)?.planner_counters(device)?;
                Ok(
                    counters.map_or_else(AccallocPlannerStats::default, |c| AccallocPlannerStats {
                        struct_size: 0,
                        enabled: 1,
                        in_force: c.in_force as i32,
                        plans: count(c.plans),
                        attempts: count(c.attempts),
                        dropped: count(c.dropped),
                        advised: count(c.advised),
                        conflicts: count(c.conflicts),
                        plan_height: count(c.height),
                        from_parked: count(c.from_parked),
                        plan_floor: count(c.floor),
                    }),
                )
            })
        }
    })
}
