//! Abort, last and on its own communicator: rank 0 joins the communicator and aborts it while
//! the other ranks are blocked in an all-reduce it never joins. They must get an error within
//! the timeout, not hang: from the all-reduce or the stream's synchronize, or (NCCL's way: a
//! watchdog aborts the communicator, its kernels exit and the stream drains) from
//! `comm_get_async_error` after a synchronize that succeeded.

use std::time::{Duration, Instant};

use ferrocx::abi::{Comm, Status};
use ferrocx::adaptor::AdaptorError;

use super::{Ctx, Planned, UniqueIds};
use crate::boundary::CclApi;
use crate::boundary::{fail, is_panic, skip, Stop, Verdict};
use crate::buffer::DevBuf;
use crate::report::Outcome;

/// The check's name.
pub(super) const NAME: &str = "comm_abort unblocks the peers of an aborted rank";

/// How long rank 0 waits before aborting, so the others are inside the all-reduce.
const DELAY: Duration = Duration::from_millis(300);
/// Slack past the timeout for the error to arrive.
const GRACE: Duration = Duration::from_secs(3);

pub(super) fn plan<'a>(ctx: &'a Ctx<'a>, ids: &'a UniqueIds) -> Vec<Planned<'a>> {
    vec![Planned::new("ccl", NAME, move || abort(ctx, ids))]
}

fn abort(ctx: &Ctx<'_>, ids: &UniqueIds) -> Verdict {
    let api = ctx.ccl;
    if api.root().comm_abort.is_none() {
        return Err(Stop(Outcome::absent("`comm_abort`")));
    }
    if ctx.world < 2 {
        return Err(skip("needs 2 or more ranks"));
    }
    let (dtype, op) = ctx.any_reduction()?;
    let c = api.seen(api.ccl.comm_init_rank(
        ctx.rank as i32,
        ctx.world as i32,
        ctx.device,
        &ids.abort,
        ctx.timeout.as_millis() as u64,
        &[],
    ))?;
    if ctx.rank == 0 {
        std::thread::sleep(DELAY);
        api.seen(api.ccl.comm_abort(c))?;
        return Ok(());
    }
    let b = DevBuf::device(ctx.dev, 80)?;
    b.fill(0)?;
    let start = Instant::now();
    let r = api
        .seen(
            // SAFETY: `b` holds 80 bytes, 10 elements of any type, in place; the stream is
            // synchronized right after, before `b` drops.
            unsafe {
                api.ccl
                    .all_reduce(b.ptr(), b.ptr(), 10, dtype, op, c, ctx.s)
            },
        )
        .and_then(|()| ctx.dev.seen(ctx.dev.dev.stream_synchronize(ctx.s)));
    let took = start.elapsed();
    let verdict = match r {
        // The synchronize succeeded: the communicator must report the failure.
        Ok(()) => match async_failure(api, c) {
            Ok(Some(status)) => in_time(ctx, status, took),
            Ok(None) => Err(fail(
                "the all-reduce completed, and comm_get_async_error reports no error, although \
                 rank 0 never joined it and aborted",
            )),
            Err(e) => Err(e.into()),
        },
        Err(AdaptorError::Failed {
            op,
            status,
            message,
            ..
        }) => {
            if is_panic(status, &message) {
                Err(fail(format!("{op} panicked: {message}")))
            } else {
                in_time(ctx, status, took)
            }
        }
        Err(e) => Err(e.into()),
    };
    // This rank's handle is released too (its result says nothing about the check).
    let _ = api.seen(api.ccl.comm_abort(c));
    verdict
}

/// After a synchronize that succeeded: the communicator's asynchronous error, if it reports one
/// (`None` for `SUCCESS`, `NOT_READY` or an absent `comm_get_async_error`). A failing call of
/// the entry itself is an error of its own, not the expected one.
fn async_failure(api: &CclApi, c: Comm) -> Result<Option<Status>, AdaptorError> {
    if api.root().comm_get_async_error.is_none() {
        return Ok(None);
    }
    let status = api.seen(api.ccl.comm_async_error(c))?;
    Ok((status != Status::SUCCESS && status != Status::NOT_READY).then_some(status))
}

/// Passes when the expected error (`status`) came within the timeout and its grace.
fn in_time(ctx: &Ctx<'_>, status: Status, took: Duration) -> Verdict {
    if took > ctx.timeout + GRACE {
        return Err(fail(format!(
            "the error ({status}) came after {} ms, past the {} ms timeout",
            took.as_millis(),
            ctx.timeout.as_millis()
        )));
    }
    Ok(())
}
