//! A host communicator: its segment, the order its operations execute in, and the
//! collective algorithms.
//!
//! Operations are enqueued on a stream and run on that stream's worker. Each gets a ticket
//! when enqueued; a worker runs an operation only when every earlier ticket of the
//! communicator has run, so ranks execute their operations in the order they issued them even
//! across streams. The first failure breaks the communicator: later operations fail at once
//! with it, and `comm_get_async_error` reports it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp, Status};
use ferrocx_plugin_sdk::{Error, Result};

use super::reduce::reduce;
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
    fn name(self) -> &'static str {
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

struct Exec {
    /// Workers waiting for their ticket's turn (only operations of one communicator enqueued
    /// on several streams ever wait).
    waiting: usize,
    /// Barrier generation reached.
    gen: u64,
    /// Ticket of the next operation to run.
    next: u64,
    /// The first failure; later operations fail with it.
    broken: Option<Error>,
}

/// One rank's communicator.
pub struct HostComm {
    pub rank: usize,
    pub nranks: usize,
    pub seg: Segment,
    pub timeout: Duration,
    tickets: AtomicU64,
    exec: Mutex<Exec>,
    turn: Condvar,
    pub aborted: AtomicBool,
    /// Set when the handle is destroyed (handle caches check it).
    pub destroyed: AtomicBool,
}

/// Messages up to this size take the one-shot path (every rank reduces everything).
const ONE_SHOT_BYTES: usize = 16 * 1024;

thread_local! {
    static SCRATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with an 8-byte-aligned scratch buffer of `bytes` bytes.
fn with_scratch<R>(bytes: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let words = bytes.div_ceil(8);
        if s.len() < words {
            s.resize(words, 0);
        }
        // SAFETY: the Vec<u64> holds at least `bytes` bytes, 8-byte aligned.
        let b = unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, bytes) };
        f(b)
    })
}

/// Copies `n` bytes between addresses of this process (no-op for 0).
///
/// # Safety
/// Both ranges must be valid for `n` bytes.
unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    if n > 0 && !std::ptr::eq(dst, src) {
        // SAFETY: by the caller's contract; ranges may overlap (in-place user buffers).
        unsafe { std::ptr::copy(src, dst, n) };
    }
}

/// The element size of `dtype`, or an error.
pub fn elem_size(dtype: DataType) -> Result<usize> {
    dtype
        .size()
        .ok_or_else(|| Error::invalid_argument(format!("unknown data type {}", dtype.0)))
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

impl HostComm {
    /// Wraps an attached segment.
    pub fn new(rank: usize, nranks: usize, seg: Segment, timeout: Duration) -> Self {
        HostComm {
            rank,
            nranks,
            seg,
            timeout,
            tickets: AtomicU64::new(0),
            exec: Mutex::new(Exec {
                waiting: 0,
                gen: 0,
                next: 0,
                broken: None,
            }),
            turn: Condvar::new(),
            aborted: AtomicBool::new(false),
            destroyed: AtomicBool::new(false),
        }
    }

    /// Sets the barrier generation reached during initialisation.
    pub fn set_generation(&self, gen: u64) {
        self.exec.lock().unwrap_or_else(|p| p.into_inner()).gen = gen;
    }

    /// Blocks until every operation enqueued so far has run; returns the first failure.
    pub fn wait_idle(&self) -> Result<()> {
        let target = self.tickets.load(Ordering::Acquire);
        let mut ex = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        while ex.next < target && ex.broken.is_none() {
            ex.waiting += 1;
            ex = self.turn.wait(ex).unwrap_or_else(|p| p.into_inner());
            ex.waiting -= 1;
        }
        match &ex.broken {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// A ticket for an operation about to be enqueued.
    pub fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::AcqRel)
    }

    /// The first failure of the communicator, if any.
    pub fn async_error(&self) -> Option<Error> {
        self.exec
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .broken
            .clone()
    }

    /// Marks the communicator aborted: every pending and later operation fails.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        let h = self.seg.header();
        h.abort.store(1, Ordering::Release);
        h.wake.fetch_add(1, Ordering::AcqRel);
        super::sync::futex_wake(&h.wake);
        let mut ex = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        ex.broken
            .get_or_insert_with(|| Error::new(Status::ABORTED, "the communicator was aborted"));
        drop(ex);
        self.turn.notify_all();
    }

    /// Runs operation `ticket` once every earlier ticket has run.
    pub fn run(&self, ticket: u64, f: impl FnOnce(&mut Ctx<'_>) -> Result<()>) -> Result<()> {
        let mut ex = self.exec.lock().unwrap_or_else(|p| p.into_inner());
        while ex.next != ticket && ex.broken.is_none() {
            ex.waiting += 1;
            ex = self.turn.wait(ex).unwrap_or_else(|p| p.into_inner());
            ex.waiting -= 1;
        }
        let result = match &ex.broken {
            Some(e) => Err(Error::new(
                e.status(),
                format!("the communicator failed earlier: {}", e.message()),
            )),
            None => {
                let mut ctx = Ctx {
                    comm: self,
                    gen: ex.gen,
                };
                let r = f(&mut ctx);
                ex.gen = ctx.gen;
                r
            }
        };
        if let Err(e) = &result {
            if ex.broken.is_none() {
                ex.broken = Some(e.clone());
                if e.status() != Status::ABORTED {
                    tracing::warn!(rank = self.rank, "host communicator failed: {e}");
                }
            }
        }
        ex.next = ex.next.max(ticket + 1);
        let wake = ex.waiting > 0;
        drop(ex);
        if wake {
            self.turn.notify_all();
        }
        result
    }
}

/// The state an algorithm runs with.
pub struct Ctx<'a> {
    pub comm: &'a HostComm,
    gen: u64,
}

