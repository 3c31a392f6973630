//! On a machine with an NVIDIA GPU: the adaptor against the real driver. Every test returns
//! early ("skipped: no CUDA driver") where no driver loads.
//!
//! No multicast object is ever created: the multicast tests run their calls in a worker whose
//! environment sets a kill-switch (checked before the first call), with arguments the adaptor
//! refuses before any driver call even if the switch were ignored, and check the refusal.

mod common;

use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::random_bytes;
use cudarc::driver::sys::{CUresult, CUstream, CUstream_flags, Lib};
use ferrocx_adaptor_cuda::CudaDevice;
use ferrocx_plugin_sdk::abi::{
    Capabilities, DevicePtr, McHandle, MemKind, Status, Stream, VmmHandle,
};
use ferrocx_plugin_sdk::{
    DeviceAdaptor, DeviceFlatMap, DeviceMemOps, DeviceMulticast, DeviceVmm, HostCall, Options,
    WaitCondition,
};

/// The initialised adaptor with device 0 current on this thread, or `None` without a driver.
fn gpu() -> Option<&'static CudaDevice> {
    if !ferrocx_adaptor_cuda::is_present() {
        println!("skipped: no CUDA driver");
        return None;
    }
    let dev = CudaDevice::instance();
    dev.init(&Options::default()).expect("init");
    dev.set_device(0).expect("set_device(0)");
    Some(dev)
}

fn host_ptr(v: &mut [u8]) -> DevicePtr {
    DevicePtr(v.as_mut_ptr() as u64)
}

/// A pinned buffer read back as a slice.
fn pinned(p: DevicePtr, n: usize) -> &'static [u8] {
    // SAFETY: `p` is a live `cuMemAllocHost` allocation of `n` bytes, no copy in flight.
    unsafe { std::slice::from_raw_parts(p.0 as *const u8, n) }
}

#[test]
fn devices_and_properties() {
    let Some(dev) = gpu() else { return };
    let n = dev.device_count().expect("count");
    assert!(n >= 1, "{n} devices");
    assert_eq!(dev.get_device().expect("get_device"), 0);
    let p = dev.properties(0).expect("properties");
    println!("device 0: {p:?}");
    assert_eq!(p.vendor, "NVIDIA");
    assert!(!p.name.is_empty());
    assert!(p.total_memory > 0);
    assert!(p.arch >= 50, "arch {}", p.arch);
    assert_eq!(p.device_count, n);
    let always = Capabilities::IPC
        | Capabilities::HOST_FUNC
        | Capabilities::STREAM_WRAP
        | Capabilities::TIMED_EVENTS;
    assert!(p.capabilities.contains(always), "{:?}", p.capabilities);
    // VMM and flat map are reported exactly when the device has them.
    let vmm = dev.vmm_granularity(0);
    println!("VMM granularity of device 0: {vmm:?}");
    if let Err(e) = &vmm {
        assert_eq!(e.status(), Status::UNSUPPORTED, "{e}");
    }
    assert_eq!(p.capabilities.contains(Capabilities::VMM), vmm.is_ok());
    assert_eq!(p.capabilities.contains(Capabilities::FLAT_MAP), vmm.is_ok());
    // Multicast: what the hardware and driver offer (no object is created to find out).
    let mc = dev.mc_supported(0).expect("mc_supported");
    println!("multicast supported by device 0: {mc}");
    assert_eq!(p.capabilities.contains(Capabilities::MULTICAST), mc);
    let known = always | Capabilities::VMM | Capabilities::FLAT_MAP | Capabilities::MULTICAST;
    assert_eq!(p.capabilities.0 & !known.0, 0, "{:?}", p.capabilities);
    let err = dev.properties(n).expect_err("out of range");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    let err = dev.set_device(-1).expect_err("negative");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
}

