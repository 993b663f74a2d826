//! The one-device shortcut (Runtime::sole_device): while the host's single device is the only one of
//! the process, malloc and free reach its allocator directly. These checks run in their own process
//! (this test binary) so that the shortcut is taken first and then has to be given up: errors must
//! read as on the general path, and once another accelerator exists, its pointers and the calls made
//! current on it must go to it, never to the host.

use accalloc::backend::testing::TestBackend;
use accalloc::backend::{Backend, BackendError, MemInfo, StreamId};
use accalloc::capi::device::accalloc_set_accelerator;
use accalloc::capi::info::accalloc_last_error_message;
use accalloc::capi::memory::{accalloc_free, accalloc_malloc, accalloc_malloc_on};
use accalloc::capi::AccallocStatus;
use accalloc::runtime::{runtime, DEVICE_TYPE_HOST};
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// Past every address a user-space mmap can return: the fake segments never meet the host's.
const OFFSET: usize = 1 << 47;

/// A TestBackend (fake addresses, no memory touched) moved up by OFFSET.
struct Distant(TestBackend);

impl Backend for Distant {
    fn name(&self) -> &str {
        "distant"
    }
    fn device_count(&self) -> usize {
        1
    }
    fn raw_alloc(
        &self,
        device: usize,
        size: usize,
        stream: StreamId,
    ) -> Result<usize, BackendError> {
        Ok(self.0.raw_alloc(device, size, stream)? + OFFSET)
    }
    fn raw_free(&self, device: usize, ptr: usize, size: usize) -> Result<(), BackendError> {
        self.0.raw_free(device, ptr - OFFSET, size)
    }
    fn mem_get_info(&self, device: usize) -> Result<MemInfo, BackendError> {
        self.0.mem_get_info(device)
    }
}

fn malloc(size: usize) -> *mut c_void {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: &mut ptr is a valid out-pointer.
    let status = unsafe { accalloc_malloc(&mut ptr, size, -1, std::ptr::null_mut()) };
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    ptr
}

fn free_error(ptr: *mut c_void) -> (AccallocStatus, String) {
    // SAFETY: accalloc_free checks its pointer; the message is a NUL-terminated thread-local.
    unsafe {
        let status = accalloc_free(ptr);
        let message = CStr::from_ptr(accalloc_last_error_message())
            .to_string_lossy()
            .into_owned();
        (status, message)
    }
}

fn allocated(device_type: i32) -> i64 {
    let accelerator = runtime().unwrap().accelerator(device_type).unwrap();
    accelerator.device_stats(0).unwrap().allocated_bytes[0].current
}

#[test]
fn the_one_device_shortcut_answers_as_the_general_path_and_gives_way() {
    if runtime().unwrap().current().device_type() != DEVICE_TYPE_HOST
        || runtime().unwrap().current().device_count() != 1
    {
        eprintln!("skipped: the shortcut needs the host as the only accelerator, with one device");
        return;
    }
    // Warm: the first calls make the host's device and take the shortcut.
    for size in [512, 4096, 1 << 20, 16 << 20] {
        let ptr = malloc(size);
        // SAFETY: a pointer from accalloc_malloc, freed once.
        assert_eq!(unsafe { accalloc_free(ptr) }, AccallocStatus::ACCALLOC_OK);
    }
    let live = malloc(4096);
    assert_eq!(allocated(DEVICE_TYPE_HOST), 4096);

    // Errors on the shortcut read as on the general path.
    let (status, message) = free_error((live as usize + 512) as *mut c_void);
    assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
    assert!(message.contains("not the start of a block"), "{message}");
    let stack = 0u64;
    let (status, message) = free_error(&stack as *const u64 as *mut c_void);
    assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
    assert!(
        message.contains("was not allocated by accalloc"),
        "{message}"
    );
    // SAFETY: a live pointer, freed once; then the same pointer again.
    assert_eq!(unsafe { accalloc_free(live) }, AccallocStatus::ACCALLOC_OK);
    let (status, message) = free_error(live);
    assert_eq!(status, AccallocStatus::ACCALLOC_ERROR_INVALID_POINTER);
    assert!(message.contains("already freed"), "{message}");
    assert_eq!(allocated(DEVICE_TYPE_HOST), 0);

    // Another accelerator appears while two threads keep the host busy through the shortcut: its
    // pointers are freed by it, not refused by the host, and the host's books stay exact.
    let base = OFFSET;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let other = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut pairs = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) || pairs < 10_000 {
                        let ptr = malloc([512, 4096, 1 << 20][pairs as usize % 3]);
                        // SAFETY: a pointer from accalloc_malloc, freed once.
                        assert_eq!(unsafe { accalloc_free(ptr) }, AccallocStatus::ACCALLOC_OK);
                        pairs += 1;
                    }
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let other = runtime()
            .unwrap()
            .register(Arc::new(Distant(TestBackend::new(1, 64 << 20))))
            .unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for worker in workers {
            worker.join().unwrap();
        }
        other
    });
    assert_eq!(allocated(DEVICE_TYPE_HOST), 0);
    let mut foreign = std::ptr::null_mut();
    // SAFETY: &mut foreign is a valid out-pointer.
    let status = unsafe { accalloc_malloc_on(other, &mut foreign, 8192, 0, std::ptr::null_mut()) };
    assert_eq!(status, AccallocStatus::ACCALLOC_OK);
    assert!(foreign as usize >= base);
    assert_eq!(allocated(other), 8192);
    // SAFETY: a pointer from accalloc_malloc_on, freed once.
    assert_eq!(
        unsafe { accalloc_free(foreign) },
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(allocated(other), 0);

    // Made current, it serves calls without a device type.
    assert_eq!(accalloc_set_accelerator(other), AccallocStatus::ACCALLOC_OK);
    let on_other = malloc(4096);
    assert!(on_other as usize >= base);
    assert_eq!((allocated(other), allocated(DEVICE_TYPE_HOST)), (4096, 0));
    // SAFETY: freed once.
    assert_eq!(
        unsafe { accalloc_free(on_other) },
        AccallocStatus::ACCALLOC_OK
    );

    // And back on the host, everything still adds up.
    assert_eq!(
        accalloc_set_accelerator(DEVICE_TYPE_HOST),
        AccallocStatus::ACCALLOC_OK
    );
    let on_host = malloc(4096);
    assert_eq!((allocated(other), allocated(DEVICE_TYPE_HOST)), (0, 4096));
    // SAFETY: freed once.
    assert_eq!(
        unsafe { accalloc_free(on_host) },
        AccallocStatus::ACCALLOC_OK
    );
    assert_eq!(allocated(DEVICE_TYPE_HOST), 0);
}
