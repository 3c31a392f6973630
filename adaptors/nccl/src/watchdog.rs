//! The watchdog's bookkeeping, free of CUDA so that it is tested with fake events and clocks:
//! which operations of a communicator are outstanding and since when the oldest one has made no
//! progress ([`Tracker`]), who may still touch NCCL's handle ([`Gate`]), and the settings.
//!
//! How it works (the CUDA side is in `monitor`): after each operation is enqueued (or at the end
//! of a group) an event is recorded on its stream; one thread per process queries the oldest
//! outstanding event of each communicator every few milliseconds. An operation's clock starts
//! when it becomes the oldest outstanding one (first seen so by the watchdog), not when it was
//! enqueued, so operations queued behind long ones are not timed out early. When the oldest has
//! made no progress for the communicator's timeout, or NCCL reports an asynchronous error, the
//! communicator is marked broken (every later call fails with that error) and aborted.
//!
//! A call can also hang on the host, inside NCCL: the first collective of a communicator sets up
//! its connections (NCCL connects at run time), and waits there for a peer that never joined.
//! The [`Gate`] remembers when the calls inside NCCL began; one inside for longer than the
//! timeout breaks the communicator the same way, and the abort releases the call (NCCL's host
//! waits watch its abort flag).

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ferrocx_plugin_sdk::prelude::*;

/// The adaptor option (`[cluster.options.nccl]`) that turns the watchdog on or off.
pub const WATCHDOG_OPTION: &str = "watchdog";
/// The environment variable that turns the watchdog off (`0`) whatever the configuration says.
pub const WATCHDOG_ENV: &str = "FERROCX_NCCL_WATCHDOG";

/// Whether the watchdog runs, from the `watchdog` option (`"on"`, the default, or `"off"`) and
/// [`WATCHDOG_ENV`] (`0`/`off`/`false` turns it off; `1`/`on`/`true` leaves the option's choice).
pub(crate) fn enabled(option: Option<&str>, env: Option<&str>) -> Result<bool> {
    let on = match option.map(str::trim) {
        None | Some("on") => true,
        Some("off") => false,
        Some(other) => {
            return Err(Error::invalid_argument(format!(
                "option `{WATCHDOG_OPTION}` = {other:?}: expected \"on\" or \"off\""
            )))
        }
    };
    match env.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("1") | Some("on") | Some("true") => Ok(on),
        Some("0") | Some("off") | Some("false") => Ok(false),
        Some(other) => Err(Error::invalid_argument(format!(
            "environment variable {WATCHDOG_ENV} = {other:?}: expected 0 (off) or 1"
        ))),
    }
}

/// The deadline for a communicator created with `timeout_ms` (0: the core's default).
pub(crate) fn timeout(timeout_ms: u64) -> Duration {
    Duration::from_millis(if timeout_ms == 0 {
        ferrocx::config::DEFAULT_TIMEOUT_MS
    } else {
        timeout_ms
    })
}

/// What an outstanding operation is, for the error: its name and its sequence number on the
/// communicator (1 for the first operation; the same on every rank, since every rank issues the
/// same operations in the same order). A group covers several operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Label {
    /// The (first) operation's name.
    pub op: &'static str,
    /// Sequence number of the first operation.
    pub first: u64,
    /// Sequence number of the last operation.
    pub last: u64,
    /// Number of operations.
    pub count: u64,
}

impl Label {
    /// One operation.
    pub(crate) fn one(op: &'static str, seq: u64) -> Self {
        Label {
            op,
            first: seq,
            last: seq,
            count: 1,
        }
    }

    /// This label extended by a later operation of the same group.
    pub(crate) fn and(self, later: Label) -> Self {
        Label {
            op: self.op,
            first: self.first.min(later.first),
            last: self.last.max(later.last),
            count: self.count + later.count,
        }
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 1 {
            write!(f, "{} (op #{})", self.op, self.first)
        } else {
            write!(
                f,
                "a group of {} ops from {} (ops #{} to #{})",
                self.count, self.op, self.first, self.last
            )
        }
    }
}

/// What the query of one event says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Query {
    /// Completed.
    Done,
    /// Not yet.
    Pending,
    /// The query itself failed (the words of the failure).
    Failed(String),
}

