//! One collective (or group of transfers) as queued on a stream, and how it runs there.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferrocx_plugin_sdk::prelude::*;

use super::algo;
use super::comm::HostComm;
use super::ctx::Kind;
use super::handles::with;
use super::p2p::{self, Transfer};
use crate::stream;

/// One collective (or group of transfers) as queued on a stream: stored inline in the stream's
/// queue, so issuing a call allocates nothing.
pub(crate) struct CollTask {
    pub(super) comm: Arc<HostComm>,
    pub(super) ticket: u64,
    pub(super) op: Coll,
    /// An inline attempt already published the operation's start (see `enqueue`).
    pub(super) resume: bool,
}

/// Buffers are addresses (`usize`) so the task is `Send`; they stay valid until the operation
/// completes on the stream (the ABI's contract).
pub(super) enum Coll {
    Reduce {
        send: usize,
        recv: usize,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: Option<usize>,
    },
    Gather {
        send: usize,
        recv: usize,
        count: usize,
        dtype: DataType,
        root: Option<usize>,
    },
    Broadcast {
        send: usize,
        recv: usize,
        count: usize,
        dtype: DataType,
        root: usize,
    },
    Exchange {
        kind: Kind,
        send: usize,
        recv: usize,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: Option<usize>,
    },
    AllToAllV {
        send: usize,
        recv: usize,
        dtype: DataType,
        counts: Box<[Vec<usize>; 4]>,
    },
    Transfers(Vec<Transfer>),
}

impl CollTask {
    /// Runs the operation in its turn on the communicator.
    pub(crate) fn run(self) -> Result<()> {
        let CollTask {
            comm,
            ticket,
            op,
            resume,
        } = self;
        let small = op.one_round(&comm).is_some();
        comm.run(ticket, resume, small, |ctx| op.exec(ctx))
    }
}

impl Coll {
    /// Runs the operation with `ctx` (in its turn on the communicator).
    fn exec(self, ctx: &mut super::ctx::Ctx<'_>) -> Result<()> {
        let op = self;
        match op {
            // A small broadcast settles on its root only (see `Ctx::post_broadcast`);
            // transfers use the rings, not the generations' buffers.
            Coll::Broadcast { .. } if op.posted() => {}
            // A small all-reduce uses lines only: its agreement settles what it needs.
            Coll::Reduce { count, dtype, .. } if algo::all_reduce_is_line(count, dtype) => {}
            Coll::Transfers(_) => {}
            // Anything else may write its slot before its agreement: make that free first.
            _ => ctx.settle_slots("collective")?,
        }
        {
            // SAFETY: (every arm) the buffers hold what the ABI requires for the operation and
            // stay valid until it completes on the stream.
            unsafe {
                match op {
                    Coll::Reduce {
                        send,
                        recv,
                        count,
                        dtype,
                        op,
                        root,
                    } => algo::all_reduce(
                        ctx,
                        send as *const u8,
                        recv as *mut u8,
                        count,
                        dtype,
                        op,
                        root,
                    ),
                    Coll::Gather {
                        send,
                        recv,
                        count,
                        dtype,
                        root,
                    } => algo::all_gather(
                        ctx,
                        send as *const u8,
                        recv as *mut u8,
                        count,
                        dtype,
                        root,
                    ),
                    Coll::Broadcast {
                        send,
                        recv,
                        count,
                        dtype,
                        root,
                    } => {
                        algo::broadcast(ctx, send as *const u8, recv as *mut u8, count, dtype, root)
                    }
                    Coll::Exchange {
                        kind,
                        send,
                        recv,
                        count,
                        dtype,
                        op,
                        root,
                    } => algo::exchange(
                        ctx,
                        kind,
                        send as *const u8,
                        recv as *mut u8,
                        count,
                        dtype,
                        op,
                        root,
                    ),
                    Coll::AllToAllV {
                        send,
                        recv,
                        dtype,
                        counts,
                    } => {
                        let [sc, sd, rc, rd] = &*counts;
                        algo::all_to_allv(
                            ctx,
                            send as *const u8,
                            sc,
                            sd,
                            recv as *mut u8,
                            rc,
                            rd,
                            dtype,
                        )
                    }
                    Coll::Transfers(t) => p2p::run(ctx.comm, t),
                }
            }
        }
    }

    /// Whether this is an all-reduce (or reduce) whose data rides in the lines (see
    /// `algo::all_reduce_is_line`).
    fn in_lines(&self) -> bool {
        matches!(*self, Coll::Reduce { count, dtype, .. } if algo::all_reduce_is_line(count, dtype))
    }

    /// Whether this is a small broadcast (see `Ctx::post_broadcast`).
    fn posted(&self) -> bool {
        matches!(*self, Coll::Broadcast { count, dtype, .. } if algo::broadcast_is_posted(count, dtype))
    }

