//! A minimal CCL: communicators of one rank, over [`HostMemDevice`]'s memory and streams.
//!
//! With one rank every collective is a copy of the rank's own data (a reduction over one
//! contribution is that contribution, whatever the operation), enqueued on the caller's stream
//! of the paired device adaptor, so it runs in stream order with the device's other work. The
//! adaptor declares what it claims in [`CclAdaptor::LIMITS`]: one rank, and a subset of the
//! data types and reductions (to show the declaration; the conformance kit reports the others
//! as "not claimed"). Point-to-point and groups, which a one-rank world has no use for, and
//! buffer registration are exported as absent (`ccl_absent` in `lib.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ferrocx_plugin_sdk::prelude::*;

use crate::HostMemDevice;

/// The CCL: its live communicators and the device each was made on.
#[derive(Default)]
pub struct OneRankCcl {
    comms: Mutex<HashMap<usize, i32>>,
    next: AtomicU64,
}

impl OneRankCcl {
    /// The device of a live communicator.
    fn device_of(&self, comm: Comm) -> Result<i32> {
        let comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        comms.get(&(comm.0 as usize)).copied().ok_or_else(|| {
            Error::invalid_handle(format!("{:#x} is not a communicator", comm.0 as usize))
        })
    }

    /// Checks a collective's arguments and enqueues the copy of `n` elements of `dtype` from
    /// `send` to `recv` (nothing when they are the same buffer: in place).
    #[allow(clippy::too_many_arguments)] // a collective's own arguments
    fn copy(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        dtype: DataType,
        root: Option<i32>,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.device_of(comm)?;
        let size = dtype
            .size()
            .ok_or_else(|| Error::invalid_argument(format!("unknown data type {}", dtype.0)))?;
        if let Some(root) = root {
            if root != 0 {
                return Err(Error::invalid_argument(format!(
                    "root {root} is not a rank of a one-rank communicator"
                )));
            }
        }
        if n == 0 || send == recv {
            return Ok(());
        }
        if send == DevicePtr::NULL || recv == DevicePtr::NULL {
            return Err(Error::invalid_argument(
                "a null buffer with a non-zero count",
            ));
        }
        HostMemDevice::instance().mem_copy_async(recv, send, n * size, stream)
    }
}

fn reduction(op: ReduceOp) -> Result<()> {
    if ReduceOp::ALL.contains(&op) {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!(
            "unknown reduction {}",
            op.0
        )))
    }
}

impl CclAdaptor for OneRankCcl {
    // One rank; the types and reductions listed. Anything else is refused before these methods
    // are called, and reported by the conformance kit as "not claimed".
    const LIMITS: Limits = Limits::NONE
        .max_ranks(1)
        .dtypes(&[
            DataType::F32,
            DataType::F64,
            DataType::I32,
            DataType::I64,
            DataType::U8,
            DataType::U64,
        ])
        .reduce_ops(&[ReduceOp::SUM, ReduceOp::MAX, ReduceOp::MIN]);

