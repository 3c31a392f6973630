//! Streams of the host device: ordered queues, each run by its own worker thread.
//!
//! Enqueueing returns at once; the worker runs tasks in order. A task that fails leaves its
//! error on the stream (sticky, as CUDA's are) until `synchronize` reports it; later tasks still
//! run, so events recorded after a failure still complete and nothing waits forever.
//!
//! A stream holds at most [`depth`] operations not yet completed (as a device's launch queue
//! is bounded): an enqueue beyond it waits until the worker has made room, except on a stream's
//! own worker thread (a host function enqueueing), which cannot wait for itself and fails with
//! `OUT_OF_MEMORY` instead. An enqueue that has room takes no lock or system call more than it
//! did before the bound.
//!
//! The memops group's operations run on the worker too: a store of a 32-bit word
//! ([`StreamInner::enqueue_write_value32`]) and a wait for one
//! ([`StreamInner::enqueue_wait_value32`]). The worker polls the word: it spins briefly, then
//! yields, then sleeps on it (a futex, growing to [`WAIT_POLL_MAX`] between reads); a host
//! stream's store wakes the word's sleepers at once, a writer that cannot (a device) is seen
//! within the sleep. A long wait costs little CPU and a short one little latency. A wait is abortable: destroying the stream ends
//! it at the next read with `ABORTED` (left on the stream as its error), so the worker exits
//! and no thread is left polling memory that may be gone. A wait is not otherwise bounded: like
//! CUDA's `cuStreamWaitValue32`, a word that is never written holds the stream (and whoever
//! synchronizes it) until then.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;

use ferrocx_plugin_sdk::abi::Stream;
use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::{Error, Result, WaitCondition};

use crate::ccl::CollTask;

/// Polls of an idle worker for new work before it sleeps.
const IDLE_SPINS: u32 = 512;

/// Reads of a waited-for word spinning before the worker yields between reads.
const WAIT_SPINS: u32 = 2048;
/// Reads of a waited-for word with a yield between them before the worker sleeps between reads.
const WAIT_YIELDS: u32 = 256;
/// The longest sleep between two reads of a waited-for word (a store by a host stream wakes the
/// sleeper at once).
pub const WAIT_POLL_MAX: std::time::Duration = std::time::Duration::from_micros(200);

/// Operations a stream holds (queued or running) by default.
pub const DEFAULT_DEPTH: u64 = 65536;

/// Environment variable that sets the operations a stream holds (at least 1).
pub const DEPTH_ENV: &str = "FERROCX_HOST_STREAM_DEPTH";

/// The operations a stream holds: [`DEPTH_ENV`] if set to a positive number, else
/// [`DEFAULT_DEPTH`]. Read once per process.
pub fn depth() -> u64 {
    static DEPTH: OnceLock<u64> = OnceLock::new();
    *DEPTH.get_or_init(|| match std::env::var(DEPTH_ENV) {
        Err(_) => DEFAULT_DEPTH,
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => {
                tracing::warn!("{DEPTH_ENV}={v:?} is not a positive count; using {DEFAULT_DEPTH}");
                DEFAULT_DEPTH
            }
        },
    })
}

