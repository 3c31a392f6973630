//! Without a CUDA driver: `init` fails with the reason, every other entry answers
//! `NOT_INITIALIZED` without panicking, through the built-in table and through the plugin `.so`;
//! the multicast entries that could create or join an object refuse first of all, naming the
//! kill-switch, while one is set.

mod common;

use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::time::Duration;

use ferrocx::abi::{
    DeviceAdaptorV1, DeviceProperties, DevicePtr, Event, FunctionHandle, ImageFormat, KernelLaunch,
    McHandle, MemKind, ModuleHandle, Status, Stream, VmmHandle,
};
use ferrocx::loader::{Checked, DeviceTables};
use ferrocx::registry::{Registry, Source};

/// Every table the adaptor exports, in the order `groups()` lists them.
const GROUPS: [&str; 7] = [
    "ferrocx_device_adaptor_v1",
    "ferrocx_device_vmm_v1",
    "ferrocx_device_flatmap_v1",
    "ferrocx_device_multicast_v1",
    "ferrocx_device_graph_v1",
    "ferrocx_device_kernel_v1",
    "ferrocx_device_memops_v1",
];

fn skip_on_gpu() -> bool {
    if ferrocx_adaptor_cuda::is_present() {
        println!("skipped: a CUDA driver is present (see tests/gpu.rs)");
        return true;
    }
    false
}

fn last_error(t: &DeviceAdaptorV1) -> String {
    let f = t.get_last_error.expect("get_last_error");
    // SAFETY: returns a NUL-terminated thread-local string, never null.
    unsafe { CStr::from_ptr(f()) }
        .to_string_lossy()
        .into_owned()
}

unsafe extern "C" fn never_called(_: *mut c_void) {
    panic!("a host function ran on an uninitialised adaptor");
}

/// `init` fails with `VENDOR_ERROR` naming libcuda; every other entry is `NOT_INITIALIZED`.
fn check_uninitialised(t: &DeviceAdaptorV1) {
    // SAFETY: every call below passes valid out-pointers and in-buffers, as the ABI requires.
    unsafe {
        let init = t.init.expect("init");
        assert_eq!(init(std::ptr::null(), 0), Status::VENDOR_ERROR);
        let msg = last_error(t);
        assert!(msg.contains("libcuda"), "{msg}");
        // A second try gives the same answer (the load is not retried, and nothing panics).
        assert_eq!(init(std::ptr::null(), 0), Status::VENDOR_ERROR);
        assert!(last_error(t).contains("libcuda"));

        let ni = Status::NOT_INITIALIZED;
        let (mut n, mut p, mut s, mut e, mut ms) =
            (0i32, DevicePtr::NULL, Stream::NULL, Event::NULL, 0f32);
        let mut props = DeviceProperties::default();
        let (a, b) = (DevicePtr(0x1000), DevicePtr(0x2000));
        let mut handle = [0u8; 64];
        let mut len = handle.len();
        let (mut free, mut total) = (0usize, 0usize);
        let results = [
            ("finalize", t.finalize.unwrap()()),
            ("device_count", t.device_count.unwrap()(&mut n)),
            ("set_device", t.set_device.unwrap()(0)),
            ("get_device", t.get_device.unwrap()(&mut n)),
            ("get_properties", t.get_properties.unwrap()(0, &mut props)),
            (
                "mem_alloc",
                t.mem_alloc.unwrap()(16, MemKind::DEVICE, &mut p),
            ),
            ("mem_free", t.mem_free.unwrap()(a, MemKind::DEVICE)),
            ("mem_copy", t.mem_copy.unwrap()(a, b, 16)),
            ("mem_copy_async", t.mem_copy_async.unwrap()(a, b, 16, s)),
            ("mem_set", t.mem_set.unwrap()(a, 1, 16)),
            ("mem_set_async", t.mem_set_async.unwrap()(a, 1, 16, s)),
            ("stream_create", t.stream_create.unwrap()(1, &mut s)),
            (
                "stream_wrap",
                t.stream_wrap.unwrap()(std::ptr::null_mut(), &mut s),
            ),
            ("stream_destroy", t.stream_destroy.unwrap()(s)),
            ("stream_synchronize", t.stream_synchronize.unwrap()(s)),
            ("stream_query", t.stream_query.unwrap()(s)),
            ("stream_wait_event", t.stream_wait_event.unwrap()(s, e)),
            ("event_create", t.event_create.unwrap()(0, &mut e)),
            ("event_destroy", t.event_destroy.unwrap()(e)),
            ("event_record", t.event_record.unwrap()(e, s)),
            ("event_synchronize", t.event_synchronize.unwrap()(e)),
            ("event_query", t.event_query.unwrap()(e)),
            (
                "event_elapsed_ms",
                t.event_elapsed_ms.unwrap()(e, e, &mut ms),
            ),
            (
                "launch_host_func",
                t.launch_host_func.unwrap()(s, Some(never_called), std::ptr::null_mut()),
            ),
            (
                "ipc_export",
                t.ipc_export.unwrap()(a, handle.as_mut_ptr(), &mut len),
            ),
            (
                "ipc_import",
                t.ipc_import.unwrap()(handle.as_ptr(), handle.len(), &mut p),
            ),
            ("ipc_close", t.ipc_close.unwrap()(a)),
            (
                "mem_get_info",
                t.mem_get_info.unwrap()(&mut free, &mut total),
            ),
        ];
        for (entry, status) in results {
            assert_eq!(status, ni, "{entry}: {}", last_error(t));
            let msg = last_error(t);
            assert!(msg.contains("not initialised"), "{entry}: {msg}");
        }
        // Nothing was written through the out-pointers.
        assert_eq!(
            (p, s, e, free, total),
            (DevicePtr::NULL, Stream::NULL, Event::NULL, 0, 0)
        );
    }
}