    /// A copy of the operation if it is one agreement with local work before and after it
    /// (no other wait on peers), so an inline attempt can hand it to the worker at that one
    /// point; `None` for every other operation.
    fn one_round(&self, comm: &HostComm) -> Option<Coll> {
        let slot = comm.seg.layout.slot_bytes;
        match *self {
            Coll::Reduce {
                send,
                recv,
                count,
                dtype,
                op,
                root,
            } if algo::all_reduce_is_one_round(count, dtype, slot) => Some(Coll::Reduce {
                send,
                recv,
                count,
                dtype,
                op,
                root,
            }),
            Coll::Broadcast {
                send,
                recv,
                count,
                dtype,
                root,
            } if algo::broadcast_is_one_round(count, dtype, slot) => Some(Coll::Broadcast {
                send,
                recv,
                count,
                dtype,
                root,
            }),
            _ => None,
        }
    }
}

/// Enqueues an operation on `stream`: it takes a ticket now and runs on the stream's worker.
///
/// Fast path ([`INLINE_US_ENV`]): a small all-reduce, reduce or broadcast (one agreement, see
/// `Coll::one_round`) on an idle stream whose communicator has nothing else to run first is
/// run on the calling thread, as an MPI call would be, saving the hand-off to the worker. The
/// caller waits for its peers at most that many microseconds; if one has not arrived by then,
/// the operation (its start published) is handed to the worker, which finishes it before
/// anything enqueued later. So the caller never waits on a peer longer than the budget (a
/// bounded cost like a launch, never a wait that another process's progress could withhold),
/// operations still run in stream and communicator order, and event waits and host functions
/// enqueued before it have run (the stream was idle). Errors go to the stream (sticky) as the
/// worker's would, not to this call.
///
/// A stream still busy with earlier work (typically a call handed over just before) is waited
/// for, asleep, at most [`DRAIN_US_ENV`] before the call is queued behind it: without that, one
/// late peer would send every later call of a busy loop through the worker (the caller keeps
/// ahead of it), each a hand-off between two threads of the rank that compete for its core.
/// So the calling thread waits at most that plus the budget, both bounded.
///
/// It is on by default ([`DEFAULT_INLINE_US`]) for an all-reduce whose data rides in the lines
/// (the core's barrier is one) where every rank of the communicator can have a core of its
/// own: a peer is then late by a cache-line round trip, rarely by a time slice. Where ranks
/// outnumber cores it is off unless set: a peer is often descheduled, the attempt fails and
/// the calls alternate between the caller and the worker. Even with a core per rank, a loaded
/// machine sometimes settles into that alternation (a hand-off and a wake-up per call, several
/// microseconds each); `FERROCX_HOST_DRAIN_US=0` trades it for the steady worker path.
///
/// A small broadcast (see `Ctx::post_broadcast`) takes this path whatever the setting, with a
/// budget of its own ([`POSTED_US_ENV`]): its root's work is local (it writes its line; only a
/// root whose lines are all still unread waits for its slowest receiver, as a launch waits for
/// room in a full queue), and a receiver finds the root's data already there when the root is
/// ahead, else waits for it within the budget. Stream order holds as above.
pub(super) fn enqueue(c: Comm, s: Stream, op: Coll) -> Result<()> {
    // The communicator and the stream are borrowed from this thread's caches, not counted
    // references: the call that runs inline touches no shared counter but its ticket, the
    // stream's claim, the communicator's turn and its own line.
    with(c, |comm| stream::with(s, |st| enqueue_on(comm, st, op)))??
}

/// [`enqueue`] of the operation `make(root)` for a rooted collective: `root` checked against
/// the communicator in the same lookup that enqueues it. Inlined: `make`'s captures stay in
/// registers.
#[inline(always)]
pub(super) fn enqueue_rooted(
    c: Comm,
    s: Stream,
    root: i32,
    make: impl FnOnce(usize) -> Coll,
) -> Result<()> {
    with(c, |comm| {
        let root = super::root_of(comm, root)?;
        stream::with(s, |st| enqueue_on(comm, st, make(root)))?
    })?
}

