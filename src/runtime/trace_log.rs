//! ACCALLOC_TRACE=path.jsonl: every malloc, free, empty_cache and record_stream of the process written
//! to a file as accalloc's trace (the format is the core's: accalloc_core::trace), so any program on
//! accalloc can be replayed and tuned. Off, each hook is one relaxed load and a branch.
//!
//! Lines are buffered and written every FLUSH_EVERY operations and at exit, so a crash loses at most
//! that many. "%p" in the path becomes the process id (for programs that fork). The file is created
//! afresh. Streams are numbered in the order they first appear (the null stream is 0); devices are
//! the device indices of the accelerator (a process using several accelerators gets their devices
//! mixed). Ids are given here: a free is written before the block is freed, so another thread cannot
//! be handed the same address before the free is in the file.

use crate::error::{Error, Result};
use crate::trace::{PoolCall, TraceOp};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

pub use super::environment::TRACE_VAR;
/// Operations buffered before they are written out.
pub const FLUSH_EVERY: usize = 32;

static ENABLED: AtomicBool = AtomicBool::new(false);
static LOG: Mutex<Option<TraceLog>> = Mutex::new(None);
static AT_EXIT: Once = Once::new();

struct TraceLog {
    out: BufWriter<File>,
    path: String,
    /// The id of each live address this log handed out.
    ids: HashMap<usize, u64>,
    streams: HashMap<usize, usize>,
    next_id: u64,
    unflushed: usize,
}