/// The outcome of one [`Tracker::poll`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Poll {
    /// Nothing is outstanding.
    Idle,
    /// The query budget ran out while operations were completing: poll again.
    More,
    /// The oldest operation is outstanding, for less than the timeout so far.
    Waiting { label: Label, waited: Duration },
    /// The oldest operation has made no progress for the timeout or longer.
    Stalled { label: Label, waited: Duration },
    /// Querying the oldest operation's event failed.
    Failed { label: Label, what: String },
    /// The tracker was closed (the communicator is gone).
    Closed,
}

/// A communicator's outstanding operations, oldest first, each with the event recorded after it
/// and its stream, and the pool of events that are free for reuse. `E` is the event handle
/// (`CUevent` in use, a number in tests); streams are plain numbers (`CUstream` values).
#[derive(Debug)]
pub(crate) struct Tracker<E> {
    queue: VecDeque<(E, Label)>,
    /// The stream of the queue's operations while they all share one (`None` once operations
    /// of another stream joined, until the queue is empty again).
    one_stream: Option<usize>,
    /// When the current oldest operation was first seen as the oldest.
    head_since: Option<Instant>,
    free: Vec<E>,
    closed: bool,
}

impl<E: Copy> Tracker<E> {
    /// An empty tracker whose pool holds `free`.
    pub(crate) fn new(free: Vec<E>) -> Self {
        Tracker {
            queue: VecDeque::new(),
            one_stream: None,
            head_since: None,
            free,
            closed: false,
        }
    }

    /// `true` once [`Tracker::close`] ran.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// A free event from the pool, if any.
    pub(crate) fn take_free(&mut self) -> Option<E> {
        self.free.pop()
    }

    /// Gives an event back to the pool; after [`Tracker::close`] it comes back as `Err`, for the
    /// caller to destroy.
    pub(crate) fn recycle(&mut self, event: E) -> std::result::Result<(), E> {
        if self.closed {
            return Err(event);
        }
        self.free.push(event);
        Ok(())
    }

    /// Appends an operation whose event was just recorded on `stream`; after [`Tracker::close`]
    /// the event comes back as `Err`, for the caller to destroy.
    pub(crate) fn push(
        &mut self,
        event: E,
        label: Label,
        stream: usize,
    ) -> std::result::Result<(), E> {
        if self.closed {
            return Err(event);
        }
        if self.queue.is_empty() {
            self.one_stream = Some(stream);
        } else if self.one_stream != Some(stream) {
            self.one_stream = None;
        }
        self.queue.push_back((event, label));
        Ok(())
    }

    /// Number of outstanding operations.
    pub(crate) fn outstanding(&self) -> usize {
        self.queue.len()
    }

    /// Closes the tracker and hands over every event it holds, outstanding and free.
    pub(crate) fn close(&mut self) -> Vec<E> {
        self.closed = true;
        self.head_since = None;
        let mut all: Vec<E> = self.queue.drain(..).map(|(e, _)| e).collect();
        all.append(&mut self.free);
        all
    }

    /// Retires completed operations from the front (at most `budget` queries) and judges the
    /// oldest one left at time `now`: stalled once it has been the oldest for `timeout`.
    pub(crate) fn poll(
        &mut self,
        now: Instant,
        timeout: Duration,
        budget: usize,
        mut query: impl FnMut(E) -> Query,
    ) -> Poll {
        if self.closed {
            return Poll::Closed;
        }
        // On one stream, operations complete in order: the newest one's event retires them all
        // with one query (a busy communicator has many complete ones between two polls, and
        // every query takes the driver's locks that the callers' launches take too).
        if self.queue.len() > 1 && self.one_stream.is_some() {
            if let Some(&(event, label)) = self.queue.back() {
                match query(event) {
                    Query::Done => {
                        self.free.extend(self.queue.drain(..).map(|(e, _)| e));
                        self.head_since = None;
                        return Poll::Idle;
                    }
                    Query::Pending => {}
                    Query::Failed(what) => return Poll::Failed { label, what },
                }
            }
        }
        for _ in 0..budget {
            let Some(&(event, label)) = self.queue.front() else {
                self.head_since = None;
                return Poll::Idle;
            };
            match query(event) {
                Query::Done => {
                    self.queue.pop_front();
                    self.free.push(event);
                    // The next one (if any) becomes the oldest now.
                    self.head_since = Some(now);
                }
                Query::Pending => {
                    let since = *self.head_since.get_or_insert(now);
                    let waited = now.saturating_duration_since(since);
                    return if waited >= timeout {
                        Poll::Stalled { label, waited }
                    } else {
                        Poll::Waiting { label, waited }
                    };
                }
                Query::Failed(what) => return Poll::Failed { label, what },
            }
        }
        if self.queue.is_empty() {
            self.head_since = None;
            Poll::Idle
        } else {
            Poll::More
        }
    }
}

