//! Memory of the host device: allocations, copies and memsets.
//!
//! `DEVICE` and `PINNED` memory is one POSIX shared-memory segment per allocation, so another
//! process of the job can map it (see [`crate::ipc`]); `HOST` memory comes from the C heap. Every
//! live allocation is in a registry (base → size, kind, backing), which is what makes a double
//! free an error instead of a crash, and lets copies into a known allocation be bounds-checked.
//!
//! Addresses are this process's own (the device is the CPU), so a copy is a `memmove`.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use ferrocx_plugin_sdk::abi::{DevicePtr, MemKind, Stream};
use ferrocx_plugin_sdk::{Error, Result};

use crate::shm::{self, Segment};
use crate::{flatmap, ipc, stream};

/// Alignment of `HOST` allocations (what `cudaMalloc` guarantees; segments are page-aligned).
const HOST_ALIGN: usize = 256;

/// What an allocation's memory is.
#[derive(Debug)]
enum Backing {
    /// A shared-memory segment, mapped (`DEVICE`, `PINNED`).
    Segment(Segment),
    /// A C-heap block (`HOST`).
    Heap(HeapBlock),
}

/// A block from `posix_memalign`, freed on drop.
#[derive(Debug)]
struct HeapBlock(*mut libc::c_void);

// SAFETY: the block is plain memory owned by this value; any thread may free it.
unsafe impl Send for HeapBlock {}

impl Drop for HeapBlock {
    fn drop(&mut self) {
        // SAFETY: the pointer came from posix_memalign and is freed once, here.
        unsafe { libc::free(self.0) }
    }
}

/// One live allocation.
#[derive(Debug)]
struct Allocation {
    size: usize,
    kind: MemKind,
    backing: Backing,
}

fn registry() -> MutexGuard<'static, BTreeMap<u64, Allocation>> {
    static ALLOCATIONS: OnceLock<Mutex<BTreeMap<u64, Allocation>>> = OnceLock::new();
    ALLOCATIONS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The ABI's name of a memory kind.
pub fn kind_name(kind: MemKind) -> String {
    match kind {
        MemKind::DEVICE => "DEVICE".into(),
        MemKind::HOST => "HOST".into(),
        MemKind::PINNED => "PINNED".into(),
        MemKind(k) => format!("MemKind({k})"),
    }
}

/// Allocates `bytes` of memory of `kind`.
pub fn alloc(bytes: usize, kind: MemKind) -> Result<DevicePtr> {
    if bytes == 0 {
        return Err(Error::invalid_argument("cannot allocate 0 bytes"));
    }
    let backing = match kind {
        MemKind::DEVICE | MemKind::PINNED => Backing::Segment(Segment::create(bytes)?),
        MemKind::HOST => Backing::Heap(heap_alloc(bytes)?),
        other => {
            return Err(Error::invalid_argument(format!(
                "unknown memory kind {}",
                kind_name(other)
            )))
        }
    };
    let base = match &backing {
        Backing::Segment(s) => s.mapping().addr(),
        Backing::Heap(h) => h.0 as u64,
    };
    tracing::trace!(base, bytes, kind = %kind_name(kind), "allocated");
    registry().insert(
        base,
        Allocation {
            size: bytes,
            kind,
            backing,
        },
    );
    Ok(DevicePtr(base))
}

fn heap_alloc(bytes: usize) -> Result<HeapBlock> {
    shm::check_room(bytes, "allocating host memory", false)?;
    let mut p = std::ptr::null_mut();
    // SAFETY: `p` is writable; HOST_ALIGN is a power of two and a multiple of the pointer size.
    let rc = unsafe { libc::posix_memalign(&mut p, HOST_ALIGN, bytes) };
    if rc != 0 || p.is_null() {
        return Err(shm::os_error(
            format!("allocating {bytes} bytes of host memory"),
            std::io::Error::from_raw_os_error(if rc != 0 { rc } else { libc::ENOMEM }),
        ));
    }
    Ok(HeapBlock(p))
}

