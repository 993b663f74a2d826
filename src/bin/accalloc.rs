//! The accalloc command-line tool: `info`, `replay TRACE [--json]`, `bench`.

use accalloc::backend::host::{HostBackend, HostSettings};
use accalloc::backend::testing::TestBackend;
use accalloc::backend::Backend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::summary::memory_summary;
use accalloc::caching::CachingConfig;
use accalloc::replay::{parse_trace, replay_with, ReplayOptions, ReplayReport};
use accalloc::runtime::{runtime, ALLOC_CONF_VAR, DEVICE_VAR};
use accalloc::timeline::timeline_svg;
use accalloc::units::format_size;
use std::process::ExitCode;
use std::sync::Arc;

const USAGE: &str = "usage:
  accalloc info                    the current accelerator, its devices and their capacity
  accalloc replay TRACE [--json] [--simulate|--cuda|--backend LIB] [--config STR] [--svg FILE] [--snapshot FILE] [--summary]
                                   replay an allocation trace (JSON lines) through the allocator;
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
  accalloc bench [--quick]         cached malloc+free pair against the C library's malloc+free
  accalloc --version               the version and ABI of this build

Environment (read by the library and by every command; a bad value is an error naming it):
  ACCALLOC_CONF          allocator settings, PYTORCH_ALLOC_CONF's syntax (replay: --config's keys
                         override the same keys here)
  ACCALLOC_DEVICE        host or cuda: force the accelerator (replay: the backend, unless --simulate,
                         --cuda or --backend chooses)
  ACCALLOC_HOST_CAPACITY bytes each host device may hold, e.g. 8GiB (default: physical memory)
  ACCALLOC_HOST_DEVICES  how many host devices, 1 to 64 (default 1)
  ACCALLOC_HOST_FAIL     inject host allocation failures, for tests: alloc:every=N or alloc:after=N";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("info") if args.len() == 1 => info(),
        Some("replay") => replay_command(&args[1..]),
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
            Err(format!("too many arguments for '{command}'\n{USAGE}"))
        }
        Some(unknown) => Err(format!("unknown command '{unknown}'\n{USAGE}")),
        None => Err(format!("no command given\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("accalloc: {message}");
            ExitCode::FAILURE
        }
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

/// The replay's settings: ACCALLOC_CONF as every entry point reads it, then `--config` on top, whose
/// keys override the same keys of the environment (the others keep the environment's values).
fn replay_config(cli: Option<&str>) -> Result<CachingConfig, String> {
    let env = std::env::var(ALLOC_CONF_VAR).ok();
    let env_config = match &env {
        Some(text) => parse_settings(text, &CachingConfig::default())
            .map_err(|e| format!("{ALLOC_CONF_VAR}: {}", e.message))?,
        None => CachingConfig::default(),
    };
    let Some(cli) = cli else {
        return Ok(env_config);
    };
    parse_settings(cli, &CachingConfig::default())
        .map_err(|e| format!("--config: {}", e.message))?;
    // One string, the environment's keys first: a later key wins, and the keys that a new string
    // resets (max_split_size_mb, ...) keep the environment's value unless --config names them.
    let combined: Vec<&str> = [env.as_deref().unwrap_or(""), cli]
        .into_iter()
        .filter(|part| !part.trim().is_empty())
        .collect();
    parse_settings(&combined.join(","), &CachingConfig::default())
        .map_err(|e| format!("{ALLOC_CONF_VAR} with --config: {}", e.message))
}

/// Which backend a replay uses when no flag chooses: ACCALLOC_DEVICE, as the library reads it.
fn forced_device() -> Result<Option<String>, String> {
    match std::env::var(DEVICE_VAR) {
        Err(_) => Ok(None),
        Ok(value) if value == "host" || value == "cuda" => Ok(Some(value)),
        Ok(value) => Err(format!(
            "{DEVICE_VAR}='{value}' is not a valid accelerator: give host or cuda (or leave it unset)"
        )),
    }
}

fn replay_command(args: &[String]) -> Result<(), String> {
    let mut path = None;
    let mut json = false;
    let mut simulate = false;
    let mut cuda = false;
    let mut library = None;
    let mut config_text = None;
    let mut svg_path = None;
    let mut snapshot_path = None;
    let mut summary = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--json" => json = true,
            "--simulate" => simulate = true,
            "--cuda" => cuda = true,
            "--backend" => library = Some(value("--backend")?),
            "--summary" => summary = true,
            "--config" => config_text = Some(value("--config")?),
            "--svg" => svg_path = Some(value("--svg")?),
            "--snapshot" => snapshot_path = Some(value("--snapshot")?),
            flag if flag.starts_with("--") => {
                return Err(format!("unknown option {flag}\n{USAGE}"))
            }
            _ if path.is_some() => return Err(format!("one trace at a time\n{USAGE}")),
            file => path = Some(file.to_string()),
        }
    }
    let path = path.ok_or_else(|| format!("replay needs a trace file\n{USAGE}"))?;
    let config = replay_config(config_text.as_deref())?;
    let forced = forced_device()?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let ops = parse_trace(&text).map_err(|e| format!("{path}: {}", e.message))?;
    let settings = HostSettings::from_env().map_err(|e| e.message)?;
    let backend: Arc<dyn Backend> = if let Some(spec) = &library {
        load_backend(spec)?
    } else if simulate {
        Arc::new(TestBackend::new(settings.devices, settings.capacity))
    } else if cuda {
        cuda_backend("--cuda")?
    } else if forced.as_deref() == Some("cuda") {
        cuda_backend(&format!("{DEVICE_VAR}=cuda"))?
    } else {
        Arc::new(HostBackend::new(settings))
    };
    let options = ReplayOptions {
        timeline: svg_path.is_some(),
        snapshot_at_peak: snapshot_path.is_some(),
    };
    let report = replay_with(&ops, backend, &config, options).map_err(|e| e.message)?;
    if let Some(svg) = &svg_path {
        let title = match &config_text {
            Some(text) => format!("{path} ({text})"),
            None => path.clone(),
        };
        std::fs::write(svg, timeline_svg(&report.timeline, &title))
            .map_err(|e| format!("cannot write {svg}: {e}"))?;
    }
    if let (Some(file), Some(snapshot)) = (&snapshot_path, &report.snapshot) {
        std::fs::write(file, snapshot.to_string())
            .map_err(|e| format!("cannot write {file}: {e}"))?;
    }
    if json {
        println!("{}", report_json(&path, &report));
    } else {
        print_report(&path, &report);
    }
    if summary {
        for (device, stats) in report.device_stats.iter().enumerate() {
            print!(
                "{}",
                memory_summary(stats, device, "accalloc replay", false)
            );
        }
    }
    Ok(())
}

