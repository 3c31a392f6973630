//! Element values of every ABI data type: encoding exact values into a device's bytes, decoding
//! them back, and the reference reduction a collective's output is checked against. The
//! conformance kit and `ferrocx bench` share this; each draws its own inputs.
//!
//! Inputs are small integers, so a reference is exact: integer results wrap as the type's
//! arithmetic does, float results are computed in `f64` and rounded once when encoded (f16 and
//! bf16 through [`ferrocx::half`]).

use ferrocx::abi::{DataType, ReduceOp};
use ferrocx::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// A value before encoding: an exact integer, or a float result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// An integer (encoded with the type's wrapping; converted for a float type).
    Int(i128),
    /// A float (rounded to nearest for a float type; truncated for an integer type).
    Float(f64),
}

impl Value {
    /// The value as an `f64`.
    pub fn as_f64(self) -> f64 {
        match self {
            Value::Int(i) => i as f64,
            Value::Float(f) => f,
        }
    }
}

/// `true` for the floating-point types.
pub fn is_float(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
    )
}

/// `true` for the unsigned integer types.
pub fn is_unsigned(dt: DataType) -> bool {
    matches!(dt, DataType::U8 | DataType::U32 | DataType::U64)
}

/// `x` narrowed (wrapping) to integer type `dt`, back as `i128`; unchanged for a float type.
pub fn narrow(dt: DataType, x: i128) -> i128 {
    match dt {
        DataType::I8 => x as i8 as i128,
        DataType::U8 => x as u8 as i128,
        DataType::I32 => x as i32 as i128,
        DataType::U32 => x as u32 as i128,
        DataType::I64 => x as i64 as i128,
        DataType::U64 => x as u64 as i128,
        _ => x,
    }
}

/// The reduction of `vals` (one element of every rank, in rank order) with `op`, as type `dt`
/// computes it: floats in `f64`, integers wrapping in the type's width, integer averages
/// truncated toward zero (as C's division, and NCCL's, do).
pub fn reduce(dt: DataType, op: ReduceOp, vals: &[i128]) -> Value {
    let n = vals.len().max(1);
    if is_float(dt) {
        let vals = vals.iter().map(|&v| v as f64);
        return Value::Float(match op {
            ReduceOp::PROD => vals.product(),
            ReduceOp::MIN => vals.fold(f64::INFINITY, f64::min),
            ReduceOp::MAX => vals.fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::AVG => vals.sum::<f64>() / n as f64,
            _ => vals.sum(),
        });
    }
    let vals = vals.iter().copied();
    // Wrapping in 128 bits, then narrowing, is wrapping in the type's width.
    Value::Int(narrow(
        dt,
        match op {
            ReduceOp::PROD => vals.fold(1i128, i128::wrapping_mul),
            ReduceOp::MIN => vals.min().unwrap_or(0),
            ReduceOp::MAX => vals.max().unwrap_or(0),
            ReduceOp::AVG => narrow(dt, vals.fold(0i128, i128::wrapping_add)) / n as i128,
            _ => vals.fold(0i128, i128::wrapping_add),
        },
    ))
}

/// Appends `v` as one element of type `dt`, in the machine's byte order (as a device holds it).
pub fn encode_into(dt: DataType, v: Value, out: &mut Vec<u8>) {
    let f = v.as_f64();
    let i = match v {
        Value::Int(i) => i,
        Value::Float(f) => f as i128,
    };
    match dt {
        DataType::F64 => out.extend_from_slice(&f.to_ne_bytes()),
        DataType::F32 => out.extend_from_slice(&(f as f32).to_ne_bytes()),
        DataType::F16 => out.extend_from_slice(&f32_to_f16(f as f32).to_ne_bytes()),
        DataType::BF16 => out.extend_from_slice(&f32_to_bf16(f as f32).to_ne_bytes()),
        DataType::I8 => out.push(i as i8 as u8),
        DataType::U8 => out.push(i as u8),
        DataType::I32 => out.extend_from_slice(&(i as i32).to_ne_bytes()),
        DataType::U32 => out.extend_from_slice(&(i as u32).to_ne_bytes()),
        DataType::I64 => out.extend_from_slice(&(i as i64).to_ne_bytes()),
        _ => out.extend_from_slice(&(i as u64).to_ne_bytes()),
    }
}

/// `values` as elements of type `dt`, in the machine's byte order.
pub fn encode(dt: DataType, values: impl IntoIterator<Item = Value>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        encode_into(dt, v, &mut out);
    }
    out
}

/// One element of type `dt` (the first `dt.size()` bytes of `b`), as an `f64`.
pub fn decode(dt: DataType, b: &[u8]) -> f64 {
    let es = dt.size().unwrap_or(1);
    let mut w = [0u8; 8];
    w[..es].copy_from_slice(&b[..es]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_encodes_and_decodes() {
        for dt in DataType::ALL {
            let v = [0, 1, 7, 9];
            let b = encode(dt, v.map(Value::Int));
            let es = dt.size().unwrap();
            assert_eq!(b.len(), 4 * es);
            for (i, x) in v.iter().enumerate() {
                assert_eq!(decode(dt, &b[i * es..]), *x as f64, "{dt:?}");
            }
        }
        // Float values round once, to nearest even, in the half types.
        let h = encode(DataType::F16, [Value::Float(1.0 / 3.0)]);
        assert_eq!(u16::from_ne_bytes([h[0], h[1]]), 0x3555);
        let b = encode(DataType::BF16, [Value::Float(1.0 + 3.0 * 2f64.powi(-8))]);
        assert_eq!(u16::from_ne_bytes([b[0], b[1]]), 0x3f82);
    }

    #[test]
    fn references_wrap_and_truncate_like_the_type() {
        assert_eq!(
            reduce(DataType::I8, ReduceOp::SUM, &[100, 100]),
            Value::Int(-56)
        );
        assert_eq!(
            reduce(DataType::U8, ReduceOp::PROD, &[16, 16, 2]),
            Value::Int(0)
        );
        assert_eq!(
            reduce(DataType::I32, ReduceOp::AVG, &[-3, 0]),
            Value::Int(-1)
        );
        assert_eq!(
            reduce(DataType::F32, ReduceOp::AVG, &[-3, 0]),
            Value::Float(-1.5)
        );
        assert_eq!(
            reduce(DataType::F16, ReduceOp::MIN, &[4, -2, 9]),
            Value::Float(-2.0)
        );
        assert_eq!(
            reduce(DataType::U64, ReduceOp::MAX, &[4, 2, 9]),
            Value::Int(9)
        );
    }
}