thread_local! {
    /// Set on a stream's worker thread: an enqueue from it must never wait for room.
    static ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Work enqueued on a stream.
pub type Task = Box<dyn FnOnce() -> Result<()> + Send>;

/// A queue entry: a collective is stored inline (no allocation per call), anything else boxed.
enum Work {
    Fn(Task),
    Coll(CollTask),
    /// `stream_write_value32`: the address (checked non-null and aligned) and the value.
    Write(usize, u32),
    /// `stream_wait_value32`: the address, the value and the condition.
    Wait(usize, u32, WaitCondition),
}

impl Work {
    fn run(self, stream: &StreamInner) -> Result<()> {
        match self {
            Work::Fn(f) => f(),
            Work::Coll(c) => c.run(),
            Work::Write(addr, value) => {
                // SAFETY: a non-null, 4-byte aligned address the enqueuer guaranteed valid for
                // a 32-bit atomic store until this store has run (the memops contract).
                let word = unsafe { AtomicU32::from_ptr(addr as *mut u32) };
                word.store(value, Ordering::Release);
                // A stream of this process (or another) may sleep on the word.
                ferrocx::futex::wake(word);
                Ok(())
            }
            Work::Wait(addr, value, condition) => stream.wait_value32(addr, value, condition),
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
    /// Operations it holds at most (see [`depth`]).
    depth: u64,
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
    /// Set while a caller runs an operation itself (see [`StreamInner::claim_inline`]): the
    /// worker starts nothing until it is cleared. An atomic rather than a field under the lock,
    /// so that the calling thread's fast path takes no lock.
    inline: AtomicBool,
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
        // `enqueued` only changes under the lock: exact here. Room is the common case and costs
        // one more atomic load.
        if self.enqueued.load(Ordering::Relaxed) - self.completed.load(Ordering::Acquire)
            >= self.depth
        {
            s = self.wait_for_room(s)?;
        }
        s.queue.push_back(w);
        // `SeqCst`: a caller claiming the stream inline either sees this count or its claim is
        // seen by the worker (see `claim_inline`).
        self.enqueued.fetch_add(1, Ordering::SeqCst);
        let wake = s.worker_asleep;
        drop(s);
        // Skip the wake-up system call while the worker is busy: it re-checks the queue.
        if wake {
            self.work.notify_one();
        }
        Ok(())
    }

    /// Waits (with the lock released) until the stream holds fewer than `depth` operations;
    /// fails at once on a stream's worker thread, and if the stream is destroyed meanwhile.
    fn wait_for_room<'a>(
        &'a self,
        mut s: std::sync::MutexGuard<'a, State>,
    ) -> Result<std::sync::MutexGuard<'a, State>> {
        if ON_WORKER.with(|w| w.get()) {
            return Err(Error::out_of_memory(format!(
                "stream {} already holds {} operations (its limit, {DEPTH_ENV}), and this \
                 enqueue comes from a stream's worker (a host function), which cannot wait for \
                 room: enqueue less from host functions, or raise {DEPTH_ENV}",
                self.id, self.depth
            )));
        }
        loop {
            // Room once `completed` reaches this: the same wake-up as `synchronize`'s.
            let target = self.enqueued.load(Ordering::Relaxed) - self.depth + 1;
            self.wake_at.fetch_min(target, Ordering::SeqCst);
            if self.completed.load(Ordering::SeqCst) >= target {
                break;
            }
            s = self.done.wait(s).unwrap_or_else(|p| p.into_inner());
            if s.closing {
                return Err(Error::invalid_handle(format!(
                    "stream {} was destroyed while an enqueue waited for room",
                    self.id
                )));
            }
        }
        Ok(s)
    }

    /// The operations this stream holds at most.
    #[cfg(test)]
    fn depth(&self) -> u64 {
        self.depth
    }

    /// Enqueues `task`; returns at once unless the stream already holds [`depth`] operations,
    /// then it waits for room (fails on a stream's worker thread).
    pub fn enqueue(&self, task: Task) -> Result<()> {
        self.push(Work::Fn(task))
    }

    /// Enqueues a store of `value` to the 32-bit word at `addr` (release ordering) in stream
    /// order; returns as [`enqueue`](Self::enqueue) does.
    ///
    /// # Safety
    /// `addr` is non-null, 4-byte aligned, and valid for a 32-bit atomic store until the store
    /// has run.
    pub unsafe fn enqueue_write_value32(&self, addr: *mut u32, value: u32) -> Result<()> {
        self.push(Work::Write(addr as usize, value))
    }

    /// Enqueues a wait until the 32-bit word at `addr` satisfies `condition` for `value`: work
    /// enqueued after it starts only then. Returns as [`enqueue`](Self::enqueue) does (the
    /// worker waits, not the caller); destroying the stream abandons the wait (see the module's
    /// documentation).
    ///
    /// # Safety
    /// `addr` is non-null, 4-byte aligned, and valid for 32-bit atomic loads until the wait is
    /// over (satisfied, or abandoned when the stream is destroyed).
    pub unsafe fn enqueue_wait_value32(
        &self,
        addr: *const u32,
        value: u32,
        condition: WaitCondition,
    ) -> Result<()> {
        self.push(Work::Wait(addr as usize, value, condition))
    }

    /// Runs on the worker: polls the word at `addr` until it satisfies `condition`, or fails
    /// with `ABORTED` once the stream is destroyed.
    fn wait_value32(&self, addr: usize, value: u32, condition: WaitCondition) -> Result<()> {
        // SAFETY: non-null and aligned (checked at enqueue), valid for atomic loads until the
        // wait is over by the enqueuer's contract; only loads are made through it.
        let word = unsafe { AtomicU32::from_ptr(addr as *mut u32) };
        let mut reads: u32 = 0;
        let mut pause = std::time::Duration::from_micros(1);
        loop {
            let current = word.load(Ordering::Acquire);
            if condition.holds(current, value) {
                return Ok(());
            }
            reads = reads.saturating_add(1);
            if reads < WAIT_SPINS {
                std::hint::spin_loop();
                continue;
            }
            if !self.alive.load(Ordering::Acquire) {
                return Err(Error::new(
                    ferrocx::abi::Status::ABORTED,
                    format!(
                        "stream {} was destroyed while it waited for the word at {addr:#x} to be {} {value} (it read {current}): the wait is abandoned",
                        self.id,
                        match condition {
                            WaitCondition::Geq => ">= (with wrap-around)",
                            WaitCondition::Eq => "==",
                        }
                    ),
                ));
            }
            if reads < WAIT_SPINS + WAIT_YIELDS {
                thread::yield_now();
            } else {
                // Woken at once by a store of a host stream (it wakes the word's sleepers);
                // a writer that cannot wake (a device) is seen within `pause`.
                ferrocx::futex::wait(word, current, pause);
                pause = (pause * 2).min(WAIT_POLL_MAX);
            }
        }
    }

    /// Enqueues a collective; returns as [`enqueue`](Self::enqueue) does.
    pub fn enqueue_coll(&self, task: CollTask) -> Result<()> {
        self.push(Work::Coll(task))
    }

    /// Blocks until everything enqueued before this call has run; returns (and clears) the
    /// stream's sticky error, if any.
    pub fn synchronize(&self) -> Result<()> {
        // An operation another thread runs inline right now (bounded: see `claim_inline`)
        // ends first, completed or handed over (then counted in `enqueued`).
        self.wait_inline();
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

    /// `true` when every enqueued task has run (and no caller runs one inline).
    pub fn is_idle(&self) -> bool {
        self.completed.load(Ordering::Acquire) >= self.enqueued.load(Ordering::Acquire)
            && !self.inline.load(Ordering::Acquire)
    }

    /// Waits at most `timeout` (asleep, so that the worker can have this core) until every
    /// operation enqueued so far has completed; returns whether they have.
    /// On a stream's worker thread (a host function) it returns `false` at once: that worker
    /// may be the one it would wait for.
    pub(crate) fn wait_drained(&self, timeout: std::time::Duration) -> bool {
        let target = self.enqueued.load(Ordering::SeqCst);
        if self.completed.load(Ordering::SeqCst) >= target {
            return true;
        }
        if ON_WORKER.with(|w| w.get()) {
            return false;
        }
        let deadline = std::time::Instant::now() + timeout;
        let mut s = self.lock();
        loop {
            // As `synchronize`: register the target, then re-check.
            self.wake_at.fetch_min(target, Ordering::SeqCst);
            if self.completed.load(Ordering::SeqCst) >= target {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .done
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits (yielding) while a caller runs an operation inline: a bounded wait, since such an
    /// operation waits on peers at most its budget before it is handed over.
    fn wait_inline(&self) {
        while self.inline.load(Ordering::Acquire) {
            thread::yield_now();
        }
    }

    fn run(self: Arc<Self>) {
        ON_WORKER.with(|w| w.set(true));
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
                    if s.queue.is_empty() {
                        if !s.closing {
                            // Nothing to do; an inline claim's end wakes nobody, a push does.
                            s.worker_asleep = true;
                            s = self.work.wait(s).unwrap_or_else(|p| p.into_inner());
                            s.worker_asleep = false;
                            continue;
                        }
                        if !self.inline.load(Ordering::SeqCst) {
                            return;
                        }
                        // Closing, but a claim may still hand its operation over: wait for it.
                    } else if !self.inline.load(Ordering::SeqCst) {
                        // Take everything queued at once: one lock per batch, not per task.
                        // (`SeqCst`: a claim made before this push is seen, see `claim_inline`.)
                        std::mem::swap(&mut s.queue, &mut batch);
                        break;
                    }
                    // A caller runs an operation inline: it ends within its budget (completed,
                    // or handed over to the front of the queue), so yield until then rather
                    // than sleep (its end wakes nobody).
                    drop(s);
                    self.wait_inline();
                    s = self.lock();
                }
            }
            while let Some(w) = batch.pop_front() {
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run(&self)))
                        .unwrap_or_else(|_| Err(Error::internal("a task on the stream panicked")));
                self.complete(outcome);
            }
        }
    }

    /// Counts one operation complete (its failure, if any, becomes the sticky error) and wakes
    /// a thread in `synchronize` whose target it reaches.
    fn complete(&self, outcome: Result<()>) {
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

    /// Claims the stream for one operation the calling thread runs itself, at once: only when
    /// nothing is queued or running on it, and never on a stream's worker thread. The claim
    /// holds the worker off until the caller ends it with [`Inline::finish`] (it ran) or
    /// [`Inline::hand_over`] (the worker runs the rest, before anything enqueued meanwhile),
    /// and `synchronize` waits for it to end. So whatever is enqueued after the claimed
    /// operation runs after it, and the claimed operation starts after everything enqueued
    /// before it: stream order holds.
    ///
    /// It takes no lock and one atomic exchange: the claim is the `inline` flag, set and then
    /// checked against the counts. An operation pushed concurrently either raised `enqueued`
    /// before that check (the claim fails) or is taken by the worker after it, and the worker
    /// reads the flag (`SeqCst`) before it takes work, so it sees the claim and waits for its
    /// end. An operation that completes inline is not counted in `enqueued`/`completed` at all:
    /// it is done before the call that issued it returns.
    pub(crate) fn claim_inline(&self) -> Option<Inline<'_>> {
        let idle = || self.completed.load(Ordering::SeqCst) == self.enqueued.load(Ordering::SeqCst);
        if !idle() || ON_WORKER.with(|w| w.get()) {
            return None;
        }
        if self.inline.swap(true, Ordering::SeqCst) {
            // Another thread runs one inline on this stream.
            return None;
        }
        if !idle() {
            // Work was enqueued meanwhile: it runs first, on the worker.
            self.inline.store(false, Ordering::Release);
            return None;
        }
        Some(Inline { stream: self })
    }
}

