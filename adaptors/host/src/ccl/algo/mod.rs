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
pub use all_reduce::all_reduce;
pub use all_to_allv::all_to_allv;
pub use broadcast::broadcast;
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