/// Frees the allocation at `ptr`, which must be the base of a live allocation of `kind`.
/// Freeing the null pointer does nothing (as `free` and `cudaFree`).
pub fn free(ptr: DevicePtr, kind: MemKind) -> Result<()> {
    if ptr == DevicePtr::NULL {
        return Ok(());
    }
    let mut reg = registry();
    let Some(a) = reg.get(&ptr.0) else {
        let inside = reg
            .range(..ptr.0)
            .next_back()
            .filter(|(&b, a)| ptr.0 - b < a.size as u64)
            .map(|(&b, _)| {
                format!(
                    " (it lies {} bytes into the allocation at {b:#x})",
                    ptr.0 - b
                )
            })
            .unwrap_or_default();
        return Err(Error::invalid_handle(format!(
            "{:#x} is not a live allocation of the host device{inside}",
            ptr.0
        )));
    };
    if a.kind != kind {
        return Err(Error::invalid_argument(format!(
            "{:#x} is {} memory, freed as {}",
            ptr.0,
            kind_name(a.kind),
            kind_name(kind)
        )));
    }
    let a = reg.remove(&ptr.0);
    drop(reg);
    // Unmapping and unlinking happen outside the lock.
    drop(a);
    Ok(())
}

/// Frees every allocation still live; returns how many there were.
pub fn free_all() -> usize {
    let all = std::mem::take(&mut *registry());
    all.len()
}

/// Where `ptr` lies inside a shared-memory allocation: `(segment name, offset, size)`.
/// `INVALID_ARGUMENT` for any other address.
pub fn segment_of(ptr: DevicePtr) -> Result<(String, u64, usize)> {
    let reg = registry();
    let found = reg
        .range(..=ptr.0)
        .next_back()
        .filter(|(&b, a)| ptr.0 - b < a.size as u64);
    match found {
        Some((&base, a)) => match &a.backing {
            Backing::Segment(s) => Ok((s.name().to_string(), ptr.0 - base, a.size)),
            Backing::Heap(_) => Err(Error::invalid_argument(format!(
                "{:#x} is {} memory, which cannot be exported (only DEVICE and PINNED can)",
                ptr.0,
                kind_name(a.kind)
            ))),
        },
        None => Err(Error::invalid_argument(format!(
            "{:#x} is not inside a DEVICE or PINNED allocation of this process",
            ptr.0
        ))),
    }
}

/// Checks `[addr, addr + bytes)` against this process's allocations: a span that starts inside
/// an allocation must end inside it.
fn check_allocations(addr: u64, bytes: usize, role: &str) -> Result<()> {
    let reg = registry();
    if let Some((&base, a)) = reg.range(..=addr).next_back() {
        let off = addr - base;
        if off < a.size as u64 && off as u128 + bytes as u128 > a.size as u128 {
            return Err(Error::invalid_argument(format!(
                "{role} {addr:#x} + {bytes} bytes overruns the {}-byte {} allocation at {base:#x} \
                 (offset {off})",
                a.size,
                kind_name(a.kind)
            )));
        }
    }
    Ok(())
}

/// Validates one side of a copy or memset: non-null, no address overflow, and inside whatever
/// known mapping it starts in (allocations, IPC imports, flat ranges). Addresses the device does
/// not know (the caller's own buffers) are taken as given.
fn check_span(addr: DevicePtr, bytes: usize, role: &str) -> Result<()> {
    if addr == DevicePtr::NULL {
        return Err(Error::invalid_argument(format!(
            "`{role}` is null ({bytes} bytes)"
        )));
    }
    if addr.0.checked_add(bytes as u64).is_none() {
        return Err(Error::invalid_argument(format!(
            "`{role}` {:#x} + {bytes} bytes overflows the address space",
            addr.0
        )));
    }
    check_allocations(addr.0, bytes, role)?;
    ipc::check_span(addr.0, bytes, role)?;
    flatmap::check_span(addr.0, bytes, role)
}