fn log() -> MutexGuard<'static, Option<TraceLog>> {
    // The log is a file and two maps: a panic elsewhere cannot leave them inconsistent.
    LOG.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Start recording when ACCALLOC_TRACE names a file (called once, when the runtime starts, with
/// environment::Environment's value).
pub fn start_if(path: Option<&str>) -> Result<()> {
    match path {
        Some(path) => start(path).map_err(|e| Error::config(format!("{TRACE_VAR}: {}", e.message))),
        None => Ok(()),
    }
}

/// Record every operation from now on into `path` (created afresh; "%p" is the process id).
pub fn start(path: &str) -> Result<()> {
    let path = path.replace("%p", &std::process::id().to_string());
    let file = File::create(&path).map_err(|e| {
        Error::invalid_argument(format!("cannot create the trace file '{path}': {e}"))
    })?;
    let mut guard = log();
    if let Some(mut old) = guard.take() {
        let _ = old.out.flush();
    }
    *guard = Some(TraceLog {
        out: BufWriter::with_capacity(64 << 10, file),
        path,
        ids: HashMap::new(),
        streams: HashMap::from([(0, 0)]),
        next_id: 0,
        unflushed: 0,
    });
    ENABLED.store(true, Ordering::Release);
    AT_EXIT.call_once(|| {
        // SAFETY: flush_at_exit is an extern "C" fn taking nothing, as atexit requires.
        unsafe { libc::atexit(flush_at_exit) };
    });
    Ok(())
}

/// Stop recording; everything recorded is in the file when this returns.
pub fn stop() -> Result<()> {
    ENABLED.store(false, Ordering::Release);
    match log().take() {
        Some(mut old) => old
            .out
            .flush()
            .map_err(|e| Error::invalid_argument(format!("cannot write {}: {e}", old.path))),
        None => Ok(()),
    }
}

extern "C" fn flush_at_exit() {
    if let Ok(mut guard) = LOG.try_lock() {
        if let Some(log) = guard.as_mut() {
            let _ = log.out.flush();
        }
    }
}

/// Whether recording is on: the one branch each entry point pays when it is off.
#[inline(always)]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Run `write` on the log (recording is on: the callers test `enabled` first).
#[cold]
#[inline(never)]
fn with_log(write: impl FnOnce(&mut TraceLog) -> std::io::Result<()>) {
    let mut guard = log();
    let Some(trace) = guard.as_mut() else { return };
    let mut result = write(trace);
    trace.unflushed += 1;
    if result.is_ok() && trace.unflushed >= FLUSH_EVERY {
        trace.unflushed = 0;
        result = trace.out.flush();
    }
    if let Err(e) = result {
        // A full disk must not break the program: stop recording and say so once.
        eprintln!(
            "accalloc: {TRACE_VAR}: cannot write {}: {e}; recording stops",
            trace.path
        );
        ENABLED.store(false, Ordering::Release);
        *guard = None;
    }
}

impl TraceLog {
    fn stream(&mut self, stream: usize) -> usize {
        let next = self.streams.len();
        *self.streams.entry(stream).or_insert(next)
    }
}

/// A malloc of `size` bytes on `device` for `stream` and its result: `Some(address)`, or None for
/// an out-of-memory (written as an allocation freed at once). The caller leaves out other errors,
/// which are no operations, and tests `enabled` first.
#[cold]
pub fn malloc(device: usize, size: usize, stream: usize, ptr: Option<usize>) {
    with_log(|log| {
        let id = log.next_id;
        log.next_id += 1;
        let stream = log.stream(stream);
        let alloc = TraceOp::Alloc {
            id,
            size,
            stream,
            device,
        };
        writeln!(log.out, "{alloc}")?;
        match ptr {
            Some(ptr) => {
                log.ids.insert(ptr, id);
                Ok(())
            }
            None => writeln!(log.out, "{}", TraceOp::Free { id }),
        }
    });
}

/// A free of `ptr`, before it happens; pointers this log did not hand out are left out.
#[inline]
pub fn free(ptr: usize) {
    if !enabled() {
        return;
    }
    with_log(|log| match log.ids.remove(&ptr) {
        Some(id) => writeln!(log.out, "{}", TraceOp::Free { id }),
        None => Ok(()),
    });
}

/// `stream` uses the live allocation at `ptr`.
#[inline]
pub fn record_stream(ptr: usize, stream: usize) {
    if !enabled() {
        return;
    }
    with_log(|log| match log.ids.get(&ptr).copied() {
        Some(id) => {
            let stream = log.stream(stream);
            writeln!(log.out, "{}", TraceOp::RecordStream { id, stream })
        }
        None => Ok(()),
    });
}

/// An empty_cache.
#[inline]
pub fn empty_cache() {
    if !enabled() {
        return;
    }
    with_log(|log| writeln!(log.out, "{}", TraceOp::EmptyCache));
}

/// A checkpoint of private pool `pool` of `device` put back (accalloc_pool_checkpoint_restore), in
/// the trace's own terms: the frees it made (`freed`), then the blocks it handed out again
/// (`allocated`: address, size, stream) as allocations routed to the pool (begun for them, ended
/// and released: no use left over). A replay frees and allocates the same and holds the same bytes,
/// but places the blocks by its policy, not at the checkpoint's addresses.
pub fn pool_restored(
    device: usize,
    pool: (u64, u64),
    freed: &[usize],
    allocated: &[(usize, usize, usize)],
) {
    if !enabled() {
        return;
    }
    with_log(|log| {
        for ptr in freed {
            if let Some(id) = log.ids.remove(ptr) {
                writeln!(log.out, "{}", TraceOp::Free { id })?;
            }
        }
        let call = |call| TraceOp::Pool { pool, device, call };
        writeln!(log.out, "{}", call(PoolCall::Begin { stream: None }))?;
        for &(ptr, size, stream) in allocated {
            let id = log.next_id;
            log.next_id += 1;
            let stream = log.stream(stream);
            writeln!(
                log.out,
                "{}",
                TraceOp::Alloc {
                    id,
                    size,
                    stream,
                    device
                }
            )?;
            log.ids.insert(ptr, id);
        }
        writeln!(log.out, "{}", call(PoolCall::End))?;
        writeln!(log.out, "{}", call(PoolCall::Release))
    });
}

/// A call on private pool `pool` of `device` that succeeded.
pub fn pool(device: usize, pool: (u64, u64), call: crate::trace::PoolCall) {
    if !enabled() {
        return;
    }
    with_log(|log| writeln!(log.out, "{}", TraceOp::Pool { pool, device, call }));
}
