//! The host device's emulated multicast, called through the real tables of the built-in
//! adaptor: the whole lifecycle across three real processes, and the errors in one.
//!
//! The multi-process test re-runs this executable three times on itself (`--exact <name>`) with
//! `FERROCX_TEST_ROLE` giving the rank; the children share a job id of their own
//! (`FERROCX_JOB_ID`), so what they leave in `/dev/shm` can be checked exactly.

mod common;

use std::ffi::CStr;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use ferrocx::abi::{
    Capabilities, DataType, DeviceMulticastV1, DevicePtr, McHandle, ReduceOp, Status, VmmHandle,
};
use ferrocx::adaptor::Device;
use ferrocx::registry::Registry;
use ferrocx_adaptor_host::multicast;
use ferrocx_test_support::procs::{finish, rerun};
use ferrocx_test_support::shm::{segments_of_job, JobCleanup};
use ferrocx_test_support::{fresh_seed, random_bytes};

const ROLE: &str = "FERROCX_TEST_ROLE";
const WORLD: usize = 3;
const TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Calling the tables.

type Outcome<T> = Result<T, (Status, String)>;

struct Host {
    dev: Device,
}

fn host() -> Host {
    ferrocx_adaptor_host::link();
    let dev = Registry::with_builtins()
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
        Err((s, message))
    }

    fn mc(&self) -> &DeviceMulticastV1 {
        self.dev
            .tables()
            .multicast
            .as_ref()
            .expect("the multicast group")
            .get()
    }

    fn mc_supported(&self) -> i32 {
        let mut s = -1;
        // SAFETY: `s` is writable.
        self.status(unsafe { self.mc().mc_supported.unwrap()(0, &mut s) })
            .expect("mc_supported");
        s
    }

    fn mc_create(&self, bytes: usize, n: i32) -> Outcome<McHandle> {
        let mut mc = McHandle(0);
        // SAFETY: `mc` is writable.
        self.status(unsafe { self.mc().mc_create.unwrap()(bytes, n, &mut mc) })?;
        Ok(mc)
    }

    fn mc_export_fd(&self, mc: McHandle) -> OwnedFd {
        let mut fd = -1;
        // SAFETY: `fd` is writable.
        self.status(unsafe { self.mc().mc_export_fd.unwrap()(mc, &mut fd) })
            .expect("mc_export_fd");
        // SAFETY: the exported descriptor is the caller's.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    fn mc_import_fd(&self, fd: RawFd, bytes: usize) -> Outcome<McHandle> {
        let mut mc = McHandle(0);
        // SAFETY: `mc` is writable; `fd` stays ours.
        self.status(unsafe { self.mc().mc_import_fd.unwrap()(fd, bytes, &mut mc) })?;
        Ok(mc)
    }

    fn mc_add_device(&self, mc: McHandle) -> Outcome<()> {
        // SAFETY: plain values.
        self.status(unsafe { self.mc().mc_add_device.unwrap()(mc, 0) })
    }

    fn mc_bind(&self, mc: McHandle, mc_off: usize, v: VmmHandle, mem_off: usize, n: usize) {
        // SAFETY: plain values.
        self.status(unsafe { self.mc().mc_bind.unwrap()(mc, mc_off, v, mem_off, n) })
            .expect("mc_bind");
    }

    fn mc_map(&self, mc: McHandle, bytes: usize) -> DevicePtr {
        let mut p = DevicePtr::NULL;
        // SAFETY: `p` is writable.
        self.status(unsafe { self.mc().mc_map.unwrap()(mc, bytes, &mut p) })
            .expect("mc_map");
        p
    }

    fn mc_unmap(&self, p: DevicePtr, bytes: usize) -> Outcome<()> {
        // SAFETY: plain values.
        self.status(unsafe { self.mc().mc_unmap.unwrap()(p, bytes) })
    }

    fn mc_unbind(&self, mc: McHandle, mc_off: usize, n: usize) -> Outcome<()> {
        // SAFETY: plain values.
        self.status(unsafe { self.mc().mc_unbind.unwrap()(mc, 0, mc_off, n) })
    }

    fn mc_release(&self, mc: McHandle) -> Outcome<()> {
        // SAFETY: plain value.
        self.status(unsafe { self.mc().mc_release.unwrap()(mc) })
    }

    fn granularity(&self) -> usize {
        let vmm = self.dev.tables().vmm.as_ref().unwrap().get();
        let mut g = 0usize;
        // SAFETY: `g` is writable.
        self.status(unsafe { vmm.vmm_granularity.unwrap()(0, &mut g) })
            .unwrap();
        g
    }

    fn vmm_alloc(&self, bytes: usize) -> VmmHandle {
        let vmm = self.dev.tables().vmm.as_ref().unwrap().get();
        let mut h = VmmHandle(0);
        // SAFETY: `h` is writable.
        self.status(unsafe { vmm.vmm_alloc.unwrap()(bytes, &mut h) })
            .expect("vmm_alloc");
        h
    }

    fn vmm_release(&self, h: VmmHandle) {
        let vmm = self.dev.tables().vmm.as_ref().unwrap().get();
        // SAFETY: plain value.
        self.status(unsafe { vmm.vmm_release.unwrap()(h) })
            .expect("vmm_release");
    }

    /// Maps allocation `v` of `bytes` alone into a flat range: its local address.
    fn map_local(&self, v: VmmHandle, bytes: usize) -> DevicePtr {
        let flat = self.dev.tables().flatmap.as_ref().unwrap().get();
        let mut base = DevicePtr::NULL;
        // SAFETY: `base` is writable; then plain values.
        unsafe {
            self.status(flat.flat_reserve.unwrap()(bytes, &mut base))
                .expect("flat_reserve");
            self.status(flat.flat_map.unwrap()(base, 0, bytes, v))
                .expect("flat_map");
        }
        base
    }

    fn unmap_local(&self, base: DevicePtr, bytes: usize) {
        let flat = self.dev.tables().flatmap.as_ref().unwrap().get();
        // SAFETY: plain values.
        unsafe {
            self.status(flat.flat_unmap.unwrap()(base, 0, bytes))
                .expect("flat_unmap");
            self.status(flat.flat_release.unwrap()(base, bytes))
                .expect("flat_release");
        }
    }

    /// # Safety
    ///
    /// `dst` is mapped memory of this process, writable for `data.len()` bytes.
    unsafe fn upload(&self, dst: DevicePtr, data: &[u8]) {
        // SAFETY: `dst` by the caller's contract; `data` is live host memory.
        unsafe {
            self.dev
                .mem_copy(dst, DevicePtr(data.as_ptr() as u64), data.len())
        }
        .expect("upload");
    }

    /// # Safety
    ///
    /// `src` is mapped memory of this process, readable for `n` bytes.
    unsafe fn download(&self, src: DevicePtr, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        // SAFETY: `src` by the caller's contract; `out` holds `n` bytes.
        unsafe {
            self.dev
                .mem_copy(DevicePtr(out.as_mut_ptr() as u64), src, n)
        }
        .expect("download");
        out
    }
}