/// [`Gate`]'s `entered_at` when no call is inside NCCL.
const NOT_INSIDE: u64 = u64::MAX;

/// The clock of [`Gate`]: nanoseconds of the monotonic clock at its coarse resolution (a few
/// milliseconds, ample for deadlines of seconds). Reading it costs a few nanoseconds, where a
/// precise read can cost far more on virtual machines whose clock source is not the TSC; every
/// call on a communicator reads it once.
pub(crate) fn coarse_now() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer; CLOCK_MONOTONIC_COARSE exists on every Linux since 2.6.32.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0 {
            return ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        }
    }
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Who owns a communicator's NCCL handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// In use.
    Live,
    /// The watchdog found it broken and is aborting it.
    Aborting,
    /// The watchdog aborted it; only the user's handle is left to release.
    Aborted,
    /// The user destroyed or aborted it.
    Released,
}

/// The gate every call on a communicator passes: it counts the calls inside NCCL, refuses new
/// ones once the communicator is broken (with the error that broke it), and decides who tears
/// the NCCL handle down (the watchdog's abort or the user's destroy, never both).
#[derive(Debug)]
pub(crate) struct Gate {
    in_flight: AtomicUsize,
    /// When the calls now inside NCCL began ([`coarse_now`]), [`NOT_INSIDE`] when
    /// none is.
    entered_at: AtomicU64,
    broken: AtomicBool,
    failure: OnceLock<Error>,
    phase: Mutex<Phase>,
    /// Signalled when the watchdog's abort finished.
    settled: Condvar,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            in_flight: AtomicUsize::new(0),
            entered_at: AtomicU64::new(NOT_INSIDE),
            broken: AtomicBool::new(false),
            failure: OnceLock::new(),
            phase: Mutex::new(Phase::Live),
            settled: Condvar::new(),
        }
    }
}

impl Gate {
    fn phase_lock(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets a call in, or refuses it with the error that broke the communicator. Every `Ok` is
    /// paired with one [`Gate::exit`].
    #[inline]
    pub(crate) fn enter(&self) -> Result<()> {
        // Dekker with `fail` + `drain`: either this call sees `broken`, or the aborter sees the
        // call in flight and waits for it to leave.
        if self.in_flight.fetch_add(1, Ordering::SeqCst) == 0 {
            self.entered_at.store(coarse_now(), Ordering::SeqCst);
        }
        if self.broken.load(Ordering::SeqCst) {
            self.exit();
            return Err(self.broken_error());
        }
        Ok(())
    }

    /// The end of a call [`Gate::enter`] let in.
    #[inline]
    pub(crate) fn exit(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            // A call entering between the two steps finds `NOT_INSIDE` restored and goes
            // unwatched on the host (its events are still watched): a miss, never a false alarm.
            self.entered_at.store(NOT_INSIDE, Ordering::SeqCst);
        }
    }

