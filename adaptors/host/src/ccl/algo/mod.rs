//! The collective algorithms over the segment's slots, one file each, and what they share:
//! element copies, a per-thread scratch buffer, shares of a range and the reduction of slots.

mod all_gather;
mod all_reduce;
mod all_to_allv;
mod broadcast;
mod exchange;

use std::cell::RefCell;

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

use super::ctx::Ctx;
use super::reduce::reduce;

pub use all_gather::all_gather;
pub use all_reduce::{all_reduce, all_reduce_is_line, all_reduce_is_one_round};
pub use all_to_allv::all_to_allv;
pub use broadcast::{broadcast, broadcast_is_one_round, broadcast_is_posted};
pub use exchange::exchange;

thread_local! {
    static SCRATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with an 8-byte-aligned scratch buffer of `bytes` bytes.
pub(super) fn with_scratch<R>(bytes: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let words = bytes.div_ceil(8);
        if s.len() < words {
            s.resize(words, 0);
        }
        // SAFETY: the Vec<u64> holds at least `bytes` bytes, 8-byte aligned.
        let b = unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, bytes) };
        f(b)
    })
}

/// Copies `n` bytes between addresses of this process (no-op for 0).
///
/// # Safety
/// Both ranges must be valid for `n` bytes.
pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    if n > 0 && !std::ptr::eq(dst, src) {
        // SAFETY: by the caller's contract; ranges may overlap (in-place user buffers).
        unsafe { std::ptr::copy(src, dst, n) };
    }
}

/// The element size of `dtype`, or an error.
pub fn elem_size(dtype: DataType) -> Result<usize> {
    dtype
        .size()
        .ok_or_else(|| Error::invalid_argument(format!("unknown data type {}", dtype.0)))
}

/// Element range `[lo, hi)` of share `r` when `n` elements are split over `k` ranks.
pub(super) fn share(n: usize, k: usize, r: usize) -> (usize, usize) {
    let base = n / k;
    let extra = n % k;
    let lo = r * base + r.min(extra);
    (lo, lo + base + usize::from(r < extra))
}

/// Bytes below which a copy or reduction is not split over helper threads (a fork-join costs
/// microseconds and a helper's wake-up; measured on a 16-core host: 64 KiB calls took 250 µs
/// split, 30 µs not): 256 KiB, or `FERROCX_HOST_PAR_MIN` bytes.
fn par_min_bytes() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("FERROCX_HOST_PAR_MIN")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(256 << 10)
    })
}

/// Byte range `[lo, hi)` of part `i` of `parts` over `len` bytes, cut at cache lines.
fn piece(len: usize, parts: usize, i: usize) -> (usize, usize) {
    let (lo, hi) = share(len.div_ceil(64), parts, i);
    ((lo * 64).min(len), (hi * 64).min(len))
}

/// Copies `n` bytes as [`copy`] does, split over the communicator's helper threads when large.
///
/// # Safety
/// As [`copy`]; the ranges do not overlap unless equal.
pub(super) unsafe fn par_copy(ctx: &Ctx<'_>, dst: *mut u8, src: *const u8, n: usize) -> Result<()> {
    let h = &ctx.comm.helpers;
    if !std::ptr::eq(dst, src) {
        ctx.comm.count_moved(2 * n);
    }
    if h.parts() == 1 || n < par_min_bytes() {
        // SAFETY: by the caller's contract.
        unsafe { copy(dst, src, n) };
        return Ok(());
    }
    let (d, s, parts) = (dst as usize, src as usize, h.parts());
    h.run(&|i| {
        let (lo, hi) = piece(n, parts, i);
        // SAFETY: disjoint parts of the caller's ranges.
        unsafe { copy((d + lo) as *mut u8, (s + lo) as *const u8, hi - lo) };
    })
}

/// A copy of `n` bytes from `src` to `dst` (addresses of this process), one job of a
/// [`par_step`].
#[derive(Clone, Copy)]
pub(super) struct Move {
    pub dst: usize,
    pub src: usize,
    pub n: usize,
}

/// The reduction of elements `[lo, hi)` of every rank's slot of parity `p` into `dst` (an
/// address), one job of a [`par_step`].
#[derive(Clone, Copy)]
pub(super) struct SlotReduce {
    pub p: usize,
    pub lo: usize,
    pub hi: usize,
    pub es: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub dst: usize,
}

