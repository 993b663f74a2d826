//! Streams run asynchronously, each on a worker thread of its own: work enqueued by
//! accallocModelLaunch holds its memory range until the worker has slept through it. An event
//! records how far its stream's queue reached; it completes when the worker gets there.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

struct Work {
    seq: u64,
    micros: u64,
    range: (usize, usize),
}

#[derive(Default)]
struct Queue {
    enqueued: u64,
    completed: u64,
    /// Not yet finished, the one running first.
    work: VecDeque<Work>,
    closed: bool,
}

pub struct Stream {
    pub handle: usize,
    pub device: usize,
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Stream {
    pub fn start(handle: usize, device: usize) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            handle,
            device,
            queue: Mutex::default(),
            changed: Condvar::new(),
        });
        let worker = stream.clone();
        std::thread::Builder::new()
            .name(format!("cuda-model-stream-{handle:#x}"))
            .spawn(move || worker.run())
            .expect("the model could not start a stream's worker thread");
        stream
    }

    fn run(&self) {
        let mut queue = self.queue.lock().unwrap();
        loop {
            let Some(next) = queue.work.front() else {
                if queue.closed {
                    return;
                }
                queue = self.changed.wait(queue).unwrap();
                continue;
            };
            let (seq, micros) = (next.seq, next.micros);
            drop(queue);
            std::thread::sleep(Duration::from_micros(micros));
            queue = self.queue.lock().unwrap();
            queue.work.pop_front();
            queue.completed = seq;
            self.changed.notify_all();
        }
    }

    /// Work that uses [start, end) for `micros`; its place in the queue.
    pub fn launch(&self, micros: u64, range: (usize, usize)) -> u64 {
        let mut queue = self.queue.lock().unwrap();
        queue.enqueued += 1;
        let seq = queue.enqueued;
        queue.work.push_back(Work { seq, micros, range });
        self.changed.notify_all();
        seq
    }

    /// How far the queue reaches now: what an event recorded now waits for.
    pub fn mark(&self) -> u64 {
        self.queue.lock().unwrap().enqueued
    }

    pub fn reached(&self, seq: u64) -> bool {
        self.queue.lock().unwrap().completed >= seq
    }

    pub fn wait_for(&self, seq: u64) {
        let mut queue = self.queue.lock().unwrap();
        while queue.completed < seq {
            queue = self.changed.wait(queue).unwrap();
        }
    }

    pub fn synchronize(&self) {
        let seq = self.mark();
        self.wait_for(seq);
    }

    pub fn idle(&self) -> bool {
        let queue = self.queue.lock().unwrap();
        queue.completed == queue.enqueued
    }

    /// Pending work (running or queued) whose range meets [start, end).
    pub fn using(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let queue = self.queue.lock().unwrap();
        queue
            .work
            .iter()
            .map(|w| w.range)
            .find(|&(s, e)| s < end && start < e)
    }

    /// The worker finishes what is queued, then exits (cuStreamDestroy does not wait).
    pub fn close(&self) {
        self.queue.lock().unwrap().closed = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_completes_in_order_and_asynchronously() {
        let s = Stream::start(0x10, 0);
        let first = s.launch(20_000, (0, 8));
        let second = s.launch(1, (8, 16));
        assert!(!s.reached(first), "launches return before the work is done");
        assert_eq!(s.using(4, 12), Some((0, 8)));
        s.wait_for(second);
        assert!(s.reached(first) && s.idle() && s.using(0, 16).is_none());
        s.close();
    }
}
