//! Block exchanges: reduce-scatter, all-to-all and scatter, through per-destination sub-slots.

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

use super::{copy, elem_size, with_scratch};
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
    // The whole input of reduce-scatter and all-to-all is read before any output is written, so
    // in place works chunk by chunk only when recv is not send: stage the input when it is.
    let staged: Option<Vec<u8>> = if std::ptr::eq(send, recv) && block > 0 && root.is_none() {
        // SAFETY: send holds count * nranks elements.
        Some(unsafe { std::slice::from_raw_parts(send, block * n) }.to_vec())
    } else {
        None
    };
    let send = staged.as_ref().map_or(send, |v| v.as_ptr());
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
