//! The watchdog's CUDA side: the events that track a communicator's outstanding operations
//! ([`Watch`]), and the one thread per process that polls them and aborts a communicator that
//! made no progress for its timeout or that NCCL reports broken.
//!
//! Cost on the calling thread, per enqueued operation: a capture check (`cuStreamIsCapturing`),
//! and one `cuEventRecord` of a pooled `CU_EVENT_DISABLE_TIMING` event inside one hold of the
//! communicator's tracker lock (which only the watchdog's poll shares, every few milliseconds;
//! on one stream a poll queries the newest event only, see [`Tracker::poll`]). Nothing is recorded while the stream is being
//! captured into a CUDA graph, so graphs stay free of the watchdog's events (operations replayed
//! from a graph are not watched). The watchdog thread runs with the thread-local capture mode,
//! so its queries never invalidate another thread's capture.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ferrocx_adaptor_cuda::shared::{self as cuda, Driver};
use ferrocx_plugin_sdk::prelude::*;

use crate::comm::NcclComm;
use crate::watchdog::{Label, Poll, Query, Tracker};
use crate::{conv, sys};

/// How often the communicators with outstanding operations are polled.
const POLL_BUSY: Duration = Duration::from_millis(5);
/// How often the others are (for NCCL's asynchronous errors).
const POLL_IDLE: Duration = Duration::from_millis(50);
/// Event queries per lock hold, so a long run of completed operations never holds up a caller.
const BUDGET: usize = 8;
/// Events created with each communicator, so the first operations find the pool stocked.
const PREALLOCATED: usize = 4;
/// How long an abort waits for calls still inside NCCL before aborting under them (only the
/// abort can release a call that NCCL itself blocks).
const ABORT_GRACE: Duration = Duration::from_secs(2);

/// A `CUevent`, as a plain number so the tracker can move between threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ev(usize);

impl Ev {
    fn raw(self) -> cuda::CUevent {
        self.0 as cuda::CUevent
    }
}

/// The events of one communicator: recorded by the calling threads, queried by the watchdog.
pub(crate) struct Watch {
    cuda: Driver,
    /// The communicator's CUDA context (as a number), made current to create, query and destroy
    /// its events.
    ctx: usize,
    timeout: Duration,
    seq: AtomicU64,
    tracker: Mutex<Tracker<Ev>>,
    /// Whether an event creation failure was reported (once per communicator).
    warned: AtomicBool,
}

impl Watch {
    /// Tracking for a communicator just created on the calling thread (whose current context is
    /// the communicator's), with `timeout` as its deadline.
    pub(crate) fn new(cuda: Driver, timeout: Duration) -> Self {
        let w = Watch {
            cuda,
            ctx: cuda.current_context() as usize,
            timeout,
            seq: AtomicU64::new(0),
            tracker: Mutex::new(Tracker::new(Vec::new())),
            warned: AtomicBool::new(false),
        };
        let events: Vec<Ev> = (0..PREALLOCATED).filter_map(|_| w.create()).collect();
        for e in events {
            let _ = w.lock().recycle(e);
        }
        w
    }

    fn lock(&self) -> MutexGuard<'_, Tracker<Ev>> {
        self.tracker.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ctx(&self) -> cuda::CUcontext {
        self.ctx as cuda::CUcontext
    }

    /// The deadline of the communicator.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The next operation's sequence number (1 for the first).
    #[inline]
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Number of operations whose completion has not been seen yet.
    pub(crate) fn outstanding(&self) -> usize {
        self.lock().outstanding()
    }

