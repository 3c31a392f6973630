//! Conversions between f32 and the 16-bit floating-point types of the ABI (IEEE binary16 and
//! bfloat16), rounding to nearest even, for adaptors and algorithms that reduce them in f32.
//! (The conformance kit and the benchmark keep references of their own on purpose: a check must
//! not share the code it checks.)

/// bfloat16 bits to f32.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 to bfloat16 bits, rounded to nearest even; a NaN stays a (quiet) NaN.
pub fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if f.is_nan() {
        return ((x >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((x >> 16) & 1);
    (x.wrapping_add(round) >> 16) as u16
}

/// IEEE binary16 bits to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: shift the mantissa up to an implicit one, lowering the exponent.
            let shift = m.leading_zeros() - 21;
            let m = (m << shift) & 0x3ff;
            sign | ((113 - shift) << 23) | (m << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// f32 to IEEE binary16 bits, rounded to nearest even; too large gives infinity.
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let mant = x & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 112;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // A subnormal half (or zero): the implicit one joins the mantissa, shifted right.
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let rest = m & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && r & 1 == 1) {
        // A carry out of the mantissa correctly bumps the exponent (up to infinity).
        r += 1;
    }
    sign | r as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_half_value_round_trips() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan(), "{h:#06x}");
            } else {
                assert_eq!(f32_to_f16(f), h, "f16 {h:#06x} via {f}");
            }
            let b = bf16_to_f32(h);
            if b.is_nan() {
                assert!(bf16_to_f32(f32_to_bf16(b)).is_nan(), "{h:#06x}");
            } else {
                assert_eq!(f32_to_bf16(b), h, "bf16 {h:#06x} via {b}");
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "rounds up to infinity");
        assert_eq!(f32_to_f16(2f32.powi(-24)), 0x0001, "smallest subnormal");
        assert_eq!(
            f32_to_f16(2f32.powi(-25)),
            0x0000,
            "a tie goes to even (zero)"
        );
        assert_eq!(
            f32_to_f16(3.0 * 2f32.powi(-25)),
            0x0002,
            "a tie goes to even (two)"
        );
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        assert_eq!(
            f32_to_bf16(1.0 + 2f32.powi(-8)),
            0x3f80,
            "a tie goes to even"
        );
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    }
}
