//! What an algorithm runs with: the communicator, the barrier generation, the slots of the
//! segment, and the agreement every operation starts with (its descriptor, published and
//! compared across ranks).

use std::sync::atomic::Ordering;

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

use super::algo::copy;
use super::comm::HostComm;
use super::segment::{Segment, LINE, LINE_BYTES};
use super::sync::{barrier, notify, wait_until};

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
        for (slot, v) in line.desc.iter().zip(mine) {
            slot.store(v, Ordering::Relaxed);
        }
        if let Some(bytes) = small {
            // SAFETY: at most LINE_BYTES bytes into this rank's own line, which no peer reads
            // until the generation below is published.
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
        wait_until(
            seg,
            me,
            comm.timeout,
            d.kind.name(),
            || Ok((0..n).all(|r| seg.rank(r).line[p].gen.load(Ordering::Acquire) >= g)),
            || {
                (0..n)
                    .filter(|&r| seg.rank(r).line[p].gen.load(Ordering::Acquire) < g)
                    .collect()
            },
        )?;
        self.gen = g;
        let mut differ = Vec::new();
        for r in 0..n {
            let theirs: Vec<u64> = seg.rank(r).line[p]
                .desc
                .iter()
                .map(|x| x.load(Ordering::Relaxed))
                .collect();
            let same = if d.kind == Kind::AllToAllV {
                theirs[0] == mine[0] && theirs[2] == mine[2]
            } else {
                theirs[..5] == mine[..5]
            };
            if !same {
                differ.push((r, theirs));
            }
        }
        if differ.is_empty() {
            return Ok(p);
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