impl Ctx<'_> {
    fn n(&self) -> usize {
        self.comm.nranks
    }
    fn me(&self) -> usize {
        self.comm.rank
    }
    fn seg(&self) -> &Segment {
        &self.comm.seg
    }
    /// The parity the next barrier publishes.
    fn next_parity(&self) -> usize {
        ((self.gen + 1) % 2) as usize
    }
    fn slot_bytes(&self) -> usize {
        self.seg().layout.slot_bytes
    }

    /// A barrier; returns the parity of the buffers it published.
    fn barrier(&mut self, what: &str) -> Result<usize> {
        self.gen += 1;
        barrier(self.seg(), self.me(), self.gen, self.comm.timeout, what)?;
        Ok((self.gen % 2) as usize)
    }

    /// Starts an operation: publishes its descriptor (and `small`, a payload of at most
    /// [`LINE_BYTES`]) in this rank's line for the next generation, waits until every rank has
    /// published that generation (a barrier), and checks that every rank called the same
    /// operation. Returns the parity of what was published.
    fn agree(&mut self, d: &Desc, small: Option<&[u8]>) -> Result<usize> {
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
    fn line_data(&self, p: usize, r: usize) -> *const u8 {
        self.seg().rank(r).line[p].data.get() as *const u8
    }

    /// Rank `r`'s slot of parity `p`.
    fn slot(&self, p: usize, r: usize) -> *mut u8 {
        self.seg().slot(p, r)
    }

    /// Largest whole number of elements of `es` bytes, aligned to a cache line, within `bytes`.
    fn fit(bytes: usize, es: usize) -> usize {
        (bytes / LINE * LINE) / es * es
    }
}

/// Element range `[lo, hi)` of share `r` when `n` elements are split over `k` ranks.
fn share(n: usize, k: usize, r: usize) -> (usize, usize) {
    let base = n / k;
    let extra = n % k;
    let lo = r * base + r.min(extra);
    (lo, lo + base + usize::from(r < extra))
}

/// Reduces elements `[lo, hi)` of every rank's slot of parity `p` into `dst`.
///
/// # Safety
/// `dst` must hold `(hi - lo) * es` bytes, aligned for the type.
#[allow(clippy::too_many_arguments)]
unsafe fn reduce_slots(
    ctx: &Ctx<'_>,
    p: usize,
    lo: usize,
    hi: usize,
    es: usize,
    dtype: DataType,
    op: ReduceOp,
    dst: &mut [u8],
) -> Result<()> {
    let len = (hi - lo) * es;
    let srcs: Vec<&[u8]> = (0..ctx.n())
        // SAFETY: each slot holds at least `hi * es` published bytes for this phase.
        .map(|r| unsafe { std::slice::from_raw_parts(ctx.slot(p, r).add(lo * es), len) })
        .collect();
    reduce(&mut dst[..len], &srcs, dtype, op)
}

