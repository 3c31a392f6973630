//! The graph group (`ferrocx_device_graph_v1`). Without a driver: its entries answer
//! `NOT_INITIALIZED` through the built-in table. With a GPU: a memset and a copy captured on a
//! stream run only at launch, twice; the null stream and an allocation during a capture are
//! refused, and the capture still ends.

use ferrocx::abi::{GraphHandle, Status, Stream};
use ferrocx::registry::Registry;
use ferrocx_adaptor_cuda::CudaDevice;
use ferrocx_plugin_sdk::abi::{DevicePtr, MemKind};
use ferrocx_plugin_sdk::{DeviceAdaptor, DeviceGraph, Options};

#[test]
fn the_builtin_exports_the_graph_group_which_needs_init() {
    ferrocx_adaptor_cuda::link();
    let r = Registry::with_builtins();
    let e = r.device("cuda").expect("the cuda built-in is registered");
    let g = e.device.as_ref().expect("device").graph.as_ref();
    let g = g.expect("ferrocx_device_graph_v1 is exported").get();
    if ferrocx_adaptor_cuda::is_present() {
        println!("skipped the uninitialised half: a CUDA driver is present");
        return;
    }
    let mut out = GraphHandle::NULL;
    // SAFETY: entries of the built-in table with a valid out-pointer; the adaptor is not
    // initialised (no driver here), so none of them touches a handle.
    let statuses = unsafe {
        [
            g.graph_begin_capture.expect("begin")(Stream::NULL),
            g.graph_end_capture.expect("end")(Stream::NULL, &mut out),
            g.graph_launch.expect("launch")(GraphHandle::NULL, Stream::NULL),
            g.graph_destroy.expect("destroy")(GraphHandle::NULL),
        ]
    };
    assert_eq!(statuses, [Status::NOT_INITIALIZED; 4]);
    assert!(out.is_null(), "nothing written on failure");
}

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

fn read(dev: &CudaDevice, p: DevicePtr, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    dev.mem_copy(DevicePtr(v.as_mut_ptr() as u64), p, n)
        .expect("device -> host");
    v
}

#[test]
fn a_captured_memset_and_copy_run_at_each_launch() {
    let Some(dev) = gpu() else { return };
    let n = (1 << 20) + 5;
    let a = dev.mem_alloc(n, MemKind::DEVICE).expect("alloc a");
    let b = dev.mem_alloc(n, MemKind::DEVICE).expect("alloc b");
    dev.mem_set(a, 0, n).expect("memset a");
    dev.mem_set(b, 0, n).expect("memset b");
    let s = dev.stream_create(1).expect("stream");

    dev.graph_begin_capture(s).expect("begin capture");
    dev.mem_set_async(a, 0x5A, n, s).expect("captured memset");
    dev.mem_copy_async(b, a, n, s).expect("captured copy");
    let g = dev.graph_end_capture(s).expect("end capture");
    assert!(!g.is_null());
    dev.stream_synchronize(s).expect("sync");
    // Captured work is recorded, not run.
    assert!(read(dev, b, n).iter().all(|&x| x == 0), "ran at capture");

    dev.graph_launch(g, s).expect("first launch");
    dev.stream_synchronize(s).expect("sync");
    assert!(read(dev, b, n).iter().all(|&x| x == 0x5A));
    // Each launch runs the whole graph again.
    dev.mem_set(a, 1, n).expect("memset a");
    dev.mem_set(b, 2, n).expect("memset b");
    dev.graph_launch(g, s).expect("second launch");
    dev.stream_synchronize(s).expect("sync");
    assert!(read(dev, a, n).iter().all(|&x| x == 0x5A));
    assert!(read(dev, b, n).iter().all(|&x| x == 0x5A));
    dev.graph_destroy(g).expect("destroy");

    // The legacy default stream cannot be captured.
    let err = dev
        .graph_begin_capture(Stream::NULL)
        .expect_err("null stream");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    assert!(err.message().contains("null"), "{err}");

    // Thread-local mode: an allocation (a call unsafe during a capture) on the capturing thread
    // is refused; the capture still ends, and the stream runs work again.
    dev.graph_begin_capture(s).expect("begin capture");
    if let Ok(p) = dev.mem_alloc(64, MemKind::DEVICE) {
        let _ = dev.graph_end_capture(s).map(|g| dev.graph_destroy(g));
        dev.mem_free(p, MemKind::DEVICE).expect("free");
        panic!("cuMemAlloc was allowed during a thread-local capture");
    }
    if let Ok(g) = dev.graph_end_capture(s) {
        dev.graph_destroy(g).expect("destroy");
    }
    dev.mem_set_async(b, 3, n, s)
        .expect("the stream runs work again");
    dev.stream_synchronize(s).expect("sync");
    assert!(read(dev, b, n).iter().all(|&x| x == 3));

    dev.stream_destroy(s).expect("stream destroy");
    dev.mem_free(a, MemKind::DEVICE).expect("free a");
    dev.mem_free(b, MemKind::DEVICE).expect("free b");
}
