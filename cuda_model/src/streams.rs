//! Streams run asynchronously, each on a worker thread of its own: work enqueued by
//! accallocModelLaunch holds its memory range until the worker has slept through it. An event
//! records how far its stream's queue reached; it completes when the worker gets there. A wait
//! (cuStreamWaitEvent) holds a stream's worker until another stream reaches an event's place, and
//! orders what the stream runs afterwards behind the work before that place. A copy
//! (cuMemcpyHtoDAsync, cuMemcpyDtoHAsync) reads one range and writes another when the worker
//! reaches it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

type Range = (usize, usize);

/// How work uses a range: a read conflicts with writes only, a write with any use.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Use {
    Read,
    Write,
}

enum Task {
    /// Use [start, end) for so many microseconds (read and written, as a kernel may).
    Launch { micros: u64, range: Range },
    /// Read `src` and write `dst`: `run` copies, once the stream gets there.
    Copy {
        dst: Range,
        src: Range,
        run: Option<Box<dyn FnOnce() + Send>>,
    },
    /// Wait until another stream has done its work up to a place in its queue.
    Wait { on: Arc<Stream>, seq: u64 },
}

/// What the worker does with the task at the front of its queue.
enum Job {
    Sleep(u64),
    Wait(Arc<Stream>, u64),
    Run(Option<Box<dyn FnOnce() + Send>>),
}

struct Work {
    seq: u64,
    task: Task,
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
    /// For each stream this one waited for: the place in its queue that work enqueued here from
    /// then on comes after (cuStreamWaitEvent). Not transitive: stricter than the driver.
    after: Mutex<HashMap<usize, u64>>,
}

impl Stream {
    pub fn start(handle: usize, device: usize) -> Arc<Stream> {
        let stream = Arc::new(Stream {
            handle,
            device,
            queue: Mutex::default(),
            changed: Condvar::new(),
            after: Mutex::default(),
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
            let Some(next) = queue.work.front_mut() else {
                if queue.closed {
                    return;
                }
                queue = self.changed.wait(queue).unwrap();
                continue;
            };
            let seq = next.seq;
            let job = match &mut next.task {
                Task::Launch { micros, .. } => Job::Sleep(*micros),
                Task::Wait { on, seq } => Job::Wait(on.clone(), *seq),
                Task::Copy { run, .. } => Job::Run(run.take()),
            };
            drop(queue);
            match job {
                Job::Sleep(micros) => std::thread::sleep(Duration::from_micros(micros)),
                Job::Wait(on, place) => on.wait_for(place),
                Job::Run(run) => run.into_iter().for_each(|f| f()),
            }
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
        queue.work.push_back(Work {
            seq,
            task: Task::Launch { micros, range },
        });
        self.changed.notify_all();
        seq
    }

    /// A copy that reads `src` and writes `dst`, made by `run` when the stream gets there; its
    /// place in the queue.
    pub fn copy(&self, dst: Range, src: Range, run: Box<dyn FnOnce() + Send>) -> u64 {
        let mut queue = self.queue.lock().unwrap();
        queue.enqueued += 1;
        let seq = queue.enqueued;
        let task = Task::Copy {
            dst,
            src,
            run: Some(run),
        };
        queue.work.push_back(Work { seq, task });
        self.changed.notify_all();
        seq
    }

    /// Hold this stream's later work until `on` has done its work up to `seq`.
    pub fn wait(&self, on: Arc<Stream>, seq: u64) {
        if on.handle != self.handle {
            let mut after = self.after.lock().unwrap();
            let place = after.entry(on.handle).or_insert(0);
            *place = (*place).max(seq);
        }
        let mut queue = self.queue.lock().unwrap();
        queue.enqueued += 1;
        let mine = queue.enqueued;
        queue.work.push_back(Work {
            seq: mine,
            task: Task::Wait { on, seq },
        });
        self.changed.notify_all();
    }

    /// Whether work enqueued here now runs after `other`'s work up to `seq`.
    pub fn comes_after(&self, other: &Stream, seq: u64) -> bool {
        self.after
            .lock()
            .unwrap()
            .get(&other.handle)
            .is_some_and(|&place| place >= seq)
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

    /// Pending work (running or queued) whose use of a range meets `access` of [start, end): its
    /// range and place.
    pub fn using(&self, start: usize, end: usize, access: Use) -> Option<(Range, u64)> {
        let queue = self.queue.lock().unwrap();
        queue.work.iter().find_map(|w| {
            let uses = match w.task {
                Task::Launch { range, .. } => [Some((range, Use::Write)), None],
                Task::Copy { dst, src, .. } => [Some((dst, Use::Write)), Some((src, Use::Read))],
                Task::Wait { .. } => [None, None],
            };
            uses.into_iter().flatten().find_map(|((s, e), used)| {
                let conflict = used == Use::Write || access == Use::Write;
                (conflict && s < end && start < e).then_some(((s, e), w.seq))
            })
        })
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
        assert_eq!(s.using(4, 12, Use::Read), Some(((0, 8), first)));
        s.wait_for(second);
        assert!(s.reached(first) && s.idle() && s.using(0, 16, Use::Write).is_none());
        s.close();
    }

    #[test]
    fn a_copy_runs_in_order_and_reads_and_writes_its_ranges() {
        let s = Stream::start(0x40, 0);
        let long = s.launch(30_000, (0, 8));
        let done = Arc::new(Mutex::new(false));
        let flag = done.clone();
        let copy = s.copy(
            (100, 108),
            (200, 208),
            Box::new(move || *flag.lock().unwrap() = true),
        );
        assert!(!*done.lock().unwrap(), "queued behind the launch");
        assert_eq!(s.using(200, 204, Use::Write), Some(((200, 208), copy)));
        assert_eq!(
            s.using(200, 204, Use::Read),
            None,
            "two reads do not conflict"
        );
        assert_eq!(s.using(104, 120, Use::Read), Some(((100, 108), copy)));
        s.wait_for(copy);
        assert!(s.reached(long) && *done.lock().unwrap());
        assert_eq!(s.using(0, 300, Use::Write), None);
        s.close();
    }

    #[test]
    fn a_wait_holds_a_stream_until_the_other_gets_there() {
        let (a, b) = (Stream::start(0x20, 0), Stream::start(0x30, 0));
        let long = b.launch(30_000, (0, 8));
        a.wait(b.clone(), long);
        assert!(a.comes_after(&b, long) && !a.comes_after(&b, long + 1) && !b.comes_after(&a, 1));
        let after = a.launch(1, (0, 8));
        assert!(!a.reached(after), "held behind stream B's work");
        a.wait_for(after);
        assert!(b.reached(long), "B finished first");
        a.close();
        b.close();
    }
}
