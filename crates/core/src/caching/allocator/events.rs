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

    /// Before a block that other streams used is freed: wait for those streams (no events), or
    /// create and record one event on each. None when `ptr` is no live block or no other stream used
    /// it. When the backend fails, whatever this call created is destroyed again and the error says
    /// that the block is still allocated: the free did not happen and may be retried.
    pub(super) fn prepare_stream_events(
        &mut self,
        ptr: usize,
    ) -> Result<Option<Vec<(StreamId, EventId)>>> {
        // During a capture no event may be recorded: the free defers them (see free_unchecked).
        if self.capturing {
            return Ok(None);
        }
        let Some(&id) = self.active.get(&ptr) else {
            return Ok(None);
        };
        self.stream_events_of(id)
    }

    /// The events (or stream waits) for block `id`'s stream uses, as prepare_stream_events.
    fn stream_events_of(&mut self, id: BlockId) -> Result<Option<Vec<(StreamId, EventId)>>> {
        let ptr = self.blocks[id].ptr;
        let Some(streams) = self.stream_uses.get(&id).cloned() else {
            return Ok(None);
        };
        let still_allocated = |error: Error| {
            Error::new(
                error.kind,
                format!(
                    "{}; the block at {ptr:#x} is still allocated (free it again)",
                    error.message
                ),
            )
        };
        if !self.backend.events_supported() {
            // No events: wait for the streams now, then the block is free at once.
            for &stream in &streams {
                self.backend
                    .synchronize_stream(self.device, stream)
                    .map_err(|e| {
                        still_allocated(backend_error(
                            &*self.backend,
                            self.device,
                            "stream_synchronize",
                            e,
                        ))
                    })?;
            }
            return Ok(Some(Vec::new()));
        }
        let mut events = Vec::with_capacity(streams.len());
        for &stream in &streams {
            match self.create_recorded_event(stream) {
                Ok(event) => events.push((stream, event)),
                Err(error) => {
                    for (_, event) in events {
                        let _ = self.backend.destroy_event(self.device, event);
                    }
                    return Err(still_allocated(error));
                }
            }
        }
        Ok(Some(events))
    }

    /// A new event recorded on `stream` (destroyed again when recording fails).
    fn create_recorded_event(&mut self, stream: StreamId) -> Result<EventId> {
        let event = self
            .backend
            .create_event(self.device)
            .map_err(|e| backend_error(&*self.backend, self.device, "create_event", e))?;
        if let Err(e) = self.backend.record_event(self.device, event, stream) {
            let _ = self.backend.destroy_event(self.device, event);
            return Err(backend_error(
                &*self.backend,
                self.device,
                "record_event",
                e,
            ));
        }
        Ok(event)
    }

    /// A block other streams used, freed during a capture: it stays active, waiting, until its
    /// events can be recorded once no capture is underway.
    #[cold]
    pub(super) fn defer_until_no_capture(&mut self, id: BlockId) {
        self.blocks[id].event_count += 1;
        self.private_pools.deferred_frees.push(id);
    }

    /// No capture is underway: record the events of the blocks freed during one, which then wait
    /// for them as any freed block does. A block whose events the backend fails stays deferred.
    pub(super) fn insert_deferred_events(&mut self) -> Result<()> {
        while let Some(&id) = self.private_pools.deferred_frees.last() {
            let events = self.stream_events_of(id)?.unwrap_or_default();
            self.private_pools.deferred_frees.pop();
            self.stream_uses.remove(&id);
            self.blocks[id].event_count -= 1;
            self.insert_events(id, events);
        }
        // Nothing deferred any more: the cached path may serve again when no pool is begun.
        self.routing = self.private_pools.closes_cached_path();
        Ok(())
    }

    /// The freed block waits for the events recorded on the streams that used it; it returns to the
    /// pool when they complete (at once when there are none).
    pub(super) fn insert_events(&mut self, id: BlockId, events: Vec<(StreamId, EventId)>) {
        for (stream, event) in events {
            self.blocks[id].event_count += 1;
            self.pending_events
                .entry(stream)
                .or_default()
                .push_back((event, id));
        }
        if self.blocks[id].event_count == 0 {
            self.return_to_pool(id);
        }
    }

    /// Return the blocks whose events have all completed (checked at the start of every malloc).
    /// An event leaves its queue only once it is complete and destroyed, so a backend call that
    /// fails leaves it pending for the next try.
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
                self.event_completed(event, id)?;
                self.pending_events.get_mut(&stream).unwrap().pop_front();
            }
            if self.pending_events[&stream].is_empty() {
                self.pending_events.remove(&stream);
            }
        }
        Ok(())
    }

    /// Wait for every pending event and return their blocks (PyTorch's synchronize_and_free_events).
    /// As in process_events, an event whose synchronization or destruction fails stays pending.
    pub(super) fn synchronize_and_free_events(&mut self) -> Result<()> {
        self.stats.num_sync_all_streams += 1;
        if !self.capturing && !self.private_pools.deferred_frees.is_empty() {
            self.insert_deferred_events()?;
        }
        let streams: Vec<StreamId> = self.pending_events.keys().copied().collect();
        for stream in streams {
            while let Some(&(event, id)) = self.pending_events[&stream].front() {
                self.backend
                    .synchronize_event(self.device, event)
                    .map_err(|e| {
                        backend_error(&*self.backend, self.device, "synchronize_event", e)
                    })?;
                self.event_completed(event, id)?;
                self.pending_events.get_mut(&stream).unwrap().pop_front();
            }
            self.pending_events.remove(&stream);
        }
        Ok(())
    }

    /// A completed event is destroyed; its block returns to the pool with its last event. Nothing
    /// changes when the backend cannot destroy it.
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
