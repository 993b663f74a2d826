//! The host backend: segments are anonymous memory mappings from the operating system, so a released
//! segment really goes back (its pages dropped). Each host "device" has a capacity that the backend
//! enforces, and a window of address space of its own where its segments are placed
//! (address_window.rs: the same addresses in any process, hence the same statistics).
//! Always available; the default accelerator when no GPU is found.

use super::address_window::{self, page_size, AddressWindow};
use super::{Backend, BackendError, EventId, MemInfo, PinnedHostAllocation, StreamId};
use crate::error::{Error, Result};
use crate::units::parse_byte_size;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Environment variable: capacity of each host device ("8GiB", "512MiB", or bytes).
pub const CAPACITY_VAR: &str = "ACCALLOC_HOST_CAPACITY";
/// Environment variable: how many host devices to present.
pub const DEVICES_VAR: &str = "ACCALLOC_HOST_DEVICES";
/// Environment variable: make device calls fail on purpose, to test the failure paths:
/// "alloc:every=7" (every 7th raw allocation or mapping fails as out of memory), "alloc:after=100"
/// (all after the first 100 fail), "event:every=3" / "event:after=N" (the event and stream calls:
/// create, record, query, synchronize and destroy an event, synchronize a stream, fail with an
/// error), or one of each, separated by a comma: "alloc:every=7,event:every=3".
pub const FAIL_VAR: &str = "ACCALLOC_HOST_FAIL";
/// Upper bound on ACCALLOC_HOST_DEVICES, matching the widest device index PyTorch supports (int8).
pub const MAX_HOST_DEVICES: usize = 64;

/// Injected failures of device allocations (raw allocations and mappings, counted together per
/// backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailRule {
    /// Every n-th allocation fails as out of memory.
    Every(u64),
    /// Every allocation after the first n fails as out of memory.
    After(u64),
}

impl FailRule {
    /// Parse "alloc:every=N" (N >= 1) or "alloc:after=N".
    pub fn parse(text: &str) -> Result<FailRule> {
        Self::parse_for("alloc", text).ok_or_else(|| invalid_fail_rule(text))
    }

    /// Parse ACCALLOC_HOST_FAIL: (the rule for allocations, the rule for event and stream calls).
    pub fn parse_rules(text: &str) -> Result<(Option<FailRule>, Option<FailRule>)> {
        let (mut alloc, mut event) = (None, None);
        for part in text.split(',') {
            let slot = if part.trim().starts_with("event:") {
                (&mut event, "event")
            } else {
                (&mut alloc, "alloc")
            };
            let rule = Self::parse_for(slot.1, part).ok_or_else(|| invalid_fail_rule(text))?;
            if slot.0.replace(rule).is_some() {
                return Err(invalid_fail_rule(text));
            }
        }
        Ok((alloc, event))
    }

    /// "{kind}:every=N" (N >= 1) or "{kind}:after=N".
    fn parse_for(kind: &str, text: &str) -> Option<FailRule> {
        let rest = text.trim().strip_prefix(kind)?.strip_prefix(':');
        rest.and_then(|rest| {
            let (kind, n) = rest.split_once('=')?;
            let n: u64 = n.trim().parse().ok()?;
            match kind.trim() {
                "every" if n >= 1 => Some(FailRule::Every(n)),
                "after" => Some(FailRule::After(n)),
                _ => None,
            }
        })
    }

    /// Whether allocation number `call` (from 1) fails.
    fn fails(self, call: u64) -> bool {
        match self {
            FailRule::Every(n) => call.is_multiple_of(n),
            FailRule::After(n) => call > n,
        }
    }
}

fn invalid_fail_rule(text: &str) -> Error {
    Error::config(format!(
        "{FAIL_VAR}={} is not a valid failure rule: give alloc:every=N (N >= 1), alloc:after=N, \
         event:every=N or event:after=N, or one alloc and one event rule separated by a comma",
        crate::error::quote(text)
    ))
}

/// How the host backend is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostSettings {
    /// Bytes each device can hold.
    pub capacity: usize,
    /// How many devices.
    pub devices: usize,
    /// Injected allocation failures (ACCALLOC_HOST_FAIL), for tests.
    pub fail: Option<FailRule>,
    /// Injected failures of event and stream calls (ACCALLOC_HOST_FAIL's event: rule), for tests.
    pub event_fail: Option<FailRule>,
}

