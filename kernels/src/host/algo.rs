//! The algorithms on the host device, over the scratch window as this process maps it: every
//! rank's window at a real address of this process (the flat range, or one mapping per peer).
//!
//! Each function runs one call to its end on the calling thread (the stream's worker, in
//! stream order), waiting on peers through the signal slots of [`crate::layout`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferrocx::window::collectives::{CollectiveError, WindowAlgo};

use crate::element::{reduce, Elem, Op};
use crate::layout::{granule_elems, part, ring_value, Layout, Signal};

/// Yields of a waiting rank before it starts to sleep.
const YIELDS: u32 = 256;
/// The longest nap of a waiting rank: the latency a sleeping waiter adds at most.
const MAX_NAP: Duration = Duration::from_micros(200);

/// What every call of one communicator shares: the layout and the ranks' scratch windows.
pub(crate) struct Ctx {
    /// The layout of every rank's scratch window.
    pub layout: Layout,
    /// This rank.
    pub rank: usize,
    /// Ranks.
    pub world: usize,
    /// Each rank's scratch window, as this process addresses it.
    pub peers: Vec<u64>,
    /// The deadline of one wait on the peers of a step.
    pub timeout: Duration,
    /// Polls before a waiter yields (fewer when ranks outnumber cores).
    pub spin: u32,
}

/// One all-reduce: `count` elements at `send` into `recv` (addresses of this process).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    /// Input.
    pub send: u64,
    /// Output (may be `send`).
    pub recv: u64,
    /// Elements, at least 1.
    pub count: usize,
    /// Element type.
    pub elem: Elem,
    /// Reduction.
    pub op: Op,
}

/// `len` bytes at `addr`.
///
/// # Safety
/// `addr..addr + len` is mapped, readable memory of this process that nobody writes while the
/// slice lives (the algorithms' signals order every write before the reads it feeds).
unsafe fn bytes<'a>(addr: u64, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// `len` writable bytes at `addr`.
///
/// # Safety
/// `addr..addr + len` is mapped, writable memory of this process that nobody else reads or
/// writes while the slice lives.
unsafe fn bytes_mut<'a>(addr: u64, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

impl Ctx {
    /// The slot where `src` signals `kind` to `owner`.
    fn slot(&self, owner: usize, kind: Signal, src: usize) -> &AtomicU64 {
        let addr = self.peers[owner] + self.layout.signal_offset(kind, 0, src) as u64;
        // SAFETY: the slot lies inside `owner`'s scratch window (the layout's signal region),
        // which stays mapped while the communicator's window collectives live; it is 64-byte
        // aligned (windows are page-aligned, slots SIGNAL_STRIDE apart) and only ever accessed
        // atomically, by every process that maps it.
        unsafe { AtomicU64::from_ptr(addr as *mut u64) }
    }

    /// Tells `dst` that this rank reached `value` of `kind`: a store-release, so everything
    /// this rank wrote before is visible to a waiter that sees the value.
    fn put(&self, dst: usize, kind: Signal, value: u64) {
        self.slot(dst, kind, self.rank)
            .store(value, Ordering::Release);
    }

    /// [`Ctx::put`] to every peer.
    fn put_all(&self, kind: Signal, value: u64) {
        for q in (0..self.world).filter(|&q| q != self.rank) {
            self.put(q, kind, value);
        }
    }

