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

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::sys::{
    CUdeviceptr, CUmemAccessDesc, CUmemAccess_flags, CUmemLocation, CUmemLocationType,
};
use ferrocx_plugin_sdk::prelude::*;

use crate::device::State;
use crate::vmm;
use crate::CudaDevice;

/// One reservation and its mapped slots.
#[derive(Debug, Default)]
pub(crate) struct Reservation {
    /// Bytes reserved (a multiple of `granularity`).
    size: usize,
    /// The granularity the reservation was made with; slots are multiples of it.
    granularity: usize,
    /// Mapped slots: address → length.
    slots: BTreeMap<u64, usize>,
}

impl Reservation {
    /// The mapped slot overlapping `[addr, addr + len)`, if any.
    fn overlapping(&self, addr: u64, len: usize) -> Option<(u64, usize)> {
        let end = addr + len as u64;
        let before = self
            .slots
            .range(..=addr)
            .next_back()
            .filter(|(&s, &l)| s + l as u64 > addr);
        let after = self.slots.range(addr..end).next();
        before.or(after).map(|(&s, &l)| (s, l))
    }
}

/// The reservations of this adaptor, by base address.
#[derive(Default)]
pub(crate) struct Reservations(Mutex<BTreeMap<u64, Reservation>>);

impl Reservations {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Reservation>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `true` when nothing is reserved.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// The reservation holding `base` and the address of slot `index` of `size` bytes, checked to
/// lie aligned inside it.
fn locate(
    reg: &mut BTreeMap<u64, Reservation>,
    base: DevicePtr,
    index: usize,
    size: usize,
) -> Result<(&mut Reservation, u64)> {
    let (&start, r) = reg
        .range_mut(..=base.0)
        .next_back()
        .filter(|(&start, r)| base.0 < start + r.size as u64)
        .ok_or_else(|| {
            Error::invalid_handle(format!(
                "{:#x} is not inside a flat reservation of this adaptor",
                base.0
            ))
        })?;
    let g = r.granularity;
    if size == 0 || size % g != 0 {
        return Err(Error::invalid_argument(format!(
            "slot size {size} is not a non-zero multiple of the granularity ({g} bytes)"
        )));
    }
    if (base.0 - start) % g as u64 != 0 {
        return Err(Error::invalid_argument(format!(
            "base {:#x} is not aligned to the granularity ({g} bytes)",
            base.0
        )));
    }
    let end = start + r.size as u64;
    let addr = index
        .checked_mul(size)
        .and_then(|off| base.0.checked_add(off as u64))
        .filter(|&a| a.checked_add(size as u64).is_some_and(|e| e <= end))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "slot {index} of {size} bytes from {:#x} ends past the {}-byte reservation at \
                 {start:#x}",
                base.0, r.size
            ))
        })?;
    Ok((r, addr))
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
    let all = std::mem::take(&mut *st.flat.lock());
    let mut first = Ok(());
    let mut keep = |r: Result<()>| {
        if first.is_ok() {
            first = r;
        }
    };
    for (base, r) in all {
        for (&addr, &len) in &r.slots {
            // SAFETY: a slot this adaptor mapped; the adaptor is being finalised.
            keep(st.check("cuMemUnmap", unsafe { (st.lib.cuMemUnmap)(addr, len) }));
        }
        // SAFETY: a reservation this adaptor made, its slots unmapped above.
        keep(st.check("cuMemAddressFree", unsafe {
            (st.lib.cuMemAddressFree)(base, r.size)
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
        st.flat.lock().insert(
            base,
            Reservation {
                size,
                granularity: g,
                slots: BTreeMap::new(),
            },
        );
        Ok(DevicePtr(base))
    }

    fn flat_map(&self, base: DevicePtr, index: usize, size: usize, h: VmmHandle) -> Result<()> {
        let st = self.ready()?;
        let ordinal = st.thread_ordinal()?;
        // Lock order: reservations, then VMM handles.
        let mut reg = st.flat.lock();
        let (r, addr) = locate(&mut reg, base, index, size)?;
        if let Some((s, l)) = r.overlapping(addr, size) {
            return Err(Error::invalid_argument(format!(
                "slot {index} ({size} bytes at {addr:#x}) overlaps the mapping of {l} bytes at \
                 {s:#x}: unmap it first"
            )));
        }
        let p = st.vmm.get(h)?;
        if size > p.size {
            return Err(Error::invalid_argument(format!(
                "slot of {size} bytes is larger than VMM handle {:#x} ({} bytes)",
                h.0, p.size
            )));
        }
        map_with_access(&st, ordinal, addr, size, p.handle)?;
        r.slots.insert(addr, size);
        Ok(())
    }

    fn flat_unmap(&self, base: DevicePtr, index: usize, size: usize) -> Result<()> {
        let st = self.ready()?;
        let mut reg = st.flat.lock();
        let (r, addr) = locate(&mut reg, base, index, size)?;
        if r.slots.get(&addr) != Some(&size) {
            return Err(Error::invalid_argument(format!(
                "slot {index} ({size} bytes at {addr:#x}) is not mapped"
            )));
        }
        // SAFETY: a slot this adaptor mapped; the caller is done with it (the ABI's contract).
        st.check("cuMemUnmap", unsafe { (st.lib.cuMemUnmap)(addr, size) })?;
        r.slots.remove(&addr);
        Ok(())
    }

    fn flat_release(&self, base: DevicePtr, bytes: usize) -> Result<()> {
        let st = self.ready()?;
        let mut reg = st.flat.lock();
        let r = reg.get(&base.0).ok_or_else(|| {
            Error::invalid_handle(format!(
                "{:#x} is not a flat reservation of this adaptor",
                base.0
            ))
        })?;
        if bytes == 0 || vmm::round_up(bytes, r.granularity)? != r.size {
            return Err(Error::invalid_argument(format!(
                "the reservation at {:#x} has {} bytes, not {bytes}",
                base.0, r.size
            )));
        }
        if !r.slots.is_empty() {
            return Err(Error::invalid_argument(format!(
                "the reservation at {:#x} still has {} mapped slot(s): unmap them first",
                base.0,
                r.slots.len()
            )));
        }
        let size = r.size;
        // SAFETY: a reservation of this adaptor with no slot mapped.
        st.check("cuMemAddressFree", unsafe {
            (st.lib.cuMemAddressFree)(base.0, size)
        })?;
        reg.remove(&base.0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(base: u64, size: usize, g: usize) -> BTreeMap<u64, Reservation> {
        let mut reg = BTreeMap::new();
        reg.insert(
            base,
            Reservation {
                size,
                granularity: g,
                slots: BTreeMap::new(),
            },
        );
        reg
    }

    #[test]
    fn slots_are_located_inside_their_reservation() {
        let (g, base) = (1usize << 21, 1u64 << 40);
        let mut reg = one(base, 4 * g, g);
        let st = |r: Result<(&mut Reservation, u64)>| r.map(|(_, a)| a).unwrap_err().status();
        assert_eq!(
            locate(&mut reg, DevicePtr(base), 3, g).unwrap().1,
            base + 3 * g as u64
        );
        // From an inner base too: slot 1 of 2g from base + g is [base + 3g, base + 5g): too far.
        assert_eq!(
            locate(&mut reg, DevicePtr(base + g as u64), 0, 2 * g)
                .unwrap()
                .1,
            base + g as u64
        );
        assert_eq!(
            st(locate(&mut reg, DevicePtr(base + g as u64), 1, 2 * g)),
            Status::INVALID_ARGUMENT
        );
        assert_eq!(
            st(locate(&mut reg, DevicePtr(base), 4, g)),
            Status::INVALID_ARGUMENT
        );
        assert_eq!(
            st(locate(&mut reg, DevicePtr(base), 0, g + 1)),
            Status::INVALID_ARGUMENT
        );
        assert_eq!(
            st(locate(&mut reg, DevicePtr(base), 0, 0)),
            Status::INVALID_ARGUMENT
        );
        assert_eq!(
            st(locate(&mut reg, DevicePtr(base + 1), 0, g)),
            Status::INVALID_ARGUMENT
        );
        assert_eq!(
            st(locate(&mut reg, DevicePtr(base), usize::MAX, g)),
            Status::INVALID_ARGUMENT
        );
        assert_eq!(
            st(locate(&mut reg, DevicePtr(base + 4 * g as u64), 0, g)),
            Status::INVALID_HANDLE
        );
        assert_eq!(
            st(locate(&mut reg, DevicePtr(8), 0, g)),
            Status::INVALID_HANDLE
        );
    }

    #[test]
    fn overlapping_slots_are_found() {
        let g = 4096usize;
        let mut r = Reservation {
            size: 8 * g,
            granularity: g,
            slots: BTreeMap::new(),
        };
        r.slots.insert(2 * g as u64, 2 * g);
        assert_eq!(r.overlapping(0, 2 * g), None);
        assert_eq!(r.overlapping(4 * g as u64, g), None);
        assert_eq!(r.overlapping(3 * g as u64, g), Some((2 * g as u64, 2 * g)));
        assert_eq!(r.overlapping(g as u64, 2 * g), Some((2 * g as u64, 2 * g)));
    }
}