/// Name of the function a backend library exports for `--backend` unless LIB:SYMBOL names another:
/// `int32_t accalloc_backend_entry(AccallocBackendVTable *table, const char **name)` fills the table and the
/// backend's name and returns 0.
const BACKEND_ENTRY: &str = "accalloc_backend_entry";

/// Load a backend written in C from a shared library ("path/lib.so" or "path/lib.so:symbol").
fn load_backend(spec: &str) -> Result<Arc<dyn Backend>, String> {
    use accalloc::backend::custom::{AccallocBackendVTable, CustomBackend};
    use std::ffi::{c_char, CStr, CString};
    let (path, symbol) = spec.rsplit_once(':').unwrap_or((spec, BACKEND_ENTRY));
    let c_path = CString::new(path).map_err(|_| format!("--backend: bad path {path}"))?;
    let c_symbol = CString::new(symbol).map_err(|_| format!("--backend: bad symbol {symbol}"))?;
    // SAFETY: dlopen/dlsym with valid strings; the library stays loaded for the process (the backend
    // keeps its function pointers), and the entry has the documented signature.
    unsafe {
        let handle = libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            let why = CStr::from_ptr(libc::dlerror())
                .to_string_lossy()
                .into_owned();
            return Err(format!("--backend: cannot load {path}: {why}"));
        }
        let entry = libc::dlsym(handle, c_symbol.as_ptr());
        if entry.is_null() {
            return Err(format!("--backend: {path} has no function {symbol}"));
        }
        let entry: unsafe extern "C" fn(*mut AccallocBackendVTable, *mut *const c_char) -> i32 =
            std::mem::transmute(entry);
        let mut table: AccallocBackendVTable = std::mem::zeroed();
        table.struct_size = std::mem::size_of::<AccallocBackendVTable>();
        let mut name: *const c_char = std::ptr::null();
        let rc = entry(&mut table, &mut name);
        if rc != 0 || name.is_null() {
            return Err(format!("--backend: {symbol} in {path} returned {rc}"));
        }
        let name = CStr::from_ptr(name).to_string_lossy().into_owned();
        let backend =
            CustomBackend::new(&name, &table).map_err(|why| format!("--backend: {why}"))?;
        Ok(Arc::new(backend))
    }
}