/// An operation the calling thread runs on an idle stream in the stream's place (see
/// [`StreamInner::claim_inline`]). Dropped without an end, it counts as failed.
pub(crate) struct Inline<'a> {
    stream: &'a StreamInner,
}

impl Inline<'_> {
    /// The operation ran here with `outcome`: a failure becomes the stream's sticky error, as
    /// the worker's would, and the worker may go on.
    pub(crate) fn finish(self, outcome: Result<()>) {
        let s = self.stream;
        std::mem::forget(self);
        if let Err(e) = outcome {
            tracing::debug!(stream = s.id, "task failed: {e}");
            s.lock().error.get_or_insert(e);
        }
        // Release: the worker, and a `synchronize` that waits for the claim, see its effects.
        s.inline.store(false, Ordering::Release);
    }

    /// The worker finishes the operation: `rest` runs first on the stream, before anything
    /// enqueued while the caller held the claim.
    pub(crate) fn hand_over(self, rest: CollTask) {
        let s = self.stream;
        std::mem::forget(self);
        let mut st = s.lock();
        st.queue.push_front(Work::Coll(rest));
        // Counted before the claim ends: a `synchronize` that waited for the claim sees it.
        s.enqueued.fetch_add(1, Ordering::SeqCst);
        s.inline.store(false, Ordering::Release);
        let wake = st.worker_asleep;
        drop(st);
        if wake {
            s.work.notify_one();
        }
    }
}

