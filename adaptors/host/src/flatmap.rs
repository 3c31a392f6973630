//! Flat mapping of the host device: a reserved range of address space (`PROT_NONE`, no memory
//! behind it) into which VMM allocations are mapped, peer `i` at `base + i * size`.
//!
//! Mapping a slot replaces its part of the reservation with a shared mapping of the
//! allocation's memory file (`MAP_FIXED`); unmapping puts inaccessible anonymous memory back, so
//! the range stays reserved (nothing else of the process can be placed in it) until released.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use ferrocx_plugin_sdk::abi::{DevicePtr, VmmHandle};
use ferrocx_plugin_sdk::{Error, Result};

use crate::shm::{self, Mapping};
use crate::vmm;

/// One reservation and its mapped slots.
struct Reservation {
    /// The whole range; unmapping it on drop also unmaps every slot.
    map: Mapping,
    /// Mapped slots: address → length.
    slots: BTreeMap<u64, usize>,
}

impl Reservation {
    /// The slot overlapping `[addr, addr + len)`, if any.
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

fn registry() -> MutexGuard<'static, BTreeMap<u64, Reservation>> {
    static RESERVATIONS: OnceLock<Mutex<BTreeMap<u64, Reservation>>> = OnceLock::new();
    RESERVATIONS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Reserves `bytes` (rounded up to pages) of address space.
pub fn reserve(bytes: usize) -> Result<DevicePtr> {
    if bytes == 0 {
        return Err(Error::invalid_argument("cannot reserve 0 bytes"));
    }
    let map = Mapping::reserve(shm::round_to_pages(bytes)?)?;
    let base = map.addr();
    registry().insert(
        base,
        Reservation {
            map,
            slots: BTreeMap::new(),
        },
    );
    Ok(DevicePtr(base))
}

/// The reservation holding `base` and the address of slot `index` of `size` bytes, checked to
/// lie page-aligned inside it.
fn locate(
    reg: &mut BTreeMap<u64, Reservation>,
    base: DevicePtr,
    index: usize,
    size: usize,
) -> Result<(&mut Reservation, u64)> {
    let (_, r) = reg
        .range_mut(..=base.0)
        .next_back()
        .filter(|(_, r)| r.map.contains(base.0, 1))
        .ok_or_else(|| {
            Error::invalid_handle(format!(
                "{:#x} is not inside a flat reservation of this process",
                base.0
            ))
        })?;
    let page = shm::page_size();
    if size == 0 || size % page != 0 {
        return Err(Error::invalid_argument(format!(
            "slot size {size} is not a non-zero multiple of the granularity ({page} bytes)"
        )));
    }
    if (base.0 - r.map.addr()) % page as u64 != 0 {
        return Err(Error::invalid_argument(format!(
            "base {:#x} is not aligned to the granularity ({page} bytes)",
            base.0
        )));
    }
    let addr = index
        .checked_mul(size)
        .and_then(|off| base.0.checked_add(off as u64))
        .filter(|&a| r.map.contains(a, size))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "slot {index} of {size} bytes from {:#x} ends past the {}-byte reservation at {:#x}",
                base.0,
                r.map.len(),
                r.map.addr()
            ))
        })?;
    Ok((r, addr))
}

/// Maps allocation `h` at `base + index * size` (`size` bytes of it, from its start).
pub fn map(base: DevicePtr, index: usize, size: usize, h: VmmHandle) -> Result<()> {
    // Lock order: reservations, then VMM handles.
    let mut reg = registry();
    let (r, addr) = locate(&mut reg, base, index, size)?;
    if let Some((s, l)) = r.overlapping(addr, size) {
        return Err(Error::invalid_argument(format!(
            "slot {index} ({size} bytes at {addr:#x}) overlaps the mapping of {l} bytes at \
             {s:#x}: unmap it first"
        )));
    }
    vmm::with_fd(h, |fd, held| {
        if size > held {
            return Err(Error::invalid_argument(format!(
                "slot of {size} bytes is larger than VMM handle {:#x} ({held} bytes)",
                h.0
            )));
        }
        // SAFETY: `addr..addr + size` is page-aligned, inside a reservation this process owns
        // (checked by `locate`) and not mapped (checked above): nothing uses those pages.
        let mapped = unsafe { shm::map_fixed(addr, size, fd) };
        if mapped.is_err() {
            // A failed MAP_FIXED may have dropped the old pages; keep the range reserved.
            // SAFETY: as above.
            if let Err(e) = unsafe { shm::unmap_fixed(addr, size) } {
                tracing::warn!("restoring the reservation after a failed map: {e}");
            }
        }
        mapped
    })?;
    r.slots.insert(addr, size);
    Ok(())
}

