//! The process-wide state: which accelerators exist, which is current, the current device of each
//! thread, and one caching allocator per device (each behind its own lock). Initialised once, on first
//! use, from the environment.

pub mod ownership;

use crate::backend::host::{HostBackend, HostSettings};
use crate::backend::{Backend, MemInfo, StreamId};
use crate::caching::settings::parse_settings;
use crate::caching::snapshot::settings_json;
use crate::caching::summary::memory_summary;
use crate::caching::{CachingAllocator, CachingConfig, DeviceStats, MallocStep};
use crate::error::{Error, ErrorKind, Result};
use ownership::{IndexedBackend, SegmentIndex};
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

/// Environment variable with the allocator settings, in PYTORCH_ALLOC_CONF's syntax.
pub const ALLOC_CONF_VAR: &str = "ACC_ALLOC_CONF";

/// A kind of accelerator, as the C ABI numbers them.
pub type DeviceType = i32;
/// The host backend's device type.
pub const DEVICE_TYPE_HOST: DeviceType = 0;
/// CUDA's device type.
pub const DEVICE_TYPE_CUDA: DeviceType = 1;

/// The name of a device type ("host", "cuda"), or None when no such type exists.
pub fn device_type_name(device_type: DeviceType) -> Option<&'static str> {
    match device_type {
        DEVICE_TYPE_HOST => Some("host"),
        DEVICE_TYPE_CUDA => Some("cuda"),
        _ => None,
    }
}

/// One accelerator: a backend and a caching allocator per device, created on first use.
pub struct Accelerator {
    device_type: DeviceType,
    backend: Arc<dyn Backend>,
    /// The settings every device of this accelerator runs with.
    config: Mutex<CachingConfig>,
    /// History recording for devices created from now on: Some(max entries) when on.
    history: Mutex<Option<usize>>,
    devices: Vec<spin::Once<Mutex<CachingAllocator>>>,
}

impl Accelerator {
    /// Wrap `backend` so that its segments are recorded in `index`.
    pub fn new(
        device_type: DeviceType,
        backend: Arc<dyn Backend>,
        index: Arc<SegmentIndex>,
        config: CachingConfig,
    ) -> Self {
        let count = backend.device_count();
        Accelerator {
            device_type,
            backend: Arc::new(IndexedBackend::new(backend, device_type, index)),
            config: Mutex::new(config),
            history: Mutex::new(None),
            devices: (0..count).map(|_| spin::Once::new()).collect(),
        }
    }

    fn config(&self) -> MutexGuard<'_, CachingConfig> {
        // The config is plain data: a panic elsewhere cannot leave it half-written.
        self.config
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The settings in force.
    pub fn settings(&self) -> CachingConfig {
        self.config().clone()
    }

    /// Apply a configuration string on top of the settings in force, on every device; on error nothing
    /// changes.
    pub fn set_settings(&self, text: &str) -> Result<()> {
        let mut config = self.config();
        let updated = parse_settings(text, &config)?;
        for (index, slot) in self.devices.iter().enumerate() {
            if slot.is_completed() {
                self.lock(index)?.set_config(updated.clone());
            }
        }
        *config = updated;
        Ok(())
    }

    pub fn device_type(&self) -> DeviceType {
        self.device_type
    }

    pub fn name(&self) -> &str {
        self.backend.name()
    }

    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Check a device index from the C ABI (-1 = this thread's current device).
    pub fn resolve(&self, device: i32) -> Result<usize> {
        let index = if device == -1 {
            current_device_of(self.device_type) as i64
        } else {
            device as i64
        };
        if index < 0 || index >= self.devices.len() as i64 {
            return Err(Error::invalid_device(format!(
                "device {device} does not exist: {} has {} device(s), indices 0 to {} (or -1 for the \
                 current device)",
                self.name(),
                self.devices.len(),
                self.devices.len() as i64 - 1
            )));
        }
        Ok(index as usize)
    }

    /// Lock the caching allocator of device `index` (a resolved index), creating it on first use.
    pub fn lock(&self, index: usize) -> Result<MutexGuard<'_, CachingAllocator>> {
        let slot = self.devices[index].try_call_once(|| {
            let mut allocator =
                CachingAllocator::new(self.backend.clone(), index, self.config().clone())?;
            if let Some(entries) = *self.history.lock().unwrap_or_else(|p| p.into_inner()) {
                allocator.record_history(true, entries);
            }
            Ok::<_, Error>(Mutex::new(allocator))
        })?;
        slot.lock().map_err(|_| {
            Error::new(
                ErrorKind::Internal,
                format!(
                    "{} device {index} is unusable: a thread panicked while holding it",
                    self.name()
                ),
            )
        })
    }

