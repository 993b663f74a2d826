//! The process-wide state: which accelerators exist (the host, CUDA when present, backends registered
//! from C), which one is current, and the index of which device owns each address. Initialised once,
//! on first use, from the environment.
//!
//! - `accelerator`: one accelerator and its devices
//! - `current_device`: each thread's current device
//! - `ownership`: which device an address belongs to
//! - `trace_log`: ACCALLOC_TRACE, every operation of the process written as a trace
//! - `device_lock`: the lock each device's allocator sits behind
//! - `fork`: what a fork() child gets (a clear error, never a hang)
//! - `reentry`: refusing calls from a backend's callbacks into its own device type
//! - `sole_device`: the shortcut to the one device that holds memory, while there is only one
//! - `owner_guess`: each thread's last answer of the segment index, tried before asking it again

pub mod accelerator;
pub mod current_device;
pub mod device_lock;
pub mod environment;
mod fork;
pub(crate) mod last_error;
pub mod observers;
mod owner_guess;
pub mod pinned_host;
pub mod pools;
/// The one-device shortcut's switches, for the benchmark (`accalloc bench` times both paths): the
/// `bench-internals` feature, which the tools crate turns on; not part of the library's API.
#[cfg(feature = "bench-internals")]
pub use sole_device::{suspended as with_shortcut_suspended, taken as shortcut_taken};
pub mod ownership;
mod reentry;
mod sleep;
mod sole_device;
pub mod trace_log;

pub use accelerator::Accelerator;

use crate::backend::host::HostBackend;
use crate::backend::{Backend, StreamId};
use crate::caching::{CachingAllocator, CachingConfig};
use crate::error::{Error, ErrorKind, Result};
use ownership::SegmentIndex;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

pub use environment::{Environment, ALLOC_CONF_VAR, DEVICE_VAR};

/// A kind of accelerator, as the C ABI numbers them.
pub type DeviceType = i32;
/// The host backend's device type.
pub const DEVICE_TYPE_HOST: DeviceType = 0;
/// CUDA's device type.
pub const DEVICE_TYPE_CUDA: DeviceType = 1;
/// The first device type given to a registered backend.
pub const FIRST_REGISTERED_TYPE: DeviceType = 2;
/// How many device types a process can hold.
pub const MAX_DEVICE_TYPES: usize = 16;

/// Everything the library knows, created once.
pub struct Runtime {
    /// Accelerators by device type; each is created once and lives as long as the process.
    accelerators: [spin::Once<&'static Accelerator>; MAX_DEVICE_TYPES],
    current: AtomicI32,
    index: Arc<SegmentIndex>,
    /// The settings from ACCALLOC_CONF, which every accelerator starts with.
    initial_config: CachingConfig,
    /// Serializes registrations.
    registering: Mutex<()>,
    /// Why CUDA is not in use, when it is not.
    cuda_absent_because: Option<String>,
}

static RUNTIME: spin::Once<std::result::Result<Runtime, Error>> = spin::Once::new();

/// The runtime, initialised from the environment on first call; a configuration error is returned by
/// every call after it, unchanged.
/// In the child of a fork every call fails (see `fork`).
#[inline]
pub fn runtime() -> Result<&'static Runtime> {
    let state = match RUNTIME.get() {
        Some(state) => state,
        None => initialise()?,
    };
    fork::check()?;
    state.as_ref().map_err(Clone::clone)
}

#[cold]
fn initialise() -> Result<&'static std::result::Result<Runtime, Error>> {
    // Before anything a fork could leave half done; the check comes first, since a parent may have
    // forked while another thread was initialising.
    fork::watch();
    fork::check()?;
    Ok(RUNTIME.call_once(Runtime::from_env))
}

#[cfg(feature = "cuda")]
fn detect_cuda() -> std::result::Result<Arc<dyn Backend>, String> {
    crate::backend::cuda::CudaBackend::detect().map(|b| Arc::new(b) as Arc<dyn Backend>)
}