    /// How long calls have been inside NCCL without a pause, at `now`; `None` when none is.
    /// Overlapping calls from several threads count as one spell, from the first.
    /// `now` is a [`coarse_now`] reading.
    pub(crate) fn inside_for(&self, now: u64) -> Option<Duration> {
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            return None;
        }
        match self.entered_at.load(Ordering::SeqCst) {
            NOT_INSIDE => None,
            t => Some(Duration::from_nanos(now.saturating_sub(t))),
        }
    }

    fn broken_error(&self) -> Error {
        self.failure.get().cloned().unwrap_or_else(|| {
            Error::new(
                Status::ABORTED,
                "the communicator was aborted by the watchdog",
            )
        })
    }

    /// The error that broke the communicator, if one did.
    pub(crate) fn failure(&self) -> Option<&Error> {
        self.failure.get()
    }

    /// Marks a live communicator broken with `error` and hands its teardown to the caller
    /// (`Live` → `Aborting`); `false` when it is no longer live.
    pub(crate) fn fail(&self, error: Error) -> bool {
        let mut phase = self.phase_lock();
        if *phase != Phase::Live {
            return false;
        }
        let _ = self.failure.set(error);
        self.broken.store(true, Ordering::SeqCst);
        *phase = Phase::Aborting;
        true
    }

    /// The user's destroy or abort: `Live` → `Released` (the caller tears NCCL's handle down);
    /// returns the phase it found.
    pub(crate) fn release(&self) -> Phase {
        let mut phase = self.phase_lock();
        let found = *phase;
        if found == Phase::Live {
            *phase = Phase::Released;
        }
        found
    }

    /// The watchdog's abort finished.
    pub(crate) fn aborted(&self) {
        *self.phase_lock() = Phase::Aborted;
        self.settled.notify_all();
    }

    /// Waits, at most `wait`, until an abort the watchdog started has finished; `true` when none
    /// is running.
    pub(crate) fn wait_aborted(&self, wait: Duration) -> bool {
        let phase = self.phase_lock();
        let (phase, _) = self
            .settled
            .wait_timeout_while(phase, wait, |p| *p == Phase::Aborting)
            .unwrap_or_else(|p| p.into_inner());
        *phase != Phase::Aborting
    }

    /// Runs `f` while the communicator is live, with the phase held so that no teardown starts
    /// meanwhile; `None` when it is not live.
    pub(crate) fn while_live<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        let phase = self.phase_lock();
        (*phase == Phase::Live).then(f)
    }

    /// Waits, after [`Gate::fail`], until no call is inside NCCL, at most `grace`, polling every
    /// `step`; `true` when none is.
    pub(crate) fn drain(&self, grace: Duration, step: Duration) -> bool {
        let until = Instant::now() + grace;
        loop {
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A tracker of events 1..=n, all outstanding, labelled all_reduce #1..#n, on two streams
    /// taken in turn (so completion order is not implied: the oldest is queried first).
    fn outstanding(n: u32) -> Tracker<u32> {
        let mut t = Tracker::new(Vec::new());
        for e in 1..=n {
            t.push(e, Label::one("all_reduce", e as u64), 1 + e as usize % 2)
                .unwrap();
        }
        t
    }

    /// As [`outstanding`], on one stream.
    fn on_one_stream(n: u32) -> Tracker<u32> {
        let mut t = Tracker::new(Vec::new());
        for e in 1..=n {
            t.push(e, Label::one("all_reduce", e as u64), 7).unwrap();
        }
        t
    }

    /// A query that reports the events in `done` as completed.
    fn done_if(done: &[u32]) -> impl FnMut(u32) -> Query + '_ {
        move |e| {
            if done.contains(&e) {
                Query::Done
            } else {
                Query::Pending
            }
        }
    }

    #[test]
    fn options_and_environment() {
        assert!(enabled(None, None).unwrap());
        assert!(enabled(Some("on"), None).unwrap());
        assert!(!enabled(Some("off"), None).unwrap());
        assert!(
            !enabled(None, Some("0")).unwrap(),
            "the variable turns it off"
        );
        assert!(!enabled(Some("on"), Some("off")).unwrap());
        assert!(enabled(None, Some("1")).unwrap());
        assert!(
            !enabled(Some("off"), Some("1")).unwrap(),
            "1 keeps the file's off"
        );
        assert!(enabled(Some("on"), Some("")).unwrap());
        let e = enabled(Some("maybe"), None).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_ARGUMENT);
        assert!(e.message().contains("`watchdog`"), "{}", e.message());
        let e = enabled(None, Some("2")).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_ARGUMENT);
        assert!(e.message().contains(WATCHDOG_ENV), "{}", e.message());
    }

    #[test]
    fn zero_timeout_is_the_cores_default() {
        assert_eq!(timeout(0), Duration::from_millis(30_000));
        assert_eq!(
            timeout(0).as_millis() as u64,
            ferrocx::config::DEFAULT_TIMEOUT_MS
        );
        assert_eq!(timeout(2_500), ms(2_500));
    }

    #[test]
    fn labels() {
        assert_eq!(
            Label::one("all_reduce", 7).to_string(),
            "all_reduce (op #7)"
        );
        let g = Label::one("send", 5)
            .and(Label::one("recv", 6))
            .and(Label::one("send", 9));
        assert_eq!(g.count, 3);
        assert_eq!(g.to_string(), "a group of 3 ops from send (ops #5 to #9)");
    }

    #[test]
    fn empty_tracker_is_idle() {
        let mut t: Tracker<u32> = Tracker::new(vec![7]);
        let now = Instant::now();
        assert_eq!(t.poll(now, T, 8, |_| unreachable!()), Poll::Idle);
        assert_eq!(t.take_free(), Some(7));
        assert_eq!(t.take_free(), None);
    }

    #[test]
    fn a_stuck_oldest_op_stalls_after_the_timeout_from_when_it_was_first_seen() {
        let mut t = outstanding(2);
        let t0 = Instant::now();
        let head = Label::one("all_reduce", 1);
        assert_eq!(
            t.poll(t0, T, 8, done_if(&[])),
            Poll::Waiting {
                label: head,
                waited: Duration::ZERO
            }
        );
        assert_eq!(
            t.poll(t0 + T - ms(1), T, 8, done_if(&[])),
            Poll::Waiting {
                label: head,
                waited: T - ms(1)
            }
        );
        assert_eq!(
            t.poll(t0 + T, T, 8, done_if(&[])),
            Poll::Stalled {
                label: head,
                waited: T
            }
        );
        assert_eq!(t.outstanding(), 2);
    }

    #[test]
    fn ops_queued_behind_long_work_get_their_own_full_timeout() {
        // Op 1 runs for 0.9 T; ops 2 and 3 were enqueued at t0 behind it. Op 2's clock starts
        // when op 1 completes, so it is not stalled at t0 + 1.5 T, only at t0 + 1.9 T.
        let mut t = outstanding(3);
        let t0 = Instant::now();
        t.poll(t0, T, 8, done_if(&[]));
        let t1 = t0 + T * 9 / 10;
        assert_eq!(
            t.poll(t1, T, 8, done_if(&[1])),
            Poll::Waiting {
                label: Label::one("all_reduce", 2),
                waited: Duration::ZERO
            }
        );
        assert_eq!(t.outstanding(), 2);
        assert_eq!(
            t.poll(t0 + T * 3 / 2, T, 8, done_if(&[1])),
            Poll::Waiting {
                label: Label::one("all_reduce", 2),
                waited: T * 3 / 5
            }
        );
        assert_eq!(
            t.poll(t1 + T, T, 8, done_if(&[1])),
            Poll::Stalled {
                label: Label::one("all_reduce", 2),
                waited: T
            }
        );
    }

    #[test]
    fn the_clock_starts_when_the_watchdog_first_sees_the_op() {
        // Enqueued long before the first poll (a watchdog that slept): no instant timeout.
        let mut t = outstanding(1);
        let first_look = Instant::now() + 3 * T;
        assert!(matches!(
            t.poll(first_look, T, 8, done_if(&[])),
            Poll::Waiting { waited, .. } if waited == Duration::ZERO
        ));
        assert!(matches!(
            t.poll(first_look + T, T, 8, done_if(&[])),
            Poll::Stalled { .. }
        ));
    }

    #[test]
    fn a_new_op_after_an_idle_spell_starts_a_fresh_clock() {
        let mut t = outstanding(1);
        let t0 = Instant::now();
        assert_eq!(t.poll(t0, T, 8, done_if(&[1])), Poll::Idle);
        // Pooled: the completed event is reused for the next operation.
        let e = t.take_free().expect("event back in the pool");
        assert_eq!(e, 1);
        t.push(e, Label::one("broadcast", 2), 1).unwrap();
        let later = t0 + 5 * T;
        assert!(matches!(
            t.poll(later, T, 8, done_if(&[])),
            Poll::Waiting { label, waited } if label.op == "broadcast" && waited == Duration::ZERO
        ));
    }

    #[test]
    fn the_query_budget_bounds_each_poll() {
        let mut t = outstanding(10);
        let now = Instant::now();
        let all: Vec<u32> = (1..=10).collect();
        let mut queries = 0;
        let r = t.poll(now, T, 4, |e| {
            queries += 1;
            done_if(&all)(e)
        });
        assert_eq!(r, Poll::More);
        assert_eq!(queries, 4);
        assert_eq!(t.outstanding(), 6);
        assert_eq!(t.poll(now, T, 4, done_if(&all)), Poll::More);
        assert_eq!(t.poll(now, T, 4, done_if(&all)), Poll::Idle);
        assert_eq!(t.outstanding(), 0);
        // Every event is back in the pool, the last completed on top.
        let mut pool: Vec<u32> = std::iter::from_fn(|| t.take_free()).collect();
        assert_eq!(pool[0], 10);
        pool.sort_unstable();
        assert_eq!(pool, all);
    }

    #[test]
    fn on_one_stream_the_newest_completion_retires_every_op_with_one_query() {
        let mut t = on_one_stream(50);
        let mut asked = Vec::new();
        let all: Vec<u32> = (1..=50).collect();
        let r = t.poll(Instant::now(), T, 8, |e| {
            asked.push(e);
            done_if(&all)(e)
        });
        assert_eq!(r, Poll::Idle);
        assert_eq!(asked, [50], "one query, of the newest");
        assert_eq!(t.outstanding(), 0);
        let mut pool: Vec<u32> = std::iter::from_fn(|| t.take_free()).collect();
        pool.sort_unstable();
        assert_eq!(pool, all, "every event back in the pool");
    }

    #[test]
    fn on_one_stream_a_pending_newest_falls_back_to_the_oldest_first() {
        let mut t = on_one_stream(3);
        let mut asked = Vec::new();
        let r = t.poll(Instant::now(), T, 8, |e| {
            asked.push(e);
            done_if(&[1])(e)
        });
        assert_eq!(asked, [3, 1, 2], "the newest, then from the oldest");
        assert!(matches!(r, Poll::Waiting { label, .. } if label.first == 2));
        assert_eq!(t.outstanding(), 2);
        // A stuck op is still found, and its clock runs from when it became the oldest.
        let later = Instant::now() + T;
        assert!(matches!(
            t.poll(later, T, 8, done_if(&[])),
            Poll::Stalled { label, .. } if label.first == 2
        ));
    }

    #[test]
    fn a_second_stream_turns_the_shortcut_off_until_the_queue_empties() {
        let mut t = on_one_stream(2);
        t.push(3, Label::one("all_reduce", 3), 8).unwrap();
        t.push(4, Label::one("all_reduce", 4), 7).unwrap();
        let mut asked = Vec::new();
        t.poll(Instant::now(), T, 8, |e| {
            asked.push(e);
            Query::Pending
        });
        assert_eq!(
            asked,
            [1],
            "the oldest only: stream order says nothing across streams"
        );
        assert_eq!(
            t.poll(Instant::now(), T, 8, done_if(&[1, 2, 3, 4])),
            Poll::Idle
        );
        for e in 5..=6 {
            t.push(e, Label::one("all_reduce", e as u64), 8).unwrap();
        }
        let mut asked = Vec::new();
        t.poll(Instant::now(), T, 8, |e| {
            asked.push(e);
            Query::Pending
        });
        assert_eq!(asked, [6, 5], "one stream again once the queue emptied");
    }

    #[test]
    fn only_the_oldest_op_is_queried() {
        let mut t = outstanding(3);
        let mut asked = Vec::new();
        t.poll(Instant::now(), T, 8, |e| {
            asked.push(e);
            Query::Pending
        });
        assert_eq!(asked, [1]);
    }

    #[test]
    fn a_failed_query_names_the_op() {
        let mut t = outstanding(2);
        let r = t.poll(Instant::now(), T, 8, |e| {
            if e == 1 {
                Query::Done
            } else {
                Query::Failed("cuEventQuery failed".into())
            }
        });
        assert_eq!(
            r,
            Poll::Failed {
                label: Label::one("all_reduce", 2),
                what: "cuEventQuery failed".into()
            }
        );
    }

    #[test]
    fn closing_hands_over_every_event_and_refuses_new_ones() {
        let mut t = outstanding(2);
        t.recycle(9).unwrap();
        let mut all = t.close();
        all.sort_unstable();
        assert_eq!(all, [1, 2, 9]);
        assert!(t.is_closed());
        assert_eq!(t.push(3, Label::one("send", 3), 1), Err(3));
        assert_eq!(t.recycle(4), Err(4));
        assert_eq!(t.take_free(), None);
        assert_eq!(
            t.poll(Instant::now(), T, 8, |_| unreachable!()),
            Poll::Closed
        );
    }

    #[test]
    fn a_broken_gate_refuses_calls_with_the_error() {
        let g = Gate::default();
        g.enter().unwrap();
        g.exit();
        let e = Error::new(
            Status::TIMEOUT,
            "rank 1: all_reduce (op #1) made no progress",
        );
        assert!(g.fail(e.clone()));
        assert!(!g.fail(Error::vendor("second")), "broken once");
        for _ in 0..2 {
            let refused = g.enter().unwrap_err();
            assert_eq!(refused, e);
        }
        assert_eq!(g.failure(), Some(&e));
        assert!(g.drain(ms(0), ms(1)), "refused calls do not stay in flight");
        assert_eq!(
            g.release(),
            Phase::Aborting,
            "the user's destroy leaves NCCL alone"
        );
        g.aborted();
        assert_eq!(g.release(), Phase::Aborted);
        assert_eq!(g.while_live(|| 1), None);
    }

    #[test]
    fn the_users_release_wins_over_a_later_failure() {
        let g = Gate::default();
        assert_eq!(g.while_live(|| 5), Some(5));
        assert_eq!(g.release(), Phase::Live);
        assert!(!g.fail(Error::vendor("too late")));
        assert_eq!(g.failure(), None);
        g.enter().unwrap();
        g.exit();
    }

    #[test]
    fn the_gate_times_calls_inside_nccl() {
        let g = Gate::default();
        assert_eq!(g.inside_for(coarse_now()), None, "no call yet");
        g.enter().unwrap();
        let start = coarse_now();
        g.enter().unwrap();
        let later = start + 1_500_000_000;
        let d = g.inside_for(later).expect("two calls inside");
        assert!(
            d >= ms(1500) && d < ms(1600),
            "timed from the first call: {d:?}"
        );
        g.exit();
        assert!(g.inside_for(later).is_some(), "one call still inside");
        g.exit();
        assert_eq!(g.inside_for(later), None, "none inside");
        g.enter().unwrap();
        let d = g.inside_for(coarse_now() + 10_000_000).unwrap();
        assert!(d < ms(500), "a new spell starts a fresh clock: {d:?}");
        g.exit();
    }

    #[test]
    fn the_users_release_waits_for_the_watchdogs_abort() {
        let g = std::sync::Arc::new(Gate::default());
        assert!(g.fail(Error::new(Status::TIMEOUT, "stalled")));
        assert!(!g.wait_aborted(ms(20)), "still aborting");
        let aborter = {
            let g = g.clone();
            std::thread::spawn(move || {
                std::thread::sleep(ms(50));
                g.aborted();
            })
        };
        let start = Instant::now();
        assert!(g.wait_aborted(ms(5000)), "the abort finished");
        assert!(start.elapsed() >= ms(30), "waited for it");
        aborter.join().unwrap();
        assert!(Gate::default().wait_aborted(ms(0)), "nothing to wait for");
    }

    #[test]
    fn drain_waits_for_calls_in_flight() {
        let g = std::sync::Arc::new(Gate::default());
        g.enter().unwrap();
        assert!(g.fail(Error::vendor("x")));
        assert!(!g.drain(ms(20), ms(1)), "a call is still inside");
        let g2 = g.clone();
        let leaver = std::thread::spawn(move || {
            std::thread::sleep(ms(30));
            g2.exit();
        });
        assert!(g.drain(Duration::from_secs(10), ms(1)));
        leaver.join().unwrap();
    }
}
