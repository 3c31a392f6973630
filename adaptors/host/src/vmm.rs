//! VMM of the host device: a physical allocation is an anonymous memory file (`memfd_create`),
//! exported and imported as its file descriptor (passed between processes with `SCM_RIGHTS`).
//!
//! A [`VmmHandle`] is an opaque id into this process's registry; the registry owns one
//! descriptor per handle. Memory lives as long as a descriptor or a mapping of it does, so
//! releasing a handle that is still mapped into a flat range keeps the mapping valid.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use ferrocx_plugin_sdk::abi::VmmHandle;
use ferrocx_plugin_sdk::{Error, Result};

use crate::shm;

/// One physical allocation or import.
struct Physical {
    fd: OwnedFd,
    size: usize,
    imported: bool,
}

fn registry() -> MutexGuard<'static, HashMap<u64, Physical>> {
    static PHYSICAL: OnceLock<Mutex<HashMap<u64, Physical>>> = OnceLock::new();
    PHYSICAL
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

fn insert(p: Physical) -> VmmHandle {
    let id = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    registry().insert(id, p);
    VmmHandle(id)
}

fn unknown(h: VmmHandle) -> Error {
    Error::invalid_handle(format!("unknown VMM handle {:#x}", h.0))
}

/// Allocation granularity: the page size.
pub fn granularity() -> usize {
    shm::page_size()
}

/// Allocates `bytes` (rounded up to the granularity) of exportable memory.
pub fn alloc(bytes: usize) -> Result<VmmHandle> {
    if bytes == 0 {
        return Err(Error::invalid_argument("cannot allocate 0 bytes"));
    }
    let size = shm::round_to_pages(bytes)?;
    // SAFETY: a NUL-terminated name; memfd_create touches no memory of this process.
    let fd = unsafe { libc::memfd_create(c"ferrocx-vmm".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(shm::last_os_error("memfd_create"));
    }
    // SAFETY: `fd` is a new descriptor nothing else owns; an early return closes it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    shm::allocate(fd.as_fd(), size, "a VMM allocation")?;
    Ok(insert(Physical {
        fd,
        size,
        imported: false,
    }))
}

/// A new descriptor of the allocation, owned by the caller.
pub fn export_fd(h: VmmHandle) -> Result<i32> {
    let reg = registry();
    let p = reg.get(&h.0).ok_or_else(|| unknown(h))?;
    let fd = p
        .fd
        .try_clone()
        .map_err(|e| shm::os_error(format!("dup of the descriptor of VMM handle {:#x}", h.0), e))?;
    Ok(fd.into_raw_fd())
}

/// Imports the allocation behind `fd` (the caller keeps `fd`); `bytes`, rounded up to the
/// granularity, must be its size.
pub fn import_fd(fd: i32, bytes: usize) -> Result<VmmHandle> {
    if fd < 0 {
        return Err(Error::invalid_argument(format!(
            "{fd} is not a file descriptor"
        )));
    }
    if bytes == 0 {
        return Err(Error::invalid_argument("cannot import 0 bytes"));
    }
    // SAFETY: the caller passed an open descriptor and keeps it open for this call; it is only
    // borrowed (duplicated below, never closed here).
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let (_, size, regular) = shm::stat(borrowed).map_err(|e| {
        Error::invalid_argument(format!("fd {fd} cannot be imported: fstat failed: {e}"))
    })?;
    if !regular {
        return Err(Error::invalid_argument(format!(
            "fd {fd} is not a memory file (not a regular file)"
        )));
    }
    let want = shm::round_to_pages(bytes)?;
    if want != size {
        return Err(Error::invalid_argument(format!(
            "fd {fd} holds {size} bytes, but {bytes} bytes ({want} rounded to the granularity) \
             were asked for"
        )));
    }
    let own = borrowed
        .try_clone_to_owned()
        .map_err(|e| shm::os_error(format!("dup of fd {fd}"), e))?;
    Ok(insert(Physical {
        fd: own,
        size,
        imported: true,
    }))
}

/// Releases a handle (closes this process's descriptor of it).
pub fn release(h: VmmHandle) -> Result<()> {
    let p = registry().remove(&h.0).ok_or_else(|| unknown(h))?;
    tracing::trace!(
        handle = h.0,
        fd = p.fd.as_raw_fd(),
        size = p.size,
        imported = p.imported,
        "released"
    );
    Ok(())
}

/// Releases every handle still held; returns how many there were.
pub fn release_all() -> usize {
    std::mem::take(&mut *registry()).len()
}

/// Calls `f` with the descriptor and size of `h`, under the registry's lock (callers that hold
/// another registry's lock take this one second, never the other way round).
pub fn with_fd<T>(h: VmmHandle, f: impl FnOnce(BorrowedFd<'_>, usize) -> Result<T>) -> Result<T> {
    let reg = registry();
    let p = reg.get(&h.0).ok_or_else(|| unknown(h))?;
    f(p.fd.as_fd(), p.size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrocx_plugin_sdk::abi::Status;

    #[test]
    fn export_import_release_balance() {
        let h = alloc(10).unwrap();
        let fd = export_fd(h).unwrap();
        // SAFETY: export_fd hands the caller a descriptor it owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let e = import_fd(fd.as_raw_fd(), granularity() + 1).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_ARGUMENT);
        assert!(e.message().contains(&granularity().to_string()), "{e}");
        let g = import_fd(fd.as_raw_fd(), 10).unwrap();
        drop(fd);
        with_fd(g, |_, size| {
            assert_eq!(size, granularity());
            Ok(())
        })
        .unwrap();
        release(h).unwrap();
        release(g).unwrap();
        assert_eq!(release(g).unwrap_err().status(), Status::INVALID_HANDLE);
        assert_eq!(export_fd(h).unwrap_err().status(), Status::INVALID_HANDLE);
    }
}