/// The VMM, flat-map and multicast entries that cannot create or join a multicast object
/// answer `NOT_INITIALIZED` too (the gated ones are checked under a kill-switch below).
fn check_groups_uninitialised(d: &DeviceTables) {
    let t = d.root.get();
    let vmm = d.vmm.as_ref().expect("VMM group").get();
    let flat = d.flatmap.as_ref().expect("flat-map group").get();
    let mc = d.multicast.as_ref().expect("multicast group").get();
    let kernel = d.kernel.as_ref().expect("kernel group").get();
    let memops = d.memops.as_ref().expect("memops group").get();
    let word = std::sync::atomic::AtomicU32::new(0);
    let (mut formats, mut module, mut function) =
        (0usize, ModuleHandle::NULL, FunctionHandle::NULL);
    let launch = KernelLaunch::default();
    let image = [0u8; 16];
    let (mut g, mut h, mut fd, mut base, mut yes) =
        (0usize, VmmHandle(0), -1i32, DevicePtr::NULL, -1i32);
    let (a, m) = (DevicePtr(0x20_0000), McHandle(1));
    // SAFETY: entries of a checked table with valid out-pointers; the adaptor is not
    // initialised, so none of them reaches the driver.
    let results = unsafe {
        [
            (
                "kernel_image_formats",
                kernel.kernel_image_formats.unwrap()(0, std::ptr::null_mut(), &mut formats),
            ),
            (
                "module_load",
                kernel.module_load.unwrap()(image.as_ptr(), 16, ImageFormat::CUBIN, &mut module),
            ),
            (
                "module_get_function",
                kernel.module_get_function.unwrap()(
                    ModuleHandle::NULL,
                    c"f".as_ptr(),
                    &mut function,
                ),
            ),
            (
                "launch_kernel",
                kernel.launch_kernel.unwrap()(FunctionHandle::NULL, &launch, Stream::NULL),
            ),
            (
                "module_unload",
                kernel.module_unload.unwrap()(ModuleHandle::NULL),
            ),
            ("vmm_granularity", vmm.vmm_granularity.unwrap()(0, &mut g)),
            ("vmm_alloc", vmm.vmm_alloc.unwrap()(1 << 21, &mut h)),
            (
                "vmm_export_fd",
                vmm.vmm_export_fd.unwrap()(VmmHandle(1), &mut fd),
            ),
            (
                "vmm_import_fd",
                vmm.vmm_import_fd.unwrap()(0, 1 << 21, &mut h),
            ),
            ("vmm_release", vmm.vmm_release.unwrap()(VmmHandle(1))),
            (
                "flat_reserve",
                flat.flat_reserve.unwrap()(1 << 22, &mut base),
            ),
            (
                "flat_map",
                flat.flat_map.unwrap()(a, 0, 1 << 21, VmmHandle(1)),
            ),
            ("flat_unmap", flat.flat_unmap.unwrap()(a, 0, 1 << 21)),
            ("flat_release", flat.flat_release.unwrap()(a, 1 << 22)),
            ("mc_supported", mc.mc_supported.unwrap()(0, &mut yes)),
            ("mc_export_fd", mc.mc_export_fd.unwrap()(m, &mut fd)),
            ("mc_unmap", mc.mc_unmap.unwrap()(a, 1 << 21)),
            ("mc_unbind", mc.mc_unbind.unwrap()(m, 0, 0, 1 << 21)),
            ("mc_release", mc.mc_release.unwrap()(m)),
            (
                "stream_write_value32",
                memops.stream_write_value32.unwrap()(Stream::NULL, word.as_ptr(), 1),
            ),
            (
                "stream_wait_value32",
                memops.stream_wait_value32.unwrap()(Stream::NULL, word.as_ptr(), 1, 0),
            ),
        ]
    };
    for (entry, status) in results {
        let msg = last_error(t);
        assert_eq!(status, Status::NOT_INITIALIZED, "{entry}: {msg}");
        assert!(msg.contains("not initialised"), "{entry}: {msg}");
    }
    assert_eq!(
        (g, h, fd, base, yes),
        (0, VmmHandle(0), -1, DevicePtr::NULL, -1)
    );
}