    fn instance() -> &'static Self {
        singleton!(OneRankCcl)
    }
    fn init(&self, _options: &Options) -> Result<()> {
        Ok(())
    }
    fn finalize(&self) -> Result<()> {
        self.comms.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(())
    }
    fn version(&self) -> Result<i32> {
        Ok(1)
    }
    fn unique_id(&self) -> Result<Vec<u8>> {
        // One rank: nothing to rendezvous with, but a distinct id per call all the same.
        Ok(self
            .next
            .fetch_add(1, Ordering::Relaxed)
            .to_le_bytes()
            .to_vec())
    }
    fn comm_init_rank(&self, init: &CommInit<'_>) -> Result<Comm> {
        // `LIMITS` already refused more than one rank.
        if init.rank != 0 || init.nranks != 1 {
            return Err(Error::invalid_argument(format!(
                "rank {} of {}: this CCL has communicators of one rank",
                init.rank, init.nranks
            )));
        }
        let count = HostMemDevice::instance().device_count()?;
        if !(0..count).contains(&init.device) {
            return Err(Error::invalid_argument(format!(
                "device {} out of range",
                init.device
            )));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed) as usize + 1;
        let handle = id << 4; // never null
        self.comms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, init.device);
        Ok(Comm(handle as *mut std::ffi::c_void))
    }
    fn comm_finalize(&self, comm: Comm) -> Result<()> {
        self.device_of(comm).map(|_| ())
    }
    fn comm_destroy(&self, comm: Comm) -> Result<()> {
        let mut comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        comms.remove(&(comm.0 as usize)).map(|_| ()).ok_or_else(|| {
            Error::invalid_handle(format!("{:#x} is not a communicator", comm.0 as usize))
        })
    }
    fn comm_abort(&self, comm: Comm) -> Result<()> {
        self.comm_destroy(comm)
    }
    fn comm_async_error(&self, comm: Comm) -> Result<Status> {
        self.device_of(comm).map(|_| Status::SUCCESS)
    }
    fn comm_count(&self, comm: Comm) -> Result<i32> {
        self.device_of(comm).map(|_| 1)
    }
    fn comm_user_rank(&self, comm: Comm) -> Result<i32> {
        self.device_of(comm).map(|_| 0)
    }
    fn comm_device(&self, comm: Comm) -> Result<i32> {
        self.device_of(comm)
    }
    fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        dtype: DataType,
        op: ReduceOp,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        reduction(op)?;
        self.copy(send, recv, n, dtype, None, comm, stream)
    }
    fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        dtype: DataType,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.copy(send, recv, n, dtype, None, comm, stream)
    }
    fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        dtype: DataType,
        op: ReduceOp,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        reduction(op)?;
        self.copy(send, recv, n, dtype, None, comm, stream)
    }
    fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        dtype: DataType,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.copy(send, recv, n, dtype, Some(root), comm, stream)
    }
    fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        dtype: DataType,
        op: ReduceOp,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        reduction(op)?;
        self.copy(send, recv, n, dtype, Some(root), comm, stream)
    }
    fn gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        dtype: DataType,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.copy(send, recv, n, dtype, Some(root), comm, stream)
    }
    fn scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        dtype: DataType,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.copy(send, recv, n, dtype, Some(root), comm, stream)
    }
    fn all_to_all(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        dtype: DataType,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.copy(send, recv, n, dtype, None, comm, stream)
    }
    fn all_to_allv(
        &self,
        send: DevicePtr,
        send_counts: VCounts<'_>,
        recv: DevicePtr,
        recv_counts: VCounts<'_>,
        dtype: DataType,
        comm: Comm,
        stream: Stream,
    ) -> Result<()> {
        let size = dtype
            .size()
            .ok_or_else(|| Error::invalid_argument(format!("unknown data type {}", dtype.0)))?;
        let (n, sd, rd) = (
            send_counts.counts[0],
            send_counts.displs[0],
            recv_counts.displs[0],
        );
        if recv_counts.counts[0] != n {
            return Err(Error::invalid_argument(format!(
                "rank 0 sends {n} elements to itself but receives {}",
                recv_counts.counts[0]
            )));
        }
        let at = |p: DevicePtr, d: usize| DevicePtr(p.0 + (d * size) as u64);
        self.copy(at(send, sd), at(recv, rd), n, dtype, None, comm, stream)
    }
    fn send(&self, _: DevicePtr, _: usize, _: DataType, _: i32, _: Comm, _: Stream) -> Result<()> {
        Err(Error::unsupported("exported as absent"))
    }
    fn recv(&self, _: DevicePtr, _: usize, _: DataType, _: i32, _: Comm, _: Stream) -> Result<()> {
        Err(Error::unsupported("exported as absent"))
    }
    fn group_start(&self) -> Result<()> {
        Err(Error::unsupported("exported as absent"))
    }
    fn group_end(&self) -> Result<()> {
        Err(Error::unsupported("exported as absent"))
    }
    fn mem_alloc(&self, _bytes: usize) -> Result<DevicePtr> {
        Err(Error::unsupported("exported as absent"))
    }
    fn mem_free(&self, _ptr: DevicePtr) -> Result<()> {
        Err(Error::unsupported("exported as absent"))
    }
    fn mem_register(&self, _comm: Comm, _buf: DevicePtr, _bytes: usize) -> Result<RegHandle> {
        Err(Error::unsupported("exported as absent"))
    }
    fn mem_deregister(&self, _comm: Comm, _handle: RegHandle) -> Result<()> {
        Err(Error::unsupported("exported as absent"))
    }
}
