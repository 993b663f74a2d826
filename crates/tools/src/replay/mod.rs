//! The tools over the library. The what-if tools read an allocation trace or a PyTorch memory
//! snapshot, replay it through fresh caching allocators, search the settings, compare two of them,
//! and draw the memory timeline; the benchmark times the hot path against the C library's malloc.
//!
//! - `trace`: accalloc's JSON-lines trace format, read and written (the core's, re-exported)
//! - `snapshot`: PyTorch snapshots (torch.cuda.memory._snapshot) as traces, and back
//! - `input`: which of those a file holds (by content), pickles included
//! - `session`: the replay itself and what it measures
//! - `tune`: the search over the settings that matter, on all cores
//! - `compare`: two settings side by side
//! - `timeline`: the SVG picture of one or two replays
//! - `bench`: the cached malloc + free pair through the C ABI (`accalloc bench`, `cargo bench`)

pub mod bench;
pub mod compare;
pub mod input;
pub mod plan;
pub mod plan_bench;
pub mod session;
pub mod sleep_bench;
pub mod snapshot;
pub mod timeline;
pub mod tune;

/// accalloc's trace format, whose one owner is the core (accalloc_core::trace).
pub use accalloc_core::trace;

pub use input::{read_workload, InputFormat, Workload};
pub use session::{replay, replay_with, ReplayOptions, ReplayReport, TimelinePoint};
pub use snapshot::{read_snapshot, snapshot_of_trace, SnapshotImport, SnapshotOptions};
pub use trace::{parse_trace, trace_to_jsonl, TraceOp};
