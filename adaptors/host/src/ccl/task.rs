//! One collective (or group of transfers) as queued on a stream, and how it runs there.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ferrocx_plugin_sdk::prelude::*;

use super::algo;
use super::comm::HostComm;
use super::ctx::Kind;
use super::handles::get;
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
/// Fast path, off unless [`INLINE_US_ENV`] is set above 0: a small operation (one agreement,
/// see `Coll::one_round`) on an idle stream whose communicator has nothing else to run first
/// is run on the calling thread, as an MPI call would be, saving the hand-off to the worker.
/// The caller waits for its peers at most that many microseconds; if one has not arrived by
/// then, the operation (its start published) is handed to the worker, which finishes it before
/// anything enqueued later. So the caller never waits on a peer longer than the budget (a
/// bounded cost like a launch, never a wait that another process's progress could withhold),
/// operations still run in stream and communicator order, and event waits and host functions
/// enqueued before it have run (the stream was idle). Errors go to the stream (sticky) as the
/// worker's would, not to this call. It is off by default: on a loaded machine a late peer
/// makes the calls alternate between the caller and a sleeping worker, which costs more than
/// the hand-off it saves (measured with `scripts/bench-vs-mpi.sh`).
///
/// A small broadcast (see `Ctx::post_broadcast`) takes this path whatever the setting, with no
/// wait at all: its root's work is local (it writes its line; only a root whose lines are all
/// still unread waits, and that one is handed over), and a receiver finds the root's data
/// already there when the root is ahead, else it is handed over at once. So the calling thread
/// never waits on a peer, and stream order holds as above.
pub(super) fn enqueue(c: Comm, s: Stream, op: Coll) -> Result<()> {
    let comm = get(c)?;
    let st = stream::get(s)?;
    let ticket = comm.ticket();
    // A small broadcast is always tried here (with no wait: its root's work is local, and a
    // receiver's is when the root is ahead, the common case); anything else only when the
    // fast path is on.
    let posted = op.posted();
    let budget = if posted {
        Duration::ZERO
    } else {
        inline_budget()
    };
    if let Some(attempt) = (posted || !budget.is_zero())
        .then(|| op.one_round(&comm))
        .flatten()
    {
        if let Some(claim) = st.claim_inline() {
            return match comm.run_inline(ticket, budget, |ctx| attempt.exec(ctx)) {
                Some(Ok(outcome)) => {
                    claim.finish(outcome);
                    Ok(())
                }
                // Peers (or the data) not there yet: the worker finishes it, from its
                // published start if it made one.
                Some(Err(started)) => {
                    claim.hand_over(CollTask {
                        comm,
                        ticket,
                        op,
                        resume: started,
                    });
                    Ok(())
                }
                // Not its turn on the communicator: queued as usual, first on the stream.
                None => {
                    claim.hand_over(CollTask {
                        comm,
                        ticket,
                        op,
                        resume: false,
                    });
                    Ok(())
                }
            };
        }
    }
    st.enqueue_coll(CollTask {
        comm,
        ticket,
        op,
        resume: false,
    })
}

/// Environment variable: how long (microseconds) a small collective run on the calling thread
/// waits for its peers before the stream's worker takes it over; 0 turns the fast path off.
pub const INLINE_US_ENV: &str = "FERROCX_HOST_INLINE_US";

/// Default of [`INLINE_US_ENV`].
const DEFAULT_INLINE_US: u64 = 0;

/// [`INLINE_US_ENV`], read once per process.
pub(super) fn inline_budget() -> Duration {
    static BUDGET: OnceLock<Duration> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let us = match std::env::var(INLINE_US_ENV) {
            Err(_) => DEFAULT_INLINE_US,
            Ok(v) => v.trim().parse::<u64>().unwrap_or_else(|_| {
                tracing::warn!(
                    "{INLINE_US_ENV}={v:?} is not a number of microseconds; using \
                     {DEFAULT_INLINE_US}"
                );
                DEFAULT_INLINE_US
            }),
        };
        Duration::from_micros(us)
    })
}
