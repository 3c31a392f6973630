//! Element reductions on host memory for the bridge: `dst = op over sources`, sources taken in
//! the order given (cluster order), so that every owner of a piece gets the same bits. The
//! arithmetic is [`crate::element`]'s, shared with the host CCL and the window algorithms.

use crate::abi::{DataType, ReduceOp};

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
    let Some(size) = dtype.size() else {
        return;
    };
    if srcs.is_empty() || n == 0 {
        return;
    }
    let bytes = n * size;
    // The shared reduction takes an output none of its sources is: a source that is `dst`
    // itself is read from a copy.
    let own: Option<Vec<u8>> = srcs
        .iter()
        .any(|&s| std::ptr::eq(s, dst.cast_const()))
        // SAFETY: `dst` holds `n` elements (the contract).
        .then(|| unsafe { std::slice::from_raw_parts(dst.cast_const(), bytes) }.to_vec());
    let views: Vec<&[u8]> = srcs
        .iter()
        .map(|&s| match &own {
            Some(copy) if std::ptr::eq(s, dst.cast_const()) => copy.as_slice(),
            // SAFETY: every source holds `n` elements and overlaps `dst` only by being it
            // (handled above), so it is not written while this view lives.
            _ => unsafe { std::slice::from_raw_parts(s, bytes) },
        })
        .collect();
    // SAFETY: `dst` holds `n` elements and no view aliases it.
    let out = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
    // The type has a size and `supports` admitted the op before any plan reached here.
    let _ = crate::element::reduce_averaged_over(out, &views, dtype, op, divisor);
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

    #[test]
    fn in_place_and_averaged_over_every_rank_of_the_clusters() {
        // Two clusters' partial sums of 4 ranks in all: AVG divides by 4, not by 2; the output
        // is the first source itself.
        let mut a = [4.0f32, 8.0, -2.0];
        let b = [4.0f32, 0.0, 6.0];
        let dst = a.as_mut_ptr().cast::<u8>();
        let srcs = [dst.cast_const(), b.as_ptr().cast()];
        // SAFETY: three f32 each; `dst` is a source, which the function allows.
        unsafe { reduce(dst, &srcs, 3, DataType::F32, ReduceOp::AVG, 4) };
        assert_eq!(a, [2.0, 2.0, 1.0]);
        // bf16 sums accumulate in f32 and round once: 1 + 2^-8 + 2^-8 is 1 + 2^-7 exactly.
        let one = crate::half::f32_to_bf16(1.0);
        let tiny = crate::half::f32_to_bf16(1.0 / 256.0);
        let (p, q, r) = ([one], [tiny], [tiny]);
        let mut out = [0u16];
        let srcs = [p.as_ptr().cast(), q.as_ptr().cast(), r.as_ptr().cast()];
        // SAFETY: one bf16 each.
        unsafe {
            reduce(
                out.as_mut_ptr().cast(),
                &srcs,
                1,
                DataType::BF16,
                ReduceOp::SUM,
                1,
            )
        };
        assert_eq!(crate::half::bf16_to_f32(out[0]), 1.0 + 1.0 / 128.0);
    }
}