#[test]
fn memory_round_trip_and_memset() {
    let Some(dev) = gpu() else { return };
    let n = (1 << 20) + 3;
    let mut src = random_bytes(0x9e37_79b9_7f4a_7c15, n);
    let a = dev.mem_alloc(n, MemKind::DEVICE).expect("alloc a");
    let b = dev.mem_alloc(n, MemKind::DEVICE).expect("alloc b");
    dev.mem_copy(a, host_ptr(&mut src), n)
        .expect("host -> device");
    dev.mem_copy(b, a, n).expect("device -> device");
    let mut back = vec![0u8; n];
    dev.mem_copy(host_ptr(&mut back), b, n)
        .expect("device -> host");
    assert!(back == src, "round trip differs");

    // memset the middle, leave both ends.
    dev.mem_set(DevicePtr(b.0 + 7), 0xA5, n - 14)
        .expect("memset");
    dev.mem_copy(host_ptr(&mut back), b, n).expect("read back");
    assert_eq!(back[..7], src[..7]);
    assert!(back[7..n - 7].iter().all(|&x| x == 0xA5));
    assert_eq!(back[n - 7..], src[n - 7..]);

    // HOST allocations are plain memory; a wrong free is refused.
    let h = dev.mem_alloc(64, MemKind::HOST).expect("host alloc");
    dev.mem_copy(h, a, 64).expect("device -> malloc'd host");
    // SAFETY: a live 64-byte allocation, the copy is complete.
    let got = unsafe { std::slice::from_raw_parts(h.0 as *const u8, 64) };
    assert_eq!(got, &src[..64]);
    dev.mem_free(h, MemKind::HOST).expect("host free");
    let err = dev.mem_free(h, MemKind::HOST).expect_err("double free");
    assert_eq!(err.status(), Status::INVALID_HANDLE);

    dev.mem_free(a, MemKind::DEVICE).expect("free a");
    dev.mem_free(b, MemKind::DEVICE).expect("free b");
    let err = dev
        .mem_alloc(1 << 60, MemKind::DEVICE)
        .expect_err("too big");
    assert_eq!(err.status(), Status::OUT_OF_MEMORY, "{err}");
    assert!(err
        .message()
        .contains("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2)"));
}

#[test]
fn async_copy_is_ordered_after_async_memset_on_one_stream() {
    let Some(dev) = gpu() else { return };
    let n = (1 << 20) + 3;
    let s = dev.stream_create(1).expect("stream");
    let d = dev.mem_alloc(n, MemKind::DEVICE).expect("alloc");
    let h = dev.mem_alloc(n, MemKind::PINNED).expect("pinned");
    dev.mem_set(h, 0, n).expect("clear pinned");
    dev.mem_set_async(d, 0x3C, n, s).expect("memset async");
    dev.mem_copy_async(h, d, n, s).expect("copy async");
    dev.stream_synchronize(s).expect("sync");
    assert!(dev.stream_query(s).expect("query"), "idle after sync");
    assert!(pinned(h, n).iter().all(|&x| x == 0x3C));
    // Wrapping is the identity, and destroying a wrapper leaves the stream alone.
    let w = dev.stream_wrap(s.0).expect("wrap");
    assert_eq!(w, s);
    dev.stream_destroy(Stream::NULL)
        .expect("the default stream is not ours to destroy");
    dev.mem_free(h, MemKind::PINNED).expect("free pinned");
    dev.mem_free(d, MemKind::DEVICE).expect("free");
    dev.stream_destroy(s).expect("destroy");
}

#[test]
fn an_event_orders_two_streams_without_the_host() {
    let Some(dev) = gpu() else { return };
    let big = 256 << 20;
    let n = (1 << 20) + 3;
    let (a, b) = (
        dev.stream_create(1).expect("a"),
        dev.stream_create(1).expect("b"),
    );
    let scratch = dev.mem_alloc(big, MemKind::DEVICE).expect("scratch");
    let x = dev.mem_alloc(n, MemKind::DEVICE).expect("x");
    let y = dev.mem_alloc(n, MemKind::PINNED).expect("y");
    dev.mem_set(x, 0, n).expect("clear x");
    dev.mem_set(y, 0, n).expect("clear y");
    let ev = dev.event_create(1).expect("event");
    // A long chain on A, then the value B must see.
    for i in 0..64u8 {
        dev.mem_set_async(scratch, i, big, a).expect("chain");
    }
    dev.mem_set_async(x, 0x77, n, a).expect("last memset");
    dev.event_record(ev, a).expect("record");
    dev.stream_wait_event(b, ev).expect("wait");
    dev.mem_copy_async(y, x, n, b).expect("copy on b");
    dev.stream_synchronize(b).expect("sync b only");
    assert!(
        pinned(y, n).iter().all(|&v| v == 0x77),
        "B ran before A's record"
    );
    assert!(dev.event_query(ev).expect("query"));
    dev.stream_synchronize(a).expect("sync a");
    dev.event_destroy(ev).expect("destroy event");
    for p in [scratch, x] {
        dev.mem_free(p, MemKind::DEVICE).expect("free");
    }
    dev.mem_free(y, MemKind::PINNED).expect("free pinned");
    dev.stream_destroy(a).expect("destroy a");
    dev.stream_destroy(b).expect("destroy b");
}

