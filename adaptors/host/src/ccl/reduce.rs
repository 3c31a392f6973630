//! Element-wise reductions over byte buffers: the core's one implementation
//! ([`ferrocx::element`]), with its refusals as the SDK's `INVALID_ARGUMENT`.

use ferrocx_plugin_sdk::abi::{DataType, ReduceOp};
use ferrocx_plugin_sdk::{Error, Result};

pub use ferrocx::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// `dst = op over srcs` element-wise (see [`ferrocx::element::reduce`]); an unknown type or op
/// is `INVALID_ARGUMENT`.
pub fn reduce(dst: &mut [u8], srcs: &[&[u8]], dtype: DataType, op: ReduceOp) -> Result<()> {
    ferrocx::element::reduce(dst, srcs, dtype, op)
        .map_err(|e| Error::invalid_argument(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrocx_plugin_sdk::abi::Status;

    #[test]
    fn unknown_types_and_ops_are_invalid_arguments() {
        let mut out = [0u8; 4];
        let e = reduce(&mut out, &[&[0u8; 4]], DataType(99), ReduceOp::SUM).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_ARGUMENT);
        assert_eq!(e.message(), "unknown data type 99");
        let e = reduce(&mut out, &[&[0u8; 4]], DataType::F32, ReduceOp(77)).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_ARGUMENT);
        assert_eq!(e.message(), "unknown reduction op 77");
        let one = 1.5f32.to_ne_bytes();
        reduce(&mut out, &[&one, &one], DataType::F32, ReduceOp::SUM).unwrap();
        assert_eq!(f32::from_ne_bytes(out), 3.0);
    }
}
