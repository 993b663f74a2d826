//! The accalloc tool reads the library's environment like every other entry point, and says what
//! went wrong when a command or a value is bad.

use std::process::Command;

fn accalloc(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_accalloc"));
    // Only what the test sets: none of the ACCALLOC_ variables of the process running the tests.
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("ACCALLOC_") {
            command.env_remove(var);
        }
    }
    command.args(args).env("ACCALLOC_HOST_CAPACITY", "1GiB");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One 25 MiB block, allocated and freed: oversize (counted in oversize_allocations) only when
/// max_split_size_mb is 25 or less.
/// A trace file of one 25 MiB block, a file of its own per call: tests run in parallel, and one
/// rewriting a shared file while another reads it would hand that one an empty trace.
fn trace() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("accalloc-cli-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("t{n}.jsonl"));
    std::fs::write(
        &path,
        "{\"op\":\"alloc\",\"id\":1,\"size\":26214400,\"stream\":0}\n{\"op\":\"free\",\"id\":1}\n",
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

fn stat(json: &str, key: &str) -> i64 {
    let value: serde_json::Value = serde_json::from_str(json).unwrap();
    value["stats"][key].as_i64().unwrap()
}

/// (max_split_size, oversize allocations) of a simulated replay of `trace()` with `ACCALLOC_CONF` set
/// to `env` (or unset) and `--config` given as `config` (or not).
fn replay_figures(env: Option<&str>, config: Option<&str>) -> (i64, i64) {
    let trace = trace();
    let mut args = vec!["replay", &trace, "--json", "--simulate"];
    if let Some(config) = config {
        args.extend(["--config", config]);
    }
    let env: Vec<(&str, &str)> = env.map(|v| ("ACCALLOC_CONF", v)).into_iter().collect();
    let (ok, out, err) = accalloc(&args, &env);
    assert!(ok, "{err}");
    (
        stat(&out, "max_split_size"),
        stat(&out, "oversize_allocations.allocated"),
    )
}

#[test]
fn replay_honours_accalloc_conf_and_config_overrides_its_keys() {
    assert_eq!(replay_figures(None, None), (-1, 0));
    let env = Some("max_split_size_mb:20");
    assert_eq!(replay_figures(env, None), (20 << 20, 1));
    // --config names the same key: its value wins.
    assert_eq!(
        replay_figures(env, Some("max_split_size_mb:40")),
        (40 << 20, 0)
    );
    // --config names another key: the environment's max_split_size stays.
    assert_eq!(
        replay_figures(env, Some("roundup_power2_divisions:4")),
        (20 << 20, 1)
    );
}

#[test]
fn bad_environment_values_are_errors_naming_the_variable() {
    let trace = trace();
    let (ok, _, err) = accalloc(
        &["replay", &trace, "--simulate"],
        &[("ACCALLOC_CONF", "max_split_size_mb:5")],
    );
    assert!(!ok);
    assert!(
        err.starts_with("accalloc: ACCALLOC_CONF: ") && err.contains("max_split_size_mb"),
        "{err}"
    );
    let (ok, _, err) = accalloc(&["replay", &trace], &[("ACCALLOC_DEVICE", "gpu")]);
    assert!(!ok);
    assert!(err.contains("ACCALLOC_DEVICE='gpu'"), "{err}");
    // The old names (OpenACC's prefix) are not read at all.
    let (ok, _, err) = accalloc(
        &["replay", &trace, "--simulate"],
        &[("ACC_ALLOC_CONF", "not a setting"), ("ACC_DEVICE", "gpu")],
    );
    assert!(ok, "{err}");
}

#[test]
fn unknown_commands_version_and_help() {
    let (ok, out, err) = accalloc(&["frobnicate"], &[]);
    assert!(!ok && out.is_empty());
    assert!(
        err.starts_with("accalloc: unknown command 'frobnicate'\nusage:"),
        "{err}"
    );
    let (ok, out, _) = accalloc(&["--version"], &[]);
    assert!(ok);
    assert_eq!(
        out.trim(),
        format!("accalloc {} (ABI 2)", env!("CARGO_PKG_VERSION"))
    );
    let (ok, out, _) = accalloc(&["--help"], &[]);
    assert!(ok);
    for var in [
        "ACCALLOC_CONF",
        "ACCALLOC_DEVICE",
        "ACCALLOC_HOST_CAPACITY",
        "ACCALLOC_HOST_DEVICES",
        "ACCALLOC_HOST_FAIL",
        "ACCALLOC_TRACE",
    ] {
        assert!(out.contains(var), "--help does not name {var}:\n{out}");
    }
    let (ok, _, err) = accalloc(&[], &[]);
    assert!(
        !ok && err.starts_with("accalloc: no command given\nusage:"),
        "{err}"
    );
}

#[test]
fn replay_refuses_device_ids_no_backend_has_without_panicking() {
    let dir = std::env::temp_dir().join(format!("accalloc-cli-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, line) in [
        (
            "max.jsonl",
            "{\"op\":\"alloc\",\"id\":1,\"size\":1000,\"stream\":0,\"device\":18446744073709551615}",
        ),
        (
            "zero.jsonl",
            "{\"op\":\"alloc\",\"id\":1,\"size\":0,\"stream\":0,\"device\":18446744073709551615}",
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, format!("{line}\n")).unwrap();
        let path = path.to_str().unwrap();
        for extra in [None, Some("--json"), Some("--simulate")] {
            let mut args = vec!["replay", path];
            args.extend(extra);
            let out = Command::new(env!("CARGO_BIN_EXE_accalloc"))
                .args(&args)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.contains("trace line 1: \"device\" is 18446744073709551615"),
                "{args:?}: {err}"
            );
        }
    }
    // A device the trace may name but the backend lacks: an error naming it, not a panic.
    let path = dir.join("three.jsonl");
    std::fs::write(
        &path,
        "{\"op\":\"alloc\",\"id\":1,\"size\":0,\"stream\":0,\"device\":3}\n",
    )
    .unwrap();
    let (ok, _, err) = accalloc(&["replay", path.to_str().unwrap(), "--json"], &[]);
    assert!(!ok && err.contains("the trace uses device 3"), "{err}");
}

const COMMANDS: [&str; 6] = ["info", "replay", "tune", "compare", "convert", "bench"];

#[test]
fn every_command_answers_help_with_its_own_usage() {
    let trace = trace();
    for command in COMMANDS {
        let own = format!("usage:\n  accalloc {command}");
        for args in [
            vec![command, "--help"],
            vec![command, "-h"],
            vec!["help", command],
            // After other arguments too, and whatever the environment holds.
            vec![command, &trace, "--help"],
        ] {
            let (ok, out, err) = accalloc(&args, &[("ACCALLOC_CONF", "bogus:1")]);
            assert!(ok, "{args:?}: {err}");
            assert!(err.is_empty(), "{args:?}: {err}");
            assert!(out.starts_with(&own), "{args:?}:\n{out}");
            assert!(
                out.contains("ACCALLOC_CONF"),
                "{args:?}: names the environment"
            );
            for other in COMMANDS.iter().filter(|&&other| other != command) {
                assert!(
                    !out.contains(&format!("  accalloc {other} ")),
                    "{args:?}: {command}'s help shows {other}'s usage:\n{out}"
                );
            }
        }
    }
    for args in [vec!["--help"], vec!["-h"], vec!["help"]] {
        let (ok, out, err) = accalloc(&args, &[]);
        assert!(ok && err.is_empty(), "{args:?}: {err}");
        for command in COMMANDS {
            assert!(out.contains(&format!("  accalloc {command}")), "{args:?}");
        }
    }
    let (ok, _, err) = accalloc(&["help", "frobnicate"], &[]);
    assert!(!ok && err.starts_with("accalloc: unknown command 'frobnicate'"));
    // An unknown single-dash option is an error with the command's usage, not a file name.
    let (ok, _, err) = accalloc(&["replay", "-x"], &[]);
    assert!(!ok);
    assert!(
        err.starts_with("accalloc: unknown option -x\nusage:\n  accalloc replay"),
        "{err}"
    );
    let (ok, _, err) = accalloc(&["info", "extra"], &[]);
    assert!(!ok && err.contains("info takes no arguments"), "{err}");
    let (ok, _, err) = accalloc(&["bench", "--slow"], &[]);
    assert!(
        !ok && err.starts_with("accalloc: unknown option --slow\nusage:\n  accalloc bench"),
        "{err}"
    );
}

/// Arguments with which each command would run (and quickly, on `trace`).
fn runnable(command: &str, trace: &str, out: &str) -> Vec<String> {
    let args: Vec<&str> = match command {
        "replay" => vec!["replay", trace, "--simulate"],
        "tune" => vec!["tune", trace, "--frontier"],
        "compare" => vec!["compare", trace, "--config", "expandable_segments:True"],
        "convert" => vec!["convert", trace, "-o", out],
        "bench" => vec!["bench", "--quick"],
        _ => vec!["info"],
    };
    args.into_iter().map(String::from).collect()
}

#[test]
fn every_command_refuses_a_bad_environment_before_it_starts() {
    let trace = trace();
    let dir = std::env::temp_dir().join(format!("accalloc-cli-badenv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out.jsonl");
    let bad: [(&str, &str, &str); 7] = [
        (
            "ACCALLOC_CONF",
            "bogus:1",
            "ACCALLOC_CONF: unrecognized key 'bogus'",
        ),
        (
            "ACCALLOC_DEVICE",
            "gpu",
            "ACCALLOC_DEVICE='gpu' is not a valid accelerator",
        ),
        (
            "ACCALLOC_HOST_CAPACITY",
            "8GB",
            "ACCALLOC_HOST_CAPACITY: '8GB' is ambiguous: GB may mean a power of 1000 or of 1024; \
             write 8GiB",
        ),
        (
            "ACCALLOC_HOST_CAPACITY",
            "lots",
            "ACCALLOC_HOST_CAPACITY: 'lots' is not a size",
        ),
        ("ACCALLOC_HOST_DEVICES", "0", "ACCALLOC_HOST_DEVICES='0'"),
        (
            "ACCALLOC_HOST_FAIL",
            "sometimes",
            "ACCALLOC_HOST_FAIL='sometimes'",
        ),
        (
            "ACCALLOC_TRACE",
            "/nonexistent-accalloc-dir/x.jsonl",
            "ACCALLOC_TRACE='/nonexistent-accalloc-dir/x.jsonl': cannot create the trace file",
        ),
    ];
    for command in COMMANDS {
        let args = runnable(command, &trace, out.to_str().unwrap());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        for (name, value, message) in bad {
            let _ = std::fs::remove_file(&out);
            let (ok, stdout, err) = accalloc(&args, &[(name, value)]);
            assert!(!ok, "{command} with {name}={value} ran: {stdout}");
            assert!(
                err.starts_with(&format!("accalloc: {message}")),
                "{command} with {name}={value}: {err}"
            );
            assert!(stdout.is_empty(), "{command}: work was done: {stdout}");
            assert!(!out.exists(), "{command} wrote its output");
        }
    }
    // Two bad values: both named at once.
    let (ok, _, err) = accalloc(
        &["replay", &trace],
        &[("ACCALLOC_CONF", "bogus:1"), ("ACCALLOC_DEVICE", "gpu")],
    );
    assert!(!ok);
    assert!(
        err.contains("accalloc: ACCALLOC_CONF: ") && err.contains("accalloc: ACCALLOC_DEVICE="),
        "{err}"
    );
}

#[test]
fn accalloc_trace_is_checked_without_a_trace_left_behind() {
    let trace = trace();
    let dir = std::env::temp_dir().join(format!("accalloc-cli-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("run.jsonl");
    let _ = std::fs::remove_file(&file);
    let (ok, out, err) = accalloc(
        &["replay", &trace, "--simulate"],
        &[("ACCALLOC_TRACE", file.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    assert!(out.contains("peak reserved"), "{out}");
    assert!(
        err.contains(
            "ACCALLOC_TRACE is set, but replay runs allocators of its own and records nothing"
        ),
        "{err}"
    );
    assert!(!file.exists(), "the check leaves no empty trace behind");
    // An existing file is neither truncated nor refused.
    std::fs::write(&file, "kept\n").unwrap();
    let (ok, _, err) = accalloc(
        &["replay", &trace, "--simulate"],
        &[("ACCALLOC_TRACE", file.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept\n");
    // A folder is not a file.
    let (ok, _, err) = accalloc(&["info"], &[("ACCALLOC_TRACE", dir.to_str().unwrap())]);
    assert!(!ok && err.contains("it is a folder"), "{err}");
    // info runs on the library, which records (nothing allocated: an empty trace).
    std::fs::remove_file(&file).unwrap();
    let (ok, _, err) = accalloc(&["info"], &[("ACCALLOC_TRACE", file.to_str().unwrap())]);
    assert!(ok, "{err}");
    assert!(file.exists(), "info's library made the trace file");
}

#[test]
fn capacities_say_what_was_understood() {
    let trace = trace();
    let (ok, out, err) = accalloc(&["replay", &trace], &[("ACCALLOC_HOST_CAPACITY", "8G")]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "backend: host, 1 device(s) of 8.00 GiB (8589934592 bytes; ACCALLOC_HOST_CAPACITY=8G)"
        ),
        "{out}"
    );
    // A bare number is bytes, and a small one is pointed out.
    let (ok, out, err) = accalloc(
        &["replay", &trace, "--simulate"],
        &[("ACCALLOC_HOST_CAPACITY", "600000")],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("ACCALLOC_HOST_CAPACITY='600000' is read as 600000 bytes (585.94 KiB)"),
        "{err}"
    );
    assert!(
        out.contains("OOMs: 1"),
        "the 25 MiB block does not fit: {out}"
    );
}

#[test]
fn unknown_names_close_to_a_variable_are_warned_about() {
    let trace = trace();
    let (ok, _, err) = accalloc(
        &["replay", &trace, "--simulate"],
        &[("ACCALLOC_CONFIG", "expandable_segments:True")],
    );
    assert!(ok, "a warning, not an error: {err}");
    assert!(
        err.contains(
            "warning: ACCALLOC_CONFIG is not a variable accalloc reads; did you mean ACCALLOC_CONF?"
        ),
        "{err}"
    );
    let (ok, _, err) = accalloc(
        &["tune", &trace, "--frontier"],
        &[("ACCALLOC_CONF", "max_split_size_mb:40")],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("ACCALLOC_CONF is checked but not applied: tune searches the settings itself"),
        "{err}"
    );
}