impl HostSettings {
    /// Build settings from ACCALLOC_HOST_CAPACITY's and ACCALLOC_HOST_DEVICES's values (None when
    /// unset: the machine's physical memory and one device); a bad value is an error that names the
    /// variable. The core reads no environment: the C library's runtime::environment does, and
    /// adds ACCALLOC_HOST_FAIL's rules.
    pub fn from_values(capacity: Option<&str>, devices: Option<&str>) -> Result<Self> {
        let capacity = match capacity {
            None => physical_memory(),
            Some(text) => match parse_byte_size(text) {
                Some(bytes) if bytes >= 512 && bytes <= isize::MAX as u64 => bytes as usize,
                _ => {
                    return Err(Error::config(format!(
                        "{CAPACITY_VAR}={} is not a valid capacity: give bytes or a size with a \
                         unit such as 512MiB or 8GiB (at least 512 bytes)",
                        crate::error::quote(text)
                    )))
                }
            },
        };
        let devices = match devices {
            None => 1,
            Some(text) => match text.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_HOST_DEVICES).contains(&n) => n,
                _ => {
                    return Err(Error::config(format!(
                        "{DEVICES_VAR}={} is not a valid device count: give an integer from 1 to \
                         {MAX_HOST_DEVICES}",
                        crate::error::quote(text)
                    )))
                }
            },
        };
        Ok(HostSettings {
            capacity,
            devices,
            fail: None,
            event_fail: None,
        })
    }
}

/// The machine's physical memory in bytes.
pub fn physical_memory() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page_size <= 0 {
        return 1 << 30;
    }
    (pages as usize).saturating_mul(page_size as usize)
}

/// Host memory as devices.
pub struct HostBackend {
    settings: HostSettings,
    used: Vec<AtomicUsize>,
    /// Device allocations asked for so far (for injected failures).
    allocations: std::sync::atomic::AtomicU64,
    /// Event and stream calls made so far (for injected failures).
    event_calls: std::sync::atomic::AtomicU64,
    /// Each device's address window (None where the system refused one: segments then go
    /// wherever mmap puts them).
    windows: Vec<Option<AddressWindow>>,
}

/// A device's window: twice its capacity, so fragmentation alone never fills it, within bounds
/// that keep 64 devices of a large machine inside the address space.
fn window_size(capacity: usize) -> usize {
    let size = capacity.div_ceil(address_window::LARGE_ALIGNMENT) * address_window::LARGE_ALIGNMENT;
    size.saturating_mul(2).clamp(1 << 30, 1 << 40)
}

impl HostBackend {
    pub fn new(settings: HostSettings) -> Self {
        HostBackend {
            windows: (0..settings.devices)
                .map(|_| AddressWindow::reserve(window_size(settings.capacity)))
                .collect(),
            settings,
            used: (0..settings.devices).map(|_| AtomicUsize::new(0)).collect(),
            allocations: std::sync::atomic::AtomicU64::new(0),
            event_calls: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn settings(&self) -> HostSettings {
        self.settings
    }

    /// Claim `size` bytes of the device's capacity, or say there is no room (also when a failure is
    /// injected for this allocation).
    fn claim(&self, device: usize, size: usize) -> bool {
        if let Some(rule) = self.settings.fail {
            let call = self.allocations.fetch_add(1, Ordering::AcqRel) + 1;
            if rule.fails(call) {
                return false;
            }
        }
        self.used[device]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(size)
                    .filter(|&total| total <= self.settings.capacity)
            })
            .is_ok()
    }
}

impl HostBackend {
    /// The host's work is synchronous, so events complete at once; an event or stream call fails
    /// only when ACCALLOC_HOST_FAIL's event rule says so.
    fn event_call(&self, call: &str) -> std::result::Result<(), BackendError> {
        let Some(rule) = self.settings.event_fail else {
            return Ok(());
        };
        let number = self.event_calls.fetch_add(1, Ordering::AcqRel) + 1;
        if rule.fails(number) {
            return Err(BackendError::Failed {
                code: -1,
                message: format!("{call} failed (injected by {FAIL_VAR}, call {number})"),
            });
        }
        Ok(())
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &str {
        "host"
    }

    fn device_count(&self) -> usize {
        self.settings.devices
    }

    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        _stream: StreamId,
    ) -> std::result::Result<usize, BackendError> {
        if size == 0 || !self.claim(device, size) {
            return Err(BackendError::OutOfMemory);
        }
        let window = self.windows[device].as_ref();
        let place = window.and_then(|w| w.take(size));
        // SAFETY: anywhere, or over the range of this device's window just taken, which nothing else
        // uses. NORESERVE because, as on a GPU, reserving a segment should not commit every page of
        // it up front.
        let mapped = unsafe {
            address_window::map_anonymous(place, size, libc::PROT_READ | libc::PROT_WRITE)
        };
        let Some(ptr) = mapped else {
            if let (Some(w), Some(start)) = (window, place) {
                w.give_back(start);
            }
            self.used[device].fetch_sub(size, Ordering::AcqRel);
            return Err(BackendError::OutOfMemory);
        };
        Ok(ptr)
    }

