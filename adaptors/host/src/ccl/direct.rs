//! Large reduce-scatters and all-gathers that read the peers' buffers where they lie.
//!
//! The slot paths copy every input into this rank's slot and every peer reads it there: one
//! copy of each input per call, most of a reduce-scatter's memory traffic. Where every rank's
//! input is `DEVICE` or `PINNED` memory of this device (a shared-memory segment, see
//! [`crate::ipc`]), each rank puts its input's IPC handle in the line that announces the call,
//! maps the peers' inputs (kept mapped for later calls: the latest [`KEEP`] handles of each
//! peer) and reads them in place: a reduce-scatter reduces its block straight from every
//! input, an all-gather copies every block straight into its output. A barrier ends the call,
//! so no rank returns (and may write its input again) while a peer still reads it. When any
//! rank's input cannot be exported (C-heap memory, a handle longer than a line), every rank
//! sees it in the same lines and takes the slot path; `FERROCX_HOST_DIRECT=0` offers no
//! handle (any rank that sets it sends every rank the slot way).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use ferrocx_plugin_sdk::abi::DevicePtr;
use ferrocx_plugin_sdk::Result;

use super::ctx::{Ctx, Desc};
use super::segment::LINE_BYTES;

/// Handles kept mapped per peer.
pub const KEEP: usize = 4;

/// Bytes per rank from which a reduce-scatter's block or an all-gather's block is read in place
/// (below it the extra agreement costs more than the copy it saves).
pub const DIRECT_MIN: usize = 256 << 10;

/// The environment variable that turns the reads in place off (`0`) for this rank.
pub const DIRECT_ENV: &str = "FERROCX_HOST_DIRECT";

/// Calls of this process that read the peers' buffers in place ([`reads_in_place`]).
static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many calls of this process's host communicators have read the peers' buffers in place
/// so far. For tests and diagnostics: the slot path gives the same results, so only this
/// count tells which path a call took.
pub fn reads_in_place() -> u64 {
    CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// One peer's mappings: (handle, pointer here), latest first.
type Kept = VecDeque<(Vec<u8>, u64)>;

/// The peers' inputs this rank has mapped, by peer.
#[derive(Default)]
pub struct PeerInputs {
    kept: Mutex<HashMap<usize, Kept>>,
}

impl PeerInputs {
    /// Peer `r`'s pointer of `handle` here (mapped once, then kept).
    fn open(&self, r: usize, handle: &[u8]) -> Result<u64> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let list = kept.entry(r).or_default();
        if let Some(i) = list.iter().position(|(h, _)| h == handle) {
            let e = list.remove(i).expect("an index just found");
            let ptr = e.1;
            list.push_front(e);
            return Ok(ptr);
        }
        let ptr = crate::ipc::import(handle)?.0;
        list.push_front((handle.to_vec(), ptr));
        while list.len() > KEEP {
            if let Some((_, old)) = list.pop_back() {
                let _ = crate::ipc::close(DevicePtr(old));
            }
        }
        Ok(ptr)
    }
}

impl Drop for PeerInputs {
    fn drop(&mut self) {
        let kept = self.kept.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, ptr) in kept.drain().flat_map(|(_, l)| l) {
            let _ = crate::ipc::close(DevicePtr(ptr));
        }
    }
}

/// Agrees on the call `desc` (the agreement that starts it) with this rank's input `send` in
/// its line; returns every rank's input as this process sees it when every rank gave a handle,
/// `None` when one did not (every rank sees the same lines, so every rank returns alike).
///
/// # Safety
/// `send` lies in memory of this device (a valid range of the call), or is null (no offer).
pub(super) unsafe fn agree_inputs(
    ctx: &mut Ctx<'_>,
    desc: &Desc,
    send: *const u8,
) -> Result<Option<Vec<u64>>> {
    // SAFETY: this function's contract.
    let all = unsafe { agree_buffers(ctx, desc, &[send]) }?;
    Ok(all.map(|v| v.into_iter().map(|b| b[0]).collect()))
}

/// As [`agree_inputs`] for several buffers of each rank (an all-reduce's input and output):
/// per rank, its buffers as this process sees them, or `None` unless every rank gave a handle
/// for every buffer. A rank offers nothing when any of its buffers is null or cannot be
/// exported, or the handles do not fit its line.
///
/// # Safety
/// Each buffer lies in memory of this device (a valid range of the call), or is null.
pub(super) unsafe fn agree_buffers(
    ctx: &mut Ctx<'_>,
    desc: &Desc,
    bufs: &[*const u8],
) -> Result<Option<Vec<Vec<u64>>>> {
    let offered = bufs.iter().all(|b| !b.is_null())
        && std::env::var(DIRECT_ENV).map_or(true, |v| v.trim() != "0");
    let handles: Option<Vec<Vec<u8>>> = offered
        .then(|| {
            bufs.iter()
                .map(|&b| crate::ipc::export(DevicePtr(b as u64)).ok())
                .collect()
        })
        .flatten();
    let mut line = Vec::with_capacity(LINE_BYTES);
    if let Some(hs) = &handles {
        for h in hs {
            line.extend_from_slice(&(h.len() as u16).to_le_bytes());
            line.extend_from_slice(h);
        }
    }
    if line.len() > LINE_BYTES || line.is_empty() {
        line = vec![0u8; 2];
    }
    ctx.agree(desc, Some(&line))?;
    let me = ctx.me();
    let mut all: Vec<Vec<Vec<u8>>> = Vec::with_capacity(ctx.n());
    for r in 0..ctx.n() {
        let at = ctx.line_data(r);
        let mut pos = 0usize;
        let mut mine = Vec::with_capacity(bufs.len());
        for _ in bufs {
            if pos + 2 > LINE_BYTES {
                return Ok(None);
            }
            let mut len = [0u8; 2];
            // SAFETY: every rank's line of this generation holds what it published (at least
            // the first length), readable until it is rewritten LINES generations later; the
            // reads stay within the line.
            unsafe { std::ptr::copy_nonoverlapping(at.add(pos), len.as_mut_ptr(), 2) };
            let len = usize::from(u16::from_le_bytes(len));
            if len == 0 || pos + 2 + len > LINE_BYTES {
                return Ok(None);
            }
            let mut h = vec![0u8; len];
            // SAFETY: as above, `len` bytes within the line.
            unsafe { std::ptr::copy_nonoverlapping(at.add(pos + 2), h.as_mut_ptr(), len) };
            mine.push(h);
            pos += 2 + len;
        }
        all.push(mine);
    }
    let mut out = Vec::with_capacity(ctx.n());
    for (r, hs) in all.iter().enumerate() {
        let mut ptrs = Vec::with_capacity(hs.len());
        for (i, h) in hs.iter().enumerate() {
            ptrs.push(if r == me {
                bufs[i] as u64
            } else {
                ctx.comm.peers.open(r, h)?
            });
        }
        out.push(ptrs);
    }
    CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(Some(out))
}

