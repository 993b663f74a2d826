//! `accalloc replay FILE`: one replay, its figures, and optionally its pictures.

use crate::args::Args;
use crate::backends::{cuda_backend, forced_device, load_backend, replay_config};
use crate::input::{load, snapshot_json};
use accalloc::backend::host::{HostBackend, CAPACITY_VAR};
use accalloc::backend::simulated::SimulatedBackend;
use accalloc::backend::Backend;
use accalloc::caching::summary::memory_summary;
use accalloc::caching::Stat;
use accalloc::runtime::DEVICE_VAR;
use accalloc::units::format_size;
use accalloc_tools::replay::timeline::timeline_svg;
use accalloc_tools::replay::{replay_with, ReplayOptions, ReplayReport, Workload};
use std::sync::Arc;

pub fn replay_command(args: &[String]) -> Result<(), String> {
    let args = Args::parse(
        args,
        &[
            "--json",
            "--simulate",
            "--cuda",
            "--summary",
            "--plan",
            crate::input::EMPTY_CACHE_FLAG,
        ],
        &[
            "--backend",
            "--config",
            "--svg",
            "--snapshot",
            "--device",
            "--reset-peaks-at",
        ],
    )?;
    let path = args.one_file("replay")?;
    let reset_peaks_at = match args.value("--reset-peaks-at") {
        None => None,
        Some(text) => Some(text.parse::<usize>().map_err(|_| {
            format!("--reset-peaks-at takes an operation's index (a whole number), not {text:?}")
        })?),
    };
    let config_text = args.value("--config");
    let config = replay_config(config_text)?;
    let forced = forced_device()?;
    let workload = load(path, &args)?;
    let environment = accalloc::runtime::Environment::read();
    let settings = environment.host_settings().map_err(|e| e.message)?;
    // The devices as the user set them: which capacity was understood, and from where.
    let devices = |kind: &str| {
        let source = match &environment.host_capacity {
            Some(text) => format!("{CAPACITY_VAR}={}", text.trim()),
            None => "the machine's physical memory".to_string(),
        };
        format!(
            "{kind}, {} device(s) of {} ({} bytes; {source})",
            settings.devices,
            format_size(settings.capacity as u64),
            settings.capacity
        )
    };
    let (backend, described): (Arc<dyn Backend>, String) =
        if let Some(spec) = args.value("--backend") {
            let backend = load_backend(spec)?;
            let name = format!("{} (--backend {spec})", backend.name());
            (backend, name)
        } else if args.has("--simulate") {
            let backend = SimulatedBackend::new(settings.devices, settings.capacity);
            (Arc::new(backend), devices("simulated"))
        } else if args.has("--cuda") {
            (cuda_backend("--cuda")?, "cuda".to_string())
        } else if forced.as_deref() == Some("cuda") {
            let backend = cuda_backend(&format!("{DEVICE_VAR}=cuda"))?;
            (backend, format!("cuda ({DEVICE_VAR}=cuda)"))
        } else {
            (Arc::new(HostBackend::new(settings)), devices("host"))
        };
    let svg_path = args.value("--svg");
    let snapshot_path = args.value("--snapshot");
    let options = ReplayOptions {
        timeline: svg_path.is_some(),
        snapshot_at_peak: snapshot_path.is_some(),
        reset_peaks_at,
        ..ReplayOptions::default()
    };
    let report = replay_with(&workload.ops, backend, &config, options).map_err(|e| e.message)?;
    let mut written = Vec::new();
    if let Some(svg) = svg_path {
        let title = match config_text {
            Some(text) => format!("{path} ({text})"),
            None => path.to_string(),
        };
        std::fs::write(svg, timeline_svg(&report.timeline, &title))
            .map_err(|e| format!("cannot write {svg}: {e}"))?;
        written.push(format!("wrote {svg} (the memory timeline)"));
    }
    if let (Some(file), Some(snapshot)) = (snapshot_path, &report.snapshot) {
        // Streamed to the file, not built as one string first.
        let out = std::fs::File::create(file).map_err(|e| format!("cannot write {file}: {e}"))?;
        let mut out = std::io::BufWriter::new(out);
        serde_json::to_writer(&mut out, snapshot)
            .map_err(|e| e.to_string())
            .and_then(|()| std::io::Write::flush(&mut out).map_err(|e| e.to_string()))
            .map_err(|e| format!("cannot write {file}: {e}"))?;
        written.push(format!(
            "wrote {file} (the snapshot at peak reserved memory)"
        ));
    }
    if args.has("--json") {
        println!("{}", report_json(path, &workload, &described, &report));
        // Standard output is one JSON object: the files written are told on standard error.
        for line in &written {
            eprintln!("accalloc: {line}");
        }
    } else {
        print_report(path, &workload, &described, &report);
        for line in &written {
            println!("{line}");
        }
    }
    if args.has("--plan") {
        // What planned placement could reach: the floor and the best offline placement.
        for bound in accalloc_tools::replay::plan::plan_bounds(&workload.ops, &config) {
            let period = match bound.period {
                Some((events, times)) => format!("{events} events, {times} times in a row"),
                None => "none".to_string(),
            };
            println!(
                "plan bound, device {}: {} blocks; floor {} ({}); offline placement {} ({}, {}), utilization {:.3} of it; steady period: {period}",
                bound.device,
                bound.blocks,
                format_size(bound.floor as u64),
                bound.floor,
                format_size(bound.placed as u64),
                bound.placed,
                bound.order.name(),
                bound.utilization(),
            );
            let growth: Vec<String> = bound
                .growth_calls
                .iter()
                .map(|(utilization, calls)| format!("{calls} at {utilization:.2}"))
                .collect();
            println!(
                "growth floor, device {}: map calls any allocator of 2 MiB pages makes if it keeps \
                 that utilization wherever the trace could have stopped: {}",
                bound.device,
                growth.join(", "),
            );
        }
    }
    if args.has("--summary") {
        for (device, stats) in report.device_stats.iter().enumerate() {
            print!(
                "{}",
                // A trace has no sleep and wake: nothing is ever paused in a replay.
                memory_summary(stats, &Stat::default(), device, "accalloc replay", false)
            );
        }
    }
    Ok(())
}

