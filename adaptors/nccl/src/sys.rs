//! The few declarations of `nccl.h` (2.x) this adaptor needs, written out rather than generated:
//! NCCL's C API is small and stable, and values here are checked against the header in `conv`'s
//! tests.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

/// `ncclResult_t`.
pub type ncclResult_t = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: ncclResult_t = 0;
/// `ncclInProgress`: a non-blocking communicator is still initialising (or finalising).
pub const NCCL_IN_PROGRESS: ncclResult_t = 7;

/// `ncclDataType_t`.
pub type ncclDataType_t = c_int;
/// `ncclInt8` (= `ncclChar`).
pub const NCCL_INT8: ncclDataType_t = 0;
/// `ncclUint8`.
pub const NCCL_UINT8: ncclDataType_t = 1;
/// `ncclInt32` (= `ncclInt`).
pub const NCCL_INT32: ncclDataType_t = 2;
/// `ncclUint32`.
pub const NCCL_UINT32: ncclDataType_t = 3;
/// `ncclInt64`.
pub const NCCL_INT64: ncclDataType_t = 4;
/// `ncclUint64`.
pub const NCCL_UINT64: ncclDataType_t = 5;
/// `ncclFloat16` (= `ncclHalf`).
pub const NCCL_FLOAT16: ncclDataType_t = 6;
/// `ncclFloat32` (= `ncclFloat`).
pub const NCCL_FLOAT32: ncclDataType_t = 7;
/// `ncclFloat64` (= `ncclDouble`).
pub const NCCL_FLOAT64: ncclDataType_t = 8;
/// `ncclBfloat16` (NCCL >= 2.10).
pub const NCCL_BFLOAT16: ncclDataType_t = 9;

/// `ncclRedOp_t`.
pub type ncclRedOp_t = c_int;
/// `ncclSum`.
pub const NCCL_SUM: ncclRedOp_t = 0;
/// `ncclProd`.
pub const NCCL_PROD: ncclRedOp_t = 1;
/// `ncclMax` (note: before `ncclMin`, unlike ferrocx's constants).
pub const NCCL_MAX: ncclRedOp_t = 2;
/// `ncclMin`.
pub const NCCL_MIN: ncclRedOp_t = 3;
/// `ncclAvg` (NCCL >= 2.10).
pub const NCCL_AVG: ncclRedOp_t = 4;

/// `ncclComm_t`: an opaque pointer.
pub type ncclComm_t = *mut c_void;
/// `cudaStream_t` (= `CUstream`): an opaque pointer, null for the legacy default stream.
pub type cudaStream_t = *mut c_void;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// Opaque bytes.
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// `ncclGetVersion(int*)`.
pub type GetVersion = unsafe extern "C" fn(*mut c_int) -> ncclResult_t;
/// `ncclGetUniqueId(ncclUniqueId*)`.
pub type GetUniqueId = unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t;
/// `ncclCommInitRank(ncclComm_t*, int nranks, ncclUniqueId, int rank)`.
pub type CommInitRank =
    unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> ncclResult_t;
/// `ncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*)` (the config's
/// layout varies with the version: only probed for now).
pub type CommInitRankConfig =
    unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int, *mut c_void) -> ncclResult_t;
/// `ncclCommFinalize`, `ncclCommDestroy`, `ncclCommAbort`.
pub type CommOp = unsafe extern "C" fn(ncclComm_t) -> ncclResult_t;
/// `ncclCommGetAsyncError(ncclComm_t, ncclResult_t*)`.
pub type CommGetAsyncError = unsafe extern "C" fn(ncclComm_t, *mut ncclResult_t) -> ncclResult_t;
/// `ncclCommCount`, `ncclCommUserRank`, `ncclCommCuDevice`: `(ncclComm_t, int*)`.
pub type CommQuery = unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t;
/// `ncclAllReduce(send, recv, count, type, op, comm, stream)`.
pub type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
/// `ncclAllGather(send, recv, sendcount, type, comm, stream)`.
pub type AllGather = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
/// `ncclReduceScatter(send, recv, recvcount, type, op, comm, stream)`: the shape of
/// [`AllReduce`].
pub type ReduceScatter = AllReduce;
/// `ncclBroadcast(send, recv, count, type, root, comm, stream)`.
pub type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
/// `ncclReduce(send, recv, count, type, op, root, comm, stream)`.
pub type Reduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
/// `ncclSend(send, count, type, peer, comm, stream)`.
pub type Send = unsafe extern "C" fn(
    *const c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
/// `ncclRecv(recv, count, type, peer, comm, stream)`.
pub type Recv = unsafe extern "C" fn(
    *mut c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
/// `ncclGroupStart()`, `ncclGroupEnd()`.
pub type Group = unsafe extern "C" fn() -> ncclResult_t;
/// `ncclGetErrorString(ncclResult_t)`.
pub type GetErrorString = unsafe extern "C" fn(ncclResult_t) -> *const c_char;
/// `ncclGetLastError(ncclComm_t)` (the comm may be null).
pub type GetLastError = unsafe extern "C" fn(ncclComm_t) -> *const c_char;
/// `ncclMemAlloc(void**, size_t)` (NCCL >= 2.19).
pub type MemAlloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> ncclResult_t;
/// `ncclMemFree(void*)`.
pub type MemFree = unsafe extern "C" fn(*mut c_void) -> ncclResult_t;
/// `ncclCommRegister(comm, buff, size, void** handle)` (NCCL >= 2.19).
pub type CommRegister =
    unsafe extern "C" fn(ncclComm_t, *mut c_void, usize, *mut *mut c_void) -> ncclResult_t;
/// `ncclCommDeregister(comm, handle)`.
pub type CommDeregister = unsafe extern "C" fn(ncclComm_t, *mut c_void) -> ncclResult_t;
/// `ncclCommWindowRegister(comm, buff, size, ncclWindow_t*, int flags)` (NCCL >= 2.27).
pub type CommWindowRegister =
    unsafe extern "C" fn(ncclComm_t, *mut c_void, usize, *mut *mut c_void, c_int) -> ncclResult_t;
/// `ncclCommWindowDeregister(comm, ncclWindow_t)`.
pub type CommWindowDeregister = unsafe extern "C" fn(ncclComm_t, *mut c_void) -> ncclResult_t;
