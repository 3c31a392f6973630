//! Block exchanges: reduce-scatter, all-to-all and scatter, through per-destination sub-slots.

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

use super::{copy, elem_size, pipeline, slot_parity, with_scratch, Move, SlotReduce};
use crate::ccl::ctx::{Ctx, Desc, Kind};
use crate::ccl::reduce::reduce;

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
    if kind == Kind::ReduceScatter && block >= super::super::direct::DIRECT_MIN {
        // Every block read where it lies (see `direct`), unless some rank's input cannot be
        // mapped; a rank whose output overlaps its input other than as its own block offers
        // nothing (the peers read that input while it writes).
        let (lo, hi) = (send as usize, send as usize + block * n);
        let own = std::ptr::eq(recv, send.wrapping_add(ctx.me() * block));
        let apart = (recv as usize) >= hi || (recv as usize) + block <= lo;
        let offer = if own || apart { send } else { std::ptr::null() };
        // SAFETY: `send` is the call's input (or null: no offer).
        if let Some(ins) = unsafe { super::super::direct::agree_inputs(ctx, &desc, offer) }? {
            let at = ctx.me() * block;
            // SAFETY: every rank's input holds n blocks and is not written until the barrier;
            // `recv` holds a block and overlaps no input but possibly this rank's own block
            // exactly (offered only then).
            unsafe { super::super::direct::par_reduce(ctx, recv, &ins, at, block, dtype, op) }?;
            ctx.barrier(kind.name())?;
            return Ok(());
        }
    }
    // The whole input of reduce-scatter and all-to-all is read before any output is written, so
    // in place works chunk by chunk only when recv is not send: stage the input when it is.
    // The pipelined reduce-scatter reads chunk k of every block while it writes chunk k - 1 of
    // its own: in place as NCCL defines it (`recv` is this rank's block of `send`) it needs no
    // staging.
    let pipelined = kind == Kind::ReduceScatter && block > sub;
    let own_block = std::ptr::eq(recv, send.wrapping_add(ctx.me() * block));
    let staged: Option<Vec<u8>> =
        if std::ptr::eq(send, recv) && block > 0 && root.is_none() && !(pipelined && own_block) {
            // SAFETY: send holds count * nranks elements.
            Some(unsafe { std::slice::from_raw_parts(send, block * n) }.to_vec())
        } else {
            None
        };
    let send = staged.as_ref().map_or(send, |v| v.as_ptr());
    if pipelined {
        // SAFETY: the caller's contract; `send` is the input or its staged copy.
        return unsafe { reduce_scatter_pipelined(ctx, &desc, send, recv, block, sub, es) };
    }
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

/// Reduce-scatter of `block` bytes per rank in chunks of `sub` bytes (a sub-slot per
/// destination), software-pipelined as the large all-reduce: step `k` reduces this rank's
/// sub-slot of every other rank's slot for chunk `k - 1`, and its own block's chunk straight
/// from `send`, into `recv`, and copies chunk `k` of every other destination's block into this
/// rank's slot (its own block never goes through the slot), as one fork-join over the helper threads,
/// then one barrier. Chunk `k` lives in slot parity `(g0 + k) % 2` (`g0` the agreement's
/// generation): written in step `k`, read in step `k + 1`, rewritten in step `k + 2`, a
/// barrier between each; the last chunk's slots are rewritten only two generations later,
/// which every rank reaches after its last reduction, so the last step needs no barrier.
///
/// # Safety
/// `send` holds `block * nranks` bytes; `recv` holds `block` bytes and is either disjoint from
/// `send` or this rank's block of it (in place; else the caller staged `send`).
unsafe fn reduce_scatter_pipelined(
    ctx: &mut Ctx<'_>,
    desc: &Desc,
    send: *const u8,
    recv: *mut u8,
    block: usize,
    sub: usize,
    es: usize,
) -> Result<()> {
    let n = ctx.n();
    let me = ctx.me();
    let chunks = block.div_ceil(sub);
    let g0 = ctx.gen + 1;
    let bytes = |k: usize| sub.min(block - k * sub);
    // No rank reads this rank's own block from its slot: the reduction reads it from `send`.
    let copies_in = |ctx: &Ctx<'_>, k: usize, moves: &mut Vec<Move>| {
        let base = ctx.slot(slot_parity(g0, k), me) as usize;
        moves.extend((0..n).filter(|&d| d != me).map(|d| Move {
            dst: base + d * sub,
            // SAFETY: within `send`, which holds `block * n` bytes.
            src: unsafe { send.add(d * block + k * sub) } as usize,
            n: bytes(k),
            stream: false,
        }));
    };
    let mut first = Vec::with_capacity(n);
    copies_in(ctx, 0, &mut first);
    let step = |ctx: &Ctx<'_>, k: usize, moves: &mut Vec<Move>| {
        if k < chunks {
            copies_in(ctx, k, moves);
        }
        let lo = me * sub / es;
        Some(SlotReduce {
            p: slot_parity(g0, k - 1),
            lo,
            hi: lo + bytes(k - 1) / es,
            es,
            dtype: desc.dtype,
            op: desc.op,
            // SAFETY: within `recv`, which holds `block` bytes.
            dst: unsafe { recv.add((k - 1) * sub) } as usize,
            // SAFETY: within `send`, which holds `block * n` bytes. In place this is `dst`:
            // the reduction reads a block of its sources before it writes that block.
            own: unsafe { send.add(me * block + (k - 1) * sub) } as usize,
            also: 0,
            stream: false,
        })
    };
    // SAFETY: chunk 0 of every block fits its sub-slot of this rank's slot of the parity the
    // agreement publishes. In step k every rank's slot of chunk k - 1 holds it (published by
    // the barrier or agreement before); the slot chunk k goes to is read by nobody in this
    // step (see above); `recv` is none of the slots, and in place only chunk k - 1 of this
    // rank's block is written while chunk k is read.
    unsafe { pipeline(ctx, desc, chunks, &first, false, step) }
}