impl Drop for Inline<'_> {
    fn drop(&mut self) {
        let s = self.stream;
        s.lock().error.get_or_insert(Error::internal(
            "an operation run on the calling thread ended without completing",
        ));
        s.inline.store(false, Ordering::Release);
    }
}

/// All live streams of this process, by handle value.
static STREAMS: HandleTable<Arc<StreamInner>> = HandleTable::new("stream");
static DEFAULT: OnceLock<Arc<StreamInner>> = OnceLock::new();

/// Starts the worker of stream `id` (its handle value; 0 for the default stream).
fn spawn(id: u64) -> Result<Arc<StreamInner>> {
    spawn_with_depth(id, depth())
}

/// As [`spawn`], holding at most `depth` operations.
fn spawn_with_depth(id: u64, depth: u64) -> Result<Arc<StreamInner>> {
    let inner = Arc::new(StreamInner {
        id,
        depth: depth.max(1),
        state: Mutex::new(State::default()),
        enqueued: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        wake_at: AtomicU64::new(u64::MAX),
        alive: AtomicBool::new(true),
        inline: AtomicBool::new(false),
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

/// Creates a stream that holds at most `depth` operations (tests of the bound).
#[cfg(test)]
fn create_with_depth(depth: u64) -> Result<Stream> {
    let id = STREAMS.insert_with(|id| spawn_with_depth(id, depth))?;
    Ok(Stream(id as usize as *mut std::ffi::c_void))
}

thread_local! {
    /// The stream this thread used last: enqueueing many calls on one stream skips the map.
    static LAST: RefCell<Option<(u64, Arc<StreamInner>)>> = const { RefCell::new(None) };
}

/// The stream behind a handle; the null handle is this process's default stream.
pub fn get(handle: Stream) -> Result<Arc<StreamInner>> {
    let id = handle.0 as usize as u64;
    let cached = LAST.with(|l| match l.try_borrow().as_deref() {
        Ok(Some((h, s))) if *h == id && s.alive.load(Ordering::Acquire) => Some(s.clone()),
        _ => None,
    });
    if let Some(s) = cached {
        return Ok(s);
    }
    let s = lookup(handle)?;
    // Not cached when the cache is borrowed (a lookup inside `with`'s closure).
    LAST.with(|l| {
        if let Ok(mut cache) = l.try_borrow_mut() {
            *cache = Some((id, s.clone()));
        }
    });
    Ok(s)
}

/// Runs `f` with the stream behind a handle, without taking a reference to it when it is this
/// thread's last one (the calling thread's fast path, see `claim_inline`). Inlined, with `f`
/// called inside the one access to the thread's cache.
#[inline(always)]
pub fn with<R>(handle: Stream, f: impl FnOnce(&Arc<StreamInner>) -> R) -> Result<R> {
    let id = handle.0 as usize as u64;
    LAST.with(|l| {
        if let Ok(cache) = l.try_borrow() {
            if let Some((h, s)) = &*cache {
                if *h == id && s.alive.load(Ordering::Acquire) {
                    return Ok(f(s));
                }
            }
        }
        Ok(f(&get(handle)?))
    })
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

    /// A task that waits until the returned gate opens.
    fn gated() -> (Task, Arc<(Mutex<bool>, Condvar)>) {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        let task: Task = Box::new(move || {
            let (m, c) = &*g;
            let mut open = m.lock().unwrap();
            while !*open {
                open = c.wait(open).unwrap();
            }
            Ok(())
        });
        (task, gate)
    }

    fn open(gate: &(Mutex<bool>, Condvar)) {
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
    }

    #[test]
    fn a_full_stream_makes_the_enqueuer_wait_for_room() {
        let h = create_with_depth(4).unwrap();
        let s = get(h).unwrap();
        assert_eq!(s.depth(), 4);
        let (task, gate) = gated();
        s.enqueue(task).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let r = ran.clone();
            s.enqueue(Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }))
            .unwrap();
        }
        // Four held (one running behind the gate): the fifth enqueue waits.
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = s.clone();
        let r = ran.clone();
        let waiter = thread::spawn(move || {
            let out = s2.enqueue(Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }));
            tx.send(out.is_ok()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "an enqueue on a full stream returned"
        );
        open(&gate);
        assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap());
        waiter.join().unwrap();
        s.synchronize().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 4);
        destroy(h).unwrap();
    }

    #[test]
    fn a_host_function_enqueueing_on_its_full_stream_fails_instead_of_deadlocking() {
        let h = create_with_depth(2).unwrap();
        let s = get(h).unwrap();
        let (task, gate) = gated();
        s.enqueue(task).unwrap();
        let outcome = Arc::new(Mutex::new(None));
        let (s2, o) = (s.clone(), outcome.clone());
        // Runs on the worker once the gate opens; the stream then holds itself and nothing
        // else, so fill it first from here.
        s.enqueue(Box::new(move || {
            let filler = s2.enqueue(Box::new(|| Ok(())));
            let over = s2.enqueue(Box::new(|| Ok(())));
            *o.lock().unwrap() = Some((filler.is_ok(), over.map_err(|e| e.status())));
            Ok(())
        }))
        .unwrap();
        open(&gate);
        s.synchronize().unwrap();
        let (filler, over) = outcome.lock().unwrap().take().unwrap();
        assert!(filler);
        assert_eq!(over, Err(ferrocx::abi::Status::OUT_OF_MEMORY));
        destroy(h).unwrap();
    }

    #[test]
    fn many_more_operations_than_the_depth_run_in_order() {
        let h = create_with_depth(3).unwrap();
        let s = get(h).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..2000 {
            let l = log.clone();
            s.enqueue(Box::new(move || {
                l.lock().unwrap().push(i);
                Ok(())
            }))
            .unwrap();
            assert!(s.enqueued.load(Ordering::SeqCst) - s.completed.load(Ordering::SeqCst) <= 3);
        }
        s.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), (0..2000).collect::<Vec<_>>());
        destroy(h).unwrap();
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

    #[test]
    fn a_wait_holds_later_work_until_another_stream_writes_the_word() {
        let (ha, hb) = (create().unwrap(), create().unwrap());
        let (a, b) = (get(ha).unwrap(), get(hb).unwrap());
        let word = Box::new(AtomicU32::new(0));
        let addr = word.as_ptr();
        let log = Arc::new(Mutex::new(Vec::new()));
        // Stream b: wait for the word to reach 3, then log.
        // SAFETY: `word` outlives both streams' work (synchronized below).
        unsafe { b.enqueue_wait_value32(addr, 3, WaitCondition::Geq) }.unwrap();
        let l = log.clone();
        b.enqueue(Box::new(move || {
            l.lock().unwrap().push("b");
            Ok(())
        }))
        .unwrap();
        // Stream a: log behind a gate, then write 3.
        let (task, gate) = gated();
        a.enqueue(task).unwrap();
        let l = log.clone();
        a.enqueue(Box::new(move || {
            l.lock().unwrap().push("a");
            Ok(())
        }))
        .unwrap();
        // SAFETY: as above.
        unsafe { a.enqueue_write_value32(addr, 3) }.unwrap();
        thread::sleep(Duration::from_millis(20));
        assert!(
            log.lock().unwrap().is_empty(),
            "b ran before the word was written"
        );
        assert!(!b.is_idle());
        open(&gate);
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), ["a", "b"]);
        assert_eq!(word.load(Ordering::SeqCst), 3);
        destroy(ha).unwrap();
        destroy(hb).unwrap();
    }

    #[test]
    fn geq_wraps_around_and_eq_needs_the_exact_value() {
        let h = create().unwrap();
        let s = get(h).unwrap();
        // A counter that wrapped past u32::MAX is at or past u32::MAX - 1: satisfied at once.
        let word = Box::new(AtomicU32::new(1));
        // SAFETY: `word` outlives the stream's work (synchronized below).
        unsafe { s.enqueue_wait_value32(word.as_ptr(), u32::MAX - 1, WaitCondition::Geq) }.unwrap();
        s.synchronize().unwrap();
        // EQ: 5 does not satisfy == 4 (nor does a value past it); 4 does.
        word.store(5, Ordering::SeqCst);
        // SAFETY: as above.
        unsafe { s.enqueue_wait_value32(word.as_ptr(), 4, WaitCondition::Eq) }.unwrap();
        thread::sleep(Duration::from_millis(20));
        assert!(!s.is_idle(), "EQ 4 was satisfied by 5");
        word.store(4, Ordering::SeqCst);
        s.synchronize().unwrap();
        // GEQ: u32::MAX - 1 is not at or past 2 (it is "before" it, with wrap-around).
        word.store(u32::MAX - 1, Ordering::SeqCst);
        // SAFETY: as above.
        unsafe { s.enqueue_wait_value32(word.as_ptr(), 2, WaitCondition::Geq) }.unwrap();
        thread::sleep(Duration::from_millis(20));
        assert!(!s.is_idle(), "GEQ 2 was satisfied by u32::MAX - 1");
        word.store(2, Ordering::SeqCst);
        s.synchronize().unwrap();
        destroy(h).unwrap();
    }

    #[test]
    fn an_inline_claim_holds_the_worker_off_and_synchronize_waits_for_it() {
        let h = create().unwrap();
        let s = get(h).unwrap();
        // Busy: no claim.
        let (task, gate) = gated();
        s.enqueue(task).unwrap();
        assert!(
            s.claim_inline().is_none(),
            "claimed a stream with work queued"
        );
        open(&gate);
        s.synchronize().unwrap();
        // Idle: claimed, once; work enqueued meanwhile waits for the claim's end.
        let claim = s.claim_inline().expect("an idle stream is claimed");
        assert!(s.claim_inline().is_none(), "two claims at once");
        assert!(!s.is_idle());
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        s.enqueue(Box::new(move || {
            l.lock().unwrap().push("queued");
            Ok(())
        }))
        .unwrap();
        thread::sleep(Duration::from_millis(50));
        assert!(
            log.lock().unwrap().is_empty(),
            "the worker ran work enqueued during a claim"
        );
        // A synchronize on another thread waits for the claim too.
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = s.clone();
        let t = thread::spawn(move || {
            s2.synchronize().unwrap();
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "synchronize returned during a claim"
        );
        log.lock().unwrap().push("inline");
        claim.finish(Ok(()));
        rx.recv_timeout(Duration::from_secs(30)).unwrap();
        t.join().unwrap();
        assert_eq!(*log.lock().unwrap(), ["inline", "queued"]);
        // A failure inline is the stream's sticky error; the claim is over either way.
        s.claim_inline()
            .unwrap()
            .finish(Err(Error::invalid_argument("inline failure")));
        assert_eq!(s.synchronize().unwrap_err().message(), "inline failure");
        drop(s.claim_inline().unwrap());
        assert!(
            s.synchronize().is_err(),
            "a claim dropped without an end fails"
        );
        assert!(s.is_idle());
        destroy(h).unwrap();
    }

    #[test]
    fn inline_claims_and_the_worker_never_overlap() {
        // Two threads enqueue, one of them also runs work itself whenever it can claim the
        // stream: no two pieces of work ever run at once, and each thread's work runs in the
        // order it issued it.
        let h = create().unwrap();
        let s = get(h).unwrap();
        let busy = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(Mutex::new(vec![Vec::new(), Vec::new()]));
        let (claimed, queued) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let work = {
            let (busy, overlaps, order) = (busy.clone(), overlaps.clone(), order.clone());
            move |who: usize, i: usize| {
                if busy.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                for _ in 0..50 {
                    std::hint::spin_loop();
                }
                order.lock().unwrap()[who].push(i);
                busy.store(false, Ordering::SeqCst);
            }
        };
        let threads: Vec<_> = (0..2)
            .map(|who| {
                let (s, work) = (s.clone(), work.clone());
                let (claimed, queued) = (claimed.clone(), queued.clone());
                thread::spawn(move || {
                    for i in 0..3000 {
                        if who == 0 {
                            if let Some(claim) = s.claim_inline() {
                                work(who, i);
                                claim.finish(Ok(()));
                                claimed.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                        }
                        let work = work.clone();
                        s.enqueue(Box::new(move || {
                            work(who, i);
                            Ok(())
                        }))
                        .unwrap();
                        queued.fetch_add(1, Ordering::Relaxed);
                        if i % 97 == 0 {
                            s.synchronize().unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        s.synchronize().unwrap();
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "work overlapped");
        let order = order.lock().unwrap();
        for (who, done) in order.iter().enumerate() {
            assert_eq!(*done, (0..3000).collect::<Vec<_>>(), "thread {who}'s order");
        }
        assert!(
            claimed.load(Ordering::Relaxed) > 0,
            "no claim ever succeeded"
        );
        destroy(h).unwrap();
    }

    #[test]
    fn destroying_a_stream_abandons_a_wait_never_satisfied() {
        let h = create().unwrap();
        let s = get(h).unwrap();
        let word = Box::new(AtomicU32::new(0));
        let ran = Arc::new(AtomicUsize::new(0));
        // SAFETY: `word` outlives the wait (it ends before `synchronize` below returns).
        unsafe { s.enqueue_wait_value32(word.as_ptr(), 1, WaitCondition::Eq) }.unwrap();
        let r = ran.clone();
        s.enqueue(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
        .unwrap();
        thread::sleep(Duration::from_millis(10));
        destroy(h).unwrap();
        let e = s.synchronize().unwrap_err();
        assert_eq!(e.status(), ferrocx::abi::Status::ABORTED);
        assert!(e.message().contains("destroyed"), "{}", e.message());
        // The work behind it still ran (as after any failed task), and the word is untouched.
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(word.load(Ordering::SeqCst), 0);
    }
}