    fn create(&self) -> Option<Ev> {
        // SAFETY: the communicator's context, alive while its watch is; `event_create` leaves
        // the context stack as it found it.
        let created = unsafe {
            self.cuda.with_context(self.ctx(), || {
                self.cuda.event_create(cuda::EVENT_DISABLE_TIMING)
            })
        };
        match created {
            Ok(e) => Some(Ev(e as usize)),
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "nccl watchdog: {}; operations that find no free event are not watched",
                        e.message()
                    );
                }
                None
            }
        }
    }

    fn destroy(&self, events: Vec<Ev>) {
        if events.is_empty() {
            return;
        }
        // SAFETY: the communicator's context, alive while its watch is; destroying events
        // leaves the context stack as it found it.
        unsafe {
            self.cuda.with_context(self.ctx(), || {
                for e in events {
                    // SAFETY: an event of this watch, handed over by the tracker (or never given
                    // to it), so destroyed once, with its context current; one still pending is
                    // released when it completes.
                    let _ = self.cuda.event_destroy(e.raw());
                }
            })
        };
    }

    /// Records the completion of the operation(s) `label` just enqueued on `stream` (a
    /// `CUstream`), unless the stream is being captured into a graph.
    #[inline]
    pub(crate) fn record(&self, stream: Stream, label: Label) {
        let s: cuda::CUstream = stream.0.cast();
        // SAFETY: a stream of the communicator's device (the ABI's contract).
        if !matches!(unsafe { self.cuda.stream_is_capturing(s) }, Ok(false)) {
            // Captured into a graph (or capture in progress elsewhere on the legacy stream):
            // an event here would become part of the graph.
            return;
        }
        let mut t = self.lock();
        if t.is_closed() {
            return;
        }
        let ev = match t.take_free() {
            Some(ev) => ev,
            None => {
                // The pool is empty: create one outside the lock (rare once the pool is stocked).
                drop(t);
                let Some(ev) = self.create() else {
                    return;
                };
                t = self.lock();
                if t.is_closed() {
                    drop(t);
                    self.destroy(vec![ev]);
                    return;
                }
                ev
            }
        };
        // Recorded under the lock, so the event goes from the pool to the queue in one hold;
        // the only other holder is the watchdog's poll, every few milliseconds.
        // SAFETY: an event of the communicator's context owned by this call (taken from the
        // pool, not yet in the queue); the stream as above.
        let kept = match unsafe { self.cuda.event_record(ev.raw(), s) } {
            Ok(()) => t.push(ev, label, s as usize),
            Err(e) => {
                tracing::debug!("nccl watchdog: {}; {label} is not watched", e.message());
                t.recycle(ev)
            }
        };
        if let Err(ev) = kept {
            // Not reached: the tracker was open when the lock was taken, and only closes under it.
            drop(t);
            self.destroy(vec![ev]);
        }
    }

    /// Polls the oldest outstanding operations (see [`Tracker::poll`]); on the watchdog thread,
    /// with the communicator's context current.
    fn poll(&self, now: Instant) -> Poll {
        loop {
            let p = self.lock().poll(now, self.timeout, BUDGET, |e| {
                // SAFETY: an event of this tracker, not destroyed while its lock is held; the
                // watchdog thread made the communicator's context current.
                match unsafe { self.cuda.event_query(e.raw()) } {
                    Ok(true) => Query::Done,
                    Ok(false) => Query::Pending,
                    Err(e) => Query::Failed(e.message().to_string()),
                }
            });
            if p != Poll::More {
                return p;
            }
        }
    }

    /// Stops tracking and destroys every event (outstanding ones are released by the driver
    /// when they complete).
    pub(crate) fn close(&self) {
        let events = self.lock().close();
        self.destroy(events);
    }
}

/// The communicators being watched, and the thread that watches them.
struct Registry {
    comms: Mutex<Vec<Arc<NcclComm>>>,
    wake: Condvar,
    started: OnceLock<std::result::Result<(), String>>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        comms: Mutex::new(Vec::new()),
        wake: Condvar::new(),
        started: OnceLock::new(),
    })
}