/// All-reduce (and reduce to `root` when `root` is Some).
///
/// # Safety
/// `send`/`recv` are valid for `count` elements (recv only on the root for a reduce).
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_reduce(
    ctx: &mut Ctx<'_>,
    send: *const u8,
    recv: *mut u8,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    root: Option<usize>,
) -> Result<()> {
    let es = elem_size(dtype)?;
    if op.name().is_none() {
        return Err(Error::invalid_argument(format!(
            "unknown reduction op {}",
            op.0
        )));
    }
    let kind = if root.is_some() {
        Kind::Reduce
    } else {
        Kind::AllReduce
    };
    let desc = Desc {
        kind,
        count: count as u64,
        dtype,
        op,
        root: root.map_or(-1, |r| r as i64),
    };
    let bytes = count * es;
    let writes = |ctx: &Ctx<'_>| root.is_none_or(|r| r == ctx.me());
    if bytes <= LINE_BYTES {
        // The data rides in the line that announces the call: one round trip in all.
        // SAFETY: send holds `bytes` bytes.
        let data = unsafe { std::slice::from_raw_parts(send, bytes) };
        let p = ctx.agree(&desc, Some(data))?;
        if writes(ctx) && bytes > 0 {
            with_scratch(bytes, |s| -> Result<()> {
                let srcs: Vec<&[u8]> = (0..ctx.n())
                    // SAFETY: every rank's line of parity p holds `bytes` published bytes,
                    // 8-byte aligned, until the next generation of that parity.
                    .map(|r| unsafe { std::slice::from_raw_parts(ctx.line_data(p, r), bytes) })
                    .collect();
                reduce(s, &srcs, dtype, op)?;
                // SAFETY: recv holds bytes.
                unsafe { copy(recv, s.as_ptr(), bytes) };
                Ok(())
            })?;
        }
        return Ok(());
    }
    if bytes <= ONE_SHOT_BYTES.min(ctx.slot_bytes()) {
        let p = ctx.next_parity();
        // SAFETY: the slot holds slot_bytes >= bytes; send holds bytes.
        unsafe { copy(ctx.slot(p, ctx.me()), send, bytes) };
        let p = ctx.agree(&desc, None)?;
        if writes(ctx) && bytes > 0 {
            with_scratch(bytes, |s| -> Result<()> {
                // SAFETY: scratch holds bytes, 8-aligned.
                unsafe { reduce_slots(ctx, p, 0, count, es, dtype, op, s) }?;
                // SAFETY: recv holds bytes.
                unsafe { copy(recv, s.as_ptr(), bytes) };
                Ok(())
            })?;
        }
        return Ok(());
    }
    let chunk = Ctx::fit(ctx.slot_bytes(), es) / es;
    let mut done = 0;
    let mut first = true;
    while done < count || first {
        let n = chunk.min(count - done);
        let p = ctx.next_parity();
        // SAFETY: n elements fit in the slot; send holds count elements.
        unsafe { copy(ctx.slot(p, ctx.me()), send.add(done * es), n * es) };
        let p = if first {
            ctx.agree(&desc, None)?
        } else {
            ctx.barrier(kind.name())?
        };
        first = false;
        let (lo, hi) = share(n, ctx.n(), ctx.me());
        let q = ctx.next_parity();
        let res = ctx.seg().result(q);
        if hi > lo {
            // SAFETY: the result buffer holds a whole chunk; the share is within it and aligned.
            let dst = unsafe { std::slice::from_raw_parts_mut(res.add(lo * es), (hi - lo) * es) };
            // SAFETY: as above.
            unsafe { reduce_slots(ctx, p, lo, hi, es, dtype, op, dst) }?;
        }
        ctx.barrier(kind.name())?;
        if writes(ctx) {
            // SAFETY: the result holds n elements; recv holds count.
            unsafe { copy(recv.add(done * es), res, n * es) };
        }
        done += n;
    }
    Ok(())
}