#[test]
fn builtin_init_fails_with_the_reason_and_the_rest_is_not_initialised() {
    if skip_on_gpu() {
        return;
    }
    ferrocx_adaptor_cuda::link();
    let r = Registry::with_builtins();
    let e = r.device("cuda").expect("the cuda built-in is registered");
    assert_eq!(e.source, Source::Builtin);
    assert_eq!(e.groups(), GROUPS);
    let d = e.device.as_ref().expect("device tables");
    assert!(d.root.absent().is_empty(), "{:?}", d.root.absent());
    check_uninitialised(d.root.get());
    check_groups_uninitialised(d);

    // The safe handle reports the same, as `ferrocx info` shows it.
    let err = e
        .device()
        .expect("device")
        .init(&[])
        .expect_err("no driver");
    assert_eq!(err.status(), Status::VENDOR_ERROR);
    assert!(err.to_string().contains("libcuda"), "{err}");
}

/// The plugin's path: cargo builds it as a dev-dependency, beside the test executable.
fn plugin_path() -> PathBuf {
    let name = ferrocx::registry::plugin_file_name("cuda");
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("executable has a directory");
    [dir.to_path_buf(), dir.join("deps"), dir.join("../deps")]
        .iter()
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not found beside {}", exe.display()))
}

#[test]
fn plugin_loads_abi_checked_and_answers_the_same() {
    if skip_on_gpu() {
        return;
    }
    let mut r = Registry::empty();
    let path = plugin_path();
    let e = r.add_plugin(&path).expect("the CUDA plugin loads");
    assert_eq!(e.name, "cuda");
    assert_eq!(e.source, Source::Plugin(path.clone()));
    assert_eq!(e.checked, Checked::AbiStable);
    assert_eq!(e.abi_version(), (1, ferrocx::abi::ABI_MINOR));
    assert_eq!(e.groups(), GROUPS);
    assert!(e.ccl.is_none());
    let d = e.device.as_ref().expect("device");
    check_uninitialised(d.root.get());
    check_groups_uninitialised(d);
}

const KILL_SWITCH_WORKER: &str = "multicast_kill_switch_worker";

