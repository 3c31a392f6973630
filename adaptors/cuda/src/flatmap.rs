//! The flat-map group (`ferrocx_device_flatmap_v1`): VMM allocations of every peer mapped into
//! one reserved virtual range, peer `i` at `base + i * size`.
//!
//! - `flat_reserve` is `cuMemAddressReserve` of `bytes` rounded up to the calling thread's
//!   device's granularity, aligned to it (the core reserves `n * size` for `n` peers).
//! - `flat_map` is `cuMemMap` of an allocation (or an import of a peer's) at
//!   `base + index * size`, then `cuMemSetAccess` read/write for the calling thread's device.
//!   When the access cannot be set the slot is unmapped again: a failed call leaves nothing
//!   mapped.
//! - `flat_unmap` is `cuMemUnmap` of one slot; `flat_release` is `cuMemAddressFree` of a
//!   reservation whose slots are all unmapped.
//!
//! Every slot is checked against the reservations this adaptor made before the driver sees
//! it: inside one, aligned to the granularity, not overlapping a mapped slot.

use std::sync::{Mutex, MutexGuard};

use cudarc::driver::sys::{
    CUdeviceptr, CUmemAccessDesc, CUmemAccess_flags, CUmemLocation, CUmemLocationType,
};
use ferrocx_plugin_sdk::flat::FlatReservations;
use ferrocx_plugin_sdk::prelude::*;

use crate::device::State;
use crate::vmm;
use crate::CudaDevice;

/// The reservations of this adaptor and their mapped slots.
#[derive(Default)]
pub(crate) struct Reservations(Mutex<FlatReservations<()>>);

impl Reservations {
    fn lock(&self) -> MutexGuard<'_, FlatReservations<()>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `true` when nothing is reserved.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// Read/write access for device `ordinal`.
fn read_write(st: &State, ordinal: usize) -> CUmemAccessDesc {
    CUmemAccessDesc {
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: st.devices[ordinal],
        },
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// Maps `size` bytes of `handle` at `addr` (reserved, unmapped, aligned) with read/write
/// access for device `ordinal`. On failure nothing stays mapped.
pub(crate) fn map_with_access(
    st: &State,
    ordinal: usize,
    addr: CUdeviceptr,
    size: usize,
    handle: cudarc::driver::sys::CUmemGenericAllocationHandle,
) -> Result<()> {
    // SAFETY: `addr..addr + size` lies in a reservation of this adaptor and is not mapped
    // (checked by the callers); the handle is live; offset and flags must be 0.
    st.check("cuMemMap", unsafe {
        (st.lib.cuMemMap)(addr, size, 0, handle, 0)
    })?;
    let desc = read_write(st, ordinal);
    // SAFETY: the range was just mapped; one valid descriptor.
    let r = unsafe { (st.lib.cuMemSetAccess)(addr, size, &desc, 1) };
    if let Err(e) = st.check("cuMemSetAccess", r) {
        // Release what this call mapped before reporting.
        // SAFETY: the mapping made above, not handed out to anyone.
        let undo = unsafe { (st.lib.cuMemUnmap)(addr, size) };
        if let Err(u) = st.check("cuMemUnmap", undo) {
            tracing::warn!("undoing a mapping whose access could not be set: {u}");
        }
        return Err(e);
    }
    Ok(())
}

/// Unmaps every slot and frees every reservation still held (at `finalize`): the first error.
pub(crate) fn release_all(st: &State) -> Result<()> {
    let all = st.flat.lock().take_all();
    let mut first = Ok(());
    let mut keep = |r: Result<()>| {
        if first.is_ok() {
            first = r;
        }
    };
    for r in all {
        for (addr, len) in r.slots() {
            // SAFETY: a slot this adaptor mapped; the adaptor is being finalised.
            keep(st.check("cuMemUnmap", unsafe { (st.lib.cuMemUnmap)(addr, len) }));
        }
        // SAFETY: a reservation this adaptor made, its slots unmapped above.
        keep(st.check("cuMemAddressFree", unsafe {
            (st.lib.cuMemAddressFree)(r.start(), r.size())
        }));
    }
    first
}

impl DeviceFlatMap for CudaDevice {
    fn flat_reserve(&self, bytes: usize) -> Result<DevicePtr> {
        let st = self.ready()?;
        if bytes == 0 {
            return Err(Error::invalid_argument("cannot reserve 0 bytes"));
        }
        let ordinal = st.thread_ordinal()?;
        let g = vmm::granularity(&st, ordinal)?;
        let size = vmm::round_up(bytes, g)?;
        let mut base: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; no fixed address is asked for (0) and flags must be 0.
        st.check("cuMemAddressReserve", unsafe {
            (st.lib.cuMemAddressReserve)(&mut base, size, g, 0, 0)
        })?;
        st.flat.lock().insert(base, size, g, ());
        Ok(DevicePtr(base))
    }

    fn flat_map(&self, base: DevicePtr, index: usize, size: usize, h: VmmHandle) -> Result<()> {
        let st = self.ready()?;
        let ordinal = st.thread_ordinal()?;
        // Lock order: reservations, then VMM handles.
        let mut reg = st.flat.lock();
        let addr = reg.free_slot(base, index, size)?;
        let p = st.vmm.get(h)?;
        if size > p.size {
            return Err(Error::invalid_argument(format!(
                "slot of {size} bytes is larger than VMM handle {:#x} ({} bytes)",
                h.0, p.size
            )));
        }
        map_with_access(&st, ordinal, addr, size, p.handle)?;
        reg.mapped(addr, size);
        Ok(())
    }

    fn flat_unmap(&self, base: DevicePtr, index: usize, size: usize) -> Result<()> {
        let st = self.ready()?;
        let mut reg = st.flat.lock();
        let addr = reg.mapped_slot(base, index, size)?;
        // SAFETY: a slot this adaptor mapped; the caller is done with it (the ABI's contract).
        st.check("cuMemUnmap", unsafe { (st.lib.cuMemUnmap)(addr, size) })?;
        reg.unmapped(addr);
        Ok(())
    }

    fn flat_release(&self, base: DevicePtr, bytes: usize) -> Result<()> {
        let st = self.ready()?;
        let mut reg = st.flat.lock();
        let size = reg.releasable(base, bytes, vmm::round_up)?.size();
        // SAFETY: a reservation of this adaptor with no slot mapped.
        st.check("cuMemAddressFree", unsafe {
            (st.lib.cuMemAddressFree)(base.0, size)
        })?;
        reg.remove(base);
        Ok(())
    }
}
