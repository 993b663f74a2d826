//! Which backend and settings a replay runs with: the flags, then the environment as the library
//! reads it.

use accalloc::backend::Backend;
use accalloc::caching::settings::parse_settings;
use accalloc::caching::CachingConfig;
use accalloc::runtime::{Environment, ALLOC_CONF_VAR};
use std::sync::Arc;

/// The replay's settings: ACCALLOC_CONF as every entry point reads it, then `--config` on top, whose
/// keys override the same keys of the environment (the others keep the environment's values).
pub fn replay_config(cli: Option<&str>) -> Result<CachingConfig, String> {
    let environment = Environment::read();
    let env_config = environment.initial_config().map_err(|e| e.message)?;
    let env = environment.alloc_conf;
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
pub fn forced_device() -> Result<Option<String>, String> {
    Environment::read()
        .forced_device()
        .map(|device| device.map(str::to_string))
        .map_err(|e| e.message)
}

/// Name of the function a backend library exports for `--backend` unless LIB:SYMBOL names another:
/// `int32_t accalloc_backend_entry(AccallocBackendVTable *table, const char **name)` fills the table and the
/// backend's name and returns 0.
const BACKEND_ENTRY: &str = "accalloc_backend_entry";

/// Load a backend written in C from a shared library ("path/lib.so" or "path/lib.so:symbol").
pub fn load_backend(spec: &str) -> Result<Arc<dyn Backend>, String> {
    use accalloc::backend::custom::CustomBackend;
    use accalloc::capi::AccallocBackendVTable;
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
        let backend = table
            .functions()
            .and_then(|functions| CustomBackend::new(&name, functions))
            .map_err(|why| format!("--backend: {why}"))?;
        Ok(Arc::new(backend))
    }
}

#[cfg(feature = "cuda")]
pub fn cuda_backend(asked_by: &str) -> Result<Arc<dyn Backend>, String> {
    accalloc::backend::cuda::CudaBackend::detect()
        .map(|b| Arc::new(b) as Arc<dyn Backend>)
        .map_err(|why| format!("{asked_by}: CUDA is not available: {why}"))
}

#[cfg(not(feature = "cuda"))]
pub fn cuda_backend(asked_by: &str) -> Result<Arc<dyn Backend>, String> {
    Err(format!(
        "{asked_by}: accalloc was built without the cuda feature"
    ))
}
