//! Element-wise reductions over byte buffers, for every data type and op of the ABI: the one
//! implementation the host CCL, the host device's emulated multicast and the host window
//! algorithms share.
//!
//! Elements are in the byte order of this machine. f16 and bf16 are reduced in f32 and rounded
//! back once per result (round to nearest even). Sources are combined in the order given, so
//! every rank that reduces the same sources in the same order gets the same bits. Integer sums
//! and products wrap.

use std::fmt;

use crate::abi::{DataType, ReduceOp};
use crate::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// Why a reduction was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceError {
    /// A data type the ABI does not define.
    UnknownType(DataType),
    /// A reduction the ABI does not define.
    UnknownOp(ReduceOp),
}

impl fmt::Display for ReduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceError::UnknownType(t) => write!(f, "unknown data type {}", t.0),
            ReduceError::UnknownOp(o) => write!(f, "unknown reduction op {}", o.0),
        }
    }
}

impl std::error::Error for ReduceError {}

trait Elem: Copy {
    fn combine(self, other: Self, op: ReduceOp) -> Self;
    fn divide(self, n: usize) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline(always)]
            fn combine(self, o: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::PROD => self.wrapping_mul(o),
                    ReduceOp::MIN => self.min(o),
                    ReduceOp::MAX => self.max(o),
                    _ => self.wrapping_add(o),
                }
            }
            #[inline(always)]
            fn divide(self, n: usize) -> Self {
                self / (n as $t)
            }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            #[inline(always)]
            fn combine(self, o: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::PROD => self * o,
                    ReduceOp::MIN => self.min(o),
                    ReduceOp::MAX => self.max(o),
                    _ => self + o,
                }
            }
            #[inline(always)]
            fn divide(self, n: usize) -> Self {
                self / n as $t
            }
        }
    )*};
}
float_elem!(f32, f64);

/// `dst[i] = dst[i] op src[i]`, with the op matched once outside the loop so each loop
/// vectorises.
fn fold<T: Elem>(dst: &mut [T], src: &[T], op: ReduceOp) {
    macro_rules! lp {
        ($op:expr) => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = d.combine(*s, $op);
            }
        };
    }
    match op {
        ReduceOp::PROD => lp!(ReduceOp::PROD),
        ReduceOp::MIN => lp!(ReduceOp::MIN),
        ReduceOp::MAX => lp!(ReduceOp::MAX),
        _ => lp!(ReduceOp::SUM),
    }
}

/// Reinterprets aligned bytes as elements (alignment checked by [`reduce`]).
fn cast<T>(b: &[u8]) -> &[T] {
    assert_eq!(
        b.as_ptr() as usize % std::mem::align_of::<T>(),
        0,
        "misaligned reduction buffer"
    );
    // SAFETY: alignment checked; every bit pattern is a valid value of the numeric types used.
    unsafe {
        std::slice::from_raw_parts(b.as_ptr() as *const T, b.len() / std::mem::size_of::<T>())
    }
}

fn cast_mut<T>(b: &mut [u8]) -> &mut [T] {
    assert_eq!(
        b.as_ptr() as usize % std::mem::align_of::<T>(),
        0,
        "misaligned reduction buffer"
    );
    // SAFETY: as in `cast`, and the borrow is unique.
    unsafe {
        std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut T, b.len() / std::mem::size_of::<T>())
    }
}

fn reduce_typed<T: Elem>(dst: &mut [u8], srcs: &[&[u8]], op: ReduceOp, avg_n: Option<usize>) {
    let d = cast_mut::<T>(dst);
    let n = d.len();
    d.copy_from_slice(&cast::<T>(srcs[0])[..n]);
    for s in &srcs[1..] {
        fold(d, &cast::<T>(s)[..n], op);
    }
    if let Some(n) = avg_n {
        for x in d.iter_mut() {
            *x = x.divide(n);
        }
    }
}

fn reduce_half(dst: &mut [u8], srcs: &[&[u8]], op: ReduceOp, avg_n: Option<usize>, bf: bool) {
    type Convert = (fn(u16) -> f32, fn(f32) -> u16);
    let (to, from): Convert = if bf {
        (bf16_to_f32, f32_to_bf16)
    } else {
        (f16_to_f32, f32_to_f16)
    };
    let d = cast_mut::<u16>(dst);
    let srcs: Vec<&[u16]> = srcs.iter().map(|s| cast::<u16>(s)).collect();
    // Accumulate in f32 through a small block so each element is rounded once.
    const BLOCK: usize = 1024;
    let mut acc = [0f32; BLOCK];
    let mut start = 0;
    while start < d.len() {
        let n = BLOCK.min(d.len() - start);
        for (a, h) in acc[..n].iter_mut().zip(&srcs[0][start..start + n]) {
            *a = to(*h);
        }
        for s in &srcs[1..] {
            for (a, h) in acc[..n].iter_mut().zip(&s[start..start + n]) {
                *a = a.combine(to(*h), op);
            }
        }
        for (o, a) in d[start..start + n].iter_mut().zip(&acc[..n]) {
            let v = match avg_n {
                Some(k) => *a / k as f32,
                None => *a,
            };
            *o = from(v);
        }
        start += n;
    }
}

