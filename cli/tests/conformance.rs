//! `ferrocx conformance` against real plugin libraries: the host adaptor's `.so` conforms; the
//! Rust and C test plugins do not, and the table says why; and a wrapper of the host plugin
//! with one entry broken at a time shows the kit catches each kind of violation it claims to
//! (a wait that does not wait, a wrong reduction, a panic reported across the boundary, a
//! crash).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn ferrocx(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrocx"));
    c.args(args).env_remove("FERROCX_CONFIG");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run ferrocx")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(o)))
}

/// The check `group`/`name` of a JSON report.
fn check<'a>(doc: &'a Value, group: &str, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["group"] == group && c["name"] == name))
        .unwrap_or_else(|| panic!("no check {group}/{name} in {doc:#}"))
}

fn outcome<'a>(doc: &'a Value, group: &str, name: &str) -> (&'a str, &'a str) {
    let c = check(doc, group, name);
    (
        c["outcome"].as_str().unwrap_or(""),
        c["reason"].as_str().unwrap_or(""),
    )
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

#[test]
fn the_host_plugin_conforms_on_two_ranks() {
    let so = ferrocx_tests::host_plugin();
    let o = ferrocx(&["conformance", "--plugin", path(&so), "--ranks", "2"], &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("GROUP") && out.contains("RESULT") && out.contains("REASON"),
        "{out}"
    );
    for line in [
        "all_reduce f32 sum",
        "re-recording an event does not redirect an earlier wait",
        "comm_abort unblocks the peers of an aborted rank",
        "IPC: export, open in another process, read, close",
    ] {
        let row = out
            .lines()
            .find(|l| l.contains(line))
            .unwrap_or_else(|| panic!("no row {line:?}:\n{out}"));
        assert!(row.contains(" pass"), "{row}");
    }
    assert!(!out.contains("FAIL"), "{out}");
    assert!(out.contains("0 failed"), "{out}");
    assert!(
        out.contains("skipped (absent)"),
        "the window group is absent:\n{out}"
    );
}

#[test]
fn the_built_in_host_adaptor_conforms_in_json() {
    let o = ferrocx(
        &["conformance", "--adaptor", "host", "--ranks", "1", "--json"],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let doc = json(&o);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["failed"], 0);
    assert_eq!(doc["source"], "built-in");
    assert_eq!(outcome(&doc, "ccl", "all_to_allv i64").0, "pass");
    // One rank: what needs a peer process is skipped, with the reason.
    assert_eq!(
        outcome(
            &doc,
            "ccl",
            "comm_abort unblocks the peers of an aborted rank"
        ),
        ("skip", "needs 2 or more ranks")
    );
}

#[test]
fn the_rust_test_plugin_fails_with_reasons_and_its_panic_is_not_triggered() {
    let so = ferrocx_tests::rust_plugin();
    let o = ferrocx(&["conformance", "--plugin", path(&so), "--ranks", "2"], &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let row = out
        .lines()
        .find(|l| l.contains("streams: create, query, synchronize, destroy"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("FAIL"), "{row}");
    assert!(row.contains("stream_create returned UNSUPPORTED"), "{row}");
    assert!(row.contains("must be an absent entry"), "{row}");
    assert!(out.contains("NOT CONFORMANT"), "{out}");
    // The kit never selects device 666, on which the plugin panics on purpose.
    assert!(!out.contains("deliberate panic"), "{out}");

    let o = ferrocx(
        &[
            "conformance",
            "--plugin",
            path(&so),
            "--ranks",
            "2",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    let doc = json(&o);
    assert_eq!(doc["adaptor"], "testrust");
    let (result, reason) = outcome(
        &doc,
        "ccl",
        "communicator: comm_init_rank, count, rank, device",
    );
    assert_eq!(result, "fail");
    assert!(
        reason.contains("rank 0, rank 1: comm_init_rank returned UNSUPPORTED"),
        "{reason}"
    );
    assert_eq!(outcome(&doc, "ccl", "all_reduce f32 sum").0, "skip");
    assert_eq!(
        outcome(&doc, "abi", "no panic across the boundary (device)").0,
        "pass"
    );
    assert_eq!(
        outcome(&doc, "abi", "no panic across the boundary (ccl)").0,
        "pass"
    );
    let (result, reason) = outcome(&doc, "device", "bad argument: unknown memory kind");
    assert_eq!(result, "fail");
    assert!(reason.contains("MemKind(99) succeeded"), "{reason}");
}

#[test]
fn the_c_test_plugin_reports_absent_entries_as_skipped() {
    let so = ferrocx_tests::c_plugin("testc");
    let o = ferrocx(
        &[
            "conformance",
            "--plugin",
            path(&so),
            "--ranks",
            "2",
            "--json",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let doc = json(&o);
    let streams = check(
        &doc,
        "device",
        "streams: create, query, synchronize, destroy",
    );
    assert_eq!(streams["outcome"], "skip");
    assert_eq!(streams["absent"], true);
    assert!(streams["reason"]
        .as_str()
        .unwrap_or("")
        .contains("stream_create"));
    // What the suite cannot run without fails, naming the entries.
    let (result, reason) = outcome(&doc, "device", "required entries");
    assert_eq!(result, "fail");
    assert!(reason.contains("mem_alloc, mem_free, mem_copy"), "{reason}");
    let (result, reason) = outcome(&doc, "ccl", "required entries");
    assert_eq!(result, "fail");
    assert!(reason.contains("CCL `comm_init_rank`"), "{reason}");
    // What the plugin has still runs.
    assert_eq!(
        outcome(&doc, "device", "set_device and get_device").0,
        "pass"
    );

    let o = ferrocx(&["conformance", "--plugin", path(&so)], &[]);
    let out = text(&o);
    assert!(out.contains("skipped (absent)"), "{out}");
}

#[test]
fn usage_errors_exit_2_and_a_plugin_that_does_not_load_fails_with_the_reason() {
    assert_eq!(ferrocx(&["conformance"], &[]).status.code(), Some(2));
    let o = ferrocx(&["conformance", "--adaptor", "no-such-adaptor"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("no adaptor named"), "{}", text(&o));
    assert_eq!(
        ferrocx(&["conformance", "--adaptor", "host", "--ranks", "0"], &[])
            .status
            .code(),
        Some(2)
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let bogus = dir.path().join("libferrocx_adaptor_bogus.so");
    std::fs::write(&bogus, b"not a library").expect("write");
    let o = ferrocx(&["conformance", "--plugin", path(&bogus)], &[]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("the plugin loads"), "{out}");
    assert!(out.contains("dlopen failed"), "{out}");
}

/// The host plugin's tables with one entry broken, chosen by `$MUT` (built here from C).
const WRAPPER: &str = r#"
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include "ferrocx_plugin.h"

FerrocxDeviceAdaptorV1 ferrocx_device_adaptor_v1;
FerrocxCclAdaptorV1 ferrocx_ccl_adaptor_v1;
static FerrocxDeviceAdaptorV1 dev;
static FerrocxCclAdaptorV1 ccl;

static FerrocxStatus wait_noop(FerrocxStream s, FerrocxEvent e) { (void)s; (void)e; return 0; }
static FerrocxStatus version_panics(int32_t *v) { (void)v; return FerrocxStatus_INTERNAL_ERROR; }
static const char *panic_message(void) { return "get_version: panic inside the adaptor: boom"; }
static FerrocxStatus reduce_max_as_min(FerrocxDevicePtr s, FerrocxDevicePtr r, size_t n,
    FerrocxDataType t, FerrocxReduceOp op, FerrocxComm c, FerrocxStream st) {
    return ccl.all_reduce(s, r, n, t, op == FerrocxReduceOp_MAX ? FerrocxReduceOp_MIN : op, c, st);
}
static FerrocxStatus broadcast_crashes(FerrocxDevicePtr s, FerrocxDevicePtr r, size_t n,
    FerrocxDataType t, int32_t root, FerrocxComm c, FerrocxStream st) {
    (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st;
    raise(SIGSEGV);
    return 0;
}

__attribute__((constructor)) static void wrap(void) {
    void *h = dlopen(getenv("MUT_HOST"), RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    const FerrocxDeviceAdaptorV1 *d = dlsym(h, "ferrocx_device_adaptor_v1");
    const FerrocxCclAdaptorV1 *c = dlsym(h, "ferrocx_ccl_adaptor_v1");
    size_t n = d->header.struct_size < sizeof dev ? d->header.struct_size : sizeof dev;
    memcpy(&dev, d, n);
    memcpy(&ccl, c, sizeof ccl);
    ferrocx_device_adaptor_v1 = dev;
    ferrocx_ccl_adaptor_v1 = ccl;
    ferrocx_device_adaptor_v1.header.name = "hostmut";
    ferrocx_device_adaptor_v1.header.struct_size = (uint32_t)n;
    ferrocx_ccl_adaptor_v1.header.name = "hostmut";
    const char *m = getenv("MUT");
    if (!m) return;
    if (!strcmp(m, "wait")) ferrocx_device_adaptor_v1.stream_wait_event = wait_noop;
    if (!strcmp(m, "max")) ferrocx_ccl_adaptor_v1.all_reduce = reduce_max_as_min;
    if (!strcmp(m, "crash")) ferrocx_ccl_adaptor_v1.broadcast = broadcast_crashes;
    if (!strcmp(m, "panic")) {
        ferrocx_ccl_adaptor_v1.get_version = version_panics;
        ferrocx_ccl_adaptor_v1.get_last_error = panic_message;
    }
}
"#;

fn build_wrapper(dir: &Path) -> PathBuf {
    let src = dir.join("wrap.c");
    let so = dir.join("libferrocx_adaptor_hostmut.so");
    std::fs::write(&src, WRAPPER).expect("write the wrapper");
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-sdk/include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&so)
        .arg("-ldl")
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "{cc} failed on the wrapper");
    so
}

#[test]
fn a_broken_entry_is_caught_by_the_check_that_covers_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let so = build_wrapper(dir.path());
    let host = ferrocx_tests::host_plugin();
    let run = |m: &str| {
        let o = ferrocx(
            &[
                "conformance",
                "--plugin",
                path(&so),
                "--ranks",
                "2",
                "--json",
            ],
            &[("MUT_HOST", path(&host)), ("MUT", m)],
        );
        assert_eq!(o.status.code(), Some(1), "MUT={m}: {}", text(&o));
        json(&o)
    };

    let doc = run("wait");
    let (result, reason) = outcome(
        &doc,
        "device",
        "re-recording an event does not redirect an earlier wait",
    );
    assert_eq!(result, "fail", "{reason}");
    assert_eq!(
        outcome(
            &doc,
            "device",
            "stream_wait_event holds a stream until the record completes"
        )
        .0,
        "fail"
    );

    let doc = run("max");
    let (result, reason) = outcome(&doc, "ccl", "all_reduce f32 max");
    assert_eq!(result, "fail");
    assert!(reason.contains("expected"), "{reason}");
    assert_eq!(outcome(&doc, "ccl", "all_reduce f32 min").0, "pass");

    let doc = run("panic");
    let (result, reason) = outcome(&doc, "abi", "no panic across the boundary (ccl)");
    assert_eq!(result, "fail");
    assert!(reason.contains("get_version"), "{reason}");

    let doc = run("crash");
    let (result, reason) = outcome(&doc, "ccl", "broadcast f32");
    assert_eq!(result, "fail");
    assert!(
        reason.contains("SIGSEGV") && reason.contains("during this check"),
        "{reason}"
    );
    let (result, reason) = outcome(&doc, "run", "worker processes exit cleanly");
    assert_eq!(result, "fail");
    assert!(reason.contains("did not run"), "{reason}");
}
