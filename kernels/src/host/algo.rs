//! The algorithms on the host device, over the scratch window as this process maps it: every
//! rank's window at a real address of this process (the flat range, or one mapping per peer).
//!
//! Each function runs one call to its end on the calling thread (the stream's worker, in
//! stream order), waiting on peers through the signal slots of [`crate::layout`].
//!
//! # Waiting
//!
//! A waiter polls its own slot: it spins [`Ctx::spin`] times (the fast path when every rank
//! has a core), yields [`Ctx::yields`] times, then sleeps until the deadline. On Linux it
//! sleeps in the kernel on a futex and the peer's [`Ctx::put`] wakes it; elsewhere it naps,
//! for 2 µs doubling up to 200 µs (`MAX_NAP`), and polls again.
//!
//! The futex: a slot's value is 64 bits and a futex word 32, so the futex word is the low
//! half of the value itself (see [`SlotWords`]). Values only grow and a peer is at most a
//! couple of rounds ahead of a waiter on its slot, so a change of the value always changes its
//! low half (a change of a multiple of 2^32 would need 2^32 rounds while the waiter slept, and
//! would cost only the sleep's timeout, never a hang). A put therefore needs no second word to
//! bump: its store is what makes a sleeping waiter's futex compare fail. The same cache line
//! holds a 32-bit `waiters` count, so that a put makes the `FUTEX_WAKE` system call only when
//! a waiter may be asleep; on the fast path (nobody asleep) a put costs a load more.
//!
//! No wake-up can be lost (the waiter is `W`, the putter `P`; every access `SeqCst`):
//!
//! ```text
//! W1 waiters += 1          P1 value = v
//! W2 seen = value          P2 if waiters > 0: FUTEX_WAKE(low(value))
//! W3 if seen < v: FUTEX_WAIT(low(value), low(seen), time left)
//! W4 waiters -= 1
//! ```
//!
//! `SeqCst` operations fall in one total order consistent with each thread's program order.
//! If `P1` precedes `W2` in it, `W2` reads `v` (or later) and `W` does not sleep. Otherwise
//! `W2` read an older value, so `W2` precedes `P1`, hence `W1 < W2 < P1 < P2`: `P2` reads
//! `W1`'s increment (or a later count: `W4`'s decrement only once `W` has left `W3` and polls
//! again), and `P` calls `FUTEX_WAKE` after its store. The kernel compares the futex word and
//! queues the waiter atomically with respect to `FUTEX_WAKE` on the same word (futex(2)):
//! either the compare in `W3` sees `P1`'s store (the low half changed: it returns at once) or
//! `W` is queued before the wake and is woken by it. Any other return (a signal, a spurious
//! wake-up, the timeout) goes back to the poll, which re-reads the value before it checks the
//! deadline, so the deadline (and the peer named when it passes) is as before: a dead peer
//! costs the timeout, never a hang. The futex is not process-private (no
//! `FUTEX_PRIVATE_FLAG`): the kernel keys it by the shared-memory page, so processes that map
//! the window at different addresses meet on it.
//!
//! The cost on the fast path: a put is a `SeqCst` store (`xchg` on x86, which waits for the
//! cache line) and a load from the same line; a waiter that finds its value while spinning or
//! yielding makes no system call and touches no other word.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferrocx::window::collectives::{CollectiveError, WindowAlgo};

use crate::element::{reduce, Elem, Op};
use crate::layout::{granule_elems, part, ring_value, Layout, Signal, SIGNAL_STRIDE};

/// Yields of a waiting rank before it sleeps.
pub(crate) const YIELDS: u32 = 256;
/// The longest nap of a waiting rank where there is no futex: the latency a sleeping waiter
/// adds at most there.
#[cfg(not(target_os = "linux"))]
const MAX_NAP: Duration = Duration::from_micros(200);

/// A signal slot as the host backend uses it: the value of [`crate::layout`] (only ever
/// stored by the source, growing) and, in the same cache line, how many of the owner's threads
/// announced that they will sleep on it (0 in a zeroed window; only the owner changes it).
#[repr(C)]
struct SlotWords {
    /// The signal's value.
    value: AtomicU64,
    /// Waiters that may be asleep on the value's futex word (Linux).
    waiters: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<SlotWords>() <= SIGNAL_STRIDE);