fn print_report(path: &str, workload: &Workload, backend: &str, r: &ReplayReport) {
    println!("trace: {path} ({})", workload.format.name());
    println!("backend: {backend}");
    if let Some(import) = &workload.import {
        println!("{}", import.describe());
    }
    println!(
        "operations: {} ({} allocs, {} frees)",
        r.operations, r.allocs, r.frees
    );
    println!(
        "peak allocated: {} ({} bytes)",
        format_size(r.peak_allocated() as u64),
        r.peak_allocated()
    );
    println!(
        "peak reserved:  {} ({} bytes)",
        format_size(r.peak_reserved() as u64),
        r.peak_reserved()
    );
    println!(
        "utilization (peak allocated / peak reserved): {:.3}",
        r.utilization()
    );
    println!("OOMs: {}   retries: {}", r.ooms, r.alloc_retries());
    if r.stream_uses_skipped > 0 {
        println!(
            "record_stream: {} skipped (the backend has no events)",
            r.stream_uses_skipped
        );
    }
    println!(
        "device allocations: {}   device frees: {}",
        r.device_allocs(),
        r.device_frees()
    );
    println!(
        "time per operation: {:.1} ns (malloc {:.1} ns, free {:.1} ns)",
        r.ns_per_op(),
        r.ns_per_malloc(),
        r.ns_per_free()
    );
    for (device, planner) in r.planners.iter().enumerate() {
        let Some(c) = planner else { continue };
        println!(
            "planned placement, device {device}: {} plans made ({} tried, {} dropped), {} requests \
             given a planned address ({} of them taken, served by the policy; {} served from the \
             block parked there); a plan in force at the end: {}",
            c.plans,
            c.attempts,
            c.dropped,
            c.advised,
            c.conflicts,
            c.from_parked,
            if c.in_force { "yes" } else { "no" }
        );
        if c.height > 0 {
            // How far the latest plan's placement is from the least any placement of it needs.
            println!(
                "latest plan, device {device}: spans {} of its segment; its floor (the most its \
                 step's blocks and the long-lived blocks around them hold at once) is {}",
                format_size(c.height),
                format_size(c.floor)
            );
        }
    }
}

fn report_json(path: &str, workload: &Workload, backend: &str, r: &ReplayReport) -> String {
    let flat = |s: &accalloc::caching::DeviceStats| {
        serde_json::Value::Object(s.flat().into_iter().map(|(k, v)| (k, v.into())).collect())
    };
    let mut object = r.figures_json();
    let more = serde_json::json!({
        "trace": path,
        "input_format": workload.format.name(),
        "backend": backend,
        "operations": r.operations,
        "allocs": r.allocs,
        "frees": r.frees,
        "ns_per_malloc": r.ns_per_malloc(),
        "ns_per_free": r.ns_per_free(),
        "devices": r.device_stats.len(),
        "stats": flat(&r.device_stats[0]),
    });
    if let (Some(object), serde_json::Value::Object(more)) = (object.as_object_mut(), more) {
        object.extend(more);
    }
    if let Some(import) = &workload.import {
        object["snapshot"] = snapshot_json(import);
    }
    if r.device_stats.len() > 1 {
        object["stats_by_device"] = r.device_stats.iter().map(flat).collect();
    }
    // planned_placement's planners, by device (null where the setting is off).
    if r.planners.iter().any(Option::is_some) {
        object["planners"] = r
            .planners
            .iter()
            .map(|p| {
                p.map_or(serde_json::Value::Null, |c| {
                    serde_json::json!({
                        "plans": c.plans,
                        "attempts": c.attempts,
                        "dropped": c.dropped,
                        "advised": c.advised,
                        "conflicts": c.conflicts,
                        "plan_height": c.height,
                        "from_parked": c.from_parked,
                        "plan_floor": c.floor,
                        "in_force": c.in_force,
                    })
                })
            })
            .collect();
    }
    object.to_string()
}
