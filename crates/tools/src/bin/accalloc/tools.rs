//! `accalloc tune`, `accalloc compare` and `accalloc convert`.

use crate::args::Args;
use crate::environment::describe_capacity;
use crate::input::{load, EMPTY_CACHE_FLAG};
use accalloc::backend::simulated::SimulatedBackend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::CachingConfig;
use accalloc::units::format_size;
use accalloc_tools::replay::compare::{compare, comparison_table};
use accalloc_tools::replay::input::json_to_pickle;
use accalloc_tools::replay::plan::plan_bounds;
use accalloc_tools::replay::timeline::comparison_svg;
use accalloc_tools::replay::tune::{
    default_candidates, fold_equivalent, frontier_candidates, on_frontier, tune, Candidate,
    Outcome, FRONTIER_TRIM_SLACKS, UNLIMITED_CAPACITY,
};
use accalloc_tools::replay::{snapshot_of_trace, trace_to_jsonl, TraceOp};
use serde_json::json;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Instant;

const SNAPSHOT_FLAGS: [&str; 1] = [EMPTY_CACHE_FLAG];

fn with_snapshot_flags<'a>(switches: &[&'a str]) -> Vec<&'a str> {
    switches.iter().copied().chain(SNAPSHOT_FLAGS).collect()
}

/// How many devices a trace uses.
fn devices_used(ops: &[TraceOp]) -> usize {
    ops.iter()
        .filter_map(|op| match op {
            TraceOp::Alloc { device, .. } => Some(device + 1),
            _ => None,
        })
        .max()
        .unwrap_or(1)
}

fn print_import(workload: &accalloc_tools::replay::Workload) {
    if let Some(import) = &workload.import {
        eprintln!("{}", import.describe());
    }
}

/// A progress bar on standard error, drawn only when that is a terminal.
struct Progress {
    shown: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            shown: std::io::stderr().is_terminal(),
        }
    }

    fn update(&self, done: usize, total: usize) {
        if !self.shown {
            return;
        }
        let width = 40;
        let filled = done * width / total.max(1);
        eprint!(
            "\r[{}{}] {done}/{total}",
            "#".repeat(filled),
            " ".repeat(width - filled)
        );
        if done == total {
            eprint!("\r{}\r", " ".repeat(width + 24));
        }
        let _ = std::io::stderr().flush();
    }
}

fn outcome_json(outcome: &Outcome) -> serde_json::Value {
    json!({
        "config": outcome.candidate.accalloc_conf(),
        "pytorch_config": outcome.candidate.pytorch_conf(),
        "pytorch_can_run": outcome.candidate.pytorch_can_express(),
        "memory_fraction": outcome.candidate.garbage_collection.map(|(_, f)| f),
        "peak_allocated_bytes": outcome.peak_allocated,
        "peak_reserved_bytes": outcome.peak_reserved,
        "utilization": outcome.utilization(),
        "ooms": outcome.ooms,
        "alloc_retries": outcome.alloc_retries,
        "device_allocs": outcome.device_allocs,
        "device_frees": outcome.device_frees,
        "ns_per_op": outcome.ns_per_op,
        "fits": outcome.fits,
    })
}

fn label(conf: &str) -> &str {
    if conf.is_empty() {
        "(defaults)"
    } else {
        conf
    }
}

/// One run's figures for a summary line: every figure from that run.
fn run_figures(outcome: &Outcome, capacity: usize) -> String {
    let mut text = format!(
        "peak allocated {}, peak reserved {}, utilization {:.3}, {} device calls",
        format_size(outcome.peak_allocated.max(0) as u64),
        format_size(outcome.peak_reserved.max(0) as u64),
        outcome.utilization(),
        outcome.device_calls()
    );
    if !outcome.fits {
        text.push_str(&format!(
            ", {} OOM(s): does NOT fit in {}",
            outcome.ooms,
            describe_capacity(capacity)
        ));
    }
    text
}

