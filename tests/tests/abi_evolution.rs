//! ABI evolution with real `.so` files: ABI 1.1 appended `mem_get_info` to the device table.
//!
//! A plugin compiled against the 1.0 header (minor 0, `struct_size` ending before
//! `mem_get_info`) still loads and the entry reads as absent; a 1.1 plugin has it; a plugin of a
//! newer minor (1.7, a larger table) loads with its extra entries ignored; a plugin that also
//! exports a future major's table is loaded through v1 with a note. The C plugins are
//! `plugins/c/abiplugin.c`, built by the build script.

mod ferrocx_cli;

use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};

use ferrocx::abi::{AbiTable, DeviceAdaptorV1, MemKind, Status, ABI_MAJOR, ABI_MINOR};
use ferrocx::loader::Checked;
use ferrocx::registry::{AdaptorEntry, Registry};
use ferrocx_tests::{file_name, host_plugin, plugin_dir, rust_plugin};

/// What the C plugins' `mem_get_info` reports.
const C_FREE: usize = 3 << 20;
const C_TOTAL: usize = 8 << 20;

/// The size of a device table compiled against the ABI 1.0 header.
const V1_0_SIZE: usize = offset_of!(DeviceAdaptorV1, mem_get_info);

fn abi_plugin(variant: &str) -> PathBuf {
    Path::new(env!("FERROCX_TEST_C_PLUGINS")).join(file_name(variant))
}

fn load<'r>(r: &'r mut Registry, path: &Path) -> &'r AdaptorEntry {
    r.add_plugin(path)
        .unwrap_or_else(|e| panic!("{} must load: {e}", path.display()))
}

/// Calls the raw `mem_get_info` entry of a loaded table.
fn mem_get_info(e: &AdaptorEntry) -> Result<(usize, usize), Status> {
    let d = e.device.as_ref().expect("device table");
    let f = d.root.get().mem_get_info.expect("mem_get_info present");
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two valid out-pointers, as the ABI requires.
    let s = unsafe { f(&mut free, &mut total) };
    if s.is_success() {
        Ok((free, total))
    } else {
        Err(s)
    }
}

#[test]
fn this_build_speaks_abi_1_3_and_mem_get_info_is_the_last_device_entry() {
    assert_eq!((ABI_MAJOR, ABI_MINOR), (1, 3));
    let entries = DeviceAdaptorV1::entries();
    assert_eq!(entries.last(), Some(&("mem_get_info", V1_0_SIZE)));
    assert_eq!(V1_0_SIZE + size_of::<usize>(), size_of::<DeviceAdaptorV1>());
    // The 1.0 table ended with `ipc_close`: appending kept every older offset.
    assert_eq!(entries[entries.len() - 2].0, "ipc_close");
}

#[test]
fn a_1_0_plugin_loads_and_mem_get_info_reads_as_absent() {
    let mut r = Registry::empty();
    let e = load(&mut r, &abi_plugin("abi10"));
    assert_eq!(e.name, "abi10");
    assert_eq!(e.checked, Checked::HeaderOnly);
    assert_eq!(e.abi_version(), (1, 0));
    let d = e.device.as_ref().expect("device");
    assert_eq!(d.root.declared_size(), V1_0_SIZE);
    assert_eq!(d.root.beyond_size(), ["mem_get_info"]);
    // The plugin's initializer sets mem_get_info, but past its struct_size: never read.
    assert!(d.root.get().mem_get_info.is_none());
    assert!(!d.root.present().contains(&"mem_get_info"));
    assert!(
        !d.root.absent().contains(&"mem_get_info"),
        "beyond, not absent"
    );
    // Everything within the 1.0 table works.
    let dev = e.device().expect("device");
    assert_eq!(dev.device_count().expect("device_count"), 1);
    dev.set_device(0).expect("set_device");
}

