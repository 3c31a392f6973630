//! Error codes for bad arguments of the CCL: each call must fail at once (before anything is
//! enqueued) with the status the ABI names, on every rank alike. A call that is accepted
//! instead leaves the communicator in an unknown state, so it is marked broken.

use ferrocx::abi::{Comm, DataType, ReduceOp, Status};

use super::{Ctx, Planned};
use crate::boundary::{refused, Res, Verdict};
use crate::buffer::DevBuf;

const BAD_ARGUMENT: &[Status] = &[Status::INVALID_ARGUMENT];
const BAD_HANDLE: &[Status] = &[Status::INVALID_HANDLE, Status::INVALID_ARGUMENT];

pub(super) fn plan<'a>(ctx: &'a Ctx<'a>) -> Vec<Planned<'a>> {
    vec![
        Planned::new("ccl", "bad argument: unknown data type", move || {
            bad(ctx, "all_reduce of DataType(99)", BAD_ARGUMENT, |b| {
                // SAFETY: `b` holds 64 bytes, more than the 4 elements; the call is expected to be
                // refused, and `bad` spoils the communicator if it is not.
                ctx.ccl.seen(unsafe {
                    ctx.ccl
                        .ccl
                        .all_reduce(b, b, 4, DataType(99), ReduceOp::SUM, ctx.comm, ctx.s)
                })
            })
        }),
        Planned::new("ccl", "bad argument: root out of range", move || {
            let root = ctx.world as i32;
            ctx.claims(DataType::F32, None)?;
            bad(
                ctx,
                &format!("broadcast from root {root}"),
                BAD_ARGUMENT,
                |b| {
                    // SAFETY: as above.
                    ctx.ccl.seen(unsafe {
                        ctx.ccl
                            .ccl
                            .broadcast(b, b, 4, DataType::F32, root, ctx.comm, ctx.s)
                    })
                },
            )
        }),
        Planned::new("ccl", "bad argument: peer out of range", move || {
            let peer = ctx.world as i32;
            ctx.claims(DataType::F32, None)?;
            bad(ctx, &format!("send to rank {peer}"), BAD_ARGUMENT, |b| {
                ctx.ccl
                    // SAFETY: as above.
                    .seen(unsafe { ctx.ccl.ccl.send(b, 4, DataType::F32, peer, ctx.comm, ctx.s) })
            })
        }),
        Planned::new("ccl", "bad argument: null communicator", move || {
            ctx.claims(DataType::F32, Some(ReduceOp::SUM))?;
            bad(
                ctx,
                "all_reduce on the null communicator",
                BAD_HANDLE,
                |b| {
                    // SAFETY: as above.
                    ctx.ccl.seen(unsafe {
                        ctx.ccl.ccl.all_reduce(
                            b,
                            b,
                            4,
                            DataType::F32,
                            ReduceOp::SUM,
                            Comm::NULL,
                            ctx.s,
                        )
                    })
                },
            )?;
            if ctx.ccl.root().comm_count.is_some() {
                refused(
                    "comm_count of the null communicator",
                    ctx.ccl.seen(ctx.ccl.ccl.comm_count(Comm::NULL).map(|_| ())),
                    BAD_HANDLE,
                )?;
            }
            Ok(())
        }),
    ]
}

/// Makes `call` on a small buffer; it must be refused with one of `allowed`.
fn bad(
    ctx: &Ctx<'_>,
    what: &str,
    allowed: &[Status],
    call: impl FnOnce(ferrocx::abi::DevicePtr) -> Res<()>,
) -> Verdict {
    ctx.usable()?;
    let b = DevBuf::device(ctx.dev, 64)?;
    b.fill(0)?;
    let r = call(b.ptr());
    if r.is_ok() {
        // Accepted: whatever it enqueued may never complete, or desynchronise the ranks.
        ctx.spoil(what);
    }
    refused(what, r, allowed)
}
