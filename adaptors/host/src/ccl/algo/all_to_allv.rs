//! All-to-all with per-peer counts and displacements, in rounds every rank agrees on.

use std::sync::atomic::Ordering;

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::Result;

use super::{copy, elem_size};
use crate::ccl::ctx::{Ctx, Desc, Kind};

/// All-to-all with per-peer counts and displacements (elements).
///
/// # Safety
/// `send` valid up to the largest `send_displs[d] + send_counts[d]`, `recv` likewise.
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_to_allv(
    ctx: &mut Ctx<'_>,
    send: *const u8,
    sc: &[usize],
    sd: &[usize],
    recv: *mut u8,
    rc: &[usize],
    rd: &[usize],
    dtype: DataType,
) -> Result<()> {
    let es = elem_size(dtype)?;
    let n = ctx.n();
    let sub = Ctx::fit(ctx.slot_bytes() / n, es);
    let local_max = sc.iter().chain(rc).copied().max().unwrap_or(0) * es;
    let desc = Desc {
        kind: Kind::AllToAllV,
        count: local_max as u64,
        dtype,
        op: ReduceOp::SUM,
        root: -1,
    };
    let staged: Option<Vec<u8>> = if std::ptr::eq(send, recv) {
        let end = (0..n).map(|d| (sd[d] + sc[d]) * es).max().unwrap_or(0);
        // SAFETY: send is valid up to `end`.
        Some(unsafe { std::slice::from_raw_parts(send, end) }.to_vec())
    } else {
        None
    };
    let send = staged.as_ref().map_or(send, |v| v.as_ptr());
    // Every rank must run the same number of rounds: agree on the largest block first.
    ctx.agree(&desc, None)?;
    let global_max = (0..n)
        .map(|r| ctx.line(r).desc[1].load(Ordering::Relaxed))
        .max()
        .unwrap_or(0) as usize;
    let mut done = 0;
    while done < global_max {
        let p = ctx.next_parity();
        for d in 0..n {
            let len = sc[d] * es;
            let m = sub.min(len.saturating_sub(done));
            // SAFETY: sub-slot d holds `sub` bytes; send holds the block.
            unsafe {
                copy(
                    ctx.slot(p, ctx.me()).add(d * sub),
                    send.add(sd[d] * es + done),
                    m,
                )
            };
        }
        let p = ctx.barrier("all_to_allv")?;
        let me = ctx.me();
        for r in 0..n {
            let len = rc[r] * es;
            let m = sub.min(len.saturating_sub(done));
            // SAFETY: recv holds the block; the sub-slot holds what r published.
            unsafe { copy(recv.add(rd[r] * es + done), ctx.slot(p, r).add(me * sub), m) };
        }
        done += sub;
    }
    Ok(())
}
