//! Streams: blocks used by other streams wait for their events before returning to the pool.

use super::*;

impl CachingAllocator {
    /// Note that `stream` uses the block at `ptr`: when it is freed, it waits for `stream`'s work
    /// queued until then. Uses on the block's own stream need no event and are ignored.
    pub fn record_stream(&mut self, ptr: usize, stream: StreamId) -> Result<()> {
        let Some(&id) = self.active.get(&ptr) else {
            return Err(Error::invalid_pointer(format!(
                "pointer {ptr:#x} is not a live allocation of {} device {}: record_stream needs the \
                 start of a block that is still allocated",
                self.backend.name(),
                self.device
            )));
        };
        if !self.backend.events_supported() && !self.backend.stream_synchronize_supported() {
            return Err(Error::new(
                ErrorKind::NotSupported,
                format!(
                    "record_stream is not supported: the {} backend has neither events nor stream \
                     synchronization",
                    self.backend.name()
                ),
            ));
        }
        if self.blocks[id].stream != stream {
            let uses = self.stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
        Ok(())
    }

    /// Record an event on each stream that used a freed block; it stays out of the pool until they
    /// complete.
    pub(super) fn insert_events(&mut self, id: BlockId, streams: Vec<StreamId>) -> Result<()> {
        if !self.backend.events_supported() {
            // No events: wait for the streams now, then the block is free at once.
            for stream in streams {
                self.backend
                    .synchronize_stream(self.device, stream)
                    .map_err(|e| {
                        backend_error(&*self.backend, self.device, "stream_synchronize", e)
                    })?;
            }
            self.return_to_pool(id);
            return Ok(());
        }
        for stream in streams {
            let event = self
                .backend
                .create_event(self.device)
                .map_err(|e| backend_error(&*self.backend, self.device, "create_event", e))?;
            self.backend
                .record_event(self.device, event, stream)
                .map_err(|e| backend_error(&*self.backend, self.device, "record_event", e))?;
            self.blocks[id].event_count += 1;
            self.pending_events
                .entry(stream)
                .or_default()
                .push_back((event, id));
        }
        if self.blocks[id].event_count == 0 {
            self.return_to_pool(id);
        }
        Ok(())
    }

    /// Return the blocks whose events have all completed (checked at the start of every malloc).
    pub(super) fn process_events(&mut self) -> Result<()> {
        let streams: Vec<StreamId> = self.pending_events.keys().copied().collect();
        for stream in streams {
            while let Some(&(event, id)) = self.pending_events[&stream].front() {
                let done = self
                    .backend
                    .query_event(self.device, event)
                    .map_err(|e| backend_error(&*self.backend, self.device, "query_event", e))?;
                if !done {
                    break;
                }
                self.pending_events.get_mut(&stream).unwrap().pop_front();
                self.event_completed(event, id)?;
            }
            if self.pending_events[&stream].is_empty() {
                self.pending_events.remove(&stream);
            }
        }
        Ok(())
    }

    /// Wait for every pending event and return their blocks (PyTorch's synchronize_and_free_events).
    pub(super) fn synchronize_and_free_events(&mut self) -> Result<()> {
        self.stats.num_sync_all_streams += 1;
        while let Some((_, mut queue)) = self.pending_events.pop_first() {
            while let Some((event, id)) = queue.pop_front() {
                self.backend
                    .synchronize_event(self.device, event)
                    .map_err(|e| {
                        backend_error(&*self.backend, self.device, "synchronize_event", e)
                    })?;
                self.event_completed(event, id)?;
            }
        }
        Ok(())
    }

    pub(super) fn event_completed(&mut self, event: EventId, id: BlockId) -> Result<()> {
        self.backend
            .destroy_event(self.device, event)
            .map_err(|e| backend_error(&*self.backend, self.device, "destroy_event", e))?;
        let block = &mut self.blocks[id];
        block.event_count -= 1;
        if block.event_count == 0 {
            self.return_to_pool(id);
        }
        Ok(())
    }
}