#[test]
fn stream_memops_order_a_stream_after_a_host_written_word_and_signal_the_host() {
    let Some(dev) = gpu() else { return };
    let n = (1 << 20) + 5;
    let s = dev.stream_create(1).expect("stream");
    let words = dev.mem_alloc(4096, MemKind::PINNED).expect("pinned words");
    let x = dev.mem_alloc(n, MemKind::DEVICE).expect("x");
    let y = dev.mem_alloc(n, MemKind::PINNED).expect("y");
    dev.mem_set(y, 0, n).expect("clear y");
    // SAFETY: a live pinned allocation of 4096 bytes; the words are only touched atomically.
    let (gate, done) = unsafe {
        (
            &*(words.0 as *const AtomicU32),
            &*((words.0 + 64) as *const AtomicU32),
        )
    };
    gate.store(0, Ordering::SeqCst);
    done.store(0, Ordering::SeqCst);
    // The stream waits for the host's word (GEQ 7), fills x, copies it to y, then signals 9.
    // SAFETY: the words stay allocated until the stream is synchronized below.
    unsafe {
        dev.stream_wait_value32(s, gate.as_ptr(), 7, WaitCondition::Geq)
            .expect("wait");
    }
    dev.mem_set_async(x, 0x5a, n, s).expect("memset");
    dev.mem_copy_async(y, x, n, s).expect("copy");
    // SAFETY: as above.
    unsafe { dev.stream_write_value32(s, done.as_ptr(), 9) }.expect("write");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        done.load(Ordering::Acquire),
        0,
        "the stream went past its wait"
    );
    assert!(
        pinned(y, n).iter().all(|&v| v == 0),
        "work ran before the wait"
    );
    gate.store(6, Ordering::Release);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(done.load(Ordering::Acquire), 0, "6 is not >= 7");
    gate.store(8, Ordering::Release);
    let start = std::time::Instant::now();
    while done.load(Ordering::Acquire) != 9 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no signal from the stream"
        );
        std::hint::spin_loop();
    }
    // The signal comes after the copy: its bytes are in place when the host sees it.
    assert!(
        pinned(y, n).iter().all(|&v| v == 0x5a),
        "signal before the copy"
    );
    dev.stream_synchronize(s).expect("sync");
    dev.mem_free(x, MemKind::DEVICE).expect("free x");
    for p in [y, words] {
        dev.mem_free(p, MemKind::PINNED).expect("free pinned");
    }
    dev.stream_destroy(s).expect("destroy");
}

#[test]
fn timed_events_measure_a_non_negative_time() {
    let Some(dev) = gpu() else { return };
    let s = dev.stream_create(1).expect("stream");
    let (e0, e1) = (
        dev.event_create(0).expect("e0"),
        dev.event_create(0).expect("e1"),
    );
    let d = dev.mem_alloc(64 << 20, MemKind::DEVICE).expect("alloc");
    dev.event_record(e0, s).expect("record e0");
    dev.mem_set_async(d, 1, 64 << 20, s).expect("memset");
    dev.event_record(e1, s).expect("record e1");
    dev.event_synchronize(e1).expect("sync e1");
    let ms = dev.event_elapsed_ms(e0, e1).expect("elapsed");
    assert!(ms >= 0.0, "{ms} ms");
    // An event without timing refuses to measure, with the driver's name for it.
    let untimed = dev.event_create(1).expect("untimed");
    dev.event_record(untimed, s).expect("record");
    dev.event_synchronize(untimed).expect("sync");
    let err = dev.event_elapsed_ms(e0, untimed).expect_err("no timing");
    // The driver answers CUDA_ERROR_INVALID_HANDLE, which keeps its meaning.
    assert_eq!(err.status(), Status::INVALID_HANDLE, "{err}");
    assert!(
        err.message()
            .starts_with("cuEventElapsedTime failed: CUDA_ERROR_"),
        "{err}"
    );
    for e in [e0, e1, untimed] {
        dev.event_destroy(e).expect("destroy");
    }
    dev.mem_free(d, MemKind::DEVICE).expect("free");
    dev.stream_destroy(s).expect("destroy");
}

struct Seen {
    buf: u64,
    first: AtomicU32,
}

unsafe extern "C" fn read_first_byte(user: *mut c_void) {
    // SAFETY: `user` is the `Seen` the test keeps alive until the stream is synchronised.
    let seen = unsafe { &*(user as *const Seen) };
    // SAFETY: `buf` is pinned memory the preceding copy on this stream has completed.
    let v = unsafe { *(seen.buf as *const u8) };
    seen.first.store(u32::from(v) + 1, Ordering::SeqCst);
}

