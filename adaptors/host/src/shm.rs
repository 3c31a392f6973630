//! The operating-system layer under the host device's memory: mappings, POSIX shared-memory
//! segments and their names, and the removal of segments a crashed process of the job left.
//!
//! A segment is named `/ferrocx-<jobid>-<pid>-<seq>`: `<jobid>` is `FERROCX_JOB_ID` restricted to
//! `[A-Za-z0-9_-]` (default `local`), `<pid>` the creating process and `<seq>` a counter of that
//! process, so a name is never reused while its creator lives and a leftover names its owner.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use ferrocx::bootstrap::JobInfo;
use ferrocx_plugin_sdk::{Error, Result};

/// Where Linux shows the POSIX shared-memory segments.
const SHM_DIR: &str = "/dev/shm";

/// Environment variable naming the job.
pub const JOB_ID_ENV: &str = "FERROCX_JOB_ID";

/// The page size: the granularity of mappings and VMM allocations.
pub fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
    })
}

/// `bytes` rounded up to a whole number of pages.
pub fn round_to_pages(bytes: usize) -> Result<usize> {
    let page = page_size();
    bytes
        .checked_add(page - 1)
        .map(|b| b / page * page)
        .ok_or_else(|| Error::invalid_argument(format!("{bytes} bytes is too large a size")))
}

/// An error for a failed OS call, with the OS's own error; running out of memory or of space in
/// the shared-memory file system is `OUT_OF_MEMORY`, anything else `SYSTEM_ERROR`.
pub fn os_error(what: impl Into<String>, err: io::Error) -> Error {
    match err.raw_os_error() {
        Some(libc::ENOMEM) | Some(libc::ENOSPC) => {
            Error::out_of_memory(format!("{}: {err}", what.into()))
        }
        _ => Error::system(what, err),
    }
}

/// [`os_error`] with `errno`.
pub fn last_os_error(what: impl Into<String>) -> Error {
    os_error(what, io::Error::last_os_error())
}

/// Free and total bytes of the file system behind `/dev/shm` (`statvfs`).
// The statvfs fields are u64 here but narrower on some targets.
#[allow(clippy::unnecessary_cast)]
pub fn shm_space() -> io::Result<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: a NUL-terminated path and a writable statvfs buffer.
    if unsafe { libc::statvfs(c"/dev/shm".as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded and filled the buffer.
    let st = unsafe { st.assume_init() };
    let block = st.f_frsize as u64;
    Ok((
        (st.f_bavail as u64).saturating_mul(block),
        (st.f_blocks as u64).saturating_mul(block),
    ))
}

/// Memory the kernel can still hand out without swapping: `MemAvailable` of `/proc/meminfo`,
/// in bytes; `None` where the kernel does not say.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line["MemAvailable:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// `bytes` as `N bytes (X.Y GiB)`, for errors about sizes.
pub fn show_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u32); 3] = [("GiB", 30), ("MiB", 20), ("KiB", 10)];
    match UNITS.iter().find(|(_, shift)| bytes >= 1u64 << shift) {
        Some((unit, shift)) => {
            format!(
                "{bytes} bytes ({:.1} {unit})",
                bytes as f64 / (1u64 << shift) as f64
            )
        }
        None => format!("{bytes} bytes"),
    }
}

