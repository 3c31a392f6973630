//! Plugin loading with real `.so` files: a Rust plugin built through the SDK and a C plugin
//! built from the generated header load and answer calls; every broken input is refused with a
//! clear reason and leaves the registry usable.

use std::path::Path;
use std::sync::Arc;

use ferrocx::abi::{Capabilities, DevicePtr, GraphHandle, MemKind, Status, Stream};
use ferrocx::adaptor::AdaptorError;
use ferrocx::loader::{load_plugin, Checked, LoadError, LoadErrorKind};
use ferrocx::registry::{Registry, Source};
use ferrocx_tests::{c_plugin, file_name, host_plugin, plugin_dir, rust_plugin};

fn refused(r: &Registry, name: &str) -> LoadError {
    let file = file_name(name);
    r.rejected()
        .iter()
        .find(|e| e.path.file_name().and_then(|f| f.to_str()) == Some(file.as_str()))
        .unwrap_or_else(|| panic!("{file} was not refused; refused: {:?}", r.rejected()))
        .clone()
}

/// After a refusal the registry still takes a good plugin and calls through it.
fn assert_still_usable(r: &mut Registry) {
    let dir = plugin_dir(&[c_plugin("testc")], &[]);
    let before = r.entries().len();
    r.add_plugin_dir(dir.path());
    assert_eq!(r.entries().len(), before + 1, "refused: {:?}", r.rejected());
    let dev = r
        .device("testc")
        .expect("testc registered")
        .device()
        .expect("device table");
    assert_eq!(dev.device_count().expect("device_count"), 2);
}

#[test]
fn rust_plugin_loads_reports_groups_and_answers() {
    let mut r = Registry::empty();
    let path = rust_plugin();
    let e = r.add_plugin(&path).expect("the Rust plugin loads");
    assert_eq!(e.name, "testrust");
    assert_eq!(e.source, Source::Plugin(path.clone()));
    assert_eq!(
        e.checked,
        Checked::AbiStable,
        "layout-checked through abi_stable"
    );
    assert_eq!(e.abi_version(), (1, ferrocx::abi::ABI_MINOR));
    assert_eq!(
        e.groups(),
        [
            "ferrocx_device_adaptor_v1",
            "ferrocx_device_vmm_v1",
            "ferrocx_device_graph_v1",
            "ferrocx_device_kernel_v1",
            "ferrocx_ccl_adaptor_v1"
        ]
    );
    let ccl_tables = e.ccl.as_ref().expect("ccl");
    assert_eq!(
        ccl_tables.root.absent(),
        ["all_to_allv"],
        "declared absent in export_plugin!"
    );

    let dev = e.device().expect("device");
    dev.init(&[("k".into(), "v".into())]).expect("init");
    assert_eq!(dev.device_count().expect("device_count"), 1);
    let p = dev.properties(0).expect("properties");
    assert_eq!(p.vendor, "ferrocx-test");
    assert_eq!(p.name, "rust test device");
    assert!(p.capabilities.contains(Capabilities::VMM));

    // Memory round trip through the table: memset a source, copy it, read the copy back.
    let a = dev.mem_alloc(37, MemKind::DEVICE).expect("alloc");
    let b = dev.mem_alloc(37, MemKind::DEVICE).expect("alloc");
    // SAFETY: `a` is a fresh allocation of 37 bytes.
    unsafe { dev.mem_set(a, 0xA5, 37) }.expect("memset");
    // SAFETY: `a` and `b` are distinct allocations of 37 bytes.
    unsafe { dev.mem_copy(b, a, 37) }.expect("copy");
    let mut host = vec![0u8; 37];
    let host_ptr = DevicePtr(host.as_mut_ptr() as u64);
    // The test device only copies between its own allocations: a foreign pointer is refused.
    // SAFETY: the foreign pointer is the bad argument under test: the test device checks its
    // allocations before touching memory (and `host` holds 37 bytes anyway).
    let err = unsafe { dev.mem_copy(host_ptr, b, 37) }.expect_err("foreign pointer");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    assert!(err.to_string().contains("not an allocation"), "{err}");
    // SAFETY: the test plugin's "device memory" is a live host allocation of 37 bytes at `b`.
    let copied = unsafe { std::slice::from_raw_parts(b.0 as *const u8, 37) }.to_vec();
    assert!(copied.iter().all(|&x| x == 0xA5));
    // SAFETY: the allocation made above, no longer used.
    unsafe { dev.mem_free(a, MemKind::DEVICE) }.expect("free");
    // SAFETY: as above.
    unsafe { dev.mem_free(b, MemKind::DEVICE) }.expect("free");
    // SAFETY: a double free is the bad argument under test: the test device checks its allocations
    // first.
    let err = unsafe { dev.mem_free(a, MemKind::DEVICE) }.expect_err("double free");
    assert_eq!(err.status(), Status::INVALID_HANDLE);

    let ccl = e.ccl().expect("ccl");
    assert_eq!(ccl.version().expect("version"), 12_345);
    assert_eq!(
        ccl.unique_id().expect("unique id"),
        b"ferrocx-test-unique-id"
    );
}

