//! What an algorithm runs with: the communicator, the barrier generation, the slots of the
//! segment, and the agreement every operation starts with (its descriptor, published and
//! compared across ranks).

use std::sync::atomic::Ordering;
use std::time::Duration;

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

use super::algo::copy;
use super::comm::HostComm;
use super::segment::{Segment, LINE, LINE_BYTES};
use super::sync::{barrier, notify, poll, wait_until};

/// Operation kinds, as written in descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Kind {
    AllReduce = 1,
    AllGather = 2,
    ReduceScatter = 3,
    Broadcast = 4,
    Reduce = 5,
    Gather = 6,
    Scatter = 7,
    AllToAll = 8,
    AllToAllV = 9,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::Gather => "gather",
            Kind::Scatter => "scatter",
            Kind::AllToAll => "all_to_all",
            Kind::AllToAllV => "all_to_allv",
        }
    }
    fn from(v: u64) -> Option<Kind> {
        use Kind::*;
        [
            AllReduce,
            AllGather,
            ReduceScatter,
            Broadcast,
            Reduce,
            Gather,
            Scatter,
            AllToAll,
            AllToAllV,
        ]
        .into_iter()
        .find(|k| *k as u64 == v)
    }
}

/// What one operation is, as every rank must agree.
#[derive(Clone, Copy, Debug)]
pub struct Desc {
    pub kind: Kind,
    pub count: u64,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: i64,
}

/// The state an algorithm runs with.
pub struct Ctx<'a> {
    pub comm: &'a HostComm,
    pub(super) gen: u64,
    /// Set while the operation runs on the calling thread (see `HostComm::run_inline`): how
    /// long its agreement may wait for peers before the operation is handed to the worker.
    pub(super) budget: Option<Duration>,
    /// This run continues an operation whose start (the published line and, for a slot path,
    /// the copy into this rank's slot) an inline attempt already made.
    pub(super) resume: bool,
    /// Set when an inline attempt published its start but its peers had not all arrived within
    /// the budget: the operation goes on from there on the worker.
    pub(super) pending: bool,
}

impl Ctx<'_> {
    pub(super) fn n(&self) -> usize {
        self.comm.nranks
    }
    pub(super) fn me(&self) -> usize {
        self.comm.rank
    }
    pub(super) fn seg(&self) -> &Segment {
        &self.comm.seg
    }
    /// The parity the next barrier publishes.
    pub(super) fn next_parity(&self) -> usize {
        ((self.gen + 1) % 2) as usize
    }
    pub(super) fn slot_bytes(&self) -> usize {
        self.seg().layout.slot_bytes
    }

    /// A context for operations that run in their turn (on the worker).
    pub(super) fn new(comm: &HostComm, gen: u64, resume: bool) -> Ctx<'_> {
        Ctx {
            comm,
            gen,
            budget: None,
            resume,
            pending: false,
        }
    }

    /// Whether the start of this operation was already made by an inline attempt: its data is
    /// in this rank's slot and line, so the algorithm must not write them again.
    pub(super) fn resuming(&self) -> bool {
        self.resume
    }

    /// A barrier; returns the parity of the buffers it published.
    pub(super) fn barrier(&mut self, what: &str) -> Result<usize> {
        self.gen += 1;
        barrier(self.seg(), self.me(), self.gen, self.comm.timeout, what)?;
        Ok((self.gen % 2) as usize)
    }

    /// Starts an operation: publishes its descriptor (and `small`, a payload of at most
    /// [`LINE_BYTES`]) in this rank's line for the next generation, waits until every rank has
    /// published that generation (a barrier), and checks that every rank called the same
    /// operation. Returns the parity of what was published.
    pub(super) fn agree(&mut self, d: &Desc, small: Option<&[u8]>) -> Result<usize> {
        let g = self.gen + 1;
        let p = (g % 2) as usize;
        let comm = self.comm;
        let seg = &comm.seg;
        let n = comm.nranks;
        let me = comm.rank;
        let line = &seg.rank(me).line[p];
        let mine = [
            d.kind as u64,
            d.count,
            d.dtype.0 as u64,
            d.op.0 as u64,
            d.root as u64,
            g,
        ];
        let all_there = || (0..n).all(|r| seg.rank(r).line[p].gen.load(Ordering::Acquire) >= g);
        if std::mem::take(&mut self.resume) {
            // An inline attempt published this generation already (same descriptor, same data).
            debug_assert_eq!(line.gen.load(Ordering::Relaxed), g);
        } else {
            for (slot, v) in line.desc.iter().zip(mine) {
                slot.store(v, Ordering::Relaxed);
            }
            if let Some(bytes) = small {
                // SAFETY: at most LINE_BYTES bytes into this rank's own line, which no peer
                // reads until the generation below is published.
                unsafe {
                    copy(
                        line.data.get() as *mut u8,
                        bytes.as_ptr(),
                        bytes.len().min(LINE_BYTES),
                    )
                };
            }
            line.gen.store(g, Ordering::SeqCst);
            notify(seg);
            if let Some(budget) = self.budget {
                if !poll(budget, n, all_there) {
                    self.pending = true;
                    return Err(Error::internal(
                        "handed to the stream's worker (peers not there yet)",
                    ));
                }
            }
        }
        wait_until(
            seg,
            me,
            comm.timeout,
            d.kind.name(),
            || Ok(all_there()),
            || {
                (0..n)
                    .filter(|&r| seg.rank(r).line[p].gen.load(Ordering::Acquire) < g)
                    .collect()
            },
        )?;
        self.gen = g;
        let same = |r: usize| {
            let theirs = &seg.rank(r).line[p].desc;
            let at = |i: usize| theirs[i].load(Ordering::Relaxed);
            if d.kind == Kind::AllToAllV {
                at(0) == mine[0] && at(2) == mine[2]
            } else {
                (0..5).all(|i| at(i) == mine[i])
            }
        };
        // The common case allocates nothing: every rank called the same operation.
        if (0..n).all(same) {
            return Ok(p);
        }
        let mut differ = Vec::new();
        for r in (0..n).filter(|&r| !same(r)) {
            let theirs: Vec<u64> = seg.rank(r).line[p]
                .desc
                .iter()
                .map(|x| x.load(Ordering::Relaxed))
                .collect();
            differ.push((r, theirs));
        }
        let show = |r: usize, v: &[u64]| {
            let kind = Kind::from(v[0]).map(Kind::name).unwrap_or("?");
            format!(
                "rank {r}: {kind} count {} dtype {:?} op {:?} root {}",
                v[1],
                DataType(v[2] as u32),
                ReduceOp(v[3] as u32),
                v[4] as i64
            )
        };
        let mut msg = format!("ranks disagree on the operation ({}; ", show(me, &mine));
        msg += &differ
            .iter()
            .map(|(r, v)| show(*r, v))
            .collect::<Vec<_>>()
            .join("; ");
        msg.push(')');
        Err(Error::invalid_argument(msg))
    }

    /// Rank `r`'s small payload of parity `p`.
    pub(super) fn line_data(&self, p: usize, r: usize) -> *const u8 {
        self.seg().rank(r).line[p].data.get() as *const u8
    }

    /// Rank `r`'s slot of parity `p`.
    pub(super) fn slot(&self, p: usize, r: usize) -> *mut u8 {
        self.seg().slot(p, r)
    }

    /// Largest whole number of elements of `es` bytes, aligned to a cache line, within `bytes`.
    pub(super) fn fit(bytes: usize, es: usize) -> usize {
        (bytes / LINE * LINE) / es * es
    }
}
