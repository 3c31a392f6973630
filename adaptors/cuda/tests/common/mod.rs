//! Helpers of the CUDA adaptor's tests: the test executable re-runs one of its own tests in a
//! child process (a "worker", selected by [`ROLE`]) with its own environment, and workers talk
//! over a UNIX socket. The harness itself is `ferrocx-test-support`'s.

#![allow(dead_code, unused_imports)]

use std::time::Duration;

pub use ferrocx_test_support::fds;
pub use ferrocx_test_support::procs::Outcome;
use ferrocx_test_support::procs::{rerun, wait};
pub use ferrocx_test_support::random_bytes;
pub use ferrocx_test_support::sock::{barrier, connect};

/// Set in a child: the name of the worker test to run.
pub const ROLE: &str = "FERROCX_CUDA_TEST_ROLE";

/// `true` in a child started by [`run_workers`] for test `name`.
pub fn is_worker(name: &str) -> bool {
    std::env::var(ROLE).is_ok_and(|r| r == name)
}

/// One child to start: extra variables to set and variables to remove.
pub struct Worker<'a> {
    /// Variables set in the child.
    pub set: Vec<(&'a str, String)>,
    /// Variables removed from the child's environment.
    pub unset: Vec<&'a str>,
}

/// Runs test `name` of this executable once per worker, all at once, each alone in its
/// process; waits at most `limit` for all of them (killing the ones still running, which then
/// fail) and returns their outcomes in order.
pub fn run_workers(name: &str, workers: &[Worker<'_>], limit: Duration) -> Vec<Outcome> {
    let children = workers
        .iter()
        .map(|w| {
            let mut c = rerun(name);
            c.env(ROLE, name);
            for v in &w.unset {
                c.env_remove(v);
            }
            for (k, v) in &w.set {
                c.env(k, v);
            }
            c.spawn().expect("start a worker")
        })
        .collect();
    wait(children, limit)
}

/// Prints every worker's output, then panics naming the workers that failed, if any.
pub fn assert_all_succeeded(outs: &[(String, Outcome)]) {
    let mut failed = Vec::new();
    for (what, out) in outs {
        println!("=== {what}: exit {:?}\n{}", out.code, out.output);
        if out.code != Some(0) {
            failed.push(what.as_str());
        }
    }
    assert!(
        failed.is_empty(),
        "failed: {} (output above)",
        failed.join(", ")
    );
}
