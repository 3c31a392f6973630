//! What the ranks write into their inputs and what they must read back.
//!
//! Element `i` of rank `r`'s input is `(7r + 3i) mod 11` (for a product, 1 or 2 by the parity
//! of that): small integers, so sums are exact in every type and any rank can reproduce any
//! other's input. Everything is periodic in `i` with period 11, so a buffer is described by an
//! 11-element [`Pattern`] and a phase, and the reference of a reduction is 11 values computed
//! here, independently of the CCL under test (its own wrapping and rounding rules included).

use ferrocx::abi::{DataType, ReduceOp};

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
    fn from_fn(dtype: DataType, f: impl Fn(usize) -> Num) -> Pattern {
        let es = dtype.size().unwrap_or(1);
        let mut bytes = Vec::with_capacity(PERIOD * es);
        for k in 0..PERIOD {
            bytes.extend_from_slice(&encode(dtype, f(k)));
        }
        Pattern { dtype, es, bytes }
    }

    /// `rank`'s input.
    pub fn input(dtype: DataType, rank: usize, prod: bool) -> Pattern {
        Pattern::from_fn(dtype, |k| Num::Int(value(rank, k, prod)))
    }

    /// Every one of `nranks` ranks' inputs reduced with `op`: what all_reduce returns.
    pub fn reduced(dtype: DataType, nranks: usize, op: ReduceOp) -> Pattern {
        let prod = op == ReduceOp::PROD;
        let n = nranks.max(1);
        Pattern::from_fn(dtype, |k| {
            let vals = (0..n).map(|r| value(r, k, prod));
            if is_float(dtype) {
                let vals = vals.map(|v| v as f64);
                Num::Float(match op {
                    ReduceOp::PROD => vals.product(),
                    ReduceOp::MIN => vals.fold(f64::INFINITY, f64::min),
                    ReduceOp::MAX => vals.fold(f64::NEG_INFINITY, f64::max),
                    ReduceOp::AVG => vals.sum::<f64>() / n as f64,
                    _ => vals.sum(),
                })
            } else {
                // Integer ops wrap in the type's width: the same result modulo 2^width as
                // wrapping in 128 bits, then narrowing.
                Num::Int(match op {
                    ReduceOp::PROD => vals.fold(1i128, i128::wrapping_mul),
                    ReduceOp::MIN => vals.min().unwrap_or(0),
                    ReduceOp::MAX => vals.max().unwrap_or(0),
                    ReduceOp::AVG => {
                        let sum = narrow(dtype, vals.fold(0i128, i128::wrapping_add));
                        let n = narrow(dtype, n as i128);
                        if n == 0 {
                            0
                        } else {
                            sum / n
                        }
                    }
                    _ => vals.fold(0i128, i128::wrapping_add),
                })
            }
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

/// A value before encoding.
#[derive(Clone, Copy, Debug)]
enum Num {
    Int(i128),
    Float(f64),
}

fn is_float(dtype: DataType) -> bool {
    matches!(
        dtype,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
    )
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

/// `x` narrowed (wrapping) to an integer type, back as i128.
fn narrow(dtype: DataType, x: i128) -> i128 {
    match dtype {
        DataType::I8 => x as i8 as i128,
        DataType::U8 => x as u8 as i128,
        DataType::I32 => x as i32 as i128,
        DataType::U32 => x as u32 as i128,
        DataType::I64 => x as i64 as i128,
        DataType::U64 => x as u64 as i128,
        _ => x,
    }
}

/// One element in the machine's byte order.
fn encode(dtype: DataType, v: Num) -> Vec<u8> {
    let f = match v {
        Num::Int(i) => i as f64,
        Num::Float(f) => f,
    };
    let i = match v {
        Num::Int(i) => i,
        Num::Float(f) => f as i128,
    };
    match dtype {
        DataType::F64 => f.to_ne_bytes().to_vec(),
        DataType::F32 => (f as f32).to_ne_bytes().to_vec(),
        DataType::F16 => f32_to_f16(f as f32).to_ne_bytes().to_vec(),
        DataType::BF16 => f32_to_bf16(f as f32).to_ne_bytes().to_vec(),
        DataType::I8 => (i as i8).to_ne_bytes().to_vec(),
        DataType::U8 => (i as u8).to_ne_bytes().to_vec(),
        DataType::I32 => (i as i32).to_ne_bytes().to_vec(),
        DataType::U32 => (i as u32).to_ne_bytes().to_vec(),
        DataType::I64 => (i as i64).to_ne_bytes().to_vec(),
        _ => (i as u64).to_ne_bytes().to_vec(),
    }
}

/// One float element (of a float type) as f64.
fn decode(dtype: DataType, b: &[u8]) -> f64 {
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    match dtype {
        DataType::F64 => f64::from_ne_bytes(arr(8)),
        DataType::F32 => {
            let a = arr(4);
            f32::from_ne_bytes([a[0], a[1], a[2], a[3]]) as f64
        }
        DataType::F16 => {
            let a = arr(2);
            f16_to_f32(u16::from_ne_bytes([a[0], a[1]])) as f64
        }
        DataType::BF16 => {
            let a = arr(2);
            f32::from_bits((u16::from_ne_bytes([a[0], a[1]]) as u32) << 16) as f64
        }
        _ => f64::NAN,
    }
}

/// f32 to IEEE binary16, rounding to nearest even.
fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let a = b & 0x7fff_ffff;
    if a >= 0x7f80_0000 {
        return sign | if a > 0x7f80_0000 { 0x7e00 } else { 0x7c00 };
    }
    // 65520 and above round to infinity.
    if a >= 0x477f_f000 {
        return sign | 0x7c00;
    }
    // Below 2^-14: a subnormal, in units of 2^-24 (the multiplication is exact).
    if a < 0x3880_0000 {
        return sign | (f32::from_bits(a) * 16_777_216.0).round_ties_even() as u16;
    }
    // At least 2^-14 here: the rebiased exponent is at least 1.
    let exp = (a >> 23) + 15 - 127;
    let mant = a & 0x7f_ffff;
    let mut h = (exp << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        // A carry out of the mantissa correctly bumps the exponent.
        h += 1;
    }
    sign | h as u16
}

/// IEEE binary16 to f32 (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let mant = f32::from(h & 0x3ff);
    match exp {
        0 => sign * mant * 2f32.powi(-24),
        0x1f if mant == 0.0 => sign * f32::INFINITY,
        0x1f => f32::NAN,
        e => sign * (1.0 + mant / 1024.0) * 2f32.powi(e - 15),
    }
}

/// f32 to bfloat16, rounding to nearest even.
fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_to_nearest_even() {
        for (x, h) in [
            (0.0f32, 0x0000u16),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65520.0, 0x7c00),
            (2f32.powi(-24), 0x0001),
            (2f32.powi(-14), 0x0400),
            (1.0 + 2f32.powi(-11), 0x3c00),
            (1.0 + 3.0 * 2f32.powi(-11), 0x3c02),
            (0.5, 0x3800),
            (-0.25, 0xb400),
            (1.0 / 3.0, 0x3555),
        ] {
            assert_eq!(f32_to_f16(x), h, "{x}");
        }
        for h in [
            0x0000u16, 0x0001, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0xc000, 0x3555,
        ] {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x}");
        }
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    }

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