/// Copies `bytes` from `src` to `dst` (the two may overlap).
///
/// # Safety
/// Both spans must be readable/writable memory of this process for the copy's duration.
unsafe fn raw_copy(dst: u64, src: u64, bytes: usize) {
    // SAFETY: the caller's contract; `ptr::copy` allows overlap.
    unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) }
}

/// Sets `bytes` at `dst` to `value`.
///
/// # Safety
/// The span must be writable memory of this process for the call's duration.
unsafe fn raw_set(dst: u64, value: u8, bytes: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_bytes(dst as usize as *mut u8, value, bytes) }
}

/// Copies `bytes` from `src` to `dst`; returns when done. The spans may overlap.
pub fn copy(dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    check_span(dst, bytes, "dst")?;
    check_span(src, bytes, "src")?;
    // SAFETY: the ABI's contract is that both are valid addresses of this process for `bytes`
    // (the device is the CPU); what the device knows of them was checked above.
    unsafe { raw_copy(dst.0, src.0, bytes) };
    Ok(())
}

/// Enqueues a copy on `s`; returns at once.
pub fn copy_async(dst: DevicePtr, src: DevicePtr, bytes: usize, s: Stream) -> Result<()> {
    let stream = stream::get(s)?;
    if bytes == 0 {
        return Ok(());
    }
    check_span(dst, bytes, "dst")?;
    check_span(src, bytes, "src")?;
    stream.enqueue(Box::new(move || {
        // SAFETY: as in `copy`; the caller keeps both spans valid until the stream reaches
        // this copy (the ABI's contract for asynchronous work).
        unsafe { raw_copy(dst.0, src.0, bytes) };
        Ok(())
    }))
}

/// Sets `bytes` at `dst` to `value`; returns when done.
pub fn set(dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    check_span(dst, bytes, "dst")?;
    // SAFETY: the ABI's contract is that `dst` is valid for `bytes`; what the device knows of
    // it was checked above.
    unsafe { raw_set(dst.0, value, bytes) };
    Ok(())
}

/// Enqueues a memset on `s`; returns at once.
pub fn set_async(dst: DevicePtr, value: u8, bytes: usize, s: Stream) -> Result<()> {
    let stream = stream::get(s)?;
    if bytes == 0 {
        return Ok(());
    }
    check_span(dst, bytes, "dst")?;
    stream.enqueue(Box::new(move || {
        // SAFETY: as in `set`; the caller keeps the span valid until the stream reaches it.
        unsafe { raw_set(dst.0, value, bytes) };
        Ok(())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_and_frees_once() {
        for kind in [MemKind::DEVICE, MemKind::PINNED, MemKind::HOST] {
            let p = alloc(5, kind).unwrap();
            set(p, 0xab, 5).unwrap();
            let mut out = [0u8; 5];
            copy(DevicePtr(out.as_mut_ptr() as u64), p, 5).unwrap();
            assert_eq!(out, [0xab; 5]);
            let e = copy(DevicePtr(out.as_mut_ptr() as u64), p, 6).unwrap_err();
            assert_eq!(
                e.status(),
                ferrocx_plugin_sdk::abi::Status::INVALID_ARGUMENT
            );
            free(p, kind).unwrap();
            let e = free(p, kind).unwrap_err();
            assert_eq!(e.status(), ferrocx_plugin_sdk::abi::Status::INVALID_HANDLE);
        }
    }

    #[test]
    fn an_interior_pointer_is_not_freed() {
        let p = alloc(64, MemKind::HOST).unwrap();
        let e = free(DevicePtr(p.0 + 8), MemKind::HOST).unwrap_err();
        assert!(e.message().contains("8 bytes into"), "{e}");
        free(p, MemKind::HOST).unwrap();
    }
}
