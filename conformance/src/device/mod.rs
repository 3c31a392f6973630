//! The device part: memory, streams and events, host functions, the optional groups, and the
//! error codes for bad arguments. One process is enough for all of it (IPC, which needs a
//! second process, runs in the CCL part).
//!
//! The suite needs `mem_alloc`, `mem_free`, `mem_copy` and `get_last_error` to run at all: if
//! one is absent, "required entries" fails and the checks that move data are skipped.

mod arguments;
mod contract;
mod graph;
mod groups;
mod memops;
pub(crate) mod memory;
mod probe;
mod streams;

use std::collections::HashMap;
use std::sync::Mutex;

use ferrocx::abi::{AbiTable, Capabilities, DeviceProperties};
use ferrocx::adaptor::Device;

use crate::boundary::{ensure, fail, raw_call, DeviceApi, Mark, Res, Verdict};
use crate::report::{Outcome, Report};
use crate::runner::Runner;

/// Device entries without which the suite cannot move data.
pub const REQUIRED_ENTRIES: [&str; 4] = ["get_last_error", "mem_alloc", "mem_free", "mem_copy"];

/// Most devices the kit selects in turn (it never guesses device numbers beyond the count).
const MAX_DEVICES: i32 = 8;

/// Runs the device checks in this process.
pub fn check_device(dev: &Device) -> Report {
    let mut r = Runner::new(None);
    run(&mut r, dev);
    r.finish()
}

/// The device checks, into `r`.
pub(crate) fn run(r: &mut Runner<'_>, dev: &Device) {
    let mark = Mark::now();
    let api = DeviceApi::new(dev);
    let missing = missing_entries(&api, &REQUIRED_ENTRIES);
    let required = if claims_nothing(dev.tables().root.present()) {
        // A table with every entry absent (the SDK template as generated) claims nothing: it
        // is not a failure, and every check says so.
        let o = Outcome::not_claimed("the device table exports every entry as absent");
        r.record("device", "required entries", o.clone());
        o
    } else {
        r.check("device", "required entries", || {
            ensure(missing.is_empty(), || {
                format!(
                    "absent: {} (the suite needs them to move data)",
                    missing.join(", ")
                )
            })
        })
    };
    r.check(
        "device",
        "a call before init works or returns NOT_INITIALIZED",
        || contract::before_init(&api),
    );
    let init = r.check("device", "init", || Ok(init_once(&api)?));
    // An absent `init` means there is nothing to initialise.
    let init = if init.is_absent() {
        Outcome::Pass
    } else {
        init
    };
    let memory = needs("the required entries", &required).or_else(|| needs("init", &init));
    r.check("device", "device count and properties", || properties(&api));
    r.check("device", "set_device and get_device", || select(&api));
    r.check("device", "capabilities match the tables", || {
        capabilities(&api)
    });
    memory::run(r, &api, &memory);
    streams::run(r, &api, &memory);
    check_if(
        r,
        &memory,
        "the null stream is the default stream: in order, synchronized",
        || contract::null_stream(&api),
    );
    let host_funcs = api.root().launch_host_func.is_some();
    check_if(
        r,
        &needs("init", &init),
        "event_elapsed_ms: untimed event, record not completed",
        || contract::elapsed_edges(&api, host_funcs),
    );
    check_if(
        r,
        &memory,
        "bad argument: mem_free with the wrong kind",
        || contract::wrong_kind(&api),
    );
    r.record(
        "device",
        crate::ccl::ipc::NAME,
        crate::ccl::ipc::device_row(api.root()),
    );
    groups::run(r, &api, &memory);
    memops::run(r, &api, &memory);
    graph::run(r, &api, &memory);
    arguments::run(r, &api, &memory);
    r.boundary("device", mark);
}

/// `true` when a table's present entries are at most `get_last_error` and `get_limits` (which
/// the SDK always provides: a message and a declaration, no operation): the adaptor claims
/// nothing of that table.
pub(crate) fn claims_nothing(present: Vec<&'static str>) -> bool {
    present
        .iter()
        .all(|e| matches!(*e, "get_last_error" | "get_limits"))
}

/// `Some(skip)` when a prerequisite check did not pass: checks that need it are skipped with
/// the reason (an absent prerequisite keeps its "absent" label).
pub(crate) fn needs(what: &str, prerequisite: &Outcome) -> Option<Outcome> {
    match prerequisite {
        Outcome::Pass => None,
        o if o.is_absent() || o.is_not_claimed() => Some(o.clone()),
        Outcome::Skip(why) => Some(Outcome::Skip(format!("needs {what}: {why}"))),
        Outcome::Fail(_) => Some(Outcome::Skip(format!("needs {what}, which failed"))),
    }
}

/// Runs `body` as check `name` unless `need` says why it cannot run.
pub(crate) fn check_if(
    r: &mut Runner<'_>,
    need: &Option<Outcome>,
    name: &str,
    body: impl FnOnce() -> Verdict,
) -> Outcome {
    match need {
        Some(skip) => {
            r.record("device", name, skip.clone());
            skip.clone()
        }
        None => r.check("device", name, body),
    }
}

