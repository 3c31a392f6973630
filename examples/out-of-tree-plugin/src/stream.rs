//! Streams as worker threads, and events with CUDA's semantics.
//!
//! Each stream is a queue and a thread that runs its operations one after another, so work on
//! a stream completes in the order it was enqueued, while the enqueueing call returns at once.
//! An event record is an operation too: it completes a fresh [`Latch`] when the stream reaches
//! it. The event keeps its most recent latch; `stream_wait_event` enqueues a wait on the latch
//! the event has *at that moment*, so a later re-record does not redirect an earlier wait, and
//! an event never recorded has no latch, so a wait on it does not wait. The null stream is a
//! stream like the others (created on first use), with no implicit synchronisation.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use ferrocx_plugin_sdk::prelude::*;

/// Event flag bit 0: the event takes no time.
pub const DISABLE_TIMING: u32 = 1;

/// One operation of a stream.
type Op = Box<dyn FnOnce() + Send>;

fn poisoned() -> Error {
    Error::internal("a lock of the device was poisoned")
}

fn lock<T>(m: &Mutex<T>) -> Result<MutexGuard<'_, T>> {
    m.lock().map_err(|_| poisoned())
}

#[derive(Default)]
struct QueueState {
    ops: VecDeque<Op>,
    /// The worker is running an operation.
    busy: bool,
    /// Destroyed: the worker exits once the queue is empty.
    closing: bool,
}

/// A stream: its queue, and the condition its worker and its waiters share.
#[derive(Default)]
pub struct Queue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

impl Queue {
    /// A new queue with its worker thread.
    fn start() -> Result<Arc<Queue>> {
        let q = Arc::new(Queue::default());
        let worker = Arc::clone(&q);
        std::thread::Builder::new()
            .name("outoftree-stream".into())
            .spawn(move || worker.run())
            .map_err(|e| Error::system("spawning a stream's worker thread", e))?;
        Ok(q)
    }

    fn run(&self) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        loop {
            if let Some(op) = st.ops.pop_front() {
                st.busy = true;
                drop(st);
                op();
                let Ok(next) = self.state.lock() else {
                    return;
                };
                st = next;
                st.busy = false;
                self.changed.notify_all();
            } else if st.closing {
                return;
            } else {
                let Ok(next) = self.changed.wait(st) else {
                    return;
                };
                st = next;
            }
        }
    }

    /// Appends an operation; it runs after everything enqueued before it.
    pub fn enqueue(&self, op: Op) -> Result<()> {
        lock(&self.state)?.ops.push_back(op);
        self.changed.notify_all();
        Ok(())
    }

    /// `true` when every operation enqueued so far has completed.
    pub fn is_idle(&self) -> Result<bool> {
        let st = lock(&self.state)?;
        Ok(st.ops.is_empty() && !st.busy)
    }

    /// Blocks until every operation enqueued so far has completed.
    pub fn synchronize(&self) -> Result<()> {
        let mut st = lock(&self.state)?;
        while !st.ops.is_empty() || st.busy {
            st = self.changed.wait(st).map_err(|_| poisoned())?;
        }
        Ok(())
    }

    fn close(&self) -> Result<()> {
        lock(&self.state)?.closing = true;
        self.changed.notify_all();
        Ok(())
    }
}

/// Completed once, by the record operation of one `event_record`; carries its time.
#[derive(Default)]
pub struct Latch {
    done: Mutex<Option<Instant>>,
    changed: Condvar,
}

impl Latch {
    fn complete(&self) {
        if let Ok(mut d) = self.done.lock() {
            *d = Some(Instant::now());
        }
        self.changed.notify_all();
    }

    fn completed_at(&self) -> Result<Option<Instant>> {
        Ok(*lock(&self.done)?)
    }

    fn wait(&self) -> Result<Instant> {
        let mut d = lock(&self.done)?;
        loop {
            if let Some(t) = *d {
                return Ok(t);
            }
            d = self.changed.wait(d).map_err(|_| poisoned())?;
        }
    }
}

struct EventState {
    timing: bool,
    /// The latch of the most recent record, `None` before the first.
    latest: Option<Arc<Latch>>,
}

/// The live streams and events of the device. Handles are numbers from a counter.
#[derive(Default)]
pub struct Handles {
    next: AtomicUsize,
    default_stream: OnceLock<Arc<Queue>>,
    streams: Mutex<HashMap<usize, Arc<Queue>>>,
    events: Mutex<HashMap<usize, EventState>>,
}