#[test]
fn a_host_function_runs_in_stream_order() {
    let Some(dev) = gpu() else { return };
    let n = 16 << 20;
    let s = dev.stream_create(1).expect("stream");
    let d = dev.mem_alloc(n, MemKind::DEVICE).expect("alloc");
    let h = dev.mem_alloc(n, MemKind::PINNED).expect("pinned");
    dev.mem_set(h, 0, n).expect("clear");
    let seen = Box::new(Seen {
        buf: h.0,
        first: AtomicU32::new(0),
    });
    dev.mem_set_async(d, 0xC3, n, s).expect("memset");
    dev.mem_copy_async(h, d, n, s).expect("copy");
    let user = &*seen as *const Seen as *mut c_void;
    dev.launch_host_func(s, HostCall::new(read_first_byte, user))
        .expect("launch");
    dev.stream_synchronize(s).expect("sync");
    assert_eq!(seen.first.load(Ordering::SeqCst), 0xC3 + 1);
    dev.mem_free(h, MemKind::PINNED).expect("free pinned");
    dev.mem_free(d, MemKind::DEVICE).expect("free");
    dev.stream_destroy(s).expect("destroy");
}

#[test]
fn ipc_export_works_and_import_into_the_same_process_is_refused() {
    let Some(dev) = gpu() else { return };
    let d = dev.mem_alloc(1 << 20, MemKind::DEVICE).expect("alloc");
    let handle = dev.ipc_export(d).expect("export");
    assert_eq!(handle.len(), ferrocx_adaptor_cuda::IPC_HANDLE_BYTES);
    let err = dev.ipc_import(&handle[..10]).expect_err("short handle");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    // CUDA refuses to open a handle in the process that exported it.
    let err = dev.ipc_import(&handle).expect_err("same process");
    println!("same-process import: {err}");
    assert_eq!(err.status(), Status::VENDOR_ERROR);
    assert!(
        err.message()
            .starts_with("cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_CONTEXT (201)"),
        "{err}"
    );
    dev.mem_free(d, MemKind::DEVICE).expect("free");
}

#[test]
fn mem_get_info_reports_free_at_most_total() {
    let Some(dev) = gpu() else { return };
    let info = dev.mem_get_info().expect("mem_get_info");
    assert!(info.total > 0 && info.free <= info.total, "{info:?}");
    let p = dev.properties(0).expect("properties");
    assert!(
        info.total as u64 <= p.total_memory,
        "{info:?} vs {}",
        p.total_memory
    );
}

/// The VMM granularity of `device`, or `None` (with a note) where the device has no VMM.
fn vmm_granularity(dev: &CudaDevice, device: i32) -> Option<usize> {
    match dev.vmm_granularity(device) {
        Ok(g) => Some(g),
        Err(e) => {
            assert_eq!(e.status(), Status::UNSUPPORTED, "{e}");
            println!("skipped: device {device} has no VMM: {e}");
            None
        }
    }
}

/// Takes ownership of a descriptor the adaptor handed out.
fn owned(fd: i32) -> OwnedFd {
    assert!(fd >= 0, "descriptor {fd}");
    // SAFETY: the ABI makes an exported descriptor the caller's; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn at(base: DevicePtr, index: usize, size: usize) -> DevicePtr {
    DevicePtr(base.0 + (index * size) as u64)
}