#[cfg(not(feature = "cuda"))]
fn detect_cuda() -> std::result::Result<Arc<dyn Backend>, String> {
    Err("accalloc was built without the cuda feature".into())
}

fn not_ours(ptr: usize) -> Error {
    Error::invalid_pointer(format!(
        "pointer {ptr:#x} was not allocated by accalloc (it lies in no segment accalloc holds)"
    ))
}

impl Runtime {
    fn from_env() -> Result<Runtime> {
        // The environment is read here, once, and nowhere else in the library.
        let env = Environment::read();
        let settings = env.host_settings()?;
        trace_log::start_if(env.trace_path())?;
        let initial_config = env.initial_config()?;
        let forced = env.forced_device()?.map(str::to_string);
        let mut runtime = Runtime {
            accelerators: std::array::from_fn(|_| spin::Once::new()),
            current: AtomicI32::new(DEVICE_TYPE_HOST),
            index: Arc::new(SegmentIndex::new(sole_device::give_up)),
            initial_config,
            registering: Mutex::new(()),
            cuda_absent_because: None,
        };
        runtime.install(DEVICE_TYPE_HOST, Arc::new(HostBackend::new(settings)));
        if forced.as_deref() == Some("host") {
            runtime.cuda_absent_because = Some(format!("{DEVICE_VAR}=host"));
            return Ok(runtime);
        }
        match detect_cuda() {
            Ok(cuda) => {
                runtime.install(DEVICE_TYPE_CUDA, cuda);
                runtime.current.store(DEVICE_TYPE_CUDA, Ordering::Release);
            }
            Err(why) if forced.is_some() => {
                return Err(Error::config(format!(
                    "{DEVICE_VAR}=cuda but CUDA is not available: {why}"
                )))
            }
            Err(why) => runtime.cuda_absent_because = Some(why),
        }
        Ok(runtime)
    }

    /// Why the CUDA accelerator is not in use (None when it is).
    pub fn cuda_absent_because(&self) -> Option<&str> {
        self.cuda_absent_because.as_deref()
    }