/// `dst = op over srcs` element-wise. Every source holds at least `dst.len()` bytes (only the
/// first `dst.len()` are read), `dst` holds whole elements of `dtype`, `dst` is none of `srcs`,
/// and there is at least one source. `AVG` divides the sum by `srcs.len()`. Buffers need not be
/// aligned: misaligned ones are reduced through aligned copies.
pub fn reduce(
    dst: &mut [u8],
    srcs: &[&[u8]],
    dtype: DataType,
    op: ReduceOp,
) -> Result<(), ReduceError> {
    reduce_averaged_over(dst, srcs, dtype, op, srcs.len())
}

/// As [`reduce`], with `AVG` dividing the sum by `ranks` instead of the number of sources: for
/// sources that are themselves sums over several ranks (the cross-cluster bridge reduces one
/// partial sum per cluster, `ranks` ranks in all).
pub fn reduce_averaged_over(
    dst: &mut [u8],
    srcs: &[&[u8]],
    dtype: DataType,
    op: ReduceOp,
    ranks: usize,
) -> Result<(), ReduceError> {
    let size = dtype.size().ok_or(ReduceError::UnknownType(dtype))?;
    if op.name().is_none() {
        return Err(ReduceError::UnknownOp(op));
    }
    debug_assert!(!srcs.is_empty() && srcs.iter().all(|s| s.len() >= dst.len()));
    debug_assert!(dst.len() % size == 0);
    if srcs.is_empty() {
        return Ok(());
    }
    let aligned = |b: &[u8]| b.as_ptr() as usize % size == 0;
    if aligned(dst) && srcs.iter().all(|s| aligned(s)) {
        reduce_aligned(dst, srcs, dtype, op, ranks);
    } else {
        reduce_staged(dst, srcs, dtype, op, ranks);
    }
    Ok(())
}

/// [`reduce`] of aligned buffers (type and op checked); `AVG` divides by `ranks`.
fn reduce_aligned(dst: &mut [u8], srcs: &[&[u8]], dtype: DataType, op: ReduceOp, ranks: usize) {
    let avg = (op == ReduceOp::AVG).then_some(ranks.max(1));
    let op = if op == ReduceOp::AVG {
        ReduceOp::SUM
    } else {
        op
    };
    match dtype {
        DataType::F32 => reduce_typed::<f32>(dst, srcs, op, avg),
        DataType::F64 => reduce_typed::<f64>(dst, srcs, op, avg),
        DataType::F16 => reduce_half(dst, srcs, op, avg, false),
        DataType::BF16 => reduce_half(dst, srcs, op, avg, true),
        DataType::I8 => reduce_typed::<i8>(dst, srcs, op, avg),
        DataType::U8 => reduce_typed::<u8>(dst, srcs, op, avg),
        DataType::I32 => reduce_typed::<i32>(dst, srcs, op, avg),
        DataType::U32 => reduce_typed::<u32>(dst, srcs, op, avg),
        DataType::I64 => reduce_typed::<i64>(dst, srcs, op, avg),
        DataType::U64 => reduce_typed::<u64>(dst, srcs, op, avg),
        _ => unreachable!("size() checked the type"),
    }
}

/// [`reduce`] of buffers some of which are misaligned: block by block through aligned copies
/// (the same bits as the aligned path: each element is combined in the same order).
fn reduce_staged(dst: &mut [u8], srcs: &[&[u8]], dtype: DataType, op: ReduceOp, ranks: usize) {
    /// Bytes per block: a multiple of every element size.
    const BLOCK: usize = 4096;
    let words = BLOCK / 8;
    let mut stage = vec![0u64; words * (srcs.len() + 1)];
    let mut start = 0;
    while start < dst.len() {
        let n = BLOCK.min(dst.len() - start);
        let (out, ins) = stage.split_at_mut(words);
        let ins: Vec<&[u8]> = ins
            .chunks_mut(words)
            .zip(srcs)
            .map(|(w, s)| {
                let b = bytes_of(w, n);
                b.copy_from_slice(&s[start..start + n]);
                &*b
            })
            .collect();
        let out = bytes_of(out, n);
        reduce_aligned(out, &ins, dtype, op, ranks);
        dst[start..start + n].copy_from_slice(out);
        start += n;
    }
}