#[test]
fn vmm_allocation_and_its_import_at_two_slots_of_one_range() {
    let Some(dev) = gpu() else { return };
    let Some(g) = vmm_granularity(dev, 0) else {
        return;
    };
    assert!(g.is_power_of_two(), "granularity {g}");
    let st = |e: ferrocx_plugin_sdk::Error| e.status();
    assert_eq!(st(dev.vmm_alloc(0).unwrap_err()), Status::INVALID_ARGUMENT);
    assert_eq!(
        st(dev.vmm_import_fd(-1, g).unwrap_err()),
        Status::INVALID_ARGUMENT
    );

    // One byte asks for a whole granule.
    let a = dev.vmm_alloc(1).expect("vmm_alloc");
    let fd = owned(dev.vmm_export_fd(a).expect("vmm_export_fd"));
    let b = dev
        .vmm_import_fd(fd.as_raw_fd(), g)
        .expect("import into the exporting process");
    drop(fd);

    // 3 granules and a byte reserve 4.
    let base = dev.flat_reserve(3 * g + 1).expect("flat_reserve");
    assert_eq!(base.0 % g as u64, 0, "aligned to the granularity");
    dev.flat_map(base, 0, g, a)
        .expect("map the allocation at slot 0");
    dev.flat_map(base, 1, g, b)
        .expect("map its import at slot 1");

    // Bad slots never reach the driver.
    let refused = |r: ferrocx_plugin_sdk::Result<()>| r.expect_err("refused").status();
    assert_eq!(
        refused(dev.flat_map(base, 1, g, a)),
        Status::INVALID_ARGUMENT
    );
    assert_eq!(
        refused(dev.flat_map(base, 4, g, a)),
        Status::INVALID_ARGUMENT
    );
    assert_eq!(
        refused(dev.flat_map(base, 2, g + 1, a)),
        Status::INVALID_ARGUMENT
    );
    assert_eq!(
        refused(dev.flat_map(base, 1, 2 * g, a)),
        Status::INVALID_ARGUMENT,
        "a slot larger than the allocation"
    );
    assert_eq!(
        refused(dev.flat_map(base, 2, g, VmmHandle(u64::MAX))),
        Status::INVALID_HANDLE
    );
    assert_eq!(
        refused(dev.flat_map(DevicePtr(8), 0, g, a)),
        Status::INVALID_HANDLE
    );

    // One memory at two addresses: written through one slot, read through the other.
    let first = random_bytes(0xF1A7, g);
    let mut seen = vec![0u8; g];
    dev.mem_copy(at(base, 0, g), DevicePtr(first.as_ptr() as u64), g)
        .expect("write slot 0");
    dev.mem_copy(host_ptr(&mut seen), at(base, 1, g), g)
        .expect("read slot 1");
    assert!(seen == first, "slot 1 does not show what slot 0 wrote");
    dev.mem_set(at(base, 1, g), 0x3D, 4096)
        .expect("memset slot 1");
    dev.mem_copy(host_ptr(&mut seen), at(base, 0, g), g)
        .expect("read slot 0");
    assert!(seen[..4096].iter().all(|&x| x == 0x3D));
    assert_eq!(seen[4096..], first[4096..]);

    let e = dev
        .flat_release(base, 4 * g)
        .expect_err("slots still mapped");
    assert!(e.message().contains("2 mapped slot"), "{e}");
    dev.flat_unmap(base, 1, g).expect("unmap slot 1");
    assert_eq!(
        refused(dev.flat_unmap(base, 1, g)),
        Status::INVALID_ARGUMENT
    );
    dev.flat_unmap(base, 0, g).expect("unmap slot 0");
    assert_eq!(
        refused(dev.flat_release(base, 2 * g)),
        Status::INVALID_ARGUMENT
    );
    dev.flat_release(base, 3 * g + 1).expect("flat_release");
    assert_eq!(
        refused(dev.flat_release(base, 4 * g)),
        Status::INVALID_HANDLE
    );

    dev.vmm_release(b).expect("release the import");
    dev.vmm_release(a).expect("release the allocation");
    assert_eq!(refused(dev.vmm_release(a)), Status::INVALID_HANDLE);
    assert_eq!(
        st(dev.vmm_export_fd(a).unwrap_err()),
        Status::INVALID_HANDLE
    );
}

const FLAT_WORKER: &str = "vmm_flat_map_worker";

/// The data rank `r` writes into its own allocation.
fn rank_pattern(r: usize, n: usize) -> Vec<u8> {
    random_bytes(0x5EED_0000 + r as u64, n)
}