const _: () = assert!(std::mem::align_of::<SlotWords>() <= SIGNAL_STRIDE);

/// The futex system calls on a slot's value (its low 32 bits): the core's, shared with the
/// host CCL.
#[cfg(target_os = "linux")]
mod futex {
    pub(super) use ferrocx::futex::{wait_low as wait, wake_low as wake};
}

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
    /// Yields of a waiter before it sleeps.
    pub yields: u32,
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
    fn slot(&self, owner: usize, kind: Signal, src: usize) -> &SlotWords {
        let addr = self.peers[owner] + self.layout.signal_offset(kind, 0, src) as u64;
        // SAFETY: the slot lies inside `owner`'s scratch window (the layout's signal region,
        // SIGNAL_STRIDE >= size_of::<SlotWords>() bytes a slot), which stays mapped while the
        // communicator's window collectives live; it is 64-byte aligned (windows are
        // page-aligned, slots SIGNAL_STRIDE apart) and only ever accessed atomically, by every
        // process that maps it, so a shared reference to its atomics is sound.
        unsafe { &*(addr as *const SlotWords) }
    }

    /// Tells `dst` that this rank reached `value` of `kind`: a store-release, so everything
    /// this rank wrote before is visible to a waiter that sees the value; on Linux it then
    /// wakes the waiter if it may be asleep (see the module's notes for the order).
    fn put(&self, dst: usize, kind: Signal, value: u64) {
        let slot = self.slot(dst, kind, self.rank);
        #[cfg(target_os = "linux")]
        {
            // P1, P2: SeqCst (a store-release too), so that either the waiter's re-check
            // sees the value or this load sees its announcement.
            slot.value.store(value, Ordering::SeqCst);
            if slot.waiters.load(Ordering::SeqCst) != 0 {
                futex::wake(&slot.value);
            }
        }
        #[cfg(not(target_os = "linux"))]
        slot.value.store(value, Ordering::Release);
    }

    /// [`Ctx::put`] to every peer.
    fn put_all(&self, kind: Signal, value: u64) {
        for q in (0..self.world).filter(|&q| q != self.rank) {
            self.put(q, kind, value);
        }
    }

    /// Waits until `src` signalled at least `value` of `kind` to this rank, or the deadline:
    /// spins, yields, then sleeps (see the module's notes).
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
        #[cfg(not(target_os = "linux"))]
        let mut nap = Duration::from_micros(2);
        loop {
            if slot.value.load(Ordering::Acquire) >= value {
                return Ok(());
            }
            if polls < self.spin {
                std::hint::spin_loop();
            } else if polls < self.spin.saturating_add(self.yields) {
                std::thread::yield_now();
            } else {
                let now = Instant::now();
                if now >= deadline {
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
                #[cfg(target_os = "linux")]
                {
                    // W1, W2: announce, then re-check (both SeqCst); W3 only if still short.
                    slot.waiters.fetch_add(1, Ordering::SeqCst);
                    let seen = slot.value.load(Ordering::SeqCst);
                    if seen < value {
                        futex::wait(&slot.value, seen, deadline - now);
                    }
                    // W4.
                    slot.waiters.fetch_sub(1, Ordering::SeqCst);
                }
                #[cfg(not(target_os = "linux"))]
                {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(MAX_NAP);
                }
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

/// One all-gather: `len` bytes of this rank's input at `send`; every rank's, in rank order, at
/// `recv` (this rank's place in it may be `send`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gather {
    /// Input.
    pub send: u64,
    /// Output: `world * len` bytes.
    pub recv: u64,
    /// Bytes of each rank's input, at most a parity's.
    pub len: usize,
}

/// All-gather of round `epoch`: publish the input in this round's parity, signal every peer,
/// wait for every peer's, copy every peer's input from its window into the output.
///
/// # Safety
/// `call.send` holds `len` bytes and `call.recv` `world * len` (`send` is this rank's place
/// in it or disjoint from it), valid while the call runs; `len` fits one parity; `ctx.peers`
/// are the live scratch windows of this communicator; every rank runs the same sequence of
/// rounds.
pub(crate) unsafe fn all_gather(
    ctx: &Ctx,
    call: &Gather,
    epoch: u64,
) -> Result<(), CollectiveError> {
    let len = call.len;
    let place = |q: usize| call.recv + (q * len) as u64;
    if ctx.world > 1 {
        let parity = ctx.layout.parity_offset(epoch);
        {
            // SAFETY: as in `one_shot`: this rank's parity of this round is written only here,
            // and no peer reads it before the signal below.
            let mine = unsafe { bytes_mut(ctx.at(ctx.rank, parity), len) };
            // SAFETY: the caller's input.
            mine.copy_from_slice(unsafe { bytes(call.send, len) });
        }
        ctx.put_all(Signal::Arrive, epoch);
        ctx.wait_all(WindowAlgo::OneShot, epoch, Signal::Arrive, epoch)
            .map_err(|e| match e {
                CollectiveError::PeerTimeout {
                    algo,
                    peer,
                    epoch,
                    waited,
                    ..
                } => CollectiveError::PeerTimeout {
                    algo,
                    peer,
                    what: "its all-gather input".into(),
                    epoch,
                    waited,
                },
                e => e,
            })?;
        for q in (0..ctx.world).filter(|&q| q != ctx.rank) {
            // SAFETY: peer q's parity holds its input of this round (signalled with release,
            // awaited with acquire), unwritten before round epoch + 2; the output's place of q
            // is the caller's, disjoint from the windows and from `send`.
            let (src, dst) = unsafe { (bytes(ctx.at(q, parity), len), bytes_mut(place(q), len)) };
            dst.copy_from_slice(src);
        }
    }
    if place(ctx.rank) != call.send && len > 0 {
        // SAFETY: the caller's buffers; `send` is disjoint from this rank's place (they differ
        // and the contract allows no partial overlap).
        unsafe {
            std::ptr::copy_nonoverlapping(call.send as *const u8, place(ctx.rank) as *mut u8, len)
        };
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeroed, page-aligned memory for `windows` scratch windows of `layout`: on Linux a
    /// `MAP_SHARED` mapping, as the host device's windows are, so the futex is keyed by the
    /// shared page as it is between processes.
    struct Windows {
        base: *mut u8,
        len: usize,
    }

    impl Windows {
        fn new(layout: &Layout, windows: usize) -> Windows {
            let len = layout.scratch_bytes() * windows;
            #[cfg(target_os = "linux")]
            // SAFETY: a fresh anonymous mapping; no address hint, no file.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            #[cfg(target_os = "linux")]
            assert_ne!(base, libc::MAP_FAILED, "mmap");
            #[cfg(not(target_os = "linux"))]
            // SAFETY: a non-zero size and a power-of-two alignment.
            let base = unsafe {
                std::alloc::alloc_zeroed(std::alloc::Layout::from_size_align(len, 4096).unwrap())
            };
            assert!(!base.is_null());
            Windows {
                base: base.cast(),
                len,
            }
        }

        /// Rank `rank`'s context over these windows.
        fn ctx(
            &self,
            layout: &Layout,
            rank: usize,
            timeout: Duration,
            spin: u32,
            yields: u32,
        ) -> Ctx {
            let world = layout.world();
            Ctx {
                layout: *layout,
                rank,
                world,
                peers: (0..world)
                    .map(|q| self.base as u64 + (q * layout.scratch_bytes()) as u64)
                    .collect(),
                timeout,
                spin,
                yields,
            }
        }
    }

    impl Drop for Windows {
        fn drop(&mut self) {
            #[cfg(target_os = "linux")]
            // SAFETY: the mapping made in `new`; the tests' threads have ended and their
            // contexts (declared after it) are dropped, so nothing addresses it any more.
            unsafe {
                libc::munmap(self.base.cast(), self.len);
            }
            #[cfg(not(target_os = "linux"))]
            // SAFETY: the allocation made in `new`, with the same layout.
            unsafe {
                std::alloc::dealloc(
                    self.base,
                    std::alloc::Layout::from_size_align(self.len, 4096).unwrap(),
                )
            };
        }
    }

    /// Rank 0 goes to sleep on rank 1's `Arrive` slot before rank 1 puts: it must return as
    /// soon as the put lands, not at its deadline (a lost wake-up sleeps until then).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_sleeping_waiter_is_woken_by_the_put() {
        let layout = Layout::new(2, 256);
        let windows = Windows::new(&layout, 2);
        let long = Duration::from_secs(20);
        let waiter = windows.ctx(&layout, 0, long, 0, 0);
        let putter = windows.ctx(&layout, 1, long, 0, 0);
        for epoch in 1..=5u64 {
            let returned = std::thread::scope(|s| {
                let w = s.spawn(|| {
                    let deadline = Instant::now() + long;
                    let r = waiter.wait(
                        WindowAlgo::OneShot,
                        epoch,
                        1,
                        Signal::Arrive,
                        epoch,
                        deadline,
                    );
                    (r, Instant::now())
                });
                // Until the waiter announced itself, then some more: it is asleep in the kernel.
                let slot = putter.slot(0, Signal::Arrive, 1);
                let until = Instant::now() + Duration::from_secs(5);
                while slot.waiters.load(Ordering::SeqCst) == 0 {
                    assert!(Instant::now() < until, "the waiter never went to sleep");
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(50));
                assert!(!w.is_finished(), "the waiter returned before the put");
                let put = Instant::now();
                putter.put(0, Signal::Arrive, epoch);
                let (r, at) = w.join().unwrap();
                assert_eq!(r, Ok(()));
                at - put
            });
            assert!(
                returned < Duration::from_secs(2),
                "round {epoch}: the waiter returned {returned:?} after the put (deadline 20 s)"
            );
            assert_eq!(
                waiter
                    .slot(0, Signal::Arrive, 1)
                    .waiters
                    .load(Ordering::SeqCst),
                0
            );
        }
    }

    /// Two ranks signal each other back to back with no spinning or yielding, so every wait
    /// that finds the value short sleeps on the futex: a lost wake-up would stall a round
    /// until its 20 s deadline.
    #[test]
    fn ping_pong_loses_no_wake_up() {
        let layout = Layout::new(2, 256);
        let windows = Windows::new(&layout, 2);
        let long = Duration::from_secs(20);
        let ranks = [
            windows.ctx(&layout, 0, long, 0, 0),
            windows.ctx(&layout, 1, long, 0, 0),
        ];
        let start = Instant::now();
        std::thread::scope(|s| {
            for ctx in &ranks {
                s.spawn(move || {
                    for epoch in 1..=3000u64 {
                        ctx.put_all(Signal::Arrive, epoch);
                        ctx.wait_all(WindowAlgo::OneShot, epoch, Signal::Arrive, epoch)
                            .unwrap();
                    }
                });
            }
        });
        let took = start.elapsed();
        assert!(took < Duration::from_secs(10), "3000 rounds took {took:?}");
    }

    /// A peer that never signals: the wait fails at its deadline, naming that peer (rank 1
    /// signalled, rank 2 did not), with the round and what was awaited.
    #[test]
    fn the_deadline_fires_naming_the_peer() {
        let layout = Layout::new(3, 256);
        let windows = Windows::new(&layout, 3);
        let timeout = Duration::from_millis(300);
        let me = windows.ctx(&layout, 0, timeout, 32, YIELDS);
        let one = windows.ctx(&layout, 1, timeout, 32, YIELDS);
        one.put(0, Signal::Arrive, 7);
        let start = Instant::now();
        let r = me.wait_all(WindowAlgo::OneShot, 7, Signal::Arrive, 7);
        let took = start.elapsed();
        assert_eq!(
            r,
            Err(CollectiveError::PeerTimeout {
                algo: WindowAlgo::OneShot,
                peer: 2,
                what: "its input".into(),
                epoch: 7,
                waited: timeout,
            })
        );
        assert!(r
            .unwrap_err()
            .to_string()
            .contains("rank 2 did not signal its input of round 7"));
        assert!(took >= timeout, "failed after {took:?}, before the timeout");
        assert!(
            took < timeout + Duration::from_secs(2),
            "failed only after {took:?}"
        );
        assert_eq!(
            me.slot(0, Signal::Arrive, 2).waiters.load(Ordering::SeqCst),
            0
        );
        // The ring names its step.
        let start = Instant::now();
        let want = ring_value(4, 3, 2);
        let r = me.wait(WindowAlgo::Ring, 4, 2, Signal::Ring, want, start + timeout);
        assert!(matches!(
            r,
            Err(CollectiveError::PeerTimeout { peer: 2, ref what, epoch: 4, .. }) if what == "ring step 2"
        ));
        assert!(start.elapsed() >= timeout);
    }
}
