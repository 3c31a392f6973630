//! Reproducible inputs and independently computed references.
//!
//! Every rank draws every rank's inputs from the same seeded generator, so each computes the
//! expected output of a collective on its own. Inputs are small integers, chosen so that every
//! result is exact in every data type (products draw from ±1 and ±2).

use ferrocx::abi::{DataType, ReduceOp};

/// Seed of every input.
const SEED: u64 = 0x5EED_F00D_C0FF_EE00;

/// xorshift64*: deterministic pseudo-random numbers every rank can reproduce.
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for `(seed, stream)`.
    pub(crate) fn new(seed: u64, stream: u64) -> Rng {
        Rng((seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }

    /// The next value.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// An integer in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }
}

/// A stable 64-bit tag for a case name (FNV-1a), so every rank derives the same inputs.
pub(crate) fn tag(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `true` for the floating-point types.
pub(crate) fn is_float(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
    )
}

fn is_unsigned(dt: DataType) -> bool {
    matches!(dt, DataType::U8 | DataType::U32 | DataType::U64)
}

/// Element size in bytes (every type the kit uses is known).
pub(crate) fn size_of(dt: DataType) -> usize {
    dt.size().unwrap_or(1)
}

/// The short name of a type.
pub(crate) fn dt_name(dt: DataType) -> &'static str {
    dt.name().unwrap_or("?")
}

/// The short name of a reduction.
pub(crate) fn op_name(op: ReduceOp) -> &'static str {
    op.name().unwrap_or("?")
}

/// Rank `rank`'s `n` inputs of case `tag`.
pub(crate) fn input(tag: u64, rank: usize, n: usize, dt: DataType, op: ReduceOp) -> Vec<i64> {
    let mut rng = Rng::new(SEED ^ tag, rank as u64 + 1);
    // Beyond 8 ranks a product draws only ±1, so it stays exact in f16 and bf16.
    let wide = rank < 8;
    (0..n)
        .map(|_| match (op, is_unsigned(dt)) {
            (ReduceOp::PROD, false) if wide => [-2, -1, 1, 2][rng.range(0, 3) as usize],
            (ReduceOp::PROD, false) => [-1, 1][rng.range(0, 1) as usize],
            (ReduceOp::PROD, true) if wide => rng.range(1, 2),
            (ReduceOp::PROD, true) => 1,
            (_, true) => rng.range(0, 9),
            _ => rng.range(-9, 9),
        })
        .collect()
}

/// Every rank's inputs of case `tag`.
pub(crate) fn inputs(
    tag: u64,
    world: usize,
    n: usize,
    dt: DataType,
    op: ReduceOp,
) -> Vec<Vec<i64>> {
    (0..world).map(|r| input(tag, r, n, dt, op)).collect()
}

/// Wraps an exact integer the way the type's arithmetic does.
fn wrap(dt: DataType, v: i64) -> i64 {
    match dt {
        DataType::I8 => v as i8 as i64,
        DataType::U8 => v as u8 as i64,
        DataType::I32 => v as i32 as i64,
        DataType::U32 => v as u32 as i64,
        _ => v,
    }
}

/// Element `i` of the reduction of `inputs` with `op`, as the type computes it.
pub(crate) fn reduced(dt: DataType, op: ReduceOp, inputs: &[Vec<i64>], i: usize) -> f64 {
    let n = inputs.len();
    let mut acc = inputs[0][i];
    for inp in &inputs[1..] {
        let x = inp[i];
        acc = wrap(
            dt,
            match op {
                ReduceOp::PROD => acc.wrapping_mul(x),
                ReduceOp::MIN => acc.min(x),
                ReduceOp::MAX => acc.max(x),
                _ => acc.wrapping_add(x),
            },
        );
    }
    if op == ReduceOp::AVG {
        if is_float(dt) {
            return acc as f64 / n as f64;
        }
        // Integer averages truncate toward zero, as C's division (and NCCL's) does.
        return wrap(dt, acc / n as i64) as f64;
    }
    acc as f64
}

/// The bytes of `values` in type `dt` (native endianness, as the device holds them).
pub(crate) fn encode(dt: DataType, values: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * size_of(dt));
    for &v in values {
        match dt {
            DataType::F32 => out.extend_from_slice(&(v as f32).to_ne_bytes()),
            DataType::F64 => out.extend_from_slice(&(v as f64).to_ne_bytes()),
            DataType::F16 => out.extend_from_slice(&f32_to_f16(v as f32).to_ne_bytes()),
            DataType::BF16 => out.extend_from_slice(&f32_to_bf16(v as f32).to_ne_bytes()),
            DataType::I8 => out.push(v as i8 as u8),
            DataType::U8 => out.push(v as u8),
            DataType::I32 => out.extend_from_slice(&(v as i32).to_ne_bytes()),
            DataType::U32 => out.extend_from_slice(&(v as u32).to_ne_bytes()),
            DataType::I64 => out.extend_from_slice(&v.to_ne_bytes()),
            _ => out.extend_from_slice(&(v as u64).to_ne_bytes()),
        }
    }
    out
}

