//! CUDA detection without a GPU: with no libcuda, and with stub libcudas that report no device or
//! lack functions, accalloc falls back to the host cleanly, and ACCALLOC_DEVICE=cuda says why it cannot.

#![cfg(feature = "cuda")]

use accalloc::backend::cuda::REQUIRED_SYMBOLS;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Build a stub libcuda from `source` in its own folder; returns the folder.
fn stub_libcuda(name: &str, source: &str) -> Option<PathBuf> {
    let dir = std::env::temp_dir().join(format!("accalloc-stub-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c_file = dir.join("stub.c");
    std::fs::write(&c_file, source).unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so"))
        .arg(&c_file)
        .status()
        .ok()?;
    if !built.success() {
        return None;
    }
    std::fs::copy(dir.join("libcuda.so"), dir.join("libcuda.so.1")).unwrap();
    Some(dir)
}

fn info(library_path: Option<&Path>, device: Option<&str>) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_accalloc"));
    command
        .arg("info")
        .env_remove("ACCALLOC_DEVICE")
        .env("ACCALLOC_HOST_CAPACITY", "1GiB");
    if let Some(path) = library_path {
        command.env("LD_LIBRARY_PATH", path);
    }
    if let Some(device) = device {
        command.env("ACCALLOC_DEVICE", device);
    }
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every driver function accalloc calls, as a stub that fails; `overrides` replace some bodies and
/// `omit` leaves functions out.
fn stub_source(overrides: &[(&str, &str)], omit: &[&str]) -> String {
    let mut source = String::new();
    for symbol in REQUIRED_SYMBOLS.iter().filter(|s| !omit.contains(s)) {
        match overrides.iter().find(|(name, _)| name == symbol) {
            Some((_, definition)) => source.push_str(definition),
            None => source.push_str(&format!("int {symbol}(void) {{ return 999; }}")),
        }
        source.push('\n');
    }
    source
}

fn real_gpu_present() -> bool {
    let (_, out, _) = info(None, None);
    out.contains("accelerator: cuda")
}

#[test]
fn a_stub_libcuda_without_devices_falls_back_to_the_host() {
    // The stub is found first whatever the machine has: LD_LIBRARY_PATH precedes the loader's cache.
    let init_ok = ("cuInit", "int cuInit(unsigned f) { (void)f; return 0; }");
    let cases = [
        (
            // cuInit reports CUDA_ERROR_NO_DEVICE (100), as on a machine whose driver sees no GPU.
            "noinit",
            stub_source(
                &[("cuInit", "int cuInit(unsigned f) { (void)f; return 100; }")],
                &[],
            ),
            "cuInit",
        ),
        (
            "nodevice",
            stub_source(
                &[
                    init_ok,
                    (
                        "cuDeviceGetCount",
                        "int cuDeviceGetCount(int *n) { *n = 0; return 0; }",
                    ),
                ],
                &[],
            ),
            "reports no CUDA device",
        ),
        (
            // cuDeviceGetCount is missing: cudarc would panic on it; accalloc checks first and says so.
            "partial",
            stub_source(&[init_ok], &["cuDeviceGetCount"]),
            "cuDeviceGetCount is not available in the loaded libcuda",
        ),
    ];
    for (name, source, reason) in cases {
        let Some(dir) = stub_libcuda(name, &source) else {
            panic!(
                "{name}: no C compiler (cc) to build the stub libcuda: accalloc's tests need one"
            );
        };
        let (ok, out, err) = info(Some(&dir), None);
        assert!(ok, "{name}: {err}");
        assert!(out.contains("accelerator: host"), "{name}: {out}");
        assert!(out.contains(reason), "{name}: the reason is shown: {out}");
        let (ok, _, err) = info(Some(&dir), Some("cuda"));
        assert!(!ok, "{name}: forcing cuda must fail");
        assert!(
            err.contains("ACCALLOC_DEVICE=cuda but CUDA is not available") && err.contains(reason),
            "{name}: {err}"
        );
        assert!(
            !err.contains("panicked"),
            "{name}: no panic reaches the user: {err}"
        );
    }
}

#[test]
fn without_libcuda_the_host_is_used_and_forcing_cuda_is_a_clear_error() {
    assert!(
        !real_gpu_present(),
        "this test needs a machine with no libcuda that sees a GPU (the loader's cache would find \
         the real one): on a GPU machine, scripts/gpu-check.sh runs the CUDA tests instead"
    );
    let empty = std::env::temp_dir().join(format!("accalloc-nolib-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let (ok, out, _) = info(Some(&empty), None);
    assert!(ok && out.contains("accelerator: host"), "{out}");
    let (ok, _, err) = info(Some(&empty), Some("cuda"));
    assert!(!ok);
    assert!(
        err.contains("ACCALLOC_DEVICE=cuda but CUDA is not available"),
        "{err}"
    );
    let (ok, out, _) = info(Some(&empty), Some("host"));
    assert!(
        ok && out.contains("cuda: not in use (ACCALLOC_DEVICE=host)"),
        "{out}"
    );
}
