//! Sleep and wake through the runtime: each call on its device's allocator (the rules are the
//! core's: accalloc_core::caching::allocator, sleep.rs).

use super::Accelerator;
use crate::error::Result;
use accalloc_core::caching::pools::MempoolId;
use std::sync::atomic::Ordering;

impl Accelerator {
    /// Make pool `id` on `device` sleepable (before it allocates).
    pub fn make_pool_sleepable(&self, device: i32, id: MempoolId) -> Result<()> {
        self.lock(self.resolve(device)?)?.make_pool_sleepable(id)
    }

    /// Pause pool `id` on `device`, with a backup of its contents in host memory when asked.
    pub fn pause_pool(&self, device: i32, id: MempoolId, backup: bool) -> Result<()> {
        let mut allocator = self.lock(self.resolve(device)?)?;
        // Set before any page pauses, while the device is held: paused_pool_at never misses one.
        self.paused_ever.store(true, Ordering::Release);
        allocator.pause_pool(id, backup)
    }

    /// The pool whose paused pages [ptr, ptr + size) on `device` touches, if any. One load until
    /// this accelerator first pauses; the device's lock and a lookup after that.
    pub fn paused_pool_at(
        &self,
        device: i32,
        ptr: usize,
        size: usize,
    ) -> Result<Option<MempoolId>> {
        let index = self.resolve(device)?;
        if !self.paused_ever.load(Ordering::Acquire) {
            return Ok(None);
        }
        Ok(self.lock(index)?.paused_pool_at(ptr, size))
    }

    /// Resume pool `id` on `device`.
    pub fn resume_pool(&self, device: i32, id: MempoolId) -> Result<()> {
        self.lock(self.resolve(device)?)?.resume_pool(id)
    }

    /// Bytes of pool `id` paused now (None: no such pool).
    pub fn pool_paused_bytes(&self, device: i32, id: MempoolId) -> Result<Option<usize>> {
        Ok(self.lock(self.resolve(device)?)?.pool_paused_bytes(id))
    }
}
