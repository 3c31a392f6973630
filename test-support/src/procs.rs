//! The multi-process harness: a test executable re-runs one of its own tests in child
//! processes (the ranks or workers of a job), each selected by an environment variable the
//! test reads, and the parent waits for them all with a time limit.

use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A command that runs test `test` of this test executable, alone (`--exact`, one thread,
/// output not captured), with stdin closed and stdout/stderr piped. The caller adds the
/// variables that make the child a worker.
pub fn rerun(test: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for one child, killing it once `limit` has passed, and returns its output.
pub fn finish(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("wait_with_output")
}

/// Outcome of one child.
pub struct Outcome {
    /// Its index among the children waited for (the rank).
    pub rank: usize,
    /// Its exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// Its stdout then stderr, after a note when the harness killed it.
    pub output: String,
    /// Its stdout alone.
    pub stdout: String,
    /// Its stderr alone, after a note when the harness killed it.
    pub stderr: String,
}

/// Waits for every child, returning their exit codes and output in order. Each child's pipes
/// are drained by a thread of its own (a child never blocks on a full pipe); children still
/// running after `limit` are killed, and their output says so.
pub fn wait(children: Vec<Child>, limit: Duration) -> Vec<Outcome> {
    let mut deadline = Instant::now() + limit;
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let (tx, rx) = mpsc::channel();
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
                let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
                let stderr = format!("{note}{}", String::from_utf8_lossy(&out.stderr));
                outcomes[rank] = Some(Outcome {
                    rank,
                    code: out.status.code(),
                    output: format!("{note}{stdout}{}", String::from_utf8_lossy(&out.stderr)),
                    stdout,
                    stderr,
                });
            }
            Err(mpsc::RecvTimeoutError::Timeout) if !killed => {
                killed = true;
                // The killed children's waiters report within moments.
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
            o.unwrap_or_else(|| Outcome {
                rank,
                code: None,
                output: "(never reported, even after SIGKILL)".into(),
                stdout: String::new(),
                stderr: "(never reported, even after SIGKILL)".into(),
            })
        })
        .collect()
}

/// Asserts every child exited 0, showing the failing ones' output (named `rank N`).
pub fn assert_all_ok(outcomes: &[Outcome]) {
    assert_all_ok_as(outcomes, |r| format!("rank {r}"));
}

/// Asserts every child exited 0, showing the failing ones' output, each named by `name(rank)`.
pub fn assert_all_ok_as(outcomes: &[Outcome], name: impl Fn(usize) -> String) {
    let bad: Vec<&Outcome> = outcomes.iter().filter(|o| o.code != Some(0)).collect();
    assert!(
        bad.is_empty(),
        "{}",
        bad.iter()
            .map(|o| format!("--- {} exited {:?}:\n{}", name(o.rank), o.code, o.output))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLE: &str = "FERROCX_TEST_SUPPORT_ROLE";

    #[test]
    fn child() {
        match std::env::var(ROLE).as_deref() {
            Ok("ok") => println!("worker ran"),
            Ok("fail") => panic!("worker failed on purpose"),
            Ok("hang") => std::thread::sleep(Duration::from_secs(600)),
            _ => {}
        }
    }

    #[test]
    fn outcomes_report_exit_codes_output_and_kills() {
        let start = |role: &str| {
            rerun("procs::tests::child")
                .env(ROLE, role)
                .spawn()
                .unwrap()
        };
        let kids = vec![start("ok"), start("fail"), start("hang")];
        let t = Instant::now();
        let out = wait(kids, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(60));
        assert_eq!(out[0].code, Some(0), "{}", out[0].output);
        assert!(out[0].output.contains("worker ran"), "{}", out[0].output);
        assert!(out[0].stdout.contains("worker ran"), "{}", out[0].stdout);
        assert!(
            out[1].stderr.contains("failed on purpose"),
            "{}",
            out[1].stderr
        );
        assert_ne!(out[1].code, Some(0));
        assert!(
            out[1].output.contains("failed on purpose"),
            "{}",
            out[1].output
        );
        assert_eq!(out[2].code, None, "killed by a signal");
        assert!(
            out[2].output.starts_with("(killed by the test"),
            "{}",
            out[2].output
        );
        let e = std::panic::catch_unwind(|| assert_all_ok_as(&out, |r| format!("worker {r}")))
            .unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(msg.contains("--- worker 1 exited") && msg.contains("--- worker 2 exited"));
        assert!(!msg.contains("worker 0"), "{msg}");
    }
}