    /// Lock a device given as a C ABI index.
    pub fn device(&self, device: i32) -> Result<MutexGuard<'_, CachingAllocator>> {
        self.lock(self.resolve(device)?)
    }

    /// Hand out `size` bytes (size > 0) on device `index` for `stream`. With release_lock_on_malloc,
    /// the backend is asked for a new segment without holding the device's lock, so other threads
    /// keep allocating from the cache meanwhile.
    pub fn malloc(&self, index: usize, size: usize, stream: StreamId) -> Result<usize> {
        let step = self.lock(index)?.malloc_begin(size, stream)?;
        match step {
            MallocStep::Done(ptr) => Ok(ptr),
            MallocStep::NeedSegment(request) => {
                let raw = self.backend.raw_alloc(index, request.size, request.stream);
                self.lock(index)?.malloc_finish(request, raw)
            }
        }
    }

    /// Start or stop recording allocator history on every device.
    pub fn record_history(&self, enabled: bool, max_entries: usize) -> Result<()> {
        let mut setting = self.history.lock().unwrap_or_else(|p| p.into_inner());
        *setting = enabled.then_some(max_entries);
        for (index, slot) in self.devices.iter().enumerate() {
            if slot.is_completed() {
                self.lock(index)?.record_history(enabled, max_entries);
            }
        }
        Ok(())
    }

    /// The summary table of one device.
    pub fn memory_summary(&self, device: i32, abbreviated: bool) -> Result<String> {
        let index = self.resolve(device)?;
        let stats = self.lock(index)?.stats();
        let title = format!("accalloc {}", self.name());
        Ok(memory_summary(&stats, index, &title, abbreviated))
    }

    /// Every segment and block of every device, the history of each device, and the settings.
    pub fn snapshot(&self) -> Result<serde_json::Value> {
        let mut segments = Vec::new();
        let mut traces = Vec::new();
        for (index, slot) in self.devices.iter().enumerate() {
            if !slot.is_completed() {
                traces.push(serde_json::Value::Array(Vec::new()));
                continue;
            }
            let device = self.lock(index)?;
            segments.extend(device.segments().iter().map(|s| s.to_json(index)));
            let entries = device
                .history()
                .map(|h| h.entries().map(|e| e.to_json()).collect());
            traces.push(serde_json::Value::Array(entries.unwrap_or_default()));
        }
        Ok(serde_json::json!({
            "segments": segments,
            "device_traces": traces,
            "allocator_settings": settings_json(&self.settings()),
        }))
    }

    /// Release the cached segments of every device in use.
    pub fn empty_cache(&self) -> Result<()> {
        let mut first_error = None;
        for (index, slot) in self.devices.iter().enumerate() {
            if slot.is_completed() {
                if let Err(e) = self.lock(index).and_then(|mut d| d.empty_cache()) {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

fn not_ours(ptr: usize) -> Error {
    Error::invalid_pointer(format!(
        "pointer {ptr:#x} was not allocated by accalloc (it lies in no segment accalloc holds)"
    ))
}

/// Everything the library knows, created once.
pub struct Runtime {
    host: Accelerator,
    index: Arc<SegmentIndex>,
}

static RUNTIME: spin::Once<std::result::Result<Runtime, Error>> = spin::Once::new();

thread_local! {
    /// This thread's current device, per device type (as cudaSetDevice is per thread).
    static CURRENT_DEVICE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn current_device_of(device_type: DeviceType) -> usize {
    CURRENT_DEVICE.with(|c| c.borrow().get(device_type as usize).copied().unwrap_or(0))
}

fn set_current_device_of(device_type: DeviceType, index: usize) {
    CURRENT_DEVICE.with(|c| {
        let mut current = c.borrow_mut();
        let slot = device_type as usize;
        if current.len() <= slot {
            current.resize(slot + 1, 0);
        }
        current[slot] = index;
    })
}

/// The runtime, initialised from the environment on first call; a configuration error is returned by
/// every call after it, unchanged.
pub fn runtime() -> Result<&'static Runtime> {
    RUNTIME
        .call_once(Runtime::from_env)
        .as_ref()
        .map_err(Clone::clone)
}

impl Runtime {
    fn from_env() -> Result<Runtime> {
        let settings = HostSettings::from_env()?;
        let config = match std::env::var(ALLOC_CONF_VAR) {
            Ok(text) => parse_settings(&text, &CachingConfig::default())
                .map_err(|e| Error::config(format!("{ALLOC_CONF_VAR}: {}", e.message)))?,
            Err(_) => CachingConfig::default(),
        };
        let index = Arc::new(SegmentIndex::default());
        let host = Accelerator::new(
            DEVICE_TYPE_HOST,
            Arc::new(HostBackend::new(settings)),
            index.clone(),
            config,
        );
        Ok(Runtime { host, index })
    }

    /// The accelerator that calls without an explicit type use.
    pub fn current(&self) -> &Accelerator {
        &self.host
    }

    /// The accelerator of a device type, if it exists in this process.
    pub fn accelerator(&self, device_type: DeviceType) -> Option<&Accelerator> {
        (device_type == DEVICE_TYPE_HOST).then_some(&self.host)
    }

    /// Hand out `size` bytes on `device` (-1 = current) for `stream`; size 0 gives a null pointer.
    pub fn malloc(&self, size: usize, device: i32, stream: StreamId) -> Result<usize> {
        let accelerator = self.current();
        let index = accelerator.resolve(device)?;
        if size == 0 {
            return Ok(0);
        }
        accelerator.malloc(index, size, stream)
    }

    /// Return memory from `malloc`; a null pointer is a no-op.
    pub fn free(&self, ptr: usize) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        self.with_owner(ptr, |device| device.free(ptr))
    }

    /// Note that `stream` uses the allocation at `ptr` (PyTorch's record_stream).
    pub fn record_stream(&self, ptr: usize, stream: StreamId) -> Result<()> {
        self.with_owner(ptr, |device| device.record_stream(ptr, stream))
    }

    /// Run `action` on the device that owns `ptr`, under that device's lock.
    fn with_owner<T>(
        &self,
        ptr: usize,
        action: impl FnOnce(&mut CachingAllocator) -> Result<T>,
    ) -> Result<T> {
        // Fast path: with a single device there is only one place the pointer can be.
        let current = self.current();
        if current.device_count() == 1 && current.devices[0].is_completed() {
            let result = action(&mut *current.lock(0)?);
            return match result {
                Err(e)
                    if e.kind == ErrorKind::InvalidPointer
                        && self.index.owner_of(ptr).is_none() =>
                {
                    Err(not_ours(ptr))
                }
                other => other,
            };
        }
        let (device_type, device) = self.index.owner_of(ptr).ok_or_else(|| not_ours(ptr))?;
        let accelerator = self.accelerator(device_type).ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "segment owned by an unknown accelerator",
            )
        })?;
        action(&mut *accelerator.lock(device)?)
    }

    /// Release cached memory on every device of the current accelerator.
    pub fn empty_cache(&self) -> Result<()> {
        self.current().empty_cache()
    }

    pub fn device_stats(&self, device: i32) -> Result<DeviceStats> {
        Ok(self.current().device(device)?.stats())
    }

    pub fn reset_accumulated_stats(&self, device: i32) -> Result<()> {
        self.current().device(device)?.reset_accumulated_stats();
        Ok(())
    }

    pub fn reset_peak_stats(&self, device: i32) -> Result<()> {
        self.current().device(device)?.reset_peak_stats();
        Ok(())
    }

    pub fn mem_get_info(&self, device: i32) -> Result<MemInfo> {
        self.current().device(device)?.mem_get_info()
    }

    pub fn set_memory_fraction(&self, fraction: f64, device: i32) -> Result<()> {
        self.current().device(device)?.set_memory_fraction(fraction)
    }

    pub fn device_count(&self) -> usize {
        self.current().device_count()
    }

    /// Change the allocator settings at run time (torch._C._accelerator_setAllocatorSettings).
    pub fn set_allocator_settings(&self, text: &str) -> Result<()> {
        self.current().set_settings(text)
    }

    pub fn current_device(&self) -> usize {
        current_device_of(self.current().device_type())
    }

    /// Make `device` this thread's current device of the current accelerator.
    pub fn set_device(&self, device: i32) -> Result<()> {
        if device < 0 {
            return Err(Error::invalid_device(format!(
                "device {device} does not exist: set_device takes an index from 0"
            )));
        }
        let accelerator = self.current();
        let index = accelerator.resolve(device)?;
        set_current_device_of(accelerator.device_type(), index);
        Ok(())
    }
}