/// `len` bytes of the test plugin's "device memory" at `p`.
fn test_device_bytes(p: DevicePtr, len: usize) -> Vec<u8> {
    // SAFETY: the test plugin's device memory is a live host allocation of at least `len` bytes
    // at `p`, and its streams complete work before a call returns.
    unsafe { std::slice::from_raw_parts(p.0 as *const u8, len) }.to_vec()
}

#[test]
fn the_graph_group_records_a_capture_and_replays_it_at_each_launch() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&rust_plugin()).expect("the Rust plugin loads");
    let dev = e.device().expect("device");
    dev.init(&[]).expect("init");
    let graphs = dev
        .graph()
        .expect("the Rust plugin exports ferrocx_device_graph_v1");
    let (a, b) = (
        dev.mem_alloc(16, MemKind::DEVICE).expect("alloc"),
        dev.mem_alloc(16, MemKind::DEVICE).expect("alloc"),
    );
    let s = Stream::NULL;
    let graph = graphs
        .capture(s, || {
            // SAFETY: `a` and `b` hold 16 bytes and live until the end of the test, after every
            // launch.
            unsafe { dev.mem_set_async(a, 0x5A, 16, s) }?;
            // SAFETY: as above.
            unsafe { dev.mem_copy_async(b, a, 16, s) }
        })
        .expect("capture a memset and a copy");
    // Captured work is recorded, not run.
    assert_eq!(test_device_bytes(b, 16), [0u8; 16]);
    graph.launch(s).expect("first launch");
    assert_eq!(test_device_bytes(b, 16), [0x5A; 16]);
    // Each launch runs the whole graph again.
    // SAFETY: `a` and `b` hold 16 bytes; the test device's streams complete work before a call
    // returns.
    unsafe { dev.mem_set(a, 1, 16) }.expect("memset");
    // SAFETY: as above.
    unsafe { dev.mem_set(b, 2, 16) }.expect("memset");
    graph.launch(s).expect("second launch");
    assert_eq!(test_device_bytes(a, 16), [0x5A; 16]);
    assert_eq!(test_device_bytes(b, 16), [0x5A; 16]);

    // A capture whose work fails is still ended: the error comes back and the stream can
    // capture again.
    let err = graphs
        // SAFETY: address 8 is no allocation: the bad argument under test, which the test device
        // checks first.
        .capture(s, || unsafe { dev.mem_free(DevicePtr(8), MemKind::DEVICE) })
        .err()
        .expect("the work failed");
    assert_eq!(err.status(), Status::INVALID_HANDLE);
    graphs.begin_capture(s).expect("capturing again");
    let empty = graphs.end_capture(s).expect("an empty graph");
    empty.launch(s).expect("an empty graph launches");
    // Ending a capture that was never begun is the caller's mistake, with a message.
    let err = graphs.end_capture(s).err().expect("not capturing");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    assert!(err.to_string().contains("not capturing"), "{err}");

    // Through the raw table: a null out-pointer is refused and still ends the capture.
    let t = e
        .device
        .as_ref()
        .expect("device")
        .graph
        .as_ref()
        .expect("graph");
    let t = t.get();
    let mut made = GraphHandle::NULL;
    // SAFETY: entries of a loaded table, called with a stream handle of the adaptor; the null
    // out-pointer is the bad argument under test.
    let (refused, again, ended, destroyed, unknown) = unsafe {
        let begin = t.graph_begin_capture.expect("begin");
        let end = t.graph_end_capture.expect("end");
        let destroy = t.graph_destroy.expect("destroy");
        assert_eq!(begin(s), Status::SUCCESS);
        let refused = end(s, std::ptr::null_mut());
        let again = begin(s);
        let ended = end(s, &mut made);
        // A handle the plugin never gave is refused, not a crash.
        (refused, again, ended, destroy(made), destroy(made))
    };
    assert_eq!(refused, Status::INVALID_ARGUMENT);
    assert_eq!((again, ended), (Status::SUCCESS, Status::SUCCESS));
    assert!(!made.is_null());
    assert_eq!(
        (destroyed, unknown),
        (Status::SUCCESS, Status::INVALID_HANDLE)
    );
    drop(graph);
    drop(empty);
    // SAFETY: the allocations made above; the graphs that used them are dropped.
    unsafe { dev.mem_free(a, MemKind::DEVICE) }.expect("free");
    // SAFETY: as above.
    unsafe { dev.mem_free(b, MemKind::DEVICE) }.expect("free");
}