/// The line to paste into PyTorch's environment for `candidate`.
fn pytorch_line(candidate: &Candidate) -> String {
    let mut line = format!("PYTORCH_ALLOC_CONF={}", candidate.pytorch_conf());
    if let Some((_, fraction)) = candidate.garbage_collection {
        line.push_str(&format!(
            "   # with torch.cuda.set_per_process_memory_fraction({fraction})"
        ));
    }
    line
}

pub fn tune_command(args: &[String]) -> Result<(), String> {
    let args = Args::parse(
        args,
        &with_snapshot_flags(&["--json", "--frontier"]),
        &["--capacity", "--threads", "--top", "--device"],
    )?;
    let path = args.one_file("tune")?;
    let capacity = args.capacity("--capacity")?;
    let threads = match args.value("--threads") {
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("--threads: '{text}' is not a positive number"))?,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let top = match args.value("--top") {
        Some(text) => text
            .parse::<usize>()
            .map_err(|_| format!("--top: '{text}' is not a number"))?,
        None => 15,
    };
    let workload = load(path, &args)?;
    print_import(&workload);
    if args.has("--frontier") {
        return frontier_command(path, &workload.ops, capacity, threads, args.has("--json"));
    }
    let candidates = default_candidates(capacity.is_some());
    let progress = Progress::new();
    let start = Instant::now();
    let ranked = tune(
        &workload.ops,
        &candidates,
        capacity.unwrap_or(UNLIMITED_CAPACITY),
        threads,
        |done, total| progress.update(done, total),
    )
    .map_err(|e| e.message)?;
    let seconds = start.elapsed().as_secs_f64();
    let best = &ranked[0];
    let best_pytorch = ranked
        .iter()
        .find(|o| o.candidate.pytorch_can_express())
        .unwrap_or(best);
    let defaults = ranked
        .iter()
        .find(|o| o.candidate == Candidate::DEFAULT)
        .unwrap_or(best);
    if args.has("--json") {
        let object = json!({
            "trace": path,
            "input_format": workload.format.name(),
            "operations": workload.ops.len(),
            "capacity_bytes": capacity,
            "threads": threads,
            "seconds": seconds,
            "best": outcome_json(best),
            "best_pytorch": outcome_json(best_pytorch),
            "defaults": outcome_json(defaults),
            "distinct_outcomes": fold_equivalent(&ranked).len(),
            "candidates": ranked.iter().map(outcome_json).collect::<Vec<_>>(),
        });
        println!("{object}");
        return Ok(());
    }
    let rows = fold_equivalent(&ranked);
    println!(
        "tune: {path}: {} operations, {} settings on {threads} thread(s) in {seconds:.1} s, simulated \
         device{}",
        workload.ops.len(),
        candidates.len(),
        match capacity {
            Some(c) => format!(
                " of {}, read from --capacity {}: a setting with an OOM there ranks last",
                describe_capacity(c),
                args.value("--capacity").unwrap_or_default().trim()
            ),
            None => " without a capacity (give --capacity SIZE to rank OOMs last and try garbage collection)".to_string(),
        }
    );
    println!(
        "\n| rank | settings | folded | peak allocated | peak reserved | utilization | OOMs | retries | device allocs | device frees | ns/op |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (rank, &(index, count)) in rows.iter().enumerate() {
        let outcome = &ranked[index];
        let is_default = outcome.candidate == Candidate::DEFAULT;
        if rank >= top && !is_default {
            continue;
        }
        println!(
            "| {} | `{}` | {} | {} | {} | {:.3} | {} | {} | {} | {} | {:.0} |",
            rank + 1,
            label(&outcome.candidate.accalloc_conf()),
            if count > 1 {
                format!("+{}", count - 1)
            } else {
                String::new()
            },
            format_size(outcome.peak_allocated.max(0) as u64),
            format_size(outcome.peak_reserved.max(0) as u64),
            outcome.utilization(),
            outcome.ooms,
            outcome.alloc_retries,
            outcome.device_allocs,
            outcome.device_frees,
            outcome.ns_per_op
        );
    }
    println!(
        "\n{} settings, {} distinct outcomes: each row is the simplest of the settings with the same \
         figures (all but ns/op); folded: how many more it stands for (--json lists every setting)",
        ranked.len(),
        rows.len()
    );
    let searched = capacity.unwrap_or(UNLIMITED_CAPACITY);
    println!(
        "\ndefaults:         PyTorch's, no settings   ({})",
        run_figures(defaults, searched)
    );
    println!(
        "best:             ACCALLOC_CONF={}   ({})",
        best.candidate.accalloc_conf(),
        run_figures(best, searched)
    );
    println!(
        "best for PyTorch: {}   ({})",
        pytorch_line(&best_pytorch.candidate),
        run_figures(best_pytorch, searched)
    );
    // How far the best setting is from what planning the trace's addresses could reach.
    for bound in plan_bounds(&workload.ops, &CachingConfig::default()) {
        let repeats = match bound.period {
            Some((events, times)) => {
                format!("its longest exact repetition: {events} requests, {times} times in a row")
            }
            None => "no run of its requests repeats exactly".to_string(),
        };
        println!(
            "planning bound:   device {}: the best offline placement of the whole trace needs {} \
             (utilization {:.3}; the floor is {}); {repeats} (accalloc replay FILE --plan)",
            bound.device,
            format_size(bound.placed as u64),
            bound.utilization(),
            format_size(bound.floor as u64),
        );
    }
    Ok(())
}