/// Unmaps the slot at `base + index * size`; the range stays reserved.
pub fn unmap(base: DevicePtr, index: usize, size: usize) -> Result<()> {
    let mut reg = registry();
    let (r, addr) = locate(&mut reg, base, index, size)?;
    if r.slots.get(&addr) != Some(&size) {
        return Err(Error::invalid_argument(format!(
            "slot {index} ({size} bytes at {addr:#x}) is not mapped"
        )));
    }
    // SAFETY: the slot is a mapping inside this process's reservation; the caller is done with
    // it (the ABI's contract for unmap).
    unsafe { shm::unmap_fixed(addr, size) }?;
    r.slots.remove(&addr);
    Ok(())
}

/// Releases the reservation at `base` of `bytes` (as reserved); every slot must be unmapped.
pub fn release(base: DevicePtr, bytes: usize) -> Result<()> {
    let mut reg = registry();
    let r = reg.get(&base.0).ok_or_else(|| {
        Error::invalid_handle(format!(
            "{:#x} is not a flat reservation of this process",
            base.0
        ))
    })?;
    let len = r.map.len();
    if bytes == 0 || shm::round_to_pages(bytes)? != len {
        return Err(Error::invalid_argument(format!(
            "the reservation at {:#x} has {len} bytes, not {bytes}",
            base.0
        )));
    }
    if !r.slots.is_empty() {
        return Err(Error::invalid_argument(format!(
            "the reservation at {:#x} still has {} mapped slot(s): unmap them first",
            base.0,
            r.slots.len()
        )));
    }
    let r = reg.remove(&base.0);
    drop(reg);
    drop(r);
    Ok(())
}

/// Releases every reservation (and its mapped slots); returns how many there were.
pub fn release_all() -> usize {
    std::mem::take(&mut *registry()).len()
}

/// Checks `[addr, addr + bytes)` against the reservations: a span that starts inside one must
/// end inside it and be mapped throughout (touching an unmapped slot would kill the process).
pub fn check_span(addr: u64, bytes: usize, role: &str) -> Result<()> {
    let reg = registry();
    let Some((_, r)) = reg
        .range(..=addr)
        .next_back()
        .filter(|(_, r)| r.map.contains(addr, 1))
    else {
        return Ok(());
    };
    if !r.map.contains(addr, bytes) {
        return Err(Error::invalid_argument(format!(
            "{role} {addr:#x} + {bytes} bytes overruns the {}-byte flat reservation at {:#x}",
            r.map.len(),
            r.map.addr()
        )));
    }
    let end = addr + bytes as u64;
    let first = r.slots.range(..=addr).next_back().map_or(addr, |(&s, _)| s);
    let mut covered = addr;
    for (&s, &l) in r.slots.range(first..end) {
        if s > covered {
            break;
        }
        covered = covered.max(s + l as u64);
        if covered >= end {
            break;
        }
    }
    if covered < end {
        return Err(Error::invalid_argument(format!(
            "{role} {addr:#x} + {bytes} bytes touches {covered:#x}, which is not mapped in the \
             flat reservation at {:#x}",
            r.map.addr()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrocx_plugin_sdk::abi::Status;

    #[test]
    fn slots_map_unmap_and_guard_the_reservation() {
        let g = vmm::granularity();
        let h = vmm::alloc(g).unwrap();
        let base = reserve(3 * g).unwrap();
        map(base, 1, g, h).unwrap();
        // The same memory in two slots: a write through one is read through the other.
        map(base, 2, g, h).unwrap();
        // SAFETY: slots 1 and 2 are mapped, `g` bytes each.
        unsafe {
            *((base.0 + g as u64) as *mut u8) = 42;
            assert_eq!(*((base.0 + 2 * g as u64) as *const u8), 42);
        }
        let st = |r: Result<()>| r.unwrap_err().status();
        assert_eq!(st(map(base, 1, g, h)), Status::INVALID_ARGUMENT);
        assert_eq!(st(map(base, 3, g, h)), Status::INVALID_ARGUMENT);
        assert_eq!(st(map(base, 0, g + 1, h)), Status::INVALID_ARGUMENT);
        assert_eq!(
            st(map(base, 0, g, VmmHandle(u64::MAX))),
            Status::INVALID_HANDLE
        );
        assert_eq!(st(map(DevicePtr(8), 0, g, h)), Status::INVALID_HANDLE);
        assert!(check_span(base.0 + g as u64, 2 * g, "src").is_ok());
        assert!(check_span(base.0 + g as u64 - 1, 2, "src").is_err());
        assert!(check_span(base.0 + 2 * g as u64, g + 1, "src").is_err());
        let e = release(base, 3 * g).unwrap_err();
        assert!(e.message().contains("2 mapped slot"), "{e}");
        unmap(base, 1, g).unwrap();
        assert_eq!(st(unmap(base, 1, g)), Status::INVALID_ARGUMENT);
        unmap(base, 2, g).unwrap();
        assert_eq!(st(release(base, 2 * g)), Status::INVALID_ARGUMENT);
        release(base, 3 * g).unwrap();
        assert_eq!(st(release(base, 3 * g)), Status::INVALID_HANDLE);
        vmm::release(h).unwrap();
    }
}