#[test]
fn c_plugin_loads_reports_groups_and_answers() {
    let mut r = Registry::empty();
    let e = r
        .add_plugin(&c_plugin("testc"))
        .expect("the C plugin loads");
    assert_eq!(e.name, "testc");
    assert_eq!(e.checked, Checked::HeaderOnly);
    assert_eq!(
        e.groups(),
        [
            "ferrocx_device_adaptor_v1",
            "ferrocx_device_flatmap_v1",
            "ferrocx_ccl_adaptor_v1"
        ]
    );
    let d = e.device.as_ref().expect("device");
    assert_eq!(
        d.root.present(),
        [
            "get_last_error",
            "device_count",
            "set_device",
            "get_device",
            "get_properties",
            "stream_query"
        ]
    );
    let dev = e.device().expect("device");
    assert_eq!(dev.device_count().expect("count"), 2);
    dev.set_device(1).expect("set_device");
    assert_eq!(dev.get_device().expect("get_device"), 1);
    let p = dev.properties(1).expect("properties");
    assert_eq!(
        (p.name.as_str(), p.arch, p.device_count),
        ("c test device", 1, 2)
    );
    assert!(p.capabilities.contains(Capabilities::FLAT_MAP));
    // A failure carries the plugin's own message.
    let err = dev.set_device(7).expect_err("out of range");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    assert!(err.to_string().contains("device out of range"), "{err}");
    // An absent entry is "unsupported", not a crash.
    let err = dev.init(&[]).expect_err("init is absent");
    assert!(
        matches!(err, AdaptorError::Unsupported { op: "init", .. }),
        "{err}"
    );

    // The optional group is callable by its own table.
    let flat = d.flatmap.as_ref().expect("flatmap group");
    let f = flat.get().flat_reserve.expect("flat_reserve");
    let mut base = DevicePtr::NULL;
    // SAFETY: a valid out-pointer, as the ABI requires.
    let s = unsafe { f(4096, &mut base) };
    assert_eq!(s, Status::UNSUPPORTED);

    let ccl = e.ccl().expect("ccl");
    assert_eq!(ccl.version().expect("version"), 20_800);
}