    fn raw_free(
        &self,
        device: usize,
        ptr: usize,
        size: usize,
    ) -> std::result::Result<(), BackendError> {
        let window = self.windows[device].as_ref().filter(|w| w.contains(ptr));
        // SAFETY: the caching layer frees only segments this backend mapped, with their exact size,
        // and uses them no more. One in the window becomes inaccessible reservation again.
        let released = unsafe {
            match window {
                Some(w) => w.unmap(ptr, size),
                None => libc::munmap(ptr as *mut libc::c_void, size) == 0,
            }
        };
        if !released {
            return Err(os_error("munmap", size, ptr));
        }
        self.used[device].fetch_sub(size, Ordering::AcqRel);
        Ok(())
    }

    fn mem_get_info(&self, device: usize) -> std::result::Result<MemInfo, BackendError> {
        let used = self.used[device].load(Ordering::Acquire);
        Ok(MemInfo {
            free: self.settings.capacity.saturating_sub(used),
            total: self.settings.capacity,
        })
    }

    // Events and streams: the host's work is synchronous, so both are supported and an event
    // completes as soon as it is recorded (see event_call).

    fn events_supported(&self) -> bool {
        true
    }

    fn create_event(&self, _device: usize) -> std::result::Result<EventId, BackendError> {
        self.event_call("create_event").map(|()| 0)
    }

    fn record_event(
        &self,
        _device: usize,
        _event: EventId,
        _stream: StreamId,
    ) -> std::result::Result<(), BackendError> {
        self.event_call("record_event")
    }

    fn query_event(
        &self,
        _device: usize,
        _event: EventId,
    ) -> std::result::Result<bool, BackendError> {
        self.event_call("query_event").map(|()| true)
    }

    fn synchronize_event(
        &self,
        _device: usize,
        _event: EventId,
    ) -> std::result::Result<(), BackendError> {
        self.event_call("synchronize_event")
    }

    fn destroy_event(
        &self,
        _device: usize,
        _event: EventId,
    ) -> std::result::Result<(), BackendError> {
        self.event_call("destroy_event")
    }

    fn stream_synchronize_supported(&self) -> bool {
        true
    }

    fn synchronize_stream(
        &self,
        _device: usize,
        _stream: StreamId,
    ) -> std::result::Result<(), BackendError> {
        self.event_call("stream_synchronize")
    }

    // Virtual memory: a reservation is an inaccessible mapping; mapping a range makes it readable and
    // writable and counts it against the capacity; unmapping drops its pages (MADV_DONTNEED) so the
    // memory really goes back, and makes it inaccessible again.

    fn vm_granularity(&self, _device: usize) -> Option<usize> {
        Some(page_size())
    }

    fn vm_reserve(&self, _device: usize, size: usize) -> std::result::Result<usize, BackendError> {
        address_window::reserve_inaccessible(size)
            .ok_or_else(|| os_error("mmap (reserve)", size, 0))
    }

