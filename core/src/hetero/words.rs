//! 32-bit signal words in host memory that a device's streams write and wait on (the memops
//! group), shared by the proxy and the enqueuer threads: a block of the device's pinned memory
//! (what a GPU's stream can reach), or the process's own memory for a device whose memory the
//! host addresses (no device allocation a crashed rank could leave behind).

use std::sync::atomic::AtomicU32;

use crate::abi::{DevicePtr, MemKind};
use crate::adaptor::{AdaptorError, Device};

/// Bytes of a block: room for words a cache line apart.
const BYTES: usize = 4096;

/// A block of zeroed signal words.
pub(crate) struct Words {
    base: usize,
    /// The words, when they are the process's own memory (else a pinned allocation).
    heap: Option<Box<[AtomicU32]>>,
    freed: bool,
}

impl Words {
    /// A zeroed block: `device`'s pinned memory when `pinned`, else the process's own.
    pub(crate) fn new(device: &Device, pinned: bool) -> Result<Words, AdaptorError> {
        if !pinned {
            let words: Box<[AtomicU32]> = (0..BYTES / 4).map(|_| AtomicU32::new(0)).collect();
            return Ok(Words {
                base: words.as_ptr() as usize,
                heap: Some(words),
                freed: false,
            });
        }
        let base = device.mem_alloc(BYTES, MemKind::PINNED)?.0 as usize;
        // SAFETY: a fresh host allocation of `BYTES` bytes that nothing else uses yet.
        unsafe { std::ptr::write_bytes(base as *mut u8, 0, BYTES) };
        Ok(Words {
            base,
            heap: None,
            freed: false,
        })
    }

    /// The word at byte `off` (a multiple of 4 below 4096).
    pub(crate) fn word(&self, off: usize) -> &AtomicU32 {
        assert!(
            off % 4 == 0 && off + 4 <= BYTES && !self.freed,
            "word {off} of a block"
        );
        // SAFETY: inside a live block of `BYTES` bytes (freed only by `free`, which the owner
        // calls once every stream and thread using it is done), 4-aligned; the device and the
        // host touch it only with 32-bit atomic accesses.
        unsafe { &*((self.base + off) as *const AtomicU32) }
    }

    /// Frees the block; the streams that use it are drained and no thread reads it any more.
    pub(crate) fn free(&mut self, device: &Device) {
        if self.freed {
            return;
        }
        self.freed = true;
        if self.heap.take().is_none() {
            // SAFETY: our pinned allocation, freed once; its users are done (the contract).
            let _ = unsafe { device.mem_free(DevicePtr(self.base as u64), MemKind::PINNED) };
        }
    }
}
