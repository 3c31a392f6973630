//! VMM of the host device: a physical allocation is a named POSIX shared-memory segment
//! (`/ferrocx-<jobid>-<pid>-<seq>`, mode 0600), exported and imported as its file descriptor
//! (passed between processes with `SCM_RIGHTS`). The name is what lets another process open a
//! peer's allocation without a descriptor (the emulated multicast of [`crate::multicast`] does).
//!
//! A [`VmmHandle`] is an opaque id into this process's registry; the registry owns one
//! descriptor per handle. The creating handle unlinks the name when released (or at
//! `finalize`); the memory itself lives as long as a descriptor or a mapping of it does, so
//! releasing a handle that is still mapped into a flat range keeps the mapping valid. An
//! imported handle learns the name from `/proc/self/fd` (and never unlinks it).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use ferrocx_plugin_sdk::abi::VmmHandle;
use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::{Error, Result};

use crate::shm;

/// A segment name this process created, unlinked on drop.
#[derive(Debug)]
pub(crate) struct Unlink(CString);

impl Unlink {
    /// The name, with its leading `/`.
    pub(crate) fn name(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

impl Drop for Unlink {
    fn drop(&mut self) {
        // SAFETY: a NUL-terminated name; shm_unlink touches no memory of this process.
        if unsafe { libc::shm_unlink(self.0.as_ptr()) } != 0 {
            tracing::warn!(
                segment = self.name(),
                "shm_unlink failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// First sequence number of the segments made here. `shm::Segment` counts from 0 with the same
/// name pattern; starting at 2^62 keeps the two apart, and the names still parse as the
/// `ferrocx-<jobid>-<pid>-<digits>` that the stale-segment cleanup of `init` removes.
const SEQ_BASE: u64 = 1 << 62;

static NEXT_SEQ: AtomicU64 = AtomicU64::new(SEQ_BASE);

fn shm_create(name: &CString) -> std::io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name; O_EXCL makes this a new segment only.
    let fd = unsafe {
        libc::shm_open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o600 as libc::mode_t,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Creates a new named segment of `bytes` bytes (allocated, so touching it cannot `SIGBUS`):
/// its descriptor and its name, which unlinks it when dropped.
pub(crate) fn create_segment(bytes: usize, what: &str) -> Result<(OwnedFd, Unlink)> {
    let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
    let name = format!("/ferrocx-{}-{}-{seq}", shm::job_id(), std::process::id());
    let c = CString::new(name.clone())
        .map_err(|_| Error::internal(format!("segment name {name:?} has a NUL")))?;
    let fd = match shm_create(&c) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            // Only a process with our pid makes this name, and we never made it: a dead
            // process that had our pid before us left it.
            tracing::warn!(segment = %name, "removing a stale segment of an earlier process with this pid");
            drop(Unlink(c.clone()));
            shm_create(&c).map_err(|e| shm::os_error(format!("shm_open({name})"), e))?
        }
        Err(e) => return Err(shm::os_error(format!("shm_open({name})"), e)),
    };
    // From here on, an early return unlinks the name and closes the descriptor.
    let unlink = Unlink(c);
    shm::allocate(fd.as_fd(), bytes, &format!("{what} ({name})"))?;
    Ok((fd, unlink))
}

/// The shared-memory segment name (with its leading `/`) behind `fd`, from
/// `/proc/self/fd/<fd>`; `None` when it is not a live segment of `/dev/shm`.
fn name_of_fd(fd: BorrowedFd<'_>) -> Option<String> {
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let target = target.to_str()?;
    let rest = target.strip_prefix("/dev/shm/")?;
    if rest.is_empty() || rest.contains('/') || rest.ends_with(" (deleted)") {
        return None;
    }
    Some(format!("/{rest}"))
}

/// One physical allocation or import.
struct Physical {
    fd: OwnedFd,
    size: usize,
    /// The segment's name; `None` for an import whose descriptor is not a named segment.
    name: Option<String>,
    /// Set for the creating handle: unlinks the name when the handle goes.
    owner: Option<Unlink>,
}

/// The allocations and imports of this process, by handle.
static PHYSICAL: HandleTable<Physical> = HandleTable::new("VMM");

fn insert(p: Physical) -> VmmHandle {
    VmmHandle(PHYSICAL.insert(p))
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
    let (fd, unlink) = create_segment(size, "a VMM allocation")?;
    Ok(insert(Physical {
        fd,
        size,
        name: Some(unlink.name().to_string()),
        owner: Some(unlink),
    }))
}

/// A new descriptor of the allocation, owned by the caller.
pub fn export_fd(h: VmmHandle) -> Result<i32> {
    let fd = PHYSICAL
        .with(h.0, |p| p.fd.try_clone())?
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
    let name = name_of_fd(own.as_fd());
    Ok(insert(Physical {
        fd: own,
        size,
        name,
        owner: None,
    }))
}

/// Releases a handle (closes this process's descriptor of it).
pub fn release(h: VmmHandle) -> Result<()> {
    let p = PHYSICAL.remove(h.0)?;
    tracing::trace!(
        handle = h.0,
        fd = p.fd.as_raw_fd(),
        size = p.size,
        segment = p.name.as_deref().unwrap_or("?"),
        imported = p.owner.is_none(),
        "released"
    );
    Ok(())
}

/// Releases every handle still held; returns how many there were.
pub fn release_all() -> usize {
    PHYSICAL.take_all().len()
}

/// Calls `f` with the descriptor and size of `h`, under the registry's lock (callers that hold
/// another registry's lock take this one second, never the other way round).
pub fn with_fd<T>(h: VmmHandle, f: impl FnOnce(BorrowedFd<'_>, usize) -> Result<T>) -> Result<T> {
    PHYSICAL.with(h.0, |p| f(p.fd.as_fd(), p.size))?
}

/// The segment name (with its leading `/`) of `h`'s memory.
pub fn segment_name(h: VmmHandle) -> Result<String> {
    PHYSICAL.with(h.0, |p| p.name.clone())?.ok_or_else(|| {
        Error::invalid_argument(format!(
            "VMM handle {:#x} was imported from a descriptor that is not a named shared-memory \
             segment of /dev/shm",
            h.0
        ))
    })
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
        // The allocation is a named segment; the import learns the same name.
        let name = segment_name(h).unwrap();
        assert_eq!(segment_name(g).unwrap(), name);
        let path = std::path::Path::new("/dev/shm").join(&name[1..]);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            granularity() as u64
        );
        with_fd(g, |_, size| {
            assert_eq!(size, granularity());
            Ok(())
        })
        .unwrap();
        release(g).unwrap();
        assert!(path.exists(), "releasing an import keeps the name");
        release(h).unwrap();
        assert!(!path.exists(), "releasing the creator unlinks the name");
        assert_eq!(release(g).unwrap_err().status(), Status::INVALID_HANDLE);
        assert_eq!(export_fd(h).unwrap_err().status(), Status::INVALID_HANDLE);
    }
}
