//! What an algorithm runs with: the communicator, the barrier generation, the slots of the
//! segment, and the agreement every operation starts with (its descriptor, published and
//! compared across ranks).

use std::sync::atomic::Ordering;
use std::time::Duration;

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

use super::algo::copy;
use super::comm::HostComm;
use super::segment::{Line, Segment, Tiny, LINE, LINES, LINE_BYTES, TINY, TINY_BYTES};
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

impl Desc {
    /// The descriptor as published, in two words so that a small payload shares the
    /// generation's cache line: kind (8 bits), data type (16), reduction (8) and root (32, -1
    /// for none) in the first, the count in the second.
    fn words(&self) -> [u64; 2] {
        [
            self.kind as u64
                | (u64::from(self.dtype.0) & 0xffff) << 8
                | (u64::from(self.op.0) & 0xff) << 24
                | u64::from(self.root as i32 as u32) << 32,
            self.count,
        ]
    }

    /// The call that published `words`, as a mismatch message shows it (rank `r`).
    fn show(r: usize, words: [u64; 2]) -> String {
        let w = words[0];
        let kind = Kind::from(w & 0xff).map(Kind::name).unwrap_or("?");
        format!(
            "rank {r}: {kind} count {} dtype {:?} op {:?} root {}",
            words[1],
            DataType(((w >> 8) & 0xffff) as u32),
            ReduceOp(((w >> 24) & 0xff) as u32),
            (w >> 32) as u32 as i32
        )
    }
}

/// Whether rank `r` has published generation `g` or a later one, so it has finished reading
/// everything published before `g`. Every rank publishes every generation in order, in a line
/// (an agreement, a small broadcast) or at a barrier: `g` is then in its line of `g` (or a later
/// generation that reused it) or below its barrier word.
fn reached(seg: &Segment, r: usize, g: u64) -> bool {
    line_of(seg, r, g).gen.load(Ordering::Acquire) >= g
        || seg.rank(r).arrived.load(Ordering::Acquire) >= g
}

/// Rank `r`'s line of generation `g`.
fn line_of(seg: &Segment, r: usize, g: u64) -> &Line {
    &seg.rank(r).line[(g % LINES as u64) as usize]
}

/// Rank `r`'s tiny-broadcast record of generation `g`.
fn tiny_of(seg: &Segment, r: usize, g: u64) -> &Tiny {
    &seg.rank(r).tiny[(g % TINY as u64) as usize]
}

/// The tag of a tiny broadcast `d` of generation `g`: the generation's low 32 bits (a record
/// is rewritten `TINY` generations later, so equality tells this generation's from an older
/// one), then the call exactly: count (4 bits), data type (8), root (20). `None` where the
/// call does not fit (it then takes the root's line).
fn tiny_tag(g: u64, d: &Desc, bytes: usize) -> Option<u64> {
    let fits =
        bytes <= TINY_BYTES && d.count < 16 && d.dtype.0 < 256 && (0..1 << 20).contains(&d.root);
    fits.then_some(
        (g as u32 as u64) << 32 | d.count | (d.dtype.0 as u64) << 4 | (d.root as u64) << 12,
    )
}

/// Whether tag `tag` is of generation `g`.
fn tiny_is(tag: u64, g: u64) -> bool {
    tag >> 32 == g as u32 as u64
}

/// The call a tiny tag names, as a mismatch message shows it.
fn show_tiny(r: usize, tag: u64) -> String {
    format!(
        "rank {r}: broadcast count {} dtype {:?} op {:?} root {}",
        tag & 0xf,
        DataType(((tag >> 4) & 0xff) as u32),
        ReduceOp::SUM,
        (tag >> 12) & 0xf_ffff
    )
}