#[track_caller]
fn expect_status<T: std::fmt::Debug>(r: Outcome<T>, want: Status) -> String {
    match r {
        Ok(v) => panic!("expected {want:?}, got Ok({v:?})"),
        Err((s, m)) => {
            assert_eq!(s, want, "{m}");
            m
        }
    }
}

/// The error of a `multicast::store` / `load_reduce` that must fail with `INVALID_ARGUMENT`.
#[track_caller]
fn invalid<E: std::fmt::Display, F: Fn(&E) -> Status>(r: Result<(), E>, status: F) -> String {
    let e = r.expect_err("the access must fail");
    assert_eq!(status(&e), Status::INVALID_ARGUMENT, "{e}");
    e.to_string()
}

// ---------------------------------------------------------------------------------------------
// Data, segments, children and sockets.

fn spawn_rank(test: &str, rank: usize, envs: &[(&str, String)]) -> Child {
    let mut cmd = rerun(test);
    cmd.env(ROLE, rank.to_string());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a rank")
}

/// Rank 0's sockets to ranks 1.. (index r - 1), or a rank's socket to rank 0.
enum Links {
    Hub(Vec<UnixStream>),
    Leaf(UnixStream),
}

impl Links {
    fn connect(rank: usize, path: &Path) -> Links {
        let deadline = Instant::now() + TIMEOUT;
        if rank == 0 {
            let listener = UnixListener::bind(path).expect("bind the hub socket");
            let mut socks: Vec<Option<UnixStream>> = (1..WORLD).map(|_| None).collect();
            for _ in 1..WORLD {
                let (mut s, _) = listener.accept().expect("accept");
                s.set_read_timeout(Some(TIMEOUT)).unwrap();
                let mut r = [0u8];
                s.read_exact(&mut r).unwrap();
                socks[r[0] as usize - 1] = Some(s);
            }
            return Links::Hub(socks.into_iter().map(Option::unwrap).collect());
        }
        loop {
            match UnixStream::connect(path) {
                Ok(mut s) => {
                    s.set_read_timeout(Some(TIMEOUT)).unwrap();
                    s.write_all(&[rank as u8]).unwrap();
                    return Links::Leaf(s);
                }
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("rank {rank} cannot reach rank 0: {e}"),
            }
        }
    }

