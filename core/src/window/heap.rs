//! The symmetric heap's allocations: exportable VMM memory mapped at a local address, so that a
//! window over it can hand peers a descriptor. The heap remembers each allocation (weakly) by
//! address, which is how `register_window` tells a buffer of the heap from any other.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use crate::abi::{DevicePtr, MemKind};
use crate::adaptor::{AdaptorError, Device};

use super::resources::{self, DeviceMem, Reservation, Slot, Vmm};

/// One allocation of the heap: its memory, mapped alone in a reservation of its own.
pub(crate) struct HeapAllocation {
    // Drop order: the mapping, the reservation, then the memory.
    slot: Slot,
    _reservation: Reservation,
    mem: Vmm,
    size: usize,
}

impl HeapAllocation {
    /// The local address.
    pub(crate) fn base(&self) -> DevicePtr {
        self.slot.addr()
    }

    /// Bytes, a multiple of the granularity.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The memory.
    pub(crate) fn mem(&self) -> &Vmm {
        &self.mem
    }
}

/// What a [`SymmetricBuffer`] is made of.
enum Memory {
    /// An allocation of the heap.
    Heap(Arc<HeapAllocation>),
    /// Plain device memory, where the device cannot export and map (no VMM or flat-map group).
    Plain(DeviceMem),
}

/// A buffer from `Communicator::alloc_symmetric`: memory of the symmetric heap, which a window
/// maps into every peer's flat range. Freed when dropped; a window registered over it keeps
/// the memory alive until the window is deregistered.
pub struct SymmetricBuffer {
    memory: Memory,
    requested: usize,
}

impl SymmetricBuffer {
    /// The buffer's address on this rank's device.
    pub fn ptr(&self) -> DevicePtr {
        match &self.memory {
            Memory::Heap(a) => a.base(),
            Memory::Plain(m) => m.ptr(),
        }
    }

    /// Bytes asked for.
    pub fn size(&self) -> usize {
        self.requested
    }

    /// Bytes held: the size rounded up to the device's allocation granularity.
    pub fn capacity(&self) -> usize {
        match &self.memory {
            Memory::Heap(a) => a.size(),
            Memory::Plain(_) => self.requested,
        }
    }

    /// `true` when the buffer is heap memory (exportable, so windows over it can be
    /// symmetric); `false` when the device could not make such memory and it is plain device
    /// memory, which windows reach through IPC handles.
    pub fn is_heap(&self) -> bool {
        matches!(self.memory, Memory::Heap(_))
    }
}

impl std::fmt::Debug for SymmetricBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr().0))
            .field("size", &self.requested)
            .field("capacity", &self.capacity())
            .field("heap", &self.is_heap())
            .finish()
    }
}

/// The heap of one communicator: its live allocations by local address.
#[derive(Default)]
pub(crate) struct SymHeap {
    allocations: Mutex<BTreeMap<u64, Weak<HeapAllocation>>>,
}

impl SymHeap {
    /// Allocates `bytes` (> 0) on `device`: heap memory where the device can export and map
    /// it, plain device memory otherwise.
    pub(crate) fn alloc(
        &self,
        dev: &Device,
        device: i32,
        bytes: usize,
    ) -> Result<SymmetricBuffer, AdaptorError> {
        if !resources::can_map_peers(dev) {
            tracing::debug!(
                device = dev.name(),
                bytes,
                "alloc_symmetric: the device has no VMM or flat-map group; plain device memory"
            );
            return Ok(SymmetricBuffer {
                memory: Memory::Plain(DeviceMem::alloc(dev, bytes, MemKind::DEVICE)?),
                requested: bytes,
            });
        }
        let g = resources::granularity(dev, device)?;
        let size = bytes
            .div_ceil(g)
            .checked_mul(g)
            .ok_or_else(|| AdaptorError::Failed {
                adaptor: dev.name().to_string(),
                op: "vmm_alloc",
                status: crate::abi::Status::INVALID_ARGUMENT,
                message: format!("{bytes} bytes is too large a size"),
            })?;
        let mem = Vmm::alloc(dev, size)?;
        let reservation = Reservation::new(dev, size)?;
        let slot = reservation.map(0, size, &mem)?;
        let alloc = Arc::new(HeapAllocation {
            slot,
            _reservation: reservation,
            mem,
            size,
        });
        let mut map = self.allocations.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, a| a.strong_count() > 0);
        map.insert(alloc.base().0, Arc::downgrade(&alloc));
        Ok(SymmetricBuffer {
            memory: Memory::Heap(alloc),
            requested: bytes,
        })
    }

    /// The live allocation holding `[ptr, ptr + bytes)`, and `ptr`'s offset in it.
    pub(crate) fn find(
        &self,
        ptr: DevicePtr,
        bytes: usize,
    ) -> Option<(Arc<HeapAllocation>, usize)> {
        let map = self.allocations.lock().unwrap_or_else(|p| p.into_inner());
        let (_, weak) = map.range(..=ptr.0).next_back()?;
        let alloc = weak.upgrade()?;
        let offset = (ptr.0 - alloc.base().0) as usize;
        (offset as u128 + bytes as u128 <= alloc.size() as u128).then_some((alloc, offset))
    }
}
