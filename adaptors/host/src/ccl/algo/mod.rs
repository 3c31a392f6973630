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

use super::ctx::{Ctx, Desc};
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

/// Copies `n` bytes as [`copy`] does, with non-temporal (streaming) stores where `stream` is set
/// and the machine has them: the destination's cache lines are written without being read in
/// first (no read-for-ownership) and are not kept in the cache, which is what a copy into a
/// buffer much larger than the cache wants. The stores are weakly ordered: the thread that made
/// them must call [`stream_fence`] before anything that publishes the destination.
///
/// # Safety
/// As [`copy`]; with `stream`, the ranges do not overlap.
pub(super) unsafe fn copy_to(dst: *mut u8, src: *const u8, n: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && n >= STREAM_MIN_COPY {
        // SAFETY: by the caller's contract.
        unsafe { stream::copy(dst, src, n) };
        return;
    }
    let _ = stream;
    // SAFETY: by the caller's contract.
    unsafe { copy(dst, src, n) };
}

/// Copies shorter than this take ordinary stores even when streaming is asked for.
#[cfg(target_arch = "x86_64")]
const STREAM_MIN_COPY: usize = 256;

/// Makes the streaming stores of [`copy_to`] made by this thread visible to every other before
/// any later store (a no-op where there are none).
pub(super) fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is SSE, part of the x86_64 baseline; it only orders stores.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Streaming copies on x86_64: SSE2 (the baseline), or AVX where the CPU has it.
#[cfg(target_arch = "x86_64")]
mod stream {
    use std::arch::x86_64::*;

    /// Whether the CPU has AVX (probed once).
    fn avx() -> bool {
        static AVX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX.get_or_init(|| std::arch::is_x86_feature_detected!("avx"))
    }

