//! Sleep and wake of a private pool (issue 30's tags): pause gives the memory behind every mapped
//! page of the pool back to the device, keeping the addresses (and, when asked, the contents in
//! host memory); resume maps new memory at the same addresses and copies the contents back. The
//! books do not move: blocks stay allocated or free as they were, reserved memory is what the
//! pool holds; the pool's paused bytes are a figure of their own.
//!
//! Only pages of expandable segments can pause (an ordinary segment cannot be unmapped and kept),
//! so a sleepable pool grows expandable segments whatever expandable_segments says.
//!
//! Rules: pausing a paused pool, or resuming a running one, does nothing. An allocation routed to
//! a paused pool is refused; a free of one of its blocks is booked as any free. empty_cache gives
//! back a paused pool's free pages (only the books change: their memory went at the pause). A
//! failure half way leaves every page either paused or running, the books exact: pause puts back
//! the pages it had paused; resume stops at the failing page (the pool stays paused; resume again).
//! Work queued on the pool's memory must be finished before a pause (as torch_memory_saver asks).

use super::*;
use crate::caching::observers::SegmentAction;
use crate::caching::pools::MempoolId;
use crate::caching::Stat;

/// Whether a range of pages is running, paused, or some of each (after a pause that failed).
pub(super) enum PauseState {
    Running,
    Paused,
    Mixed,
}

impl CachingAllocator {
    /// Make pool `id` sleepable: its segments grow as expandable ones (so that they can pause)
    /// whatever expandable_segments says. Refused, nothing changed, when the pool holds ordinary
    /// segments already or its memory has no virtual memory (pause could never work).
    pub fn make_pool_sleepable(&mut self, id: MempoolId) -> Result<()> {
        let index = self.existing_pool(id)?;
        if !self.sleep_possible(index) {
            return Err(self.no_virtual_memory(index));
        }
        let pool = self.private_pools.get(index);
        if pool.segments > 0 {
            return Err(Error::invalid_argument(format!(
                "pool ({}, {}) holds ordinary segments already: make it sleepable before it allocates",
                id.0, id.1
            )));
        }
        self.private_pools.sleep_mut(index).sleepable = true;
        Ok(())
    }

    /// Pause pool `id`: the memory behind its mapped pages goes back to the device, copied to host
    /// memory first when `backup` is set. See the module's rules.
    pub fn pause_pool(&mut self, id: MempoolId, backup: bool) -> Result<()> {
        let index = self.existing_pool(id)?;
        self.check_sleepable(index, id)?;
        let source = self.segment_backend(index);
        if backup && !source.copies_supported() {
            return Err(Error::new(
                ErrorKind::NotSupported,
                format!(
                    "pause with a backup needs copies between device and host memory, which the {} \
                     backend does not offer: pause without one (the contents are then lost)",
                    source.name()
                ),
            ));
        }
        let pages = self.pool_pages(index, false);
        let mut done = Vec::with_capacity(pages.len());
        for &(segment, page) in &pages {
            if let Err(error) = self.pause_page(index, segment, page, backup) {
                // Put back what this call paused, newest first: each page ends paused or running.
                for &(segment, page) in done.iter().rev() {
                    let _ = self.resume_page(index, segment, page);
                }
                self.verify("pause");
                return Err(error);
            }
            done.push((segment, page));
        }
        self.private_pools.sleep_mut(index).paused = self.pool_paused_bytes_at(index) > 0;
        self.verify("pause");
        Ok(())
    }

    /// Resume pool `id`: new memory at the addresses of its paused pages, the backups copied back.
    pub fn resume_pool(&mut self, id: MempoolId) -> Result<()> {
        let index = self.existing_pool(id)?;
        self.check_sleepable(index, id)?;
        let mut result = Ok(());
        for (segment, page) in self.pool_pages(index, true) {
            if let Err(error) = self.resume_page(index, segment, page) {
                result = Err(error);
                break;
            }
        }
        self.private_pools.sleep_mut(index).paused = self.pool_paused_bytes_at(index) > 0;
        self.verify("resume");
        result
    }

    /// The error of an allocation routed to a paused pool.
    #[cold]
    pub(super) fn paused_pool_refusal(&self, private: PoolIndex) -> Error {
        let id = self.private_pools.get(private).id;
        Error::invalid_argument(format!(
            "pool ({}, {}) is paused: resume it before allocating in it",
            id.0, id.1
        ))
    }

