//! The NCCL adaptor on a machine without NCCL: `init` fails naming what it tried, every other
//! entry answers `NOT_INITIALIZED`, and the drop-in `.so` loads.
//!
//! The library is always named through the `library` option (never this process's
//! environment), so the tests behave the same on a machine that has libnccl.

use std::ffi::CStr;
use std::path::PathBuf;

use ferrocx::abi::{
    Comm, DataType, DevicePtr, KeyValue, ReduceOp, RegHandle, Status, Stream, WindowHandle,
};
use ferrocx::registry::Registry;
use ferrocx_adaptor_nccl::NcclCcl;
use ferrocx_plugin_sdk::{CclAdaptor, CclWindow, CommInit, Options, VCounts};

const MISSING: &str = "/nonexistent/libnccl.so.2";

fn missing_library() -> Options {
    Options::new(vec![("library".into(), MISSING.into())])
}

#[test]
fn init_fails_naming_what_was_tried() {
    let err = NcclCcl::instance()
        .init(&missing_library())
        .expect_err("no libnccl there");
    assert_eq!(err.status(), Status::UNSUPPORTED);
    let m = err.message();
    assert!(m.contains(MISSING), "{m}");
    assert!(m.contains("option `library`"), "{m}");
    // Named explicitly: nothing else is tried behind the operator's back.
    assert!(!m.contains("libnccl.so ("), "{m}");
}

#[test]
fn env_variable_names_the_library() {
    // Runs `child_init_from_env` in a child process with the variable set, so this process's
    // environment is left alone.
    if std::env::var_os("FERROCX_NCCL_TEST_CHILD").is_some() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", "child_init_from_env", "--nocapture"])
        .env("FERROCX_NCCL_TEST_CHILD", "1")
        .env("FERROCX_NCCL_LIBRARY", MISSING)
        .output()
        .expect("spawn child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
}

#[test]
fn child_init_from_env() {
    if std::env::var_os("FERROCX_NCCL_TEST_CHILD").is_none() {
        return;
    }
    let err = NcclCcl::instance()
        .init(&Options::default())
        .expect_err("no libnccl there");
    assert!(err.message().contains(MISSING), "{}", err.message());
    assert!(
        err.message().contains("FERROCX_NCCL_LIBRARY"),
        "{}",
        err.message()
    );
    // The safety default: NVLink SHARP stays off unless the operator said otherwise.
    assert_eq!(std::env::var("NCCL_NVLS_ENABLE").as_deref(), Ok("0"));
}

#[test]
fn every_entry_is_not_initialized() {
    let ccl = NcclCcl::instance();
    let _ = ccl.init(&missing_library());
    let (c, p, s) = (Comm(8 as *mut _), DevicePtr(0x1000), Stream::NULL);
    let (t, op) = (DataType::F32, ReduceOp::SUM);
    let v = VCounts {
        counts: &[1],
        displs: &[0],
    };
    let uid = [0u8; 128];
    let init = CommInit {
        rank: 0,
        nranks: 1,
        device: 0,
        unique_id: &uid,
        timeout_ms: 0,
        options: Options::default(),
    };
    let results: Vec<(&str, Status)> = vec![
        ("finalize", status(ccl.finalize())),
        ("version", status(ccl.version())),
        ("unique_id", status(ccl.unique_id())),
        ("comm_init_rank", status(ccl.comm_init_rank(&init))),
        ("comm_finalize", status(ccl.comm_finalize(c))),
        ("comm_destroy", status(ccl.comm_destroy(c))),
        ("comm_abort", status(ccl.comm_abort(c))),
        ("comm_async_error", status(ccl.comm_async_error(c))),
        ("comm_count", status(ccl.comm_count(c))),
        ("comm_user_rank", status(ccl.comm_user_rank(c))),
        ("comm_device", status(ccl.comm_device(c))),
        ("all_reduce", status(ccl.all_reduce(p, p, 1, t, op, c, s))),
        ("all_gather", status(ccl.all_gather(p, p, 1, t, c, s))),
        (
            "reduce_scatter",
            status(ccl.reduce_scatter(p, p, 1, t, op, c, s)),
        ),
        ("broadcast", status(ccl.broadcast(p, p, 1, t, 0, c, s))),
        ("reduce", status(ccl.reduce(p, p, 1, t, op, 0, c, s))),
        ("gather", status(ccl.gather(p, p, 1, t, 0, c, s))),
        ("scatter", status(ccl.scatter(p, p, 1, t, 0, c, s))),
        ("all_to_all", status(ccl.all_to_all(p, p, 1, t, c, s))),
        ("all_to_allv", status(ccl.all_to_allv(p, v, p, v, t, c, s))),
        ("send", status(ccl.send(p, 1, t, 0, c, s))),
        ("recv", status(ccl.recv(p, 1, t, 0, c, s))),
        ("group_start", status(ccl.group_start())),
        ("group_end", status(ccl.group_end())),
        ("mem_alloc", status(ccl.mem_alloc(64))),
        ("mem_free", status(ccl.mem_free(p))),
        ("mem_register", status(ccl.mem_register(c, p, 64))),
        (
            "mem_deregister",
            status(ccl.mem_deregister(c, RegHandle::NULL)),
        ),
        ("window_register", status(ccl.window_register(c, p, 64, 0))),
        (
            "window_deregister",
            status(ccl.window_deregister(c, WindowHandle::NULL)),
        ),
        (
            "query_support",
            status(ccl.query_support("window_register")),
        ),
    ];
    for (entry, st) in results {
        assert_eq!(st, Status::NOT_INITIALIZED, "{entry}");
    }
    let err = ccl.version().expect_err("not initialised");
    assert!(
        err.message().contains(MISSING),
        "says why: {}",
        err.message()
    );
}

fn status<T>(r: ferrocx_plugin_sdk::Result<T>) -> Status {
    r.map_or_else(|e| e.status(), |_| Status::SUCCESS)
}

/// The drop-in plugin, built beside this executable as a dev-dependency.
fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("executable has a directory");
    let name = ferrocx::registry::plugin_file_name("nccl");
    [dir.to_path_buf(), dir.join("deps"), dir.join("../deps")]
        .iter()
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not found beside {}", exe.display()))
}

