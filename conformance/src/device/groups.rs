//! The optional device groups: VMM (exportable allocations), flat mapping, multicast.
//!
//! Multicast objects are never created: DESIGN.md forbids it on hosts other jobs share, and the
//! kit cannot know. Only `mc_supported` is called (it reports what the device offers and
//! creates nothing); no check calls `mc_create` or any entry that joins or fills an object.

use std::os::fd::{FromRawFd, OwnedFd};

use ferrocx::abi::{
    AbiTable, DeviceFlatMapV1, DeviceMulticastV1, DevicePtr, DeviceVmmV1, VmmHandle,
};

use super::check_if;
use super::memory::{differ, pattern};
use crate::boundary::{ensure, optional, raw_call, DeviceApi, Stop, Verdict};
use crate::buffer::{host_ptr, host_ptr_mut};
use crate::report::Outcome;
use crate::runner::Runner;

pub(super) fn run(r: &mut Runner<'_>, api: &DeviceApi, memory: &Option<Outcome>) {
    let t = api.dev.tables();
    let vmm_absent = t
        .vmm
        .is_none()
        .then(|| Outcome::absent(DeviceVmmV1::SYMBOL));
    let flat_absent = t
        .flatmap
        .is_none()
        .then(|| Outcome::absent(DeviceFlatMapV1::SYMBOL));
    check_if(
        r,
        &vmm_absent,
        "VMM: alloc, export and import a descriptor, release",
        || vmm(api),
    );
    let flat_need = flat_absent.or(vmm_absent).or_else(|| memory.clone());
    check_if(
        r,
        &flat_need,
        "flat map: one allocation at two slots, through mem_copy",
        || flat_map(api),
    );
    let mc_absent = t
        .multicast
        .is_none()
        .then(|| Outcome::absent(DeviceMulticastV1::SYMBOL));
    check_if(
        r,
        &mc_absent,
        "multicast: mc_supported (no object is created)",
        || multicast(api),
    );
}

/// A VMM handle, released on drop.
struct Vmm<'a> {
    api: &'a DeviceApi,
    h: VmmHandle,
}

impl<'a> Vmm<'a> {
    fn alloc(api: &'a DeviceApi, bytes: usize) -> Result<Vmm<'a>, Stop> {
        let t = table_vmm(api)?;
        let mut h = VmmHandle(0);
        optional(raw_call!(api, t, vmm_alloc(bytes, &mut h)))?;
        Ok(Vmm { api, h })
    }

    fn import(api: &'a DeviceApi, fd: &OwnedFd, bytes: usize) -> Result<Vmm<'a>, Stop> {
        use std::os::fd::AsRawFd;
        let t = table_vmm(api)?;
        let mut h = VmmHandle(0);
        raw_call!(api, t, vmm_import_fd(fd.as_raw_fd(), bytes, &mut h))?;
        Ok(Vmm { api, h })
    }

    fn export(&self) -> Result<OwnedFd, Stop> {
        let t = table_vmm(self.api)?;
        let mut fd = -1;
        raw_call!(self.api, t, vmm_export_fd(self.h, &mut fd))?;
        ensure(fd >= 0, || {
            format!("vmm_export_fd returned descriptor {fd}")
        })?;
        // SAFETY: the ABI makes the exported descriptor the caller's; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn release(self) -> Result<(), Stop> {
        let (api, h) = (self.api, self.h);
        std::mem::forget(self);
        let t = table_vmm(api)?;
        raw_call!(api, t, vmm_release(h)).map_err(Stop::from)
    }
}

impl Drop for Vmm<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.api.dev.tables().vmm.as_ref() {
            // Observed; `release` reports the outcome where the check cares.
            let _ = raw_call!(self.api, t.get(), vmm_release(self.h));
        }
    }
}

fn table_vmm(api: &DeviceApi) -> Result<&DeviceVmmV1, Stop> {
    api.dev
        .tables()
        .vmm
        .as_ref()
        .map(|t| t.get())
        .ok_or_else(|| Stop(Outcome::absent(DeviceVmmV1::SYMBOL)))
}

fn table_flat(api: &DeviceApi) -> Result<&DeviceFlatMapV1, Stop> {
    api.dev
        .tables()
        .flatmap
        .as_ref()
        .map(|t| t.get())
        .ok_or_else(|| Stop(Outcome::absent(DeviceFlatMapV1::SYMBOL)))
}