/// Bytes of the blocks a reduction goes through (in the first level cache): every source of a
/// block is read before its destination is written, so the destination may be a source.
const BLOCK: usize = 8 << 10;

/// `dst = op over src(r) + off` for `bytes` bytes, over the helper threads, block by block
/// through a buffer in the cache.
///
/// # Safety
/// `dst` holds `bytes` writable bytes; every source `srcs[r] + off` holds `bytes` readable
/// bytes that nobody writes during the call; `dst` overlaps no source, or is one exactly.
pub(super) unsafe fn par_reduce(
    ctx: &Ctx<'_>,
    dst: *mut u8,
    srcs: &[u64],
    off: usize,
    bytes: usize,
    dtype: ferrocx_plugin_sdk::abi::DataType,
    op: ferrocx_plugin_sdk::abi::ReduceOp,
) -> Result<()> {
    let es = super::algo::elem_size(dtype)?;
    let h = &ctx.comm.helpers;
    let per = (bytes.div_ceil(h.parts() * 4) / BLOCK + 1) * BLOCK;
    let units = bytes.div_ceil(per).max(1);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let n = srcs.len();
    let dst_at = dst as usize;
    h.run(units, &|u| {
        let lo = u * per;
        let hi = ((u + 1) * per).min(bytes);
        let mut buf = [0u8; BLOCK];
        let mut at = lo;
        while at < hi {
            let len = BLOCK.min(hi - at) / es * es;
            if len == 0 {
                break;
            }
            // SAFETY: every source holds `bytes` from `off` (the caller's contract); `buf`
            // holds BLOCK >= len bytes and overlaps nothing.
            let r = unsafe {
                super::algo::reduce_into(
                    buf.as_mut_ptr(),
                    len,
                    n,
                    |r| (srcs[r] as usize + off + at) as *const u8,
                    dtype,
                    op,
                )
            };
            if r.is_err() {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            }
            // SAFETY: `dst` holds `bytes` (the caller's contract); the block's sources were
            // all read above.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), (dst_at + at) as *mut u8, len) };
            at += len;
        }
    })?;
    if failed.into_inner() {
        return Err(ferrocx_plugin_sdk::Error::internal(
            "a reduction of peers' inputs failed",
        ));
    }
    Ok(())
}

/// Copies every peer's block (`srcs[r]`, `bytes` each) into `recv` at `r * bytes`, over the
/// helper threads; this rank's own block from `own` unless it is there already (in place).
///
/// # Safety
/// `recv` holds `srcs.len() * bytes` writable bytes; every source holds `bytes` readable
/// bytes that nobody writes during the call, none overlapping the blocks of `recv` written
/// (a source may be this rank's own block of `recv`, which is then not written).
pub(super) unsafe fn par_gather(
    ctx: &Ctx<'_>,
    recv: *mut u8,
    srcs: &[u64],
    bytes: usize,
) -> Result<()> {
    let recv_at = recv as usize;
    let jobs: Vec<(usize, usize, usize)> = (0..srcs.len())
        .map(|r| (recv_at + r * bytes, srcs[r] as usize, bytes))
        .filter(|&(d, s, n)| d != s && n > 0)
        .collect();
    // SAFETY: this function's contract.
    unsafe { par_copies(ctx, &jobs) }
}

/// Copies `(dst, src, bytes)` jobs over the helper threads, each cut into pieces.
///
/// # Safety
/// Every destination holds its bytes, writable, overlapping no other job's destination nor any
/// source; every source holds its bytes, readable, not written during the call.
pub(super) unsafe fn par_copies(ctx: &Ctx<'_>, jobs: &[(usize, usize, usize)]) -> Result<()> {
    let h = &ctx.comm.helpers;
    let total: usize = jobs.iter().map(|j| j.2).sum();
    let per = (total.div_ceil(h.parts() * 4) / BLOCK + 1) * BLOCK;
    let units: Vec<(usize, usize, usize)> = jobs
        .iter()
        .flat_map(|&(d, s, n)| {
            (0..n.div_ceil(per)).map(move |p| (d + p * per, s + p * per, per.min(n - p * per)))
        })
        .collect();
    h.run(units.len(), &|u| {
        let (d, s, n) = units[u];
        // SAFETY: this function's contract; the pieces of a job are disjoint.
        unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, n) };
    })
}
