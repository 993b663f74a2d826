//! The accalloc tool as a user runs it.

use std::process::Command;

fn accalloc(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_accalloc"))
        .args(args)
        .env("ACCALLOC_HOST_CAPACITY", "8GiB")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("accalloc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

const TRACE: &str = "{\"op\":\"alloc\",\"id\":1,\"size\":1000,\"stream\":0}\n\
                     {\"op\":\"alloc\",\"id\":2,\"size\":31457280,\"stream\":0}\n\
                     {\"op\":\"free\",\"id\":1}\n{\"op\":\"empty_cache\"}\n{\"op\":\"free\",\"id\":2}\n";

#[test]
fn info_names_the_host() {
    let (ok, out, _) = accalloc(&["info"]);
    assert!(ok);
    assert!(out.contains("accelerator: host"), "{out}");
    assert!(
        out.contains("device 0: capacity 8.00 GiB (8589934592 bytes)"),
        "{out}"
    );
}

#[test]
fn replay_reports_json_with_all_stats_and_writes_pictures() {
    let trace = temp("small.jsonl");
    std::fs::write(&trace, TRACE).unwrap();
    let (svg, snapshot) = (temp("t.svg"), temp("s.json"));
    let (ok, out, err) = accalloc(&[
        "replay",
        trace.to_str().unwrap(),
        "--json",
        "--config",
        "max_split_size_mb:20",
        "--svg",
        svg.to_str().unwrap(),
        "--snapshot",
        snapshot.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["stats"].as_object().unwrap().len(), 122);
    assert_eq!(report["peak_allocated_bytes"], 1024 + (30 << 20));
    assert_eq!(
        report["stats"]["oversize_allocations.allocated"], 1,
        "--config took effect"
    );
    assert_eq!(report["device_frees"], 1);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<polygon"));
    let snap: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&snapshot).unwrap()).unwrap();
    assert_eq!(
        snap["segments"].as_array().unwrap().len(),
        2,
        "taken at peak: both segments held"
    );
    assert_eq!(snap["allocator_settings"]["max_split_size"], 20 << 20);
}

#[test]
fn reset_peaks_at_gives_the_peaks_of_the_rest_of_the_trace() {
    let trace = temp("reset.jsonl");
    std::fs::write(&trace, TRACE).unwrap();
    let peaks = |extra: &[&str]| {
        let mut args = vec!["replay", trace.to_str().unwrap(), "--simulate", "--json"];
        args.extend_from_slice(extra);
        let (ok, out, err) = accalloc(&args);
        assert!(ok, "{err}");
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        (
            report["peak_allocated_bytes"].clone(),
            report["peak_reserved_bytes"].clone(),
        )
    };
    // Both blocks live after op 1: 1 KiB (a 2 MiB small segment) and 30 MiB.
    assert_eq!(peaks(&[]), peaks(&["--reset-peaks-at", "0"]));
    // Reset before op 3 (empty_cache, then the 30 MiB free): the 1 KiB block was freed at op 2,
    // so the most allocated from then on is the 30 MiB block; reserved memory is what was held at
    // the reset, its 2 MiB small segment still cached.
    let (allocated, reserved) = peaks(&["--reset-peaks-at", "3"]);
    assert_eq!(allocated, 30 << 20);
    assert_eq!(reserved, 32 << 20);
    let (ok, _, err) = accalloc(&["replay", trace.to_str().unwrap(), "--reset-peaks-at", "x"]);
    assert!(!ok);
    assert!(
        err.contains("--reset-peaks-at takes an operation's index"),
        "{err}"
    );
}

#[test]
fn replay_says_what_the_planner_did() {
    // Eight steps of a chain: 40 blocks of 2 MiB + i x 4 KiB, each freed once the next is made.
    let trace = temp("planned.jsonl");
    let mut lines = Vec::new();
    let mut id = 0;
    for _ in 0..8 {
        for i in 0..40 {
            lines.push(format!(
                "{{\"op\":\"alloc\",\"id\":{id},\"size\":{}}}",
                (2 << 20) + i * 4096
            ));
            if i > 0 {
                lines.push(format!("{{\"op\":\"free\",\"id\":{}}}", id - 1));
            }
            id += 1;
        }
        lines.push(format!("{{\"op\":\"free\",\"id\":{}}}", id - 1));
    }
    std::fs::write(&trace, lines.join("\n") + "\n").unwrap();
    let path = trace.to_str().unwrap();
    let args = [
        "replay",
        path,
        "--simulate",
        "--config",
        "planned_placement:True",
    ];
    let (ok, out, err) = accalloc(&[&args[..], &["--json"]].concat());
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let planner = &report["planners"][0];
    assert!(planner["plans"].as_u64().unwrap() >= 1, "{planner}");
    assert_eq!(planner["in_force"], true);
    assert_eq!(planner["dropped"], 0);
    // At least the last steps' requests, every one of them.
    assert!(planner["advised"].as_u64().unwrap() >= 3 * 40, "{planner}");
    // The latest plan's floor: more than nothing, and no more than what the plan spans.
    let (floor, height) = (
        planner["plan_floor"].as_u64(),
        planner["plan_height"].as_u64(),
    );
    assert!(
        floor.is_some_and(|floor| floor > 0 && Some(floor) <= height),
        "{planner}"
    );
    let (ok, out, err) = accalloc(&args);
    assert!(ok, "{err}");
    assert!(
        out.contains("planned placement, device 0: ")
            && out.contains("a plan in force at the end: yes")
            && out.contains("latest plan, device 0: spans "),
        "{out}"
    );
    // Off: nothing said.
    let (ok, out, _) = accalloc(&["replay", path, "--simulate", "--json"]);
    assert!(ok);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(report.get("planners").is_none());
}

#[test]
fn bad_input_is_reported_with_its_line() {
    let trace = temp("bad.jsonl");
    std::fs::write(
        &trace,
        "{\"op\":\"alloc\",\"id\":1,\"size\":8}\n{\"op\":\"free\",\"id\":9}\n",
    )
    .unwrap();
    let (ok, _, err) = accalloc(&["replay", trace.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("trace line 2: free of id 9, which is not live"),
        "{err}"
    );
    let (ok, _, err) = accalloc(&["replay", trace.to_str().unwrap(), "--config", "bogus:1"]);
    assert!(!ok);
    assert!(err.contains("--config: unrecognized key 'bogus'"), "{err}");
    let (ok, _, err) = accalloc(&["replay"]);
    assert!(!ok && err.contains("usage:"), "{err}");
}

fn sample(path: &str) -> String {
    format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn replay_reads_a_pytorch_snapshot_by_content() {
    // The pickle under a name that says nothing of its kind.
    let copy = temp("snapshot.bin");
    std::fs::copy(sample("examples/snapshots/sample_snapshot.pickle"), &copy).unwrap();
    let (ok, out, err) = accalloc(&[
        "replay",
        copy.to_str().unwrap(),
        "--simulate",
        "--json",
        "--segment-free-as-empty-cache",
    ]);
    assert!(ok, "{err}");
    let from_snapshot: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(from_snapshot["input_format"], "PyTorch snapshot (pickle)");
    assert_eq!(from_snapshot["snapshot"]["segment_free_runs"], 1);
    let (ok, out, _) = accalloc(&[
        "replay",
        &sample("examples/snapshots/sample_trace.jsonl"),
        "--simulate",
        "--json",
    ]);
    assert!(ok);
    let from_trace: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(from_snapshot["stats"], from_trace["stats"]);
    let (ok, out, _) = accalloc(&["replay", copy.to_str().unwrap(), "--simulate"]);
    assert!(ok);
    assert!(
        out.contains("snapshot: 4476 history entries of device(s) 0, 1 stream(s)"),
        "{out}"
    );
}

#[test]
fn convert_writes_a_trace_and_a_snapshot_that_read_back() {
    let trace = temp("convert.jsonl");
    std::fs::write(&trace, TRACE).unwrap();
    let pickle = temp("convert.pickle");
    let (ok, out, err) = accalloc(&[
        "convert",
        trace.to_str().unwrap(),
        "-o",
        pickle.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("5 operations"), "{out}");
    let back = temp("back.jsonl");
    let (ok, _, err) = accalloc(&[
        "convert",
        pickle.to_str().unwrap(),
        "-o",
        back.to_str().unwrap(),
        "--segment-free-as-empty-cache",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "{\"op\":\"alloc\",\"id\":0,\"size\":1000,\"stream\":0}\n\
         {\"op\":\"alloc\",\"id\":1,\"size\":31457280,\"stream\":0}\n\
         {\"op\":\"free\",\"id\":0}\n{\"op\":\"empty_cache\"}\n{\"op\":\"free\",\"id\":1}\n",
        "the trace again, ids from 0"
    );
    let (ok, _, err) = accalloc(&["convert", trace.to_str().unwrap(), "-o", "x.txt"]);
    assert!(!ok && err.contains("name the output .jsonl"), "{err}");
}

#[test]
fn bad_snapshots_name_what_and_where() {
    let pickle = std::fs::read(sample("tests/data/snapshot_protocol4.pickle")).unwrap();
    let truncated = temp("truncated.pickle");
    std::fs::write(&truncated, &pickle[..pickle.len() / 2]).unwrap();
    let (ok, _, err) = accalloc(&["replay", truncated.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("truncated.pickle: not a readable pickle"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let unknown = temp("unknown.json");
    std::fs::write(
        &unknown,
        r#"{"device_traces": [[{"action": "alloc", "addr": 512, "size": 10, "stream": 0},
            {"action": "resize", "addr": 512, "size": 10, "stream": 0}]]}"#,
    )
    .unwrap();
    let (ok, _, err) = accalloc(&["replay", unknown.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("device_traces[0][1]: unknown action \"resize\""),
        "{err}"
    );
    let (ok, _, err) = accalloc(&["replay", unknown.to_str().unwrap(), "--device", "3"]);
    assert!(!ok && err.contains("--device 3"), "{err}");
}

#[test]
fn tune_frontier_gives_each_trim_line_beside_plain_expandable_segments() {
    let file = temp("frontier.jsonl");
    std::fs::write(&file, TRACE).unwrap();
    let trace = file.to_str().unwrap();
    let (ok, out, err) = accalloc(&["tune", trace, "--frontier", "--json"]);
    assert!(ok, "{err}");
    let result: serde_json::Value = serde_json::from_str(&out).unwrap();
    let points = result["points"].as_array().unwrap();
    // The defaults, plain expandable segments, the lines 0 to 0.2, then planned placement.
    assert_eq!(points.len(), 14);
    assert_eq!(points[0]["config"], "");
    assert_eq!(points[1]["config"], "expandable_segments:True");
    assert_eq!(points[2]["trim_slack"], 0.0);
    assert_eq!(points[12]["trim_slack"], 0.2);
    assert_eq!(points[13]["config"], "planned_placement:True");
    assert!(points.iter().any(|p| p["on_frontier"] == true));
    let (ok, out, _) = accalloc(&["tune", trace, "--frontier"]);
    assert!(ok && out.contains("| frontier |"), "{out}");
}

#[test]
fn tune_ranks_settings_and_prints_lines_to_paste() {
    // A small trace: the debug build checks every invariant after every operation of every replay.
    let file = temp("tune.jsonl");
    std::fs::write(&file, TRACE).unwrap();
    let trace = file.to_str().unwrap();
    let (ok, out, err) = accalloc(&["tune", trace, "--json", "--threads", "2"]);
    assert!(ok, "{err}");
    let result: serde_json::Value = serde_json::from_str(&out).unwrap();
    let candidates = result["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 551);
    let best = &result["best"];
    assert_eq!(best, &candidates[0]);
    let peaks: Vec<i64> = candidates
        .iter()
        .map(|c| c["peak_reserved_bytes"].as_i64().unwrap())
        .collect();
    assert!(
        peaks.windows(2).all(|w| w[0] <= w[1]),
        "ranked by peak reserved"
    );
    // By default 2 MiB + 30 MiB are reserved; expandable segments need 2 MiB + 40 MiB (20 MiB
    // pages), with trimming 2 MiB pages in both pools: 2 MiB + 30 MiB, the same as the default,
    // which comes first as it is first in the search.
    assert_eq!(result["defaults"]["peak_reserved_bytes"], 32 << 20);
    assert_eq!(best["peak_reserved_bytes"], 32 << 20);
    // best.config replays with the figures tune found.
    let config = best["config"].as_str().unwrap();
    let (ok, out, _) = accalloc(&["replay", trace, "--simulate", "--json", "--config", config]);
    assert!(ok);
    let replayed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(replayed["peak_reserved_bytes"], best["peak_reserved_bytes"]);
    assert!(!result["best_pytorch"]["config"]
        .as_str()
        .unwrap()
        .contains("expandable_trim"));

    // 40 MiB: every candidate fits; 16 MiB: none does (the 30 MiB request), all rank "does not fit".
    let (ok, out, err) = accalloc(&["tune", trace, "--capacity", "40MiB", "--top", "3"]);
    assert!(ok, "{err}");
    assert!(out.contains("2755 settings"), "{out}");
    assert!(out.contains("\nbest:             ACCALLOC_CONF="), "{out}");
    assert!(
        out.contains("\nbest for PyTorch: PYTORCH_ALLOC_CONF="),
        "{out}"
    );
    assert!(out.contains("| 1 | `"), "{out}");
    let (ok, out, _) = accalloc(&["tune", trace, "--capacity", "16MiB", "--json"]);
    assert!(ok);
    let result: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(result["best"]["fits"], false);
    assert_eq!(result["best"]["ooms"], 1);
    let (ok, _, err) = accalloc(&["tune", trace, "--capacity", "lots"]);
    assert!(
        !ok && err.contains("--capacity: 'lots' is not a size: give bytes"),
        "{err}"
    );
}

#[test]
fn capacities_refuse_the_ambiguous_and_say_what_was_understood() {
    let file = temp("capacity.jsonl");
    std::fs::write(&file, TRACE).unwrap();
    let trace = file.to_str().unwrap();
    // 80 alone would be 80 bytes: refused as a forgotten unit, naming the forms that work.
    let (ok, out, err) = accalloc(&["tune", trace, "--capacity", "80"]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.starts_with(
            "accalloc: --capacity: '80' would be 80 bytes (a bare number is bytes), surely not the \
             device's memory: write the unit (e.g. 80GiB), or 80B if bytes are meant"
        ),
        "{err}"
    );
    for (command, extra) in [
        ("tune", None),
        ("compare", Some("expandable_segments:True")),
    ] {
        let mut args = vec![command, trace, "--capacity", "80GB"];
        if let Some(config) = extra {
            args.extend(["--config", config]);
        }
        let (ok, _, err) = accalloc(&args);
        assert!(!ok, "{command}");
        assert!(
            err.contains("--capacity: '80GB' is ambiguous: GB may mean a power of 1000 or of 1024; write 80GiB"),
            "{command}: {err}"
        );
    }
    // Bytes when asked for, and said so beside the verdict.
    let (ok, out, err) = accalloc(&["tune", trace, "--capacity", "80B", "--top", "1"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("simulated device of 80 bytes, read from --capacity 80B"),
        "{out}"
    );
    assert!(out.contains("does NOT fit in 80 bytes"), "{out}");
    let (ok, out, err) = accalloc(&["tune", trace, "--capacity", "40MiB", "--frontier"]);
    assert!(ok, "{err}");
    assert!(out.contains("| frontier |"), "{out}");
    let (ok, out, err) = accalloc(&[
        "compare",
        trace,
        "--config",
        "expandable_segments:True",
        "--capacity",
        "1.5GiB",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("simulated device of 1.50 GiB (1610612736 bytes)"),
        "{out}"
    );
}

/// The table rows of tune's text output, as cells.
fn table_rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| rank"))
        .map(|l| {
            l.split(" | ")
                .map(|c| c.trim_matches(['|', ' ']).to_string())
                .collect()
        })
        .collect()
}

#[test]
fn tune_folds_settings_with_the_same_figures_and_keeps_each_line_to_one_run() {
    let file = temp("fold.jsonl");
    std::fs::write(&file, TRACE).unwrap();
    let trace = file.to_str().unwrap();
    let (ok, out, err) = accalloc(&["tune", trace, "--top", "10000", "--threads", "2"]);
    assert!(ok, "{err}");
    let rows = table_rows(&out);
    // Columns: rank, settings, folded, then the figures, ns/op last.
    let figures: Vec<&[String]> = rows.iter().map(|r| &r[3..r.len() - 1]).collect();
    for (i, a) in figures.iter().enumerate() {
        for b in &figures[i + 1..] {
            assert_ne!(a, b, "two rows with the same figures:\n{out}");
        }
    }
    assert!(
        rows.len() < 60,
        "{} rows for a 5-operation trace",
        rows.len()
    );
    let stands_for: usize = rows
        .iter()
        .map(|r| 1 + r[2].trim_start_matches('+').parse::<usize>().unwrap_or(0))
        .sum();
    assert_eq!(stands_for, 551, "every setting in exactly one row");
    assert!(
        out.contains(&format!("551 settings, {} distinct outcomes", rows.len())),
        "{out}"
    );
    // The defaults' figures, all from the defaults' run: 1 KiB + 30 MiB allocated in 32 MiB.
    assert!(
        out.contains(
            "\ndefaults:         PyTorch's, no settings   (peak allocated 30.00 MiB, peak reserved \
             32.00 MiB, utilization 0.938, 3 device calls)"
        ),
        "{out}"
    );
    let defaults = rows.iter().find(|r| r[1] == "`(defaults)`").unwrap();
    assert_eq!(defaults[3..6], ["30.00 MiB", "32.00 MiB", "0.938"]);
    // The best line's figures are the best row's.
    let best = &rows[0];
    let best_line = out.lines().find(|l| l.starts_with("best: ")).unwrap();
    assert!(
        best_line.contains(&format!(
            "ACCALLOC_CONF={}   (peak allocated {}, peak reserved {}, utilization {}",
            best[1].trim_matches('`').replace("(defaults)", ""),
            best[3],
            best[4],
            best[5]
        )),
        "{best_line}\n{out}"
    );
    assert!(!out.contains("PyTorch's defaults reserve"), "{out}");
}

#[test]
fn utilization_is_one_figure_in_one_direction_everywhere() {
    let file = temp("utilization.jsonl");
    std::fs::write(&file, TRACE).unwrap();
    let trace = file.to_str().unwrap();
    let (ok, out, _) = accalloc(&["replay", trace, "--simulate"]);
    assert!(ok);
    assert!(
        out.contains("\nutilization (peak allocated / peak reserved): 0.938\n"),
        "{out}"
    );
    assert!(!out.contains("reserved / allocated"), "{out}");
    let (ok, out, _) = accalloc(&["replay", trace, "--simulate", "--json"]);
    assert!(ok);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let expected = report["peak_allocated_bytes"].as_f64().unwrap()
        / report["peak_reserved_bytes"].as_f64().unwrap();
    assert_eq!(report["utilization"].as_f64().unwrap(), expected);
    assert!(report.get("reserved_to_allocated_ratio").is_none());
    let (ok, out, _) = accalloc(&["compare", trace, "--config", "max_split_size_mb:20"]);
    assert!(ok);
    assert!(
        out.contains("| utilization (peak allocated / peak reserved) | 0.938 |"),
        "{out}"
    );
    let (ok, out, _) = accalloc(&["tune", trace, "--json"]);
    assert!(ok);
    let tuned: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(tuned["defaults"]["utilization"].as_f64().unwrap(), expected);
}

#[test]
fn files_written_are_named_and_the_comparison_tells_runs_apart() {
    let file = temp("pictures.jsonl");
    std::fs::write(&file, TRACE).unwrap();
    let trace = file.to_str().unwrap();
    let svg = temp("runs.svg");
    let svg_path = svg.to_str().unwrap();
    let _ = std::fs::remove_file(&svg);
    let (ok, out, err) = accalloc(&[
        "compare",
        trace,
        "--config",
        "expandable_segments:True",
        "--svg",
        svg_path,
    ]);
    assert!(ok, "{err}");
    assert!(
        out.trim_end()
            .ends_with(&format!("wrote {svg_path} (the timeline of the 2 runs)")),
        "{out}"
    );
    let picture = std::fs::read_to_string(&svg).unwrap();
    // Each run's reserved line in its own width and dash pattern, the defaults widest and solid.
    let reserved: Vec<&str> = picture
        .lines()
        .filter(|l| l.starts_with("<polyline") && !l.contains("stroke-opacity"))
        .collect();
    assert_eq!(reserved.len(), 2, "{picture}");
    let style = |line: &str| {
        let width = line
            .split("stroke-width=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let dash = line
            .split("stroke-dasharray=\"")
            .nth(1)
            .map(|d| d.split('"').next().unwrap().to_string());
        (width.parse::<f64>().unwrap(), dash)
    };
    let (defaults, other) = (style(reserved[0]), style(reserved[1]));
    assert!(defaults.0 > other.0, "the defaults underneath, wider");
    assert!(defaults.1.is_none() && other.1.is_some(), "{picture}");
    assert!(
        picture.contains(">(defaults)</text>")
            && picture.contains(">expandable_segments:True</text>")
    );
    // 5 operations: x ticks 0 to 4.
    let x_ticks = picture.matches("text-anchor=\"middle\">").count() - 1;
    assert!((5..=8).contains(&x_ticks), "{x_ticks} x ticks: {picture}");
    // With --json, standard output stays one JSON object and the file is named on standard error.
    let (ok, out, err) = accalloc(&[
        "compare",
        trace,
        "--config",
        "expandable_segments:True",
        "--svg",
        svg_path,
        "--json",
    ]);
    assert!(ok, "{err}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap();
    assert!(err.contains(&format!("wrote {svg_path}")), "{err}");
    let (timeline, snapshot) = (temp("one.svg"), temp("one.json"));
    let (ok, out, err) = accalloc(&[
        "replay",
        trace,
        "--simulate",
        "--svg",
        timeline.to_str().unwrap(),
        "--snapshot",
        snapshot.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!(
            "wrote {} (the memory timeline)",
            timeline.display()
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("wrote {} (the snapshot", snapshot.display())),
        "{out}"
    );
}

#[test]
fn compare_shows_two_settings_and_draws_both() {
    let trace = temp("compare.jsonl");
    std::fs::write(&trace, TRACE).unwrap();
    let svg = temp("compare.svg");
    let (ok, out, err) = accalloc(&[
        "compare",
        trace.to_str().unwrap(),
        "--config",
        "max_split_size_mb:20",
        "--config",
        "expandable_segments:True",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("| | `max_split_size_mb:20` | `expandable_segments:True` |"),
        "{out}"
    );
    assert!(out.contains("| peak reserved |"), "{out}");
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(
        picture.matches("<polyline").count(),
        4,
        "reserved and allocated of each"
    );
    assert!(picture.contains(">32 MiB<"), "round ticks: {picture}");
    let (ok, _, err) = accalloc(&["compare", trace.to_str().unwrap()]);
    assert!(!ok && err.contains("compare needs --config"), "{err}");
}

/// A trace with private pools: a MemPool used for two allocations, empty_cache while it lives, then
/// released and emptied. Figures by hand: the pool's 2 MiB segment stays through the first
/// empty_cache (live), the default pools' 2 MiB goes; releasing twice makes it freeable and the
/// second empty_cache gives it back.
const POOL_TRACE: &str =
    "{\"op\":\"pool_create\",\"pool\":[0,1],\"use_on_oom\":false,\"no_split\":false}\n\
                          {\"op\":\"pool_begin\",\"pool\":[0,1]}\n\
                          {\"op\":\"alloc\",\"id\":1,\"size\":1000,\"stream\":0}\n\
                          {\"op\":\"pool_end\",\"pool\":[0,1]}\n\
                          {\"op\":\"alloc\",\"id\":2,\"size\":1000,\"stream\":0}\n\
                          {\"op\":\"free\",\"id\":1}\n{\"op\":\"free\",\"id\":2}\n\
                          {\"op\":\"empty_cache\"}\n\
                          {\"op\":\"alloc\",\"id\":3,\"size\":512,\"stream\":0}\n\
                          {\"op\":\"free\",\"id\":3}\n\
                          {\"op\":\"pool_release\",\"pool\":[0,1]}\n\
                          {\"op\":\"pool_release\",\"pool\":[0,1]}\n\
                          {\"op\":\"empty_cache\"}\n";

#[test]
fn replay_follows_private_pools() {
    let trace = temp("pools.jsonl");
    std::fs::write(&trace, POOL_TRACE).unwrap();
    let (ok, out, err) = accalloc(&["replay", trace.to_str().unwrap(), "--json", "--simulate"]);
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let stats = &report["stats"];
    // Segments: the pool's, a default one, and after the first empty_cache a new default one
    // for id 3 (the pool's cached block is not the default pools').
    assert_eq!(stats["segment.all.allocated"], 3);
    assert_eq!(stats["segment.all.freed"], 3);
    assert_eq!(stats["reserved_bytes.all.peak"], 4 << 20);
    assert_eq!(stats["num_device_free"], 3);
    // A trace's misuse is an error naming it.
    let bad = temp("bad_pools.jsonl");
    std::fs::write(&bad, "{\"op\":\"pool_end\",\"pool\":[0,1]}\n").unwrap();
    let (ok, _, err) = accalloc(&["replay", bad.to_str().unwrap(), "--simulate"]);
    assert!(!ok);
    assert!(
        err.contains("allocations do not go to pool (0, 1)"),
        "{err}"
    );
}