#[test]
fn a_file_that_is_not_elf_is_refused() {
    let mut r = Registry::empty();
    let dir = plugin_dir(
        &[],
        &[(&file_name("garbage"), b"this is not a shared library\n")],
    );
    r.add_plugin_dir(dir.path());
    let e = refused(&r, "garbage");
    assert_eq!(e.kind, LoadErrorKind::Open);
    let msg = e.to_string();
    assert!(
        msg.contains(&dir.path().join(file_name("garbage")).display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("dlopen failed"), "{msg}");
    assert!(r.entries().is_empty());
    assert_still_usable(&mut r);
}

#[test]
fn an_elf_with_no_ferrocx_symbol_is_refused() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&c_plugin("nosymbols")).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::NoSymbols);
    assert!(e.reason.contains("ferrocx_device_adaptor_v1"), "{e}");
    assert!(
        e.to_string().contains("libferrocx_adaptor_nosymbols.so"),
        "{e}"
    );
    assert_still_usable(&mut r);
}

#[test]
fn a_newer_major_in_the_header_is_refused_naming_both_versions() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&c_plugin("newmajor")).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::BadHeader);
    assert_eq!(e.symbol.as_deref(), Some("ferrocx_device_adaptor_v1"));
    assert!(
        e.reason.contains("ABI 2.x") && e.reason.contains("ABI 1.x"),
        "{e}"
    );
    assert_still_usable(&mut r);
}

#[test]
fn a_plugin_exporting_only_a_newer_major_is_refused() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&c_plugin("v2only")).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::NewerMajor);
    assert_eq!(e.symbol.as_deref(), Some("ferrocx_device_adaptor_v2"));
    assert!(
        e.reason.contains("ABI 2.x") && e.reason.contains("ABI 1.x"),
        "{e}"
    );
    assert!(e.reason.contains("ferrocx_ccl_adaptor_v2"), "{e}");
    assert_still_usable(&mut r);
}

#[test]
fn fields_past_an_older_minors_struct_size_are_absent() {
    let mut r = Registry::empty();
    let e = r
        .add_plugin(&c_plugin("oldminor"))
        .expect("an older minor still loads");
    let d = e.device.as_ref().expect("device");
    let beyond = d.root.beyond_size();
    assert_eq!(beyond.first(), Some(&"stream_create"));
    assert!(beyond.contains(&"stream_query") && beyond.contains(&"ipc_close"));
    // The plugin did set stream_query, but past its struct_size: it must read as absent.
    assert!(d.root.get().stream_query.is_none());
    assert!(d.root.get().device_count.is_some());
    assert!(!d.root.present().contains(&"stream_query"));
    let dev = e.device().expect("device");
    assert_eq!(dev.device_count().expect("count"), 2);
}

#[test]
fn a_bad_magic_is_refused() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&c_plugin("badmagic")).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::BadHeader);
    assert!(e.reason.contains("bad magic 0x12345678"), "{e}");
    assert_still_usable(&mut r);
}

#[test]
fn an_unresolved_symbol_is_refused_at_load_not_at_call() {
    let mut r = Registry::empty();
    let e = r.add_plugin(&c_plugin("undefined")).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::Open);
    assert!(e.reason.contains("fx_symbol_that_does_not_exist"), "{e}");
    assert_still_usable(&mut r);
}

#[test]
fn a_panic_inside_an_entry_becomes_an_internal_error() {
    let mut r = Registry::empty();
    let dev = r
        .add_plugin(&rust_plugin())
        .expect("loads")
        .device()
        .expect("device");
    // The test plugin panics on purpose when asked for device 666 (its PANIC_DEVICE).
    let err = dev.set_device(666).expect_err("panics inside");
    assert_eq!(err.status(), Status::INTERNAL_ERROR);
    let msg = err.to_string();
    assert!(
        msg.contains("panic") && msg.contains("deliberate panic in set_device(666)"),
        "{msg}"
    );
    // The process and the plugin go on.
    assert_eq!(dev.device_count().expect("count after the panic"), 1);
    dev.set_device(0).expect("set_device after the panic");
    assert_still_usable(&mut r);
}

