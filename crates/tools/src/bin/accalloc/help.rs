//! The usage texts: the whole tool's (`accalloc --help`) and each command's (`accalloc COMMAND
//! --help`), made of the same pieces.

const INFO: &str =
    "  accalloc info                    the current accelerator, its devices and their capacity";

const REPLAY: &str = "  accalloc replay FILE [--json] [--simulate|--cuda|--backend LIB] [--config STR] [--svg FILE] [--snapshot FILE] [--summary] [--plan] [--reset-peaks-at N]
                                   replay an allocation trace through the allocator; FILE is
                                   accalloc's trace (JSON lines) or a PyTorch memory snapshot
                                   (torch.cuda.memory._dump_snapshot's pickle, or the same as JSON),
                                   told apart by content; prints the peaks and utilization (peak
                                   allocated / peak reserved), OOMs, retries, device calls, ns/op,
                                   and with planned_placement what the planner did
                                   --json: one JSON object with those figures and all 122 statistics
                                   --simulate: a simulated device (fake addresses handed out in
                                     rising order, no memory touched) instead of the host backend
                                   --cuda: the GPUs through the CUDA backend
                                   --backend LIB[:SYMBOL]: a backend written in C, from a shared
                                     library whose SYMBOL (default accalloc_backend_entry) fills an
                                     AccallocBackendVTable and names the backend
                                   --config: allocator settings (ACCALLOC_CONF syntax)
                                   --svg: write the memory timeline (allocated and reserved by pool)
                                   --snapshot: write the snapshot taken at peak reserved memory
                                   --summary: print memory_summary's table at the end
                                   --reset-peaks-at N: reset the peak statistics before
                                     operation N (from 0): the peaks then say what the rest of
                                     the trace needed, as after a long run's first steps
                                   --plan: what planned placement could reach, per device: the
                                     floor (most bytes live at once), the best offline placement
                                     of the whole trace and its steady period (its iteration);
                                     and the growth floor: the fewest map calls of 2 MiB pages
                                     any allocator makes if it keeps 0.99 (or 0.97) utilization
                                     wherever the trace could have stopped";

const TUNE: &str = "  accalloc tune FILE [--capacity SIZE] [--json] [--threads N] [--top N] [--frontier]
                                   replay under a search of the settings that matter, on all cores,
                                   on a simulated device; a ranked table (settings with the same
                                   figures folded into one row, the simplest shown) and the best
                                   settings as ACCALLOC_CONF=... and PYTORCH_ALLOC_CONF=... (PyTorch's
                                   keys only), each with its own run's figures
                                   --capacity: the GPU's memory (e.g. 80GiB): settings with an OOM
                                     there rank last; also tries garbage collection under a fraction
                                   --json: every candidate's figures; best.config is the setting
                                   --threads N: default all cores; --top N: rows shown, default 15
                                   --frontier: instead, expandable_trim's line from 0 to 0.2 of the
                                     peak beside plain expandable segments, the defaults and
                                     planned placement: utilization against device calls, and
                                     which are on the frontier";

const COMPARE: &str = "  accalloc compare FILE --config A [--config B ...] [--svg FILE] [--capacity SIZE] [--json]
                                   the figures of each setting side by side (one --config: against
                                   the defaults); --svg: one timeline with every run, each in its own
                                   colour, dash pattern and width";

const CONVERT: &str = "  accalloc convert FILE -o OUT [--config STR]
                                   OUT.jsonl: the trace of a snapshot (or trace); OUT.json or
                                   OUT.pickle: a PyTorch-format snapshot with the whole history of a
                                   simulated replay (what replay reads back with the same figures)";

const BENCH: &str =
    "  accalloc bench [--quick]         cached malloc+free pair against the C library's malloc+free;
                                   a planned request (planned_placement) against a cached one;
                                   a large step's plan made on threads against on one;
                                   the longest request while it is made, off the request
                                   path against at once;
                                   sleep and wake (pause, resume) against a plain copy";

const OTHERS: &str = "  accalloc --version               the version and ABI of this build
  accalloc help [COMMAND]          this text, or one command's (also: accalloc COMMAND --help, -h)";

const SNAPSHOTS: &str = "Snapshots (replay, tune, compare, convert):
  --device N                       only device N of the snapshot (default: every device with
                                   history, kept apart)
  --segment-free-as-empty-cache    replay each run of segment_free entries not ending in an OOM as
                                   an empty_cache (an explicit torch.cuda.empty_cache() leaves such
                                   a run; so does a release that let a request succeed on retry).
                                   Default: the allocator under replay makes its own releases.";

const SIZES: &str =
    "Sizes (--capacity, ACCALLOC_HOST_CAPACITY): a bare number is bytes (85899345920); units are
binary: B, KiB, MiB, GiB, TiB, any case (K, M, G, T are the same binary units). KB, MB, GB and TB
are refused as ambiguous (powers of 1000 or of 1024?). --capacity refuses a bare number under
1 MiB as a forgotten unit (80 would be 80 bytes: write 80GiB, or 80B if bytes are meant);
ACCALLOC_HOST_CAPACITY takes what the library takes (512 bytes or more), with a note when a bare
number is under 1 MiB. The capacity understood is printed with the figures.";

const ENVIRONMENT: &str = "Environment (checked by every command before it starts, help and version aside: a bad value
is an error naming it, an unknown ACCALLOC_ name close to one of these a warning):
  ACCALLOC_CONF          allocator settings, PYTORCH_ALLOC_CONF's syntax (replay: --config's keys
                         override the same keys here; tune, compare and convert choose their own
                         settings: checked, not applied)
  ACCALLOC_DEVICE        host or cuda: force the accelerator (replay: the backend, unless --simulate,
                         --cuda or --backend chooses)
  ACCALLOC_HOST_CAPACITY bytes each host device may hold, e.g. 8GiB (default: physical memory)
  ACCALLOC_HOST_DEVICES  how many host devices, 1 to 64 (default 1)
  ACCALLOC_HOST_FAIL     inject host failures, for tests: alloc:every=N or alloc:after=N (allocations
                         and mappings), event:every=N or event:after=N (event and stream calls)
  ACCALLOC_TRACE         write every malloc, free, empty_cache and record_stream of the process to
                         this file (\"%p\": the process id), as a trace replay and tune read; a file
                         that cannot be created is an error. info and bench run on the library and
                         record; replay, tune, compare and convert run allocators of their own and
                         record nothing (accalloc convert FILE -o OUT.jsonl writes a file's trace)";

/// The commands, with their part of the usage and the sections that concern them.
const COMMANDS: [(&str, &str, bool, bool); 6] = [
    // (name, usage, reads snapshots, reads a size: --capacity or ACCALLOC_HOST_CAPACITY)
    ("info", INFO, false, true),
    ("replay", REPLAY, true, true),
    ("tune", TUNE, true, true),
    ("compare", COMPARE, true, true),
    ("convert", CONVERT, true, false),
    ("bench", BENCH, false, false),
];

/// Whether `name` is one of the tool's commands.
pub fn is_command(name: &str) -> bool {
    COMMANDS.iter().any(|(command, ..)| *command == name)
}

/// The whole tool's usage.
pub fn usage() -> String {
    let commands: Vec<&str> = COMMANDS.iter().map(|(_, text, ..)| *text).collect();
    format!(
        "usage:\n{}\n{OTHERS}\n\n{SNAPSHOTS}\n\n{SIZES}\n\n{ENVIRONMENT}",
        commands.join("\n")
    )
}

/// One command's usage (None for a name that is not a command).
pub fn command_usage(name: &str) -> Option<String> {
    let &(_, text, snapshots, sizes) = COMMANDS.iter().find(|(command, ..)| *command == name)?;
    let mut out = format!("usage:\n{text}\n");
    if snapshots {
        out.push_str(&format!("\n{SNAPSHOTS}\n"));
    }
    if sizes {
        out.push_str(&format!("\n{SIZES}\n"));
    }
    out.push_str(&format!("\n{ENVIRONMENT}"));
    Some(out)
}
