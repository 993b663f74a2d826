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
