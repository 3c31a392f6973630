//! Element-wise reductions over byte buffers, for every data type and op of the ABI.
//! f16 and bf16 are reduced in f32 and rounded back (round to nearest even).

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

pub use ferrocx::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

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

/// Reinterprets aligned bytes as elements.
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
    d.copy_from_slice(cast::<T>(srcs[0]));
    for s in &srcs[1..] {
        fold(d, cast::<T>(s), op);
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

/// `dst = op over srcs` element-wise. Every buffer has `dst.len()` bytes, is aligned for
/// `dtype`, and `dst` is none of `srcs`. `AVG` divides the sum by `srcs.len()`.
pub fn reduce(dst: &mut [u8], srcs: &[&[u8]], dtype: DataType, op: ReduceOp) -> Result<()> {
    let size = dtype
        .size()
        .ok_or_else(|| Error::invalid_argument(format!("unknown data type {}", dtype.0)))?;
    if op.name().is_none() {
        return Err(Error::invalid_argument(format!(
            "unknown reduction op {}",
            op.0
        )));
    }
    debug_assert!(srcs.iter().all(|s| s.len() == dst.len()) && dst.len() % size == 0);
    let avg = (op == ReduceOp::AVG).then_some(srcs.len());
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_trip_and_round_to_nearest_even() {
        for h in 0u16..=0xffff {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
            } else {
                assert_eq!(f32_to_f16(f), h, "{h:#x} -> {f}");
            }
        }
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00, "tie rounds to even");
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "overflow to infinity");
        for h in (0u16..=0xffff).step_by(7) {
            let f = bf16_to_f32(h);
            if !f.is_nan() {
                assert_eq!(f32_to_bf16(f), h);
            }
        }
    }

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
}
