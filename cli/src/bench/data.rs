//! What the ranks write into their inputs and what they must read back.
//!
//! Element `i` of rank `r`'s input is `(7r + 3i) mod 11` (for a product, 1 or 2 by the parity
//! of that): small integers, so sums are exact in every type and any rank can reproduce any
//! other's input. Everything is periodic in `i` with period 11, so a buffer is described by an
//! 11-element [`Pattern`] and a phase, and the reference of a reduction is 11 values computed
//! here, independently of the CCL under test (its own wrapping and rounding rules included),
//! by the conformance kit's reference ([`ferrocx_conformance::values`]).

use ferrocx::abi::{DataType, ReduceOp};
use ferrocx_conformance::values::{self, decode, is_float, Value};

/// Period of every input, in elements.
pub const PERIOD: usize = 11;

/// Element `index` of `rank`'s input, before encoding; `prod` selects the product's values
/// (1 or 2, so a product of many ranks stays representable in floats).
pub fn value(rank: usize, index: usize, prod: bool) -> i128 {
    let base = ((rank % PERIOD) * 7 + (index % PERIOD) * 3) % PERIOD;
    if prod {
        1 + (base % 2) as i128
    } else {
        base as i128
    }
}

/// `PERIOD` encoded elements: element `k` of a buffer of phase `p` is element `(p + k) % PERIOD`.
#[derive(Clone, Debug, PartialEq)]
pub struct Pattern {
    dtype: DataType,
    es: usize,
    bytes: Vec<u8>,
}

impl Pattern {
    fn from_fn(dtype: DataType, f: impl Fn(usize) -> Value) -> Pattern {
        let es = dtype.size().unwrap_or(1);
        let mut bytes = Vec::with_capacity(PERIOD * es);
        for k in 0..PERIOD {
            values::encode_into(dtype, f(k), &mut bytes);
        }
        Pattern { dtype, es, bytes }
    }

    /// `rank`'s input.
    pub fn input(dtype: DataType, rank: usize, prod: bool) -> Pattern {
        Pattern::from_fn(dtype, |k| Value::Int(value(rank, k, prod)))
    }

    /// Every one of `nranks` ranks' inputs reduced with `op`: what all_reduce returns.
    pub fn reduced(dtype: DataType, nranks: usize, op: ReduceOp) -> Pattern {
        let prod = op == ReduceOp::PROD;
        let n = nranks.max(1);
        Pattern::from_fn(dtype, |k| {
            let vals: Vec<i128> = (0..n).map(|r| value(r, k, prod)).collect();
            values::reduce(dtype, op, &vals)
        })
    }

    /// Fills `dst` (whole elements) with this pattern starting at `phase`.
    pub fn fill(&self, dst: &mut [u8], phase: usize) {
        let period = self.bytes.len();
        if period == 0 {
            return;
        }
        // One period rotated to start at `phase`, then copied over `dst` period by period.
        let start = (phase % PERIOD) * self.es;
        let mut tile = Vec::with_capacity(period);
        tile.extend_from_slice(&self.bytes[start..]);
        tile.extend_from_slice(&self.bytes[..start]);
        for chunk in dst.chunks_mut(period) {
            chunk.copy_from_slice(&tile[..chunk.len()]);
        }
    }

    /// Elements of `got` (whole elements) that differ from this pattern starting at `phase`.
    /// Floats are compared with a tolerance of a few units in the last place of their type
    /// (a CCL may reduce in another order or scale before summing); integers exactly.
    pub fn wrong(&self, got: &[u8], phase: usize) -> u64 {
        let es = self.es;
        let mut wrong = 0;
        for (k, elem) in got.chunks_exact(es).enumerate() {
            let at = ((phase + k) % PERIOD) * es;
            let want = &self.bytes[at..at + es];
            if elem == want {
                continue;
            }
            let ok = is_float(self.dtype) && {
                let (g, w) = (decode(self.dtype, elem), decode(self.dtype, want));
                (g - w).abs() <= tolerance(self.dtype) * w.abs().max(1.0)
            };
            if !ok {
                wrong += 1;
            }
        }
        wrong
    }
}

/// Relative tolerance of a float comparison.
fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F64 => 1e-12,
        DataType::F32 => 1e-5,
        DataType::F16 => 2e-3,
        _ => 1e-2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_wrap_and_round_like_the_type() {
        // Rank r, element 0: 7r mod 11 = 0, 7, 3, 10 for r = 0..4: sum 20, max 10, min 0.
        let sum = Pattern::reduced(DataType::I32, 4, ReduceOp::SUM);
        assert_eq!(&sum.bytes[..4], &20i32.to_ne_bytes());
        let avg = Pattern::reduced(DataType::F32, 4, ReduceOp::AVG);
        assert_eq!(&avg.bytes[..4], &5f32.to_ne_bytes());
        let max = Pattern::reduced(DataType::U8, 4, ReduceOp::MAX);
        assert_eq!(max.bytes[0], 10);
        // 30 ranks of sums in i8 wrap.
        let total: i128 = (0..30).map(|r| value(r, 0, false)).sum();
        let s8 = Pattern::reduced(DataType::I8, 30, ReduceOp::SUM);
        assert_eq!(s8.bytes[0] as i8, total as i8);
    }

    #[test]
    fn fill_and_check_agree_at_any_phase() {
        for dtype in DataType::ALL {
            let p = Pattern::input(dtype, 3, false);
            let es = dtype.size().unwrap();
            let mut buf = vec![0u8; 37 * es];
            p.fill(&mut buf, 5);
            assert_eq!(p.wrong(&buf, 5), 0, "{dtype:?}");
            assert!(p.wrong(&buf, 6) > 0, "{dtype:?}");
            // The most significant byte: a change no float tolerance accepts.
            let msb = if cfg!(target_endian = "little") {
                es - 1
            } else {
                0
            };
            buf[es * 3 + msb] ^= 0x40;
            assert_eq!(p.wrong(&buf, 5), 1, "{dtype:?}");
        }
    }
}
