//! One accelerator: a backend and a caching allocator per device (each behind its own lock), its
//! settings, and the per-device operations of the memory API.

use super::current_device::{current_device_of, set_current_device_of};
use super::device_lock::{DeviceGuard, DeviceLock};
use super::ownership::{IndexedBackend, SegmentIndex};
use super::DeviceType;
use crate::backend::{Backend, MemInfo, StreamId};
use crate::caching::settings::parse_settings;
use crate::caching::snapshot::settings_json;
use crate::caching::summary::memory_summary;
use crate::caching::{CachingAllocator, CachingConfig, DeviceStats, MallocStep};
use crate::error::{Error, ErrorKind, Result};
use std::sync::{Arc, Mutex, MutexGuard};

/// One accelerator: a backend and a caching allocator per device, created on first use.
pub struct Accelerator {
    device_type: DeviceType,
    /// The name as a C string, for accalloc_device_type_name (lives as long as the accelerator).
    c_name: std::ffi::CString,
    pub(super) backend: Arc<dyn Backend>,
    /// Where the segments of every device type are recorded (pool allocators' too).
    pub(super) index: Arc<SegmentIndex>,
    /// The settings every device of this accelerator runs with.
    config: Mutex<CachingConfig>,
    /// History recording for devices created from now on: Some(max entries) when on.
    history: Mutex<Option<usize>>,
    /// One slot per device; a device's allocator is made (and its memory taken) on first use, so
    /// that devices never used cost a few bytes each.
    devices: Vec<spin::Once<Box<DeviceLock<CachingAllocator>>>>,
    /// The pinned host caching allocator, made on first use (runtime/pinned_host.rs).
    pub(super) pinned_host: Mutex<Option<accalloc_core::pinned::PinnedHostCache>>,
    /// Set by the first pause of a pool on any device (runtime/sleep.rs): until then, asking
    /// whether memory is paused costs one load, not a device's lock.
    pub(super) paused_ever: std::sync::atomic::AtomicBool,
}