/// Refuses to allocate `bytes` for `what` when more than what is free: in `/dev/shm` when the
/// memory is a shared-memory segment (`shm`), and in the system (`MemAvailable`) always. Pages of
/// a segment belong to no process, so the kernel's OOM killer would end unrelated processes
/// instead of this one: failing first, with both amounts, is the only safe answer.
pub fn check_room(bytes: usize, what: &str, shm: bool) -> Result<()> {
    let space = if shm {
        match shm_space() {
            Ok((free, _)) => Some(free),
            Err(e) => return Err(os_error("statvfs(/dev/shm)", e)),
        }
    } else {
        None
    };
    match room_error(bytes as u64, what, space, mem_available()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The error [`check_room`] returns for these amounts (`None`: unknown, not checked).
fn room_error(
    bytes: u64,
    what: &str,
    shm_free: Option<u64>,
    available: Option<u64>,
) -> Option<Error> {
    let short_shm = shm_free.is_some_and(|f| bytes > f);
    let short_mem = available.is_some_and(|a| bytes > a);
    if !short_shm && !short_mem {
        return None;
    }
    let mut have = Vec::new();
    if let Some(f) = shm_free {
        have.push(format!("{SHM_DIR} has {} free", show_bytes(f)));
    }
    if let Some(a) = available {
        have.push(format!(
            "the system has {} available (MemAvailable)",
            show_bytes(a)
        ));
    }
    Some(Error::out_of_memory(format!(
        "{what}: {} requested, but {}",
        show_bytes(bytes),
        have.join(" and ")
    )))
}

/// A mapping of this process's address space, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes of `fd` from offset 0, readable and writable, shared with every other
    /// mapping of the same file.
    pub fn shared(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping> {
        // SAFETY: a fresh mapping at an address the kernel picks; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_os_error(format!("mmap of {len} shared bytes")));
        }
        Ok(Mapping {
            addr: p as usize,
            len,
        })
    }

    /// Reserves `len` bytes of address space with no access and no memory behind it.
    pub fn reserve(len: usize) -> Result<Mapping> {
        // SAFETY: a fresh anonymous mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_os_error(format!(
                "reserving {len} bytes of address space"
            )));
        }
        Ok(Mapping {
            addr: p as usize,
            len,
        })
    }

    /// First address of the mapping.
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when `[addr, addr + bytes)` lies inside the mapping.
    pub fn contains(&self, addr: u64, bytes: usize) -> bool {
        let start = self.addr as u64;
        addr >= start && (addr - start) as u128 + bytes as u128 <= self.len as u128
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `addr..addr + len` is a mapping this value owns; nothing refers to it after
        // its owner dropped it (the ABI's contract for freed memory).
        if unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) } != 0 {
            tracing::warn!(
                addr = self.addr,
                len = self.len,
                "munmap failed: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Maps `fd` at `addr` over `len` bytes of an existing reservation (`MAP_FIXED`), readable and
/// writable, shared.
///
/// # Safety
/// `addr..addr + len` must be page-aligned and lie inside a reservation this process owns, with
/// nothing in it that anyone still uses: the old pages are replaced.
pub unsafe fn map_fixed(addr: u64, len: usize, fd: BorrowedFd<'_>) -> Result<()> {
    // SAFETY: the caller owns the range; MAP_FIXED replaces only it.
    let p = unsafe {
        libc::mmap(
            addr as usize as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_os_error(format!("mmap of {len} bytes at {addr:#x}")));
    }
    Ok(())
}

/// Puts inaccessible, unbacked memory back over `addr..addr + len` (the reservation stays).
///
/// # Safety
/// As [`map_fixed`].
pub unsafe fn unmap_fixed(addr: u64, len: usize) -> Result<()> {
    // SAFETY: the caller owns the range; MAP_FIXED replaces only it, atomically.
    let p = unsafe {
        libc::mmap(
            addr as usize as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(last_os_error(format!("unmapping {len} bytes at {addr:#x}")));
    }
    Ok(())
}

/// Sets the size of the file behind `fd` to `len` bytes and allocates them, so that touching
/// the memory later cannot fail with `SIGBUS` when the file system is full.
pub fn allocate(fd: BorrowedFd<'_>, len: usize, what: &str) -> Result<()> {
    check_room(len, &format!("allocating {what}"), true)?;
    let off = libc::off_t::try_from(len)
        .map_err(|_| Error::invalid_argument(format!("{len} bytes is too large a size")))?;
    // SAFETY: `fd` is an open descriptor; ftruncate touches no memory of this process.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), off) } != 0 {
        return Err(last_os_error(format!("ftruncate of {what} to {len} bytes")));
    }
    // SAFETY: as above; posix_fallocate returns the error number instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, off) };
    if rc != 0 {
        return Err(os_error(
            format!("allocating {len} bytes for {what}"),
            io::Error::from_raw_os_error(rc),
        ));
    }
    Ok(())
}

/// Identity and size of the file behind a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    /// Device of the file system.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
}

/// `fstat`: the file's identity, its size, and whether it is a regular file.
pub fn stat(fd: BorrowedFd<'_>) -> io::Result<(FileId, usize, bool)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is writable and as large as fstat writes.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded and filled the struct (zeroed before, so every byte is initialised).
    let st = unsafe { st.assume_init() };
    let id = FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    };
    let size = usize::try_from(st.st_size).unwrap_or(0);
    Ok((id, size, st.st_mode & libc::S_IFMT == libc::S_IFREG))
}

/// The job id of this process, as it appears in segment names.
pub fn job_id() -> &'static str {
    static JOB: OnceLock<String> = OnceLock::new();
    JOB.get_or_init(|| {
        sanitize_job_id(std::env::var_os(JOB_ID_ENV).map(|v| v.to_string_lossy().into_owned()))
    })
}

/// `raw` made safe by the job-id rule of the whole project ([`JobInfo::sanitize_id`]);
/// `local` when absent or empty.
fn sanitize_job_id(raw: Option<String>) -> String {
    match raw.filter(|s| !s.is_empty()) {
        Some(s) => JobInfo::sanitize_id(&s),
        None => "local".to_string(),
    }
}