    /// The head up to the destination's first 64-byte line and the tail after its last whole
    /// line by ordinary copies, whole lines in between by streaming stores.
    ///
    /// # Safety
    /// Both ranges are valid for `n` bytes and do not overlap.
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
        let head = dst.align_offset(64).min(n);
        let body = (n - head) / 64 * 64;
        // SAFETY: within the caller's ranges, which do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (d, s) = (dst.add(head), src.add(head));
            if avx() {
                lines_avx(d, s, body);
            } else {
                lines_sse2(d, s, body);
            }
            let done = head + body;
            std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n - done);
        }
    }

    /// # Safety
    /// `dst` is 64-byte aligned; both ranges hold `n` bytes (a multiple of 64), disjoint.
    unsafe fn lines_sse2(dst: *mut u8, src: *const u8, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: line `i` is within both ranges; `dst + i` is 16-byte aligned.
            unsafe {
                let s = src.add(i) as *const __m128i;
                let d = dst.add(i) as *mut __m128i;
                let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
                let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
            i += 64;
        }
    }

    /// # Safety
    /// As [`lines_sse2`], on a CPU with AVX.
    #[target_feature(enable = "avx")]
    unsafe fn lines_avx(dst: *mut u8, src: *const u8, n: usize) {
        let mut i = 0;
        while i < n {
            // SAFETY: line `i` is within both ranges; `dst + i` is 32-byte aligned.
            unsafe {
                let s = src.add(i) as *const __m256i;
                let d = dst.add(i) as *mut __m256i;
                let (a, b) = (_mm256_loadu_si256(s), _mm256_loadu_si256(s.add(1)));
                _mm256_stream_si256(d, a);
                _mm256_stream_si256(d.add(1), b);
            }
            i += 64;
        }
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

/// Whether a collective whose every rank writes `bytes` bytes of output, out of place, writes
/// them by streaming stores (see [`copy_to`]): when the ranks' outputs together (`n * bytes`)
/// exceed a quarter of the last-level cache (the share glibc's `memcpy` streams beyond), the
/// output would leave the cache before anyone reads it again, so reading its lines in before
/// writing them is wasted memory traffic. Never in place: there the output's lines were read
/// as input shortly before and are still in the cache. `FERROCX_HOST_STREAM_MIN` sets the
/// message size from which an out-of-place output is streamed instead (0: always; a huge
/// value: never).
pub(super) fn streams_out(bytes: usize, n: usize, in_place: bool) -> bool {
    static MIN: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let min = MIN.get_or_init(|| {
        std::env::var("FERROCX_HOST_STREAM_MIN")
            .ok()
            .and_then(|v| v.trim().parse().ok())
    });
    if in_place {
        return false;
    }
    match *min {
        Some(m) => bytes >= m,
        None => bytes.saturating_mul(n) > last_level_cache() / 4,
    }
}

/// Bytes of the largest cache of cpu 0 that Linux describes, else 32 MiB.
fn last_level_cache() -> usize {
    static LLC: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LLC.get_or_init(|| {
        (0..8)
            .filter_map(|i| {
                let p = format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size");
                let v = std::fs::read_to_string(p).ok()?;
                let v = v.trim();
                let (num, unit) = match v.strip_suffix(['K', 'M', 'G']) {
                    Some(num) => (num, v.as_bytes()[v.len() - 1]),
                    None => (v, b'B'),
                };
                let shift = match unit {
                    b'K' => 10,
                    b'M' => 20,
                    b'G' => 30,
                    _ => 0,
                };
                num.parse::<usize>().ok().map(|x| x << shift)
            })
            .max()
            .unwrap_or(32 << 20)
    })
}

/// Byte range `[lo, hi)` of part `i` of `parts` over `len` bytes, cut at cache lines.
fn piece(len: usize, parts: usize, i: usize) -> (usize, usize) {
    let (lo, hi) = share(len.div_ceil(64), parts, i);
    ((lo * 64).min(len), (hi * 64).min(len))
}

/// Units a thread's share of a split copy or step is cut into: the threads claim them one at a
/// time, so a preempted or late helper holds back one unit, not a share (see `helpers`).
const UNITS_PER_THREAD: usize = 4;

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
    let (d, s, units) = (dst as usize, src as usize, h.parts() * UNITS_PER_THREAD);
    h.run(units, &|i| {
        let (lo, hi) = piece(n, units, i);
        // SAFETY: disjoint parts of the caller's ranges.
        unsafe { copy((d + lo) as *mut u8, (s + lo) as *const u8, hi - lo) };
    })
}

/// A copy of `n` bytes from `src` to `dst` (addresses of this process), one job of a
/// [`par_step`]; with `stream`, by streaming stores (see [`copy_to`]).
#[derive(Clone, Copy)]
pub(super) struct Move {
    pub dst: usize,
    pub src: usize,
    pub n: usize,
    pub stream: bool,
}

/// The reduction of elements `[lo, hi)` of every rank's slot of parity `p` into `dst` (an
/// address), one job of a [`par_step`]. Where `own` is non-zero it is the address this rank's
/// elements `[lo, hi)` are read from instead of its slot; where `also` is non-zero the result
/// is written there too (by streaming stores with `stream`).
#[derive(Clone, Copy)]
pub(super) struct SlotReduce {
    pub p: usize,
    pub lo: usize,
    pub hi: usize,
    pub es: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub dst: usize,
    pub own: usize,
    pub also: usize,
    pub stream: bool,
}