    /// Every rank arrives with `step` before any leaves.
    fn barrier(&mut self, step: u8) {
        let recv = |s: &mut UnixStream| {
            let mut b = [0u8];
            s.read_exact(&mut b).expect("barrier");
            assert_eq!(b[0], step, "barrier steps out of order");
        };
        match self {
            Links::Hub(socks) => {
                socks.iter_mut().for_each(recv);
                for s in socks {
                    s.write_all(&[step]).unwrap();
                }
            }
            Links::Leaf(s) => {
                s.write_all(&[step]).unwrap();
                recv(s);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Across processes.

/// The f32 value rank `r` holds at element `i` (sums stay exact).
fn value(r: usize, i: usize) -> f32 {
    (r as f32 + 1.0) * 0.5 + (i % 97) as f32 * 0.25 - (r * i % 5) as f32
}

#[test]
fn multicast_lifecycle_across_three_processes() {
    if let Ok(rank) = std::env::var(ROLE) {
        return rank_main(rank.parse().unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mc.sock");
    let job = format!("t{}mc", std::process::id());
    let _cleanup = JobCleanup(job.clone());
    let env = [
        ("FERROCX_JOB_ID", job.clone()),
        ("FERROCX_TEST_SOCKET", path.display().to_string()),
        ("FERROCX_TEST_SEED", fresh_seed().to_string()),
    ];
    let children: Vec<Child> = (0..WORLD)
        .map(|r| spawn_rank("multicast_lifecycle_across_three_processes", r, &env))
        .collect();
    let outs: Vec<Output> = children.into_iter().map(|c| finish(c, TIMEOUT)).collect();
    for (r, out) in outs.iter().enumerate() {
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("RANK DONE"),
            "rank {r} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(segments_of_job(&job), Vec::<String>::new());
}

fn rank_main(rank: usize) {
    let path = PathBuf::from(std::env::var("FERROCX_TEST_SOCKET").unwrap());
    let seed: u64 = std::env::var("FERROCX_TEST_SEED").unwrap().parse().unwrap();
    let job = std::env::var("FERROCX_JOB_ID").unwrap();
    let h = host();
    assert_eq!(h.mc_supported(), 1);
    let g = h.granularity();
    let mc_bytes = 3 * g;
    let alloc_bytes = 4 * g;
    // Ranks bind from different offsets of their allocations.
    let mem_off = (rank % 2) * g;
    let mut links = Links::connect(rank, &path);

    // Rank 0 creates the object and sends it to every other rank.
    let mc = match &links {
        Links::Hub(socks) => {
            let mc = h.mc_create(mc_bytes, WORLD as i32).unwrap();
            let fd = h.mc_export_fd(mc);
            for s in socks {
                common::fds::send_fds(s, &[fd.as_raw_fd()]);
            }
            mc
        }
        Links::Leaf(s) => {
            let fd = common::fds::recv_fds(s, 1).remove(0);
            let m = expect_status(
                h.mc_import_fd(fd.as_raw_fd(), mc_bytes + 1),
                Status::INVALID_ARGUMENT,
            );
            assert!(m.contains(&mc_bytes.to_string()), "{m}");
            let mc = h.mc_import_fd(fd.as_raw_fd(), mc_bytes).unwrap();
            drop(fd);
            mc
        }
    };
    let v = h.vmm_alloc(alloc_bytes);
    let local = h.map_local(v, alloc_bytes);
    h.mc_add_device(mc).unwrap();
    h.mc_bind(mc, 0, v, mem_off, mc_bytes);
    let base = h.mc_map(mc, mc_bytes);
    links.barrier(1);

    // A store from rank 0 reaches every rank's own memory.
    let (at, n) = (123usize, g + 500);
    let pattern = random_bytes(seed, n);
    if rank == 0 {
        multicast::store(base.0 + at as u64, &pattern).unwrap();
    }
    links.barrier(2);
    assert_eq!(
        // SAFETY: `local` maps the whole allocation of `alloc_bytes`, which holds the bound
        // range `mem_off..mem_off + mc_bytes` that `at + n` lies in.
        unsafe { h.download(DevicePtr(local.0 + (mem_off + at) as u64), n) },
        pattern,
        "rank {rank} reads rank 0's multicast store in its own memory"
    );

    // Each rank writes its own values; a reduce-load sums every rank's.
    let count = 1000usize;
    let f_at = 2 * g + 16;
    let mine: Vec<u8> = (0..count)
        .flat_map(|i| value(rank, i).to_le_bytes())
        .collect();
    // SAFETY: as above: `f_at + 4 * count` lies within the bound range.
    unsafe { h.upload(DevicePtr(local.0 + (mem_off + f_at) as u64), &mine) };
    links.barrier(3);
    let mut out = vec![0u8; count * 4 + 1];
    // Unaligned output works too.
    multicast::load_reduce(
        base.0 + f_at as u64,
        &mut out[1..],
        DataType::F32,
        ReduceOp::SUM,
    )
    .unwrap();
    for i in 0..count {
        let got = f32::from_le_bytes(out[1 + 4 * i..5 + 4 * i].try_into().unwrap());
        let want: f32 = (0..WORLD).map(|r| value(r, i)).sum();
        assert_eq!(got, want, "rank {rank}: element {i} of the sum");
    }
    let mut max = vec![0u8; count * 4];
    multicast::load_reduce(base.0 + f_at as u64, &mut max, DataType::F32, ReduceOp::MAX).unwrap();
    for i in 0..count {
        let got = f32::from_le_bytes(max[4 * i..4 * i + 4].try_into().unwrap());
        let want = (0..WORLD).map(|r| value(r, i)).fold(f32::MIN, f32::max);
        assert_eq!(got, want, "rank {rank}: element {i} of the max");
    }
    links.barrier(4);

    // Once rank 1 unbinds, accesses fail naming its lane (lanes are claimed in arrival order,
    // so only "a lane" is known: the one rank 1 claimed).
    if rank == 1 {
        h.mc_unbind(mc, 0, mc_bytes).unwrap();
        expect_status(h.mc_unbind(mc, 0, mc_bytes), Status::INVALID_ARGUMENT);
    }
    links.barrier(5);
    let m = invalid(multicast::store(base.0, &[1, 2, 3]), |e| e.status());
    assert!(m.contains("not bound") && m.contains("of the 3"), "{m}");
    links.barrier(6);

    // Teardown, in reverse, everywhere.
    h.mc_unmap(base, mc_bytes).unwrap();
    let m = invalid(multicast::store(base.0, &[1]), |e| e.status());
    assert!(m.contains("not inside a multicast mapping"), "{m}");
    if rank != 1 {
        h.mc_unbind(mc, 0, mc_bytes).unwrap();
    }
    h.mc_release(mc).unwrap();
    expect_status(h.mc_release(mc), Status::INVALID_HANDLE);
    h.unmap_local(local, alloc_bytes);
    h.vmm_release(v);
    links.barrier(7);
    if rank == 0 {
        assert_eq!(
            segments_of_job(&job),
            Vec::<String>::new(),
            "segments left after every rank released everything"
        );
    }
    links.barrier(8);
    println!("RANK DONE");
}

// ---------------------------------------------------------------------------------------------
// In one process.

#[test]
fn errors_in_one_process() {
    let h = host();
    let caps = h.dev.properties(0).unwrap().capabilities;
    assert!(caps.contains(Capabilities::MULTICAST), "{caps:?}");
    assert_eq!(h.mc_supported(), 1);
    let g = h.granularity();

    // Outside every multicast mapping.
    let local = [0u8; 8];
    let m = invalid(multicast::store(local.as_ptr() as u64, &[1]), |e| {
        e.status()
    });
    assert!(m.contains("not inside a multicast mapping"), "{m}");
    expect_status(h.mc_create(0, 2), Status::INVALID_ARGUMENT);
    expect_status(h.mc_create(g, 0), Status::INVALID_ARGUMENT);

    // Two lanes; the first handle and an import each add a device, a third import cannot.
    let mc = h.mc_create(g, 2).unwrap();
    let fd = h.mc_export_fd(mc);
    let peer = h.mc_import_fd(fd.as_raw_fd(), g).unwrap();
    let extra = h.mc_import_fd(fd.as_raw_fd(), g).unwrap();
    drop(fd);
    h.mc_add_device(mc).unwrap();
    let m = expect_status(h.mc_add_device(mc), Status::INVALID_ARGUMENT);
    assert!(m.contains("already added"), "{m}");
    h.mc_add_device(peer).unwrap();
    let m = expect_status(h.mc_add_device(extra), Status::INVALID_ARGUMENT);
    assert!(m.contains("all 2 devices"), "{m}");
    h.mc_release(extra).unwrap();

    let (a, b) = (h.vmm_alloc(g), h.vmm_alloc(2 * g));
    h.mc_bind(mc, 0, a, 0, g);
    let base = h.mc_map(mc, g);
    // Lane 1 (the import's) is not bound yet.
    let m = invalid(multicast::store(base.0, &[1, 2, 3, 4]), |e| e.status());
    assert!(
        m.contains("lane(s) 1 of the 2") && m.contains("not bound"),
        "{m}"
    );
    h.mc_bind(peer, 0, b, g, g);

    // Both bound: a store reaches both allocations, a reduce-load sums them.
    let ones: Vec<u8> = (0..g / 4).flat_map(|_| 1i32.to_le_bytes()).collect();
    multicast::store(base.0, &ones).unwrap();
    let mut sum = vec![0u8; g];
    multicast::load_reduce(base.0, &mut sum, DataType::I32, ReduceOp::SUM).unwrap();
    assert!(sum
        .chunks_exact(4)
        .all(|c| i32::from_le_bytes(c.try_into().unwrap()) == 2));
    let (la, lb) = (h.map_local(a, g), h.map_local(b, 2 * g));
    // SAFETY: `la` maps `a` (`g` bytes), `lb` maps `b` (`2 * g` bytes).
    assert_eq!(unsafe { h.download(la, g) }, ones);
    // SAFETY: as above.
    assert_eq!(unsafe { h.download(DevicePtr(lb.0 + g as u64), g) }, ones);
    assert_eq!(
        // SAFETY: as above.
        unsafe { h.download(lb, g) },
        vec![0u8; g],
        "before mem_offset: untouched"
    );

    // Past the end, and a length that is not whole elements.
    let m = invalid(multicast::store(base.0 + g as u64 - 2, &[0; 4]), |e| {
        e.status()
    });
    assert!(m.contains("past the end"), "{m}");
    let mut odd = [0u8; 6];
    invalid(
        multicast::load_reduce(base.0, &mut odd, DataType::F32, ReduceOp::SUM),
        |e| e.status(),
    );

    // Teardown.
    expect_status(h.mc_unmap(base, 2 * g), Status::INVALID_ARGUMENT);
    h.mc_unmap(base, g).unwrap();
    expect_status(h.mc_unmap(base, g), Status::INVALID_HANDLE);
    expect_status(h.mc_unbind(mc, g, g), Status::INVALID_ARGUMENT);
    h.mc_unbind(mc, 0, g).unwrap();
    h.mc_unbind(peer, 0, g).unwrap();
    h.mc_release(peer).unwrap();
    h.mc_release(mc).unwrap();
    expect_status(h.mc_add_device(mc), Status::INVALID_HANDLE);
    h.unmap_local(la, g);
    h.unmap_local(lb, 2 * g);
    h.vmm_release(a);
    h.vmm_release(b);
}