/// The `(pid, seq)` of a segment's file name (no leading `/`) if it belongs to job `job`.
fn parse_segment_name(file_name: &str, job: &str) -> Option<(i32, u64)> {
    let rest = file_name
        .strip_prefix("ferrocx-")?
        .strip_prefix(job)?
        .strip_prefix('-')?;
    let (pid, seq) = rest.split_once('-')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(pid) || !all_digits(seq) {
        return None;
    }
    // pid 0 and negative pids mean process groups to kill(2): never a segment's owner.
    let pid: i32 = pid.parse().ok().filter(|&p| p > 0)?;
    Some((pid, seq.parse().ok()?))
}

/// `false` only when no process `pid` exists.
fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 checks that the process exists; nothing is sent.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    // EPERM: it exists but is another user's.
    io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// A segment name, unlinked on drop.
#[derive(Debug)]
struct SegmentName(CString);

impl Drop for SegmentName {
    fn drop(&mut self) {
        // SAFETY: a NUL-terminated name; shm_unlink touches no memory of this process.
        if unsafe { libc::shm_unlink(self.0.as_ptr()) } != 0 {
            tracing::warn!(
                segment = %self.0.to_string_lossy(),
                "shm_unlink failed: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// A shared-memory segment this process created, mapped: unmapped and unlinked on drop.
#[derive(Debug)]
pub struct Segment {
    map: Mapping,
    name: SegmentName,
}

static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

impl Segment {
    /// Creates a segment of `bytes` (> 0) bytes, mode 0600, and maps it.
    pub fn create(bytes: usize) -> Result<Segment> {
        let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("/ferrocx-{}-{}-{seq}", job_id(), std::process::id());
        let c = CString::new(name.clone())
            .map_err(|_| Error::internal(format!("segment name {name:?} has a NUL")))?;
        let fd = match open_new(&c) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                // Only a process with our pid makes this name, and we never made it: it was
                // left by a dead process that had our pid before us.
                tracing::warn!(segment = %name, "removing a stale segment of an earlier process with this pid");
                drop(SegmentName(c.clone()));
                open_new(&c).map_err(|e| os_error(format!("shm_open({name})"), e))?
            }
            Err(e) => return Err(os_error(format!("shm_open({name})"), e)),
        };
        // From here on, an early return unlinks the name and closes the descriptor.
        let name_guard = SegmentName(c);
        allocate(fd.as_fd(), bytes, &format!("segment {name}"))?;
        let map = Mapping::shared(fd.as_fd(), bytes)?;
        // The mapping keeps the memory; the descriptor closes here.
        Ok(Segment {
            map,
            name: name_guard,
        })
    }

    /// The segment's name (with its leading `/`).
    pub fn name(&self) -> &str {
        self.name.0.to_str().unwrap_or_default()
    }

    /// The mapping in this process.
    pub fn mapping(&self) -> &Mapping {
        &self.map
    }
}

fn open_new(name: &CString) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name; O_EXCL makes this a new segment only.
    let fd = unsafe {
        libc::shm_open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o600 as libc::mode_t,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens an existing segment `name` (with its leading `/`) for reading and writing.
pub fn open_existing(name: &str) -> Result<OwnedFd> {
    let c = CString::new(name)
        .map_err(|_| Error::invalid_argument(format!("segment name {name:?} has a NUL")))?;
    // SAFETY: a NUL-terminated name; no O_CREAT, so the mode is unused.
    let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENOENT) {
            return Err(Error::invalid_handle(format!(
                "segment {name} does not exist (freed by its owner, or its owner exited): {err}"
            )));
        }
        return Err(Error::system(format!("shm_open({name})"), err));
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Unlinks every segment of this job in `/dev/shm` whose creating process no longer exists;
/// returns how many were removed.
pub fn remove_stale() -> usize {
    remove_stale_in(Path::new(SHM_DIR), job_id())
}

fn remove_stale_in(dir: &Path, job: &str) -> usize {
    let listing = match std::fs::read_dir(dir) {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(dir = %dir.display(), "cannot list shared-memory segments: {e}");
            return 0;
        }
    };
    let mut removed = 0;
    for entry in listing.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        let Some((pid, _)) = parse_segment_name(file_name, job) else {
            continue;
        };
        if process_alive(pid) {
            continue;
        }
        let Ok(c) = CString::new(format!("/{file_name}")) else {
            continue;
        };
        // SAFETY: a NUL-terminated name; shm_unlink touches no memory of this process.
        if unsafe { libc::shm_unlink(c.as_ptr()) } == 0 {
            removed += 1;
        } else {
            let err = io::Error::last_os_error();
            // ENOENT: another process of the job removed it first.
            if err.raw_os_error() != Some(libc::ENOENT) {
                tracing::warn!(segment = file_name, "cannot remove a stale segment: {err}");
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let meminfo = "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(2 << 20));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: x kB\n"), None);
        // This machine's own file parses.
        assert!(mem_available().is_some_and(|a| a > 0));
    }

    #[test]
    fn a_request_larger_than_what_is_free_is_refused_with_both_amounts() {
        let gib = 1u64 << 30;
        assert!(room_error(gib, "x", Some(2 * gib), Some(2 * gib)).is_none());
        assert!(room_error(gib, "x", None, None).is_none());
        // More than /dev/shm has free.
        let e = room_error(16 * gib, "allocating a segment", Some(gib), Some(32 * gib)).unwrap();
        assert_eq!(e.status(), ferrocx::abi::Status::OUT_OF_MEMORY);
        assert_eq!(
            e.message(),
            "allocating a segment: 17179869184 bytes (16.0 GiB) requested, but /dev/shm has \
             1073741824 bytes (1.0 GiB) free and the system has 34359738368 bytes (32.0 GiB) \
             available (MemAvailable)"
        );
        // /dev/shm sized to RAM, but the memory is not there: the case that woke the OOM killer.
        let e = room_error(16 * gib, "y", Some(32 * gib), Some(8 * gib)).unwrap();
        assert!(
            e.message().contains("8589934592 bytes (8.0 GiB) available"),
            "{}",
            e.message()
        );
        // Heap memory: only MemAvailable is known.
        let e = room_error(4096, "z", None, Some(1024)).unwrap();
        assert_eq!(
            e.message(),
            "z: 4096 bytes (4.0 KiB) requested, but the system has 1024 bytes (1.0 KiB) available (MemAvailable)"
        );
    }

    #[test]
    fn an_allocation_larger_than_memory_fails_before_touching_shm() {
        // Larger than any machine's memory and /dev/shm: refused by the check, nothing reserved.
        let e = Segment::create(1 << 62).unwrap_err();
        assert_eq!(e.status(), ferrocx::abi::Status::OUT_OF_MEMORY);
        assert!(
            e.message().contains("requested, but /dev/shm has"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn job_ids_are_sanitized() {
        assert_eq!(sanitize_job_id(None), "local");
        assert_eq!(sanitize_job_id(Some(String::new())), "local");
        assert_eq!(sanitize_job_id(Some("slurm-12_3".into())), "slurm-12_3");
        assert_eq!(sanitize_job_id(Some("a/b c.d\u{e9}".into())), "a_b_c_d_");
        assert_eq!(
            sanitize_job_id(Some("x".repeat(500))).len(),
            JobInfo::MAX_ID_LEN
        );
        assert_eq!(
            sanitize_job_id(Some("y".repeat(500))),
            JobInfo::sanitize_id(&"y".repeat(500)),
            "the host's segments and the store's files cut an id alike"
        );
    }

    #[test]
    fn segment_names_parse_only_for_their_job() {
        assert_eq!(
            parse_segment_name("ferrocx-local-42-7", "local"),
            Some((42, 7))
        );
        assert_eq!(parse_segment_name("ferrocx-local-42-7", "loc"), None);
        // Job "a" must not claim the segments of job "a-5".
        assert_eq!(parse_segment_name("ferrocx-a-5-42-7", "a"), None);
        assert_eq!(parse_segment_name("ferrocx-a-5-42-7", "a-5"), Some((42, 7)));
        assert_eq!(parse_segment_name("ferrocx-local-0-7", "local"), None);
        assert_eq!(parse_segment_name("ferrocx-local--1-7", "local"), None);
        assert_eq!(parse_segment_name("ferrocx-local-42-", "local"), None);
        assert_eq!(
            parse_segment_name("ferrocx-local-99999999999-1", "local"),
            None
        );
        assert_eq!(parse_segment_name("other-local-42-7", "local"), None);
    }

    #[test]
    fn sizes_round_to_pages() {
        let p = page_size();
        assert_eq!(round_to_pages(1).unwrap(), p);
        assert_eq!(round_to_pages(p).unwrap(), p);
        assert_eq!(round_to_pages(p + 1).unwrap(), 2 * p);
        assert!(round_to_pages(usize::MAX).is_err());
    }

    #[test]
    fn a_segment_is_unlinked_when_dropped() {
        let seg = Segment::create(3).unwrap();
        let path = Path::new(SHM_DIR).join(&seg.name()[1..]);
        assert!(path.exists());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3);
        drop(seg);
        assert!(!path.exists());
    }
}