fn granularity(api: &DeviceApi) -> Result<usize, Stop> {
    let t = table_vmm(api)?;
    let mut g = 0usize;
    // Whether the device has VMM is known at run time only (a GPU without virtual memory
    // management): `UNSUPPORTED` skips, like `vmm_alloc`'s.
    optional(raw_call!(api, t, vmm_granularity(0, &mut g)))?;
    ensure(g > 0 && g.is_power_of_two(), || {
        format!("vmm_granularity returned {g}, not a power of two")
    })?;
    Ok(g)
}

fn vmm(api: &DeviceApi) -> Verdict {
    let g = granularity(api)?;
    let a = Vmm::alloc(api, 2 * g)?;
    let fd = a.export()?;
    let b = Vmm::import(api, &fd, 2 * g)?;
    drop(fd);
    b.release()?;
    a.release()
}

/// A reservation, released on drop (after its slots, which are dropped first).
struct Reserved<'a> {
    api: &'a DeviceApi,
    base: DevicePtr,
    bytes: usize,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if let Ok(t) = table_flat(self.api) {
            // Observed; the check releases it itself on its good path.
            let _ = raw_call!(self.api, t, flat_release(self.base, self.bytes));
        }
    }
}

/// A mapped slot, unmapped on drop.
struct Slot<'a> {
    api: &'a DeviceApi,
    base: DevicePtr,
    index: usize,
    size: usize,
}

impl Slot<'_> {
    fn addr(&self) -> DevicePtr {
        DevicePtr(self.base.0 + (self.index * self.size) as u64)
    }

    fn unmap(self) -> Verdict {
        let (api, base, index, size) = (self.api, self.base, self.index, self.size);
        std::mem::forget(self);
        let t = table_flat(api)?;
        raw_call!(api, t, flat_unmap(base, index, size)).map_err(Stop::from)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Ok(t) = table_flat(self.api) {
            // Observed; `unmap` reports the outcome on the good path.
            let _ = raw_call!(self.api, t, flat_unmap(self.base, self.index, self.size));
        }
    }
}

fn flat_map(api: &DeviceApi) -> Verdict {
    let t = table_flat(api)?;
    let size = granularity(api)?;
    let a = Vmm::alloc(api, size)?;
    let fd = a.export()?;
    let b = Vmm::import(api, &fd, size)?;
    drop(fd);
    let mut base = DevicePtr::NULL;
    optional(raw_call!(api, t, flat_reserve(2 * size, &mut base)))?;
    let reserved = Reserved {
        api,
        base,
        bytes: 2 * size,
    };
    raw_call!(api, t, flat_map(base, 0, size, a.h))?;
    let s0 = Slot {
        api,
        base,
        index: 0,
        size,
    };
    raw_call!(api, t, flat_map(base, 1, size, b.h))?;
    let s1 = Slot {
        api,
        base,
        index: 1,
        size,
    };
    // Slot 0 maps the allocation, slot 1 its import: one memory seen at two addresses.
    let first = pattern(size, 0xF1A7);
    // SAFETY: slot 0 maps `size` bytes; `first` holds `size`.
    api.seen(unsafe { api.dev.mem_copy(s0.addr(), host_ptr(&first), size) })?;
    let mut seen = vec![0u8; size];
    // SAFETY: slot 1 maps `size` bytes; `seen` holds `size`.
    api.seen(unsafe { api.dev.mem_copy(host_ptr_mut(&mut seen), s1.addr(), size) })?;
    differ("written at slot 0, read at slot 1", &seen, &first)?;
    let second = pattern(size, 0x2F1A);
    // SAFETY: slot 1 maps `size` bytes; `second` holds `size`.
    api.seen(unsafe { api.dev.mem_copy(s1.addr(), host_ptr(&second), size) })?;
    // SAFETY: slot 0 maps `size` bytes; `seen` holds `size`.
    api.seen(unsafe { api.dev.mem_copy(host_ptr_mut(&mut seen), s0.addr(), size) })?;
    differ("written at slot 1, read at slot 0", &seen, &second)?;
    s1.unmap()?;
    s0.unmap()?;
    std::mem::forget(reserved);
    raw_call!(api, t, flat_release(base, 2 * size))?;
    b.release()?;
    a.release()
}

fn multicast(api: &DeviceApi) -> Verdict {
    let Some(t) = api.dev.tables().multicast.as_ref() else {
        return Err(Stop(Outcome::absent(DeviceMulticastV1::SYMBOL)));
    };
    let mut supported = -1i32;
    raw_call!(api, t.get(), mc_supported(0, &mut supported))?;
    ensure(supported == 0 || supported == 1, || {
        format!("mc_supported wrote {supported}; expected 0 or 1")
    })
}
