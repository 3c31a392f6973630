//! Flat mapping of the host device: a reserved range of address space (`PROT_NONE`, no memory
//! behind it) into which VMM allocations are mapped, peer `i` at `base + i * size`.
//!
//! Mapping a slot replaces its part of the reservation with a shared mapping of the
//! allocation's memory file (`MAP_FIXED`); unmapping puts inaccessible anonymous memory back, so
//! the range stays reserved (nothing else of the process can be placed in it) until released.

use std::sync::{Mutex, MutexGuard, OnceLock};

use ferrocx_plugin_sdk::abi::{DevicePtr, VmmHandle};
use ferrocx_plugin_sdk::flat::FlatReservations;
use ferrocx_plugin_sdk::{Error, Result};

use crate::shm::{self, Mapping};
use crate::vmm;

/// This process's reservations; each owns its range (unmapping it on drop also unmaps every
/// slot).
fn registry() -> MutexGuard<'static, FlatReservations<Mapping>> {
    static RESERVATIONS: OnceLock<Mutex<FlatReservations<Mapping>>> = OnceLock::new();
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
    let (base, len) = (map.addr(), map.len());
    registry().insert(base, len, shm::page_size(), map);
    Ok(DevicePtr(base))
}

/// Maps allocation `h` at `base + index * size` (`size` bytes of it, from its start).
pub fn map(base: DevicePtr, index: usize, size: usize, h: VmmHandle) -> Result<()> {
    // Lock order: reservations, then VMM handles.
    let mut reg = registry();
    let addr = reg.free_slot(base, index, size)?;
    vmm::with_fd(h, |fd, held| {
        if size > held {
            return Err(Error::invalid_argument(format!(
                "slot of {size} bytes is larger than VMM handle {:#x} ({held} bytes)",
                h.0
            )));
        }
        // SAFETY: `addr..addr + size` is page-aligned, inside a reservation this process owns
        // and not mapped (checked by `free_slot`): nothing uses those pages.
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
    reg.mapped(addr, size);
    Ok(())
}

/// Unmaps the slot at `base + index * size`; the range stays reserved.
pub fn unmap(base: DevicePtr, index: usize, size: usize) -> Result<()> {
    let mut reg = registry();
    let addr = reg.mapped_slot(base, index, size)?;
    // SAFETY: the slot is a mapping inside this process's reservation; the caller is done with
    // it (the ABI's contract for unmap).
    unsafe { shm::unmap_fixed(addr, size) }?;
    reg.unmapped(addr);
    Ok(())
}

/// Releases the reservation at `base` of `bytes` (as reserved); every slot must be unmapped.
pub fn release(base: DevicePtr, bytes: usize) -> Result<()> {
    let mut reg = registry();
    reg.releasable(base, bytes, |b, _| shm::round_to_pages(b))?;
    let r = reg.remove(base);
    drop(reg);
    drop(r);
    Ok(())
}

/// Releases every reservation (and its mapped slots); returns how many there were.
pub fn release_all() -> usize {
    let all = registry().take_all();
    all.len()
}

/// Checks `[addr, addr + bytes)` against the reservations: a span that starts inside one must
/// end inside it and be mapped throughout (touching an unmapped slot would kill the process).
pub fn check_span(addr: u64, bytes: usize, role: &str) -> Result<()> {
    let reg = registry();
    let Some(r) = reg.holding(addr) else {
        return Ok(());
    };
    if !r.contains(addr, bytes) {
        return Err(Error::invalid_argument(format!(
            "{role} {addr:#x} + {bytes} bytes overruns the {}-byte flat reservation at {:#x}",
            r.size(),
            r.start()
        )));
    }
    let covered = r.mapped_until(addr, bytes);
    if covered < addr + bytes as u64 {
        return Err(Error::invalid_argument(format!(
            "{role} {addr:#x} + {bytes} bytes touches {covered:#x}, which is not mapped in the \
             flat reservation at {:#x}",
            r.start()
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
