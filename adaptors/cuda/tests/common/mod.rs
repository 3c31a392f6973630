//! Helpers of the CUDA adaptor's tests: the test executable re-runs one of its own tests in a
//! child process (a "worker", selected by [`ROLE`]) with its own environment, and workers talk
//! over a UNIX socket.

#![allow(dead_code)]

pub mod fds;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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
/// process; waits at most `limit` for all of them (killing the ones still running) and returns
/// their outputs in order.
pub fn run_workers(name: &str, workers: &[Worker<'_>], limit: Duration) -> Vec<Output> {
    let exe = std::env::current_exe().expect("current_exe");
    let (tx, rx) = mpsc::channel();
    let mut pids = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        let mut c = Command::new(&exe);
        c.args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(ROLE, name)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for v in &w.unset {
            c.env_remove(v);
        }
        for (k, v) in &w.set {
            c.env(k, v);
        }
        let child = c.spawn().expect("start a worker");
        pids.push(child.id());
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((i, child.wait_with_output()));
        });
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let mut outputs: Vec<Option<Output>> = workers.iter().map(|_| None).collect();
    for _ in 0..workers.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, out)) => outputs[i] = Some(out.expect("wait for a worker")),
            Err(_) => {
                for (i, &pid) in pids.iter().enumerate() {
                    if outputs[i].is_none() {
                        // SAFETY: `pid` is a child this function started and has not reaped
                        // (its waiting thread has not returned), so the id is still ours.
                        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                    }
                }
                panic!("workers of {name} did not finish within {limit:?}; killed");
            }
        }
    }
    outputs
        .into_iter()
        .map(|o| o.expect("every worker"))
        .collect()
}

/// Prints every worker's output, then panics naming the workers that failed, if any.
pub fn assert_all_succeeded(outs: &[(String, Output)]) {
    let mut failed = Vec::new();
    for (what, out) in outs {
        println!(
            "=== {what}: {}\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            failed.push(what.as_str());
        }
    }
    assert!(
        failed.is_empty(),
        "failed: {} (output above)",
        failed.join(", ")
    );
}

/// The two ends of a connection between two workers: rank 0 listens at `path`, rank 1
/// connects (retrying until rank 0 is there, at most 30 s). Reads and writes time out after
/// 60 s, so a peer that died fails the other instead of hanging it.
pub fn connect(path: &Path, rank: usize) -> UnixStream {
    let s = if rank == 0 {
        let l = UnixListener::bind(path).expect("bind the test socket");
        let (s, _) = l.accept().expect("accept the peer");
        let _ = std::fs::remove_file(path);
        s
    } else {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("connect to {}: {e}", path.display()),
            }
        }
    };
    let t = Some(Duration::from_secs(60));
    s.set_read_timeout(t).expect("read timeout");
    s.set_write_timeout(t).expect("write timeout");
    s
}

/// Both workers reach this point before either goes on.
pub fn barrier(s: &mut UnixStream) {
    s.write_all(b"B").expect("barrier: write");
    let mut b = [0u8; 1];
    s.read_exact(&mut b)
        .expect("barrier: read (did the peer fail?)");
    assert_eq!(&b, b"B");
}

/// Deterministic pseudo-random bytes (xorshift64).
pub fn random_bytes(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
}
