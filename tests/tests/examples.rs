//! The ways to write an adaptor, built as their users build them and loaded as real `.so` files:
//! the out-of-tree Rust example (`examples/out-of-tree-plugin`, its own cargo project), the SDK
//! template (generated with `new-adaptor.sh`, then built), and the C example
//! (`plugin-sdk/examples/c`, built with `cc`). Each is listed by `ferrocx info` from a plugin
//! directory; the two working ones pass the conformance kit.
//!
//! The cargo builds use their own target directory (see `ferrocx_cli`), shared by every build
//! here: the SDK and core are compiled once, the first time (about a minute on 2 cores), and
//! each artifact is built at most once per test executable.

mod ferrocx_cli;

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferrocx::abi::{AbiTable, CclAdaptorV1, DeviceAdaptorV1, DevicePtr, MemKind, Status};
use ferrocx::adaptor::Device;
use ferrocx::loader::Checked;
use ferrocx::registry::Registry;
use ferrocx_cli::{build_dir, cargo, cargo_build, ferrocx_ok, info_section, repo_root, tail};
use ferrocx_tests::plugin_dir;

/// The adaptor name the template is generated with.
const TEMPLATE_NAME: &str = "tmplcheck";

/// Builds once per test executable; a failure is reported by every test that needs it.
fn once(
    cell: &'static OnceLock<Result<PathBuf, String>>,
    build: fn() -> Result<PathBuf, String>,
) -> PathBuf {
    match cell.get_or_init(build) {
        Ok(p) => p.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// `libferrocx_adaptor_outoftree.so`, built from its own manifest as a vendor would.
fn out_of_tree() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once(&BUILT, || {
        let manifest = repo_root().join("examples/out-of-tree-plugin/Cargo.toml");
        cargo_build(
            [Path::new("--manifest-path"), &manifest],
            "examples/out-of-tree-plugin",
        )?;
        Ok(build_dir().join("debug/libferrocx_adaptor_outoftree.so"))
    })
}

/// Where the template is generated (replaced at each test run).
fn template_dir() -> PathBuf {
    build_dir().join(format!("ferrocx-adaptor-{TEMPLATE_NAME}"))
}

/// The template, generated with `new-adaptor.sh` and built: `libferrocx_adaptor_tmplcheck.so`.
fn template() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once(&BUILT, || {
        let dest = template_dir();
        if dest.exists() {
            std::fs::remove_dir_all(&dest).map_err(|e| format!("removing {dest:?}: {e}"))?;
        }
        let script = repo_root().join("plugin-sdk/template/new-adaptor.sh");
        // `--local`: this checkout's SDK and kit (the tests run offline).
        let out = Command::new(&script)
            .arg("--local")
            .arg(TEMPLATE_NAME)
            .arg(&dest)
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "new-adaptor.sh failed ({}):\n{}",
                out.status,
                tail(&out.stderr, 20)
            ));
        }
        let manifest = dest.join("Cargo.toml");
        cargo_build(
            [Path::new("--manifest-path"), &manifest],
            "the generated template",
        )?;
        Ok(build_dir().join(format!("debug/libferrocx_adaptor_{TEMPLATE_NAME}.so")))
    })
}

/// `libferrocx_adaptor_cexample.so`, compiled with the system C compiler as its README says
/// (plus `-Werror`: the example must stay warning-free).
fn c_example() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once(&BUILT, || {
        let dir = build_dir().join("c-example");
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {dir:?}: {e}"))?;
        let so = dir.join("libferrocx_adaptor_cexample.so");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let root = repo_root();
        let out = Command::new(&cc)
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O2"])
            .args(["-shared", "-fPIC", "-I"])
            .arg(root.join("plugin-sdk/include"))
            .arg(root.join("plugin-sdk/examples/c/plugin.c"))
            .arg(root.join("plugin-sdk/examples/c/ccl.c"))
            .arg("-o")
            .arg(&so)
            .output()
            .map_err(|e| format!("could not run the C compiler `{cc}`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`{cc}` failed on plugin-sdk/examples/c/plugin.c ({}):\n{}",
                out.status,
                tail(&out.stderr, 40)
            ));
        }
        Ok(so)
    })
}

