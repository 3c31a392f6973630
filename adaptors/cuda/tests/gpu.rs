//! On a machine with an NVIDIA GPU: the adaptor against the real driver. Every test returns
//! early ("skipped: no CUDA driver") where no driver loads. Multicast is never touched.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use ferrocx_adaptor_cuda::CudaDevice;
use ferrocx_plugin_sdk::abi::{Capabilities, DevicePtr, MemKind, Status, Stream};
use ferrocx_plugin_sdk::{DeviceAdaptor, HostCall, Options};

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

/// Deterministic pseudo-random bytes (xorshift64).
fn random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
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
    let want = Capabilities::IPC
        | Capabilities::HOST_FUNC
        | Capabilities::STREAM_WRAP
        | Capabilities::TIMED_EVENTS;
    assert_eq!(
        p.capabilities, want,
        "VMM/flat map/multicast are not exported"
    );
    let err = dev.properties(n).expect_err("out of range");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    let err = dev.set_device(-1).expect_err("negative");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
}

#[test]
fn memory_round_trip_and_memset() {
    let Some(dev) = gpu() else { return };
    let n = (1 << 20) + 3;
    let mut src = random_bytes(n, 0x9e37_79b9_7f4a_7c15);
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
    assert_eq!(err.status(), Status::VENDOR_ERROR);
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