    /// Bytes paused on this device, over every pool: current, peak, and paused and resumed in all
    /// (reset with the other statistics).
    pub fn paused_memory(&self) -> Stat {
        self.private_pools.paused_memory
    }

    /// The pool whose paused pages [ptr, ptr + size) touches, if any (a framework refuses to run a
    /// kernel on such memory: it has none behind it). A lookup over the expandable ranges, nothing
    /// when no page is paused.
    pub fn paused_pool_at(&self, ptr: usize, size: usize) -> Option<MempoolId> {
        if self.private_pools.paused_memory.current == 0 {
            return None;
        }
        let end = ptr.saturating_add(size.max(1));
        self.expandable
            .iter()
            .find(|segment| segment.owner != DEFAULT_POOLS && segment.touches_paused(ptr, end))
            .map(|segment| self.private_pools.get(segment.owner).id)
    }

    /// Bytes of pool `id` paused now (None: no such pool).
    pub fn pool_paused_bytes(&self, id: MempoolId) -> Option<usize> {
        let index = self.private_pools.index_of(id)?;
        Some(self.pool_paused_bytes_at(index))
    }

    /// Whether the pools at `private` are paused (allocations routed there are refused).
    pub(super) fn pool_paused(&self, private: PoolIndex) -> bool {
        private != DEFAULT_POOLS && self.private_pools.get(private).sleep.paused
    }

    /// Whether the pools at `private` grow expandable segments whatever the settings say.
    pub(super) fn pool_sleepable(&self, private: PoolIndex) -> bool {
        private != DEFAULT_POOLS && self.private_pools.get(private).sleep.sleepable
    }

    /// The state of pages [first, last) of segment `segment`.
    pub(super) fn pause_state(&self, segment: usize, first: usize, last: usize) -> PauseState {
        let paused = &self.expandable[segment].paused[first..last];
        match (paused.iter().any(|&p| p), paused.iter().all(|&p| p)) {
            (false, _) => PauseState::Running,
            (true, true) => PauseState::Paused,
            (true, false) => PauseState::Mixed,
        }
    }

    /// Paused pages [first, last) leave the books (empty_cache, a trim): their memory went at the
    /// pause, their backups go now.
    pub(super) fn forget_paused_pages(&mut self, segment: usize, first: usize, last: usize) {
        let owner = self.expandable[segment].owner;
        for page in first..last {
            let (address, page_size) = self.expandable[segment].page_range(page);
            self.expandable[segment].paused[page] = false;
            self.private_pools.pages_resumed(owner, address, page_size);
        }
        let still = self.pool_paused_bytes_at(owner) > 0;
        self.private_pools.sleep_mut(owner).paused = still;
    }

    fn existing_pool(&self, id: MempoolId) -> Result<PoolIndex> {
        self.private_pools.index_of(id).ok_or_else(|| {
            Error::invalid_argument(format!("pool ({}, {}) does not exist", id.0, id.1))
        })
    }

    fn check_sleepable(&self, index: PoolIndex, id: MempoolId) -> Result<()> {
        if !self.sleep_possible(index) {
            return Err(self.no_virtual_memory(index));
        }
        if !self.private_pools.get(index).sleep.sleepable {
            return Err(Error::invalid_argument(format!(
                "pool ({}, {}) is not sleepable: make it so before it allocates",
                id.0, id.1
            )));
        }
        Ok(())
    }

    /// Whether pages of the pools at `private` can be unmapped and mapped again.
    fn sleep_possible(&self, private: PoolIndex) -> bool {
        expandable::pages_fit(self.segment_backend(private).vm_granularity(self.device))
    }

    fn no_virtual_memory(&self, private: PoolIndex) -> Error {
        Error::new(
            ErrorKind::NotSupported,
            format!(
                "sleep needs virtual memory (unmapping pages and mapping them again at the same \
                 addresses), which the {} backend does not offer",
                self.segment_backend(private).name()
            ),
        )
    }

    fn pool_paused_bytes_at(&self, index: PoolIndex) -> usize {
        self.private_pools.get(index).sleep.paused_bytes
    }

