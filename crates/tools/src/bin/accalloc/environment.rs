//! The environment, checked in one place before any command starts: every ACCALLOC_ variable the
//! library reads (accalloc::runtime::environment, the one owner of the names and the rules), with
//! the library's own rules (and the stricter size rule of `accalloc::units`), so that no command
//! runs with a value another command would refuse.

use crate::backends::forced_device;
use accalloc::backend::host::{FailRule, HostSettings, CAPACITY_VAR, DEVICES_VAR, FAIL_VAR};
use accalloc::caching::settings::parse_settings;
use accalloc::caching::CachingConfig;
use accalloc::runtime::trace_log::TRACE_VAR;
use accalloc::runtime::{ALLOC_CONF_VAR, DEVICE_VAR};
use accalloc::units::{format_size, parse_size};
use std::ffi::OsString;

/// Every variable the library and the tool read: the library's one list.
use accalloc::runtime::environment::VARIABLES as READ;

/// What the check found: errors (the command must not start) and notes for standard error.
#[derive(Default)]
pub struct Findings {
    pub errors: Vec<String>,
    pub notes: Vec<String>,
}

/// Check the process's environment for `command`.
pub fn check(command: &str) -> Findings {
    let names: Vec<OsString> = std::env::vars_os().map(|(name, _)| name).collect();
    check_with(command, |name| std::env::var_os(name), &names)
}

fn check_with(
    command: &str,
    get: impl Fn(&str) -> Option<OsString>,
    names: &[OsString],
) -> Findings {
    let mut found = Findings::default();
    // The library reads a value that is not UTF-8 as unset: refuse it rather than ignore it.
    let mut value = |name: &str| -> Option<String> {
        let raw = get(name)?;
        match raw.into_string() {
            Ok(text) => Some(text),
            Err(raw) => {
                found.errors.push(format!(
                    "{name}={} is not valid UTF-8: the library would ignore it",
                    raw.to_string_lossy()
                ));
                None
            }
        }
    };
    let conf = value(ALLOC_CONF_VAR);
    let capacity = value(CAPACITY_VAR);
    let devices = value(DEVICES_VAR);
    let fail = value(FAIL_VAR);
    let trace = value(TRACE_VAR);
    let _ = value(DEVICE_VAR);

    if let Some(text) = &conf {
        if let Err(e) = parse_settings(text, &CachingConfig::default()) {
            found
                .errors
                .push(format!("{ALLOC_CONF_VAR}: {}", e.message));
        } else if matches!(command, "tune" | "compare" | "convert") && !text.trim().is_empty() {
            found.notes.push(format!(
                "note: {ALLOC_CONF_VAR} is checked but not applied: {}",
                match command {
                    "tune" => "tune searches the settings itself",
                    "compare" => "compare runs each --config as given",
                    _ => "convert replays with --config (or the defaults)",
                }
            ));
        }
    }
    if let Err(message) = forced_device() {
        found.errors.push(message);
    }

    // Sizes under the units' rule first (it refuses GB and the like), then the library's rules.
    let mut capacity_for_library = None;
    if let Some(text) = &capacity {
        match parse_size(text) {
            Err(why) => found.errors.push(format!("{CAPACITY_VAR}: {why}")),
            Ok(size) => {
                capacity_for_library = Some(text.as_str());
                if !size.unit_given && size.bytes < 1 << 20 && size.bytes >= 512 {
                    found.notes.push(format!(
                        "note: {CAPACITY_VAR}='{}' is read as {} bytes ({}): a bare number is \
                         bytes",
                        text.trim(),
                        size.bytes,
                        format_size(size.bytes)
                    ));
                }
            }
        }
    }
    if let Err(e) = HostSettings::from_values(capacity_for_library, devices.as_deref()) {
        found.errors.push(e.message);
    }
    if let Some(rules) = &fail {
        if let Err(e) = FailRule::parse_rules(rules) {
            found.errors.push(e.message);
        }
    }

    if let Some(path) = trace.as_deref().filter(|p| !p.is_empty()) {
        match check_trace_file(path) {
            Err(message) => found.errors.push(message),
            Ok(()) if !matches!(command, "info" | "bench") => found.notes.push(format!(
                "note: {TRACE_VAR} is set, but {command} runs allocators of its own and records \
                 nothing to '{path}' (accalloc convert FILE -o OUT.jsonl writes a file's trace)"
            )),
            Ok(()) => {}
        }
    }

    for name in names {
        let Some(name) = name.to_str() else { continue };
        if let Some(meant) = near_miss(name) {
            found.notes.push(format!(
                "warning: {name} is not a variable accalloc reads; did you mean {meant}?"
            ));
        }
    }
    found
}

/// Whether a trace file can be made at `path` ("%p": this process's id), as the library makes it:
/// tried without leaving anything behind (an existing file is opened to append, not truncated; a
/// new one is created and removed).
fn check_trace_file(path: &str) -> Result<(), String> {
    let path = path.replace("%p", &std::process::id().to_string());
    let file = std::path::Path::new(&path);
    let result = if file.is_dir() {
        Err("it is a folder".to_string())
    } else if file.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(file)
            .map(drop)
            .map_err(|e| e.to_string())
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(file)
            .map(|_| {
                let _ = std::fs::remove_file(file);
            })
            .map_err(|e| e.to_string())
    };
    result.map_err(|why| {
        format!(
            "{TRACE_VAR}='{path}': cannot create the trace file: {why}; name a file in a folder \
             that exists and can be written, or unset {TRACE_VAR}"
        )
    })
}

/// The variable an unknown ACCALLOC_ name was probably meant to be (at most two letters off).
fn near_miss(name: &str) -> Option<&'static str> {
    let rest = name.strip_prefix("ACCALLOC_")?;
    if READ.contains(&name) {
        return None;
    }
    READ.iter()
        .map(|known| (edit_distance(rest, &known["ACCALLOC_".len()..]), *known))
        .filter(|&(distance, _)| distance <= 2)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, known)| known)
}

/// Levenshtein distance, case-insensitive.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_ascii_uppercase().chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// For messages: the capacity a --capacity value was read as ("80 bytes", "80.00 GiB (85899345920
/// bytes)").
pub fn describe_capacity(bytes: usize) -> String {
    match format_size(bytes as u64) {
        exact if exact.ends_with(" bytes") => exact,
        rounded => format!("{rounded} ({bytes} bytes)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_are_named() {
        assert_eq!(near_miss("ACCALLOC_CONFIG"), Some("ACCALLOC_CONF"));
        assert_eq!(
            near_miss("ACCALLOC_HOST_DEVICE"),
            Some("ACCALLOC_HOST_DEVICES")
        );
        assert_eq!(near_miss("ACCALLOC_TRACES"), Some("ACCALLOC_TRACE"));
        assert_eq!(near_miss("ACCALLOC_CONF"), None);
        // The project's other variables are not near any.
        for other in [
            "ACCALLOC_ASAN",
            "ACCALLOC_VALGRIND",
            "ACCALLOC_LIB_DIR",
            "ACCALLOC_TORCH_VENV",
            "ACCALLOC_FUZZ_SECONDS",
            "ACCALLOC_CUDA_MODEL_DEVICES",
            "ACCALLOC_TOOL",
            "ACCALLOC_CHECK",
        ] {
            assert_eq!(near_miss(other), None, "{other}");
        }
        assert_eq!(near_miss("PATH"), None);
    }
}
