//! Broadcast: the root's data through its slot, chunk by chunk.

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::Result;

use super::{elem_size, par_copy};
use crate::ccl::ctx::{Ctx, Desc, Kind};
use crate::ccl::segment::LINE_BYTES;

/// Whether a broadcast of `count` elements of `dtype` is one agreement with local work around
/// it (it fits one slot), given the slot size.
pub fn broadcast_is_one_round(count: usize, dtype: DataType, slot_bytes: usize) -> bool {
    dtype
        .size()
        .and_then(|es| count.checked_mul(es).map(|b| b <= Ctx::fit(slot_bytes, es)))
        .unwrap_or(false)
}

/// Whether a broadcast of `count` elements of `dtype` rides in the root's line (see
/// `Ctx::post_broadcast`): its root does not wait for the receivers.
pub fn broadcast_is_posted(count: usize, dtype: DataType) -> bool {
    dtype
        .size()
        .and_then(|es| count.checked_mul(es))
        .is_some_and(|b| b <= LINE_BYTES)
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
    let bytes = count * es;
    if bytes <= LINE_BYTES {
        // The root's data rides in its line; the root does not wait for the receivers.
        let mine = (ctx.me() == root)
            // SAFETY: send holds `bytes` bytes on the root.
            .then(|| unsafe { std::slice::from_raw_parts(send, bytes) });
        // SAFETY: recv holds `bytes` bytes on every rank.
        return unsafe { ctx.post_broadcast(&desc, root, mine, recv, bytes) };
    }
    let chunk = Ctx::fit(ctx.slot_bytes(), es);
    let mut done = 0;
    let mut first = true;
    while done < bytes || first {
        let n = chunk.min(bytes - done);
        let p = ctx.next_parity();
        if ctx.me() == root && !(first && ctx.resuming()) {
            // SAFETY: n <= slot bytes; send holds bytes.
            unsafe { par_copy(ctx, ctx.slot(p, root), send.add(done), n) }?;
        }
        let p = if first {
            ctx.agree(&desc, None)?
        } else {
            ctx.barrier("broadcast")?
        };
        first = false;
        // SAFETY: recv holds bytes; the root's slot holds n published bytes.
        unsafe { par_copy(ctx, recv.add(done), ctx.slot(p, root), n) }?;
        done += n;
    }
    Ok(())
}