#[test]
fn a_missing_directory_is_reported_and_skipped() {
    let mut r = Registry::empty();
    let missing = Path::new("/nonexistent/ferrocx-plugins");
    r.add_plugin_dir(missing);
    let e = r.rejected().first().expect("recorded").clone();
    assert_eq!(e.kind, LoadErrorKind::NotFound);
    assert_eq!(e.path, missing);
    assert!(e.reason.contains("cannot be read"), "{e}");
    assert_still_usable(&mut r);
}

#[test]
fn a_directory_of_good_and_broken_plugins_loads_the_good_ones() {
    let plugins: Vec<_> = [
        "testc",
        "newmajor",
        "v2only",
        "oldminor",
        "badmagic",
        "nosymbols",
        "undefined",
    ]
    .iter()
    .map(|v| c_plugin(v))
    .chain([rust_plugin()])
    .collect();
    let dir = plugin_dir(
        &plugins,
        &[(&file_name("garbage"), b"\x7fELF but not really")],
    );
    let mut r = Registry::empty();
    r.add_plugin_dir(dir.path());
    let mut names: Vec<_> = r.entries().iter().map(|e| e.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["oldminor", "testc", "testrust"]);
    let mut bad: Vec<_> = r
        .rejected()
        .iter()
        .map(|e| {
            (
                e.path.file_name().unwrap().to_string_lossy().into_owned(),
                e.kind,
            )
        })
        .collect();
    bad.sort();
    assert_eq!(
        bad,
        [
            (file_name("badmagic"), LoadErrorKind::BadHeader),
            (file_name("garbage"), LoadErrorKind::Open),
            (file_name("newmajor"), LoadErrorKind::BadHeader),
            (file_name("nosymbols"), LoadErrorKind::NoSymbols),
            (file_name("undefined"), LoadErrorKind::Open),
            (file_name("v2only"), LoadErrorKind::NewerMajor),
        ]
    );
    for e in r.rejected() {
        assert!(
            e.to_string().starts_with(&dir.path().display().to_string()),
            "{e}"
        );
    }
}

#[test]
fn the_first_directory_wins_and_a_name_clash_is_refused() {
    let a = plugin_dir(&[c_plugin("testc")], &[]);
    let b = plugin_dir(&[c_plugin("testc")], &[]);
    let mut r = Registry::empty();
    r.add_plugin_dir(a.path());
    r.add_plugin_dir(b.path());
    // The same file name in a later directory is shadowed, not opened and not an error.
    assert_eq!(r.entries().len(), 1);
    assert_eq!(
        r.entries()[0].source,
        Source::Plugin(a.path().join(file_name("testc")))
    );
    assert!(r.rejected().is_empty(), "{:?}", r.rejected());
    assert_eq!(r.shadowed().len(), 1);
    assert_eq!(r.shadowed()[0].0, b.path().join(file_name("testc")));

    // A different file whose tables carry a registered name is refused, naming the first.
    let c = tempfile::tempdir().expect("tempdir");
    let other = c.path().join(file_name("other"));
    std::fs::copy(c_plugin("testc"), &other).expect("copy");
    let e = r.add_plugin(&other).err().expect("refused");
    assert_eq!(e.kind, LoadErrorKind::Duplicate);
    assert!(
        e.reason.contains("\"testc\" is already registered by"),
        "{e}"
    );
    assert!(e.reason.contains(&a.path().display().to_string()), "{e}");
}

#[test]
fn a_library_is_opened_once() {
    let p = c_plugin("testc");
    let first = load_plugin(&p).expect("loads");
    let second = load_plugin(&p).expect("loads");
    assert!(Arc::ptr_eq(&first, &second));
    let e1 = load_plugin(&c_plugin("nosymbols")).err().expect("refused");
    let e2 = load_plugin(&c_plugin("nosymbols")).err().expect("refused");
    assert_eq!(e1, e2);
}

