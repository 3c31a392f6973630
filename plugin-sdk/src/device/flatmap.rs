//! The flat-map group (`ferrocx_device_flatmap_v1`): peers mapped into one virtual range.

use ferrocx::abi::{AbiHeader, DeviceFlatMapV1, DevicePtr, Status, VmmHandle};

use crate::boundary::{call, write_out};
use crate::error::{Error, Result};

use super::DeviceAdaptor;

/// The flat-map group (`ferrocx_device_flatmap_v1`). [`crate::flat::FlatReservations`] keeps the
/// reservations and slots and checks every argument, so an implementation only calls the
/// vendor's reserve, map, unmap and free.
pub trait DeviceFlatMap: DeviceAdaptor {
    /// Reserves a virtual range.
    fn flat_reserve(&self, bytes: usize) -> Result<DevicePtr>;
    /// Maps `handle` at `base + index * size`.
    fn flat_map(&self, base: DevicePtr, index: usize, size: usize, handle: VmmHandle)
        -> Result<()>;
    /// Unmaps the slot at `base + index * size`.
    fn flat_unmap(&self, base: DevicePtr, index: usize, size: usize) -> Result<()>;
    /// Releases a reservation.
    fn flat_release(&self, base: DevicePtr, bytes: usize) -> Result<()>;
}

/// The trampolines of the group, generic over the adaptor.
mod tramp {
    use super::*;

    pub unsafe extern "C" fn flat_reserve<A: DeviceFlatMap>(
        bytes: usize,
        out: *mut DevicePtr,
    ) -> Status {
        call("flat_reserve", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`base` is null"));
            }
            let b = A::instance().flat_reserve(bytes)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "base", b) }
        })
    }
    pub unsafe extern "C" fn flat_map<A: DeviceFlatMap>(
        base: DevicePtr,
        index: usize,
        size: usize,
        h: VmmHandle,
    ) -> Status {
        call("flat_map", || A::instance().flat_map(base, index, size, h))
    }
    pub unsafe extern "C" fn flat_unmap<A: DeviceFlatMap>(
        base: DevicePtr,
        index: usize,
        size: usize,
    ) -> Status {
        call("flat_unmap", || A::instance().flat_unmap(base, index, size))
    }
    pub unsafe extern "C" fn flat_release<A: DeviceFlatMap>(
        base: DevicePtr,
        bytes: usize,
    ) -> Status {
        call("flat_release", || A::instance().flat_release(base, bytes))
    }
}

/// Builds the flat-map group table of `A`.
pub const fn flatmap_table<A: DeviceFlatMap>(name: &'static std::ffi::CStr) -> DeviceFlatMapV1 {
    use tramp::*;
    DeviceFlatMapV1 {
        header: AbiHeader::new::<DeviceFlatMapV1>(name),
        flat_reserve: Some(flat_reserve::<A>),
        flat_map: Some(flat_map::<A>),
        flat_unmap: Some(flat_unmap::<A>),
        flat_release: Some(flat_release::<A>),
    }
}