#[test]
fn a_1_1_plugin_has_mem_get_info() {
    let mut r = Registry::empty();
    let e = load(&mut r, &abi_plugin("abi11"));
    assert_eq!(e.abi_version(), (1, 1));
    let d = e.device.as_ref().expect("device");
    assert_eq!(d.root.declared_size(), size_of::<DeviceAdaptorV1>());
    assert!(d.root.beyond_size().is_empty());
    assert!(d.root.present().contains(&"mem_get_info"));
    assert_eq!(mem_get_info(e), Ok((C_FREE, C_TOTAL)));

    // A null out-pointer is refused with the plugin's own message.
    let f = d.root.get().mem_get_info.expect("present");
    let mut total = 0usize;
    // SAFETY: a null `free` is what is being tested; `total` is valid.
    let s = unsafe { f(std::ptr::null_mut(), &mut total) };
    assert_eq!(s, Status::INVALID_ARGUMENT);
    let last = d.root.get().get_last_error.expect("get_last_error");
    // SAFETY: get_last_error returns a NUL-terminated string, valid until the next call.
    let msg = unsafe { std::ffi::CStr::from_ptr(last()) }.to_string_lossy();
    assert!(msg.contains("mem_get_info"), "{msg}");
}

#[test]
fn rust_plugins_built_with_the_sdk_export_mem_get_info() {
    let mut r = Registry::empty();

    // The test plugin: 1 GiB, less what is allocated.
    let e = load(&mut r, &rust_plugin());
    assert_eq!(e.abi_version(), (1, ABI_MINOR));
    assert_eq!(e.checked, Checked::AbiStable);
    let (free, total) = mem_get_info(e).expect("mem_get_info");
    assert_eq!(total, 1 << 30);
    let dev = e.device().expect("device");
    let p = dev.mem_alloc(1 << 20, MemKind::DEVICE).expect("alloc");
    let (free_after, _) = mem_get_info(e).expect("mem_get_info");
    assert_eq!(free - free_after, 1 << 20);
    // SAFETY: the allocation made above, unused.
    unsafe { dev.mem_free(p, MemKind::DEVICE) }.expect("free");
    // The SDK's trampoline refuses a null out-pointer before the adaptor is called.
    let f = e.device.as_ref().unwrap().root.get().mem_get_info.unwrap();
    let mut x = 0usize;
    assert_eq!(
        // SAFETY: a null `total` is what is being tested; `free` is valid.
        unsafe { f(&mut x, std::ptr::null_mut()) },
        Status::INVALID_ARGUMENT
    );

    // The host adaptor: the shared-memory filesystem its device memory lives in.
    let mut r = Registry::empty();
    let host = load(&mut r, &host_plugin());
    let (free, total) = mem_get_info(host).expect("host mem_get_info");
    assert!(total > 0 && free <= total, "free {free}, total {total}");
}

#[test]
fn a_newer_minor_loads_and_its_extra_entries_are_ignored() {
    let mut r = Registry::empty();
    let e = load(&mut r, &abi_plugin("abi17"));
    assert_eq!(e.abi_version(), (1, 7));
    let d = e.device.as_ref().expect("device");
    // Three entries of minors this build does not know follow the 1.1 table.
    assert_eq!(
        d.root.declared_size(),
        size_of::<DeviceAdaptorV1>() + 3 * size_of::<usize>()
    );
    assert!(d.root.beyond_size().is_empty());
    assert_eq!(
        d.root.present(),
        [
            "get_last_error",
            "device_count",
            "set_device",
            "get_device",
            "mem_get_info"
        ]
    );
    // The known entries work; the unknown ones (which abort if called) are never touched.
    assert_eq!(mem_get_info(e), Ok((C_FREE, C_TOTAL)));
    assert_eq!(
        e.device().expect("device").device_count().expect("count"),
        1
    );
}

