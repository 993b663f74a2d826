//! The accalloc tool reads the library's environment like every other entry point, and says what
//! went wrong when a command or a value is bad.

use std::process::Command;

fn accalloc(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_accalloc"));
    command.args(args).env("ACCALLOC_HOST_CAPACITY", "1GiB");
    for var in ["ACCALLOC_CONF", "ACCALLOC_DEVICE", "ACCALLOC_HOST_DEVICES"] {
        command.env_remove(var);
    }
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
fn trace() -> String {
    let dir = std::env::temp_dir().join(format!("accalloc-cli-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.jsonl");
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
