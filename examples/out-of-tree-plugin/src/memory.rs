//! Allocations of host memory standing in for device memory, and the system's memory size.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::Mutex;

use ferrocx_plugin_sdk::prelude::*;

/// Alignment of every allocation, as a GPU allocator gives.
const ALIGN: usize = 256;

/// The live allocations, by base address.
#[derive(Default)]
pub struct Allocations {
    live: Mutex<BTreeMap<u64, (Layout, MemKind)>>,
}

impl Allocations {
    /// Allocates `bytes` of memory of `kind` (every kind is host memory here).
    pub fn alloc(&self, bytes: usize, kind: MemKind) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::invalid_argument("cannot allocate 0 bytes"));
        }
        if ![MemKind::DEVICE, MemKind::HOST, MemKind::PINNED].contains(&kind) {
            return Err(Error::invalid_argument(format!(
                "unknown memory kind {}",
                kind.0
            )));
        }
        let layout = Layout::from_size_align(bytes, ALIGN)
            .map_err(|_| Error::out_of_memory(format!("{bytes} bytes is too large")))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(Error::out_of_memory(format!(
                "{bytes} bytes: out of memory"
            )));
        }
        self.lock()?.insert(p as u64, (layout, kind));
        Ok(DevicePtr(p as u64))
    }

    /// Frees an allocation of `kind`; the null pointer is ignored (as `cudaFree(0)`).
    pub fn free(&self, ptr: DevicePtr, kind: MemKind) -> Result<()> {
        if ptr == DevicePtr::NULL {
            return Ok(());
        }
        let mut live = self.lock()?;
        let Some(&(layout, allocated_as)) = live.get(&ptr.0) else {
            return Err(Error::invalid_handle(format!(
                "{:#x} is not an allocation of this device (or was freed)",
                ptr.0
            )));
        };
        if allocated_as != kind {
            return Err(Error::invalid_argument(format!(
                "{:#x} was allocated as kind {}, freed as kind {}",
                ptr.0, allocated_as.0, kind.0
            )));
        }
        live.remove(&ptr.0);
        // SAFETY: allocated by `alloc` above with this layout, and removed from the table, so
        // freed once.
        unsafe { std::alloc::dealloc(ptr.0 as *mut u8, layout) };
        Ok(())
    }

    /// Frees everything still allocated; returns how many allocations that was.
    pub fn free_all(&self) -> Result<usize> {
        let all = std::mem::take(&mut *self.lock()?);
        for (&base, &(layout, _)) in &all {
            // SAFETY: each was allocated by `alloc` with its layout and is no longer tracked.
            unsafe { std::alloc::dealloc(base as *mut u8, layout) };
        }
        Ok(all.len())
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<u64, (Layout, MemKind)>>> {
        self.live
            .lock()
            .map_err(|_| Error::internal("allocation table lock poisoned"))
    }
}

/// Copies `bytes` between two addresses of this process (unified addressing: allocations of
/// this device or any host memory, as `cuMemcpy`).
pub fn copy(dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    if dst == DevicePtr::NULL || src == DevicePtr::NULL {
        return Err(Error::invalid_argument("null address"));
    }
    // SAFETY: the ABI makes the caller responsible for both ranges being valid for `bytes`, as
    // cuMemcpy does; `copy` allows them to overlap.
    unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, bytes) };
    Ok(())
}

/// Sets `bytes` bytes at `dst` to `value`.
pub fn set(dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    if dst == DevicePtr::NULL {
        return Err(Error::invalid_argument("null address"));
    }
    // SAFETY: the caller guarantees `bytes` writable bytes at `dst` (the ABI's contract).
    unsafe { std::ptr::write_bytes(dst.0 as *mut u8, value, bytes) };
    Ok(())
}

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn system_memory() -> Result<MemInfo> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| Error::system("reading /proc/meminfo", e))?;
    let field = |name: &str| -> Option<usize> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: usize = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    };
    match (field("MemAvailable:"), field("MemTotal:")) {
        (Some(free), Some(total)) => Ok(MemInfo { free, total }),
        _ => Err(Error::internal(
            "/proc/meminfo has no MemTotal or MemAvailable line",
        )),
    }
}
