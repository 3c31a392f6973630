//! IPC between ranks (a device check that needs a second process): each rank exports an
//! allocation, the handles travel over the communicator, and each rank opens its next peer's,
//! reads it through `mem_copy` and closes it.

use ferrocx::abi::{DataType, DevicePtr};

use super::{Ctx, Planned};
use crate::boundary::{fail, optional, raw_call, skip, Stop, Verdict};
use crate::buffer::{host_ptr_mut, DevBuf};
use crate::device::memory::{differ, pattern};
use crate::report::Outcome;

/// Bytes each rank exports.
const BYTES: usize = 4099;

/// The check's name; the device part lists it too (see [`device_row`]).
pub(crate) const NAME: &str = "IPC: export, open in another process, read, close";

/// The row the device part records for the IPC check, so that it is listed among the device
/// checks: absent when the device table lacks an IPC entry, else run by the CCL part (which the
/// report merges into this row: a pass or failure there wins over this skip).
pub(crate) fn device_row(root: &ferrocx::abi::DeviceAdaptorV1) -> crate::report::Outcome {
    use crate::report::Outcome;
    let lacking: Vec<&str> = [
        ("`ipc_export`", root.ipc_export.is_some()),
        ("`ipc_import`", root.ipc_import.is_some()),
        ("`ipc_close`", root.ipc_close.is_some()),
    ]
    .into_iter()
    .filter(|(_, present)| !present)
    .map(|(n, _)| n)
    .collect();
    if lacking.is_empty() {
        Outcome::Skip(
            "run by the CCL part, which has the second process it needs (not run without a CCL)"
                .into(),
        )
    } else {
        Outcome::absent(&lacking.join(", "))
    }
}

pub(super) fn plan<'a>(ctx: &'a Ctx<'a>) -> Vec<Planned<'a>> {
    vec![Planned::new("device", NAME, move || ipc(ctx))]
}

fn ipc(ctx: &Ctx<'_>) -> Verdict {
    let dev = ctx.dev;
    let root = dev.root();
    let lacking: Vec<&str> = [
        ("ipc_export", root.ipc_export.is_some()),
        ("ipc_import", root.ipc_import.is_some()),
        ("ipc_close", root.ipc_close.is_some()),
    ]
    .iter()
    .filter(|(_, present)| !present)
    .map(|(n, _)| *n)
    .collect();
    if !lacking.is_empty() {
        return Err(Stop(Outcome::absent(&format!(
            "`{}`",
            lacking.join("`, `")
        ))));
    }
    if ctx.world < 2 {
        return Err(skip(
            "needs 2 or more ranks (a handle is opened by another process)",
        ));
    }
    ctx.usable()?;
    let mine = DevBuf::device(dev, BYTES)?;
    mine.upload(&pattern(BYTES, 0x1BC0 + ctx.rank as u64))?;
    // Export; a failure is carried to the exchange (length 0) so every rank takes part in it.
    let exported = export(ctx, mine.ptr());
    let len = exported.as_ref().map_or(0, Vec::len);
    let lens = ctx.all_gather_u64("exchanging IPC handle sizes", len as u64)?;
    let exported = exported?;
    if let Some(r) = lens.iter().position(|&l| l == 0) {
        return Err(fail(format!("rank {r} could not export its allocation")));
    }
    let max = lens.iter().copied().max().unwrap_or(0) as usize;
    let mut padded = exported.clone();
    padded.resize(max, 0);
    let send = DevBuf::device(dev, max)?;
    let recv = DevBuf::device(dev, max * ctx.world)?;
    send.upload(&padded)?;
    ctx.claims(DataType::U8, None)?;
    ctx.run("exchanging IPC handles", || {
        // SAFETY: `send` holds `max` and `recv` `max * world` bytes; `run` waits for the stream
        // before they drop.
        ctx.ccl.seen(unsafe {
            ctx.ccl
                .ccl
                .all_gather(send.ptr(), recv.ptr(), max, DataType::U8, ctx.comm, ctx.s)
        })
    })?;
    let all = recv.download(max * ctx.world)?;
    let peer = (ctx.rank + 1) % ctx.world;
    let handle = &all[peer * max..peer * max + lens[peer] as usize];
    let read = open_and_read(ctx, handle);
    // Nobody frees its allocation before every peer has closed its mapping.
    ctx.barrier("the barrier after IPC reads")?;
    let got = read?;
    differ(
        &format!("rank {peer}'s allocation read through IPC"),
        &got,
        &pattern(BYTES, 0x1BC0 + peer as u64),
    )
}

fn export(ctx: &Ctx<'_>, ptr: DevicePtr) -> Result<Vec<u8>, Stop> {
    let dev = ctx.dev;
    let mut len = 0usize;
    optional(raw_call!(
        dev,
        dev.root(),
        ipc_export(ptr, std::ptr::null_mut(), &mut len)
    ))?;
    if len == 0 {
        return Err(fail("ipc_export reports a handle of 0 bytes"));
    }
    let mut handle = vec![0u8; len];
    let mut got = len;
    raw_call!(
        dev,
        dev.root(),
        ipc_export(ptr, handle.as_mut_ptr(), &mut got)
    )?;
    if got == 0 || got > len {
        return Err(fail(format!(
            "ipc_export reported {len} bytes, then wrote {got}"
        )));
    }
    handle.truncate(got);
    Ok(handle)
}

fn open_and_read(ctx: &Ctx<'_>, handle: &[u8]) -> Result<Vec<u8>, Stop> {
    let dev = ctx.dev;
    let mut p = DevicePtr::NULL;
    raw_call!(
        dev,
        dev.root(),
        ipc_import(handle.as_ptr(), handle.len(), &mut p)
    )?;
    let mut got = vec![0u8; BYTES];
    // SAFETY: `p` is a peer's allocation of `BYTES`, opened above and closed after; `got` holds
    // `BYTES`.
    let read = dev.seen(unsafe { dev.dev.mem_copy(host_ptr_mut(&mut got), p, BYTES) });
    let closed = raw_call!(dev, dev.root(), ipc_close(p));
    read?;
    closed?;
    Ok(got)
}