impl Accelerator {
    /// Wrap `backend` so that its segments are recorded in `index`. Devices past MAX_DEVICES are
    /// not offered (Runtime::register refuses such a backend).
    pub fn new(
        device_type: DeviceType,
        backend: Arc<dyn Backend>,
        index: Arc<SegmentIndex>,
        config: CachingConfig,
    ) -> Self {
        let count = backend.device_count().min(crate::backend::MAX_DEVICES);
        let c_name = std::ffi::CString::new(backend.name().replace('\0', " ")).unwrap_or_default();
        Accelerator {
            device_type,
            c_name,
            backend: Arc::new(IndexedBackend::new(backend, device_type, index.clone())),
            index,
            config: Mutex::new(config),
            history: Mutex::new(None),
            pinned_host: Mutex::new(None),
            paused_ever: std::sync::atomic::AtomicBool::new(false),
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
    /// changes. A per_process_memory_fraction reaches the devices only from a string that names it,
    /// so a fraction set since with set_memory_fraction is not undone by an unrelated string.
    pub fn set_settings(&self, text: &str) -> Result<()> {
        let mut config = self.config();
        let named = parse_settings(
            text,
            &CachingConfig {
                per_process_memory_fraction: None,
                ..config.clone()
            },
        )?;
        for (index, slot) in self.devices.iter().enumerate() {
            if slot.is_completed() {
                self.lock(index)?.set_config(named.clone());
            }
        }
        *config = CachingConfig {
            per_process_memory_fraction: named
                .per_process_memory_fraction
                .or(config.per_process_memory_fraction),
            ..named
        };
        // The pinned host cache's lock is taken after the settings' everywhere else: release first.
        drop(config);
        self.configure_pinned_host(&named);
        Ok(())
    }

    pub fn device_type(&self) -> DeviceType {
        self.device_type
    }

    pub fn name(&self) -> &str {
        self.backend.name()
    }

    /// The name as a NUL-terminated string.
    pub fn c_name(&self) -> &std::ffi::CStr {
        &self.c_name
    }

    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Check a device index from the C ABI (-1 = this thread's current device).
    #[inline]
    pub fn resolve(&self, device: i32) -> Result<usize> {
        // With one device the current device can only be 0 (set_device accepts nothing else): no
        // thread-local lookup, which from a shared library is a call into the dynamic linker.
        if device == -1 && self.devices.len() == 1 {
            return Ok(0);
        }
        let index = if device == -1 {
            current_device_of(self.device_type) as i64
        } else {
            device as i64
        };
        if index < 0 || index >= self.devices.len() as i64 {
            return Err(self.no_such_device(device));
        }
        Ok(index as usize)
    }

    #[cold]
    fn no_such_device(&self, device: i32) -> Error {
        Error::invalid_device(format!(
            "device {device} does not exist: {} has {} device(s), indices 0 to {} (or -1 for the \
             current device)",
            self.name(),
            self.devices.len(),
            self.devices.len() as i64 - 1
        ))
    }

    /// Lock the caching allocator of device `index` (a resolved index), creating it on first use.
    #[inline(always)]
    pub fn lock(&self, index: usize) -> Result<DeviceGuard<'_, CachingAllocator>> {
        let once = &self.devices[index];
        let slot = match once.get() {
            Some(slot) => slot,
            None => self.create_device(index)?,
        };
        slot.lock().map_err(|_| self.unusable(index))
    }

    #[cold]
    fn create_device(&self, index: usize) -> Result<&DeviceLock<CachingAllocator>> {
        let slot = self.devices[index].try_call_once(|| {
            // The settings are copied first: the backend's mem_get_info runs without our locks.
            let config = self.config().clone();
            let mut allocator = CachingAllocator::new(self.backend.clone(), index, config)?;
            let device_type = self.device_type;
            allocator.set_segment_observer(Some(Box::new(move |event| {
                super::observers::segment_event(device_type, event)
            })));
            if let Some(entries) = *self.history.lock().unwrap_or_else(|p| p.into_inner()) {
                allocator.record_history(true, entries);
            }
            Ok::<_, Error>(Box::new(DeviceLock::new(allocator)))
        })?;
        Ok(slot)
    }

    #[cold]
    fn unusable(&self, index: usize) -> Error {
        Error::new(
            ErrorKind::Internal,
            format!(
                "{} device {index} is unusable: a thread panicked while holding it",
                self.name()
            ),
        )
    }

    /// Device `index`'s lock, if its allocator exists.
    pub fn created_device(&self, index: usize) -> Option<&DeviceLock<CachingAllocator>> {
        self.devices.get(index)?.get().map(|boxed| &**boxed)
    }

    /// Lock a device given as a C ABI index.
    pub fn device(&self, device: i32) -> Result<DeviceGuard<'_, CachingAllocator>> {
        self.lock(self.resolve(device)?)
    }

    /// Hand out `size` bytes on `device` (-1 = this thread's current device) for `stream`; size 0
    /// gives a null pointer.
    #[inline]
    pub fn alloc(&self, size: usize, device: i32, stream: StreamId) -> Result<usize> {
        let index = self.resolve(device)?;
        if size == 0 {
            return Ok(0);
        }
        if !super::trace_log::enabled() {
            // The result goes straight to the caller: holding it here to look at it, as tracing
            // does, builds it on the stack and reads it back (a store-forwarding stall, ~5 ns).
            return self.malloc(index, size, stream);
        }
        self.malloc_traced(index, size, stream)
    }

    #[cold]
    #[inline(never)]
    fn malloc_traced(&self, index: usize, size: usize, stream: StreamId) -> Result<usize> {
        let result = self.malloc(index, size, stream);
        match result {
            Ok(ptr) => super::trace_log::malloc(index, size, stream, Some(ptr)),
            Err(ref e) if e.kind == ErrorKind::OutOfMemory => {
                super::trace_log::malloc(index, size, stream, None)
            }
            Err(_) => {}
        }
        result
    }

    /// Hand out `size` bytes (size > 0) on device `index` for `stream`. With release_lock_on_malloc,
    /// the backend is asked for a new segment without holding the device's lock, so other threads
    /// keep allocating from the cache meanwhile.
    #[inline]
    pub fn malloc(&self, index: usize, size: usize, stream: StreamId) -> Result<usize> {
        let mut device = self.lock(index)?;
        if let Some(ptr) = device.malloc_cached(size, stream) {
            return Ok(ptr);
        }
        let step = device.malloc_begin(size, stream);
        drop(device);
        match self.malloc_miss(index, step) {
            Ok(ptr) => Ok(ptr),
            Err(e) if e.kind == ErrorKind::OutOfMemory => Err(self.out_of_memory(index, e)),
            Err(e) => Err(e),
        }
    }

    /// The OOM observers hear of the failure, with the device let go, before the caller does.
    #[cold]
    #[inline(never)]
    fn out_of_memory(&self, index: usize, error: Error) -> Error {
        let reports = match self.lock(index) {
            Ok(mut device) => device.take_oom_reports(),
            Err(_) => return error,
        };
        super::observers::out_of_memory(self.device_type, &reports);
        error
    }

    /// The rest of a malloc the cache could not serve at once: each segment it needs is asked for
    /// with the device let go (release_lock_on_malloc), the retries after releasing cached memory
    /// too, as PyTorch asks for each of its tries.
    fn malloc_miss(&self, index: usize, step: Result<MallocStep>) -> Result<usize> {
        let mut step = step?;
        loop {
            let request = match step {
                MallocStep::Done(ptr) => return Ok(ptr),
                MallocStep::NeedSegment(request) => request,
            };
            let raw = self.backend.raw_alloc(index, request.size, request.stream);
            step = match self.lock(index) {
                Ok(mut device) => device.malloc_finish(request, raw)?,
                Err(error) => {
                    // The device became unusable meanwhile: the new segment goes back.
                    if let Ok(ptr) = raw {
                        let _ = self.backend.raw_free(index, ptr, request.size);
                    }
                    return Err(error);
                }
            };
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
        let (stats, paused) = {
            let allocator = self.lock(index)?;
            (allocator.stats(), allocator.paused_memory())
        };
        let title = format!("accalloc {}", self.name());
        Ok(memory_summary(&stats, &paused, index, &title, abbreviated))
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
        super::trace_log::empty_cache();
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

    pub fn device_stats(&self, device: i32) -> Result<DeviceStats> {
        Ok(self.device(device)?.stats())
    }

    /// What planned_placement's planner has done on `device` (None: the setting is off there).
    pub fn planner_counters(
        &self,
        device: i32,
    ) -> Result<Option<accalloc_core::planning::online::PlannerCounters>> {
        Ok(self.lock(self.resolve(device)?)?.planner_counters())
    }

    pub fn reset_accumulated_stats(&self, device: i32) -> Result<()> {
        self.device(device)?.reset_accumulated_stats();
        Ok(())
    }

    pub fn reset_peak_stats(&self, device: i32) -> Result<()> {
        self.device(device)?.reset_peak_stats();
        Ok(())
    }

    pub fn mem_get_info(&self, device: i32) -> Result<MemInfo> {
        self.device(device)?.mem_get_info()
    }

    pub fn set_memory_fraction(&self, fraction: f64, device: i32) -> Result<()> {
        self.device(device)?.set_memory_fraction(fraction)
    }

    pub fn memory_fraction(&self, device: i32) -> Result<f64> {
        Ok(self.device(device)?.memory_fraction())
    }

    /// This thread's current device of this accelerator.
    pub fn current_device(&self) -> usize {
        current_device_of(self.device_type)
    }

    /// Make `device` this thread's current device of this accelerator.
    pub fn set_device(&self, device: i32) -> Result<()> {
        if device < 0 {
            return Err(Error::invalid_device(format!(
                "device {device} does not exist: set_device takes an index from 0"
            )));
        }
        let index = self.resolve(device)?;
        set_current_device_of(self.device_type, index);
        Ok(())
    }
}
