//! What a snapshot shows: segments with their blocks, and the history of allocator events
//! (PyTorch's torch.cuda.memory._snapshot), as data and as JSON.

use super::config::CachingConfig;
use super::policy::PoolKind;
use crate::backend::StreamId;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

/// The state of a block, in PyTorch's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out and not freed.
    ActiveAllocated,
    /// Freed, waiting for stream events before it returns to the pool.
    ActivePendingFree,
    /// Cached in a pool.
    Inactive,
}

impl BlockState {
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub address: usize,
    pub size: usize,
    /// What the caller asked for (0 for an inactive block).
    pub requested_size: usize,
    pub state: BlockState,
}

/// One segment and its blocks, by address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub address: usize,
    pub total_size: usize,
    pub stream: StreamId,
    pub pool: PoolKind,
    /// The private pool it belongs to, (0, 0) for the default pools (PyTorch's segment_pool_id).
    pub pool_id: (u64, u64),
    pub is_expandable: bool,
    /// Bytes of its pages paused (sleep and wake): their memory is back with the device.
    pub paused_size: usize,
    /// The part of the segment, [start, end), that the plan in force spans (planned_placement):
    /// where requests of the plan's step are served at their planned addresses. A plan may span
    /// several segments (mapped stretches of one reservation), or none while its pages are unmapped.
    pub planned_range: Option<(usize, usize)>,
    pub blocks: Vec<BlockInfo>,
}

impl SegmentInfo {
    fn sum(&self, keep: impl Fn(&BlockInfo) -> bool, value: impl Fn(&BlockInfo) -> usize) -> usize {
        self.blocks.iter().filter(|b| keep(b)).map(value).sum()
    }

    /// Bytes of blocks handed out.
    pub fn allocated_size(&self) -> usize {
        self.sum(|b| b.state == BlockState::ActiveAllocated, |b| b.size)
    }

    /// Bytes of blocks handed out or waiting on events.
    pub fn active_size(&self) -> usize {
        self.sum(|b| b.state != BlockState::Inactive, |b| b.size)
    }

    /// Bytes asked for by the callers of active blocks.
    pub fn requested_size(&self) -> usize {
        self.sum(|b| b.state != BlockState::Inactive, |b| b.requested_size)
    }

    /// The segment as PyTorch's snapshot writes it.
    pub fn to_json(&self, device: usize) -> Value {
        let mut segment = json!({
            "device": device,
            "address": self.address,
            "total_size": self.total_size,
            "allocated_size": self.allocated_size(),
            "active_size": self.active_size(),
            "requested_size": self.requested_size(),
            "stream": self.stream,
            "segment_type": match self.pool { PoolKind::Small => "small", PoolKind::Large => "large" },
            "segment_pool_id": [self.pool_id.0, self.pool_id.1],
            "is_expandable": self.is_expandable,
            // PyTorch's records carry the Python stack here; accalloc has none, but the key keeps the
            // snapshot readable by PyTorch's memory visualizer.
            "frames": [],
            "blocks": self.blocks.iter().map(|b| json!({
                "address": b.address,
                "size": b.size,
                "requested_size": b.requested_size,
                "state": b.state.name(),
                "frames": [],
            })).collect::<Vec<_>>(),
        });
        // accalloc's own key, only on a segment with paused pages: otherwise the record is
        // PyTorch's, key for key.
        if self.paused_size > 0 {
            segment["paused_size"] = json!(self.paused_size);
        }
        if let Some((start, end)) = self.planned_range {
            segment["planned_range"] = json!([start, end]);
        }
        segment
    }
}

/// What happened, in PyTorch's trace-entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceAction {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
}

impl TraceAction {
    pub fn name(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
        }
    }
}

/// One entry of the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    pub action: TraceAction,
    /// The block or segment address (for an OOM: the device's free bytes, as PyTorch records).
    pub addr: usize,
    /// For alloc and free entries the size the caller asked for; for segments the segment's size.
    pub size: usize,
    pub stream: StreamId,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
}