#[test]
fn a_plugin_exporting_two_majors_is_loaded_through_v1_with_a_note() {
    let mut r = Registry::empty();
    let e = load(&mut r, &abi_plugin("twomajors"));
    assert_eq!(e.abi_version(), (1, 1));
    assert_eq!(
        e.notes,
        ["ignored `ferrocx_device_adaptor_v2` (a newer ABI major); using the v1 tables"]
    );
    // The v2 table says 99 devices; the v1 table, the one in use, says 1.
    assert_eq!(
        e.device().expect("device").device_count().expect("count"),
        1
    );
    assert_eq!(mem_get_info(e), Ok((C_FREE, C_TOTAL)));
}

#[test]
fn ferrocx_info_shows_each_version_and_what_it_ignored() {
    let dir = plugin_dir(
        &["abi10", "abi11", "abi17", "twomajors"].map(abi_plugin),
        &[],
    );
    let info = ferrocx_cli::ferrocx_ok(&["info"], dir.path());
    assert!(
        info.contains(&format!("(plugin ABI 1.{ABI_MINOR})")),
        "{info}"
    );

    let abi10 = ferrocx_cli::info_section(&info, "abi10").join("\n");
    assert!(abi10.contains("ABI 1.0, checked by headers"), "{abi10}");
    assert!(
        abi10.contains(&format!(
            "past struct_size {V1_0_SIZE} (older minor): mem_get_info"
        )),
        "{abi10}"
    );

    let abi11 = ferrocx_cli::info_section(&info, "abi11").join("\n");
    assert!(abi11.contains("ABI 1.1"), "{abi11}");
    assert!(!abi11.contains("past struct_size"), "{abi11}");

    let abi17 = ferrocx_cli::info_section(&info, "abi17").join("\n");
    assert!(abi17.contains("ABI 1.7"), "{abi17}");
    assert!(!abi17.contains("past struct_size"), "{abi17}");

    let two = ferrocx_cli::info_section(&info, "twomajors").join("\n");
    assert!(
        two.contains("note: ignored `ferrocx_device_adaptor_v2` (a newer ABI major)"),
        "{two}"
    );
    assert!(two.contains("device: 1 device(s)"), "{two}");
}

#[test]
fn the_kernel_group_is_probed_and_launches_through_the_table() {
    use ferrocx::abi::{DeviceKernelV1, ImageFormat};
    let mut r = Registry::empty();
    let e = load(&mut r, &rust_plugin());
    assert!(e.groups().contains(&DeviceKernelV1::SYMBOL));
    let tables = e.device.as_ref().expect("device");
    let kernel = tables.kernel.as_ref().expect("kernel group");
    assert_eq!(kernel.version(), (1, ABI_MINOR));
    assert!(kernel.absent().is_empty() && kernel.beyond_size().is_empty());

    let dev = e.device().expect("device");
    dev.init(&[]).expect("init");
    let caps = dev.caps();
    assert!(caps.has_kernels());
    let fake = ImageFormat(0x1001);
    assert_eq!(caps.ordinal(0).expect("device 0").image_formats, [fake]);
    assert!(!caps.ordinal(0).expect("device 0").loads(ImageFormat::CUBIN));

    let k = dev.kernel().expect("kernel group");
    let err = k
        .load(b"fill_u32", ImageFormat::CUBIN)
        .err()
        .expect("not its format");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    let module = k.load(b"fill_u32\nother", fake).expect("load");
    assert_eq!(
        module.function("missing").err().expect("unknown").status(),
        Status::INVALID_ARGUMENT
    );
    let fill = module.function("fill_u32").expect("function");
    drop(module); // the function keeps its module loaded
    let n = 37usize;
    let buf = dev.mem_alloc(4 * n, MemKind::DEVICE).expect("alloc");
    // The test device runs work at once, on the null stream too.
    let stream = ferrocx::abi::Stream::NULL;
    let (mut dst, mut value, mut count) = (buf.0, 0xfeed_u32, n as u64);
    let mut args = [
        (&mut dst as *mut u64).cast(),
        (&mut value as *mut u32).cast(),
        (&mut count as *mut u64).cast(),
    ];
    // SAFETY: fill_u32(u64, u32, u64) writes `count` u32 at `dst`, an allocation of 4n bytes.
    unsafe { fill.launch([1, 1, 1], [32, 1, 1], 0, &mut args, stream) }.expect("launch");
    // SAFETY: the test device's memory is a live host allocation of 4n bytes, written above.
    let back = unsafe { std::slice::from_raw_parts(buf.0 as *const u32, n) }.to_vec();
    assert!(back.iter().all(|&v| v == 0xfeed), "{back:x?}");
    // A zero grid is refused by the SDK before the adaptor sees it.
    // SAFETY: refused before any argument is read.
    let err =
        unsafe { fill.launch([0, 1, 1], [1, 1, 1], 0, &mut args, stream) }.expect_err("zero grid");
    assert_eq!(err.status(), Status::INVALID_ARGUMENT);
    // SAFETY: the allocation above, no longer used (the test device ran the kernel at once).
    unsafe { dev.mem_free(buf, MemKind::DEVICE) }.expect("free");
}

