//! The VMM group (`ferrocx_device_vmm_v1`): exportable physical allocations.

use ferrocx::abi::{AbiHeader, DeviceVmmV1, Status, VmmHandle};

use crate::boundary::{call, write_out};
use crate::error::{Error, Result};

use super::DeviceAdaptor;

/// The VMM group (`ferrocx_device_vmm_v1`).
pub trait DeviceVmm: DeviceAdaptor {
    /// Allocation granularity in bytes.
    fn vmm_granularity(&self, device: i32) -> Result<usize>;
    /// Allocates exportable physical memory.
    fn vmm_alloc(&self, bytes: usize) -> Result<VmmHandle>;
    /// Exports an allocation as a file descriptor owned by the caller.
    fn vmm_export_fd(&self, handle: VmmHandle) -> Result<i32>;
    /// Imports an allocation from a file descriptor (which stays the caller's).
    fn vmm_import_fd(&self, fd: i32, bytes: usize) -> Result<VmmHandle>;
    /// Releases an allocation or import.
    fn vmm_release(&self, handle: VmmHandle) -> Result<()>;
}

/// The trampolines of the group, generic over the adaptor.
mod tramp {
    use super::*;

    pub unsafe extern "C" fn vmm_granularity<A: DeviceVmm>(device: i32, out: *mut usize) -> Status {
        // SAFETY: `out` null or writable by the ABI's contract.
        call("vmm_granularity", || unsafe {
            write_out(out, "bytes", A::instance().vmm_granularity(device)?)
        })
    }
    pub unsafe extern "C" fn vmm_alloc<A: DeviceVmm>(bytes: usize, out: *mut VmmHandle) -> Status {
        call("vmm_alloc", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`handle` is null"));
            }
            let h = A::instance().vmm_alloc(bytes)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "handle", h) }
        })
    }
    pub unsafe extern "C" fn vmm_export_fd<A: DeviceVmm>(h: VmmHandle, out: *mut i32) -> Status {
        call("vmm_export_fd", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`fd` is null"));
            }
            let fd = A::instance().vmm_export_fd(h)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "fd", fd) }
        })
    }
    pub unsafe extern "C" fn vmm_import_fd<A: DeviceVmm>(
        fd: i32,
        bytes: usize,
        out: *mut VmmHandle,
    ) -> Status {
        call("vmm_import_fd", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`handle` is null"));
            }
            let h = A::instance().vmm_import_fd(fd, bytes)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "handle", h) }
        })
    }
    pub unsafe extern "C" fn vmm_release<A: DeviceVmm>(h: VmmHandle) -> Status {
        call("vmm_release", || A::instance().vmm_release(h))
    }
}

/// Builds the VMM group table of `A`.
pub const fn vmm_table<A: DeviceVmm>(name: &'static std::ffi::CStr) -> DeviceVmmV1 {
    use tramp::*;
    DeviceVmmV1 {
        header: AbiHeader::new::<DeviceVmmV1>(name),
        vmm_granularity: Some(vmm_granularity::<A>),
        vmm_alloc: Some(vmm_alloc::<A>),
        vmm_export_fd: Some(vmm_export_fd::<A>),
        vmm_import_fd: Some(vmm_import_fd::<A>),
        vmm_release: Some(vmm_release::<A>),
    }
}