/// Broadcast from `root`.
///
/// # Safety
/// `send` valid for `count` elements on the root; `recv` on every rank.
pub unsafe fn broadcast(
    ctx: &mut Ctx<'_>,
    send: *const u8,
    recv: *mut u8,
    count: usize,
    dtype: DataType,
    root: usize,
) -> Result<()> {
    let es = elem_size(dtype)?;
    let desc = Desc {
        kind: Kind::Broadcast,
        count: count as u64,
        dtype,
        op: ReduceOp::SUM,
        root: root as i64,
    };
    let chunk = Ctx::fit(ctx.slot_bytes(), es);
    let bytes = count * es;
    let mut done = 0;
    let mut first = true;
    while done < bytes || first {
        let n = chunk.min(bytes - done);
        let p = ctx.next_parity();
        if ctx.me() == root {
            // SAFETY: n <= slot bytes; send holds bytes.
            unsafe { copy(ctx.slot(p, root), send.add(done), n) };
        }
        let p = if first {
            ctx.agree(&desc, None)?
        } else {
            ctx.barrier("broadcast")?
        };
        first = false;
        // SAFETY: recv holds bytes; the root's slot holds n published bytes.
        unsafe { copy(recv.add(done), ctx.slot(p, root), n) };
        done += n;
    }
    Ok(())
}

/// All-gather (or gather to `root`).
///
/// # Safety
/// `send` valid for `count` elements; `recv` for `count * nranks` (only on the root for gather).
pub unsafe fn all_gather(
    ctx: &mut Ctx<'_>,
    send: *const u8,
    recv: *mut u8,
    count: usize,
    dtype: DataType,
    root: Option<usize>,
) -> Result<()> {
    let es = elem_size(dtype)?;
    let kind = if root.is_some() {
        Kind::Gather
    } else {
        Kind::AllGather
    };
    let desc = Desc {
        kind,
        count: count as u64,
        dtype,
        op: ReduceOp::SUM,
        root: root.map_or(-1, |r| r as i64),
    };
    let chunk = Ctx::fit(ctx.slot_bytes(), es);
    let bytes = count * es;
    let mut done = 0;
    let mut first = true;
    while done < bytes || first {
        let n = chunk.min(bytes - done);
        let p = ctx.next_parity();
        // SAFETY: n fits the slot; send holds bytes. In place, the own block is copied out before
        // any peer data lands in recv (peers' blocks are elsewhere in recv).
        unsafe { copy(ctx.slot(p, ctx.me()), send.add(done), n) };
        let p = if first {
            ctx.agree(&desc, None)?
        } else {
            ctx.barrier(kind.name())?
        };
        first = false;
        if root.is_none_or(|r| r == ctx.me()) {
            for r in 0..ctx.n() {
                // SAFETY: recv holds nranks * bytes.
                unsafe { copy(recv.add(r * bytes + done), ctx.slot(p, r), n) };
            }
        }
        done += n;
    }
    Ok(())
}

/// Block exchanges where every rank sends block `d` of its input to rank `d`: reduce-scatter
/// (`op` Some), all-to-all, and scatter (`root` Some: only the root's blocks travel).
///
/// # Safety
/// `send` valid for `count * nranks` elements (on the root only, for scatter); `recv` for
/// `count * nranks` for all-to-all, `count` otherwise.
#[allow(clippy::too_many_arguments)]
pub unsafe fn exchange(
    ctx: &mut Ctx<'_>,
    kind: Kind,
    send: *const u8,
    recv: *mut u8,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    root: Option<usize>,
) -> Result<()> {
    let es = elem_size(dtype)?;
    if kind == Kind::ReduceScatter && op.name().is_none() {
        return Err(Error::invalid_argument(format!(
            "unknown reduction op {}",
            op.0
        )));
    }
    let desc = Desc {
        kind,
        count: count as u64,
        dtype,
        op,
        root: root.map_or(-1, |r| r as i64),
    };
    let n = ctx.n();
    let sub = Ctx::fit(ctx.slot_bytes() / n, es);
    if sub == 0 {
        return Err(Error::internal("slot too small for this many ranks"));
    }
    let block = count * es;
    // The whole input of reduce-scatter and all-to-all is read before any output is written, so
    // in place works chunk by chunk only when recv is not send: stage the input when it is.
    let staged: Option<Vec<u8>> = if std::ptr::eq(send, recv) && block > 0 && root.is_none() {
        // SAFETY: send holds count * nranks elements.
        Some(unsafe { std::slice::from_raw_parts(send, block * n) }.to_vec())
    } else {
        None
    };
    let send = staged.as_ref().map_or(send, |v| v.as_ptr());
    let mut done = 0;
    let mut first = true;
    while done < block || first {
        let m = sub.min(block - done);
        let p = ctx.next_parity();
        let publishes = root.is_none_or(|r| r == ctx.me());
        if publishes {
            for d in 0..n {
                // SAFETY: sub-slot d of my slot holds `sub` bytes; send holds block * n.
                unsafe {
                    copy(
                        ctx.slot(p, ctx.me()).add(d * sub),
                        send.add(d * block + done),
                        m,
                    )
                };
            }
        }
        let p = if first {
            ctx.agree(&desc, None)?
        } else {
            ctx.barrier(kind.name())?
        };
        first = false;
        let me = ctx.me();
        match kind {
            Kind::ReduceScatter if m > 0 => {
                let srcs: Vec<&[u8]> = (0..n)
                    // SAFETY: sub-slot `me` of every slot holds m published bytes, aligned.
                    .map(|r| unsafe { std::slice::from_raw_parts(ctx.slot(p, r).add(me * sub), m) })
                    .collect();
                with_scratch(m, |s| -> Result<()> {
                    reduce(s, &srcs, dtype, op)?;
                    // SAFETY: recv holds block bytes.
                    unsafe { copy(recv.add(done), s.as_ptr(), m) };
                    Ok(())
                })?;
            }
            Kind::AllToAll => {
                for r in 0..n {
                    // SAFETY: recv holds block * n bytes; the sub-slot holds m bytes.
                    unsafe { copy(recv.add(r * block + done), ctx.slot(p, r).add(me * sub), m) };
                }
            }
            Kind::Scatter => {
                let r = root.unwrap_or(0);
                // SAFETY: recv holds block bytes; the root's sub-slot holds m bytes.
                unsafe { copy(recv.add(done), ctx.slot(p, r).add(me * sub), m) };
            }
            _ => {}
        }
        done += m;
    }
    Ok(())
}

