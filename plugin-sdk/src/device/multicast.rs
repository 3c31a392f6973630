//! The multicast group (`ferrocx_device_multicast_v1`).

use ferrocx::abi::{AbiHeader, DeviceMulticastV1, DevicePtr, McHandle, Status, VmmHandle};

use crate::boundary::{call, write_out};
use crate::error::{Error, Result};

use super::DeviceAdaptor;

/// The multicast group (`ferrocx_device_multicast_v1`).
pub trait DeviceMulticast: DeviceAdaptor {
    /// Whether `device` supports multicast objects.
    fn mc_supported(&self, device: i32) -> Result<bool>;
    /// Creates a multicast object.
    fn mc_create(&self, bytes: usize, num_devices: i32) -> Result<McHandle>;
    /// Exports an object as a file descriptor.
    fn mc_export_fd(&self, mc: McHandle) -> Result<i32>;
    /// Imports an object from a file descriptor.
    fn mc_import_fd(&self, fd: i32, bytes: usize) -> Result<McHandle>;
    /// Adds a device of this process.
    fn mc_add_device(&self, mc: McHandle, device: i32) -> Result<()>;
    /// Binds memory into the object.
    fn mc_bind(
        &self,
        mc: McHandle,
        mc_offset: usize,
        mem: VmmHandle,
        mem_offset: usize,
        bytes: usize,
    ) -> Result<()>;
    /// Maps the object.
    fn mc_map(&self, mc: McHandle, bytes: usize) -> Result<DevicePtr>;
    /// Unmaps a mapping.
    fn mc_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Unbinds memory.
    fn mc_unbind(&self, mc: McHandle, device: i32, mc_offset: usize, bytes: usize) -> Result<()>;
    /// Releases the object.
    fn mc_release(&self, mc: McHandle) -> Result<()>;
}

/// The trampolines of the group, generic over the adaptor.
mod tramp {
    use super::*;

    pub unsafe extern "C" fn mc_supported<A: DeviceMulticast>(
        device: i32,
        out: *mut i32,
    ) -> Status {
        call("mc_supported", || {
            let s = A::instance().mc_supported(device)?;
            // SAFETY: `out` null or writable by the ABI's contract.
            unsafe { write_out(out, "supported", i32::from(s)) }
        })
    }
    pub unsafe extern "C" fn mc_create<A: DeviceMulticast>(
        bytes: usize,
        n: i32,
        out: *mut McHandle,
    ) -> Status {
        call("mc_create", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`mc` is null"));
            }
            let h = A::instance().mc_create(bytes, n)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "mc", h) }
        })
    }
    pub unsafe extern "C" fn mc_export_fd<A: DeviceMulticast>(
        mc: McHandle,
        out: *mut i32,
    ) -> Status {
        call("mc_export_fd", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`fd` is null"));
            }
            let fd = A::instance().mc_export_fd(mc)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "fd", fd) }
        })
    }
    pub unsafe extern "C" fn mc_import_fd<A: DeviceMulticast>(
        fd: i32,
        bytes: usize,
        out: *mut McHandle,
    ) -> Status {
        call("mc_import_fd", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`mc` is null"));
            }
            let h = A::instance().mc_import_fd(fd, bytes)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "mc", h) }
        })
    }
    pub unsafe extern "C" fn mc_add_device<A: DeviceMulticast>(
        mc: McHandle,
        device: i32,
    ) -> Status {
        call("mc_add_device", || A::instance().mc_add_device(mc, device))
    }
    pub unsafe extern "C" fn mc_bind<A: DeviceMulticast>(
        mc: McHandle,
        mc_offset: usize,
        mem: VmmHandle,
        mem_offset: usize,
        bytes: usize,
    ) -> Status {
        call("mc_bind", || {
            A::instance().mc_bind(mc, mc_offset, mem, mem_offset, bytes)
        })
    }
    pub unsafe extern "C" fn mc_map<A: DeviceMulticast>(
        mc: McHandle,
        bytes: usize,
        out: *mut DevicePtr,
    ) -> Status {
        call("mc_map", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`ptr` is null"));
            }
            let p = A::instance().mc_map(mc, bytes)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "ptr", p) }
        })
    }
    pub unsafe extern "C" fn mc_unmap<A: DeviceMulticast>(ptr: DevicePtr, bytes: usize) -> Status {
        call("mc_unmap", || A::instance().mc_unmap(ptr, bytes))
    }
    pub unsafe extern "C" fn mc_unbind<A: DeviceMulticast>(
        mc: McHandle,
        device: i32,
        mc_offset: usize,
        bytes: usize,
    ) -> Status {
        call("mc_unbind", || {
            A::instance().mc_unbind(mc, device, mc_offset, bytes)
        })
    }
    pub unsafe extern "C" fn mc_release<A: DeviceMulticast>(mc: McHandle) -> Status {
        call("mc_release", || A::instance().mc_release(mc))
    }
}

/// Builds the multicast group table of `A`.
pub const fn multicast_table<A: DeviceMulticast>(
    name: &'static std::ffi::CStr,
) -> DeviceMulticastV1 {
    use tramp::*;
    DeviceMulticastV1 {
        header: AbiHeader::new::<DeviceMulticastV1>(name),
        mc_supported: Some(mc_supported::<A>),
        mc_create: Some(mc_create::<A>),
        mc_export_fd: Some(mc_export_fd::<A>),
        mc_import_fd: Some(mc_import_fd::<A>),
        mc_add_device: Some(mc_add_device::<A>),
        mc_bind: Some(mc_bind::<A>),
        mc_map: Some(mc_map::<A>),
        mc_unmap: Some(mc_unmap::<A>),
        mc_unbind: Some(mc_unbind::<A>),
        mc_release: Some(mc_release::<A>),
    }
}