/// One of the two processes of [`vmm_and_flat_map_across_two_processes`]: rank `r` (on device
/// `r % count`) allocates, exports its descriptor to the peer over the socket and imports the
/// peer's, maps both into one range (rank `i` at `base + i * size`), writes its pattern into
/// its own allocation, and reads the peer's data through the peer's slot; then writes into
/// the peer's allocation through that slot and finds the peer's write in its own.
#[test]
fn vmm_flat_map_worker() {
    if !common::is_worker(FLAT_WORKER) {
        return;
    }
    let rank: usize = std::env::var("FERROCX_TEST_RANK")
        .expect("FERROCX_TEST_RANK")
        .parse()
        .expect("a rank");
    let path = PathBuf::from(std::env::var_os("FERROCX_TEST_SOCKET").expect("FERROCX_TEST_SOCKET"));
    let peer = 1 - rank;
    let dev = gpu().expect("the parent found a driver");
    let d = (rank as i32) % dev.device_count().expect("count");
    dev.set_device(d).expect("set_device");
    let g = dev.vmm_granularity(d).expect("the parent checked VMM");
    let size = 2 * g;

    let mine = dev.vmm_alloc(size).expect("vmm_alloc");
    let mut sock = common::connect(&path, rank);
    let fd = owned(dev.vmm_export_fd(mine).expect("vmm_export_fd"));
    common::fds::send_fds(&sock, &[fd.as_raw_fd()]);
    let theirs_fd = common::fds::recv_fds(&sock, 1)
        .pop()
        .expect("one descriptor");
    drop(fd);
    let theirs = dev
        .vmm_import_fd(theirs_fd.as_raw_fd(), size)
        .expect("import the peer's allocation");
    drop(theirs_fd);

    let base = dev.flat_reserve(2 * size).expect("flat_reserve");
    dev.flat_map(base, rank, size, mine).expect("map mine");
    dev.flat_map(base, peer, size, theirs)
        .expect("map the peer's");

    let own = rank_pattern(rank, size);
    dev.mem_copy(at(base, rank, size), DevicePtr(own.as_ptr() as u64), size)
        .expect("write my pattern into my allocation");
    common::barrier(&mut sock);

    let mut seen = vec![0u8; size];
    dev.mem_copy(host_ptr(&mut seen), at(base, peer, size), size)
        .expect("read the peer's slot");
    let want = rank_pattern(peer, size);
    let wrong = seen.iter().zip(&want).filter(|(a, b)| a != b).count();
    assert_eq!(
        wrong, 0,
        "rank {rank}: {wrong} of {size} bytes of rank {peer}'s data differ"
    );
    dev.mem_copy(host_ptr(&mut seen), at(base, rank, size), size)
        .expect("read my slot");
    assert!(seen == own, "rank {rank}: my own slot changed");
    common::barrier(&mut sock);

    // Read/write access: each writes the head of the other's allocation.
    let head = 64 << 10;
    dev.mem_set(at(base, peer, size), 0xA0 + rank as u8, head)
        .expect("write into the peer's allocation");
    common::barrier(&mut sock);
    dev.mem_copy(host_ptr(&mut seen), at(base, rank, size), size)
        .expect("read my slot again");
    assert!(
        seen[..head].iter().all(|&x| x == 0xA0 + peer as u8),
        "rank {rank}: the peer's write is not in my allocation"
    );
    assert_eq!(seen[head..], own[head..], "rank {rank}: past the head");
    common::barrier(&mut sock);

    dev.flat_unmap(base, peer, size).expect("unmap the peer's");
    dev.flat_unmap(base, rank, size).expect("unmap mine");
    dev.flat_release(base, 2 * size).expect("flat_release");
    dev.vmm_release(theirs).expect("release the import");
    dev.vmm_release(mine).expect("release mine");
    common::barrier(&mut sock);
    println!("rank {rank} on device {d}: read rank {peer}'s {size} bytes through the flat range");
}

