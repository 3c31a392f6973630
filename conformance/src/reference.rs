//! Reproducible inputs and independently computed references.
//!
//! Every rank draws every rank's inputs from the same seeded generator, so each computes the
//! expected output of a collective on its own. Inputs are small integers, chosen so that every
//! result is exact in every data type (products draw from ±1 and ±2). Encoding and the
//! reference reduction are [`crate::values`], shared with `ferrocx bench`.

use ferrocx::abi::{DataType, ReduceOp};

use crate::values::{self, is_unsigned, Value};

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

/// Element `i` of the reduction of `inputs` with `op`, as the type computes it.
pub(crate) fn reduced(dt: DataType, op: ReduceOp, inputs: &[Vec<i64>], i: usize) -> f64 {
    let vals: Vec<i128> = inputs.iter().map(|inp| inp[i] as i128).collect();
    values::reduce(dt, op, &vals).as_f64()
}

/// The bytes of `values` in type `dt` (native endianness, as the device holds them).
pub(crate) fn encode(dt: DataType, values: &[i64]) -> Vec<u8> {
    values::encode(dt, values.iter().map(|&v| Value::Int(v as i128)))
}

/// Element `i` of `bytes` in type `dt`, as an `f64`.
pub(crate) fn decode(dt: DataType, bytes: &[u8], i: usize) -> f64 {
    values::decode(dt, &bytes[i * size_of(dt)..])
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

#[cfg(test)]
mod tests {
    use super::*;

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
