//! Point-to-point transfers through per-pair rings in the segment, and their progress engine.
//!
//! Each ordered pair (src, dst) has a ring: the sender advances `head`, the receiver `tail`
//! (both monotonic byte counts). A message is a 16-byte header (its length) followed by the
//! payload, so a receive that expects a different size fails with both sizes named. A group's
//! transfers progress together, each as far as its ring allows, so any set of sends and
//! receives completes in any order without deadlock.

use std::sync::atomic::Ordering;

use ferrocx_plugin_sdk::{Error, Result};

use super::comm::HostComm;
use super::sync::{notify, wait_until};

const HDR: usize = 16;

/// One transfer of a group.
pub enum Transfer {
    /// Send `len` bytes at `ptr` to `peer`.
    Send {
        peer: usize,
        ptr: *const u8,
        len: usize,
    },
    /// Receive `len` bytes from `peer` into `ptr`.
    Recv {
        peer: usize,
        ptr: *mut u8,
        len: usize,
    },
}

// SAFETY: the pointers are the caller's buffers, valid until the operation completes on the
// stream (the ABI's contract); they are only used by the worker that runs the group.
unsafe impl Send for Transfer {}

struct Progress {
    t: Transfer,
    /// Bytes of header + payload moved so far.
    moved: usize,
    hdr: [u8; HDR],
}

/// Copies `n` bytes into the ring at logical position `pos` (wrapping).
///
/// # Safety
/// `ring` has `cap` bytes; `src` has `n` bytes.
unsafe fn ring_write(ring: *mut u8, cap: usize, pos: u64, src: *const u8, n: usize) {
    let off = (pos % cap as u64) as usize;
    let first = n.min(cap - off);
    // SAFETY: both parts are within the ring and the source.
    unsafe {
        std::ptr::copy_nonoverlapping(src, ring.add(off), first);
        std::ptr::copy_nonoverlapping(src.add(first), ring, n - first);
    }
}

/// Copies `n` bytes out of the ring at logical position `pos` (wrapping).
///
/// # Safety
/// `ring` has `cap` bytes; `dst` has room for `n`.
unsafe fn ring_read(ring: *const u8, cap: usize, pos: u64, dst: *mut u8, n: usize) {
    let off = (pos % cap as u64) as usize;
    let first = n.min(cap - off);
    // SAFETY: both parts are within the ring and the destination.
    unsafe {
        std::ptr::copy_nonoverlapping(ring.add(off), dst, first);
        std::ptr::copy_nonoverlapping(ring, dst.add(first), n - first);
    }
}

impl Progress {
    fn total(&self) -> usize {
        HDR + match self.t {
            Transfer::Send { len, .. } | Transfer::Recv { len, .. } => len,
        }
    }

    fn peer(&self) -> usize {
        match self.t {
            Transfer::Send { peer, .. } | Transfer::Recv { peer, .. } => peer,
        }
    }

