//! The host device's memory, IPC, VMM and flat mapping, called through the real tables of the
//! built-in adaptor, across real processes.
//!
//! Multi-process tests re-run this executable on one test (`--exact <name>`) with
//! `FERROCX_TEST_ROLE` naming the child's part; a child gets a job id of its own
//! (`FERROCX_JOB_ID`), so what it leaves in `/dev/shm` can be checked exactly. The parent process
//! keeps the default job id and checks only segments named with its own pid.

mod common;

use common::fds::{recv_fds, send_fds};
use ferrocx_test_support::procs::{finish, rerun};
use ferrocx_test_support::shm::segments_of_job;
use ferrocx_test_support::{fresh_seed, random_bytes};
use std::ffi::{c_void, CStr, CString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Output};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferrocx::abi::{Capabilities, DevicePtr, MemKind, Status, Stream, VmmHandle};
use ferrocx::adaptor::Device;
use ferrocx::registry::Registry;

const ROLE: &str = "FERROCX_TEST_ROLE";
const KINDS: [MemKind; 3] = [MemKind::DEVICE, MemKind::PINNED, MemKind::HOST];
/// One byte, an odd size past a page, and 1 MiB + 3.
const SIZES: [usize; 3] = [1, 4097, (1 << 20) + 3];
const TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Calling the tables.

/// A failed call: its status and the adaptor's message.
#[derive(Debug)]
struct Failure {
    status: Status,
    message: String,
}

type Outcome<T> = Result<T, Failure>;

/// The host device, with the entries `ferrocx::adaptor::Device` does not wrap called through
/// the raw tables.
struct Host {
    dev: Device,
}

fn host() -> Host {
    ferrocx_adaptor_host::link();
    let reg = Registry::with_builtins();
    let dev = reg
        .device("host")
        .expect("the host adaptor is registered")
        .device()
        .expect("it has a device table");
    dev.init(&[]).expect("init");
    Host { dev }
}

impl Host {
    fn status(&self, s: Status) -> Outcome<()> {
        if s.is_success() {
            return Ok(());
        }
        let f = self.dev.tables().root.get().get_last_error.unwrap();
        // SAFETY: get_last_error returns a NUL-terminated string valid until the next call.
        let message = unsafe { CStr::from_ptr(f()) }
            .to_string_lossy()
            .into_owned();
        Err(Failure { status: s, message })
    }

    fn alloc(&self, bytes: usize, kind: MemKind) -> DevicePtr {
        self.dev.mem_alloc(bytes, kind).expect("mem_alloc")
    }

    fn try_alloc(&self, bytes: usize, kind: MemKind) -> Outcome<DevicePtr> {
        let mut p = DevicePtr::NULL;
        let f = self.dev.tables().root.get().mem_alloc.unwrap();
        // SAFETY: `p` is writable.
        self.status(unsafe { f(bytes, kind, &mut p) })?;
        Ok(p)
    }

