//! The host CCL: a communicator over shared memory for the processes of one host.

use ferrocx_plugin_sdk::prelude::*;

/// The shared-memory CCL.
#[derive(Default)]
pub struct HostCcl {}

fn unsupported<T>(what: &str) -> Result<T> {
    Err(Error::unsupported(format!("{what} is not implemented by the host CCL yet")))
}

impl CclAdaptor for HostCcl {
    fn instance() -> &'static Self {
        singleton!(HostCcl)
    }
    fn init(&self, _o: &Options) -> Result<()> {
        Ok(())
    }
    fn finalize(&self) -> Result<()> {
        Ok(())
    }
    fn version(&self) -> Result<i32> {
        Ok(10_000)
    }
    fn unique_id(&self) -> Result<Vec<u8>> {
        unsupported("unique_id")
    }
    fn comm_init_rank(&self, _i: &CommInit<'_>) -> Result<Comm> {
        unsupported("comm_init_rank")
    }
    fn comm_finalize(&self, _c: Comm) -> Result<()> {
        unsupported("comm_finalize")
    }
    fn comm_destroy(&self, _c: Comm) -> Result<()> {
        unsupported("comm_destroy")
    }
    fn comm_abort(&self, _c: Comm) -> Result<()> {
        unsupported("comm_abort")
    }
    fn comm_async_error(&self, _c: Comm) -> Result<Status> {
        unsupported("comm_async_error")
    }
    fn comm_count(&self, _c: Comm) -> Result<i32> {
        unsupported("comm_count")
    }
    fn comm_user_rank(&self, _c: Comm) -> Result<i32> {
        unsupported("comm_user_rank")
    }
    fn comm_device(&self, _c: Comm) -> Result<i32> {
        unsupported("comm_device")
    }
    fn all_reduce(&self, _s: DevicePtr, _r: DevicePtr, _n: usize, _t: DataType, _o: ReduceOp, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("all_reduce")
    }
    fn all_gather(&self, _s: DevicePtr, _r: DevicePtr, _n: usize, _t: DataType, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("all_gather")
    }
    fn reduce_scatter(&self, _s: DevicePtr, _r: DevicePtr, _n: usize, _t: DataType, _o: ReduceOp, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("reduce_scatter")
    }
    fn broadcast(&self, _s: DevicePtr, _r: DevicePtr, _n: usize, _t: DataType, _root: i32, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("broadcast")
    }
    fn reduce(&self, _s: DevicePtr, _r: DevicePtr, _n: usize, _t: DataType, _o: ReduceOp, _root: i32, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("reduce")
    }
    fn gather(&self, _s: DevicePtr, _r: DevicePtr, _n: usize, _t: DataType, _root: i32, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("gather")
    }
    fn scatter(&self, _s: DevicePtr, _r: DevicePtr, _n: usize, _t: DataType, _root: i32, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("scatter")
    }
    fn all_to_all(&self, _s: DevicePtr, _r: DevicePtr, _n: usize, _t: DataType, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("all_to_all")
    }
    fn all_to_allv(&self, _s: DevicePtr, _sv: VCounts<'_>, _r: DevicePtr, _rv: VCounts<'_>, _t: DataType, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("all_to_allv")
    }
    fn send(&self, _b: DevicePtr, _n: usize, _t: DataType, _p: i32, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("send")
    }
    fn recv(&self, _b: DevicePtr, _n: usize, _t: DataType, _p: i32, _c: Comm, _st: Stream) -> Result<()> {
        unsupported("recv")
    }
    fn group_start(&self) -> Result<()> {
        unsupported("group_start")
    }
    fn group_end(&self) -> Result<()> {
        unsupported("group_end")
    }
    fn mem_alloc(&self, _bytes: usize) -> Result<DevicePtr> {
        unsupported("mem_alloc")
    }
    fn mem_free(&self, _p: DevicePtr) -> Result<()> {
        unsupported("mem_free")
    }
    fn mem_register(&self, _c: Comm, _b: DevicePtr, _n: usize) -> Result<RegHandle> {
        unsupported("mem_register")
    }
    fn mem_deregister(&self, _c: Comm, _h: RegHandle) -> Result<()> {
        unsupported("mem_deregister")
    }
}