/// The software-pipelined chunk loop of the large collectives (all-reduce, reduce-scatter,
/// all-gather): `first` (chunk 0 into this rank's slot) and the agreement, then for `k` in
/// `1..=chunks` one step (`step(ctx, k, moves)` fills `moves` and returns the reduction, run
/// together as one [`par_step`]) and one barrier; the last step's barrier only with
/// `last_barrier` (a collective whose last step leaves work that peers read). Chunk `k` lives
/// in slot parity `(g0 + k) % 2`, `g0` the agreement's generation (see [`slot_parity`]):
/// written in step `k`, read in step `k + 1`, rewritten in step `k + 2`, a barrier between
/// each.
///
/// # Safety
/// `first` and every step's moves and reduction as [`par_step`] requires, given the parities
/// above: a step writes nothing that a peer may still read in it.
pub(super) unsafe fn pipeline(
    ctx: &mut Ctx<'_>,
    desc: &Desc,
    chunks: usize,
    first: &[Move],
    last_barrier: bool,
    mut step: impl FnMut(&Ctx<'_>, usize, &mut Vec<Move>) -> Option<SlotReduce>,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { par_step(ctx, None, first) }?;
    ctx.agree(desc, None)?;
    let mut moves = Vec::with_capacity(ctx.n() + 2);
    for k in 1..=chunks {
        moves.clear();
        let red = step(ctx, k, &mut moves);
        // SAFETY: the caller's contract.
        unsafe { par_step(ctx, red, &moves) }?;
        if k < chunks || last_barrier {
            ctx.barrier(desc.kind.name())?;
        }
    }
    Ok(())
}

/// The slot parity of chunk `k` of a [`pipeline`] that agrees at generation `g0`.
pub(super) fn slot_parity(g0: u64, k: usize) -> usize {
    ((g0 + k as u64) % 2) as usize
}

/// Runs a reduction and some copies that touch disjoint memory, as one fork-join over the
/// communicator's helper threads when they are large (each job cut into the same units, a few
/// per thread, which the threads claim one at a time: a step whose jobs differ in size still
/// keeps every thread busy, and a descheduled thread holds back one unit), on the calling
/// thread otherwise.
///
/// # Safety
/// Each copy as [`copy_to`] (ranges valid, disjoint from every other job's destination); the
/// reduction as [`reduce_slots`], its `dst` (and `also`) holding `(hi - lo) * es` bytes.
pub(super) unsafe fn par_step(
    ctx: &Ctx<'_>,
    red: Option<SlotReduce>,
    moves: &[Move],
) -> Result<()> {
    let h = &ctx.comm.helpers;
    let total = moves.iter().map(|m| m.n).sum::<usize>()
        + red.map_or(0, |r| (r.hi - r.lo) * r.es * ctx.n());
    // Each copy reads and writes its bytes; the reduction reads every rank's share, writes one
    // (or two).
    ctx.comm.count_moved(
        2 * moves.iter().map(|m| m.n).sum::<usize>()
            + red.map_or(0, |r| {
                (r.hi - r.lo) * r.es * (ctx.n() + 1 + usize::from(r.also != 0))
            }),
    );
    let parts = if total < par_min_bytes() || h.parts() == 1 {
        1
    } else {
        h.parts() * UNITS_PER_THREAD
    };
    let streams = moves.iter().any(|m| m.stream) || red.is_some_and(|r| r.stream);
    let failed = std::sync::Mutex::new(None);
    let job = |i: usize| {
        if let Some(r) = red {
            let (a, b) = share(r.hi - r.lo, parts, i);
            if b > a {
                let at = |base: usize| if base == 0 { 0 } else { base + a * r.es };
                let part = SlotReduce {
                    lo: r.lo + a,
                    hi: r.lo + b,
                    dst: r.dst + a * r.es,
                    own: at(r.own),
                    also: at(r.also),
                    ..r
                };
                // SAFETY: a part of the caller's ranges, disjoint from the other parts.
                if let Err(e) = unsafe { reduce_slots(ctx, &part) } {
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
            unsafe {
                copy_to(
                    (m.dst + lo) as *mut u8,
                    (m.src + lo) as *const u8,
                    hi - lo,
                    m.stream,
                )
            };
        }
        if streams {
            stream_fence();
        }
    };
    if parts == 1 {
        job(0);
    } else {
        h.run(parts, &job)?;
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

/// Bytes of the block [`reduce_slots`] reduces at a time: small enough to stay in the first
/// level cache, large enough that the per-block work is small beside the data's.
const REDUCE_BLOCK: usize = 8 << 10;

/// Reduces elements `[r.lo, r.hi)` of every rank's slot of parity `r.p` (this rank's from
/// `r.own` where that is set) into `r.dst`, and into `r.also` where that is set. Block by
/// block through a buffer in the cache: each source is read once and each destination written
/// once, and a block's sources are all read before its destinations are written (so `r.also`
/// may be `r.own`, the same elements in place).
///
/// # Safety
/// `r.dst` holds `(r.hi - r.lo) * r.es` writable bytes, overlapping no source; `r.also` (if
/// set) as many, overlapping no source but `r.own` exactly; every rank's slot of parity `r.p`
/// holds elements `[r.lo, r.hi)` published for this phase, and `r.own` (if set) as many
/// elements, none of which anybody writes during the call but this one through `r.also`.
pub(super) unsafe fn reduce_slots(ctx: &Ctx<'_>, r: &SlotReduce) -> Result<()> {
    let len = (r.hi - r.lo) * r.es;
    let me = ctx.me();
    let src: Vec<*const u8> = (0..ctx.n())
        .map(|k| {
            if k == me && r.own != 0 {
                r.own as *const u8
            } else {
                // SAFETY: within the slot, which holds at least `r.hi * r.es` bytes.
                unsafe { ctx.slot(r.p, k).add(r.lo * r.es) as *const u8 }
            }
        })
        .collect();
    let mut block = [0u64; REDUCE_BLOCK / 8];
    let mut srcs: Vec<&[u8]> = Vec::with_capacity(src.len());
    let mut off = 0;
    while off < len {
        let n = REDUCE_BLOCK.min(len - off);
        // SAFETY: the block's bytes of each source, valid and unwritten while these slices
        // live (they are dropped before the destinations of the block are written).
        srcs.extend(
            src.iter()
                .map(|s| unsafe { std::slice::from_raw_parts(s.add(off), n) }),
        );
        // SAFETY: `block` holds REDUCE_BLOCK >= n bytes, 8-byte aligned.
        let out = unsafe { std::slice::from_raw_parts_mut(block.as_mut_ptr() as *mut u8, n) };
        let res = reduce(out, &srcs, r.dtype, r.op);
        srcs.clear();
        res?;
        // SAFETY: the block's bytes of the destinations (the caller's contract); the buffer
        // is none of them.
        unsafe {
            copy((r.dst + off) as *mut u8, out.as_ptr(), n);
            if r.also != 0 {
                copy_to((r.also + off) as *mut u8, out.as_ptr(), n, r.stream);
            }
        }
        off += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{copy_to, share, stream_fence};

    #[test]
    fn streaming_copies_copy_every_byte_and_nothing_else() {
        let src: Vec<u8> = ferrocx_test_support::random_bytes(0x57AE, 70_000);
        for n in [0, 1, 63, 64, 65, 255, 256, 257, 1000, 4096 + 7, 65_536 + 33] {
            for (so, d_off) in [(0, 0), (1, 0), (0, 1), (13, 37), (64, 63), (3, 64)] {
                let mut dst = vec![0xA5u8; n + d_off + 200];
                // SAFETY: both ranges hold `n` bytes (src has 70_000 >= n + 64 bytes) and are
                // different allocations.
                unsafe { copy_to(dst.as_mut_ptr().add(d_off), src.as_ptr().add(so), n, true) };
                stream_fence();
                assert_eq!(
                    &dst[d_off..d_off + n],
                    &src[so..so + n],
                    "n={n} +{so} -> +{d_off}"
                );
                assert!(
                    dst[..d_off]
                        .iter()
                        .chain(&dst[d_off + n..])
                        .all(|b| *b == 0xA5),
                    "n={n} +{so} -> +{d_off}: a byte outside the destination was written"
                );
            }
        }
    }

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
