//! Without a CUDA driver: `init` fails with the reason, every other entry answers
//! `NOT_INITIALIZED` without panicking, through the built-in table and through the plugin `.so`.

use std::ffi::{c_void, CStr};
use std::path::PathBuf;

use ferrocx::abi::{DeviceAdaptorV1, DeviceProperties, DevicePtr, Event, MemKind, Status, Stream};
use ferrocx::loader::Checked;
use ferrocx::registry::{Registry, Source};

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

#[test]
fn builtin_init_fails_with_the_reason_and_the_rest_is_not_initialised() {
    if skip_on_gpu() {
        return;
    }
    ferrocx_adaptor_cuda::link();
    let r = Registry::with_builtins();
    let e = r.device("cuda").expect("the cuda built-in is registered");
    assert_eq!(e.source, Source::Builtin);
    assert_eq!(
        e.groups(),
        ["ferrocx_device_adaptor_v1"],
        "no optional group"
    );
    let d = e.device.as_ref().expect("device tables");
    assert!(d.root.absent().is_empty(), "{:?}", d.root.absent());
    check_uninitialised(d.root.get());

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
    assert_eq!(e.groups(), ["ferrocx_device_adaptor_v1"]);
    assert!(e.ccl.is_none());
    check_uninitialised(e.device.as_ref().expect("device").root.get());
}