    /// Moves as much as the ring allows; returns bytes moved.
    fn step(&mut self, comm: &HostComm) -> Result<usize> {
        let me = comm.rank;
        let cap = comm.seg.layout.ring_bytes;
        let total = self.total();
        match self.t {
            Transfer::Send { peer, ptr, len } => {
                let (ring, data) = comm.seg.ring(me, peer);
                let head = ring.head.load(Ordering::Relaxed);
                let tail = ring.tail.load(Ordering::Acquire);
                let space = cap - (head - tail) as usize;
                let n = space.min(total - self.moved);
                if n == 0 {
                    return Ok(0);
                }
                if self.moved == 0 {
                    self.hdr[..8].copy_from_slice(&(len as u64).to_le_bytes());
                }
                let mut pos = head;
                let mut left = n;
                if self.moved < HDR {
                    let h = (HDR - self.moved).min(left);
                    // SAFETY: within the header array and the ring.
                    unsafe { ring_write(data, cap, pos, self.hdr.as_ptr().add(self.moved), h) };
                    pos += h as u64;
                    left -= h;
                    self.moved += h;
                }
                if left > 0 {
                    let off = self.moved - HDR;
                    // SAFETY: the payload has `len` bytes; off + left <= len.
                    unsafe { ring_write(data, cap, pos, ptr.add(off), left) };
                    self.moved += left;
                }
                ring.head.store(head + n as u64, Ordering::SeqCst);
                notify(&comm.seg);
                Ok(n)
            }
            Transfer::Recv { peer, ptr, len } => {
                let (ring, data) = comm.seg.ring(peer, me);
                let tail = ring.tail.load(Ordering::Relaxed);
                let head = ring.head.load(Ordering::Acquire);
                let avail = (head - tail) as usize;
                let n = avail.min(total - self.moved);
                if n == 0 {
                    return Ok(0);
                }
                let mut pos = tail;
                let mut left = n;
                if self.moved < HDR {
                    let h = (HDR - self.moved).min(left);
                    // SAFETY: within the header array and the ring.
                    unsafe { ring_read(data, cap, pos, self.hdr.as_mut_ptr().add(self.moved), h) };
                    pos += h as u64;
                    left -= h;
                    self.moved += h;
                    if self.moved == HDR {
                        let sent = u64::from_le_bytes(self.hdr[..8].try_into().unwrap_or_default())
                            as usize;
                        if sent != len {
                            return Err(Error::invalid_argument(format!(
                                "recv from rank {peer}: rank {peer} sent {sent} bytes, rank {me} expects {len}"
                            )));
                        }
                    }
                }
                if left > 0 {
                    let off = self.moved - HDR;
                    // SAFETY: the buffer has `len` bytes; off + left <= len.
                    unsafe { ring_read(data, cap, pos, ptr.add(off), left) };
                    self.moved += left;
                }
                ring.tail.store(tail + n as u64, Ordering::SeqCst);
                notify(&comm.seg);
                Ok(n)
            }
        }
    }

    /// The counter the peer moves when this transfer can progress: the ring's tail for a send
    /// (space freed), its head for a receive (data arrived).
    fn watched(&self, comm: &HostComm) -> u64 {
        let me = comm.rank;
        match self.t {
            Transfer::Send { peer, .. } => comm.seg.ring(me, peer).0.tail.load(Ordering::SeqCst),
            Transfer::Recv { peer, .. } => comm.seg.ring(peer, me).0.head.load(Ordering::SeqCst),
        }
    }
}

/// Runs a set of transfers to completion, all progressing together.
pub fn run(comm: &HostComm, transfers: Vec<Transfer>) -> Result<()> {
    for t in &transfers {
        let peer = match t {
            Transfer::Send { peer, .. } | Transfer::Recv { peer, .. } => *peer,
        };
        if peer >= comm.nranks {
            return Err(Error::invalid_argument(format!(
                "peer {peer} is not a rank of {} ranks",
                comm.nranks
            )));
        }
    }
    let mut ops: Vec<Progress> = transfers
        .into_iter()
        .map(|t| Progress {
            t,
            moved: 0,
            hdr: [0; HDR],
        })
        .collect();
    loop {
        let mut moved = 0;
        // Transfers to (or from) one peer share a ring: only the oldest unfinished one of each
        // direction and peer moves, so messages never interleave and stay in issue order.
        let mut busy: Vec<(bool, usize)> = Vec::new();
        let mut watch: Vec<(usize, u64)> = Vec::new();
        for (i, op) in ops
            .iter_mut()
            .enumerate()
            .filter(|(_, o)| o.moved < o.total())
        {
            let lane = (matches!(op.t, Transfer::Send { .. }), op.peer());
            if busy.contains(&lane) {
                continue;
            }
            busy.push(lane);
            let before = op.watched(comm);
            let n = op.step(comm)?;
            moved += n;
            if n == 0 {
                watch.push((i, before));
            }
        }
        let pending: Vec<usize> = ops
            .iter()
            .filter(|o| o.moved < o.total())
            .map(|o| o.peer())
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        if moved > 0 {
            continue;
        }
        wait_until(
            &comm.seg,
            comm.rank,
            comm.timeout,
            "send/recv",
            || Ok(watch.iter().any(|(i, v)| ops[*i].watched(comm) != *v)),
            || pending.clone(),
        )?;
    }
}