/// The first `n` bytes of `words`, 8-byte aligned.
fn bytes_of(words: &mut [u64], n: usize) -> &mut [u8] {
    assert!(n <= words.len() * 8);
    // SAFETY: `words` holds at least `n` bytes, borrowed uniquely; any byte pattern is a u8.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), n) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_and_op_against_a_scalar_reference() {
        let a: Vec<i64> = vec![3, -7, 100, 0, 5];
        let b: Vec<i64> = vec![-2, 9, 1, 4, 5];
        let c: Vec<i64> = vec![1, 1, -50, 2, 5];
        for op in ReduceOp::ALL {
            let expect: Vec<i64> = (0..5)
                .map(|i| {
                    let (x, y, z) = (a[i], b[i], c[i]);
                    match op {
                        ReduceOp::SUM => x + y + z,
                        ReduceOp::PROD => x * y * z,
                        ReduceOp::MIN => x.min(y).min(z),
                        ReduceOp::MAX => x.max(y).max(z),
                        _ => (x + y + z) / 3,
                    }
                })
                .collect();
            let enc = |v: &[i64]| -> Vec<u8> {
                v.iter().flat_map(|x| (*x as i32).to_ne_bytes()).collect()
            };
            let (ea, eb, ec) = (enc(&a), enc(&b), enc(&c));
            let mut out = vec![0u8; ea.len()];
            reduce(&mut out, &[&ea, &eb, &ec], DataType::I32, op).unwrap();
            let got: Vec<i64> = out
                .chunks(4)
                .map(|c| i32::from_ne_bytes(c.try_into().unwrap()) as i64)
                .collect();
            assert_eq!(got, expect, "{op:?}");
            let encf = |v: &[i64]| -> Vec<u8> {
                v.iter()
                    .flat_map(|x| f32_to_bf16(*x as f32).to_ne_bytes())
                    .collect()
            };
            let (fa, fb, fc) = (encf(&a), encf(&b), encf(&c));
            let mut outf = vec![0u8; fa.len()];
            reduce(&mut outf, &[&fa, &fb, &fc], DataType::BF16, op).unwrap();
            for (i, ch) in outf.chunks(2).enumerate() {
                let v = bf16_to_f32(u16::from_ne_bytes(ch.try_into().unwrap()));
                let want = match op {
                    ReduceOp::AVG => (a[i] + b[i] + c[i]) as f32 / 3.0,
                    _ => expect[i] as f32,
                };
                assert!(
                    (v - want).abs() <= want.abs() / 64.0 + 1e-3,
                    "{op:?} {i}: {v} vs {want}"
                );
            }
        }
    }

    #[test]
    fn misaligned_and_longer_buffers_give_the_aligned_bits() {
        // 3000 f32 (more than one staging block), every type, through buffers one byte off.
        for dtype in DataType::ALL {
            let size = dtype.size().unwrap();
            let n = 3000 * 4 / size;
            let len = n * size;
            let srcs: Vec<Vec<u64>> = (0..3u64)
                .map(|r| {
                    (0..len.div_ceil(8) + 1)
                        .map(|i| (i as u64 * 0x9e37_79b9 + r * 0x1234_5678) & 0x3f3f_3f3f_3f3f_3f3f)
                        .collect()
                })
                .collect();
            let bytes = |w: &[u64]| -> Vec<u8> { w.iter().flat_map(|x| x.to_ne_bytes()).collect() };
            let raw: Vec<Vec<u8>> = srcs.iter().map(|w| bytes(w)).collect();
            for op in ReduceOp::ALL {
                let mut want = vec![0u64; len.div_ceil(8)];
                let aligned: Vec<&[u8]> = srcs.iter().map(|w| &bytemuck_u8(w)[..len]).collect();
                reduce(&mut bytemuck_u8_mut(&mut want)[..len], &aligned, dtype, op).unwrap();
                // Sources one byte into a copy, longer than the output; output one byte off too.
                let shifted: Vec<Vec<u8>> = raw
                    .iter()
                    .map(|r| {
                        let mut v = vec![0u8];
                        v.extend_from_slice(r);
                        v
                    })
                    .collect();
                let views: Vec<&[u8]> = shifted.iter().map(|v| &v[1..]).collect();
                let mut out = vec![0u8; len + 1];
                reduce(&mut out[1..], &views, dtype, op).unwrap();
                assert_eq!(&out[1..], &bytemuck_u8(&want)[..len], "{dtype:?} {op:?}");
            }
        }
    }

    fn bytemuck_u8(w: &[u64]) -> &[u8] {
        // SAFETY: u64s viewed as their bytes.
        unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), w.len() * 8) }
    }

    fn bytemuck_u8_mut(w: &mut [u64]) -> &mut [u8] {
        // SAFETY: u64s viewed as their bytes, borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr().cast::<u8>(), w.len() * 8) }
    }

    #[test]
    fn unknown_types_and_ops_are_refused_by_name() {
        let mut out = [0u8; 4];
        let e = reduce(&mut out, &[&[0u8; 4]], DataType(99), ReduceOp::SUM).unwrap_err();
        assert_eq!(e, ReduceError::UnknownType(DataType(99)));
        assert_eq!(e.to_string(), "unknown data type 99");
        let e = reduce(&mut out, &[&[0u8; 4]], DataType::I32, ReduceOp(9)).unwrap_err();
        assert_eq!(e.to_string(), "unknown reduction op 9");
    }
}
