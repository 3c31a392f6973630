//! All-gather and gather: every rank's block through its slot, chunk by chunk.

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::Result;

use super::{elem_size, par_copy, pipeline, slot_parity, Move};
use crate::ccl::ctx::{Ctx, Desc, Kind};

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
    if root.is_none() && bytes >= super::super::direct::DIRECT_MIN {
        // Every block copied straight from its rank's input (see `direct`), unless some
        // rank's input cannot be mapped; a rank whose input overlaps its output other than as
        // its own block offers nothing.
        let n = ctx.n();
        let own = std::ptr::eq(send, recv.wrapping_add(ctx.me() * bytes));
        let (lo, hi) = (recv as usize, recv as usize + bytes * n);
        let apart = (send as usize) >= hi || (send as usize) + bytes <= lo;
        let offer = if own || apart { send } else { std::ptr::null() };
        // SAFETY: `send` is the call's input (or null: no offer).
        if let Some(ins) = unsafe { super::super::direct::agree_inputs(ctx, &desc, offer) }? {
            // SAFETY: every rank's input holds `bytes` and is not written until the barrier;
            // `recv` holds n blocks, none overlapping an input but this rank's own block
            // (which is then not written).
            unsafe { super::super::direct::par_gather(ctx, recv, &ins, bytes) }?;
            ctx.barrier(kind.name())?;
            return Ok(());
        }
    }
    if bytes > chunk {
        // SAFETY: the caller's contract.
        return unsafe { pipelined(ctx, &desc, send, recv, bytes, chunk, root) };
    }
    let mut done = 0;
    let mut first = true;
    while done < bytes || first {
        let n = chunk.min(bytes - done);
        let p = ctx.next_parity();
        // SAFETY: n fits the slot; send holds bytes. In place, the own block is copied out before
        // any peer data lands in recv (peers' blocks are elsewhere in recv).
        unsafe { par_copy(ctx, ctx.slot(p, ctx.me()), send.add(done), n) }?;
        let p = if first {
            ctx.agree(&desc, None)?
        } else {
            ctx.barrier(kind.name())?
        };
        first = false;
        if root.is_none_or(|r| r == ctx.me()) {
            for r in 0..ctx.n() {
                // SAFETY: recv holds nranks * bytes.
                unsafe { par_copy(ctx, recv.add(r * bytes + done), ctx.slot(p, r), n) }?;
            }
        }
        done += n;
    }
    Ok(())
}

/// All-gather (or gather) of `bytes` per rank in chunks of `chunk` bytes, software-pipelined
/// as the large all-reduce: step `k` copies chunk `k` of `send` into this rank's slot and every
/// rank's chunk `k - 1` out of its slot into `recv` (on the root only, for gather), as one
/// fork-join over the helper threads, then one barrier. Chunk `k` lives in slot parity
/// `(g0 + k) % 2`: written in step `k`, read in step `k + 1`, rewritten in step `k + 2`, a
/// barrier between each (the last chunk's slots are rewritten two generations later, after
/// every rank's last copy, so the last step needs no barrier). In place, this rank's own block
/// of `recv` is `send`: its chunks are not copied back onto themselves; out of place they go
/// from `send` to `recv` in the step that publishes them.
///
/// # Safety
/// `send` holds `bytes`; `recv` holds `bytes * nranks` where it is written.
unsafe fn pipelined(
    ctx: &mut Ctx<'_>,
    desc: &Desc,
    send: *const u8,
    recv: *mut u8,
    bytes: usize,
    chunk: usize,
    root: Option<usize>,
) -> Result<()> {
    let (n, me) = (ctx.n(), ctx.me());
    let chunks = bytes.div_ceil(chunk);
    let g0 = ctx.gen + 1;
    let len = |k: usize| chunk.min(bytes - k * chunk);
    let writes = root.is_none_or(|r| r == me);
    let copy_in = |ctx: &Ctx<'_>, k: usize| Move {
        dst: ctx.slot(slot_parity(g0, k), me) as usize,
        // SAFETY: within `send`, which holds `bytes`.
        src: unsafe { send.add(k * chunk) } as usize,
        n: len(k),
        stream: false,
    };
    // Out of place, this rank's own block goes from `send` to `recv` in the step that publishes
    // it, right after the copy into the slot: each thread copies the same part of the chunk
    // twice in a row (the copies are cut alike), so the second read is from its cache, and the
    // own block is not read back out of the slot.
    let own_out = writes && !std::ptr::eq(recv.wrapping_add(me * bytes), send);
    let own_copy = |k: usize| Move {
        // SAFETY: within `recv` (own block) and `send`, as above.
        dst: unsafe { recv.add(me * bytes + k * chunk) } as usize,
        // SAFETY: within `send`, which holds `bytes`.
        src: unsafe { send.add(k * chunk) } as usize,
        n: len(k),
        stream: false,
    };
    let mut first = vec![copy_in(ctx, 0)];
    if own_out {
        first.push(own_copy(0));
    }
    let step = |ctx: &Ctx<'_>, k: usize, moves: &mut Vec<Move>| {
        if k < chunks {
            moves.push(copy_in(ctx, k));
            if own_out {
                moves.push(own_copy(k));
            }
        }
        if writes {
            for r in 0..n {
                if r == me {
                    // In place it is `send` already; out of place it was copied from `send`.
                    continue;
                }
                // SAFETY: within `recv`, which holds `bytes * n` on a rank that writes.
                let dst = unsafe { recv.add(r * bytes + (k - 1) * chunk) };
                moves.push(Move {
                    dst: dst as usize,
                    src: ctx.slot(slot_parity(g0, k - 1), r) as usize,
                    n: len(k - 1),
                    stream: false,
                });
            }
        }
        None
    };
    // SAFETY: the first chunk fits this rank's slot of the parity the agreement publishes.
    // In step k every rank's slot of chunk k - 1 holds it (published by the barrier or
    // agreement before); the slot chunk k goes to is read by nobody in this step; the parts of
    // `recv` written are disjoint from each other and from the part of `send` read (in place,
    // the own block is not written; out of place it is written from `send`, which does not
    // overlap `recv`).
    unsafe { pipeline(ctx, desc, chunks, &first, false, step) }
}
