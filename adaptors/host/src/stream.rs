//! Streams of the host device: ordered queues, each run by its own worker thread.
//!
//! Enqueueing returns at once; the worker runs tasks in order. A task that fails leaves its
//! error on the stream (sticky, as CUDA's are) until `synchronize` reports it; later tasks still
//! run, so events recorded after a failure still complete and nothing waits forever.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;

use ferrocx_plugin_sdk::abi::Stream;
use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::{Error, Result};

use crate::ccl::CollTask;

/// Polls of an idle worker for new work before it sleeps.
const IDLE_SPINS: u32 = 512;

/// Work enqueued on a stream.
pub type Task = Box<dyn FnOnce() -> Result<()> + Send>;

/// A queue entry: a collective is stored inline (no allocation per call), anything else boxed.
enum Work {
    Fn(Task),
    Coll(CollTask),
}

impl Work {
    fn run(self) -> Result<()> {
        match self {
            Work::Fn(f) => f(),
            Work::Coll(c) => c.run(),
        }
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Work>,
    error: Option<Error>,
    closing: bool,
    /// The worker sleeps on `work`: only then does an enqueue need to wake it.
    worker_asleep: bool,
}

/// One stream: its queue and the worker's progress.
pub struct StreamInner {
    id: u64,
    state: Mutex<State>,
    /// Tasks enqueued so far (changed under the lock, read without it).
    enqueued: AtomicU64,
    /// Tasks completed so far.
    completed: AtomicU64,
    /// The smallest completion count a thread sleeping in `synchronize` waits for (`u64::MAX`
    /// when none): the worker signals only when it reaches it, not after every task.
    wake_at: AtomicU64,
    /// Cleared when the stream is destroyed (handle caches check it).
    alive: AtomicBool,
    /// Signalled when a task is enqueued or the stream closes.
    work: Condvar,
    /// Signalled when a task completes and someone waits.
    done: Condvar,
}

impl StreamInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic inside a task is caught before it can poison the lock; recover anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, w: Work) -> Result<()> {
        let mut s = self.lock();
        if s.closing {
            return Err(Error::invalid_handle(format!(
                "stream {} is being destroyed",
                self.id
            )));
        }
        s.queue.push_back(w);
        self.enqueued.fetch_add(1, Ordering::Release);
        let wake = s.worker_asleep;
        drop(s);
        // Skip the wake-up system call while the worker is busy: it re-checks the queue.
        if wake {
            self.work.notify_one();
        }
        Ok(())
    }

    /// Enqueues `task`; returns at once.
    pub fn enqueue(&self, task: Task) -> Result<()> {
        self.push(Work::Fn(task))
    }

    /// Enqueues a collective; returns at once.
    pub fn enqueue_coll(&self, task: CollTask) -> Result<()> {
        self.push(Work::Coll(task))
    }

    /// Blocks until everything enqueued before this call has run; returns (and clears) the
    /// stream's sticky error, if any.
    pub fn synchronize(&self) -> Result<()> {
        let target = self.enqueued.load(Ordering::Acquire);
        if self.completed.load(Ordering::Acquire) < target {
            let mut s = self.lock();
            loop {
                // Register the target, then re-check: the worker either sees the target or
                // completed the task before the check below.
                self.wake_at.fetch_min(target, Ordering::SeqCst);
                if self.completed.load(Ordering::SeqCst) >= target {
                    break;
                }
                s = self.done.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            drop(s);
        }
        match self.lock().error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// `true` when every enqueued task has run.
    pub fn is_idle(&self) -> bool {
        self.completed.load(Ordering::Acquire) >= self.enqueued.load(Ordering::Acquire)
    }

    fn run(self: Arc<Self>) {
        let mut batch: VecDeque<Work> = VecDeque::new();
        loop {
            // Back-to-back work usually arrives within microseconds: look for it briefly before
            // sleeping, so the enqueuer does not have to make a wake-up system call.
            for i in 0..IDLE_SPINS {
                if self.enqueued.load(Ordering::Acquire) > self.completed.load(Ordering::Acquire) {
                    break;
                }
                if i % 64 == 63 {
                    thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            {
                let mut s = self.lock();
                loop {
                    if !s.queue.is_empty() {
                        // Take everything queued at once: one lock per batch, not per task.
                        std::mem::swap(&mut s.queue, &mut batch);
                        break;
                    }
                    if s.closing {
                        return;
                    }
                    s.worker_asleep = true;
                    s = self.work.wait(s).unwrap_or_else(|p| p.into_inner());
                    s.worker_asleep = false;
                }
            }
            while let Some(w) = batch.pop_front() {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run()))
                    .unwrap_or_else(|_| Err(Error::internal("a task on the stream panicked")));
                if let Err(e) = outcome {
                    tracing::debug!(stream = self.id, "task failed: {e}");
                    self.lock().error.get_or_insert(e);
                }
                let done = self.completed.fetch_add(1, Ordering::SeqCst) + 1;
                if done >= self.wake_at.load(Ordering::SeqCst) {
                    // Under the lock, so the waiter is either before its check or asleep. Every
                    // waiter wakes, re-registers its own target if it is not reached yet.
                    let _s = self.lock();
                    self.wake_at.store(u64::MAX, Ordering::SeqCst);
                    self.done.notify_all();
                }
            }
        }
    }
}

/// All live streams of this process, by handle value.
static STREAMS: HandleTable<Arc<StreamInner>> = HandleTable::new("stream");
static DEFAULT: OnceLock<Arc<StreamInner>> = OnceLock::new();

/// Starts the worker of stream `id` (its handle value; 0 for the default stream).
fn spawn(id: u64) -> Result<Arc<StreamInner>> {
    let inner = Arc::new(StreamInner {
        id,
        state: Mutex::new(State::default()),
        enqueued: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        wake_at: AtomicU64::new(u64::MAX),
        alive: AtomicBool::new(true),
        work: Condvar::new(),
        done: Condvar::new(),
    });
    let worker = inner.clone();
    thread::Builder::new()
        .name(format!("ferrocx-stream-{id}"))
        .spawn(move || worker.run())
        .map_err(|e| Error::system("spawn a stream worker", e))?;
    Ok(inner)
}

/// Creates a stream and returns its handle.
pub fn create() -> Result<Stream> {
    let id = STREAMS.insert_with(spawn)?;
    Ok(Stream(id as usize as *mut std::ffi::c_void))
}

thread_local! {
    /// The stream this thread used last: enqueueing many calls on one stream skips the map.
    static LAST: RefCell<Option<(u64, Arc<StreamInner>)>> = const { RefCell::new(None) };
}

/// The stream behind a handle; the null handle is this process's default stream.
pub fn get(handle: Stream) -> Result<Arc<StreamInner>> {
    let id = handle.0 as usize as u64;
    let cached = LAST.with(|l| match &*l.borrow() {
        Some((h, s)) if *h == id && s.alive.load(Ordering::Acquire) => Some(s.clone()),
        _ => None,
    });
    if let Some(s) = cached {
        return Ok(s);
    }
    let s = lookup(handle)?;
    LAST.with(|l| *l.borrow_mut() = Some((id, s.clone())));
    Ok(s)
}

fn lookup(handle: Stream) -> Result<Arc<StreamInner>> {
    if handle.is_null() {
        if let Some(d) = DEFAULT.get() {
            return Ok(d.clone());
        }
        let d = spawn(0)?;
        return Ok(DEFAULT.get_or_init(|| d).clone());
    }
    STREAMS.get(handle.0 as usize as u64)
}

/// Destroys a stream: work already enqueued still runs, then the worker exits.
pub fn destroy(handle: Stream) -> Result<()> {
    if handle.is_null() {
        return Err(Error::invalid_handle(
            "the default stream cannot be destroyed",
        ));
    }
    let inner = STREAMS.remove(handle.0 as usize as u64)?;
    inner.alive.store(false, Ordering::Release);
    inner.lock().closing = true;
    inner.work.notify_all();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn tasks_run_in_order_and_enqueue_does_not_block() {
        let s = get(create().unwrap()).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        s.enqueue(Box::new(move || {
            let (m, c) = &*g;
            let mut open = m.lock().unwrap();
            while !*open {
                open = c.wait(open).unwrap();
            }
            Ok(())
        }))
        .unwrap();
        for i in 0..100 {
            let l = log.clone();
            s.enqueue(Box::new(move || {
                l.lock().unwrap().push(i);
                Ok(())
            }))
            .unwrap();
        }
        // Everything is queued behind the gate: nothing ran, and enqueue returned.
        assert!(!s.is_idle());
        assert!(log.lock().unwrap().is_empty());
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        s.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), (0..100).collect::<Vec<_>>());
        assert!(s.is_idle());
    }

    #[test]
    fn an_error_is_sticky_until_synchronize_and_later_tasks_still_run() {
        let h = create().unwrap();
        let s = get(h).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        s.enqueue(Box::new(|| Err(Error::invalid_argument("first"))))
            .unwrap();
        s.enqueue(Box::new(|| Err(Error::invalid_argument("second"))))
            .unwrap();
        let r = ran.clone();
        s.enqueue(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
        .unwrap();
        let e = s.synchronize().unwrap_err();
        assert_eq!(e.message(), "first");
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        s.synchronize().unwrap();
        destroy(h).unwrap();
        assert!(get(h).is_err());
        assert!(destroy(h).is_err());
    }

    #[test]
    fn destroy_lets_enqueued_work_finish() {
        let h = create().unwrap();
        let s = get(h).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..10 {
            let r = ran.clone();
            s.enqueue(Box::new(move || {
                thread::sleep(Duration::from_millis(1));
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }))
            .unwrap();
        }
        destroy(h).unwrap();
        s.synchronize().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 10);
    }
}