impl TraceEntry {
    pub fn to_json(&self) -> Value {
        json!({
            "action": self.action.name(),
            "addr": self.addr,
            "size": self.size,
            "stream": self.stream,
            "time_us": self.time_us,
            "frames": [],
        })
    }
}

/// A ring buffer of the most recent trace entries.
#[derive(Clone, Debug)]
pub struct History {
    entries: VecDeque<TraceEntry>,
    capacity: usize,
}

impl History {
    /// Keep at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        History {
            entries: VecDeque::with_capacity(capacity.min(1 << 16)),
            capacity,
        }
    }

    pub fn record(&mut self, action: TraceAction, addr: usize, size: usize, stream: StreamId) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        let time_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        self.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us,
        });
    }

    pub fn entries(&self) -> impl Iterator<Item = &TraceEntry> {
        self.entries.iter()
    }
}

/// The settings as the snapshot's "allocator_settings" object.
pub fn settings_json(config: &CachingConfig) -> Value {
    let divisions: serde_json::Map<String, Value> = config
        .roundup_power2_divisions
        .iter()
        .enumerate()
        .map(|(bucket, &d)| ((1usize << bucket).to_string(), d.into()))
        .collect();
    json!({
        "ACCALLOC_CONF": config.to_settings_string(),
        "max_split_size": config.max_split_size_stat(),
        "max_non_split_rounding": config.max_non_split_rounding,
        "garbage_collection_threshold": config.garbage_collection_threshold,
        "expandable_segments": config.expandable_segments,
        "expandable_trim": config.expandable_trim,
        "release_lock_on_malloc": config.release_lock_on_malloc,
        "per_process_memory_fraction": config.per_process_memory_fraction,
        "roundup_power2_divisions": divisions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_the_newest_entries() {
        let mut history = History::new(2);
        history.record(TraceAction::Alloc, 1, 512, 0);
        history.record(TraceAction::FreeRequested, 1, 512, 0);
        history.record(TraceAction::FreeCompleted, 1, 512, 0);
        let actions: Vec<_> = history.entries().map(|e| e.action).collect();
        assert_eq!(
            actions,
            vec![TraceAction::FreeRequested, TraceAction::FreeCompleted]
        );
        assert!(history.entries().all(|e| e.time_us > 1_600_000_000_000_000));
    }

    #[test]
    fn segment_sizes_add_up_by_state() {
        let block = |address, size, requested_size, state| BlockInfo {
            address,
            size,
            requested_size,
            state,
        };
        let segment = SegmentInfo {
            address: 0x1000,
            total_size: 4096,
            stream: 0,
            pool: PoolKind::Small,
            pool_id: (0, 0),
            is_expandable: false,
            paused_size: 0,
            planned_range: None,
            blocks: vec![
                block(0x1000, 1024, 1000, BlockState::ActiveAllocated),
                block(0x1400, 512, 300, BlockState::ActivePendingFree),
                block(0x1600, 2560, 0, BlockState::Inactive),
            ],
        };
        assert_eq!(
            (
                segment.allocated_size(),
                segment.active_size(),
                segment.requested_size()
            ),
            (1024, 1536, 1300)
        );
        let json = segment.to_json(2);
        assert_eq!(json["segment_type"], "small");
        assert_eq!(json["device"], 2);
        assert_eq!(json["blocks"][1]["state"], "active_pending_free");
        // accalloc's own keys appear only where they say something: PyTorch's record otherwise.
        assert!(json.get("paused_size").is_none() && json.get("planned_range").is_none());
        let planned = SegmentInfo {
            planned_range: Some((0x1400, 0x1600)),
            ..segment
        };
        assert_eq!(planned.to_json(2)["planned_range"], json!([0x1400, 0x1600]));
    }
}
