//! The accalloc command-line tool: `info`, `replay`, `tune`, `compare`, `convert`, `bench`.

mod args;
mod backends;
mod input;
mod replay_cmd;
mod tools;

use accalloc::runtime::runtime;
use accalloc::units::format_size;
use std::process::ExitCode;

const USAGE: &str = "usage:
  accalloc info                    the current accelerator, its devices and their capacity
  accalloc replay FILE [--json] [--simulate|--cuda|--backend LIB] [--config STR] [--svg FILE] [--snapshot FILE] [--summary]
                                   replay an allocation trace through the allocator; FILE is
                                   accalloc's trace (JSON lines) or a PyTorch memory snapshot
                                   (torch.cuda.memory._dump_snapshot's pickle, or the same as JSON),
                                   told apart by content;
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
  accalloc tune FILE [--capacity BYTES] [--json] [--threads N] [--top N] [--frontier]
                                   replay under a search of the settings that matter, on all cores,
                                   on a simulated device; a ranked table and the best settings as
                                   ACCALLOC_CONF=... and PYTORCH_ALLOC_CONF=... (PyTorch's keys only)
                                   --frontier: instead, expandable_trim's line from 0 to 0.2 of the
                                     peak beside plain expandable segments and the defaults:
                                     utilization against device calls, and which are on the frontier
                                   --capacity: the GPU's memory (e.g. 80GiB): settings with an OOM
                                     there rank last; also tries garbage collection under a fraction
                                   --json: every candidate's figures; best.config is the setting
  accalloc compare FILE --config A [--config B ...] [--svg FILE] [--capacity BYTES] [--json]
                                   the figures of each setting side by side (one --config: against
                                   the defaults); --svg: one timeline with every run
  accalloc convert FILE -o OUT [--config STR]
                                   OUT.jsonl: the trace of a snapshot (or trace); OUT.json or
                                   OUT.pickle: a PyTorch-format snapshot with the whole history of a
                                   simulated replay (what replay reads back with the same figures)
  accalloc bench [--quick]         cached malloc+free pair against the C library's malloc+free
  accalloc --version               the version and ABI of this build

Snapshots (replay, tune, compare, convert):
  --device N                       only device N of the snapshot (default: every device with
                                   history, kept apart)
  --segment-free-as-empty-cache    replay each run of segment_free entries not ending in an OOM as
                                   an empty_cache (an explicit torch.cuda.empty_cache() leaves such
                                   a run; so does a release that let a request succeed on retry).
                                   Default: the allocator under replay makes its own releases.

Environment (read by the library and by every command; a bad value is an error naming it):
  ACCALLOC_CONF          allocator settings, PYTORCH_ALLOC_CONF's syntax (replay: --config's keys
                         override the same keys here)
  ACCALLOC_DEVICE        host or cuda: force the accelerator (replay: the backend, unless --simulate,
                         --cuda or --backend chooses)
  ACCALLOC_HOST_CAPACITY bytes each host device may hold, e.g. 8GiB (default: physical memory)
  ACCALLOC_HOST_DEVICES  how many host devices, 1 to 64 (default 1)
  ACCALLOC_HOST_FAIL     inject host failures, for tests: alloc:every=N or alloc:after=N (allocations
                         and mappings), event:every=N or event:after=N (event and stream calls)
  ACCALLOC_TRACE         write every malloc, free, empty_cache and record_stream of the process to
                         this file, as a trace replay and tune read";

fn main() -> ExitCode {
    // Output piped into `head` and closed: end quietly, as other command-line tools do, instead of
    // panicking on the failed print (Rust ignores SIGPIPE by default).
    // SAFETY: restoring the default disposition of one signal before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let with_usage = |result: Result<(), String>| result.map_err(|e| format!("{e}\n{USAGE}"));
    let result = match args.first().map(String::as_str) {
        Some("info") if args.len() == 1 => info(),
        Some("replay") => replay_cmd::replay_command(&args[1..]).map_err(usage_if_args),
        Some("tune") => tools::tune_command(&args[1..]).map_err(usage_if_args),
        Some("compare") => tools::compare_command(&args[1..]).map_err(usage_if_args),
        Some("convert") => tools::convert_command(&args[1..]).map_err(usage_if_args),
        Some("bench") if args.len() <= 2 => bench(args.get(1).map(String::as_str)),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some("-V" | "--version" | "version") => {
            println!("{}", version_line());
            return ExitCode::SUCCESS;
        }
        Some(command @ ("info" | "bench")) => {
            with_usage(Err(format!("too many arguments for '{command}'")))
        }
        Some(unknown) => with_usage(Err(format!("unknown command '{unknown}'"))),
        None => with_usage(Err("no command given".to_string())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("accalloc: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Mistakes in the arguments get the usage text after them; errors in a file or a run do not.
fn usage_if_args(message: String) -> String {
    let about_arguments = message.starts_with("unknown option")
        || message.contains("needs a")
        || message.contains("takes one file");
    if about_arguments {
        format!("{message}\n{USAGE}")
    } else {
        message
    }
}

fn info() -> Result<(), String> {
    let runtime = runtime().map_err(|e| e.message)?;
    let accelerator = runtime.current();
    println!("accelerator: {}", accelerator.name());
    if let Some(why) = runtime.cuda_absent_because() {
        println!("cuda: not in use ({why})");
    }
    println!("devices: {}", accelerator.device_count());
    for device in 0..accelerator.device_count() {
        let info = accelerator
            .mem_get_info(device as i32)
            .map_err(|e| e.message)?;
        println!(
            "device {device}: capacity {} ({} bytes), free {}",
            format_size(info.total as u64),
            info.total,
            format_size(info.free as u64)
        );
    }
    println!("{}", version_line());
    Ok(())
}

fn version_line() -> String {
    format!(
        "accalloc {} (ABI {})",
        env!("CARGO_PKG_VERSION"),
        accalloc::capi::ACCALLOC_ABI_VERSION
    )
}

fn bench(option: Option<&str>) -> Result<(), String> {
    let (batches, pairs) = match option {
        None => (101, 20_000),
        Some("--quick") => (11, 2_000),
        Some(other) => return Err(format!("unknown option {other}\n{USAGE}")),
    };
    runtime().map_err(|e| e.message)?;
    let rows = accalloc::replay::bench::run(batches, pairs);
    println!("median of {batches} batches of {pairs} malloc+free pairs, host backend, one thread");
    print!("{}", accalloc::replay::bench::table(&rows));
    // Last of the one-thread rows: putting other devices in use gives the one-device shortcut up.
    if let Some((shortcut, general)) = accalloc::replay::bench::general_path(batches, pairs) {
        println!("\nthe mixed pairs on device 0: the one-device shortcut against the general path (the shortcut suspended), in turns");
        println!("| path | accalloc malloc+free (ns) | / the shortcut |\n|---|---:|---:|");
        println!("| one device in use (the shortcut) | {shortcut:.1} | 1.00 |");
        println!(
            "| general path, same device | {general:.1} | {:.2} |",
            general / shortcut
        );
        for (devices, ns) in accalloc::replay::bench::several_devices(batches, pairs) {
            println!(
                "| {devices} devices in use (several devices in use) | {ns:.1} | {:.2} |",
                ns / shortcut
            );
        }
    }

    // Several threads: one device (one lock) against one device each (ACCALLOC_HOST_DEVICES permitting).
    let devices = runtime().map_err(|e| e.message)?.current().device_count();
    // Long enough (a million pairs a thread by default) for the scheduler to have spread the threads.
    let threaded_pairs = pairs * 50;
    println!("\nthreads, wall-clock ns per pair (mixed sizes, {threaded_pairs} pairs a thread, best of 3; {} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("| threads | same device | one device each |\n|---:|---:|---:|");
    for threads in [1usize, 2, 4] {
        let same = accalloc::replay::bench::threaded(threads, threaded_pairs, |_| 0);
        let separate = if devices >= threads {
            format!(
                "{:.1}",
                accalloc::replay::bench::threaded(threads, threaded_pairs, |t| t as i32)
            )
        } else {
            format!("(needs ACCALLOC_HOST_DEVICES={threads})")
        };
        println!("| {threads} | {same:.1} | {separate} |");
    }
    Ok(())
}