#[test]
fn vmm_and_flat_map_across_two_processes() {
    if common::is_worker(FLAT_WORKER) {
        return;
    }
    let Some(dev) = gpu() else { return };
    let n = dev.device_count().expect("count");
    for d in [0, 1 % n] {
        if vmm_granularity(dev, d).is_none() {
            return;
        }
    }
    let path = std::env::temp_dir().join(format!("ferrocx-cuda-flat-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let workers: Vec<common::Worker<'_>> = (0..2)
        .map(|r| common::Worker {
            set: vec![
                ("FERROCX_TEST_RANK", r.to_string()),
                ("FERROCX_TEST_SOCKET", path.display().to_string()),
            ],
            unset: vec![],
        })
        .collect();
    let outs = common::run_workers(FLAT_WORKER, &workers, Duration::from_secs(180));
    let _ = std::fs::remove_file(&path);
    let named: Vec<_> = outs
        .into_iter()
        .enumerate()
        .map(|(r, out)| (format!("rank {r} (device {})", r as i32 % n), out))
        .collect();
    common::assert_all_succeeded(&named);
}

#[test]
fn a_wrapped_external_stream_is_used_and_left_alive() {
    let Some(dev) = gpu() else { return };
    // Another library's view of the driver (the adaptor's `dlopen` of it is shared).
    // SAFETY: opening the system's CUDA driver, which this process already loaded.
    let lib = unsafe { Lib::new("libcuda.so.1") }.expect("libcuda.so.1");
    let ok = CUresult::CUDA_SUCCESS;
    let mut raw: CUstream = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; device 0's primary context is current on this thread.
    let r =
        unsafe { (lib.cuStreamCreate)(&mut raw, CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
    assert_eq!(r, ok, "cuStreamCreate");
    let s = dev.stream_wrap(raw.cast()).expect("stream_wrap");
    assert_eq!(
        s.0,
        raw.cast::<c_void>(),
        "the wrapper is the CUstream itself"
    );

    let n = (4 << 20) + 5;
    let d = dev.mem_alloc(n, MemKind::DEVICE).expect("alloc");
    let h = dev.mem_alloc(n, MemKind::PINNED).expect("pinned");
    dev.mem_set(h, 0, n).expect("clear");
    dev.mem_set_async(d, 0x5A, n, s)
        .expect("memset on the wrapped stream");
    dev.mem_copy_async(h, d, n, s)
        .expect("copy on the wrapped stream");
    dev.stream_synchronize(s).expect("sync the wrapped stream");
    assert!(dev.stream_query(s).expect("query"));
    assert!(pinned(h, n).iter().all(|&x| x == 0x5A));

    dev.stream_destroy(s).expect("destroying a wrapper");
    // The native stream is still its owner's: it takes work and completes it.
    // SAFETY: live device and pinned allocations of `n` bytes and a live stream.
    unsafe {
        assert_eq!((lib.cuMemsetD8Async)(d.0, 0x6B, n, raw), ok, "memset");
        assert_eq!((lib.cuMemcpyAsync)(h.0, d.0, n, raw), ok, "copy");
        assert_eq!((lib.cuStreamSynchronize)(raw), ok, "sync");
    }
    assert!(pinned(h, n).iter().all(|&x| x == 0x6B));
    // And it can be wrapped again.
    let again = dev.stream_wrap(raw.cast()).expect("wrap again");
    dev.mem_set_async(d, 0x7C, n, again).expect("memset");
    dev.mem_copy_async(h, d, n, again).expect("copy");
    dev.stream_synchronize(again).expect("sync");
    assert!(pinned(h, n).iter().all(|&x| x == 0x7C));
    dev.stream_destroy(again)
        .expect("destroy the second wrapper");

    dev.mem_free(h, MemKind::PINNED).expect("free pinned");
    dev.mem_free(d, MemKind::DEVICE).expect("free");
    assert_eq!(
        // SAFETY: the stream this test created, idle, destroyed once.
        unsafe { (lib.cuStreamDestroy_v2)(raw) },
        ok,
        "cuStreamDestroy"
    );
}

const MC_WORKER: &str = "multicast_refusal_worker";

/// In a worker whose environment sets a kill-switch: every multicast entry that could create
/// or join an object is refused with `UNSUPPORTED` naming the switch. The arguments are ones the
/// adaptor refuses before any driver call anyway (0 bytes, descriptor -1, unknown handles), so
/// even an adaptor that ignored the switch could not create an object here.
#[test]
fn multicast_refusal_worker() {
    if !common::is_worker(MC_WORKER) {
        return;
    }
    // Refuse to go on unless a switch is in the environment, read here without the adaptor.
    let raw = |v: &str| std::env::var(v).unwrap_or_default();
    assert!(
        raw("NCCL_NVLS_ENABLE") == "0" || raw("FERROCX_MULTICAST") == "0",
        "the worker must run with NCCL_NVLS_ENABLE=0 or FERROCX_MULTICAST=0"
    );
    let expect = raw("FERROCX_TEST_EXPECT");
    let dev = gpu().expect("the parent found a driver");
    let switch = ferrocx_adaptor_cuda::multicast::kill_switch().expect("a kill-switch");
    assert!(switch.contains(&expect), "{switch}");
    let results = [
        ("mc_create", dev.mc_create(0, 1).map(drop)),
        ("mc_import_fd", dev.mc_import_fd(-1, 0).map(drop)),
        ("mc_add_device", dev.mc_add_device(McHandle(u64::MAX), 0)),
        (
            "mc_bind",
            dev.mc_bind(McHandle(u64::MAX), 0, VmmHandle(u64::MAX), 0, 0),
        ),
        ("mc_map", dev.mc_map(McHandle(u64::MAX), 0).map(drop)),
    ];
    for (entry, r) in results {
        let e = r.expect_err(entry);
        assert_eq!(e.status(), Status::UNSUPPORTED, "{entry}: {e}");
        assert!(e.message().contains(&expect), "{entry}: {e}");
    }
    println!("refused: {switch}");
}

#[test]
fn multicast_is_refused_on_a_gpu_while_a_kill_switch_is_set() {
    if common::is_worker(MC_WORKER) {
        return;
    }
    let Some(_) = gpu() else { return };
    let cases = [
        (
            vec![("NCCL_NVLS_ENABLE", "0")],
            "disabled by NCCL_NVLS_ENABLE=0",
        ),
        (
            vec![("FERROCX_MULTICAST", "0")],
            "disabled by FERROCX_MULTICAST=0",
        ),
        (
            vec![("FERROCX_MULTICAST", "0"), ("NCCL_NVLS_ENABLE", "0")],
            "disabled by NCCL_NVLS_ENABLE=0",
        ),
    ];
    let workers: Vec<common::Worker<'_>> = cases
        .iter()
        .map(|(vars, expect)| {
            let mut set: Vec<(&str, String)> =
                vars.iter().map(|&(k, v)| (k, v.to_string())).collect();
            set.push(("FERROCX_TEST_EXPECT", expect.to_string()));
            common::Worker {
                set,
                unset: vec!["NCCL_NVLS_ENABLE", "FERROCX_MULTICAST"],
            }
        })
        .collect();
    let outs = common::run_workers(MC_WORKER, &workers, Duration::from_secs(120));
    let named: Vec<_> = cases
        .iter()
        .zip(outs)
        .map(|((vars, _), out)| (format!("{vars:?}"), out))
        .collect();
    common::assert_all_succeeded(&named);
}

/// The `ferrocx` command beside this test (`FERROCX_BIN`, else `../ferrocx` from the test
/// executable: `target/<profile>/ferrocx` under cargo, the bundle's top folder in
/// `gpu-bundle/tests/`).
fn ferrocx_cli() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FERROCX_BIN") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("ferrocx");
    p.is_file().then_some(p)
}

/// The lines of adaptor `name`'s block in `ferrocx info`'s text.
fn adaptor_block(info: &str, name: &str) -> Option<String> {
    let header = format!("  {name}  [");
    let mut lines = info.lines().skip_while(|l| !l.starts_with(&header));
    lines.next()?;
    Some(
        lines
            .take_while(|l| l.starts_with("    "))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

#[test]
fn ferrocx_info_reports_multicast_disabled_by_the_kill_switch() {
    let Some(_) = gpu() else { return };
    let Some(cli) = ferrocx_cli() else {
        println!("skipped: no ferrocx command beside the tests (set FERROCX_BIN)");
        return;
    };
    let cases = [
        (
            "NCCL_NVLS_ENABLE",
            "FERROCX_MULTICAST",
            "multicast: disabled by NCCL_NVLS_ENABLE=0",
        ),
        (
            "FERROCX_MULTICAST",
            "NCCL_NVLS_ENABLE",
            "multicast: disabled by FERROCX_MULTICAST=0",
        ),
    ];
    for (set, unset, expect) in cases {
        // `info` creates no multicast object and no communicator, whatever the switches say.
        let out = Command::new(&cli)
            .arg("info")
            .env_remove("FERROCX_CONFIG")
            .env_remove(unset)
            .env(set, "0")
            .output()
            .expect("run ferrocx info");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let Some(block) = adaptor_block(&text, "cuda") else {
            println!(
                "skipped: {} lists no cuda adaptor (built without --features cuda)",
                cli.display()
            );
            return;
        };
        println!("{set}=0:\n{block}");
        assert!(
            block.contains(expect),
            "{set}=0: expected {expect:?} in\n{block}"
        );
    }
}

#[test]
fn a_thread_that_never_chose_a_device_works_on_its_current_context() {
    let Some(dev) = gpu() else { return };
    let n = dev.device_count().expect("count");
    // The last device: on a machine of several GPUs not device 0, the default.
    let last = n - 1;
    std::thread::spawn(move || {
        // Another library (PyTorch's autograd thread, say) makes its device's primary context
        // current on a thread of its own; the adaptor is never told.
        // SAFETY: opening the system's CUDA driver, which this process already loaded.
        let lib = unsafe { Lib::new("libcuda.so.1") }.expect("libcuda.so.1");
        let ok = CUresult::CUDA_SUCCESS;
        let (mut cu, mut ctx) = (0, std::ptr::null_mut());
        // SAFETY: valid out-pointers; an ordinal below the device count.
        unsafe {
            assert_eq!((lib.cuDeviceGet)(&mut cu, last), ok);
            assert_eq!((lib.cuDevicePrimaryCtxRetain)(&mut ctx, cu), ok);
            assert_eq!((lib.cuCtxSetCurrent)(ctx), ok);
        }
        let mut raw: CUstream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current.
        let r = unsafe {
            (lib.cuStreamCreate)(&mut raw, CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        };
        assert_eq!(r, ok, "cuStreamCreate");
        assert_eq!(dev.get_device().expect("get_device"), last);
        // An event made by the adaptor on this thread belongs to that device: recorded on the
        // library's stream, and on the legacy stream of the thread's context.
        let s = dev.stream_wrap(raw.cast()).expect("stream_wrap");
        let e = dev.event_create(1).expect("event_create");
        dev.event_record(e, s)
            .expect("record on the library's stream");
        dev.stream_wait_event(Stream(std::ptr::null_mut()), e)
            .expect("the legacy stream waits for it");
        dev.event_record(e, Stream(std::ptr::null_mut()))
            .expect("record on the legacy stream");
        dev.event_synchronize(e).expect("event_synchronize");
        let mut still: cudarc::driver::sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { (lib.cuCtxGetCurrent)(&mut still) }, ok);
        assert_eq!(
            still, ctx,
            "the thread's context is left as the library set it"
        );
        dev.event_destroy(e).expect("event_destroy");
        // SAFETY: the stream made above, idle.
        assert_eq!(unsafe { (lib.cuStreamDestroy_v2)(raw) }, ok);
    })
    .join()
    .expect("the thread's checks");
}