/// `tune --frontier`: the trim line from FRONTIER_TRIM_SLACKS beside plain expandable segments and
/// the defaults, utilization against device calls.
fn frontier_command(
    path: &str,
    ops: &[TraceOp],
    capacity: Option<usize>,
    threads: usize,
    as_json: bool,
) -> Result<(), String> {
    let candidates = frontier_candidates(&FRONTIER_TRIM_SLACKS);
    let mut outcomes = tune(
        ops,
        &candidates,
        capacity.unwrap_or(UNLIMITED_CAPACITY),
        threads,
        |_, _| {},
    )
    .map_err(|e| e.message)?;
    // In the candidates' order: defaults, plain expandable, then the lines from low to high.
    outcomes.sort_by_key(|o| candidates.iter().position(|c| *c == o.candidate));
    let frontier = on_frontier(&outcomes);
    let plain_calls = outcomes[1].device_calls().max(1);
    if as_json {
        let points: Vec<_> = outcomes
            .iter()
            .zip(&frontier)
            .map(|(o, &on)| {
                let mut point = outcome_json(o);
                point["on_frontier"] = json!(on);
                point["trim_slack"] = json!(o.candidate.trim_slack);
                point
            })
            .collect();
        println!("{}", json!({ "trace": path, "points": points }));
        return Ok(());
    }
    println!(
        "frontier: {path}: peak allocated {}; utilization (peak allocated / peak reserved) against \
         device calls (maps + unmaps, or segment allocations + frees)",
        format_size(outcomes[0].peak_allocated.max(0) as u64)
    );
    println!("\n| settings | peak reserved | utilization | device calls | / plain expandable's | frontier |");
    println!("|---|---:|---:|---:|---:|:---:|");
    for (o, &on) in outcomes.iter().zip(&frontier) {
        println!(
            "| `{}` | {} | {:.3} | {} | {:.2} | {} |",
            label(&o.candidate.accalloc_conf()),
            format_size(o.peak_reserved.max(0) as u64),
            o.utilization(),
            o.device_calls(),
            o.device_calls() as f64 / plain_calls as f64,
            if on { "yes" } else { "" }
        );
    }
    Ok(())
}