/// The CUDA driver for a new watched communicator, with the watchdog thread running: the
/// reason when either is not available (the communicator then runs unwatched).
pub(crate) fn prepare() -> Result<Driver> {
    let cuda = Driver::get()?;
    registry()
        .started
        .get_or_init(|| {
            std::thread::Builder::new()
                .name("ferrocx-nccl-watchdog".into())
                .spawn(run)
                .map(|_| ())
                .map_err(|e| format!("cannot start the watchdog thread: {e}"))
        })
        .clone()
        .map_err(Error::internal)?;
    Ok(cuda)
}

/// Watches `comm` (created with a [`Watch`], after [`prepare`] succeeded).
pub(crate) fn watch(comm: Arc<NcclComm>) {
    let r = registry();
    r.comms.lock().unwrap_or_else(|p| p.into_inner()).push(comm);
    r.wake.notify_one();
}

/// What a round found for one communicator.
enum Seen {
    /// Operations are outstanding.
    Busy,
    /// Nothing outstanding.
    Idle,
    /// Released, aborted or being aborted: stop watching it.
    Gone,
}

fn run() {
    if let Ok(cuda) = Driver::get() {
        let _ = cuda.relax_capture_mode();
    }
    let r = registry();
    loop {
        let comms: Vec<Arc<NcclComm>> = {
            let mut g = r.comms.lock().unwrap_or_else(|p| p.into_inner());
            while g.is_empty() {
                g = r.wake.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            g.clone()
        };
        let now = Instant::now();
        let mut busy = false;
        let mut gone = Vec::new();
        for c in &comms {
            match inspect(c, now) {
                Seen::Busy => busy = true,
                Seen::Idle => {}
                Seen::Gone => gone.push(Arc::as_ptr(c)),
            }
        }
        if !gone.is_empty() {
            r.comms
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|c| !gone.contains(&Arc::as_ptr(c)));
        }
        drop(comms);
        std::thread::sleep(if busy { POLL_BUSY } else { POLL_IDLE });
    }
}

/// One round for one communicator: retire completed operations, then judge the oldest one left
/// and NCCL's asynchronous error.
fn inspect(c: &Arc<NcclComm>, now: Instant) -> Seen {
    let Some(w) = c.watch.as_ref() else {
        return Seen::Gone;
    };
    // SAFETY: the communicator's context, alive while its watch is (checked just above).
    let _ = unsafe { w.cuda.set_context(w.ctx()) };
    let poll = w.poll(now);
    if poll == Poll::Closed {
        return Seen::Gone;
    }
    // Under the phase lock, so the user cannot destroy the handle meanwhile.
    let Some(async_error) = c.gate.while_live(|| {
        let mut rc = sys::NCCL_SUCCESS;
        // SAFETY: a live communicator (phase held) and a valid out-pointer; NCCL allows this
        // query from any thread while others use the communicator.
        let call = unsafe { (c.api.ncclCommGetAsyncError)(c.raw, &mut rc) };
        let rc = if call == sys::NCCL_SUCCESS { rc } else { call };
        if rc == sys::NCCL_SUCCESS || rc == sys::NCCL_IN_PROGRESS {
            return None;
        }
        let what = c
            .api
            .check("NCCL reported an asynchronous error", rc, c.raw)
            .err()
            .map(|e| e.message().to_string())
            .unwrap_or_default();
        Some((rc, what))
    }) else {
        return Seen::Gone;
    };
    let outstanding = match &poll {
        Poll::Waiting { label, .. } | Poll::Stalled { label, .. } | Poll::Failed { label, .. } => {
            Some(*label)
        }
        _ => None,
    };
    const CONSEQUENCE: &str = "communicator aborted; a peer failed or never joined";
    let who = || format!("rank {} of {}", c.rank, c.nranks);
    if let Some(inside) = c
        .gate
        .inside_for(crate::watchdog::coarse_now())
        .filter(|d| *d > w.timeout())
    {
        // A call blocked on the host inside NCCL (e.g. connecting to a peer that never joined):
        // the abort is what releases it, so it is not waited for.
        fail_now(
            c,
            Error::new(
                Status::TIMEOUT,
                format!(
                    "{}: a call has been inside NCCL for {:.1} s (timeout {} ms), waiting for a peer: {CONSEQUENCE}",
                    who(),
                    inside.as_secs_f64(),
                    w.timeout().as_millis()
                ),
            ),
        );
        return Seen::Gone;
    }
    if let Some((rc, what)) = async_error {
        let during = outstanding.map_or_else(String::new, |l| format!(" during {l}"));
        fail(
            c,
            Error::new(
                conv::status(rc),
                format!("{}: {what}{during}: {CONSEQUENCE}", who()),
            ),
        );
        return Seen::Gone;
    }
    match poll {
        Poll::Stalled { label, waited } => {
            fail(
                c,
                Error::new(
                    Status::TIMEOUT,
                    format!(
                        "{}: {label} made no progress for {:.1} s (timeout {} ms): {CONSEQUENCE}",
                        who(),
                        waited.as_secs_f64(),
                        w.timeout().as_millis()
                    ),
                ),
            );
            Seen::Gone
        }
        Poll::Failed { label, what } => {
            fail(
                c,
                Error::vendor(format!(
                    "{}: {what} waiting for {label}: {CONSEQUENCE}",
                    who()
                )),
            );
            Seen::Gone
        }
        Poll::Waiting { .. } | Poll::More => Seen::Busy,
        Poll::Idle => Seen::Idle,
        Poll::Closed => Seen::Gone,
    }
}