    /// Waits until `src` signalled at least `value` of `kind` to this rank, or the deadline.
    fn wait(
        &self,
        algo: WindowAlgo,
        epoch: u64,
        src: usize,
        kind: Signal,
        value: u64,
        deadline: Instant,
    ) -> Result<(), CollectiveError> {
        let slot = self.slot(self.rank, kind, src);
        let mut polls = 0u32;
        let mut nap = Duration::from_micros(2);
        loop {
            if slot.load(Ordering::Acquire) >= value {
                return Ok(());
            }
            if polls < self.spin {
                std::hint::spin_loop();
            } else if polls < self.spin + YIELDS {
                std::thread::yield_now();
            } else {
                if Instant::now() >= deadline {
                    return Err(CollectiveError::PeerTimeout {
                        algo,
                        peer: src,
                        what: match kind {
                            Signal::Arrive => "its input".to_string(),
                            Signal::Reduced => "its reduced share".to_string(),
                            Signal::Ring => {
                                format!("ring step {}", value - ring_value(epoch, self.world, 0))
                            }
                        },
                        epoch,
                        waited: self.timeout,
                    });
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(MAX_NAP);
            }
            polls = polls.saturating_add(1);
        }
    }

    /// [`Ctx::wait`] on every peer, in rank order; a failure names the first peer missing.
    fn wait_all(
        &self,
        algo: WindowAlgo,
        epoch: u64,
        kind: Signal,
        value: u64,
    ) -> Result<(), CollectiveError> {
        let deadline = Instant::now() + self.timeout;
        for q in (0..self.world).filter(|&q| q != self.rank) {
            self.wait(algo, epoch, q, kind, value, deadline)?;
        }
        Ok(())
    }

    /// The address of byte `offset` of `owner`'s scratch window.
    fn at(&self, owner: usize, offset: usize) -> u64 {
        self.peers[owner] + offset as u64
    }
}

/// Copies `call`'s input to its output (one rank: nothing to reduce).
///
/// # Safety
/// As [`one_shot`].
unsafe fn copy_through(call: &Call) {
    let len = call.count * call.elem.size();
    if call.send != call.recv {
        // SAFETY: the caller's buffers hold `len` bytes; distinct buffers do not overlap.
        let (src, dst) = unsafe { (bytes(call.send, len), bytes_mut(call.recv, len)) };
        dst.copy_from_slice(src);
    }
}

/// One-shot all-reduce of round `epoch`: publish the input in this round's parity, signal
/// every peer, wait for every peer's, reduce every rank's input (in rank order, so every rank
/// computes the same bits) into the output.
///
/// # Safety
/// `call.send` and `call.recv` hold `count` elements (the same buffer or disjoint ones) and
/// stay valid while the call runs; the message fits one parity; `ctx.peers` are the live
/// scratch windows of this communicator; every rank runs the same sequence of rounds.
pub(crate) unsafe fn one_shot(ctx: &Ctx, call: &Call, epoch: u64) -> Result<(), CollectiveError> {
    if ctx.world == 1 {
        // SAFETY: forwarded.
        unsafe { copy_through(call) };
        return Ok(());
    }
    let len = call.count * call.elem.size();
    let parity = ctx.layout.parity_offset(epoch);
    {
        // SAFETY: this rank's parity of this round is written only by this rank, and no peer
        // reads it until the signal below (peers finished round epoch - 2 with it before they
        // signalled round epoch - 1, which this rank awaited).
        let mine = unsafe { bytes_mut(ctx.at(ctx.rank, parity), len) };
        // SAFETY: the caller's input.
        mine.copy_from_slice(unsafe { bytes(call.send, len) });
    }
    ctx.put_all(Signal::Arrive, epoch);
    ctx.wait_all(WindowAlgo::OneShot, epoch, Signal::Arrive, epoch)?;
    // SAFETY: every rank's parity holds its input of this round (signalled with release,
    // awaited with acquire) and nobody writes it before round epoch + 2.
    let srcs: Vec<&[u8]> = (0..ctx.world)
        .map(|q| unsafe { bytes(ctx.at(q, parity), len) })
        .collect();
    // SAFETY: the caller's output, disjoint from the scratch windows.
    let out = unsafe { bytes_mut(call.recv, len) };
    reduce(out, &srcs, call.elem, call.op);
    Ok(())
}

/// Two-shot all-reduce of round `epoch`: publish the input, signal; reduce this rank's share
/// of every rank's input (rank order) into the output and back into this rank's parity,
/// signal; copy every other rank's reduced share into the output.
///
/// # Safety
/// As [`one_shot`].
pub(crate) unsafe fn two_shot(ctx: &Ctx, call: &Call, epoch: u64) -> Result<(), CollectiveError> {
    if ctx.world == 1 {
        // SAFETY: forwarded.
        unsafe { copy_through(call) };
        return Ok(());
    }
    let es = call.elem.size();
    let len = call.count * es;
    let parity = ctx.layout.parity_offset(epoch);
    let g = granule_elems(es);
    let share = |q: usize| {
        let (lo, hi) = part(call.count, ctx.world, q, g);
        (lo * es, (hi - lo) * es)
    };
    {
        // SAFETY: as in one_shot.
        let mine = unsafe { bytes_mut(ctx.at(ctx.rank, parity), len) };
        // SAFETY: the caller's input.
        mine.copy_from_slice(unsafe { bytes(call.send, len) });
    }
    ctx.put_all(Signal::Arrive, epoch);
    ctx.wait_all(WindowAlgo::TwoShot, epoch, Signal::Arrive, epoch)?;
    let (off, n) = share(ctx.rank);
    {
        // SAFETY: this rank's share of every rank's parity holds that rank's input, and only
        // this rank reads that share in this phase.
        let srcs: Vec<&[u8]> = (0..ctx.world)
            .map(|q| unsafe { bytes(ctx.at(q, parity + off), n) })
            .collect();
        // SAFETY: the caller's output, disjoint from the scratch windows.
        let out = unsafe { bytes_mut(call.recv + off as u64, n) };
        reduce(out, &srcs, call.elem, call.op);
    }
    {
        // SAFETY: this rank's share of its own parity was read only by this rank, above; peers
        // read it after the signal below.
        let mine = unsafe { bytes_mut(ctx.at(ctx.rank, parity + off), n) };
        // SAFETY: the share of the output just written.
        mine.copy_from_slice(unsafe { bytes(call.recv + off as u64, n) });
    }
    ctx.put_all(Signal::Reduced, epoch);
    let deadline = Instant::now() + ctx.timeout;
    for q in (0..ctx.world).filter(|&q| q != ctx.rank) {
        ctx.wait(
            WindowAlgo::TwoShot,
            epoch,
            q,
            Signal::Reduced,
            epoch,
            deadline,
        )?;
        let (off, n) = share(q);
        // SAFETY: rank q's reduced share, signalled; the output's share q is written only
        // here.
        let (src, dst) = unsafe {
            (
                bytes(ctx.at(q, parity + off), n),
                bytes_mut(call.recv + off as u64, n),
            )
        };
        dst.copy_from_slice(src);
    }
    Ok(())
}

/// Ring all-reduce from round `first_epoch` on, one round per parity's worth of the message
/// ([`Layout::ring_rounds`]).
///
/// In a round of `n` elements, piece `j` is part `j` of `n` over the ranks. At step `s` of the
/// reduce-scatter, rank `r` takes piece `p = r - s` (mod world): its input of that piece,
/// plus (for `s > 0`) the partial sum its left neighbour published in its chunk slot `p` at
/// step `s - 1`, goes into its own chunk slot `p`, and it signals its right neighbour. After
/// the last step rank `r` holds piece `r + 1` reduced over every rank, and signals everyone;
/// the all-gather then reads each piece `j` from the chunk slot `j` of its owner, rank `j - 1`.
///
/// # Safety
/// As [`one_shot`], for messages of any size.
pub(crate) unsafe fn ring(ctx: &Ctx, call: &Call, first_epoch: u64) -> Result<(), CollectiveError> {
    if ctx.world == 1 {
        // SAFETY: forwarded.
        unsafe { copy_through(call) };
        return Ok(());
    }
    let es = call.elem.size();
    let round = ctx.layout.parity_bytes() / es;
    let mut done = 0;
    let mut epoch = first_epoch;
    while done < call.count {
        let n = round.min(call.count - done);
        // SAFETY: forwarded, for elements done..done + n.
        unsafe { ring_round(ctx, call, done, n, epoch) }?;
        done += n;
        epoch += 1;
    }
    Ok(())
}

/// One round of [`ring`]: elements `done..done + n` of the call, in round `epoch`.
///
/// # Safety
/// As [`ring`].
unsafe fn ring_round(
    ctx: &Ctx,
    call: &Call,
    done: usize,
    n: usize,
    epoch: u64,
) -> Result<(), CollectiveError> {
    let (p_count, me) = (ctx.world, ctx.rank);
    let left = (me + p_count - 1) % p_count;
    let right = (me + 1) % p_count;
    let es = call.elem.size();
    let g = granule_elems(es);
    let piece = |j: usize| {
        let (lo, hi) = part(n, p_count, j, g);
        ((done + lo) * es, (hi - lo) * es)
    };
    let slot = |owner: usize, j: usize| ctx.at(owner, ctx.layout.slot_offset(epoch, j));
    for step in 0..p_count {
        let p = (me + p_count - step) % p_count;
        let (off, len) = piece(p);
        // SAFETY: the caller's input of piece p.
        let input = unsafe { bytes(call.send + off as u64, len) };
        // SAFETY: this rank's chunk slot p of this round: written once per round, here, and
        // read by peers only after the signal below.
        let mine = unsafe { bytes_mut(slot(me, p), len) };
        if step == 0 {
            mine.copy_from_slice(input);
        } else {
            let deadline = Instant::now() + ctx.timeout;
            let want = ring_value(epoch, p_count, step - 1);
            ctx.wait(WindowAlgo::Ring, epoch, left, Signal::Ring, want, deadline)?;
            // SAFETY: the left neighbour's slot p holds its partial of step - 1 (signalled).
            let partial = unsafe { bytes(slot(left, p), len) };
            reduce(mine, &[input, partial], call.elem, call.op);
        }
        let value = ring_value(epoch, p_count, step);
        if step + 1 < p_count {
            ctx.put(right, Signal::Ring, value);
        } else {
            ctx.put_all(Signal::Ring, value);
        }
    }
    let deadline = Instant::now() + ctx.timeout;
    let last = ring_value(epoch, p_count, p_count - 1);
    for j in 0..p_count {
        let owner = (j + p_count - 1) % p_count;
        if owner != me {
            ctx.wait(WindowAlgo::Ring, epoch, owner, Signal::Ring, last, deadline)?;
        }
        let (off, len) = piece(j);
        // SAFETY: piece j reduced over every rank, in its owner's slot j (signalled); the
        // output's piece j is written only here.
        let (src, dst) = unsafe {
            (
                bytes(slot(owner, j), len),
                bytes_mut(call.recv + off as u64, len),
            )
        };
        dst.copy_from_slice(src);
    }
    Ok(())
}