/// The state an algorithm runs with.
pub struct Ctx<'a> {
    pub comm: &'a HostComm,
    pub(super) gen: u64,
    /// Every rank is known to have finished reading what was published before this generation
    /// (see [`settle`](Self::settle)); equal to `gen` after an agreement or a barrier.
    pub(super) settled: u64,
    /// Set while the operation runs on the calling thread (see `HostComm::run_inline`): how
    /// long its agreement may wait for peers before the operation is handed to the worker.
    pub(super) budget: Option<Duration>,
    /// This run continues an operation whose start (the published line and, for a slot path,
    /// the copy into this rank's slot) an inline attempt already made.
    pub(super) resume: bool,
    /// Set when an inline attempt published its start but its peers had not all arrived within
    /// the budget: the operation goes on from there on the worker.
    pub(super) pending: bool,
    /// This run published something (its line): a pending inline attempt is resumed from
    /// there, not started over.
    pub(super) started: bool,
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
    pub(super) fn new(comm: &HostComm, gen: u64, settled: u64, resume: bool) -> Ctx<'_> {
        Ctx {
            comm,
            gen,
            settled,
            budget: None,
            resume,
            pending: false,
            started: false,
        }
    }

    /// Whether the start of this operation was already made by an inline attempt: its data is
    /// in this rank's slot and line, so the algorithm must not write them again.
    pub(super) fn resuming(&self) -> bool {
        self.resume
    }

    /// A barrier; returns the parity of the buffers it published.
    pub(super) fn barrier(&mut self, what: &str) -> Result<usize> {
        self.settle(self.gen, what)?;
        self.gen += 1;
        barrier(self.seg(), self.me(), self.gen, self.comm.timeout, what)?;
        self.settled = self.gen;
        Ok((self.gen % 2) as usize)
    }

    /// Makes sure every rank has reached generation `need` (published it, in a line, at a
    /// barrier or in its barrier word, so it has finished reading everything published before
    /// it), waiting if it is not known yet. Writing generation `g`'s slots needs `g - 1` (they
    /// are reused every other generation), its line `g + 1 - LINES`, its tiny record
    /// `g + 1 - TINY`. Costs nothing after an agreement or a
    /// barrier, which establish the current generation; only a small broadcast (whose root
    /// does not wait for its receivers) leaves something to wait for.
    pub(super) fn settle(&mut self, need: u64, what: &str) -> Result<()> {
        if self.settled >= need {
            return Ok(());
        }
        let comm = self.comm;
        let seg = &comm.seg;
        let (n, me) = (self.n(), self.me());
        let reached = |r: usize| reached(seg, r, need);
        self.wait_peers(
            what,
            || (0..n).all(|r| r == me || reached(r)),
            || (0..n).filter(|&r| r != me && !reached(r)).collect(),
        )?;
        // A rank's barrier word is a lower bound of its progress (a receiver of a small
        // broadcast also bumps it): the root of many learns how far each receiver is, and
        // checks again only once its lines run out.
        self.settled = (0..n)
            .filter(|&r| r != me)
            .map(|r| seg.rank(r).arrived.load(Ordering::Acquire).max(need))
            .min()
            .unwrap_or(need);
        Ok(())
    }

    /// [`settle`](Self::settle) for an operation that may write its slots before it agrees.
    pub(super) fn settle_slots(&mut self, what: &str) -> Result<()> {
        self.settle(self.gen, what)
    }

    /// Waits until `ready()`; within the budget only when running inline (then it marks the
    /// operation pending and fails, for the worker to take it over).
    fn wait_peers(
        &mut self,
        what: &str,
        ready: impl Fn() -> bool,
        pending: impl Fn() -> Vec<usize>,
    ) -> Result<()> {
        if let Some(budget) = self.budget {
            if !poll(budget, self.n(), &ready) {
                self.pending = true;
                return Err(Error::internal(
                    "handed to the stream's worker (peers not there yet)",
                ));
            }
            return Ok(());
        }
        let comm = self.comm;
        wait_until(
            &comm.seg,
            comm.rank,
            comm.timeout,
            what,
            || Ok(ready()),
            pending,
        )
    }

    /// Rank `r`'s line of the current generation (after [`agree`](Self::agree)).
    pub(super) fn line(&self, r: usize) -> &Line {
        line_of(self.seg(), r, self.gen)
    }

    /// Publishes this rank's start of generation `g`: the descriptor `d`, the payload `small`
    /// (at most [`LINE_BYTES`]) and last the generation itself, then wakes sleeping peers.
    fn publish(&mut self, g: u64, d: &Desc, small: Option<&[u8]>) {
        self.started = true;
        let line = line_of(self.seg(), self.me(), g);
        for (slot, v) in line.desc.iter().zip(d.words()) {
            slot.store(v, Ordering::Relaxed);
        }
        if let Some(bytes) = small {
            // SAFETY: at most LINE_BYTES bytes into this rank's own line, which no peer
            // reads until the generation below is published (and none still reads what it
            // held LINES generations before: the caller settled).
            unsafe {
                copy(
                    line.data.get() as *mut u8,
                    bytes.as_ptr(),
                    bytes.len().min(LINE_BYTES),
                )
            };
        }
        // Release: a peer that sees `g` sees the descriptor and payload; `notify` orders it
        // against the sleeper count.
        line.gen.store(g, Ordering::Release);
        notify(self.seg());
    }

    /// A small broadcast from `root`, its payload `data` (the root's, at most [`LINE_BYTES`])
    /// in the root's line, or for a tiny one (at most [`TINY_BYTES`], see [`tiny_tag`]) in the
    /// root's tiny record, four to a cache line: the root publishes and returns without
    /// waiting for its receivers, as an eager send does; a receiver waits for the root's
    /// record (or line), checks the call, copies the payload to `recv` and then publishes its
    /// own line (its acknowledgement, and its descriptor for a root that called something
    /// else). The root of a tiny one marks its progress in its barrier word, as a receiver
    /// does, since it publishes no line (a later root settles on it). A line is rewritten
    /// `LINES` generations later, so the root runs up to `LINES - 1` operations ahead of its
    /// slowest receiver before it waits ([`settle`](Self::settle)); any other operation
    /// settles first.
    ///
    /// # Safety
    /// `recv` holds `bytes` bytes (at most `LINE_BYTES`), on every rank.
    pub(super) unsafe fn post_broadcast(
        &mut self,
        d: &Desc,
        root: usize,
        data: Option<&[u8]>,
        recv: *mut u8,
        bytes: usize,
    ) -> Result<()> {
        // Nothing is published before a wait here: a resumed inline attempt starts over.
        self.resume = false;
        let g = self.gen + 1;
        let tag = tiny_tag(g, d, bytes);
        let me = self.me();
        if me == root {
            // A tiny record is rewritten `TINY` generations later, a line `LINES` later.
            let ahead = if tag.is_some() { TINY } else { LINES } as u64;
            self.settle((g + 1).saturating_sub(ahead), d.kind.name())?;
            match tag {
                Some(tag) => {
                    let mut word = [0u8; 8];
                    let data = data.unwrap_or_default();
                    word[..data.len().min(TINY_BYTES)]
                        .copy_from_slice(&data[..data.len().min(TINY_BYTES)]);
                    let seg = &self.comm.seg;
                    let rec = tiny_of(seg, me, g);
                    rec.data.store(u64::from_ne_bytes(word), Ordering::Relaxed);
                    // Release: a receiver that sees the tag sees the payload.
                    rec.tag.store(tag, Ordering::Release);
                    seg.rank(me).arrived.store(g, Ordering::Release);
                    self.started = true;
                    notify(seg);
                }
                None => self.publish(g, d, data),
            }
            self.gen = g;
            if tag.is_some() {
                // An in-place root's recv is its send: nothing to copy.
                if let Some(data) = data.filter(|d| !std::ptr::eq(d.as_ptr(), recv)) {
                    // SAFETY: recv and data hold `bytes` (at most TINY_BYTES) on the root.
                    unsafe { copy(recv, data.as_ptr(), bytes) };
                }
                return Ok(());
            }
        } else {
            let comm = self.comm;
            let seg = &comm.seg;
            let theirs = line_of(seg, root, g);
            let rec = tiny_of(seg, root, g);
            // The root's record or its line (the call, or the root's call if it differs, takes
            // one or the other; the checks below tell).
            let there = || {
                tiny_is(rec.tag.load(Ordering::Acquire), g)
                    || theirs.gen.load(Ordering::Acquire) >= g
            };
            self.wait_peers(d.kind.name(), there, || vec![root])?;
            let got = rec.tag.load(Ordering::Acquire);
            let (same, word) = if tiny_is(got, g) {
                (Some(got) == tag, rec.data.load(Ordering::Relaxed))
            } else {
                let mine = d.words();
                let desc = (0..2).all(|i| theirs.desc[i].load(Ordering::Relaxed) == mine[i]);
                (tag.is_none() && desc, 0)
            };
            // Its progress for a root that settles (see `settle`), then its call: published
            // even on a mismatch, so that a root that called something else sees it in its
            // agreement. A tiny one goes in this rank's own tiny record, not its line: a root
            // of tiny broadcasts runs up to `TINY - 1` generations ahead of the slowest rank,
            // and so may a receiver, whose line of this generation a slower rank may still
            // read as it was `LINES` generations before.
            seg.rank(me).arrived.store(g, Ordering::Release);
            match tag {
                Some(tag) => {
                    tiny_of(seg, me, g).tag.store(tag, Ordering::Release);
                    self.started = true;
                    notify(seg);
                }
                None => self.publish(g, d, None),
            }
            self.gen = g;
            if !same {
                if tiny_is(got, g) {
                    return Err(Error::invalid_argument(format!(
                        "ranks disagree on the operation ({}; {})",
                        Desc::show(me, d.words()),
                        show_tiny(root, got)
                    )));
                }
                return Err(self.mismatch(d, g, &[root]));
            }
            if tag.is_some() {
                let word = word.to_ne_bytes();
                // SAFETY: recv holds `bytes` (<= TINY_BYTES).
                unsafe { copy(recv, word.as_ptr(), bytes) };
                return Ok(());
            }
        }
        self.gen = g;
        // SAFETY: recv holds `bytes`; the root's line holds `bytes` published bytes until it
        // is rewritten LINES generations later, which needs this rank to have published the
        // generation after this one.
        unsafe { copy(recv, self.line_data(root), bytes) };
        Ok(())
    }

    /// Starts an operation: publishes its descriptor (and `small`, a payload of at most
    /// [`LINE_BYTES`]) in this rank's line for the next generation, waits until every rank has
    /// published that generation (a barrier), and checks that every rank called the same
    /// operation. Returns the parity of the slots of that generation.
    pub(super) fn agree(&mut self, d: &Desc, small: Option<&[u8]>) -> Result<usize> {
        let g = self.gen + 1;
        let p = (g % 2) as usize;
        let comm = self.comm;
        let seg = &comm.seg;
        let n = comm.nranks;
        let me = comm.rank;
        let mine = d.words();
        let gen_of = |r: usize| line_of(seg, r, g).gen.load(Ordering::Acquire);
        if std::mem::take(&mut self.resume) {
            // An inline attempt published this generation already (same descriptor, same data).
            debug_assert_eq!(gen_of(me), g);
        } else {
            self.settle((g + 1).saturating_sub(LINES as u64), d.kind.name())?;
            self.publish(g, d, small);
        }
        // A rank that called a tiny broadcast as its root publishes no line: it is there with
        // the wrong call.
        let tiny_root = |r: usize| tiny_is(tiny_of(seg, r, g).tag.load(Ordering::Acquire), g);
        let there = |r: usize| gen_of(r) >= g || tiny_root(r);
        let all_there = || (0..n).all(there);
        self.wait_peers(d.kind.name(), all_there, || {
            (0..n).filter(|&r| !there(r)).collect()
        })?;
        self.gen = g;
        self.settled = g;
        let same = |r: usize| {
            if gen_of(r) < g {
                return false;
            }
            let theirs = &line_of(seg, r, g).desc;
            let at = |i: usize| theirs[i].load(Ordering::Relaxed);
            // An all_to_allv's count is each rank's largest block: it may differ.
            at(0) == mine[0] && (d.kind == Kind::AllToAllV || at(1) == mine[1])
        };
        // The common case allocates nothing: every rank called the same operation.
        if (0..n).all(same) {
            return Ok(p);
        }
        let differ: Vec<usize> = (0..n).filter(|&r| !same(r)).collect();
        Err(self.mismatch(d, g, &differ))
    }

    /// The error for ranks `differ` whose descriptor of generation `g` is not `d`.
    fn mismatch(&self, d: &Desc, g: u64, differ: &[usize]) -> Error {
        let mut msg = format!(
            "ranks disagree on the operation ({}; ",
            Desc::show(self.me(), d.words())
        );
        msg += &differ
            .iter()
            .map(|&r| {
                let tag = tiny_of(self.seg(), r, g).tag.load(Ordering::Acquire);
                let line = line_of(self.seg(), r, g);
                if line.gen.load(Ordering::Acquire) < g && tiny_is(tag, g) {
                    return show_tiny(r, tag);
                }
                let at = |i: usize| line.desc[i].load(Ordering::Relaxed);
                Desc::show(r, [at(0), at(1)])
            })
            .collect::<Vec<_>>()
            .join("; ");
        msg.push(')');
        Error::invalid_argument(msg)
    }

    /// Rank `r`'s small payload of the current generation (after [`agree`](Self::agree)).
    pub(super) fn line_data(&self, r: usize) -> *const u8 {
        self.line(r).data.get() as *const u8
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

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(kind: Kind, count: u64, dtype: DataType, op: ReduceOp, root: i64) -> Desc {
        Desc {
            kind,
            count,
            dtype,
            op,
            root,
        }
    }

    #[test]
    fn packed_descriptors_differ_wherever_the_calls_do_and_show_what_they_hold() {
        let base = desc(Kind::Reduce, 37, DataType::F16, ReduceOp::MAX, 3);
        let others = [
            desc(Kind::AllReduce, 37, DataType::F16, ReduceOp::MAX, 3),
            desc(Kind::Reduce, 38, DataType::F16, ReduceOp::MAX, 3),
            desc(Kind::Reduce, 37, DataType::BF16, ReduceOp::MAX, 3),
            desc(Kind::Reduce, 37, DataType::F16, ReduceOp::MIN, 3),
            desc(Kind::Reduce, 37, DataType::F16, ReduceOp::MAX, 2),
            desc(Kind::Reduce, 37, DataType::F16, ReduceOp::MAX, -1),
            desc(
                Kind::Reduce,
                37 + (1 << 40),
                DataType::F16,
                ReduceOp::MAX,
                3,
            ),
        ];
        for o in others {
            assert_ne!(base.words(), o.words(), "{o:?}");
        }
        assert_eq!(
            Desc::show(2, base.words()),
            "rank 2: reduce count 37 dtype f16 op max root 3"
        );
        let none = desc(Kind::AllToAllV, 5, DataType::U64, ReduceOp::SUM, -1);
        assert_eq!(
            Desc::show(0, none.words()),
            "rank 0: all_to_allv count 5 dtype u64 op sum root -1"
        );
    }
}
