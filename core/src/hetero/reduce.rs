//! Element reductions on host memory for the bridge: `dst = op over sources`, sources taken in
//! the order given (cluster order), so that every owner of a piece gets the same bits.

use crate::abi::{DataType, ReduceOp};
use crate::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// `true` when the bridge reduces `dtype` with `op` (`AVG`: floating types only).
pub fn supports(dtype: DataType, op: ReduceOp) -> bool {
    let float = matches!(
        dtype,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
    );
    dtype.size().is_some()
        && (matches!(
            op,
            ReduceOp::SUM | ReduceOp::PROD | ReduceOp::MIN | ReduceOp::MAX
        ) || (op == ReduceOp::AVG && float))
}

macro_rules! fold {
    ($t:ty, $dst:expr, $srcs:expr, $n:expr, $op:expr, $add:expr, $mul:expr, $lt:expr, $scale:expr) => {{
        let dst = $dst.cast::<$t>();
        for i in 0..$n {
            // SAFETY: by `reduce`'s contract every source holds `n` elements (unaligned reads).
            let mut acc = unsafe { $srcs[0].cast::<$t>().add(i).read_unaligned() };
            for s in &$srcs[1..] {
                // SAFETY: as above.
                let v = unsafe { s.cast::<$t>().add(i).read_unaligned() };
                acc = match $op {
                    ReduceOp::PROD => $mul(acc, v),
                    ReduceOp::MIN => {
                        if $lt(v, acc) {
                            v
                        } else {
                            acc
                        }
                    }
                    ReduceOp::MAX => {
                        if $lt(acc, v) {
                            v
                        } else {
                            acc
                        }
                    }
                    _ => $add(acc, v),
                };
            }
            if let Some(d) = $scale {
                acc = d(acc);
            }
            // SAFETY: `dst` holds `n` elements.
            unsafe { dst.add(i).write_unaligned(acc) };
        }
    }};
}

/// `dst[i] = op(srcs[0][i], srcs[1][i], ...)` for `n` elements; `divisor` (for `AVG`) divides
/// the sum.
///
/// # Safety
/// Every source holds `n` elements of `dtype` and `dst` room for them; `dst` is a source or
/// overlaps none.
pub unsafe fn reduce(
    dst: *mut u8,
    srcs: &[*const u8],
    n: usize,
    dtype: DataType,
    op: ReduceOp,
    divisor: usize,
) {
    if srcs.is_empty() || n == 0 {
        return;
    }
    let avg = op == ReduceOp::AVG;
    let d = divisor.max(1);
    match dtype {
        DataType::F32 => fold!(
            f32,
            dst,
            srcs,
            n,
            op,
            |a: f32, b| a + b,
            |a: f32, b| a * b,
            |a: f32, b: f32| a < b,
            avg.then_some(|a: f32| a / d as f32)
        ),
        DataType::F64 => fold!(
            f64,
            dst,
            srcs,
            n,
            op,
            |a: f64, b| a + b,
            |a: f64, b| a * b,
            |a: f64, b: f64| a < b,
            avg.then_some(|a: f64| a / d as f64)
        ),
        DataType::BF16 => {
            let f = |a: u16, b: u16, g: fn(f32, f32) -> f32| {
                f32_to_bf16(g(bf16_to_f32(a), bf16_to_f32(b)))
            };
            fold!(
                u16,
                dst,
                srcs,
                n,
                op,
                |a, b| f(a, b, |x, y| x + y),
                |a, b| f(a, b, |x, y| x * y),
                |a: u16, b: u16| bf16_to_f32(a) < bf16_to_f32(b),
                avg.then_some(|a: u16| f32_to_bf16(bf16_to_f32(a) / d as f32))
            )
        }
        DataType::F16 => {
            let f = |a: u16, b: u16, g: fn(f32, f32) -> f32| {
                f32_to_f16(g(f16_to_f32(a), f16_to_f32(b)))
            };
            fold!(
                u16,
                dst,
                srcs,
                n,
                op,
                |a, b| f(a, b, |x, y| x + y),
                |a, b| f(a, b, |x, y| x * y),
                |a: u16, b: u16| f16_to_f32(a) < f16_to_f32(b),
                avg.then_some(|a: u16| f32_to_f16(f16_to_f32(a) / d as f32))
            )
        }
        DataType::I8 => fold!(
            i8,
            dst,
            srcs,
            n,
            op,
            i8::wrapping_add,
            i8::wrapping_mul,
            |a: i8, b: i8| a < b,
            None::<fn(i8) -> i8>
        ),
        DataType::U8 => fold!(
            u8,
            dst,
            srcs,
            n,
            op,
            u8::wrapping_add,
            u8::wrapping_mul,
            |a: u8, b: u8| a < b,
            None::<fn(u8) -> u8>
        ),
        DataType::I32 => fold!(
            i32,
            dst,
            srcs,
            n,
            op,
            i32::wrapping_add,
            i32::wrapping_mul,
            |a: i32, b: i32| a < b,
            None::<fn(i32) -> i32>
        ),
        DataType::U32 => fold!(
            u32,
            dst,
            srcs,
            n,
            op,
            u32::wrapping_add,
            u32::wrapping_mul,
            |a: u32, b: u32| a < b,
            None::<fn(u32) -> u32>
        ),
        DataType::I64 => fold!(
            i64,
            dst,
            srcs,
            n,
            op,
            i64::wrapping_add,
            i64::wrapping_mul,
            |a: i64, b: i64| a < b,
            None::<fn(i64) -> i64>
        ),
        DataType::U64 => fold!(
            u64,
            dst,
            srcs,
            n,
            op,
            u64::wrapping_add,
            u64::wrapping_mul,
            |a: u64, b: u64| a < b,
            None::<fn(u64) -> u64>
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_maxima_in_order() {
        let a = [1.5f32, -2.0, 3.0];
        let b = [0.5f32, 4.0, -1.0];
        let mut out = [0f32; 3];
        let srcs = [a.as_ptr().cast(), b.as_ptr().cast()];
        // SAFETY: three f32 each.
        unsafe {
            reduce(
                out.as_mut_ptr().cast(),
                &srcs,
                3,
                DataType::F32,
                ReduceOp::SUM,
                1,
            )
        };
        assert_eq!(out, [2.0, 2.0, 2.0]);
        // SAFETY: as above.
        unsafe {
            reduce(
                out.as_mut_ptr().cast(),
                &srcs,
                3,
                DataType::F32,
                ReduceOp::MAX,
                1,
            )
        };
        assert_eq!(out, [1.5, 4.0, 3.0]);
        // SAFETY: as above.
        unsafe {
            reduce(
                out.as_mut_ptr().cast(),
                &srcs,
                3,
                DataType::F32,
                ReduceOp::AVG,
                2,
            )
        };
        assert_eq!(out, [1.0, 1.0, 1.0]);
        let x = [i32::MAX, 7];
        let y = [1i32, -9];
        let mut o = [0i32; 2];
        let s = [x.as_ptr().cast(), y.as_ptr().cast()];
        // SAFETY: two i32 each.
        unsafe {
            reduce(
                o.as_mut_ptr().cast(),
                &s,
                2,
                DataType::I32,
                ReduceOp::SUM,
                1,
            )
        };
        assert_eq!(o, [i32::MIN, -2]);
        assert!(supports(DataType::BF16, ReduceOp::AVG) && !supports(DataType::I32, ReduceOp::AVG));
    }
}