/// Runs a reduction and some copies that touch disjoint memory, as one fork-join over the
/// communicator's helper threads when they are large (each job split over every thread, so a
/// step whose jobs differ in size still keeps every thread busy), on the calling thread
/// otherwise.
///
/// # Safety
/// Each copy as [`copy`] (ranges valid, disjoint from every other job's destination); the
/// reduction as [`reduce_slots`], its `dst` holding `(hi - lo) * es` bytes.
pub(super) unsafe fn par_step(
    ctx: &Ctx<'_>,
    red: Option<SlotReduce>,
    moves: &[Move],
) -> Result<()> {
    let h = &ctx.comm.helpers;
    let total = moves.iter().map(|m| m.n).sum::<usize>()
        + red.map_or(0, |r| (r.hi - r.lo) * r.es * ctx.n());
    // Each copy reads and writes its bytes; the reduction reads every rank's share, writes one.
    ctx.comm.count_moved(
        2 * moves.iter().map(|m| m.n).sum::<usize>()
            + red.map_or(0, |r| (r.hi - r.lo) * r.es * (ctx.n() + 1)),
    );
    let parts = if total < par_min_bytes() {
        1
    } else {
        h.parts()
    };
    let failed = std::sync::Mutex::new(None);
    let job = |i: usize| {
        if let Some(r) = red {
            let (a, b) = share(r.hi - r.lo, parts, i);
            if b > a {
                // SAFETY: a part of `r.dst`, disjoint from the other parts.
                let d = unsafe {
                    std::slice::from_raw_parts_mut((r.dst + a * r.es) as *mut u8, (b - a) * r.es)
                };
                // SAFETY: a part of the caller's range.
                let res =
                    unsafe { reduce_slots(ctx, r.p, r.lo + a, r.lo + b, r.es, r.dtype, r.op, d) };
                if let Err(e) = res {
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            }
        }
        for m in moves {
            let (lo, hi) = piece(m.n, parts, i);
            // SAFETY: disjoint parts of the caller's ranges.
            unsafe { copy((m.dst + lo) as *mut u8, (m.src + lo) as *const u8, hi - lo) };
        }
    };
    if parts == 1 {
        job(0);
    } else {
        h.run(&job)?;
    }
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Ranks whose sources [`reduce_into`] gathers on the stack; more take one allocation.
const STACK_SOURCES: usize = 16;

/// `dst = op over src(0..n)`, `bytes` bytes each, with no allocation for up to
/// [`STACK_SOURCES`] sources.
///
/// # Safety
/// `dst` holds `bytes` writable bytes; each `src(r)` holds `bytes` readable bytes, none of
/// which overlap `dst`, and nobody writes them during the call.
pub(super) unsafe fn reduce_into(
    dst: *mut u8,
    bytes: usize,
    n: usize,
    src: impl Fn(usize) -> *const u8,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    // SAFETY: by the caller's contract.
    let out = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
    // SAFETY: by the caller's contract.
    let at = |r: usize| unsafe { std::slice::from_raw_parts(src(r), bytes) };
    if n <= STACK_SOURCES {
        let mut srcs: [&[u8]; STACK_SOURCES] = [&[]; STACK_SOURCES];
        for (r, s) in srcs.iter_mut().enumerate().take(n) {
            *s = at(r);
        }
        reduce(out, &srcs[..n], dtype, op)
    } else {
        let srcs: Vec<&[u8]> = (0..n).map(at).collect();
        reduce(out, &srcs, dtype, op)
    }
}

/// Reduces elements `[lo, hi)` of every rank's slot of parity `p` into `dst`.
///
/// # Safety
/// `dst` must hold `(hi - lo) * es` bytes, aligned for the type.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn reduce_slots(
    ctx: &Ctx<'_>,
    p: usize,
    lo: usize,
    hi: usize,
    es: usize,
    dtype: DataType,
    op: ReduceOp,
    dst: &mut [u8],
) -> Result<()> {
    let len = (hi - lo) * es;
    let srcs: Vec<&[u8]> = (0..ctx.n())
        // SAFETY: each slot holds at least `hi * es` published bytes for this phase.
        .map(|r| unsafe { std::slice::from_raw_parts(ctx.slot(p, r).add(lo * es), len) })
        .collect();
    reduce(&mut dst[..len], &srcs, dtype, op)
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn shares_cover_everything_once() {
        for n in [0, 1, 5, 7, 64, 1000] {
            for k in 1..9 {
                let mut next = 0;
                for r in 0..k {
                    let (lo, hi) = share(n, k, r);
                    assert_eq!(lo, next);
                    next = hi;
                }
                assert_eq!(next, n);
            }
        }
    }
}
