//! All-reduce and reduce: the data in the announcing line up to a line, one shot up to
//! `ONE_SHOT_BYTES`, else chunked reduce-scatter then gather through the result buffer.

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

use super::{
    copy, elem_size, par_step, pipeline, reduce_into, share, slot_parity, Move, SlotReduce,
};
use crate::ccl::ctx::{Ctx, Desc, Kind};
use crate::ccl::segment::LINE_BYTES;

/// Messages up to this size take the one-shot path (every rank reduces everything).
const ONE_SHOT_BYTES: usize = 16 * 1024;

/// Whether an all-reduce (or reduce) of `count` elements of `dtype` is one agreement with
/// local work around it (the line and one-shot paths), given the slot size.
pub fn all_reduce_is_one_round(count: usize, dtype: DataType, slot_bytes: usize) -> bool {
    dtype
        .size()
        .and_then(|es| count.checked_mul(es))
        .is_some_and(|b| b <= LINE_BYTES || b <= ONE_SHOT_BYTES.min(slot_bytes))
}

/// Whether an all-reduce (or reduce) of `count` elements of `dtype` travels in the lines that
/// announce it (no slot).
pub fn all_reduce_is_line(count: usize, dtype: DataType) -> bool {
    dtype
        .size()
        .and_then(|es| count.checked_mul(es))
        .is_some_and(|b| b <= LINE_BYTES)
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
        ctx.agree(&desc, Some(data))?;
        if writes(ctx) && bytes > 0 {
            // SAFETY: every rank's line of this generation holds `bytes` published bytes, 8-byte
            // aligned, until it is rewritten LINES generations later (after this rank has
            // published the next one); recv holds `bytes` and is none of them (the sources are
            // copies in the segment, so in place is fine too).
            unsafe { reduce_into(recv, bytes, ctx.n(), |r| ctx.line_data(r), dtype, op) }?;
        }
        return Ok(());
    }
    if bytes <= ONE_SHOT_BYTES.min(ctx.slot_bytes()) {
        if !ctx.resuming() {
            let p = ctx.next_parity();
            // SAFETY: the slot holds slot_bytes >= bytes; send holds bytes.
            unsafe { copy(ctx.slot(p, ctx.me()), send, bytes) };
        }
        let p = ctx.agree(&desc, None)?;
        if writes(ctx) && bytes > 0 {
            // SAFETY: every rank's slot of parity p holds `bytes` published bytes until the
            // next generation of that parity; recv holds `bytes` and is none of them.
            unsafe { reduce_into(recv, bytes, ctx.n(), |r| ctx.slot(p, r), dtype, op) }?;
        }
        return Ok(());
    }
    if root.is_none() && bytes >= super::super::direct::DIRECT_MIN * ctx.n() {
        // Every share reduced from the inputs where they lie, then every other share copied
        // from its owner's output (see `direct`), unless some rank's buffers cannot be mapped
        // or its output overlaps its input other than exactly (in place).
        let (s0, r0) = (send as usize, recv as usize);
        let apart = r0 >= s0 + bytes || r0 + bytes <= s0;
        let ok = apart || s0 == r0;
        let bufs = if ok {
            [send, recv.cast_const()]
        } else {
            [std::ptr::null(); 2]
        };
        // SAFETY: `send` and `recv` are the call's buffers (or null: no offer).
        if let Some(all) = unsafe { super::super::direct::agree_buffers(ctx, &desc, &bufs) }? {
            let (n, me) = (ctx.n(), ctx.me());
            let ins: Vec<u64> = all.iter().map(|b| b[0]).collect();
            let (a, b) = share(count, n, me);
            // SAFETY: every rank's input holds `count` elements and is not written until the
            // first barrier but by its owner's reduction of its own share (in place), which
            // no other rank reads; `recv`'s share overlaps no input but its own, exactly.
            unsafe {
                super::super::direct::par_reduce(
                    ctx,
                    recv.add(a * es),
                    &ins,
                    a * es,
                    (b - a) * es,
                    dtype,
                    op,
                )
            }?;
            ctx.barrier(kind.name())?;
            let jobs: Vec<(usize, usize, usize)> = (0..n)
                .filter(|&r| r != me)
                .map(|r| {
                    let (a, b) = share(count, n, r);
                    (r0 + a * es, all[r][1] as usize + a * es, (b - a) * es)
                })
                .filter(|j| j.2 > 0)
                .collect();
            // SAFETY: every rank's output holds its reduced share (published by the barrier)
            // and nobody writes that share until the last barrier; this rank writes only the
            // other shares of its own output, which nobody reads.
            unsafe { super::super::direct::par_copies(ctx, &jobs) }?;
            ctx.barrier(kind.name())?;
            return Ok(());
        }
    }
    // Chunks of a slot, software-pipelined: step k reduces this rank's share of chunk k - 1
    // (every rank's slot, published by the barrier before) into the result buffer, copies
    // chunk k of `send` into this rank's slot and copies the result of chunk k - 2 (reduced
    // in the step before) out to `recv`, all as one fork-join, then one barrier. So each
    // chunk takes one barrier and one fork-join (instead of two and three), and each byte
    // is copied in once, read once by the rank that reduces it and copied out once.
    //
    // This rank's own share of a chunk never goes through the segment for its own use: it is
    // not copied into the slot (nobody else reads it there), the reduction reads it from
    // `send` (where that is aligned for the type) and writes its result to `recv` as well as
    // to the result buffer (which the peers copy it out of), so the copy out skips it too.
    // When the message is much larger than the cache and out of place, `recv` is written by
    // streaming stores (see `streams_out`).
    //
    // Buffers: chunk k lives in slot parity (g0 + k) % 2, where g0 is the agreement's
    // generation, so that what a step writes is what the generation convention frees
    // (written in step k, read in step k + 1, rewritten in step k + 2, a barrier between
    // each); its result in result buffer k % 2 (written in step k + 1, read in step k + 2).
    // In place, the share of `recv` a step writes (chunk k - 1's own share, chunk k - 2's
    // others) is no part of `send` that the step or a later one reads.
    let chunk = Ctx::fit(ctx.slot_bytes(), es) / es;
    let chunks = count.div_ceil(chunk).max(1);
    let g0 = ctx.gen + 1;
    let elems = |k: usize| (k * chunk, ((k + 1) * chunk).min(count));
    let me = ctx.me();
    let n = ctx.n();
    let stream = super::streams_out(bytes, n, std::ptr::eq(send, recv));
    let own_from_send = (send as usize) % es == 0;
    // The parts of chunk k before and after this rank's share: (offset in the chunk, length),
    // in elements.
    let others = |k: usize| {
        let (lo, hi) = elems(k);
        let (a, b) = share(hi - lo, n, me);
        [(0, a), (b, hi - lo - b)]
    };
    // Where the reduction reads this rank's share from its slot, the whole chunk goes there.
    let ins = |k: usize| {
        if own_from_send {
            others(k)
        } else {
            let (lo, hi) = elems(k);
            [(0, hi - lo), (0, 0)]
        }
    };
    let copy_in = |ctx: &Ctx<'_>, k: usize| {
        let lo = elems(k).0;
        ins(k).map(|(at, len)| Move {
            // SAFETY: within this rank's slot, which holds a chunk.
            dst: unsafe { ctx.slot(slot_parity(g0, k), me).add(at * es) } as usize,
            // SAFETY: within `send`, which holds `count` elements.
            src: unsafe { send.add((lo + at) * es) } as usize,
            n: len * es,
            stream: false,
        })
    };
    let copy_out = |ctx: &Ctx<'_>, k: usize| {
        let lo = elems(k).0;
        others(k).map(|(at, len)| Move {
            // SAFETY: within `recv`, which holds `count` elements.
            dst: unsafe { recv.add((lo + at) * es) } as usize,
            // SAFETY: within the result buffer, which holds a chunk.
            src: unsafe { ctx.seg().result(k % 2).add(at * es) } as usize,
            n: len * es,
            stream,
        })
    };
    let step = |ctx: &Ctx<'_>, k: usize, moves: &mut Vec<Move>| {
        let (lo, hi) = elems(k - 1);
        let (a, b) = share(hi - lo, n, me);
        if k < chunks {
            moves.extend(copy_in(ctx, k));
        }
        if k >= 2 && writes(ctx) {
            moves.extend(copy_out(ctx, k - 2));
        }
        Some(SlotReduce {
            p: slot_parity(g0, k - 1),
            lo: a,
            hi: b,
            es,
            dtype,
            op,
            // SAFETY: the result buffer holds a whole chunk; the share is within it.
            dst: unsafe { ctx.seg().result((k - 1) % 2).add(a * es) } as usize,
            own: if own_from_send {
                // SAFETY: within `send`.
                unsafe { send.add((lo + a) * es) as usize }
            } else {
                0
            },
            also: if writes(ctx) {
                // SAFETY: within `recv`.
                unsafe { recv.add((lo + a) * es) as usize }
            } else {
                0
            },
            stream,
        })
    };
    let first = copy_in(ctx, 0);
    // SAFETY: the first chunk fits this rank's slot of the parity the agreement publishes. In
    // step k every rank's slot of chunk k - 1 holds it (published by the barrier before); the
    // slot chunk k goes to, the result buffer chunk k - 1 goes to and the parts of `recv`
    // chunks k - 1 and k - 2 go to are read by nobody in this step (see above). Every step
    // ends with a barrier: the last one publishes the last chunk's result.
    unsafe { pipeline(ctx, &desc, chunks, &first, true, step) }?;
    if writes(ctx) {
        // SAFETY: the last chunk's result, reduced before the last barrier.
        unsafe { par_step(ctx, None, &copy_out(ctx, chunks - 1)) }?;
    }
    Ok(())
}