#[test]
fn the_host_adaptor_works_as_a_drop_in_plugin() {
    use ferrocx::abi::{DataType, ReduceOp};
    let mut r = Registry::empty();
    let e = r
        .add_plugin(&host_plugin())
        .expect("libferrocx_adaptor_host.so loads");
    assert_eq!(e.name, "host");
    assert_eq!(e.checked, Checked::AbiStable);
    assert_eq!(
        e.groups(),
        [
            "ferrocx_device_adaptor_v1",
            "ferrocx_device_vmm_v1",
            "ferrocx_device_flatmap_v1",
            "ferrocx_device_multicast_v1",
            "ferrocx_device_memops_v1",
            "ferrocx_ccl_adaptor_v1"
        ]
    );
    let dev = e.device().expect("device");
    dev.init(&[]).expect("init");
    assert!(
        dev.graph().is_none(),
        "the host device exports no graph group"
    );
    let props = dev.properties(0).expect("properties");
    assert_eq!(props.vendor, "host");
    assert!(props
        .capabilities
        .contains(Capabilities::VMM | Capabilities::IPC));
    // A one-rank communicator and an all-reduce, through the plugin's own tables.
    let ccl = e.ccl().expect("ccl");
    let uid = ccl.unique_id().expect("unique id");
    let comm = ccl.comm_init_rank(0, 1, 0, &uid, 5_000, &[]).expect("comm");
    let s = dev.stream_create().expect("stream");
    let n = 1001;
    let bytes = n * 4;
    let send = dev.mem_alloc(bytes, MemKind::DEVICE).expect("alloc");
    let recv = dev.mem_alloc(bytes, MemKind::DEVICE).expect("alloc");
    let input: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 7.0).collect();
    // SAFETY: `send` is a fresh allocation of `bytes`; `input` holds as many.
    unsafe { dev.mem_copy(send, DevicePtr(input.as_ptr() as u64), bytes) }.expect("upload");
    // SAFETY: `send` and `recv` hold `n` f32s, read and freed after the synchronize below.
    unsafe { ccl.all_reduce(send, recv, n, DataType::F32, ReduceOp::MAX, comm, s) }
        .expect("enqueue");
    dev.stream_synchronize(s).expect("all_reduce");
    let mut out = vec![0f32; n];
    // SAFETY: `recv` holds `bytes`, `out` as many.
    unsafe { dev.mem_copy(DevicePtr(out.as_mut_ptr() as u64), recv, bytes) }.expect("download");
    assert_eq!(out, input);
    ccl.comm_destroy(comm).expect("destroy");
    // SAFETY: the allocations made above; the stream was synchronized.
    unsafe { dev.mem_free(send, MemKind::DEVICE) }.expect("free");
    // SAFETY: as above.
    unsafe { dev.mem_free(recv, MemKind::DEVICE) }.expect("free");
    dev.stream_destroy(s).expect("stream");
}

#[test]
fn multicast_on_with_a_device_without_the_group_is_an_error_at_selection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ferrocx.toml");
    let text = |multicast: &str| {
        format!(
            "[[cluster]]\nname = \"t\"\ndevice = \"testrust\"\nccl = \"testrust\"\nmulticast = \"{multicast}\"\n"
        )
    };
    let mut r = Registry::empty();
    r.add_plugin(&rust_plugin()).expect("the Rust plugin loads");

    std::fs::write(&path, text("on")).expect("write the config");
    let config = ferrocx::config::Config::load(&path).expect("a valid file");
    let err = r
        .select(&config, 0)
        .err()
        .expect("the test plugin has no multicast group");
    assert_eq!(
        (err.kind(), err.line(), err.key()),
        (
            ferrocx::config::ConfigErrorKind::InvalidValue,
            Some(5),
            Some("cluster[0].multicast")
        ),
        "{err}"
    );
    assert!(err.to_string().contains("has no multicast group"), "{err}");

    std::fs::write(&path, text("auto")).expect("write the config");
    let config = ferrocx::config::Config::load(&path).expect("a valid file");
    assert!(r.select(&config, 0).is_ok(), "auto selects it");
}
