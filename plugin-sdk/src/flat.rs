//! Slot bookkeeping for the flat-map group (`ferrocx_device_flatmap_v1`), the same for every
//! vendor: which reservations an adaptor made, where slot `index` of `size` bytes from `base`
//! lies, and which slots are mapped. An adaptor keeps a [`FlatReservations`] (with whatever it
//! needs per reservation as `T`) and calls the vendor's map/unmap/free only for slots these
//! checks let through:
//!
//! - a slot lies inside one reservation, from a `base` aligned to the reservation's granularity,
//!   with a size that is a non-zero multiple of it;
//! - a slot is mapped only where nothing is mapped, and unmapped only where it was mapped with
//!   that size;
//! - a reservation is released only with the size it was made with and no slot mapped.

use std::collections::BTreeMap;

use ferrocx::abi::DevicePtr;

use crate::{Error, Result};

/// One reservation: `[start, start + size)`, slots in multiples of `granularity`, and the
/// vendor's own data `T` (e.g. the mapping that owns the range).
#[derive(Debug)]
pub struct FlatReservation<T> {
    start: u64,
    size: usize,
    granularity: usize,
    /// Mapped slots: address → length.
    slots: BTreeMap<u64, usize>,
    /// The vendor's data.
    pub data: T,
}

impl<T> FlatReservation<T> {
    /// First address.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Bytes reserved.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether `[addr, addr + bytes)` lies inside the reservation.
    pub fn contains(&self, addr: u64, bytes: usize) -> bool {
        addr >= self.start
            && addr
                .checked_add(bytes as u64)
                .is_some_and(|end| end <= self.start + self.size as u64)
    }

    /// The mapped slots, `(address, length)`, in address order.
    pub fn slots(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.slots.iter().map(|(&a, &l)| (a, l))
    }

    /// The mapped slot overlapping `[addr, addr + len)`, if any.
    pub fn overlapping(&self, addr: u64, len: usize) -> Option<(u64, usize)> {
        let end = addr + len as u64;
        let before = self
            .slots
            .range(..=addr)
            .next_back()
            .filter(|(&s, &l)| s + l as u64 > addr);
        let after = self.slots.range(addr..end).next();
        before.or(after).map(|(&s, &l)| (s, l))
    }

    /// Where `[addr, addr + bytes)` stops being mapped: `addr + bytes` when it is mapped
    /// throughout, else the first address in it that no slot covers.
    pub fn mapped_until(&self, addr: u64, bytes: usize) -> u64 {
        let end = addr + bytes as u64;
        let first = self
            .slots
            .range(..=addr)
            .next_back()
            .map_or(addr, |(&s, _)| s);
        let mut covered = addr;
        for (&s, &l) in self.slots.range(first..end) {
            if s > covered {
                break;
            }
            covered = covered.max(s + l as u64);
            if covered >= end {
                break;
            }
        }
        covered.min(end)
    }

    /// The address of slot `index` of `size` bytes from `base` (inside this reservation),
    /// checked: aligned, a non-zero multiple of the granularity, inside.
    fn slot(&self, base: DevicePtr, index: usize, size: usize) -> Result<u64> {
        let g = self.granularity;
        if size == 0 || size % g != 0 {
            return Err(Error::invalid_argument(format!(
                "slot size {size} is not a non-zero multiple of the granularity ({g} bytes)"
            )));
        }
        if (base.0 - self.start) % g as u64 != 0 {
            return Err(Error::invalid_argument(format!(
                "base {:#x} is not aligned to the granularity ({g} bytes)",
                base.0
            )));
        }
        index
            .checked_mul(size)
            .and_then(|off| base.0.checked_add(off as u64))
            .filter(|&a| self.contains(a, size))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "slot {index} of {size} bytes from {:#x} ends past the {}-byte reservation \
                     at {:#x}",
                    base.0, self.size, self.start
                ))
            })
    }
}

/// The flat reservations of one adaptor, by start address.
#[derive(Debug)]
pub struct FlatReservations<T> {
    by_start: BTreeMap<u64, FlatReservation<T>>,
}