/// [`enqueue`] with the communicator and the stream looked up.
fn enqueue_on(comm: &Arc<HostComm>, st: &stream::StreamInner, op: Coll) -> Result<()> {
    let ticket = comm.ticket();
    let posted = op.posted();
    let budget = if posted {
        posted_budget()
    } else {
        inline_budget(comm.nranks, op.in_lines())
    };
    let queued = |op, resume| CollTask {
        comm: comm.clone(),
        ticket,
        op,
        resume,
    };
    // A small broadcast is always tried (a zero budget looks once); anything else only when
    // the fast path is on.
    let Some(attempt) = (posted || !budget.is_zero())
        .then(|| op.one_round(comm))
        .flatten()
    else {
        return st.enqueue_coll(queued(op, false));
    };
    let claim = st.claim_inline().or_else(|| {
        let drain = drain_wait();
        (!budget.is_zero() && !drain.is_zero() && st.wait_drained(drain))
            .then(|| st.claim_inline())
            .flatten()
    });
    let Some(claim) = claim else {
        return st.enqueue_coll(queued(op, false));
    };
    match comm.run_inline(ticket, budget, |ctx| attempt.exec(ctx)) {
        Some(Ok(outcome)) => claim.finish(outcome),
        // Peers (or the data) not there yet: the worker finishes it, from its published start
        // if it made one.
        Some(Err(started)) => claim.hand_over(queued(op, started)),
        // Not its turn on the communicator: queued as usual, first on the stream.
        None => claim.hand_over(queued(op, false)),
    }
    Ok(())
}

/// Environment variable: how long (microseconds) a call that would run on the calling thread
/// waits for its stream's earlier work to complete (see [`enqueue`]); 0: it does not wait.
pub const DRAIN_US_ENV: &str = "FERROCX_HOST_DRAIN_US";

/// Default of [`DRAIN_US_ENV`].
const DEFAULT_DRAIN_US: u64 = 50;

/// [`DRAIN_US_ENV`], else [`DEFAULT_DRAIN_US`].
fn drain_wait() -> Duration {
    static SET: OnceLock<Option<Duration>> = OnceLock::new();
    micros_env(&SET, DRAIN_US_ENV).unwrap_or(Duration::from_micros(DEFAULT_DRAIN_US))
}

/// Environment variable: how long (microseconds) a small collective run on the calling thread
/// waits for its peers before the stream's worker takes it over; 0 turns the fast path off.
pub const INLINE_US_ENV: &str = "FERROCX_HOST_INLINE_US";

/// Default of [`INLINE_US_ENV`] where every rank can have a core (else 0): long enough that
/// a peer's short hiccup does not send the call to the worker (measured on the 2-core
/// development VM: the median of 12 runs of 5000 one-word all-reduces on 2 ranks was 0.43 us
/// with 100 us, 0.80 us with 10 us).
const DEFAULT_INLINE_US: u64 = 100;

/// Environment variable: how long (microseconds) a small broadcast run on the calling thread
/// waits for its root's data (a receiver) or for room in its lines (a root) before the
/// stream's worker takes it over; 0: it looks once.
pub const POSTED_US_ENV: &str = "FERROCX_HOST_POSTED_US";

/// Default of [`POSTED_US_ENV`], the inline all-reduce's: a receiver a few calls behind its
/// root catches up well within it, and so does one whose root was delayed by a hand-off of
/// its own; a peer descheduled for a time slice costs one hand-off. (With 5 us a hand-off on
/// one side made the other side's wait run out too, and a run could settle into hand-offs at
/// microseconds a call: on the 2-core development VM, 6 of 24 runs of 5000 8-byte broadcasts on
/// 2 ranks took over 0.2 us a call, against none with 100 us; the median was 0.12 us either
/// way.)
const DEFAULT_POSTED_US: u64 = 100;

/// Microseconds from environment variable `name`, read once into `cell`; `None` when unset.
fn micros_env(cell: &'static OnceLock<Option<Duration>>, name: &str) -> Option<Duration> {
    *cell.get_or_init(|| {
        let v = std::env::var(name).ok()?;
        match v.trim().parse::<u64>() {
            Ok(us) => Some(Duration::from_micros(us)),
            Err(_) => {
                tracing::warn!("{name}={v:?} is not a number of microseconds; ignored");
                None
            }
        }
    })
}

/// [`INLINE_US_ENV`] for an operation of a communicator of `nranks` ranks on this host: the
/// setting, else [`DEFAULT_INLINE_US`] for an all-reduce in the lines (`in_lines`) where each
/// rank can have a core, and 0 for anything else (a slot-sized all-reduce copies more than a
/// hand-off costs) or where ranks outnumber cores.
pub(super) fn inline_budget(nranks: usize, in_lines: bool) -> Duration {
    static SET: OnceLock<Option<Duration>> = OnceLock::new();
    micros_env(&SET, INLINE_US_ENV).unwrap_or_else(|| {
        if in_lines && nranks <= super::sync::cores() {
            Duration::from_micros(DEFAULT_INLINE_US)
        } else {
            Duration::ZERO
        }
    })
}

/// [`POSTED_US_ENV`], else [`DEFAULT_POSTED_US`].
pub(super) fn posted_budget() -> Duration {
    static SET: OnceLock<Option<Duration>> = OnceLock::new();
    micros_env(&SET, POSTED_US_ENV).unwrap_or(Duration::from_micros(DEFAULT_POSTED_US))
}
