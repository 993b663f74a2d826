//! Telling observers about segments and out-of-memory failures (the rules are in
//! caching/observers.rs).

use super::*;
use crate::caching::observers::{
    OomReport, SegmentAction, SegmentEvent, SegmentObserver, OOM_REPORTS_KEPT,
};

/// The allocator's observer and the OOM reports not yet taken: boxed, away from the hot fields.
#[derive(Default)]
pub(super) struct Observers {
    segment: Option<SegmentObserver>,
    oom_reports: VecDeque<OomReport>,
}

impl CachingAllocator {
    /// Call `observer` for every segment event of this device from now on (None: stop). It runs
    /// while the caller holds the allocator, so it must not use the allocator itself.
    pub fn set_segment_observer(&mut self, observer: Option<SegmentObserver>) {
        self.observers.segment = observer;
    }

    /// The out-of-memory failures since the last call, oldest first (the newest
    /// OOM_REPORTS_KEPT of them).
    pub fn take_oom_reports(&mut self) -> Vec<OomReport> {
        self.observers.oom_reports.drain(..).collect()
    }

    /// Tell the segment observer, if there is one.
    pub(super) fn announce(
        &mut self,
        action: SegmentAction,
        private: PoolIndex,
        address: usize,
        size: usize,
        stream: StreamId,
    ) {
        if self.observers.segment.is_none() {
            return;
        }
        let event = SegmentEvent {
            action,
            device: self.device,
            pool: self.pool_of_block(private),
            address,
            size,
            stream,
        };
        if let Some(observer) = &mut self.observers.segment {
            observer(&event);
        }
    }

    /// Queue an out-of-memory report for the runtime's observers.
    pub(super) fn report_oom(&mut self, alloc_size: usize, device_free: usize) {
        let reports = &mut self.observers.oom_reports;
        if reports.len() == OOM_REPORTS_KEPT {
            reports.pop_front();
        }
        reports.push_back(OomReport {
            device: self.device,
            alloc_size,
            limit_or_total: self.allowed_maximum.unwrap_or(self.capacity),
            device_free,
        });
    }
}