    /// The pool's mapped pages, as (segment, page): the running ones, or the paused ones.
    fn pool_pages(&self, index: PoolIndex, paused: bool) -> Vec<(usize, usize)> {
        let mut pages = Vec::new();
        for (s, segment) in self.expandable.iter().enumerate() {
            if segment.owner != index {
                continue;
            }
            for (p, (&mapped, &is_paused)) in segment.mapped.iter().zip(&segment.paused).enumerate()
            {
                if mapped && is_paused == paused {
                    pages.push((s, p));
                }
            }
        }
        pages
    }

    /// Pause one running page: its contents to host memory (with `backup`), then its memory back.
    fn pause_page(
        &mut self,
        index: PoolIndex,
        segment: usize,
        page: usize,
        backup: bool,
    ) -> Result<()> {
        let source = self.segment_backend(index);
        let (address, size) = self.expandable[segment].page_range(page);
        let copy = if backup {
            // Host memory may run out too: a clear error, never an abort.
            let mut buffer: Vec<u8> = Vec::new();
            buffer.try_reserve_exact(size).map_err(|_| {
                Error::new(
                    ErrorKind::OutOfMemory,
                    format!(
                        "pause: no host memory for the backup of the {size} bytes at {address:#x} \
                         (the pool stays running: free host memory, or pause without a backup)"
                    ),
                )
            })?;
            source
                .copy_to_host(self.device, buffer.as_mut_ptr() as usize, address, size)
                .map_err(|e| backend_error(&*source, self.device, "copy_to_host", e))?;
            // SAFETY: the copy wrote all `size` reserved bytes (not zeroed first: a backup of a
            // large pool would write every byte twice).
            unsafe { buffer.set_len(size) };
            Some(buffer)
        } else {
            None
        };
        self.announce(SegmentAction::Unmap, index, address, size, 0);
        if let Err(e) = source.vm_unmap(self.device, address, size) {
            self.announce(SegmentAction::Map, index, address, size, 0);
            return Err(backend_error(&*source, self.device, "vm_unmap", e));
        }
        self.expandable[segment].paused[page] = true;
        self.private_pools.pages_paused(index, size);
        if let Some(buffer) = copy {
            self.private_pools
                .sleep_mut(index)
                .backups
                .insert(address, buffer);
        }
        Ok(())
    }

    /// Resume one paused page: new memory at its address, its backup copied back.
    fn resume_page(&mut self, index: PoolIndex, segment: usize, page: usize) -> Result<()> {
        let source = self.segment_backend(index);
        let (address, size) = self.expandable[segment].page_range(page);
        source
            .vm_map(self.device, address, size)
            .map_err(|e| match e {
                BackendError::OutOfMemory => Error::new(
                    ErrorKind::OutOfMemory,
                    format!(
                        "resume: device {} has no room for the {size} bytes at {address:#x} (the rest \
                         of the pool stays paused: free memory and resume again)",
                        self.device
                    ),
                ),
                e => backend_error(&*source, self.device, "vm_map", e),
            })?;
        if let Some(buffer) = self.private_pools.sleep_mut(index).backups.get(&address) {
            let from = buffer.as_ptr() as usize;
            if let Err(e) = source.copy_from_host(self.device, address, from, size) {
                let error = backend_error(&*source, self.device, "copy_from_host", e);
                // Not restored: the page goes back to paused, its backup kept for the next try.
                if source.vm_unmap(self.device, address, size).is_ok() {
                    return Err(error);
                }
                // The new memory cannot go either: the page runs, its contents lost, as said.
                self.mark_running(index, segment, page);
                return Err(Error::new(
                    error.kind,
                    format!(
                        "{} (and the new memory at {address:#x} could not be unmapped again: that \
                         page runs without its contents)",
                        error.message
                    ),
                ));
            }
        }
        self.mark_running(index, segment, page);
        Ok(())
    }

    /// A paused page whose memory is mapped again: booked running, its backup dropped.
    fn mark_running(&mut self, index: PoolIndex, segment: usize, page: usize) {
        let (address, size) = self.expandable[segment].page_range(page);
        self.expandable[segment].paused[page] = false;
        self.private_pools.pages_resumed(index, address, size);
        self.announce(SegmentAction::Map, index, address, size, 0);
    }
}