#[test]
fn a_1_1_ccl_without_query_support_supports_what_it_exports() {
    // The C test plugin's CCL table leaves query_support NULL, as a 1.1 table has none.
    let mut r = Registry::empty();
    let e = load(&mut r, &ferrocx_tests::c_plugin("testc"));
    let ccl = e.ccl().expect("ccl");
    let caps = ccl.caps();
    assert!(!caps.root.has("query_support"));
    // It exports neither window_register nor mem_register: both absent, nothing probed.
    assert!(caps
        .runtime
        .iter()
        .all(|(_, s)| *s == ferrocx::adaptor::RuntimeSupport::Absent));
    assert!(caps.supports("get_version"));
    assert!(!caps.supports("all_reduce"));
    // Nor get_limits (ABI 1.3): no limits.
    assert!(!caps.root.has("get_limits"));
    assert_eq!(ccl.limits().expect("limits"), ferrocx::abi::CclLimits::NONE);
    assert_eq!(caps.limits, ferrocx::abi::CclLimits::NONE);
}

/// A CCL table of `minor` whose `get_limits` (set in memory either way) declares one rank.
fn ccl_table_of_minor(minor: u16) -> ferrocx::adaptor::Ccl {
    use ferrocx::abi::{AbiHeader, CclAdaptorV1, CclLimits};
    use ferrocx::loader::{CclTables, Table};
    unsafe extern "C" fn one_rank(limits: *mut CclLimits) -> Status {
        // SAFETY: the caller passes a live struct (the core's `Ccl::limits`).
        unsafe { (*limits).max_ranks = 1 };
        Status::SUCCESS
    }
    // SAFETY: every field after the header is an `Option` of a function pointer, for which
    // all-zero bytes are `None`; the header is set right after.
    let mut t: CclAdaptorV1 = unsafe { std::mem::zeroed() };
    t.header = AbiHeader::new::<CclAdaptorV1>(c"limited");
    t.header.abi_minor = minor;
    if minor < 3 {
        t.header.struct_size = offset_of!(CclAdaptorV1, get_limits) as u32;
    }
    t.get_limits = Some(one_rank);
    let table = Table::builtin(Box::leak(Box::new(t))).expect("a valid table");
    ferrocx::adaptor::Ccl::new(std::sync::Arc::new(CclTables::new(table)))
}

#[test]
fn get_limits_past_a_1_2_tables_struct_size_reads_as_no_limits() {
    let old = ccl_table_of_minor(2);
    assert!(old.tables().root.beyond_size().contains(&"get_limits"));
    assert_eq!(old.limits().expect("limits"), ferrocx::abi::CclLimits::NONE);
    let new = ccl_table_of_minor(3);
    let limits = new.limits().expect("limits");
    assert_eq!(limits.max_ranks, 1);
    assert!(limits.allows_ranks(1) && !limits.allows_ranks(2));
}
