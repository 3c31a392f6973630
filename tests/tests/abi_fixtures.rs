//! Plugins built against ABI 1.1, before ABI 1.2 (`fixtures/abi-1.1/`), and against ABI 1.2,
//! before ABI 1.3 (`fixtures/abi-1.2/`), prebuilt and committed (see the READMEs there), load
//! in this build and pass the conformance kit unchanged: the SDK template filled in (the
//! out-of-tree Rust example) and the C example. Neither exports a later group, so the kernel
//! group (1.2) and the memops group (1.3) read as absent.
//!
//! Each test re-runs its own executable as the kit's worker processes (the kit's documented
//! way for a `cargo test`).

use std::path::PathBuf;

use ferrocx::abi::{AbiTable, CclAdaptorV1, DeviceAdaptorV1, DeviceKernelV1};
use ferrocx::loader::Checked;
use ferrocx::registry::Registry;
use ferrocx_conformance::{run, run_worker, Options, Outcome, Target, WorkerCommand};

fn fixture(minor: u16, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("fixtures/abi-1.{minor}"))
        .join(format!("libferrocx_adaptor_{name}.so"))
}

/// Loads the fixture built against ABI 1.`minor`, checks what such a device-only plugin looks
/// like, and runs the kit on it (or, in a worker process, the part the driver asked for).
fn loads_and_conforms(minor: u16, name: &str, checked: Checked, test: &str) {
    let mut registry = Registry::empty();
    let entry = registry
        .add_plugin(&fixture(minor, name))
        .unwrap_or_else(|e| panic!("the ABI 1.{minor} fixture {name} must load: {e}"));
    let target = Target::new(entry);
    if run_worker(&target).is_some() {
        return; // this process is one of the kit's workers
    }
    assert_eq!(entry.name, name);
    assert_eq!(entry.checked, checked);
    assert_eq!(entry.abi_version(), (1, minor));
    assert!(entry.ccl.is_none(), "a device-only plugin");
    assert_eq!(entry.groups(), [DeviceAdaptorV1::SYMBOL]);
    let tables = entry.device.as_ref().expect("device tables");
    assert_eq!(tables.root.declared_size(), size_of::<DeviceAdaptorV1>());
    assert!(tables.kernel.is_none());
    assert!(tables.memops.is_none());
    let device = entry.device().expect("device");
    device.init(&[]).expect("init");
    let caps = device.caps();
    assert_eq!(caps.root.version, (1, minor));
    assert!(caps.kernel.is_none() && !caps.has_kernels());
    assert!(caps.memops.is_none() && !caps.has_memops() && !device.has_memops());
    assert!(caps.groups().is_empty());
    let ordinal = caps.ordinal(0).expect("device 0 listed");
    assert!(ordinal.image_formats.is_empty());
    assert!(device.kernel().is_none());
    assert!(!DeviceKernelV1::SYMBOL.is_empty() && !CclAdaptorV1::SYMBOL.is_empty());

    let worker = WorkerCommand::this_test(test).expect("current_exe");
    let report = run(&target, &worker, &Options::default());
    assert!(report.passed(), "{}", report.to_text());
    let text = report.to_text();
    assert!(text.contains(" 0 failed"), "{text}");
    // The device part ran (memory round trips, streams, events), not only the ABI checks.
    let passed = |group: &str| {
        report
            .checks
            .iter()
            .filter(|c| c.group.starts_with(group) && c.outcome == Outcome::Pass)
            .count()
    };
    assert!(passed("device") >= 10, "{text}");
    assert!(passed("abi") >= 3, "{text}");
}

#[test]
fn the_abi_1_1_rust_plugin_loads_and_passes_the_conformance_kit() {
    loads_and_conforms(
        1,
        "outoftree",
        Checked::AbiStable,
        "the_abi_1_1_rust_plugin_loads_and_passes_the_conformance_kit",
    );
}

#[test]
fn the_abi_1_1_c_plugin_loads_and_passes_the_conformance_kit() {
    loads_and_conforms(
        1,
        "cexample",
        Checked::HeaderOnly,
        "the_abi_1_1_c_plugin_loads_and_passes_the_conformance_kit",
    );
}

#[test]
fn the_abi_1_2_rust_plugin_loads_and_passes_the_conformance_kit() {
    loads_and_conforms(
        2,
        "outoftree",
        Checked::AbiStable,
        "the_abi_1_2_rust_plugin_loads_and_passes_the_conformance_kit",
    );
}

#[test]
fn the_abi_1_2_c_plugin_loads_and_passes_the_conformance_kit() {
    loads_and_conforms(
        2,
        "cexample",
        Checked::HeaderOnly,
        "the_abi_1_2_c_plugin_loads_and_passes_the_conformance_kit",
    );
}