impl Handles {
    fn next_id(&self) -> usize {
        // Never 0: the null stream is the default stream, and the null event is no event.
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A new stream with its worker thread.
    pub fn stream_create(&self) -> Result<Stream> {
        let q = Queue::start()?;
        let id = self.next_id();
        lock(&self.streams)?.insert(id, q);
        Ok(Stream(id as *mut c_void))
    }

    /// Destroys a stream: returns at once; its worker finishes the work enqueued, then exits.
    pub fn stream_destroy(&self, s: Stream) -> Result<()> {
        if s.is_null() {
            return Err(Error::invalid_handle(
                "the default stream cannot be destroyed",
            ));
        }
        let q = lock(&self.streams)?
            .remove(&(s.0 as usize))
            .ok_or_else(|| Error::invalid_handle(format!("unknown stream {:p}", s.0)))?;
        q.close()
    }

    /// The queue of `s` (the null stream is the default stream).
    pub fn stream(&self, s: Stream) -> Result<Arc<Queue>> {
        if s.is_null() {
            if let Some(q) = self.default_stream.get() {
                return Ok(Arc::clone(q));
            }
            let q = Queue::start()?;
            // Two threads may race to create it: the loser's worker just exits.
            let winner = self.default_stream.get_or_init(|| Arc::clone(&q));
            if !Arc::ptr_eq(winner, &q) {
                q.close()?;
            }
            return Ok(Arc::clone(winner));
        }
        lock(&self.streams)?
            .get(&(s.0 as usize))
            .cloned()
            .ok_or_else(|| Error::invalid_handle(format!("unknown stream {:p}", s.0)))
    }

    /// A new event (`flags`: [`DISABLE_TIMING`] or 0).
    pub fn event_create(&self, flags: u32) -> Result<Event> {
        if flags & !DISABLE_TIMING != 0 {
            return Err(Error::invalid_argument(format!(
                "unknown event flags {flags:#x}"
            )));
        }
        let id = self.next_id();
        let state = EventState {
            timing: flags & DISABLE_TIMING == 0,
            latest: None,
        };
        lock(&self.events)?.insert(id, state);
        Ok(Event(id as *mut c_void))
    }

    /// Destroys an event. Waits already enqueued hold their own latch and still complete.
    pub fn event_destroy(&self, e: Event) -> Result<()> {
        match lock(&self.events)?.remove(&(e.0 as usize)) {
            Some(_) => Ok(()),
            None => Err(Error::invalid_handle(format!("unknown event {:p}", e.0))),
        }
    }

    fn with_event<R>(&self, e: Event, f: impl FnOnce(&mut EventState) -> R) -> Result<R> {
        let mut events = lock(&self.events)?;
        let state = events
            .get_mut(&(e.0 as usize))
            .ok_or_else(|| Error::invalid_handle(format!("unknown event {:p}", e.0)))?;
        Ok(f(state))
    }

    /// Records `e` at the current end of `s`.
    pub fn event_record(&self, e: Event, s: Stream) -> Result<()> {
        let q = self.stream(s)?;
        let latch = Arc::new(Latch::default());
        self.with_event(e, |ev| ev.latest = Some(Arc::clone(&latch)))?;
        q.enqueue(Box::new(move || latch.complete()))
    }

    /// Makes later work on `s` wait for the record `e` has now (if any).
    pub fn stream_wait_event(&self, s: Stream, e: Event) -> Result<()> {
        let q = self.stream(s)?;
        let Some(latch) = self.with_event(e, |ev| ev.latest.clone())? else {
            return Ok(()); // never recorded: nothing to wait for
        };
        q.enqueue(Box::new(move || {
            // A poisoned latch cannot happen (nothing panics holding it); don't block on one.
            let _ = latch.wait();
        }))
    }

    /// Blocks until the most recent record of `e` has completed.
    pub fn event_synchronize(&self, e: Event) -> Result<()> {
        match self.with_event(e, |ev| ev.latest.clone())? {
            Some(latch) => latch.wait().map(|_| ()),
            None => Ok(()),
        }
    }

    /// `true` when the most recent record of `e` has completed (or there is none).
    pub fn event_query(&self, e: Event) -> Result<bool> {
        match self.with_event(e, |ev| ev.latest.clone())? {
            Some(latch) => Ok(latch.completed_at()?.is_some()),
            None => Ok(true),
        }
    }

    /// Milliseconds between the completed most recent records of two timing events.
    pub fn elapsed_ms(&self, start: Event, end: Event) -> Result<f32> {
        let a = self.with_event(start, |ev| (ev.timing, ev.latest.clone()))?;
        let b = self.with_event(end, |ev| (ev.timing, ev.latest.clone()))?;
        if !a.0 || !b.0 {
            return Err(Error::invalid_argument(
                "an event created with DISABLE_TIMING has no time",
            ));
        }
        let (Some(la), Some(lb)) = (a.1, b.1) else {
            return Err(Error::invalid_argument(
                "both events must have been recorded",
            ));
        };
        let (Some(ta), Some(tb)) = (la.completed_at()?, lb.completed_at()?) else {
            return Err(Error::new(
                Status::NOT_READY,
                "a record has not completed yet",
            ));
        };
        let ms = if tb >= ta {
            (tb - ta).as_secs_f64() * 1e3
        } else {
            -((ta - tb).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
    }

    /// Waits for every stream's work, then destroys every stream and event.
    pub fn clear(&self) -> Result<()> {
        let streams: Vec<Arc<Queue>> = lock(&self.streams)?.drain().map(|(_, q)| q).collect();
        for q in streams.iter().chain(self.default_stream.get()) {
            q.synchronize()?;
        }
        for q in &streams {
            q.close()?;
        }
        lock(&self.events)?.clear();
        Ok(())
    }
}
