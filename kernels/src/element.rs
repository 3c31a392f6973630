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

/// Elements reduced per pass: an accumulator of this many stays in registers and L1.
const BLOCK: usize = 256;

/// One element type's loads and stores, through its accumulator type.
trait Lane {
    type Acc: Copy + Default;
    const SIZE: usize;
    fn load(b: &[u8]) -> Self::Acc;
    fn store(a: Self::Acc, b: &mut [u8]);
}

/// One reduction on an accumulator type.
trait Combine<A> {
    fn apply(a: A, b: A) -> A;
}

struct LaneF32;
struct LaneBf16;
struct LaneF16;
struct LaneI32;

fn bytes4(b: &[u8]) -> [u8; 4] {
    let mut w = [0u8; 4];
    w.copy_from_slice(b);
    w
}

fn bytes2(b: &[u8]) -> [u8; 2] {
    let mut w = [0u8; 2];
    w.copy_from_slice(b);
    w
}

impl Lane for LaneF32 {
    type Acc = f32;
    const SIZE: usize = 4;
    fn load(b: &[u8]) -> f32 {
        f32::from_le_bytes(bytes4(b))
    }
    fn store(a: f32, b: &mut [u8]) {
        b.copy_from_slice(&a.to_le_bytes());
    }
}

impl Lane for LaneBf16 {
    type Acc = f32;
    const SIZE: usize = 2;
    fn load(b: &[u8]) -> f32 {
        bf16_to_f32(u16::from_le_bytes(bytes2(b)))
    }
    fn store(a: f32, b: &mut [u8]) {
        b.copy_from_slice(&f32_to_bf16(a).to_le_bytes());
    }
}

impl Lane for LaneF16 {
    type Acc = f32;
    const SIZE: usize = 2;
    fn load(b: &[u8]) -> f32 {
        f16_to_f32(u16::from_le_bytes(bytes2(b)))
    }
    fn store(a: f32, b: &mut [u8]) {
        b.copy_from_slice(&f32_to_f16(a).to_le_bytes());
    }
}

impl Lane for LaneI32 {
    type Acc = i32;
    const SIZE: usize = 4;
    fn load(b: &[u8]) -> i32 {
        i32::from_le_bytes(bytes4(b))
    }
    fn store(a: i32, b: &mut [u8]) {
        b.copy_from_slice(&a.to_le_bytes());
    }
}

struct Sum;
struct Min;
struct Max;

impl Combine<f32> for Sum {
    fn apply(a: f32, b: f32) -> f32 {
        a + b
    }
}
impl Combine<i32> for Sum {
    fn apply(a: i32, b: i32) -> i32 {
        a.wrapping_add(b)
    }
}
impl Combine<f32> for Min {
    fn apply(a: f32, b: f32) -> f32 {
        a.min(b)
    }
}
impl Combine<i32> for Min {
    fn apply(a: i32, b: i32) -> i32 {
        a.min(b)
    }
}
impl Combine<f32> for Max {
    fn apply(a: f32, b: f32) -> f32 {
        a.max(b)
    }
}
impl Combine<i32> for Max {
    fn apply(a: i32, b: i32) -> i32 {
        a.max(b)
    }
}

fn reduce_lane<L: Lane, C: Combine<L::Acc>>(dst: &mut [u8], srcs: &[&[u8]]) {
    let n = dst.len() / L::SIZE;
    let mut acc = [L::Acc::default(); BLOCK];
    let mut start = 0;
    while start < n {
        let m = BLOCK.min(n - start);
        let (lo, hi) = (start * L::SIZE, (start + m) * L::SIZE);
        let acc = &mut acc[..m];
        for (a, b) in acc.iter_mut().zip(srcs[0][lo..hi].chunks_exact(L::SIZE)) {
            *a = L::load(b);
        }
        for src in &srcs[1..] {
            for (a, b) in acc.iter_mut().zip(src[lo..hi].chunks_exact(L::SIZE)) {
                *a = C::apply(*a, L::load(b));
            }
        }
        for (a, b) in acc.iter().zip(dst[lo..hi].chunks_exact_mut(L::SIZE)) {
            L::store(*a, b);
        }
        start += m;
    }
}

fn reduce_elem<C>(dst: &mut [u8], srcs: &[&[u8]], elem: Elem)
where
    C: Combine<f32> + Combine<i32>,
{
    match elem {
        Elem::F32 => reduce_lane::<LaneF32, C>(dst, srcs),
        Elem::Bf16 => reduce_lane::<LaneBf16, C>(dst, srcs),
        Elem::F16 => reduce_lane::<LaneF16, C>(dst, srcs),
        Elem::I32 => reduce_lane::<LaneI32, C>(dst, srcs),
    }
}

/// Reduces `srcs` element-wise into `dst`, combining them in the order given (the order fixes
/// the rounding, so every rank that reduces the same sources in the same order gets the same
/// bits). Every source holds at least `dst.len()` bytes; `dst` holds whole elements; there
/// is at least one source.
pub fn reduce(dst: &mut [u8], srcs: &[&[u8]], elem: Elem, op: Op) {
    debug_assert!(!srcs.is_empty() && srcs.iter().all(|s| s.len() >= dst.len()));
    if srcs.is_empty() {
        return;
    }
    match op {
        Op::Sum => reduce_elem::<Sum>(dst, srcs, elem),
        Op::Min => reduce_elem::<Min>(dst, srcs, elem),
        Op::Max => reduce_elem::<Max>(dst, srcs, elem),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_trip_every_finite_value() {
        for h in 0..=u16::MAX {
            let exp = (h >> 10) & 0x1f;
            if exp == 0x1f && h & 0x3ff != 0 {
                assert!(f16_to_f32(h).is_nan());
                continue;
            }
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "f16 {h:#06x}");
            let b = bf16_to_f32(h);
            if !b.is_nan() {
                assert_eq!(f32_to_bf16(b), h, "bf16 {h:#06x}");
            }
        }
    }

    #[test]
    fn half_rounding_is_to_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and the next f16; ties go to the even one (1.0).
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(70000.0), 0x7c00);
        assert_eq!(f32_to_f16(2f32.powi(-24)), 1);
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
    }

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