    fn vm_map(
        &self,
        device: usize,
        ptr: usize,
        size: usize,
    ) -> std::result::Result<(), BackendError> {
        if !self.claim(device, size) {
            return Err(BackendError::OutOfMemory);
        }
        // SAFETY: the range lies inside a reservation made by vm_reserve.
        if unsafe {
            libc::mprotect(
                ptr as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        } != 0
        {
            self.used[device].fetch_sub(size, Ordering::AcqRel);
            return Err(os_error("mprotect (map)", size, ptr));
        }
        Ok(())
    }

    fn vm_unmap(
        &self,
        device: usize,
        ptr: usize,
        size: usize,
    ) -> std::result::Result<(), BackendError> {
        // SAFETY: the range lies inside a reservation and is no longer handed out.
        let ok = unsafe {
            libc::madvise(ptr as *mut libc::c_void, size, libc::MADV_DONTNEED) == 0
                && libc::mprotect(ptr as *mut libc::c_void, size, libc::PROT_NONE) == 0
        };
        if !ok {
            return Err(os_error("madvise/mprotect (unmap)", size, ptr));
        }
        self.used[device].fetch_sub(size, Ordering::AcqRel);
        Ok(())
    }

    fn vm_release(
        &self,
        _device: usize,
        ptr: usize,
        size: usize,
    ) -> std::result::Result<(), BackendError> {
        // SAFETY: the whole reservation is given back; nothing in it is mapped any more.
        if unsafe { libc::munmap(ptr as *mut libc::c_void, size) } != 0 {
            return Err(os_error("munmap (release)", size, ptr));
        }
        Ok(())
    }

    // Pinned host memory: a mapping of its own, page-locked with mlock where the system allows it
    // (RLIMIT_MEMLOCK is often small for unprivileged processes); where it refuses, the memory stays
    // ordinary and says so. It is the host's memory, not a device's: no device's capacity counts it.

    fn pinned_host_supported(&self) -> bool {
        true
    }

    fn copies_supported(&self) -> bool {
        true
    }

    fn copy_to_host(
        &self,
        _device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> std::result::Result<(), BackendError> {
        // SAFETY: the caller's ranges: `src` is mapped device (host) memory, `dst` a host buffer of
        // `size` bytes; they never overlap (the buffer is not device memory).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, size) };
        Ok(())
    }

    fn copy_from_host(
        &self,
        _device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> std::result::Result<(), BackendError> {
        // SAFETY: as in copy_to_host, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, size) };
        Ok(())
    }

    fn pinned_host_alloc(
        &self,
        size: usize,
    ) -> std::result::Result<PinnedHostAllocation, BackendError> {
        if let Some(rule) = self.settings.fail {
            let call = self.allocations.fetch_add(1, Ordering::AcqRel) + 1;
            if rule.fails(call) {
                return Err(BackendError::OutOfMemory);
            }
        }
        // SAFETY: a fresh anonymous mapping anywhere.
        let Some(ptr) = (unsafe {
            address_window::map_anonymous(None, size, libc::PROT_READ | libc::PROT_WRITE)
        }) else {
            return Err(BackendError::OutOfMemory);
        };
        // SAFETY: the range was just mapped.
        let page_locked = unsafe { libc::mlock(ptr as *const libc::c_void, size) } == 0;
        Ok(PinnedHostAllocation { ptr, page_locked })
    }

    fn pinned_host_free(&self, ptr: usize, size: usize) -> std::result::Result<(), BackendError> {
        // SAFETY: the host cache frees only what pinned_host_alloc mapped, with its size; munmap
        // also unlocks the pages.
        if unsafe { libc::munmap(ptr as *mut libc::c_void, size) } != 0 {
            return Err(os_error("munmap (pinned host memory)", size, ptr));
        }
        Ok(())
    }
}

fn os_error(call: &str, size: usize, ptr: usize) -> BackendError {
    let errno = std::io::Error::last_os_error();
    BackendError::Failed {
        code: errno.raw_os_error().unwrap_or(-1) as i64,
        message: format!("{call} of {size} bytes at {ptr:#x} failed: {errno}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_to_physical_memory_and_one_device() {
        let settings = HostSettings::from_values(None, None).unwrap();
        assert_eq!(settings.devices, 1);
        assert_eq!(settings.capacity, physical_memory());
    }

    #[test]
    fn settings_parse_units_and_counts() {
        let settings = HostSettings::from_values(Some("512MiB"), Some("3")).unwrap();
        assert_eq!(
            settings,
            HostSettings {
                capacity: 512 << 20,
                devices: 3,
                fail: None,
                event_fail: None,
            }
        );
    }

    #[test]
    fn bad_settings_name_the_variable() {
        let err = HostSettings::from_values(Some("lots"), None).unwrap_err();
        assert!(
            err.message.contains("ACCALLOC_HOST_CAPACITY='lots'"),
            "{}",
            err.message
        );
        let err = HostSettings::from_values(None, Some("0")).unwrap_err();
        assert!(
            err.message.contains("ACCALLOC_HOST_DEVICES='0'"),
            "{}",
            err.message
        );
        let err = HostSettings::from_values(None, Some("two")).unwrap_err();
        assert!(
            err.message.contains("ACCALLOC_HOST_DEVICES"),
            "{}",
            err.message
        );
    }

    #[test]
    fn failure_rules_parse_and_fire() {
        assert_eq!(
            FailRule::parse("alloc:every=7").unwrap(),
            FailRule::Every(7)
        );
        assert_eq!(
            FailRule::parse("alloc:after=100").unwrap(),
            FailRule::After(100)
        );
        for bad in [
            "alloc:every=0",
            "free:every=2",
            "alloc:sometimes=3",
            "alloc:every=x",
            "",
        ] {
            let err = FailRule::parse(bad).unwrap_err();
            assert!(
                err.message
                    .starts_with(&format!("ACCALLOC_HOST_FAIL='{bad}'")),
                "{}",
                err.message
            );
        }
        assert_eq!(
            FailRule::parse_rules("alloc:every=7").unwrap(),
            (Some(FailRule::Every(7)), None)
        );
        assert_eq!(
            FailRule::parse_rules("event:every=3").unwrap(),
            (None, Some(FailRule::Every(3)))
        );
        assert_eq!(
            FailRule::parse_rules("alloc:after=5, event:after=2").unwrap(),
            (Some(FailRule::After(5)), Some(FailRule::After(2)))
        );
        for bad in [
            "event:every=0",
            "alloc:every=2,alloc:every=3",
            "event:",
            "alloc:every=2,",
        ] {
            let err = FailRule::parse_rules(bad).unwrap_err();
            assert!(
                err.message
                    .starts_with(&format!("ACCALLOC_HOST_FAIL='{bad}'")),
                "{}",
                err.message
            );
        }
        let backend = HostBackend::new(HostSettings {
            capacity: 64 << 20,
            devices: 1,
            fail: None,
            event_fail: Some(FailRule::Every(2)),
        });
        assert!(backend.create_event(0).is_ok());
        assert!(backend.record_event(0, 0, 1).is_err());
        assert_eq!(backend.query_event(0, 0), Ok(true));
        assert!(backend.destroy_event(0, 0).is_err());
        let backend = HostBackend::new(HostSettings {
            capacity: 64 << 20,
            devices: 1,
            fail: Some(FailRule::Every(3)),
            event_fail: None,
        });
        let outcomes: Vec<bool> = (0..6)
            .map(|_| backend.raw_alloc(0, 4096, 0).is_ok())
            .collect();
        assert_eq!(outcomes, [true, true, false, true, true, false]);
    }

    #[test]
    fn capacity_is_enforced_and_memory_is_usable() {
        let backend = HostBackend::new(HostSettings {
            capacity: 4 << 20,
            devices: 2,
            fail: None,
            event_fail: None,
        });
        let a = backend.raw_alloc(0, 2 << 20, 0).unwrap();
        assert_eq!(a % 4096, 0, "segments are page aligned");
        // SAFETY: a is a fresh 2 MiB writable mapping.
        unsafe { std::ptr::write_bytes(a as *mut u8, 0xAB, 2 << 20) };
        let b = backend.raw_alloc(0, 2 << 20, 0).unwrap();
        assert_eq!(backend.raw_alloc(0, 512, 0), Err(BackendError::OutOfMemory));
        assert_eq!(
            backend.mem_get_info(0).unwrap(),
            MemInfo {
                free: 0,
                total: 4 << 20
            }
        );
        assert_eq!(
            backend.mem_get_info(1).unwrap().free,
            4 << 20,
            "devices are separate"
        );
        backend.raw_free(0, a, 2 << 20).unwrap();
        backend.raw_free(0, b, 2 << 20).unwrap();
        assert_eq!(backend.mem_get_info(0).unwrap().free, 4 << 20);
    }

    #[test]
    fn virtual_memory_maps_and_unmaps_inside_a_reservation() {
        let backend = HostBackend::new(HostSettings {
            capacity: 4 << 20,
            devices: 1,
            fail: None,
            event_fail: None,
        });
        assert_eq!(backend.vm_granularity(0), Some(page_size()));
        let base = backend.vm_reserve(0, 64 << 20).unwrap();
        assert_eq!(
            backend.mem_get_info(0).unwrap().free,
            4 << 20,
            "reserving costs no capacity"
        );
        backend.vm_map(0, base + (8 << 20), 2 << 20).unwrap();
        // SAFETY: the 2 MiB just mapped are readable and writable.
        unsafe { std::ptr::write_bytes((base + (8 << 20)) as *mut u8, 0x5A, 2 << 20) };
        backend.vm_map(0, base, 2 << 20).unwrap();
        assert_eq!(
            backend.vm_map(0, base + (2 << 20), 2 << 20),
            Err(BackendError::OutOfMemory)
        );
        backend.vm_unmap(0, base + (8 << 20), 2 << 20).unwrap();
        assert_eq!(backend.mem_get_info(0).unwrap().free, 2 << 20);
        backend.vm_map(0, base + (8 << 20), 2 << 20).unwrap();
        // SAFETY: remapped pages read as zero: the old contents really went back.
        assert_eq!(unsafe { *((base + (8 << 20)) as *const u8) }, 0);
        backend.vm_unmap(0, base + (8 << 20), 2 << 20).unwrap();
        backend.vm_unmap(0, base, 2 << 20).unwrap();
        backend.vm_release(0, base, 64 << 20).unwrap();
        assert_eq!(backend.mem_get_info(0).unwrap().free, 4 << 20);
    }
}
