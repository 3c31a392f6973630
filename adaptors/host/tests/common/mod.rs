//! Multi-process harness for the host CCL tests: the test executable re-runs itself as the
//! ranks of a job (one process each), passing the unique id and the rank in the environment.

#![allow(dead_code)]

pub mod fds;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// Hex encoding, for passing ids in the environment.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Hex decoding.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
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
            let mut c = Command::new(std::env::current_exe().expect("current_exe"));
            c.args(["--exact", name, "--nocapture", "--test-threads=1"])
                .env(ROLE, name)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("FERROCX_TEST_UID", hex(&uid))
                .env("FERROCX_JOB_ID", &job)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in extra {
                c.env(k, v);
            }
            c.spawn().expect("spawn rank")
        })
        .collect()
}

/// Outcome of one rank.
pub struct Outcome {
    pub rank: usize,
    pub code: Option<i32>,
    pub output: String,
}

/// Waits for every rank, returning their exit codes and output. Each rank's pipes are drained
/// by a thread of its own (a rank never blocks on a full pipe); ranks still running after
/// `limit` are killed, and their output says so.
pub fn wait(children: Vec<Child>, limit: Duration) -> Vec<Outcome> {
    let mut deadline = Instant::now() + limit;
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for (rank, child) in children.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let out = child.wait_with_output().expect("wait");
            let _ = tx.send((rank, out));
        });
    }
    drop(tx);
    let mut outcomes: Vec<Option<Outcome>> = (0..pids.len()).map(|_| None).collect();
    let mut killed = false;
    while outcomes.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok((rank, out)) => {
                let note = if killed {
                    format!("(killed by the test after {limit:?})\n")
                } else {
                    String::new()
                };
                outcomes[rank] = Some(Outcome {
                    rank,
                    code: out.status.code(),
                    output: format!(
                        "{note}{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ),
                });
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !killed => {
                killed = true;
                // The killed ranks' waiters report within moments.
                deadline = Instant::now() + Duration::from_secs(30);
                for (rank, pid) in pids.iter().enumerate() {
                    if outcomes[rank].is_none() {
                        // SAFETY: signals our own child, which has not been reaped (its waiter
                        // thread has not reported), so the pid is still ours.
                        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
                    }
                }
            }
            Err(_) => break,
        }
    }
    outcomes
        .into_iter()
        .enumerate()
        .map(|(rank, o)| {
            o.unwrap_or(Outcome {
                rank,
                code: None,
                output: "(never reported, even after SIGKILL)".into(),
            })
        })
        .collect()
}

/// Asserts every rank exited 0, showing the failing ranks' output.
pub fn assert_all_ok(outcomes: &[Outcome]) {
    let bad: Vec<&Outcome> = outcomes.iter().filter(|o| o.code != Some(0)).collect();
    assert!(
        bad.is_empty(),
        "{}",
        bad.iter()
            .map(|o| format!("--- rank {} exited {:?}:\n{}", o.rank, o.code, o.output))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The communicator of a worker: init with the unique id from the environment.
pub fn comm(ccl: &Ccl, rank: usize, world: usize, timeout_ms: u64) -> ferrocx::abi::Comm {
    let uid = unhex(&std::env::var("FERROCX_TEST_UID").expect("uid"));
    ccl.comm_init_rank(rank as i32, world as i32, 0, &uid, timeout_ms, &[])
        .unwrap_or_else(|e| panic!("rank {rank}: comm_init_rank: {e}"))
}

/// xorshift64*: deterministic pseudo-random numbers every rank can reproduce.
pub struct Rng(u64);

impl Rng {
    /// A generator for (seed, stream).
    pub fn new(seed: u64, stream: u64) -> Self {
        Rng((seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1)
    }
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// An integer in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }
}
