//! The element types and reductions the window algorithms run: f32, bf16 and f16 (reduced in
//! f32, rounded to nearest even once per result), i32 (wrapping sum); sum, min and max.

use ferrocx::abi::{DataType, ReduceOp};
use ferrocx::window::collectives::CollectiveError;

/// A supported element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
    /// Signed 32-bit integer.
    I32,
}

impl Elem {
    /// Every supported type.
    pub const ALL: [Elem; 4] = [Elem::F32, Elem::Bf16, Elem::F16, Elem::I32];

    /// The type of `dtype`, or why it is not supported.
    pub fn of(dtype: DataType) -> Result<Elem, CollectiveError> {
        Ok(match dtype {
            DataType::F32 => Elem::F32,
            DataType::BF16 => Elem::Bf16,
            DataType::F16 => Elem::F16,
            DataType::I32 => Elem::I32,
            other => {
                return Err(CollectiveError::Unsupported(format!(
                    "data type {other:?} is not supported (f32, bf16, f16, i32)"
                )))
            }
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::Bf16 | Elem::F16 => 2,
        }
    }

    /// The name used in kernel names (`f32`, `bf16`, `f16`, `i32`).
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::Bf16 => "bf16",
            Elem::F16 => "f16",
            Elem::I32 => "i32",
        }
    }
}

/// A supported reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Sum.
    Sum,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

impl Op {
    /// Every supported reduction.
    pub const ALL: [Op; 3] = [Op::Sum, Op::Min, Op::Max];

    /// The reduction of `op`, or why it is not supported.
    pub fn of(op: ReduceOp) -> Result<Op, CollectiveError> {
        Ok(match op {
            ReduceOp::SUM => Op::Sum,
            ReduceOp::MIN => Op::Min,
            ReduceOp::MAX => Op::Max,
            other => {
                return Err(CollectiveError::Unsupported(format!(
                    "reduction {other:?} is not supported (sum, min, max)"
                )))
            }
        })
    }

    /// The name used in kernel names (`sum`, `min`, `max`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Min => "min",
            Op::Max => "max",
        }
    }
}

/// `true` when the window algorithms run `dtype` with `op`.
pub fn supports(dtype: DataType, op: ReduceOp) -> bool {
    Elem::of(dtype).is_ok() && Op::of(op).is_ok()
}

pub use ferrocx::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

impl Elem {
    /// The ABI's data type.
    pub fn dtype(self) -> DataType {
        match self {
            Elem::F32 => DataType::F32,
            Elem::Bf16 => DataType::BF16,
            Elem::F16 => DataType::F16,
            Elem::I32 => DataType::I32,
        }
    }
}

impl Op {
    /// The ABI's reduction.
    pub fn reduce_op(self) -> ReduceOp {
        match self {
            Op::Sum => ReduceOp::SUM,
            Op::Min => ReduceOp::MIN,
            Op::Max => ReduceOp::MAX,
        }
    }
}

/// Reduces `srcs` element-wise into `dst`, combining them in the order given (the order fixes
/// the rounding, so every rank that reduces the same sources in the same order gets the same
/// bits). Every source holds at least `dst.len()` bytes; `dst` holds whole elements; there
/// is at least one source. The host CCL's implementation ([`ferrocx::element::reduce`]).
pub fn reduce(dst: &mut [u8], srcs: &[&[u8]], elem: Elem, op: Op) {
    // Every Elem and Op is a type and reduction of the ABI: nothing to refuse.
    let r = ferrocx::element::reduce(dst, srcs, elem.dtype(), op.reduce_op());
    debug_assert!(r.is_ok(), "{r:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn reductions_match_a_direct_computation() {
        let n = 600; // more than one block
        let srcs: Vec<Vec<f32>> = (0..3)
            .map(|r| {
                (0..n)
                    .map(|i| ((i * 7 + r * 13) % 29) as f32 - 14.0)
                    .collect()
            })
            .collect();
        let bytes: Vec<Vec<u8>> = srcs.iter().map(|s| f32s(s)).collect();
        let views: Vec<&[u8]> = bytes.iter().map(|b| b.as_slice()).collect();
        for (op, f) in [
            (Op::Sum, (|a, b| a + b) as fn(f32, f32) -> f32),
            (Op::Min, f32::min),
            (Op::Max, f32::max),
        ] {
            let mut out = vec![0u8; n * 4];
            reduce(&mut out, &views, Elem::F32, op);
            let want: Vec<f32> = (0..n)
                .map(|i| f(f(srcs[0][i], srcs[1][i]), srcs[2][i]))
                .collect();
            assert_eq!(out, f32s(&want), "{op:?}");
        }
        // i32 sums wrap.
        let a = i32::MAX.to_le_bytes();
        let b = 2i32.to_le_bytes();
        let mut out = [0u8; 4];
        reduce(&mut out, &[&a, &b], Elem::I32, Op::Sum);
        assert_eq!(i32::from_le_bytes(out), i32::MIN + 1);
    }

    #[test]
    fn halves_are_summed_in_f32_and_rounded_once() {
        // x + eps + eps, where x + eps alone is a tie that rounds back to x: summing in the
        // half type would give x, summing in f32 gives x + 2 eps, which each type represents.
        let cases = [
            (Elem::Bf16, 2f32.powi(-8), f32_to_bf16 as fn(f32) -> u16),
            (Elem::F16, 2f32.powi(-11), f32_to_f16),
        ];
        for (elem, eps, to) in cases {
            let bytes: Vec<[u8; 2]> = [1.0, eps, eps]
                .iter()
                .map(|&x| to(x).to_le_bytes())
                .collect();
            let views: Vec<&[u8]> = bytes.iter().map(|b| b.as_slice()).collect();
            let mut out = [0u8; 2];
            reduce(&mut out, &views, elem, Op::Sum);
            assert_eq!(u16::from_le_bytes(out), to(1.0) + 1, "{elem:?}");
            assert_eq!(to(1.0 + eps), to(1.0), "{elem:?}: the tie rounds to even");
        }
    }

    #[test]
    fn unsupported_types_and_ops_are_named() {
        assert!(supports(DataType::BF16, ReduceOp::MAX));
        assert!(!supports(DataType::F64, ReduceOp::SUM));
        assert!(!supports(DataType::F32, ReduceOp::PROD));
        let e = Op::of(ReduceOp::AVG).unwrap_err().to_string();
        assert!(e.contains("avg") && e.contains("sum, min, max"), "{e}");
    }
}