/// The names of `entries` absent from the root table.
pub(crate) fn missing_entries(api: &DeviceApi, entries: &[&'static str]) -> Vec<&'static str> {
    let present = api.dev.tables().root.present();
    entries
        .iter()
        .filter(|e| !present.contains(e))
        .copied()
        .collect()
}

/// `init` once per process and adaptor; later calls return the first outcome.
pub(crate) fn init_once(api: &DeviceApi) -> Res<()> {
    static DONE: Mutex<Option<HashMap<String, Res<()>>>> = Mutex::new(None);
    let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
    done.get_or_insert_with(HashMap::new)
        .entry(api.dev.name().to_string())
        .or_insert_with(|| api.seen(api.dev.init(&[])))
        .clone()
}

fn properties(api: &DeviceApi) -> Verdict {
    let count = api.seen(api.dev.device_count())?;
    ensure(count >= 1, || {
        format!("device_count reports {count} devices; at least one is needed")
    })?;
    let p = api.seen(api.dev.properties(0))?;
    ensure(p.device_count == count, || {
        format!(
            "get_properties(0) says {} devices, device_count {count}",
            p.device_count
        )
    })?;
    ensure(!p.vendor.is_empty() && !p.name.is_empty(), || {
        format!(
            "vendor {:?} and name {:?} must both be non-empty",
            p.vendor, p.name
        )
    })?;
    // An older caller's struct: the adaptor must write no byte past its `struct_size`.
    let mut old = DeviceProperties {
        struct_size: std::mem::offset_of!(DeviceProperties, name) as u32,
        capabilities: Capabilities(0x5A5A_5A5A_5A5A_5A5A),
        total_memory: 0xA5A5_A5A5,
        arch: 0xA5A5,
        device_count: -77,
        ..DeviceProperties::default()
    };
    old.name = [0x5A; 64];
    raw_call!(api, api.root(), get_properties(0, &mut old))?;
    let untouched = old.name.iter().all(|&c| c == 0x5A)
        && old.capabilities == Capabilities(0x5A5A_5A5A_5A5A_5A5A)
        && old.total_memory == 0xA5A5_A5A5
        && old.arch == 0xA5A5
        && old.device_count == -77;
    ensure(untouched, || {
        format!(
            "get_properties wrote past the caller's struct_size ({} bytes)",
            old.struct_size
        )
    })
}

fn select(api: &DeviceApi) -> Verdict {
    let count = api.seen(api.dev.device_count())?;
    for d in 0..count.clamp(1, MAX_DEVICES) {
        api.seen(api.dev.set_device(d))?;
        let got = api.seen(api.dev.get_device())?;
        if got != d {
            // Leave the thread on device 0 for the checks that follow.
            let _ = api.seen(api.dev.set_device(0));
            return Err(fail(format!(
                "after set_device({d}), get_device returns {got}"
            )));
        }
    }
    api.seen(api.dev.set_device(0))?;
    Ok(())
}

/// Each capability bit set promises entries; a bit without its entries is a lie a caller
/// would act on.
fn capabilities(api: &DeviceApi) -> Verdict {
    let caps = api.seen(api.dev.properties(0))?.capabilities;
    // The entries present, from the capabilities every reader shares (probed once).
    let t = api.dev.caps();
    let root = t.root.present.clone();
    let group = |present: Option<Vec<&'static str>>, all: &[(&'static str, usize)]| {
        let present = present.unwrap_or_default();
        all.iter()
            .map(|(n, _)| *n)
            .filter(|n| !present.contains(n))
            .collect::<Vec<_>>()
    };
    let mut wrong = Vec::new();
    let root_lacks = |names: &[&'static str]| -> Vec<&'static str> {
        names
            .iter()
            .filter(|n| !root.contains(n))
            .copied()
            .collect()
    };
    let promises: [(Capabilities, &str, Vec<&'static str>); 7] = [
        (
            Capabilities::IPC,
            "ipc",
            root_lacks(&["ipc_export", "ipc_import", "ipc_close"]),
        ),
        (
            Capabilities::HOST_FUNC,
            "host_func",
            root_lacks(&["launch_host_func"]),
        ),
        (
            Capabilities::STREAM_WRAP,
            "stream_wrap",
            root_lacks(&["stream_wrap"]),
        ),
        (
            Capabilities::TIMED_EVENTS,
            "timed_events",
            root_lacks(&["event_elapsed_ms"]),
        ),
        (
            Capabilities::VMM,
            "vmm",
            group(
                t.vmm.as_ref().map(|g| g.present.clone()),
                ferrocx::abi::DeviceVmmV1::entries(),
            ),
        ),
        (
            Capabilities::FLAT_MAP,
            "flat_map",
            group(
                t.flatmap.as_ref().map(|g| g.present.clone()),
                ferrocx::abi::DeviceFlatMapV1::entries(),
            ),
        ),
        (
            Capabilities::MULTICAST,
            "multicast",
            group(
                t.multicast.as_ref().map(|g| g.present.clone()),
                ferrocx::abi::DeviceMulticastV1::entries(),
            ),
        ),
    ];
    for (bit, name, lacking) in promises {
        if caps.contains(bit) && !lacking.is_empty() {
            wrong.push(format!("{name} is set but {} absent", lacking.join(", ")));
        }
    }
    ensure(wrong.is_empty(), || wrong.join("; "))
}
