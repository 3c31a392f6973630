//! ferrocx's data types, reduction ops and statuses in NCCL's terms.

use ferrocx_plugin_sdk::prelude::*;

use crate::sys;

/// NCCL's data type for `t`, or `UNSUPPORTED` (bf16 needs NCCL >= 2.10).
pub fn dtype(t: DataType, version: i32) -> Result<sys::ncclDataType_t> {
    Ok(match t {
        DataType::I8 => sys::NCCL_INT8,
        DataType::U8 => sys::NCCL_UINT8,
        DataType::I32 => sys::NCCL_INT32,
        DataType::U32 => sys::NCCL_UINT32,
        DataType::I64 => sys::NCCL_INT64,
        DataType::U64 => sys::NCCL_UINT64,
        DataType::F16 => sys::NCCL_FLOAT16,
        DataType::F32 => sys::NCCL_FLOAT32,
        DataType::F64 => sys::NCCL_FLOAT64,
        DataType::BF16 if version >= V2_10 => sys::NCCL_BFLOAT16,
        DataType::BF16 => return Err(too_old("bf16", version)),
        other => {
            return Err(Error::invalid_argument(format!(
                "unknown data type {other:?}"
            )))
        }
    })
}

/// NCCL's reduction op for `op`, or `UNSUPPORTED` (avg needs NCCL >= 2.10).
pub fn op(op: ReduceOp, version: i32) -> Result<sys::ncclRedOp_t> {
    Ok(match op {
        ReduceOp::SUM => sys::NCCL_SUM,
        ReduceOp::PROD => sys::NCCL_PROD,
        ReduceOp::MIN => sys::NCCL_MIN,
        ReduceOp::MAX => sys::NCCL_MAX,
        ReduceOp::AVG if version >= V2_10 => sys::NCCL_AVG,
        ReduceOp::AVG => return Err(too_old("avg", version)),
        other => {
            return Err(Error::invalid_argument(format!(
                "unknown reduction op {other:?}"
            )))
        }
    })
}

/// The status for a failed `ncclResult_t` (the message carries NCCL's words):
/// `ncclInvalidArgument` (4) and `ncclInvalidUsage` (5) are the caller's mistake
/// (`INVALID_ARGUMENT`), `ncclSystemError` (2) is `SYSTEM_ERROR`, `ncclRemoteError` (6) a
/// failed peer (`PEER_FAILURE`), `ncclInProgress` (7) `NOT_READY`; anything else a vendor error.
pub(crate) fn status(rc: sys::ncclResult_t) -> Status {
    match rc {
        sys::NCCL_SUCCESS => Status::SUCCESS,
        2 => Status::SYSTEM_ERROR,
        4 | 5 => Status::INVALID_ARGUMENT,
        6 => Status::PEER_FAILURE,
        sys::NCCL_IN_PROGRESS => Status::NOT_READY,
        _ => Status::VENDOR_ERROR,
    }
}

/// `NCCL_VERSION(2, 10, 0)`.
const V2_10: i32 = 21_000;

/// `(major, minor, patch)` of an `ncclGetVersion` code: `X*10000 + Y*100 + Z` since 2.9,
/// `X*1000 + Y*100 + Z` before.
pub(crate) fn decode_version(code: i32) -> (i32, i32, i32) {
    if code >= 10_000 {
        (code / 10_000, code % 10_000 / 100, code % 100)
    } else {
        (code / 1_000, code % 1_000 / 100, code % 100)
    }
}

fn too_old(what: &str, version: i32) -> Error {
    let (x, y, z) = decode_version(version);
    Error::unsupported(format!(
        "{what} needs NCCL 2.10 or newer; libnccl is {x}.{y}.{z}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: i32 = 22_805;

    #[test]
    fn data_types_match_nccl_h() {
        let expected = [
            (DataType::F32, 7),
            (DataType::F64, 8),
            (DataType::F16, 6),
            (DataType::BF16, 9),
            (DataType::I8, 0),
            (DataType::U8, 1),
            (DataType::I32, 2),
            (DataType::U32, 3),
            (DataType::I64, 4),
            (DataType::U64, 5),
        ];
        assert_eq!(
            expected.len(),
            DataType::ALL.len(),
            "every ferrocx type mapped"
        );
        for (t, n) in expected {
            assert_eq!(dtype(t, NEW).expect("mapped"), n, "{t:?}");
        }
        assert_eq!(
            dtype(DataType::BF16, 20_805)
                .expect_err("2.8 has no bf16")
                .status(),
            Status::UNSUPPORTED
        );
        assert_eq!(
            dtype(DataType(99), NEW).expect_err("unknown").status(),
            Status::INVALID_ARGUMENT
        );
    }

    #[test]
    fn reduction_ops_match_nccl_h() {
        let expected = [
            (ReduceOp::SUM, 0),
            (ReduceOp::PROD, 1),
            (ReduceOp::MAX, 2),
            (ReduceOp::MIN, 3),
            (ReduceOp::AVG, 4),
        ];
        assert_eq!(
            expected.len(),
            ReduceOp::ALL.len(),
            "every ferrocx op mapped"
        );
        for (o, n) in expected {
            assert_eq!(op(o, NEW).expect("mapped"), n, "{o:?}");
        }
        assert_eq!(
            op(ReduceOp::AVG, 2_408)
                .expect_err("2.4 has no avg")
                .status(),
            Status::UNSUPPORTED
        );
    }

    #[test]
    fn min_and_max_are_not_swapped() {
        // ferrocx numbers MIN before MAX; NCCL numbers ncclMax (2) before ncclMin (3).
        assert_eq!(ReduceOp::MIN.0, 2);
        assert_eq!(op(ReduceOp::MIN, NEW).unwrap(), 3);
        assert_eq!(op(ReduceOp::MAX, NEW).unwrap(), 2);
    }

    #[test]
    fn statuses() {
        assert_eq!(status(0), Status::SUCCESS);
        assert_eq!(status(7), Status::NOT_READY);
        assert_eq!(status(1), Status::VENDOR_ERROR, "ncclUnhandledCudaError");
        assert_eq!(status(2), Status::SYSTEM_ERROR);
        assert_eq!(status(3), Status::VENDOR_ERROR, "ncclInternalError");
        assert_eq!(status(4), Status::INVALID_ARGUMENT);
        assert_eq!(status(5), Status::INVALID_ARGUMENT);
        assert_eq!(status(6), Status::PEER_FAILURE);
    }

    #[test]
    fn versions() {
        assert_eq!(decode_version(22_805), (2, 28, 5));
        assert_eq!(decode_version(2_708), (2, 7, 8));
    }
}
