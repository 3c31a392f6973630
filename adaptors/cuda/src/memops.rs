//! The memops group of the CUDA adaptor (`ferrocx_device_memops_v1`): 32-bit stores and waits
//! on host memory in stream order.
//!
//! - `stream_write_value32` is `cuStreamWriteValue32` (the `_v2` entry, default flags: the
//!   store is made after the stream's earlier work, with a memory barrier, so a host thread that
//!   reads the value sees that work's writes).
//! - `stream_wait_value32` is `cuStreamWaitValue32` (`_v2`) with `CU_STREAM_WAIT_VALUE_GEQ` or
//!   `CU_STREAM_WAIT_VALUE_EQ`. A wait that is never satisfied holds the stream until it is
//!   destroyed, as CUDA does.
//! - `addr` must be host memory the device can reach: pinned (`MemKind::PINNED`) or registered
//!   memory, whose host address is its device address under unified addressing (every device
//!   this adaptor supports). The driver refuses other addresses with `INVALID_VALUE`.

use cudarc::driver::sys::{CUdeviceptr, CUstreamWaitValue_flags, CUstreamWriteValue_flags};
use ferrocx_plugin_sdk::prelude::*;

use crate::device::stream;
use crate::CudaDevice;

pub(crate) static MEMOPS: ferrocx::abi::DeviceMemOpsV1 =
    ferrocx_plugin_sdk::memops_table::<CudaDevice>(crate::NAME);

impl DeviceMemOps for CudaDevice {
    unsafe fn stream_write_value32(&self, s: Stream, addr: *mut u32, value: u32) -> Result<()> {
        let st = self.ready()?;
        let flags = CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: a stream of this adaptor (or null) and an address the caller keeps valid
        // until the store ran (this method's contract); the driver checks that the device can
        // reach it.
        let r = unsafe {
            (st.lib.cuStreamWriteValue32_v2)(stream(s), addr as CUdeviceptr, value, flags)
        };
        st.check("cuStreamWriteValue32", r)
    }

    unsafe fn stream_wait_value32(
        &self,
        s: Stream,
        addr: *const u32,
        value: u32,
        condition: WaitCondition,
    ) -> Result<()> {
        let st = self.ready()?;
        let flags = match condition {
            WaitCondition::Geq => CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ,
            WaitCondition::Eq => CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ,
        } as u32;
        // SAFETY: as `stream_write_value32`: the caller keeps `addr` valid until the wait is
        // over.
        let r = unsafe {
            (st.lib.cuStreamWaitValue32_v2)(stream(s), addr as CUdeviceptr, value, flags)
        };
        st.check("cuStreamWaitValue32", r)
    }
}
