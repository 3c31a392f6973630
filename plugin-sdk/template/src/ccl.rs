//! The collective library adaptor: what an NCCL-like library provides. The vendor-marked `TODO`
//! messages name the NCCL call each method corresponds to; call your library's equivalent.
//!
//! Buffers are [`DevicePtr`]s and streams are [`Stream`]s of the device adaptor this CCL is
//! paired with (for NCCL: CUDA addresses and `CUstream`s, passed through unchanged).
//! Collectives are asynchronous on `stream`: return once the operation is enqueued.

use ferrocx_plugin_sdk::prelude::*;

/// The CCL adaptor. One instance per process ([`CclAdaptor::instance`]), called from any
/// thread: keep the loaded library and live communicators behind `Mutex`/atomics.
#[derive(Default)]
pub struct VendorCcl {}

impl CclAdaptor for VendorCcl {
    // What the library supports, if less than everything: the most ranks per communicator, the
    // data types and the reductions. Calls outside are refused for you, and the conformance
    // kit reports them as "not claimed" instead of failing. For example, a first version for
    // one process that reduces only f32 sums:
    //
    // const LIMITS: Limits = Limits::NONE
    //     .max_ranks(1)
    //     .dtypes(&[DataType::F32])
    //     .reduce_ops(&[ReduceOp::SUM]);

    fn instance() -> &'static Self {
        singleton!(VendorCcl)
    }

    // -- First: the library and a communicator. --

    fn init(&self, _options: &Options) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): load the library (dlopen libnccl.so.2) and probe its symbols",
        ))
    }
    fn finalize(&self) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): release what init took (the library stays loaded)",
        ))
    }
    fn version(&self) -> Result<i32> {
        Err(Error::unsupported("TODO(vendor): call ncclGetVersion"))
    }
    fn unique_id(&self) -> Result<Vec<u8>> {
        Err(Error::unsupported(
            "TODO(vendor): call ncclGetUniqueId and return its bytes",
        ))
    }
    fn comm_init_rank(&self, _init: &CommInit<'_>) -> Result<Comm> {
        Err(Error::unsupported(
            "TODO(vendor): call ncclCommInitRank (or ncclCommInitRankConfig) with \
             init.nranks, init.unique_id, init.rank on init.device",
        ))
    }
    fn comm_finalize(&self, _comm: Comm) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclCommFinalize"))
    }
    fn comm_destroy(&self, _comm: Comm) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclCommDestroy"))
    }
    fn comm_abort(&self, _comm: Comm) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclCommAbort"))
    }
    fn comm_async_error(&self, _comm: Comm) -> Result<Status> {
        Err(Error::unsupported(
            "TODO(vendor): call ncclCommGetAsyncError (ncclInProgress -> Status::NOT_READY)",
        ))
    }
    fn comm_count(&self, _comm: Comm) -> Result<i32> {
        Err(Error::unsupported("TODO(vendor): call ncclCommCount"))
    }
    fn comm_user_rank(&self, _comm: Comm) -> Result<i32> {
        Err(Error::unsupported("TODO(vendor): call ncclCommUserRank"))
    }
    fn comm_device(&self, _comm: Comm) -> Result<i32> {
        Err(Error::unsupported("TODO(vendor): call ncclCommCuDevice"))
    }

    // -- Second: the collectives (all_reduce first: it is what `ferrocx bench` runs first). --

    fn all_reduce(
        &self,
        _send: DevicePtr,
        _recv: DevicePtr,
        _count: usize,
        _dtype: DataType,
        _op: ReduceOp,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): call ncclAllReduce (map DataType and ReduceOp to ncclDataType_t \
             and ncclRedOp_t; return unsupported for those the library lacks)",
        ))
    }
    fn all_gather(
        &self,
        _send: DevicePtr,
        _recv: DevicePtr,
        _send_count: usize,
        _dtype: DataType,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclAllGather"))
    }
    fn reduce_scatter(
        &self,
        _send: DevicePtr,
        _recv: DevicePtr,
        _recv_count: usize,
        _dtype: DataType,
        _op: ReduceOp,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclReduceScatter"))
    }
    fn broadcast(
        &self,
        _send: DevicePtr,
        _recv: DevicePtr,
        _count: usize,
        _dtype: DataType,
        _root: i32,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclBroadcast"))
    }
    fn reduce(
        &self,
        _send: DevicePtr,
        _recv: DevicePtr,
        _count: usize,
        _dtype: DataType,
        _op: ReduceOp,
        _root: i32,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclReduce"))
    }
    fn gather(
        &self,
        _send: DevicePtr,
        _recv: DevicePtr,
        _send_count: usize,
        _dtype: DataType,
        _root: i32,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): call ncclGather, or ncclSend to the root + ncclRecv from every \
             rank in one group",
        ))
    }
    fn scatter(
        &self,
        _send: DevicePtr,
        _recv: DevicePtr,
        _recv_count: usize,
        _dtype: DataType,
        _root: i32,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): call ncclScatter, or ncclSend from the root + ncclRecv in one group",
        ))
    }
    fn all_to_all(
        &self,
        _send: DevicePtr,
        _recv: DevicePtr,
        _count: usize,
        _dtype: DataType,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): call ncclAlltoAll, or ncclSend + ncclRecv per peer in one group",
        ))
    }
    fn all_to_allv(
        &self,
        _send: DevicePtr,
        _send_v: VCounts<'_>,
        _recv: DevicePtr,
        _recv_v: VCounts<'_>,
        _dtype: DataType,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): call ncclSend + ncclRecv per peer (counts and displacements from \
             send_v/recv_v) between ncclGroupStart and ncclGroupEnd",
        ))
    }

    // -- Third: point-to-point and groups. --

    fn send(
        &self,
        _buf: DevicePtr,
        _count: usize,
        _dtype: DataType,
        _peer: i32,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclSend"))
    }
    fn recv(
        &self,
        _buf: DevicePtr,
        _count: usize,
        _dtype: DataType,
        _peer: i32,
        _comm: Comm,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclRecv"))
    }
    fn group_start(&self) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclGroupStart"))
    }
    fn group_end(&self) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclGroupEnd"))
    }

    // -- Fourth: memory the library allocates or registers. --

    fn mem_alloc(&self, _bytes: usize) -> Result<DevicePtr> {
        Err(Error::unsupported("TODO(vendor): call ncclMemAlloc"))
    }
    fn mem_free(&self, _ptr: DevicePtr) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclMemFree"))
    }
    fn mem_register(&self, _comm: Comm, _buf: DevicePtr, _bytes: usize) -> Result<RegHandle> {
        Err(Error::unsupported("TODO(vendor): call ncclCommRegister"))
    }
    fn mem_deregister(&self, _comm: Comm, _handle: RegHandle) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call ncclCommDeregister"))
    }
    // ABI 1.2: whether an entry works with the library `init` loaded; Ok(None) for yes,
    // Ok(Some(reason)) for no. (Without this method the SDK answers "yes" for every entry.)
    fn query_support(&self, _entry: &str) -> Result<Option<String>> {
        Err(Error::unsupported(
            "TODO(vendor): say whether the loaded library has what the entry needs (e.g. window_register: ncclCommWindowRegister, NCCL 2.27)",
        ))
    }
}
