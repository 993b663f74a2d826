//! The CUDA backend: NVIDIA GPUs through the driver API, via cudarc with libcuda loaded at run time.
//!
//! cudarc panics when libcuda cannot be loaded, or when a function is missing from it, so detection
//! first checks that the library loads, and every call into cudarc runs inside a panic guard. Each
//! device is driven through its primary context. Segments come from cuMemAlloc; expandable segments
//! from cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess at the device's granularity;
//! pinned host memory from cuMemHostAlloc, portable, so that every device's copies may use it;
//! sleep's backups through cuMemcpyDtoH / cuMemcpyHtoD. Memory is taken with the thread's
//! stream-capture mode relaxed, so that a CUDA graph being captured can get its pool's memory.

use super::{Backend, BackendError, EventId, MemInfo, PinnedHostAllocation, StreamId};
use cudarc::driver::sys;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// One GPU.
struct Gpu {
    context: usize,
    granularity: usize,
    /// Physical allocations mapped into reservations, by address.
    mappings: Mutex<BTreeMap<usize, Mapping>>,
}

#[derive(Clone, Copy)]
struct Mapping {
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
    /// False once unmapped while the handle's release has still to succeed.
    mapped: bool,
}

/// The GPUs of this machine.
pub struct CudaBackend {
    gpus: Vec<Gpu>,
}

/// Run a cudarc call; a panic (libcuda or one of its functions missing) becomes an error.
fn guarded<T>(call: &str, f: impl FnOnce() -> T) -> Result<T, BackendError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| BackendError::Failed {
        code: -1,
        message: format!("{call} is not available in the loaded libcuda"),
    })
}

fn check(call: &str, result: Result<sys::CUresult, BackendError>) -> Result<(), BackendError> {
    match result? {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(BackendError::OutOfMemory),
        other => Err(BackendError::Failed {
            code: other as i64,
            message: format!("{call} failed with {other:?}"),
        }),
    }
}

/// This thread's stream-capture mode, relaxed while the guard lives and given back when it drops.
///
/// While a stream is captured into a CUDA graph (`torch.cuda.graph` captures in the global mode),
/// the driver refuses calls that take memory (cuMemAlloc, cuMemCreate, cuMemMap, ...) with
/// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture. A caching allocator must take
/// new memory during a capture, for the graph's own pool: taking it is safe as long as it is not
/// given back before the graph is done with it. PyTorch's allocator relaxes the mode for its
/// allocations the same way. Frees are left refused: the caching core releases nothing during a
/// capture but where PyTorch's rules do (with max_split_size_mb, the capture's own pool's
/// oversize blocks when a request runs short), and there the driver's refusal keeps the graph's
/// memory: the request fails with the driver's error, the books exact, as PyTorch's would. Event
/// queries are relaxed too (`query_event`): another thread's global capture would refuse them.
struct RelaxedCapture {
    previous: sys::CUstreamCaptureMode,
}

impl RelaxedCapture {
    fn begin() -> Result<RelaxedCapture, BackendError> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in-out pointer; the call needs no context.
        check(
            "cuThreadExchangeStreamCaptureMode",
            guarded("cuThreadExchangeStreamCaptureMode", || unsafe {
                sys::cuThreadExchangeStreamCaptureMode(&mut mode)
            }),
        )?;
        Ok(RelaxedCapture { previous: mode })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        // The memory taken under the guard is kept whatever this answers: failing to restore the
        // mode only leaves this thread's later allocations relaxed too.
        // SAFETY: a valid in-out pointer.
        let _ = guarded("cuThreadExchangeStreamCaptureMode", || unsafe {
            sys::cuThreadExchangeStreamCaptureMode(&mut self.previous)
        });
    }
}

/// Every driver function this backend calls (cudarc panics on a missing one, so they are checked
/// before the first call).
pub const REQUIRED_SYMBOLS: [&str; 27] = [
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuStreamSynchronize",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD_v2",
    "cuThreadExchangeStreamCaptureMode",
];