/// Marks `c` broken with `error` and aborts it on a thread of its own (an abort can take a
/// while; the other communicators stay watched meanwhile), after calls inside NCCL left it.
fn fail(c: &Arc<NcclComm>, error: Error) {
    fail_with(c, error, true);
}

/// As [`fail`], without waiting for calls inside NCCL: they are what hangs.
fn fail_now(c: &Arc<NcclComm>, error: Error) {
    fail_with(c, error, false);
}

fn fail_with(c: &Arc<NcclComm>, error: Error, drain: bool) {
    if !c.gate.fail(error.clone()) {
        return;
    }
    tracing::error!("nccl watchdog: {}", error.message());
    let comm = c.clone();
    let spawned = std::thread::Builder::new()
        .name("ferrocx-nccl-abort".into())
        .spawn(move || abort(&comm, drain));
    if spawned.is_err() {
        abort(c, drain);
    }
}

/// Aborts a communicator the watchdog marked broken: waits (briefly) for calls still inside
/// NCCL (`drain`), then `ncclCommAbort` (its kernels and host waits see the abort flag and
/// exit, so streams drain and blocked calls return).
fn abort(c: &NcclComm, drain: bool) {
    if let Some(w) = c.watch.as_ref() {
        let _ = w.cuda.relax_capture_mode();
        // SAFETY: the communicator's context, alive until its abort below.
        let _ = unsafe { w.cuda.set_context(w.ctx()) };
    }
    if drain && !c.gate.drain(ABORT_GRACE, Duration::from_millis(1)) {
        tracing::warn!(
            rank = c.rank,
            "nccl watchdog: a call is still inside NCCL after {} s; aborting under it",
            ABORT_GRACE.as_secs()
        );
    }
    // SAFETY: the gate gave this thread the teardown (phase `Aborting`): the user's destroy only
    // releases the handle now, and no new call reaches NCCL.
    let rc = unsafe { (c.api.ncclCommAbort)(c.raw) };
    if let Err(e) = c.api.check("ncclCommAbort", rc, std::ptr::null_mut()) {
        tracing::warn!(rank = c.rank, "nccl watchdog: {e}");
    }
    if let Some(w) = c.watch.as_ref() {
        w.close();
    }
    c.gate.aborted();
    tracing::debug!(rank = c.rank, "nccl watchdog: communicator aborted");
}