/// Loads `so` into a fresh registry and returns its device handle and checks.
fn load_device(so: &Path, name: &str, checked: Checked) -> Device {
    let mut r = Registry::empty();
    let e = r
        .add_plugin(so)
        .unwrap_or_else(|e| panic!("{} must load: {e}", so.display()));
    assert_eq!(e.name, name);
    assert_eq!(e.checked, checked);
    assert_eq!(e.abi_version(), (1, ferrocx::abi::ABI_MINOR));
    // The device with its minimal one-rank CCL, which declares one rank at most.
    let ccl = e.ccl().expect("a CCL table beside the device");
    assert_eq!(ccl.limits().expect("get_limits").max_ranks, 1);
    e.device().expect("device table")
}

/// A host function: adds one to the `AtomicU32` at `user`.
unsafe extern "C" fn count_up(user: *mut c_void) {
    // SAFETY: `user` is a leaked `AtomicU32` (see `exercise_host_memory_device`).
    unsafe { &*(user as *const AtomicU32) }.fetch_add(1, Ordering::SeqCst);
}

/// A host function: sleeps 20 ms.
unsafe extern "C" fn sleep_20ms(_user: *mut c_void) {
    std::thread::sleep(Duration::from_millis(20));
}

/// A host function: holds its stream until the `AtomicBool` at `user` is set (or 5 s pass).
unsafe extern "C" fn gate(user: *mut c_void) {
    // SAFETY: `user` is a leaked `AtomicBool` (see `exercise_host_memory_device`).
    let open = unsafe { &*(user as *const AtomicBool) };
    let t = Instant::now();
    while !open.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What both host-memory examples must do through their tables: memory of every kind, async
/// copies and memsets in stream order, host functions, events ordering two streams, timing.
fn exercise_host_memory_device(dev: &Device) {
    dev.init(&[]).expect("init");
    assert_eq!(dev.device_count().expect("count"), 1);
    let p = dev.properties(0).expect("properties");
    assert_eq!(p.vendor, "ferrocx-example");
    assert!(p.total_memory > 0);
    let root = dev.tables().root.get();
    for absent in [
        root.stream_wrap.is_none(),
        root.ipc_export.is_none(),
        root.ipc_import.is_none(),
        root.ipc_close.is_none(),
    ] {
        assert!(absent, "stream_wrap and IPC are exported as absent");
    }
    let err = dev.set_device(1).expect_err("one device");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    assert!(err.to_string().contains("does not exist"), "{err}");

    // mem_get_info (ABI 1.1): the system's memory.
    let f = root.mem_get_info.expect("mem_get_info");
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two valid out-pointers.
    assert_eq!(unsafe { f(&mut free, &mut total) }, Status::SUCCESS);
    assert!(total > 0 && free <= total, "free {free}, total {total}");

    // Round trips of every kind.
    let n = 100_003;
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    for kind in [MemKind::DEVICE, MemKind::HOST, MemKind::PINNED] {
        let a = dev.mem_alloc(n, kind).expect("alloc");
        // SAFETY: `a` is a fresh allocation of `n` bytes; `data` holds `n`.
        unsafe { dev.mem_copy(a, DevicePtr(data.as_ptr() as u64), n) }.expect("upload");
        let mut back = vec![0u8; n];
        // SAFETY: `a` holds `n` bytes; `back` holds `n`.
        unsafe { dev.mem_copy(DevicePtr(back.as_mut_ptr() as u64), a, n) }.expect("download");
        assert_eq!(back, data, "{kind:?}");
        // SAFETY: the allocation made above, no longer used.
        unsafe { dev.mem_free(a, kind) }.expect("free");
        // SAFETY: a double free is the bad argument under test: the host device checks its
        // allocations' table before touching memory.
        let err = unsafe { dev.mem_free(a, kind) }.expect_err("double free");
        assert_eq!(err.status(), Status::INVALID_HANDLE);
    }

    // Stream order: host → a, memset part of a, a → b, host function, b → host; then a second
    // stream waits on an event recorded after a 20 ms host function on the first.
    let s1 = dev.stream_create().expect("stream");
    let s2 = dev.stream_create().expect("stream");
    let a = dev.mem_alloc(n, MemKind::DEVICE).expect("alloc");
    let b = dev.mem_alloc(n, MemKind::DEVICE).expect("alloc");
    let mut out = vec![0u8; n];
    // Leaked: a host function may only be sound to call while what it reaches lives.
    let ran: &'static AtomicU32 = Box::leak(Box::new(AtomicU32::new(0)));
    let ran_ptr = ran as *const AtomicU32 as *mut c_void;
    let launch = root.launch_host_func.expect("launch_host_func");
    let set_async = root.mem_set_async.expect("mem_set_async");
    let start = dev.event_create(0).expect("event");
    let end = dev.event_create(0).expect("event");
    dev.event_record(start, s1).expect("record");
    // SAFETY: the host functions are sound to call once on any thread; `ran` is static, and
    // `a`, `b` and `out` outlive the stream synchronisations below.
    unsafe {
        assert_eq!(
            launch(s1, Some(sleep_20ms), std::ptr::null_mut()),
            Status::SUCCESS
        );
        dev.mem_copy_async(a, DevicePtr(data.as_ptr() as u64), n, s1)
            .expect("copy");
        assert_eq!(set_async(a, 0xEE, 10, s1), Status::SUCCESS);
        dev.mem_copy_async(b, a, n, s1).expect("copy");
        assert_eq!(launch(s1, Some(count_up), ran_ptr), Status::SUCCESS);
    }
    dev.event_record(end, s1).expect("record");
    dev.stream_wait_event(s2, end).expect("wait");
    // SAFETY: `b` and `out` hold `n` bytes and outlive the synchronize of `s2` below.
    unsafe { dev.mem_copy_async(DevicePtr(out.as_mut_ptr() as u64), b, n, s2) }.expect("copy");
    dev.stream_synchronize(s2).expect("sync");
    let mut want = data.clone();
    want[..10].fill(0xEE);
    assert_eq!(out, want, "stream order across two streams");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    dev.stream_synchronize(s1).expect("sync");
    assert!(dev.stream_query(s1).expect("query"));
    let ms = dev.event_elapsed_ms(start, end).expect("elapsed");
    assert!(
        (15.0..5_000.0).contains(&ms),
        "{ms} ms around a 20 ms host function"
    );

    // Host functions run on the stream's own thread: a held stream is pending, and the call
    // that enqueued the hold returned.
    let open: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    // SAFETY: `gate` is sound on any thread; `open` is leaked.
    let s = unsafe { launch(s1, Some(gate), open as *const AtomicBool as *mut c_void) };
    assert_eq!(s, Status::SUCCESS);
    assert!(!dev.stream_query(s1).expect("query"), "pending while held");
    open.store(true, Ordering::SeqCst);
    dev.stream_synchronize(s1).expect("sync");
    assert!(dev.stream_query(s1).expect("query"));

    for e in [start, end] {
        dev.event_destroy(e).expect("event_destroy");
    }
    for s in [s1, s2] {
        dev.stream_destroy(s).expect("stream_destroy");
    }
    // SAFETY: the allocations made above; both streams were synchronized.
    unsafe { dev.mem_free(a, MemKind::DEVICE) }.expect("free");
    // SAFETY: as above.
    unsafe { dev.mem_free(b, MemKind::DEVICE) }.expect("free");
    let err = dev.stream_destroy(s1).expect_err("destroyed twice");
    assert_eq!(err.status(), Status::INVALID_HANDLE);
}

/// Runs `ferrocx conformance --plugin SO` and asserts it passed, showing its report if not;
/// returns the report.
fn assert_conformant(so: &Path) -> String {
    let dir = plugin_dir(&[so.to_path_buf()], &[]);
    let plugin = dir.path().join(so.file_name().expect("file name"));
    let report = ferrocx_ok(
        &[
            "conformance",
            "--plugin",
            plugin.to_str().expect("utf-8 path"),
        ],
        dir.path(),
    );
    assert!(
        report.contains(" 0 failed") && report.contains("CONFORMANT"),
        "{report}"
    );
    report
}

#[test]
fn the_out_of_tree_plugin_builds_and_answers_through_its_table() {
    let so = out_of_tree();
    let dir = plugin_dir(&[so], &[]);
    let dev = load_device(
        &dir.path().join("libferrocx_adaptor_outoftree.so"),
        "outoftree",
        Checked::AbiStable,
    );
    exercise_host_memory_device(&dev);
}

#[test]
fn the_sdk_refuses_what_lies_outside_a_ccls_declared_limits() {
    use ferrocx::abi::{DataType, ReduceOp, Stream};
    let dir = plugin_dir(&[out_of_tree()], &[]);
    let mut r = Registry::empty();
    let e = r
        .add_plugin(&dir.path().join("libferrocx_adaptor_outoftree.so"))
        .expect("loads");
    let (dev, ccl) = (e.device().expect("device"), e.ccl().expect("ccl"));
    dev.init(&[]).expect("device init");
    ccl.init().expect("ccl init");
    let limits = ccl.limits().expect("get_limits");
    assert_eq!(limits.max_ranks, 1);
    assert!(!limits.allows_dtype(DataType::F16) && !limits.allows_op(ReduceOp::AVG));
    let id = ccl.unique_id().expect("id");
    let err = ccl
        .comm_init_rank(0, 2, 0, &id, 1000, &[])
        .expect_err("two ranks");
    assert_eq!(err.status(), Status::UNSUPPORTED);
    assert!(err.to_string().contains("claims at most 1"), "{err}");
    let comm = ccl
        .comm_init_rank(0, 1, 0, &id, 1000, &[])
        .expect("one rank");
    let buf = dev.mem_alloc(64, MemKind::DEVICE).expect("alloc");
    for (dtype, op, what) in [
        (DataType::F16, ReduceOp::SUM, "data type"),
        (DataType::F32, ReduceOp::AVG, "reduction"),
    ] {
        // SAFETY: `buf` holds 64 bytes, more than 4 elements of either type; the call is
        // refused before anything is enqueued.
        let err =
            unsafe { ccl.all_reduce(buf, buf, 4, dtype, op, comm, Stream::NULL) }.expect_err(what);
        assert_eq!(err.status(), Status::UNSUPPORTED, "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }
    // An unknown type is still the adaptor's INVALID_ARGUMENT, not "not claimed".
    // SAFETY: as above.
    let err =
        unsafe { ccl.all_reduce(buf, buf, 4, DataType(99), ReduceOp::SUM, comm, Stream::NULL) }
            .expect_err("unknown type");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{err}");
    ccl.comm_destroy(comm).expect("destroy");
    // SAFETY: the allocation above, unused.
    unsafe { dev.mem_free(buf, MemKind::DEVICE) }.expect("free");
}

#[test]
fn the_out_of_tree_plugin_is_listed_by_ferrocx_info() {
    let dir = plugin_dir(&[out_of_tree()], &[]);
    let info = ferrocx_ok(&["info"], dir.path());
    let me = info_section(&info, "outoftree").join("\n");
    assert!(
        me.contains(&format!(
            "ABI 1.{}, checked by abi_stable layout check + headers",
            ferrocx::abi::ABI_MINOR
        )),
        "{me}"
    );
    assert!(
        me.contains("absent: stream_wrap, ipc_export, ipc_import, ipc_close"),
        "{me}"
    );
    assert!(
        me.contains("ccl limits: at most 1 rank(s); data types f32, f64, u8, i32, i64, u64; reductions sum, min, max"),
        "{me}"
    );
    assert!(
        me.contains("device 0: ferrocx-example host memory (out-of-tree Rust example)"),
        "{me}"
    );
}

#[test]
fn the_out_of_tree_plugin_passes_the_conformance_kit() {
    let report = assert_conformant(&out_of_tree());
    // Its one-rank CCL passes at its declared world size; what lies outside its limits is
    // not claimed, not failed.
    for line in [
        "not claimed: the adaptor declares at most 1 rank(s); the CCL part ran on 1",
        "not claimed: the adaptor's limits do not list the data type f16",
        "not claimed: the adaptor's limits do not list the reduction avg",
    ] {
        assert!(report.contains(line), "{line}\n{report}");
    }
    for passed in [
        "all_reduce f32 sum",
        "all_to_allv i64",
        "bad argument: root out of range",
    ] {
        let row = report
            .lines()
            .find(|l| l.contains(passed))
            .unwrap_or_else(|| panic!("{passed} not in\n{report}"));
        assert!(row.contains(" pass"), "{row}");
    }
}

#[test]
fn the_template_generates_builds_and_says_what_to_implement() {
    let so = template();
    // Every required method is present and names the vendor call to make.
    // Every entry but get_last_error (the SDK provides it) and the CCL's get_limits (the
    // `LIMITS` constant answers it) is a method with a TODO.
    for (file, methods) in [
        ("device.rs", DeviceAdaptorV1::entries().len() - 1),
        ("ccl.rs", CclAdaptorV1::entries().len() - 2),
    ] {
        let src = std::fs::read_to_string(template_dir().join("src").join(file)).expect("read");
        assert_eq!(src.matches("\"TODO(vendor): ").count(), methods, "{file}");
    }
    let manifest = std::fs::read_to_string(template_dir().join("Cargo.toml")).expect("read");
    assert!(manifest.contains(&format!("name = \"ferrocx-adaptor-{TEMPLATE_NAME}\"")));
    for (krate, dir) in [
        ("ferrocx-plugin-sdk", "plugin-sdk"),
        ("ferrocx-conformance", "conformance"),
    ] {
        let path = repo_root().join(dir);
        assert!(
            manifest.contains(&format!("{krate} = {{ path = \"{}\" }}", path.display())),
            "--local points {krate} at this checkout:\n{manifest}"
        );
    }
    // Nothing is claimed yet: every method is in an absent list (and compiles as one).
    let lib = std::fs::read_to_string(template_dir().join("src/lib.rs")).expect("read");
    assert!(lib.contains("device_absent: [") && lib.contains("ccl_absent: ["));
    // No doc comment of the sources carries the marker: grep finds only the messages.
    for file in ["lib.rs", "device.rs", "ccl.rs"] {
        let src = std::fs::read_to_string(template_dir().join("src").join(file)).expect("read");
        assert_eq!(
            src.matches("TODO(vendor)").count(),
            src.matches("\"TODO(vendor): ").count(),
            "{file}: a TODO(vendor) marker outside the messages"
        );
    }

    let dir = plugin_dir(&[so], &[]);
    let info = ferrocx_ok(&["info"], dir.path());
    let me = info_section(&info, TEMPLATE_NAME).join("\n");
    assert!(me.contains("checked by abi_stable"), "{me}");
    assert!(
        me.contains("ferrocx_device_adaptor_v1 1/") && me.contains("present: get_last_error"),
        "{me}"
    );
    assert!(info.contains("plugins loaded: "), "{info}");

    // The conformance kit passes on it, and says that nothing is claimed.
    let plugin = dir
        .path()
        .join(format!("libferrocx_adaptor_{TEMPLATE_NAME}.so"));
    let out = ferrocx_cli::run_ferrocx(
        &["conformance", "--plugin", plugin.to_str().expect("utf-8")],
        dir.path(),
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(
        report.contains("not claimed: the device table exports every entry as absent")
            && report.contains("not claimed: the CCL table exports every entry as absent"),
        "{report}"
    );
}

#[test]
fn the_generated_templates_own_tests_pass() {
    template();
    let manifest = template_dir().join("Cargo.toml");
    let out = cargo()
        .args(["test", "--offline", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(build_dir())
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run cargo test");
    assert!(
        out.status.success(),
        "cargo test of the generated template failed:\n{}\n{}",
        tail(&out.stdout, 20),
        tail(&out.stderr, 20)
    );
    // Its conformance test (tests/conformance.rs: the kit on the plugin) ran and passed.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("test conformance ... ok"), "{stdout}");
}

#[test]
fn new_adaptor_refuses_a_bad_name_and_a_used_directory() {
    let script = repo_root().join("plugin-sdk/template/new-adaptor.sh");
    let used = tempfile::tempdir().expect("tempdir");
    std::fs::write(used.path().join("keep"), b"x").expect("write");
    for (name, dest, why) in [
        ("Acme", used.path().join("new"), "NAME must be lowercase"),
        ("acme", used.path().to_path_buf(), "is not empty"),
    ] {
        let out = Command::new(&script)
            .arg(name)
            .arg(&dest)
            .output()
            .expect("run new-adaptor.sh");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(why), "{stderr}");
    }
    assert!(!used.path().join("new").exists());
}

#[test]
fn the_c_example_builds_warning_free_and_answers_through_its_table() {
    let so = c_example();
    let dir = plugin_dir(&[so], &[]);
    let dev = load_device(
        &dir.path().join("libferrocx_adaptor_cexample.so"),
        "cexample",
        Checked::HeaderOnly,
    );
    exercise_host_memory_device(&dev);
}

#[test]
fn the_c_example_is_listed_by_ferrocx_info() {
    let dir = plugin_dir(&[c_example()], &[]);
    let info = ferrocx_ok(&["info"], dir.path());
    let me = info_section(&info, "cexample").join("\n");
    assert!(
        me.contains(&format!(
            "ABI 1.{}, checked by headers (C/C++ plugin)",
            ferrocx::abi::ABI_MINOR
        )),
        "{me}"
    );
    assert!(
        me.contains("device 0: ferrocx-example host memory (C example)"),
        "{me}"
    );
}

#[test]
fn the_c_example_passes_the_conformance_kit_with_its_one_rank_ccl() {
    let report = assert_conformant(&c_example());
    for line in [
        "not claimed: the adaptor declares at most 1 rank(s); the CCL part ran on 1",
        "not claimed: the adaptor's limits do not list the data type bf16",
    ] {
        assert!(report.contains(line), "{line}\n{report}");
    }
    let row = report
        .lines()
        .find(|l| l.contains("all_reduce f32 sum") && !l.contains("in place"))
        .unwrap_or_else(|| panic!("no all_reduce f32 sum in\n{report}"));
    assert!(row.contains(" pass"), "{row}");
}
