//! All-gather and gather: every rank's block through its slot, chunk by chunk.

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::Result;

use super::{elem_size, par_copy};
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
