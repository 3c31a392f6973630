//! One collective (or group of transfers) as queued on a stream, and how it runs there.

use std::sync::Arc;

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
        let CollTask { comm, ticket, op } = self;
        comm.run(ticket, |ctx| {
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
        })
    }
}

/// Enqueues an operation on `stream`: it takes a ticket now and runs on the stream's worker.
pub(super) fn enqueue(c: Comm, s: Stream, op: Coll) -> Result<()> {
    let comm = get(c)?;
    let st = stream::get(s)?;
    let ticket = comm.ticket();
    st.enqueue_coll(CollTask { comm, ticket, op })
}