/// Element `i` of `bytes` in type `dt`, as an `f64`.
pub(crate) fn decode(dt: DataType, bytes: &[u8], i: usize) -> f64 {
    let es = size_of(dt);
    let b = &bytes[i * es..(i + 1) * es];
    let mut w = [0u8; 8];
    w[..es].copy_from_slice(b);
    let u16v = u16::from_ne_bytes([w[0], w[1]]);
    let u32v = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
    let u64v = u64::from_ne_bytes(w);
    match dt {
        DataType::F32 => f32::from_bits(u32v) as f64,
        DataType::F64 => f64::from_bits(u64v),
        DataType::F16 => f16_to_f32(u16v) as f64,
        DataType::BF16 => bf16_to_f32(u16v) as f64,
        DataType::I8 => w[0] as i8 as f64,
        DataType::U8 => w[0] as f64,
        DataType::I32 => u32v as i32 as f64,
        DataType::U32 => u32v as f64,
        DataType::I64 => u64v as i64 as f64,
        _ => u64v as f64,
    }
}

/// Compares `n` elements of `got` with `want(i)`: exact for integers, within the type's
/// precision for floats. The error names the first wrong element and how many there are.
pub(crate) fn compare(
    dt: DataType,
    got: &[u8],
    n: usize,
    want: impl Fn(usize) -> f64,
) -> Result<(), String> {
    let es = size_of(dt);
    if got.len() < n * es {
        return Err(format!(
            "output holds {} bytes, {} expected",
            got.len(),
            n * es
        ));
    }
    let mut first = None;
    let mut wrong = 0usize;
    for i in 0..n {
        let g = decode(dt, got, i);
        let w = want(i);
        let tol = match dt {
            DataType::F16 | DataType::BF16 => w.abs() / 100.0 + 1e-2,
            DataType::F32 => w.abs() * 1e-5 + 1e-6,
            DataType::F64 => w.abs() * 1e-12 + 1e-12,
            _ => 0.0,
        };
        // A NaN (poison left in place) is never within tolerance.
        let close = (g - w).abs() <= tol;
        if !close {
            wrong += 1;
            first.get_or_insert((i, g, w));
        }
    }
    match first {
        None => Ok(()),
        Some((i, g, w)) => Err(format!(
            "element {i} of {n} is {g}, expected {w} ({wrong} wrong)"
        )),
    }
}

/// IEEE binary32 to binary16, rounding to nearest even.
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let mant = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        // A carry into the exponent is the correct rounding (up to infinity).
        r += 1;
    }
    sign | r as u16
}

/// IEEE binary16 to binary32 (exact).
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let negative = h & 0x8000 != 0;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let sign = if negative { 1u32 << 31 } else { 0 };
    match exp {
        0 => {
            let v = mant as f32 / 16_777_216.0;
            if negative {
                -v
            } else {
                v
            }
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (mant << 13)),
        _ => f32::from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13)),
    }
}

/// binary32 to bfloat16, rounding to nearest even.
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// bfloat16 to binary32 (exact).
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_round_trips_small_integers_and_rounds_to_even() {
        for v in -2048..=2048 {
            assert_eq!(f16_to_f32(f32_to_f16(v as f32)), v as f32);
        }
        for v in -256..=256 {
            assert_eq!(bf16_to_f32(f32_to_bf16(v as f32)), v as f32);
        }
        assert_eq!(f32_to_f16(2049.0), f32_to_f16(2048.0));
        assert_eq!(f16_to_f32(f32_to_f16(1.0 / 3.0)), 0.333_251_95);
        assert_eq!(f16_to_f32(f32_to_f16(1e-7)), 1.192_092_9e-7);
        assert!(f16_to_f32(f32_to_f16(1e6)).is_infinite());
    }

    #[test]
    fn every_type_encodes_and_decodes_and_references_wrap() {
        for dt in DataType::ALL {
            let v = [0, 1, 7, 9];
            let b = encode(dt, &v);
            assert_eq!(b.len(), 4 * size_of(dt));
            for (i, x) in v.iter().enumerate() {
                assert_eq!(decode(dt, &b, i), *x as f64, "{dt:?}");
            }
        }
        let ins = vec![vec![100i64], vec![100]];
        assert_eq!(reduced(DataType::I8, ReduceOp::SUM, &ins, 0), -56.0);
        assert_eq!(reduced(DataType::F32, ReduceOp::AVG, &ins, 0), 100.0);
        let ins = vec![vec![-3i64], vec![0]];
        assert_eq!(reduced(DataType::I32, ReduceOp::AVG, &ins, 0), -1.0);
    }

    #[test]
    fn comparisons_name_the_first_wrong_element() {
        let got = encode(DataType::I32, &[1, 2, 3]);
        assert!(compare(DataType::I32, &got, 3, |i| i as f64 + 1.0).is_ok());
        let e = compare(DataType::I32, &got, 3, |_| 2.0).unwrap_err();
        assert!(
            e.starts_with("element 0 of 3 is 1, expected 2 (2 wrong)"),
            "{e}"
        );
        let nan = vec![0xffu8; 4];
        assert!(compare(DataType::F32, &nan, 1, |_| 0.0).is_err());
    }
}