/// All-to-all with per-peer counts and displacements (elements).
///
/// # Safety
/// `send` valid up to the largest `send_displs[d] + send_counts[d]`, `recv` likewise.
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_to_allv(
    ctx: &mut Ctx<'_>,
    send: *const u8,
    sc: &[usize],
    sd: &[usize],
    recv: *mut u8,
    rc: &[usize],
    rd: &[usize],
    dtype: DataType,
) -> Result<()> {
    let es = elem_size(dtype)?;
    let n = ctx.n();
    let sub = Ctx::fit(ctx.slot_bytes() / n, es);
    let local_max = sc.iter().chain(rc).copied().max().unwrap_or(0) * es;
    let desc = Desc {
        kind: Kind::AllToAllV,
        count: local_max as u64,
        dtype,
        op: ReduceOp::SUM,
        root: -1,
    };
    let staged: Option<Vec<u8>> = if std::ptr::eq(send, recv) {
        let end = (0..n).map(|d| (sd[d] + sc[d]) * es).max().unwrap_or(0);
        // SAFETY: send is valid up to `end`.
        Some(unsafe { std::slice::from_raw_parts(send, end) }.to_vec())
    } else {
        None
    };
    let send = staged.as_ref().map_or(send, |v| v.as_ptr());
    // Every rank must run the same number of rounds: agree on the largest block first.
    let p0 = ctx.agree(&desc, None)?;
    let global_max = (0..n)
        .map(|r| ctx.seg().rank(r).line[p0].desc[1].load(Ordering::Relaxed))
        .max()
        .unwrap_or(0) as usize;
    let mut done = 0;
    while done < global_max {
        let p = ctx.next_parity();
        for d in 0..n {
            let len = sc[d] * es;
            let m = sub.min(len.saturating_sub(done));
            // SAFETY: sub-slot d holds `sub` bytes; send holds the block.
            unsafe {
                copy(
                    ctx.slot(p, ctx.me()).add(d * sub),
                    send.add(sd[d] * es + done),
                    m,
                )
            };
        }
        let p = ctx.barrier("all_to_allv")?;
        let me = ctx.me();
        for r in 0..n {
            let len = rc[r] * es;
            let m = sub.min(len.saturating_sub(done));
            // SAFETY: recv holds the block; the sub-slot holds what r published.
            unsafe { copy(recv.add(rd[r] * es + done), ctx.slot(p, r).add(me * sub), m) };
        }
        done += sub;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn shares_cover_everything_once() {
        for n in [0, 1, 5, 7, 64, 1000] {
            for k in 1..9 {
                let mut next = 0;
                for r in 0..k {
                    let (lo, hi) = share(n, k, r);
                    assert_eq!(lo, next);
                    next = hi;
                }
                assert_eq!(next, n);
            }
        }
    }
}