    fn free(&self, p: DevicePtr, kind: MemKind) -> Outcome<()> {
        let f = self.dev.tables().root.get().mem_free.unwrap();
        // SAFETY: plain values.
        self.status(unsafe { f(p, kind) })
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Outcome<()> {
        let f = self.dev.tables().root.get().mem_copy.unwrap();
        // SAFETY: the test passes addresses valid for `bytes` (or ones the adaptor must refuse).
        self.status(unsafe { f(dst, src, bytes) })
    }

    fn set(&self, dst: DevicePtr, value: u8, bytes: usize) -> Outcome<()> {
        let f = self.dev.tables().root.get().mem_set.unwrap();
        // SAFETY: as `copy`.
        self.status(unsafe { f(dst, value, bytes) })
    }

    fn copy_async(&self, dst: DevicePtr, src: DevicePtr, bytes: usize, s: Stream) -> Outcome<()> {
        let f = self.dev.tables().root.get().mem_copy_async.unwrap();
        // SAFETY: as `copy`; the spans stay valid until the stream is synchronized.
        self.status(unsafe { f(dst, src, bytes, s) })
    }

    fn set_async(&self, dst: DevicePtr, value: u8, bytes: usize, s: Stream) -> Outcome<()> {
        let f = self.dev.tables().root.get().mem_set_async.unwrap();
        // SAFETY: as `copy_async`.
        self.status(unsafe { f(dst, value, bytes, s) })
    }

    fn stream_create(&self) -> Stream {
        let mut s = Stream::NULL;
        let f = self.dev.tables().root.get().stream_create.unwrap();
        // SAFETY: `s` is writable.
        self.status(unsafe { f(0, &mut s) }).expect("stream_create");
        s
    }

    fn stream_synchronize(&self, s: Stream) -> Outcome<()> {
        let f = self.dev.tables().root.get().stream_synchronize.unwrap();
        // SAFETY: a stream handle of this adaptor.
        self.status(unsafe { f(s) })
    }

    fn stream_destroy(&self, s: Stream) {
        let f = self.dev.tables().root.get().stream_destroy.unwrap();
        // SAFETY: as above.
        self.status(unsafe { f(s) }).expect("stream_destroy");
    }

    fn launch_host_func(
        &self,
        s: Stream,
        func: unsafe extern "C" fn(*mut c_void),
        user: *mut c_void,
    ) {
        let f = self.dev.tables().root.get().launch_host_func.unwrap();
        // SAFETY: `func(user)` is sound to call once on any thread (the caller keeps `user` alive).
        self.status(unsafe { f(s, Some(func), user) })
            .expect("launch_host_func");
    }

    fn ipc_export(&self, p: DevicePtr) -> Outcome<Vec<u8>> {
        let f = self.dev.tables().root.get().ipc_export.unwrap();
        let mut len = 0usize;
        // SAFETY: a null handle queries the size into `len`.
        self.status(unsafe { f(p, std::ptr::null_mut(), &mut len) })?;
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` holds `len` writable bytes.
        self.status(unsafe { f(p, buf.as_mut_ptr(), &mut len) })?;
        buf.truncate(len);
        Ok(buf)
    }

    fn ipc_import(&self, handle: &[u8]) -> Outcome<DevicePtr> {
        let f = self.dev.tables().root.get().ipc_import.unwrap();
        let mut p = DevicePtr::NULL;
        // SAFETY: `handle` is readable for its length; `p` is writable.
        self.status(unsafe { f(handle.as_ptr(), handle.len(), &mut p) })?;
        Ok(p)
    }

    fn ipc_close(&self, p: DevicePtr) -> Outcome<()> {
        let f = self.dev.tables().root.get().ipc_close.unwrap();
        // SAFETY: plain value.
        self.status(unsafe { f(p) })
    }

    fn vmm(&self) -> &ferrocx::abi::DeviceVmmV1 {
        self.dev.tables().vmm.as_ref().expect("the VMM group").get()
    }

    fn flat(&self) -> &ferrocx::abi::DeviceFlatMapV1 {
        self.dev
            .tables()
            .flatmap
            .as_ref()
            .expect("the flat-map group")
            .get()
    }

    fn granularity(&self) -> usize {
        let mut g = 0usize;
        // SAFETY: `g` is writable.
        self.status(unsafe { self.vmm().vmm_granularity.unwrap()(0, &mut g) })
            .expect("vmm_granularity");
        g
    }

    fn vmm_alloc(&self, bytes: usize) -> Outcome<VmmHandle> {
        let mut h = VmmHandle(0);
        // SAFETY: `h` is writable.
        self.status(unsafe { self.vmm().vmm_alloc.unwrap()(bytes, &mut h) })?;
        Ok(h)
    }

    fn vmm_export_fd(&self, h: VmmHandle) -> Outcome<OwnedFd> {
        let mut fd = -1;
        // SAFETY: `fd` is writable.
        self.status(unsafe { self.vmm().vmm_export_fd.unwrap()(h, &mut fd) })?;
        // SAFETY: the exported descriptor is the caller's.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn vmm_import_fd(&self, fd: RawFd, bytes: usize) -> Outcome<VmmHandle> {
        let mut h = VmmHandle(0);
        // SAFETY: `h` is writable; `fd` stays ours.
        self.status(unsafe { self.vmm().vmm_import_fd.unwrap()(fd, bytes, &mut h) })?;
        Ok(h)
    }

    fn vmm_release(&self, h: VmmHandle) -> Outcome<()> {
        // SAFETY: plain value.
        self.status(unsafe { self.vmm().vmm_release.unwrap()(h) })
    }

    fn flat_reserve(&self, bytes: usize) -> Outcome<DevicePtr> {
        let mut b = DevicePtr::NULL;
        // SAFETY: `b` is writable.
        self.status(unsafe { self.flat().flat_reserve.unwrap()(bytes, &mut b) })?;
        Ok(b)
    }

    fn flat_map(&self, base: DevicePtr, i: usize, size: usize, h: VmmHandle) -> Outcome<()> {
        // SAFETY: plain values.
        self.status(unsafe { self.flat().flat_map.unwrap()(base, i, size, h) })
    }

    fn flat_unmap(&self, base: DevicePtr, i: usize, size: usize) -> Outcome<()> {
        // SAFETY: plain values.
        self.status(unsafe { self.flat().flat_unmap.unwrap()(base, i, size) })
    }

    fn flat_release(&self, base: DevicePtr, bytes: usize) -> Outcome<()> {
        // SAFETY: plain values.
        self.status(unsafe { self.flat().flat_release.unwrap()(base, bytes) })
    }

    /// Writes `data` at `dst` through the device.
    fn upload(&self, dst: DevicePtr, data: &[u8]) {
        self.copy(dst, host_ptr(data), data.len()).expect("upload");
    }

    /// Reads `n` bytes at `src` through the device.
    fn download(&self, src: DevicePtr, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        self.copy(DevicePtr(out.as_mut_ptr() as u64), src, n)
            .expect("download");
        out
    }
}

fn host_ptr(data: &[u8]) -> DevicePtr {
    DevicePtr(data.as_ptr() as u64)
}

fn offset(p: DevicePtr, by: usize) -> DevicePtr {
    DevicePtr(p.0 + by as u64)
}

#[track_caller]
fn expect_status<T: std::fmt::Debug>(r: Outcome<T>, want: Status) -> String {
    match r {
        Ok(v) => panic!("expected {want:?}, got Ok({v:?})"),
        Err(f) => {
            assert_eq!(f.status, want, "{}", f.message);
            f.message
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Data, segments and child processes.

/// The segment name inside an IPC handle (layout: magic, offset, size, name).
fn handle_segment(handle: &[u8]) -> (String, u64, u64) {
    assert_eq!(&handle[..4], b"FXI1");
    let word = |at: usize| u64::from_le_bytes(handle[at..at + 8].try_into().unwrap());
    (
        String::from_utf8(handle[20..].to_vec()).unwrap(),
        word(4),
        word(12),
    )
}

fn shm_path(name: &str) -> std::path::PathBuf {
    Path::new("/dev/shm").join(name.trim_start_matches('/'))
}

fn unique_job(tag: &str) -> String {
    format!("t{}{tag}", std::process::id())
}

/// Creates a segment file by hand, as a process of `job` with pid `pid` would have.
fn make_segment(job: &str, pid: u32, seq: u64) -> String {
    let name = format!("/ferrocx-{job}-{pid}-{seq}");
    let c = CString::new(name.clone()).unwrap();
    // SAFETY: a NUL-terminated name.
    let fd = unsafe {
        libc::shm_open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )
    };
    assert!(
        fd >= 0,
        "shm_open({name}): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new descriptor of ours.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    name
}

/// Unlinks every segment of its jobs when dropped, so a failing test leaves nothing behind.
struct JobCleanup(Vec<String>);

impl Drop for JobCleanup {
    fn drop(&mut self) {
        for job in &self.0 {
            for name in segments_of_job(job) {
                unlink_segment(&format!("/{name}"));
            }
        }
    }
}

fn unlink_segment(name: &str) {
    let c = CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name.
    unsafe { libc::shm_unlink(c.as_ptr()) };
}

/// The role this process plays, when it is a child of a multi-process test.
fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// Starts this test executable on test `test` in role `role`.
fn spawn_child(test: &str, role: &str, envs: &[(&str, String)]) -> Child {
    let mut cmd = rerun(test);
    cmd.env(ROLE, role);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn the child test process")
}

#[track_caller]
fn assert_child_ok(out: &Output) {
    assert!(
        out.status.success(),
        "child failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Values of the lines `<tag> <value>` a child printed (the harness may start the first one on
/// its own "test … " line).
fn child_lines(out: &Output, tag: &str) -> Vec<String> {
    let tag = format!("{tag} ");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(&tag).map(|(_, v)| v.trim().to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
fn send_byte(sock: &mut UnixStream, b: u8) {
    sock.write_all(&[b]).expect("send a step byte");
}

fn recv_byte(sock: &mut UnixStream, want: u8) {
    let mut b = [0u8];
    sock.read_exact(&mut b).expect("receive a step byte");
    assert_eq!(b[0], want);
}

// ---------------------------------------------------------------------------------------------
// In-process tests.

#[test]
fn properties_report_ipc_vmm_and_flat_map() {
    let h = host();
    let p = h.dev.properties(0).unwrap();
    for c in [
        Capabilities::IPC,
        Capabilities::VMM,
        Capabilities::FLAT_MAP,
        Capabilities::HOST_ADDRESSABLE,
    ] {
        assert!(
            p.capabilities.contains(c),
            "{:?} lacks {c:?}",
            p.capabilities
        );
    }
    // Multicast is emulated on the host (tests/multicast.rs).
    assert!(p.capabilities.contains(Capabilities::MULTICAST));
    assert!(h.dev.tables().vmm.is_some() && h.dev.tables().flatmap.is_some());
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    assert_eq!(h.granularity(), page);
}

#[test]
fn alloc_copy_set_round_trip_every_kind_and_size() {
    let h = host();
    let seed = fresh_seed();
    for (k, &kind) in KINDS.iter().enumerate() {
        // The second buffer is of another kind: copies go between any two.
        let other = KINDS[(k + 1) % KINDS.len()];
        for &n in &SIZES {
            let data = random_bytes(seed ^ (n as u64) ^ ((k as u64) << 40), n);
            let a = h.alloc(n, kind);
            let b = h.alloc(n, other);
            assert_ne!(a, DevicePtr::NULL);
            h.upload(a, &data);
            h.copy(b, a, n).unwrap();
            assert_eq!(h.download(b, n), data, "{kind:?} -> {other:?}, {n} bytes");

            // memset of a middle span.
            let (lo, len) = (n / 3, n - n / 3 - n / 4);
            let v = data[0] ^ 0xa5;
            h.set(offset(b, lo), v, len).unwrap();
            let mut want = data.clone();
            want[lo..lo + len].fill(v);
            assert_eq!(h.download(b, n), want, "memset of {kind:?}, {n} bytes");

            // Overlapping copy inside one allocation: memmove semantics, both directions.
            if n > 1 {
                h.copy(offset(a, 1), a, n - 1).unwrap();
                let mut want = data.clone();
                want.copy_within(..n - 1, 1);
                assert_eq!(h.download(a, n), want, "overlapping copy up, {n} bytes");
                h.copy(a, offset(a, 1), n - 1).unwrap();
                want.copy_within(1.., 0);
                assert_eq!(h.download(a, n), want, "overlapping copy down, {n} bytes");
            }
            // Size 0 is a no-op, even with null pointers.
            h.copy(DevicePtr::NULL, DevicePtr::NULL, 0).unwrap();
            h.set(DevicePtr::NULL, 0, 0).unwrap();

            h.free(a, kind).unwrap();
            h.free(b, other).unwrap();
        }
    }
}

/// A gate a host function blocks on until the test opens it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

unsafe extern "C" fn wait_at_gate(user: *mut c_void) {
    // SAFETY: `user` is an `Arc<Gate>` the test keeps alive until the stream is synchronized.
    let gate = unsafe { &*(user as *const Gate) };
    let mut open = gate.open.lock().unwrap();
    while !*open {
        open = gate.cv.wait(open).unwrap();
    }
}

#[test]
fn async_copy_is_ordered_after_async_memset_on_one_stream() {
    let h = host();
    let seed = fresh_seed();
    for s in [h.stream_create(), Stream::NULL] {
        for &n in &SIZES {
            let a = h.alloc(n, MemKind::DEVICE);
            let b = h.alloc(n, MemKind::PINNED);
            let before = random_bytes(seed ^ n as u64, n);
            let mut out = before.clone();
            let out_ptr = DevicePtr(out.as_mut_ptr() as u64);
            let value = before[0] ^ 0x3c;

            // Hold the stream so everything below is queued, not run.
            let gate = Arc::new(Gate::default());
            h.launch_host_func(s, wait_at_gate, Arc::as_ptr(&gate) as *mut c_void);
            h.set_async(a, value, n, s).unwrap();
            h.copy_async(b, a, n, s).unwrap();
            h.copy_async(out_ptr, b, n, s).unwrap();
            // SAFETY: the stream is held at the gate: nothing writes `out` now.
            let unchanged = unsafe { std::slice::from_raw_parts(out_ptr.0 as *const u8, n) };
            assert_eq!(
                unchanged,
                &before[..],
                "the async calls returned before running"
            );

            *gate.open.lock().unwrap() = true;
            gate.cv.notify_all();
            h.stream_synchronize(s).unwrap();
            assert!(out.iter().all(|&x| x == value), "{n} bytes on {s:?}");

            h.free(a, MemKind::DEVICE).unwrap();
            h.free(b, MemKind::PINNED).unwrap();
        }
        if !s.is_null() {
            h.stream_destroy(s);
        }
    }
}

#[test]
fn bad_frees_pointers_and_sizes_are_refused() {
    let h = host();
    for kind in KINDS {
        let p = h.alloc(16, kind);
        h.free(p, kind).unwrap();
        expect_status(h.free(p, kind), Status::INVALID_HANDLE);
    }
    expect_status(
        h.free(DevicePtr(0x1000), MemKind::DEVICE),
        Status::INVALID_HANDLE,
    );
    expect_status(h.try_alloc(0, MemKind::DEVICE), Status::INVALID_ARGUMENT);
    expect_status(h.try_alloc(0, MemKind::HOST), Status::INVALID_ARGUMENT);
    expect_status(h.try_alloc(8, MemKind(9)), Status::INVALID_ARGUMENT);

    let p = h.alloc(100, MemKind::DEVICE);
    let m = expect_status(h.free(p, MemKind::HOST), Status::INVALID_ARGUMENT);
    assert!(m.contains("DEVICE") && m.contains("HOST"), "{m}");
    expect_status(
        h.free(offset(p, 4), MemKind::DEVICE),
        Status::INVALID_HANDLE,
    );

    let buf = vec![0u8; 200];
    expect_status(h.copy(DevicePtr::NULL, p, 4), Status::INVALID_ARGUMENT);
    expect_status(h.copy(p, DevicePtr::NULL, 4), Status::INVALID_ARGUMENT);
    expect_status(h.set(DevicePtr::NULL, 1, 1), Status::INVALID_ARGUMENT);
    let m = expect_status(h.copy(p, host_ptr(&buf), 101), Status::INVALID_ARGUMENT);
    assert!(m.contains("overruns"), "{m}");
    expect_status(
        h.copy(host_ptr(&buf), offset(p, 50), 51),
        Status::INVALID_ARGUMENT,
    );
    expect_status(h.set(offset(p, 99), 0, 2), Status::INVALID_ARGUMENT);
    expect_status(
        h.copy_async(p, DevicePtr::NULL, 4, Stream::NULL),
        Status::INVALID_ARGUMENT,
    );
    let bogus = Stream(0xdead_0000 as *mut c_void);
    expect_status(h.copy_async(p, p, 4, bogus), Status::INVALID_HANDLE);
    expect_status(h.set_async(p, 0, 4, bogus), Status::INVALID_HANDLE);

    // IPC: only DEVICE and PINNED memory exports; handles are checked.
    let q = h.alloc(100, MemKind::HOST);
    expect_status(h.ipc_export(q), Status::INVALID_ARGUMENT);
    expect_status(h.ipc_export(host_ptr(&buf)), Status::INVALID_ARGUMENT);
    expect_status(h.ipc_export(offset(p, 100)), Status::INVALID_ARGUMENT);
    expect_status(h.ipc_import(b"not a handle"), Status::INVALID_ARGUMENT);
    expect_status(h.ipc_close(p), Status::INVALID_HANDLE);
    h.free(q, MemKind::HOST).unwrap();
    h.free(p, MemKind::DEVICE).unwrap();

    // VMM: unknown handles, bad descriptors, sizes that do not match.
    expect_status(h.vmm_alloc(0), Status::INVALID_ARGUMENT);
    expect_status(h.vmm_release(VmmHandle(u64::MAX)), Status::INVALID_HANDLE);
    expect_status(h.vmm_export_fd(VmmHandle(u64::MAX)), Status::INVALID_HANDLE);
    expect_status(h.vmm_import_fd(-1, 4096), Status::INVALID_ARGUMENT);
    let g = h.granularity();
    let v = h.vmm_alloc(1).unwrap();
    let fd = h.vmm_export_fd(v).unwrap();
    let m = expect_status(
        h.vmm_import_fd(fd.as_raw_fd(), 3 * g),
        Status::INVALID_ARGUMENT,
    );
    assert!(
        m.contains(&g.to_string()) && m.contains(&(3 * g).to_string()),
        "{m}"
    );
    let sock = UnixStream::pair().unwrap().0;
    expect_status(
        h.vmm_import_fd(sock.as_raw_fd(), g),
        Status::INVALID_ARGUMENT,
    );

    // Flat map: unknown ranges, double maps, release while mapped.
    let base = h.flat_reserve(2 * g).unwrap();
    expect_status(
        h.flat_map(DevicePtr(g as u64), 0, g, v),
        Status::INVALID_HANDLE,
    );
    expect_status(h.flat_map(base, 2, g, v), Status::INVALID_ARGUMENT);
    expect_status(
        h.flat_map(base, 0, g, VmmHandle(u64::MAX)),
        Status::INVALID_HANDLE,
    );
    h.flat_map(base, 0, g, v).unwrap();
    expect_status(h.flat_map(base, 0, g, v), Status::INVALID_ARGUMENT);
    // Slot 1 is reserved but not mapped: a copy touching it is refused, not a crash.
    expect_status(
        h.copy(host_ptr(&buf), offset(base, g - 4), 8),
        Status::INVALID_ARGUMENT,
    );
    let m = expect_status(h.flat_release(base, 2 * g), Status::INVALID_ARGUMENT);
    assert!(m.contains("1 mapped slot"), "{m}");
    expect_status(h.flat_unmap(base, 1, g), Status::INVALID_ARGUMENT);
    h.flat_unmap(base, 0, g).unwrap();
    h.flat_release(base, 2 * g).unwrap();
    expect_status(h.flat_release(base, 2 * g), Status::INVALID_HANDLE);
    h.vmm_release(v).unwrap();
}

#[test]
fn freed_segments_leave_nothing_in_dev_shm() {
    let h = host();
    let me = format!("-{}-", std::process::id());
    for kind in [MemKind::DEVICE, MemKind::PINNED] {
        for &n in &SIZES {
            let p = h.alloc(n, kind);
            let (name, off, size) = handle_segment(&h.ipc_export(p).unwrap());
            assert!(
                name.starts_with("/ferrocx-") && name.contains(&me),
                "{name}"
            );
            assert_eq!((off, size), (0, n as u64));
            let path = shm_path(&name);
            let meta = std::fs::metadata(&path).expect("the segment exists while allocated");
            assert_eq!(meta.len(), n as u64);
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
            h.free(p, kind).unwrap();
            assert!(!path.exists(), "{name} is left after mem_free");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Across processes.

#[test]
fn ipc_between_two_processes() {
    if role().as_deref() == Some("ipc-child") {
        return ipc_child();
    }
    let h = host();
    let seed = fresh_seed();
    let mut allocs = Vec::new();
    let mut spec = Vec::new();
    for (i, &n) in SIZES.iter().enumerate() {
        let kind = if i % 2 == 0 {
            MemKind::DEVICE
        } else {
            MemKind::PINNED
        };
        let p = h.alloc(n, kind);
        let data = random_bytes(seed + i as u64, n);
        h.upload(p, &data);
        let off = n / 2;
        let handle = h.ipc_export(offset(p, off)).unwrap();
        let hex: String = handle.iter().map(|b| format!("{b:02x}")).collect();
        spec.push(format!("{hex}:{}:{n}:{off}", seed + i as u64));
        allocs.push((p, kind, n, off, data));
    }
    let out = finish(
        spawn_child(
            "ipc_between_two_processes",
            "ipc-child",
            &[
                ("FERROCX_JOB_ID", unique_job("ipc")),
                ("FERROCX_TEST_IPC", spec.join(",")),
            ],
        ),
        TIMEOUT,
    );
    assert_child_ok(&out);
    for (p, kind, n, off, data) in allocs {
        // The child wrote its pattern from the exported pointer on; the rest is untouched.
        let mut want = data.clone();
        want[off..].copy_from_slice(&child_pattern(n, off));
        assert_eq!(h.download(p, n), want, "{n} bytes after the child's writes");
        h.free(p, kind).unwrap();
    }
}

/// What the IPC child writes from the exported pointer on.
fn child_pattern(n: usize, off: usize) -> Vec<u8> {
    random_bytes(0xc0ffee ^ n as u64, n - off)
}

fn ipc_child() {
    let h = host();
    let spec = std::env::var("FERROCX_TEST_IPC").unwrap();
    for item in spec.split(',') {
        let f: Vec<&str> = item.split(':').collect();
        let handle: Vec<u8> = (0..f[0].len() / 2)
            .map(|i| u8::from_str_radix(&f[0][2 * i..2 * i + 2], 16).unwrap())
            .collect();
        let (seed, n, off): (u64, usize, usize) = (
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        );
        let p = h.ipc_import(&handle).unwrap();
        // Importing the same handle again shares the mapping; each import is closed once.
        let q = h.ipc_import(&handle).unwrap();
        assert_eq!(p, q);
        let data = random_bytes(seed, n);
        assert_eq!(
            h.download(p, n - off),
            &data[off..],
            "{n} bytes read from the parent"
        );
        expect_status(
            h.copy(p, host_ptr(&data), n - off + 1),
            Status::INVALID_ARGUMENT,
        );
        h.upload(p, &child_pattern(n, off));
        h.ipc_close(p).unwrap();
        h.ipc_close(q).unwrap();
        expect_status(h.ipc_close(p), Status::INVALID_HANDLE);
    }
}

#[test]
fn vmm_and_flat_map_across_two_processes() {
    if role().as_deref() == Some("flat-child") {
        let path = std::env::var("FERROCX_TEST_SOCKET").unwrap();
        let seed: u64 = std::env::var("FERROCX_TEST_SEED").unwrap().parse().unwrap();
        let sock = UnixStream::connect(path).expect("connect to the parent");
        return flat_peer(1, sock, seed);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fds.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let seed = fresh_seed();
    let mut child = spawn_child(
        "vmm_and_flat_map_across_two_processes",
        "flat-child",
        &[
            ("FERROCX_JOB_ID", unique_job("flat")),
            ("FERROCX_TEST_SOCKET", path.display().to_string()),
            ("FERROCX_TEST_SEED", seed.to_string()),
        ],
    );
    let deadline = Instant::now() + TIMEOUT;
    let sock = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
                    assert_child_ok(&finish(child, TIMEOUT));
                    panic!("the child never connected");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    sock.set_nonblocking(false).unwrap();
    flat_peer(0, sock, seed);
    assert_child_ok(&finish(child, TIMEOUT));
}

/// One side of the flat-map exchange: rank 0 (the parent) or 1 (the child).
fn flat_peer(rank: usize, mut sock: UnixStream, seed: u64) {
    sock.set_read_timeout(Some(TIMEOUT)).unwrap();
    let h = host();
    let peer = 1 - rank;
    let g = h.granularity();
    let pattern = |r: usize, n: usize, round: u64| {
        random_bytes(seed ^ ((r as u64) << 48) ^ ((n as u64) << 8) ^ round, n)
    };

    // Each process allocates one VMM allocation per size and sends the other its descriptors.
    let own: Vec<VmmHandle> = SIZES.iter().map(|&n| h.vmm_alloc(n).unwrap()).collect();
    let exported: Vec<OwnedFd> = own.iter().map(|&v| h.vmm_export_fd(v).unwrap()).collect();
    let raw: Vec<RawFd> = exported.iter().map(|f| f.as_raw_fd()).collect();
    send_fds(&sock, &raw);
    drop(exported);
    let received = recv_fds(&sock, SIZES.len());
    let theirs: Vec<VmmHandle> = received
        .iter()
        .zip(SIZES)
        .map(|(fd, n)| {
            expect_status(
                h.vmm_import_fd(fd.as_raw_fd(), n + g),
                Status::INVALID_ARGUMENT,
            );
            h.vmm_import_fd(fd.as_raw_fd(), n).unwrap()
        })
        .collect();
    // The imports hold descriptors of their own.
    drop(received);

    // Both map both allocations: rank r's at base + r * slot.
    let mut ranges = Vec::new();
    for (i, &n) in SIZES.iter().enumerate() {
        let slot = n.div_ceil(g) * g;
        let base = h.flat_reserve(2 * slot).unwrap();
        h.flat_map(base, rank, slot, own[i]).unwrap();
        h.flat_map(base, peer, slot, theirs[i]).unwrap();
        h.upload(offset(base, rank * slot), &pattern(rank, slot, 1));
        ranges.push((base, slot));
    }
    send_byte(&mut sock, b'W');
    recv_byte(&mut sock, b'W');
    for &(base, slot) in &ranges {
        assert_eq!(
            h.download(offset(base, peer * slot), slot),
            pattern(peer, slot, 1),
            "rank {rank} reads what rank {peer} wrote ({slot} bytes)"
        );
        // Now write into the peer's slot: the peer must see it in its own memory.
        h.upload(offset(base, peer * slot), &pattern(rank, slot, 2));
    }
    send_byte(&mut sock, b'X');
    recv_byte(&mut sock, b'X');
    for &(base, slot) in &ranges {
        assert_eq!(
            h.download(offset(base, rank * slot), slot),
            pattern(peer, slot, 2),
            "rank {rank} sees rank {peer}'s writes in its own allocation ({slot} bytes)"
        );
    }

    // Teardown, in reverse.
    for &(base, slot) in &ranges {
        let m = expect_status(h.flat_release(base, 2 * slot), Status::INVALID_ARGUMENT);
        assert!(m.contains("2 mapped slot"), "{m}");
        h.flat_unmap(base, 0, slot).unwrap();
        h.flat_unmap(base, 1, slot).unwrap();
        h.flat_release(base, 2 * slot).unwrap();
    }
    for v in own.into_iter().chain(theirs) {
        h.vmm_release(v).unwrap();
    }
    send_byte(&mut sock, b'D');
    recv_byte(&mut sock, b'D');
}

#[test]
fn finalize_releases_everything_and_leaves_no_segment() {
    if role().as_deref() == Some("finalize-child") {
        return finalize_child();
    }
    let job = unique_job("fin");
    let _cleanup = JobCleanup(vec![job.clone()]);
    let out = finish(
        spawn_child(
            "finalize_releases_everything_and_leaves_no_segment",
            "finalize-child",
            &[("FERROCX_JOB_ID", job.clone())],
        ),
        TIMEOUT,
    );
    assert_child_ok(&out);
    let made = child_lines(&out, "SEGMENT");
    assert_eq!(made.len(), 4, "the child reported its segments");
    assert_eq!(segments_of_job(&job), Vec::<String>::new());
}

fn finalize_child() {
    let h = host();
    let job = std::env::var("FERROCX_JOB_ID").unwrap();
    let mut held = Vec::new();
    for (kind, n) in [
        (MemKind::DEVICE, 1),
        (MemKind::DEVICE, 4097),
        (MemKind::PINNED, (1 << 20) + 3),
        (MemKind::PINNED, 10),
    ] {
        let p = h.alloc(n, kind);
        let (name, _, _) = handle_segment(&h.ipc_export(p).unwrap());
        println!("SEGMENT {name}");
        held.push((p, kind));
    }
    let heap = h.alloc(33, MemKind::HOST);
    let import = h.ipc_import(&h.ipc_export(held[0].0).unwrap()).unwrap();
    let g = h.granularity();
    let v = h.vmm_alloc(g).unwrap();
    let base = h.flat_reserve(g).unwrap();
    h.flat_map(base, 0, g, v).unwrap();
    // The four allocations and the VMM allocation (a named segment too).
    assert_eq!(segments_of_job(&job).len(), 5);

    h.dev.finalize().unwrap();
    assert_eq!(
        segments_of_job(&job),
        Vec::<String>::new(),
        "segments left after finalize"
    );
    // Everything is gone from the registries too.
    for (p, kind) in held {
        expect_status(h.free(p, kind), Status::INVALID_HANDLE);
    }
    expect_status(h.free(heap, MemKind::HOST), Status::INVALID_HANDLE);
    expect_status(h.ipc_close(import), Status::INVALID_HANDLE);
    expect_status(h.vmm_release(v), Status::INVALID_HANDLE);
    expect_status(h.flat_release(base, g), Status::INVALID_HANDLE);
    // And the device works again after a new init.
    h.dev.init(&[]).unwrap();
    let p = h.alloc(5, MemKind::DEVICE);
    h.free(p, MemKind::DEVICE).unwrap();
}

#[test]
fn segments_of_a_crashed_process_are_removed_at_the_next_start() {
    match role().as_deref() {
        Some("crash-child") => {
            let h = host();
            for n in [1, 4097] {
                let p = h.alloc(n, MemKind::DEVICE);
                let (name, _, _) = handle_segment(&h.ipc_export(p).unwrap());
                println!("SEGMENT {name}");
            }
            std::io::stdout().flush().unwrap();
            // Die without finalize or any destructor, as a crash would (and without a core).
            // SAFETY: _exit ends the process at once; nothing runs after it.
            unsafe { libc::_exit(70) };
        }
        Some("restart-child") => {
            // `init` of the next process of the job does the cleanup.
            host();
            return;
        }
        _ => {}
    }
    let job = unique_job("crash");
    let other_job = format!("{job}x");
    let _cleanup = JobCleanup(vec![job.clone(), other_job.clone()]);
    let test = "segments_of_a_crashed_process_are_removed_at_the_next_start";
    let env = [("FERROCX_JOB_ID", job.clone())];

    let out = finish(spawn_child(test, "crash-child", &env), TIMEOUT);
    assert!(!out.status.success(), "the crash child aborts");
    let crashed = child_lines(&out, "SEGMENT");
    assert_eq!(crashed.len(), 2, "{}", String::from_utf8_lossy(&out.stdout));
    for name in &crashed {
        assert!(shm_path(name).exists(), "{name} is left by the crash");
    }
    // A segment named for a pid that no longer exists (a process that has exited)...
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let forged = make_segment(&job, dead_pid, 0);
    // ...one of a live process of the job (this one), and one of another job.
    let live = make_segment(&job, std::process::id(), u64::MAX);
    let other = make_segment(&other_job, dead_pid, 0);

    let out = finish(spawn_child(test, "restart-child", &env), TIMEOUT);
    assert_child_ok(&out);
    for name in crashed.iter().chain([&forged]) {
        assert!(!shm_path(name).exists(), "{name} survived the next start");
    }
    assert!(
        shm_path(&live).exists(),
        "a live process's segment was removed"
    );
    assert!(
        shm_path(&other).exists(),
        "another job's segment was removed"
    );
    unlink_segment(&live);
    unlink_segment(&other);
    assert_eq!(segments_of_job(&job), Vec::<String>::new());
    assert_eq!(segments_of_job(&other_job), Vec::<String>::new());
}