impl<T> Default for FlatReservations<T> {
    fn default() -> Self {
        FlatReservations {
            by_start: BTreeMap::new(),
        }
    }
}

impl<T> FlatReservations<T> {
    /// Records a reservation of `size` bytes at `start` with slots in multiples of
    /// `granularity`.
    pub fn insert(&mut self, start: u64, size: usize, granularity: usize, data: T) {
        let r = FlatReservation {
            start,
            size,
            granularity: granularity.max(1),
            slots: BTreeMap::new(),
            data,
        };
        self.by_start.insert(start, r);
    }

    /// Whether no reservation is held.
    pub fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    /// The reservation holding `addr`, if any.
    pub fn holding(&self, addr: u64) -> Option<&FlatReservation<T>> {
        self.by_start
            .range(..=addr)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| r.contains(addr, 1))
    }

    fn holding_mut(&mut self, base: DevicePtr) -> Result<&mut FlatReservation<T>> {
        self.by_start
            .range_mut(..=base.0)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| r.contains(base.0, 1))
            .ok_or_else(|| {
                Error::invalid_handle(format!(
                    "{:#x} is not inside a flat reservation of this adaptor",
                    base.0
                ))
            })
    }

    /// Checks that slot `index` of `size` bytes from `base` may be mapped (inside a
    /// reservation, aligned, nothing mapped there) and returns its address. Call
    /// [`FlatReservations::mapped`] once the vendor mapped it.
    pub fn free_slot(&mut self, base: DevicePtr, index: usize, size: usize) -> Result<u64> {
        let r = self.holding_mut(base)?;
        let addr = r.slot(base, index, size)?;
        if let Some((s, l)) = r.overlapping(addr, size) {
            return Err(Error::invalid_argument(format!(
                "slot {index} ({size} bytes at {addr:#x}) overlaps the mapping of {l} bytes at \
                 {s:#x}: unmap it first"
            )));
        }
        Ok(addr)
    }

    /// Records the slot at `addr` (from [`FlatReservations::free_slot`]) as mapped.
    pub fn mapped(&mut self, addr: u64, size: usize) {
        if let Ok(r) = self.holding_mut(DevicePtr(addr)) {
            r.slots.insert(addr, size);
        }
    }

    /// Checks that slot `index` of `size` bytes from `base` is mapped with that size and
    /// returns its address. Call [`FlatReservations::unmapped`] once the vendor unmapped it.
    pub fn mapped_slot(&mut self, base: DevicePtr, index: usize, size: usize) -> Result<u64> {
        let r = self.holding_mut(base)?;
        let addr = r.slot(base, index, size)?;
        if r.slots.get(&addr) != Some(&size) {
            return Err(Error::invalid_argument(format!(
                "slot {index} ({size} bytes at {addr:#x}) is not mapped"
            )));
        }
        Ok(addr)
    }

    /// Records the slot at `addr` (from [`FlatReservations::mapped_slot`]) as unmapped.
    pub fn unmapped(&mut self, addr: u64) {
        if let Ok(r) = self.holding_mut(DevicePtr(addr)) {
            r.slots.remove(&addr);
        }
    }

    /// Checks that the reservation at `base` may be released: it is one, `bytes` (rounded by
    /// `round`, as at reservation) is its size, and no slot is mapped.
    pub fn releasable(
        &self,
        base: DevicePtr,
        bytes: usize,
        round: impl FnOnce(usize, usize) -> Result<usize>,
    ) -> Result<&FlatReservation<T>> {
        let r = self.by_start.get(&base.0).ok_or_else(|| {
            Error::invalid_handle(format!(
                "{:#x} is not a flat reservation of this adaptor",
                base.0
            ))
        })?;
        if bytes == 0 || round(bytes, r.granularity)? != r.size {
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
        Ok(r)
    }

    /// Forgets the reservation at `base` (after [`FlatReservations::releasable`] and the
    /// vendor's release), returning it.
    pub fn remove(&mut self, base: DevicePtr) -> Option<FlatReservation<T>> {
        self.by_start.remove(&base.0)
    }

    /// Takes every reservation (at finalize), in address order.
    pub fn take_all(&mut self) -> Vec<FlatReservation<T>> {
        std::mem::take(&mut self.by_start).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrocx::abi::Status;

    fn one(base: u64, size: usize, g: usize) -> FlatReservations<()> {
        let mut reg = FlatReservations::default();
        reg.insert(base, size, g, ());
        reg
    }

    #[test]
    fn slots_are_located_inside_their_reservation() {
        let (g, base) = (1usize << 21, 1u64 << 40);
        let mut reg = one(base, 4 * g, g);
        let mut st = |b: u64, i: usize, s: usize| reg.free_slot(DevicePtr(b), i, s);
        assert_eq!(st(base, 3, g).unwrap(), base + 3 * g as u64);
        // From an inner base too: slot 1 of 2g from base + g is [base + 3g, base + 5g): too far.
        assert_eq!(st(base + g as u64, 0, 2 * g).unwrap(), base + g as u64);
        let bad = |r: Result<u64>| r.unwrap_err().status();
        assert_eq!(bad(st(base + g as u64, 1, 2 * g)), Status::INVALID_ARGUMENT);
        assert_eq!(bad(st(base, 4, g)), Status::INVALID_ARGUMENT);
        assert_eq!(bad(st(base, 0, g + 1)), Status::INVALID_ARGUMENT);
        assert_eq!(bad(st(base, 0, 0)), Status::INVALID_ARGUMENT);
        assert_eq!(bad(st(base + 1, 0, g)), Status::INVALID_ARGUMENT);
        assert_eq!(bad(st(base, usize::MAX, g)), Status::INVALID_ARGUMENT);
        assert_eq!(bad(st(base + 4 * g as u64, 0, g)), Status::INVALID_HANDLE);
        assert_eq!(bad(st(8, 0, g)), Status::INVALID_HANDLE);
    }

    #[test]
    fn overlapping_slots_are_found() {
        let g = 4096usize;
        let mut reg = one(0, 8 * g, g);
        let addr = reg.free_slot(DevicePtr(0), 1, 2 * g).unwrap();
        reg.mapped(addr, 2 * g);
        let r = reg.holding(0).unwrap();
        assert_eq!(r.overlapping(0, 2 * g), None);
        assert_eq!(r.overlapping(4 * g as u64, g), None);
        assert_eq!(r.overlapping(3 * g as u64, g), Some((2 * g as u64, 2 * g)));
        assert_eq!(r.overlapping(g as u64, 2 * g), Some((2 * g as u64, 2 * g)));
        assert_eq!(r.mapped_until(2 * g as u64, 2 * g), 4 * g as u64);
        assert_eq!(r.mapped_until(3 * g as u64, 2 * g), 4 * g as u64);
        assert_eq!(r.mapped_until(0, g), 0);
    }

    #[test]
    fn map_unmap_and_release_follow_the_rules() {
        let g = 4096usize;
        let mut reg = one(1 << 30, 4 * g, g);
        let base = DevicePtr(1 << 30);
        let round = |b: usize, g: usize| Ok(b.div_ceil(g) * g);
        let a = reg.free_slot(base, 1, g).unwrap();
        reg.mapped(a, g);
        assert!(reg.free_slot(base, 1, g).is_err(), "mapped twice");
        assert!(reg.mapped_slot(base, 2, g).is_err(), "not mapped");
        assert!(
            reg.releasable(base, 4 * g, round).is_err(),
            "a slot is mapped"
        );
        assert_eq!(reg.mapped_slot(base, 1, g).unwrap(), a);
        reg.unmapped(a);
        assert!(reg.releasable(base, 3 * g, round).is_err(), "wrong size");
        assert!(reg.releasable(DevicePtr(base.0 + 1), 4 * g, round).is_err());
        assert!(
            reg.releasable(base, 4 * g - 1, round).is_ok(),
            "rounded as reserved"
        );
        assert!(reg.remove(base).is_some());
        assert!(reg.is_empty());
    }
}
