//! All-reduce and reduce: the data in the announcing line up to a line, one shot up to
//! `ONE_SHOT_BYTES`, else chunked reduce-scatter then gather through the result buffer.

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

use super::{copy, elem_size, par_copy, par_reduce_slots, reduce_into, share};
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
    let chunk = Ctx::fit(ctx.slot_bytes(), es) / es;
    let mut done = 0;
    let mut first = true;
    while done < count || first {
        let n = chunk.min(count - done);
        let p = ctx.next_parity();
        // SAFETY: n elements fit in the slot; send holds count elements.
        unsafe { par_copy(ctx, ctx.slot(p, ctx.me()), send.add(done * es), n * es) }?;
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
            unsafe { par_reduce_slots(ctx, p, lo, hi, es, dtype, op, dst) }?;
        }
        ctx.barrier(kind.name())?;
        if writes(ctx) {
            // SAFETY: the result holds n elements; recv holds count.
            unsafe { par_copy(ctx, recv.add(done * es), res, n * es) }?;
        }
        done += n;
    }
    Ok(())
}