#[cfg(feature = "cuda")]
fn cuda_backend(asked_by: &str) -> Result<Arc<dyn Backend>, String> {
    accalloc::backend::cuda::CudaBackend::detect()
        .map(|b| Arc::new(b) as Arc<dyn Backend>)
        .map_err(|why| format!("{asked_by}: CUDA is not available: {why}"))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend(asked_by: &str) -> Result<Arc<dyn Backend>, String> {
    Err(format!(
        "{asked_by}: accalloc was built without the cuda feature"
    ))
}

fn print_report(path: &str, r: &ReplayReport) {
    println!("trace: {path}");
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
    println!("reserved / allocated at peak: {:.3}", r.reserved_ratio());
    println!("OOMs: {}   retries: {}", r.ooms, r.alloc_retries());
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
}

fn report_json(path: &str, r: &ReplayReport) -> String {
    let flat = |s: &accalloc::caching::DeviceStats| {
        serde_json::Value::Object(s.flat().into_iter().map(|(k, v)| (k, v.into())).collect())
    };
    let mut object = serde_json::json!({
        "trace": path,
        "operations": r.operations,
        "allocs": r.allocs,
        "frees": r.frees,
        "peak_allocated_bytes": r.peak_allocated(),
        "peak_reserved_bytes": r.peak_reserved(),
        "reserved_to_allocated_ratio": r.reserved_ratio(),
        "ooms": r.ooms,
        "alloc_retries": r.alloc_retries(),
        "device_allocs": r.device_allocs(),
        "device_frees": r.device_frees(),
        "ns_per_op": r.ns_per_op(),
        "ns_per_malloc": r.ns_per_malloc(),
        "ns_per_free": r.ns_per_free(),
        "devices": r.device_stats.len(),
        "stats": flat(&r.device_stats[0]),
    });
    if r.device_stats.len() > 1 {
        object["stats_by_device"] = r.device_stats.iter().map(flat).collect();
    }
    object.to_string()
}

fn bench(option: Option<&str>) -> Result<(), String> {
    let (batches, pairs) = match option {
        None => (101, 20_000),
        Some("--quick") => (11, 2_000),
        Some(other) => return Err(format!("unknown option {other}\n{USAGE}")),
    };
    runtime().map_err(|e| e.message)?;
    let rows = accalloc::bench::run(batches, pairs);
    println!("median of {batches} batches of {pairs} malloc+free pairs, host backend, one thread");
    print!("{}", accalloc::bench::table(&rows));

    // Several threads: one device (one lock) against one device each (ACCALLOC_HOST_DEVICES permitting).
    let devices = runtime().map_err(|e| e.message)?.current().device_count();
    let threaded_pairs = pairs * 5;
    println!("\nthreads, wall-clock ns per pair (mixed sizes, {threaded_pairs} pairs a thread, best of 3; {} cores)",
        std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("| threads | same device | one device each |\n|---:|---:|---:|");
    for threads in [1usize, 2, 4] {
        let same = accalloc::bench::threaded(threads, threaded_pairs, |_| 0);
        let separate = if devices >= threads {
            format!(
                "{:.1}",
                accalloc::bench::threaded(threads, threaded_pairs, |t| t as i32)
            )
        } else {
            format!("(needs ACCALLOC_HOST_DEVICES={threads})")
        };
        println!("| {threads} | {same:.1} | {separate} |");
    }
    Ok(())
}
