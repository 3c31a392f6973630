//! Broadcast: the root's data through its slot, chunk by chunk.

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::Result;

use super::{copy, elem_size};
use crate::ccl::ctx::{Ctx, Desc, Kind};

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