/// Open the libcuda cudarc would open (the first of its candidate names that loads) and check that
/// it has every function we call. Err says what is missing.
fn check_libcuda() -> Result<(), String> {
    for name in cudarc::get_lib_name_candidates("cuda") {
        let Ok(c_name) = std::ffi::CString::new(name) else {
            continue;
        };
        // SAFETY: dlopen/dlsym/dlclose with valid NUL-terminated names; the handle is closed again.
        unsafe {
            let handle = libc::dlopen(c_name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if handle.is_null() {
                continue;
            }
            let missing: Vec<&str> = REQUIRED_SYMBOLS
                .iter()
                .copied()
                .filter(|symbol| {
                    let c_symbol = std::ffi::CString::new(*symbol).unwrap();
                    libc::dlsym(handle, c_symbol.as_ptr()).is_null()
                })
                .collect();
            libc::dlclose(handle);
            return if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} is not available in the loaded libcuda",
                    missing.join(", ")
                ))
            };
        }
    }
    Err("libcuda could not be loaded (no NVIDIA driver on this machine)".into())
}

impl CudaBackend {
    /// The GPUs, or why there are none: libcuda missing or incomplete, cuInit failing, or no device.
    pub fn detect() -> Result<CudaBackend, String> {
        check_libcuda()?;
        // SAFETY: only tries to open the library.
        let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
        if !present {
            return Err("libcuda could not be loaded (no NVIDIA driver on this machine)".into());
        }
        // SAFETY: plain driver calls with valid out-pointers, each guarded.
        unsafe {
            check("cuInit", guarded("cuInit", || sys::cuInit(0)))
                .map_err(|e| format!("cuInit: {e} (no usable NVIDIA device or driver)"))?;
            let mut count = 0;
            check(
                "cuDeviceGetCount",
                guarded("cuDeviceGetCount", || sys::cuDeviceGetCount(&mut count)),
            )
            .map_err(|e| format!("cuDeviceGetCount: {e}"))?;
            if count < 1 {
                return Err("libcuda loaded but reports no CUDA device".into());
            }
            let mut gpus = Vec::new();
            for ordinal in 0..count {
                let mut device = 0;
                check(
                    "cuDeviceGet",
                    guarded("cuDeviceGet", || sys::cuDeviceGet(&mut device, ordinal)),
                )
                .map_err(|e| format!("cuDeviceGet({ordinal}): {e}"))?;
                let mut context: sys::CUcontext = std::ptr::null_mut();
                check(
                    "cuDevicePrimaryCtxRetain",
                    guarded("cuDevicePrimaryCtxRetain", || {
                        sys::cuDevicePrimaryCtxRetain(&mut context, device)
                    }),
                )
                .map_err(|e| format!("cuDevicePrimaryCtxRetain({ordinal}): {e}"))?;
                let mut gpu = Gpu {
                    context: context as usize,
                    granularity: 0,
                    mappings: Mutex::new(BTreeMap::new()),
                };
                gpu.granularity = Self::granularity_of(&gpu, ordinal).unwrap_or(0);
                gpus.push(gpu);
            }
            Ok(CudaBackend { gpus })
        }
    }

    fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct; all-zero is its documented default.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = ordinal;
        prop
    }

    fn granularity_of(gpu: &Gpu, ordinal: i32) -> Option<usize> {
        let prop = Self::allocation_prop(ordinal);
        let mut granularity = 0usize;
        Self::make_current(gpu).ok()?;
        // SAFETY: valid pointers to a property struct and an out value.
        let result = guarded("cuMemGetAllocationGranularity", || unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        });
        check("cuMemGetAllocationGranularity", result).ok()?;
        (granularity > 0).then_some(granularity)
    }

    fn make_current(gpu: &Gpu) -> Result<(), BackendError> {
        // SAFETY: the context was retained at detection and is never released.
        check(
            "cuCtxSetCurrent",
            guarded("cuCtxSetCurrent", || unsafe {
                sys::cuCtxSetCurrent(gpu.context as sys::CUcontext)
            }),
        )
    }

    /// Make `device`'s context current on this thread, then run `f`.
    fn on(
        &self,
        device: usize,
        call: &str,
        f: impl FnOnce() -> sys::CUresult,
    ) -> Result<(), BackendError> {
        Self::make_current(&self.gpus[device])?;
        check(call, guarded(call, f))
    }

    /// Unmap one mapping and release its handle. When the release fails, the handle is mapped
    /// back at its address (contents kept) and the error returned; when that fails too, the
    /// mapping stays listed as unmapped for a retry.
    fn unmap_one(
        &self,
        device: usize,
        address: usize,
        mapping: Mapping,
    ) -> Result<(), BackendError> {
        let gpu = &self.gpus[device];
        if mapping.mapped {
            // SAFETY: the mapping was made by vm_map and nothing uses it any more.
            self.on(device, "cuMemUnmap", || unsafe {
                sys::cuMemUnmap(address as sys::CUdeviceptr, mapping.size)
            })?;
        }
        // SAFETY: the handle came from cuMemCreate and is no longer mapped.
        let release = self.on(device, "cuMemRelease", || unsafe {
            sys::cuMemRelease(mapping.handle)
        });
        let Err(e) = release else {
            gpu.mappings.lock().unwrap().remove(&address);
            return Ok(());
        };
        let mapped_again = mapping.mapped && self.map_handle(device, address, mapping).is_ok();
        if let Some(m) = gpu.mappings.lock().unwrap().get_mut(&address) {
            m.mapped = mapped_again;
        }
        Err(e)
    }

    /// Map `mapping.handle` at `address` again, readable and writable.
    fn map_handle(
        &self,
        device: usize,
        address: usize,
        mapping: Mapping,
    ) -> Result<(), BackendError> {
        // SAFETY: the address range is reserved and was this handle's until just now.
        self.on(device, "cuMemMap", || unsafe {
            sys::cuMemMap(
                address as sys::CUdeviceptr,
                mapping.size,
                0,
                mapping.handle,
                0,
            )
        })?;
        let access = Self::access_desc(device);
        // SAFETY: the range was just mapped.
        let accessible = self.on(device, "cuMemSetAccess", || unsafe {
            sys::cuMemSetAccess(address as sys::CUdeviceptr, mapping.size, &access, 1)
        });
        if accessible.is_err() {
            // SAFETY: undo the mapping made above.
            let _ = self.on(device, "cuMemUnmap", || unsafe {
                sys::cuMemUnmap(address as sys::CUdeviceptr, mapping.size)
            });
        }
        accessible
    }

    /// Read and write access for `device`.
    fn access_desc(device: usize) -> sys::CUmemAccessDesc {
        // SAFETY: a plain C struct; zero is its default.
        let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        access.location = Self::allocation_prop(device as i32).location;
        access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        access
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        "cuda"
    }

    fn device_count(&self) -> usize {
        self.gpus.len()
    }

    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        _stream: StreamId,
    ) -> Result<usize, BackendError> {
        let mut ptr: sys::CUdeviceptr = 0;
        let _relaxed = RelaxedCapture::begin()?;
        // SAFETY: a valid out-pointer.
        self.on(device, "cuMemAlloc", || unsafe {
            sys::cuMemAlloc_v2(&mut ptr, size)
        })?;
        Ok(ptr as usize)
    }

    fn raw_free(&self, device: usize, ptr: usize, _size: usize) -> Result<(), BackendError> {
        // SAFETY: ptr came from cuMemAlloc on this device.
        self.on(device, "cuMemFree", || unsafe {
            sys::cuMemFree_v2(ptr as sys::CUdeviceptr)
        })
    }

    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        self.on(device, "cuMemGetInfo", || unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo { free, total })
    }

    fn events_supported(&self) -> bool {
        true
    }

    fn create_event(&self, device: usize) -> Result<EventId, BackendError> {
        let mut event: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: a valid out-pointer.
        self.on(device, "cuEventCreate", || unsafe {
            sys::cuEventCreate(&mut event, flags)
        })?;
        Ok(event as EventId)
    }

    fn record_event(
        &self,
        device: usize,
        event: EventId,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        // SAFETY: the event came from create_event; the stream is the caller's CUstream.
        self.on(device, "cuEventRecord", || unsafe {
            sys::cuEventRecord(event as sys::CUevent, stream as sys::CUstream)
        })
    }

    fn query_event(&self, device: usize, event: EventId) -> Result<bool, BackendError> {
        Self::make_current(&self.gpus[device])?;
        // The caches query their events on every request; during another thread's global capture
        // the driver would refuse (a pinned buffer asked for by a loader thread while the main
        // thread captures a graph). Their events are never recorded in a capture (the caching
        // core defers them until it ends), so the query is safe.
        let _relaxed = RelaxedCapture::begin()?;
        // SAFETY: the event came from create_event.
        match guarded("cuEventQuery", || unsafe {
            sys::cuEventQuery(event as sys::CUevent)
        })? {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check("cuEventQuery", Ok(other)).map(|_| false),
        }
    }

    fn synchronize_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        // SAFETY: the event came from create_event.
        self.on(device, "cuEventSynchronize", || unsafe {
            sys::cuEventSynchronize(event as sys::CUevent)
        })
    }

    fn destroy_event(&self, device: usize, event: EventId) -> Result<(), BackendError> {
        // SAFETY: the event came from create_event and is not used again.
        self.on(device, "cuEventDestroy", || unsafe {
            sys::cuEventDestroy_v2(event as sys::CUevent)
        })
    }

    fn stream_synchronize_supported(&self) -> bool {
        true
    }

    fn synchronize_stream(&self, device: usize, stream: StreamId) -> Result<(), BackendError> {
        // SAFETY: the stream is the caller's CUstream.
        self.on(device, "cuStreamSynchronize", || unsafe {
            sys::cuStreamSynchronize(stream as sys::CUstream)
        })
    }

    // Pinned host memory belongs to no device: it is allocated and freed in device 0's context
    // (the driver wants one current), and CU_MEMHOSTALLOC_PORTABLE makes it pinned for every
    // context, so that copies on any device's stream run asynchronously from and to it.

    fn pinned_host_supported(&self) -> bool {
        true
    }

    // Sleep's backups: synchronous copies on the legacy default stream, which first waits for the
    // device's other blocking streams, and returns once the bytes are there.
    fn copies_supported(&self) -> bool {
        true
    }

    fn copy_to_host(
        &self,
        device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        // SAFETY: src is device memory mapped on `device`, dst host memory of `size` bytes (the
        // caller's contract).
        self.on(device, "cuMemcpyDtoH", || unsafe {
            sys::cuMemcpyDtoH_v2(dst as *mut std::ffi::c_void, src as sys::CUdeviceptr, size)
        })
    }

    fn copy_from_host(
        &self,
        device: usize,
        dst: usize,
        src: usize,
        size: usize,
    ) -> Result<(), BackendError> {
        // SAFETY: as copy_to_host, the other way.
        self.on(device, "cuMemcpyHtoD", || unsafe {
            sys::cuMemcpyHtoD_v2(
                dst as sys::CUdeviceptr,
                src as *const std::ffi::c_void,
                size,
            )
        })
    }

    fn pinned_host_alloc(&self, size: usize) -> Result<PinnedHostAllocation, BackendError> {
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE;
        let _relaxed = RelaxedCapture::begin()?;
        // SAFETY: a valid out-pointer.
        self.on(0, "cuMemHostAlloc", || unsafe {
            sys::cuMemHostAlloc(&mut ptr, size, flags)
        })?;
        Ok(PinnedHostAllocation {
            ptr: ptr as usize,
            page_locked: true,
        })
    }

    fn pinned_host_free(&self, ptr: usize, _size: usize) -> Result<(), BackendError> {
        // SAFETY: ptr came from pinned_host_alloc (the trait's contract) and is not used again.
        self.on(0, "cuMemFreeHost", || unsafe {
            sys::cuMemFreeHost(ptr as *mut std::ffi::c_void)
        })
    }

    fn vm_granularity(&self, device: usize) -> Option<usize> {
        let granularity = self.gpus[device].granularity;
        (granularity > 0).then_some(granularity)
    }

    fn vm_reserve(&self, device: usize, size: usize) -> Result<usize, BackendError> {
        let mut ptr: sys::CUdeviceptr = 0;
        let _relaxed = RelaxedCapture::begin()?;
        // SAFETY: a valid out-pointer; size is a multiple of the granularity.
        self.on(device, "cuMemAddressReserve", || unsafe {
            sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0)
        })?;
        Ok(ptr as usize)
    }

    fn vm_map(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        let prop = Self::allocation_prop(device as i32);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let _relaxed = RelaxedCapture::begin()?;
        // SAFETY: valid pointers; the range lies in a reservation of this device.
        self.on(device, "cuMemCreate", || unsafe {
            sys::cuMemCreate(&mut handle, size, &prop, 0)
        })?;
        let mapped = self.on(device, "cuMemMap", || unsafe {
            sys::cuMemMap(ptr as sys::CUdeviceptr, size, 0, handle, 0)
        });
        if let Err(e) = mapped {
            // SAFETY: the handle was just created and is not mapped.
            let _ = self.on(device, "cuMemRelease", || unsafe {
                sys::cuMemRelease(handle)
            });
            return Err(e);
        }
        let access = Self::access_desc(device);
        // SAFETY: the range was just mapped.
        let accessible = self.on(device, "cuMemSetAccess", || unsafe {
            sys::cuMemSetAccess(ptr as sys::CUdeviceptr, size, &access, 1)
        });
        if let Err(e) = accessible {
            // SAFETY: undo the mapping made above.
            let _ = self.on(device, "cuMemUnmap", || unsafe {
                sys::cuMemUnmap(ptr as sys::CUdeviceptr, size)
            });
            let _ = self.on(device, "cuMemRelease", || unsafe {
                sys::cuMemRelease(handle)
            });
            return Err(e);
        }
        self.gpus[device].mappings.lock().unwrap().insert(
            ptr,
            Mapping {
                size,
                handle,
                mapped: true,
            },
        );
        Ok(())
    }

    fn vm_unmap(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        // Each mapping is unmapped whole: the range may cover several. A failure leaves the whole
        // range mapped, as the caller books it (a pause keeps running a page it could not pause,
        // and trusts its bytes): a mapping whose handle could not be released is mapped again with
        // the same handle (its contents kept), and the mappings this call had released already
        // get new memory. Only when that fails too does a mapping stay listed as unmapped, so a
        // retry releases it instead of unmapping it twice.
        let covered: Vec<(usize, Mapping)> = {
            let mappings = self.gpus[device].mappings.lock().unwrap();
            mappings
                .range(ptr..ptr + size)
                .map(|(&a, &v)| (a, v))
                .collect()
        };
        let mut released = Vec::new();
        for (address, mapping) in covered {
            if let Err(e) = self.unmap_one(device, address, mapping) {
                for (address, size) in released {
                    let _ = self.vm_map(device, address, size);
                }
                return Err(e);
            }
            released.push((address, mapping.size));
        }
        Ok(())
    }

    fn vm_release(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        // SAFETY: the reservation came from vm_reserve and nothing in it is mapped.
        self.on(device, "cuMemAddressFree", || unsafe {
            sys::cuMemAddressFree(ptr as sys::CUdeviceptr, size)
        })
    }
}