    fn install(&self, device_type: DeviceType, backend: Arc<dyn Backend>) -> &'static Accelerator {
        let accelerator = Accelerator::new(
            device_type,
            backend,
            self.index.clone(),
            self.initial_config.clone(),
        );
        // Accelerators are never removed: pointers and device types given out stay valid.
        let leaked: &'static Accelerator = Box::leak(Box::new(accelerator));
        self.accelerators[device_type as usize].call_once(|| leaked)
    }

    /// The accelerator that calls without an explicit type use.
    #[inline]
    pub fn current(&self) -> &'static Accelerator {
        let device_type = self.current.load(Ordering::Acquire);
        self.lookup(device_type)
            .expect("the current device type always exists")
    }

    /// The accelerator of a device type, to act on: refused from inside one of its own backend's
    /// callbacks (see `reentry`).
    #[inline]
    pub fn accelerator(&self, device_type: DeviceType) -> Result<&'static Accelerator> {
        let accelerator = self.lookup(device_type)?;
        reentry::check(device_type, accelerator.name())?;
        Ok(accelerator)
    }

    /// Every accelerator registered so far.
    pub fn accelerators(&self) -> impl Iterator<Item = &'static Accelerator> + '_ {
        self.accelerators
            .iter()
            .filter_map(|once| once.get().copied())
    }

    #[inline]
    fn lookup(&self, device_type: DeviceType) -> Result<&'static Accelerator> {
        usize::try_from(device_type)
            .ok()
            .and_then(|slot| self.accelerators.get(slot))
            .and_then(|once| once.get().copied())
            .ok_or_else(|| self.no_such_type(device_type))
    }

    #[cold]
    fn no_such_type(&self, device_type: DeviceType) -> Error {
        // CUDA's type is known by number; say why this process went without it.
        let why = match (device_type, self.cuda_absent_because()) {
            (DEVICE_TYPE_CUDA, Some(why)) => format!(": CUDA is not in use ({why})"),
            _ => String::new(),
        };
        Error::invalid_argument(format!(
            "device type {device_type} does not exist in this process (known: {}){why}",
            self.known_types()
        ))
    }

    fn known_types(&self) -> String {
        self.accelerators
            .iter()
            .filter_map(|once| once.get())
            .map(|a| format!("{} = {}", a.device_type(), a.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Make `device_type` the accelerator of calls without an explicit type.
    pub fn set_accelerator(&self, device_type: DeviceType) -> Result<()> {
        self.accelerator(device_type)?;
        self.current.store(device_type, Ordering::Release);
        Ok(())
    }

    /// Add a backend as a new device type, with the whole caching allocator on top.
    pub fn register(&self, backend: Arc<dyn Backend>) -> Result<DeviceType> {
        let _serial = self.registering.lock().unwrap_or_else(|p| p.into_inner());
        let name = backend.name().to_string();
        let devices = backend.device_count();
        if !(1..=crate::backend::MAX_DEVICES).contains(&devices) {
            return Err(Error::invalid_argument(format!(
                "backend {} drives {devices} device(s); 1 to {} are supported",
                crate::error::quote(&name),
                crate::backend::MAX_DEVICES
            )));
        }
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(Error::invalid_argument(format!(
                "backend name {} is not valid: use 1 to 64 letters, digits, '_' or '-'",
                crate::error::quote(&name)
            )));
        }
        if ["host", "cuda"].contains(&name.as_str())
            || self
                .accelerators
                .iter()
                .any(|o| o.get().is_some_and(|a| a.name() == name))
        {
            return Err(Error::invalid_argument(format!(
                "a backend named '{name}' is registered already"
            )));
        }
        let slot = (FIRST_REGISTERED_TYPE as usize..MAX_DEVICE_TYPES)
            .find(|&slot| !self.accelerators[slot].is_completed())
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "no room for another backend: a process holds at most {} registered backends",
                    MAX_DEVICE_TYPES - FIRST_REGISTERED_TYPE as usize
                ))
            })?;
        self.install(slot as DeviceType, backend);
        Ok(slot as DeviceType)
    }

    /// malloc on the current accelerator (the C ABI's accalloc_malloc).
    #[inline]
    pub fn malloc_current(&self, size: usize, device: i32, stream: StreamId) -> Result<usize> {
        let device_type = self.current.load(Ordering::Acquire);
        if let Some(ptr) = Self::malloc_on_sole(device_type, size, device, stream) {
            return Ok(ptr);
        }
        self.malloc_slow(self.accelerator(device_type)?, size, device, stream)
    }

    /// malloc on the accelerator of `device_type` (the C ABI's accalloc_malloc_on).
    #[inline]
    pub fn malloc_on(
        &self,
        device_type: DeviceType,
        size: usize,
        device: i32,
        stream: StreamId,
    ) -> Result<usize> {
        if let Some(ptr) = Self::malloc_on_sole(device_type, size, device, stream) {
            return Ok(ptr);
        }
        self.malloc_slow(self.accelerator(device_type)?, size, device, stream)
    }

    /// A cached block from the sole device, when the call is for it (see `sole_device`).
    #[inline(always)]
    fn malloc_on_sole(
        device_type: DeviceType,
        size: usize,
        device: i32,
        stream: StreamId,
    ) -> Option<usize> {
        let sole = sole_device::sole()?;
        // ACCALLOC_TRACE records mallocs in Accelerator::alloc: while it is on, go there.
        if !sole.serves(device_type, device) || size == 0 || trace_log::enabled() {
            return None;
        }
        // A miss or a poisoned device: the general path answers.
        sole.lock.lock().ok()?.malloc_cached(size, stream)
    }

    #[inline(never)]
    fn malloc_slow(
        &self,
        accelerator: &Accelerator,
        size: usize,
        device: i32,
        stream: StreamId,
    ) -> Result<usize> {
        // Each arm rebuilds its value after the check: a result held across a call is stored to
        // the stack and read back, a store-forwarding stall on every call of the general path.
        match accelerator.alloc(size, device, stream) {
            Ok(ptr) => {
                self.try_take_sole_device();
                Ok(ptr)
            }
            Err(e) => {
                self.try_take_sole_device();
                Err(e)
            }
        }
    }

    /// Return memory from malloc, whichever accelerator it came from; a null pointer is a no-op.
    #[inline]
    pub fn free(&self, ptr: usize) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        trace_log::free(ptr);
        if let Some(lock) = sole_device::sole_for_free() {
            if let Ok(mut allocator) = lock.lock() {
                return match allocator.free(ptr) {
                    Err(e)
                        if e.kind == ErrorKind::InvalidPointer
                            && self.index.owner_of(ptr).is_none() =>
                    {
                        Err(not_ours(ptr))
                    }
                    other => other,
                };
            }
        }
        self.free_slow(ptr)
    }

    #[inline(never)]
    fn free_slow(&self, ptr: usize) -> Result<()> {
        // As in malloc_slow: the Ok arm is rebuilt, not held across the check.
        match self.with_owner(ptr, |device| device.free(ptr)) {
            Ok(()) => {
                self.try_take_sole_device();
                Ok(())
            }
            Err(e) => {
                self.try_take_sole_device();
                Err(e)
            }
        }
    }

    /// The live allocation at `ptr`: its device type, device index and the bytes it holds (as
    /// memory_allocated counts them). Not on a hot path: the segment index answers, under its lock.
    pub fn allocation_of(&self, ptr: usize) -> Result<(i32, usize, usize)> {
        let (_, _, (device_type, device)) =
            self.index.segment_of(ptr).ok_or_else(|| not_ours(ptr))?;
        let size = self
            .accelerator(device_type)?
            .lock(device)?
            .allocation_size(ptr)?;
        Ok((device_type, device, size))
    }

    /// Note that `stream` uses the allocation at `ptr` (PyTorch's record_stream).
    pub fn record_stream(&self, ptr: usize, stream: StreamId) -> Result<()> {
        let result = self.with_owner(ptr, |device| device.record_stream(ptr, stream));
        if result.is_ok() {
            trace_log::record_stream(ptr, stream);
        }
        result
    }

    /// Run `action` on the device that owns `ptr`, under that device's lock.
    #[inline]
    fn with_owner<T>(
        &self,
        ptr: usize,
        action: impl Fn(&mut CachingAllocator) -> Result<T>,
    ) -> Result<T> {
        // This thread's last answer first: asking the index takes its read lock, whose counter is
        // written by every thread that frees on any device. A guess that has gone stale (the segment
        // went back and its addresses now belong to another device) finds no live block there, and
        // then the index answers.
        // Inside a registered backend's callback the general path answers, with its error.
        if let Some((_, lock)) =
            owner_guess::guess(ptr).filter(|&(device_type, _)| !reentry::inside(device_type))
        {
            if let Ok(mut allocator) = lock.lock() {
                // Ok is rebuilt rather than the whole result moved: moving it reads back in 16
                // bytes what the call wrote in smaller stores, a stall on every free.
                match action(&mut allocator) {
                    Ok(value) => return Ok(value),
                    Err(e) if e.kind == ErrorKind::InvalidPointer => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let (start, end, (device_type, device)) =
            self.index.segment_of(ptr).ok_or_else(|| not_ours(ptr))?;
        let accelerator = self.accelerator(device_type)?;
        if let Some(lock) = accelerator.created_device(device) {
            owner_guess::remember(start, end, device_type, lock);
        }
        action(&mut *accelerator.lock(device)?)
    }
}
