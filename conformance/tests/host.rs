//! The built-in host adaptor passes the whole suite on 1 and 3 ranks, driven through the
//! library as a vendor's `cargo test` would: this test executable re-runs itself as the
//! workers (`run_worker` answers in those processes).

use std::time::Duration;

use ferrocx::registry::Registry;
use ferrocx_conformance::{run, run_worker, Options, Outcome, Report, Target, WorkerCommand};

fn conformance(test: &str, ranks: usize) -> Option<Report> {
    ferrocx_adaptor_host::link();
    let registry = Registry::with_builtins();
    let entry = registry
        .device("host")
        .expect("the host adaptor is built in");
    let target = Target::new(entry);
    if run_worker(&target).is_some() {
        return None;
    }
    let worker = WorkerCommand::this_test(test).expect("current_exe");
    let options = Options {
        ranks,
        timeout: Duration::from_secs(20),
    };
    let report = run(&target, &worker, &options);
    println!("{}", report.to_text());
    assert!(report.passed(), "{}", report.to_text());
    Some(report)
}

/// Checks that must have run (not been skipped) for the host adaptor, whatever the rank count.
const MUST_PASS: &[(&str, &str)] = &[
    ("abi", "ferrocx_device_adaptor_v1 header"),
    ("abi", "ferrocx_ccl_adaptor_v1 header"),
    ("abi", "no panic across the boundary (device)"),
    ("abi", "get_last_error set after each failure (device)"),
    ("device", "mem round trip (DEVICE)"),
    (
        "device",
        "re-recording an event does not redirect an earlier wait",
    ),
    (
        "device",
        "a wait follows the most recent record made before it",
    ),
    ("device", "host functions run once, in stream order"),
    (
        "device",
        "VMM: alloc, export and import a descriptor, release",
    ),
    (
        "device",
        "flat map: one allocation at two slots, through mem_copy",
    ),
    ("device", "bad argument: freed pointer (mem_free twice)"),
    (
        "device",
        "memops: a write on one stream releases a wait on another",
    ),
    ("device", "memops: wait GEQ compares with wrap-around"),
    ("device", "memops: wait EQ needs the exact value"),
    (
        "device",
        "memops: unknown flags and a null address are refused",
    ),
    ("abi", "ferrocx_device_memops_v1 header"),
    (
        "device",
        "a call before init works or returns NOT_INITIALIZED",
    ),
    (
        "device",
        "the null stream is the default stream: in order, synchronized",
    ),
    (
        "device",
        "event_elapsed_ms: untimed event, record not completed",
    ),
    ("device", "bad argument: mem_free with the wrong kind"),
    ("ccl", "all_reduce f32 sum"),
    ("ccl", "all_reduce bf16 avg"),
    ("ccl", "all_to_allv i64"),
    ("ccl", "grouped send/recv ring f32"),
    ("run", "worker processes exit cleanly"),
];

fn assert_ran(report: &Report, extra: &[(&str, &str)]) {
    for (group, name) in MUST_PASS.iter().chain(extra) {
        let c = report
            .find(group, name)
            .unwrap_or_else(|| panic!("{group}/{name} did not run:\n{}", report.to_text()));
        assert_eq!(c.outcome, Outcome::Pass, "{group}/{name}");
    }
}

#[test]
fn host_adaptor_conforms_on_one_rank() {
    let Some(report) = conformance("host_adaptor_conforms_on_one_rank", 1) else {
        return;
    };
    assert_ran(&report, &[]);
    // What needs a second process is skipped, with the reason.
    let abort = report
        .find("ccl", "comm_abort unblocks the peers of an aborted rank")
        .expect("abort listed");
    assert_eq!(abort.outcome, Outcome::Skip("needs 2 or more ranks".into()));
}

#[test]
fn host_adaptor_conforms_on_three_ranks() {
    let Some(report) = conformance("host_adaptor_conforms_on_three_ranks", 3) else {
        return;
    };
    assert_ran(
        &report,
        &[
            ("ccl", "comm_abort unblocks the peers of an aborted rank"),
            (
                "device",
                "IPC: export, open in another process, read, close",
            ),
        ],
    );
    // The host adaptor's multicast group is present (emulated); the kit calls only
    // mc_supported.
    let mc = report
        .find("abi", "ferrocx_device_multicast_v1 header")
        .expect("listed");
    assert!(matches!(mc.outcome, Outcome::Pass), "{:?}", mc.outcome);
    let mc = report
        .find("device", "multicast: mc_supported (no object is created)")
        .expect("listed");
    assert!(matches!(mc.outcome, Outcome::Pass), "{:?}", mc.outcome);
}