/// In a worker whose environment sets a kill-switch (`FERROCX_TEST_EXPECT` names what the
/// refusal must say): every multicast entry that could create or join an object refuses with
/// `UNSUPPORTED` naming it, through the built-in table and the plugin's, before `init` (so
/// before the adaptor could know whether it is initialised).
#[test]
fn multicast_kill_switch_worker() {
    if !common::is_worker(KILL_SWITCH_WORKER) {
        return;
    }
    // Never call a multicast entry without a switch: refuse to run rather than risk it.
    let switch = ferrocx_adaptor_cuda::multicast::kill_switch()
        .expect("the worker runs with a multicast kill-switch in its environment");
    let expect = std::env::var("FERROCX_TEST_EXPECT").expect("FERROCX_TEST_EXPECT");
    assert!(switch.contains(&expect), "{switch}");
    ferrocx_adaptor_cuda::link();
    let builtins = Registry::with_builtins();
    let mut plugins = Registry::empty();
    let tables = [
        builtins.device("cuda").expect("built-in").device.as_ref(),
        plugins
            .add_plugin(&plugin_path())
            .expect("plugin")
            .device
            .as_ref(),
    ];
    for d in tables {
        let d = d.expect("device tables");
        let t = d.root.get();
        let mc = d.multicast.as_ref().expect("multicast group").get();
        let (mut h, mut p) = (McHandle(0), DevicePtr::NULL);
        // SAFETY: entries of a checked table with valid out-pointers; the descriptor 0 is only
        // passed, never used (the entry refuses first).
        let results = unsafe {
            [
                ("mc_create", mc.mc_create.unwrap()(1 << 21, 2, &mut h)),
                ("mc_import_fd", mc.mc_import_fd.unwrap()(0, 1 << 21, &mut h)),
                ("mc_add_device", mc.mc_add_device.unwrap()(McHandle(1), 0)),
                (
                    "mc_bind",
                    mc.mc_bind.unwrap()(McHandle(1), 0, VmmHandle(1), 0, 1 << 21),
                ),
                ("mc_map", mc.mc_map.unwrap()(McHandle(1), 1 << 21, &mut p)),
            ]
        };
        for (entry, status) in results {
            let msg = last_error(t);
            assert_eq!(status, Status::UNSUPPORTED, "{entry}: {msg}");
            assert!(msg.contains(&expect), "{entry}: {msg}");
        }
        assert_eq!((h, p), (McHandle(0), DevicePtr::NULL), "nothing written");
    }
}

#[test]
fn multicast_is_refused_by_each_kill_switch_before_anything_else() {
    if skip_on_gpu() || common::is_worker(KILL_SWITCH_WORKER) {
        return;
    }
    let cases = [
        ("NCCL_NVLS_ENABLE", "0", "disabled by NCCL_NVLS_ENABLE=0"),
        ("FERROCX_MULTICAST", "0", "disabled by FERROCX_MULTICAST=0"),
        (
            "FERROCX_MULTICAST",
            "off",
            "disabled by FERROCX_MULTICAST=off",
        ),
        ("FERROCX_MULTICAST", "maybe", "counts as off"),
    ];
    let workers: Vec<common::Worker<'_>> = cases
        .iter()
        .map(|&(var, value, expect)| common::Worker {
            set: vec![
                (var, value.to_string()),
                ("FERROCX_TEST_EXPECT", expect.to_string()),
            ],
            unset: vec!["NCCL_NVLS_ENABLE", "FERROCX_MULTICAST"],
        })
        .collect();
    let outs = common::run_workers(KILL_SWITCH_WORKER, &workers, Duration::from_secs(120));
    let named: Vec<_> = cases
        .iter()
        .zip(outs)
        .map(|((var, value, _), out)| (format!("{var}={value}"), out))
        .collect();
    common::assert_all_succeeded(&named);
}

/// The driver the NCCL adaptor's watchdog reaches (`shared::Driver`) is the device adaptor's
/// load: without a driver it fails with the very message `init` gives.
#[test]
fn the_shared_driver_fails_as_init_does() {
    if skip_on_gpu() {
        return;
    }
    let e = ferrocx_adaptor_cuda::shared::Driver::get().expect_err("no driver");
    assert_eq!(e.status(), Status::VENDOR_ERROR);
    assert!(e.message().starts_with("libcuda.so.1 not found: "), "{e}");
    use ferrocx_plugin_sdk::DeviceAdaptor;
    let init = ferrocx_adaptor_cuda::CudaDevice::instance()
        .init(&ferrocx_plugin_sdk::Options::default())
        .expect_err("no driver");
    assert_eq!(init.message(), e.message());
}