#[test]
fn plugin_loads_in_an_empty_registry() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&plugin_path()).expect("the NCCL plugin loads");
    assert_eq!(e.name, "nccl");
    assert_eq!(
        e.groups(),
        ["ferrocx_ccl_adaptor_v1", "ferrocx_ccl_window_v1"],
        "no device; the window group whatever libnccl turns out to be"
    );
    let tables = e.ccl.as_ref().expect("ccl tables");
    assert!(tables.root.absent().is_empty(), "every entry exported");
    let window = tables.window.as_ref().expect("window group");
    assert!(window.absent().is_empty(), "both window entries exported");

    // Before a successful init, query_support cannot answer: the present entries stand (as for
    // a table without the query) and the capabilities are not kept (the next call after init
    // probes again).
    let caps = e.ccl().expect("ccl").caps();
    assert_eq!(caps.root.version, (1, ferrocx::abi::ABI_MINOR));
    assert!(caps.root.has("query_support"));
    assert!(caps.windows && caps.registration && caps.p2p && caps.group);
    assert_eq!(caps.collectives.len(), 9);
    for (entry, support) in &caps.runtime {
        assert_eq!(
            *support,
            ferrocx::adaptor::RuntimeSupport::Supported,
            "{entry}"
        );
    }
    assert!(!std::sync::Arc::ptr_eq(
        &caps,
        &e.ccl().expect("ccl").caps()
    ));

    let root = tables.root.get();
    let init = root.init.expect("init entry");
    let kv = KeyValue {
        key: c"library".as_ptr(),
        value: c"/nonexistent/libnccl.so.2".as_ptr(),
    };
    // SAFETY: one valid option.
    let st = unsafe { init(&kv, 1) };
    assert_eq!(st, Status::UNSUPPORTED);
    // SAFETY: never null, NUL-terminated.
    let msg = unsafe { CStr::from_ptr(root.get_last_error.expect("get_last_error")()) };
    assert!(msg.to_string_lossy().contains(MISSING), "{msg:?}");

    let ccl = e.ccl().expect("ccl");
    let err = ccl.version().expect_err("not initialised");
    assert_eq!(err.status(), Status::NOT_INITIALIZED);
    let err = ccl
        .comm_count(Comm(8 as *mut _))
        .expect_err("not initialised");
    assert_eq!(err.status(), Status::NOT_INITIALIZED);
}