pub fn compare_command(args: &[String]) -> Result<(), String> {
    let args = Args::parse(
        args,
        &with_snapshot_flags(&["--json"]),
        &["--config", "--svg", "--capacity", "--device"],
    )?;
    let path = args.one_file("compare")?;
    let mut texts: Vec<String> = args.all("--config").to_vec();
    match texts.len() {
        0 => {
            return Err(
                "compare needs --config A (and --config B; one is compared with the defaults)"
                    .into(),
            )
        }
        1 => texts.insert(0, String::new()),
        _ => {}
    }
    let configs = texts
        .iter()
        .map(|text| {
            parse_settings(text, &CachingConfig::default())
                .map_err(|e| format!("--config '{text}': {}", e.message))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let workload = load(path, &args)?;
    print_import(&workload);
    let given_capacity = args.capacity("--capacity")?;
    let capacity = given_capacity.unwrap_or(UNLIMITED_CAPACITY);
    let reports = compare(&workload.ops, &configs, capacity).map_err(|e| e.message)?;
    let mut written = None;
    if let Some(svg) = args.value("--svg") {
        let runs: Vec<(&str, &[accalloc_tools::replay::TimelinePoint])> = texts
            .iter()
            .zip(&reports)
            .map(|(text, report)| (text.as_str(), report.timeline.as_slice()))
            .collect();
        std::fs::write(svg, comparison_svg(&runs, path))
            .map_err(|e| format!("cannot write {svg}: {e}"))?;
        written = Some(format!(
            "wrote {svg} (the timeline of the {} runs)",
            runs.len()
        ));
    }
    if args.has("--json") {
        let runs: Vec<serde_json::Value> = texts
            .iter()
            .zip(&reports)
            .map(|(text, r)| {
                let mut run = r.figures_json();
                run["config"] = json!(text);
                run
            })
            .collect();
        println!(
            "{}",
            json!({"trace": path, "capacity_bytes": given_capacity, "runs": runs})
        );
        // Standard output is one JSON object: the file written is told on standard error.
        if let Some(line) = written {
            eprintln!("accalloc: {line}");
        }
    } else {
        match given_capacity {
            Some(c) => println!(
                "compare: {path}, simulated device of {}\n",
                describe_capacity(c)
            ),
            None => println!("compare: {path}, simulated device\n"),
        }
        print!("{}", comparison_table(&texts, &reports));
        if let Some(line) = written {
            println!("\n{line}");
        }
    }
    Ok(())
}

pub fn convert_command(args: &[String]) -> Result<(), String> {
    let args = Args::parse(
        args,
        &with_snapshot_flags(&[]),
        &["-o", "--output", "--config", "--device"],
    )?;
    let path = args.one_file("convert")?;
    let output = args
        .value("-o")
        .or(args.value("--output"))
        .ok_or("convert needs -o OUTPUT (.jsonl: a trace; .json or .pickle: a snapshot)")?;
    let workload = load(path, &args)?;
    print_import(&workload);
    let ops = &workload.ops;
    let bytes = if output.ends_with(".jsonl") {
        trace_to_jsonl(ops).into_bytes()
    } else if output.ends_with(".json") || output.ends_with(".pickle") || output.ends_with(".pkl") {
        let config = match args.value("--config") {
            Some(text) => parse_settings(text, &CachingConfig::default())
                .map_err(|e| format!("--config: {}", e.message))?,
            None => CachingConfig::default(),
        };
        let backend = Arc::new(SimulatedBackend::new(devices_used(ops), UNLIMITED_CAPACITY));
        let snapshot = snapshot_of_trace(ops, backend, &config).map_err(|e| e.message)?;
        if output.ends_with(".json") {
            snapshot.to_string().into_bytes()
        } else {
            json_to_pickle(&snapshot).map_err(|e| e.message)?
        }
    } else {
        return Err(format!(
            "-o {output}: name the output .jsonl (a trace), .json or .pickle (a snapshot)"
        ));
    };
    std::fs::write(output, bytes).map_err(|e| format!("cannot write {output}: {e}"))?;
    println!(
        "{output}: {} operations from {path} ({})",
        ops.len(),
        workload.format.name()
    );
    Ok(())
}
