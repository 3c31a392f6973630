//! Multi-process harness for the host CCL tests: the test executable re-runs itself as the
//! ranks of a job (one process each), passing the unique id and the rank in the environment.

#![allow(dead_code, unused_imports)]

use std::process::Child;

pub use ferrocx_test_support::fds;
use ferrocx_test_support::procs::rerun;
pub use ferrocx_test_support::procs::{assert_all_ok, wait, Outcome};
pub use ferrocx_test_support::{hex, unhex, Rng};

use ferrocx::adaptor::{Ccl, Device};
use ferrocx::registry::Registry;

/// Set in a child: the name of the worker test to run.
pub const ROLE: &str = "FERROCX_TEST_ROLE";

/// The host device and CCL through their tables, as the core uses them.
pub fn host() -> (Device, Ccl) {
    ferrocx_adaptor_host::link();
    let r = Registry::with_builtins();
    let e = r.device("host").expect("the host adaptor is built in");
    (e.device().expect("device"), e.ccl().expect("ccl"))
}

/// This process's role, rank and world when it is a worker.
pub fn worker(name: &str) -> Option<(usize, usize)> {
    if std::env::var(ROLE).ok()? != name {
        return None;
    }
    let rank = std::env::var("RANK").ok()?.parse().ok()?;
    let world = std::env::var("WORLD_SIZE").ok()?.parse().ok()?;
    Some((rank, world))
}

/// Starts `n` ranks running the worker test `name`, with a fresh unique id and job id.
pub fn spawn(name: &str, n: usize, extra: &[(&str, String)]) -> Vec<Child> {
    let (_, ccl) = host();
    let uid = ccl.unique_id().expect("unique id");
    let job = format!("test-{}-{}", std::process::id(), name);
    (0..n)
        .map(|rank| {
            let mut c = rerun(name);
            c.env(ROLE, name)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("FERROCX_TEST_UID", hex(&uid))
                .env("FERROCX_JOB_ID", &job);
            for (k, v) in extra {
                c.env(k, v);
            }
            c.spawn().expect("spawn rank")
        })
        .collect()
}

/// The communicator of a worker: init with the unique id from the environment.
pub fn comm(ccl: &Ccl, rank: usize, world: usize, timeout_ms: u64) -> ferrocx::abi::Comm {
    let uid = unhex(&std::env::var("FERROCX_TEST_UID").expect("uid"));
    ccl.comm_init_rank(rank as i32, world as i32, 0, &uid, timeout_ms, &[])
        .unwrap_or_else(|e| panic!("rank {rank}: comm_init_rank: {e}"))
}
