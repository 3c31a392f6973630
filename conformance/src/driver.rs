//! The driver: runs each part of the suite in worker processes and merges their reports.
//!
//! One worker runs the ABI and device checks; then, for an adaptor with a CCL, N workers run
//! one rank each, with the unique ids (made here, as rank 0 would) and their rank in the
//! environment. Running everything out of process means a crash or a hang of the adaptor ends
//! one worker, not the run: the driver pins it to the check that was running (from the
//! worker's begin markers), kills a worker whose check outlives the watchdog, and reports both.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferrocx::abi::{AbiTable, CclAdaptorV1};
use serde_json::Value;

use crate::ccl::{UniqueIds, REQUIRED_CCL_ENTRIES, REQUIRED_DEVICE_ENTRIES};
use crate::report::{Check, Outcome, Report};
use crate::target::Target;
use crate::worker::{Role, BEGIN, CHECK, END};

/// How a run goes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Ranks (processes) of the CCL checks.
    pub ranks: usize,
    /// Deadline of every wait on a peer (the communicators' `timeout_ms`).
    pub timeout: Duration,
}

impl Default for Options {
    /// Two ranks, 10 s.
    fn default() -> Self {
        Options {
            ranks: 2,
            timeout: Duration::from_secs(10),
        }
    }
}

impl Options {
    /// The longest one check may run before its worker is killed as hung.
    pub fn watchdog(&self) -> Duration {
        (self.timeout * 3 + Duration::from_secs(30)).max(Duration::from_secs(60))
    }
}

/// How to start a worker: a program and its arguments, run with the `FERROCX_CONFORMANCE_*`
/// variables set, that calls [`crate::run_worker`] with the same target.
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    program: PathBuf,
    args: Vec<OsString>,
}

impl WorkerCommand {
    /// `program args...`.
    pub fn new<I, A>(program: impl Into<PathBuf>, args: I) -> WorkerCommand
    where
        I: IntoIterator<Item = A>,
        A: Into<OsString>,
    {
        WorkerCommand {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
        }
    }

    /// The running test executable, re-run to execute only the test named `test` (its full
    /// path within the test binary, e.g. `conformance` or `module::conformance`).
    pub fn this_test(test: &str) -> std::io::Result<WorkerCommand> {
        let exe = std::env::current_exe()?;
        Ok(WorkerCommand::new(
            exe,
            [test, "--exact", "--nocapture", "--test-threads=1"],
        ))
    }
}

/// Runs the whole suite against `target`: the ABI and device checks, then the CCL checks on
/// `options.ranks` ranks, each part in processes started with `worker`.
pub fn run(target: &Target<'_>, worker: &WorkerCommand, options: &Options) -> Report {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    // A job id per run: adaptors name their per-job resources with it (the host device its
    // shared-memory segments), so concurrent runs do not meet.
    let job = format!(
        "conformance-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    );
    let watchdog = options.watchdog();
    let mut parts = vec![run_workers(
        worker,
        &job,
        vec![("device worker".to_string(), Role::Device)],
        watchdog,
    )];
    match prepare_ccl(target, options) {
        Ok((roles, note)) => {
            if let Some(check) = note {
                parts.push(vec![(
                    "driver".to_string(),
                    Report {
                        checks: vec![check],
                    },
                )]);
            }
            parts.push(run_workers(worker, &job, roles, watchdog))
        }
        Err(check) => parts.push(vec![(
            "driver".to_string(),
            Report {
                checks: vec![check],
            },
        )]),
    }
    remove_job_segments(&job);
    Report::merge(parts.into_iter().flatten().collect())
}

/// Removes the shared-memory segments of the run's job that its workers left behind (a worker
/// that crashed or was killed cannot unlink its own), as `ferrocx launch` does: every name in
/// /dev/shm that starts with `ferrocx-<job id>-`. Every worker has exited by now.
fn remove_job_segments(job: &str) {
    let prefix = format!("ferrocx-{job}-");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            // Best effort: a segment that cannot be removed is left to the OS.
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The rank roles of the CCL part (with a "not claimed" check when the ranks asked for exceed
/// the adaptor's declared maximum, which the part then runs on), or the check that says why
/// it cannot run.
#[allow(clippy::type_complexity)]
fn prepare_ccl(
    target: &Target<'_>,
    options: &Options,
) -> Result<(Vec<(String, Role)>, Option<Check>), Check> {
    let Some(ccl) = target.ccl() else {
        return Err(Check::new(
            "ccl",
            "CCL checks",
            Outcome::absent(CclAdaptorV1::SYMBOL),
        ));
    };
    let required = |o| Check::new("ccl", "required entries", o);
    if crate::device::claims_nothing(ccl.tables().root.present()) {
        return Err(required(Outcome::not_claimed(
            "the CCL table exports every entry as absent",
        )));
    }
    let Some(dev) = target.ccl_device() else {
        return Err(required(Outcome::Fail(
            "the adaptor has a CCL but no device adaptor to run it on (Target::with_device)".into(),
        )));
    };
    // The entries present, from the capabilities every reader shares (probed once).
    let present = dev.caps().root.present.clone();
    let mut missing: Vec<String> = REQUIRED_DEVICE_ENTRIES
        .iter()
        .filter(|e| !present.contains(e))
        .map(|e| format!("device `{e}`"))
        .collect();
    let present = ccl.caps().root.present.clone();
    missing.extend(
        REQUIRED_CCL_ENTRIES
            .iter()
            .filter(|e| !present.contains(e))
            .map(|e| format!("CCL `{e}`")),
    );
    if !missing.is_empty() {
        return Err(required(Outcome::Fail(format!(
            "absent: {} (the CCL checks need them to run)",
            missing.join(", ")
        ))));
    }
    let ids = UniqueIds::create(&ccl).map_err(|e| {
        Check::new(
            "ccl",
            "init and get_unique_id (in the driver)",
            Outcome::Fail(e.to_string()),
        )
    })?;
    let mut world = options.ranks.max(1);
    let limits = ccl.limits().map_err(|e| {
        Check::new(
            "ccl",
            "get_limits (in the driver)",
            Outcome::Fail(e.to_string()),
        )
    })?;
    let mut note = None;
    if !limits.allows_ranks(world) {
        let max = limits.max_ranks as usize;
        note = Some(Check::new(
            "ccl",
            format!("a communicator of {world} ranks"),
            Outcome::not_claimed(&format!(
                "the adaptor declares at most {max} rank(s); the CCL part ran on {max}"
            )),
        ));
        world = max;
    }
    let roles = (0..world)
        .map(|rank| {
            (
                format!("rank {rank}"),
                Role::Rank {
                    rank,
                    world,
                    ids: ids.clone(),
                    timeout: options.timeout,
                },
            )
        })
        .collect();
    Ok((roles, note))
}

/// What a worker's reader threads tell the driver.
enum Event {
    Begin(String, String),
    Done(Check),
    End,
    Eof,
}

/// One running worker.
struct Live {
    label: String,
    child: Child,
    status: Option<ExitStatus>,
    eof: bool,
    ended: bool,
    current: Option<(String, String)>,
    since: Instant,
    killed: Option<String>,
    checks: Vec<Check>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

/// Lines of a worker's stderr kept for a crash report.
const STDERR_TAIL: usize = 12;

/// Starts the workers of one part, waits for all of them, and returns each one's report.
fn run_workers(
    worker: &WorkerCommand,
    job: &str,
    roles: Vec<(String, Role)>,
    watchdog: Duration,
) -> Vec<(String, Report)> {
    let (tx, rx) = mpsc::channel::<(usize, Event)>();
    let mut live: Vec<Live> = Vec::new();
    let mut failed: Vec<(String, Report)> = Vec::new();
    for (label, role) in roles {
        let mut cmd = Command::new(&worker.program);
        cmd.args(&worker.args)
            .env(ferrocx::bootstrap::ENV_JOB_ID, job)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in role.env() {
            cmd.env(k, v);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let reason = format!(
                    "could not start the worker {}: {e}",
                    worker.program.display()
                );
                failed.push((label, exit_report(Outcome::Fail(reason))));
                continue;
            }
        };
        let i = live.len();
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            let tx = tx.clone();
            std::thread::spawn(move || read_stdout(i, out, tx));
        }
        if let Some(err) = child.stderr.take() {
            let tail = stderr.clone();
            std::thread::spawn(move || read_stderr(err, tail));
        }
        live.push(Live {
            label,
            child,
            status: None,
            eof: false,
            ended: false,
            current: None,
            since: Instant::now(),
            killed: None,
            checks: Vec::new(),
            stderr,
        });
    }
    drop(tx);
    while live.iter().any(|w| !w.eof || w.status.is_none()) {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((i, ev)) => {
                let w = &mut live[i];
                match ev {
                    Event::Begin(group, name) => {
                        w.current = Some((group, name));
                        w.since = Instant::now();
                    }
                    Event::Done(check) => {
                        w.current = None;
                        w.since = Instant::now();
                        w.checks.push(check);
                    }
                    Event::End => w.ended = true,
                    Event::Eof => w.eof = true,
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                for w in live.iter_mut() {
                    w.eof = true;
                }
            }
        }
        for w in live.iter_mut() {
            if w.status.is_none() {
                w.status = w.child.try_wait().ok().flatten();
            }
            if w.status.is_none() && w.killed.is_none() && w.since.elapsed() > watchdog {
                w.killed = Some(format!(
                    "killed by the driver after {} s without progress",
                    watchdog.as_secs()
                ));
                // Only this worker, by its own handle; its pipes then close.
                let _ = w.child.kill();
            }
        }
    }
    failed.extend(
        live.into_iter()
            .map(|w| (w.label.clone(), worker_report(w))),
    );
    failed
}

fn read_stdout(i: usize, out: impl Read, tx: mpsc::Sender<(usize, Event)>) {
    for line in BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        if let Some(ev) = parse(&line) {
            if tx.send((i, ev)).is_err() {
                return;
            }
        }
    }
    let _ = tx.send((i, Event::Eof));
}

fn read_stderr(err: impl Read, tail: Arc<Mutex<VecDeque<String>>>) {
    for line in BufReader::new(err).lines() {
        let Ok(line) = line else { break };
        let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
        if t.len() == STDERR_TAIL {
            t.pop_front();
        }
        t.push_back(line);
    }
}

/// A marked line of a worker's stdout; anything else is the adaptor's or the harness's own.
fn parse(line: &str) -> Option<Event> {
    if let Some(at) = line.find(CHECK) {
        let v: Value = serde_json::from_str(&line[at + CHECK.len()..]).ok()?;
        return Check::from_json(&v).map(Event::Done);
    }
    if let Some(at) = line.find(BEGIN) {
        let v: Value = serde_json::from_str(&line[at + BEGIN.len()..]).ok()?;
        let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        return Some(Event::Begin(text("group")?, text("name")?));
    }
    line.trim_end().ends_with(END).then_some(Event::End)
}

fn exit_report(outcome: Outcome) -> Report {
    Report {
        checks: vec![Check::new("run", "worker processes exit cleanly", outcome)],
    }
}

/// How a process ended, in words.
fn describe(status: Option<ExitStatus>) -> String {
    match status {
        None => "did not exit".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exited with code {c}"),
            (None, Some(sig)) => format!("was killed by signal {sig}{}", signal_name(sig)),
            _ => format!("ended with {s}"),
        },
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGBUS => " (SIGBUS)",
        libc::SIGKILL => " (SIGKILL)",
        libc::SIGILL => " (SIGILL)",
        libc::SIGFPE => " (SIGFPE)",
        _ => "",
    }
}

/// A worker's checks, plus the check it died in and how the process ended.
fn worker_report(mut w: Live) -> Report {
    let how = match &w.killed {
        Some(k) => k.clone(),
        None => describe(w.status),
    };
    let tail: Vec<String> = w
        .stderr
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect();
    let stderr = if tail.is_empty() {
        String::new()
    } else {
        format!("; its stderr ended with: {}", tail.join(" | "))
    };
    if let Some((group, name)) = w.current.take() {
        let reason = match &w.killed {
            Some(_) => format!("did not finish: the worker was {how} (hung in this check)"),
            None => format!("the worker {how} during this check{stderr}"),
        };
        w.checks
            .push(Check::new(group, name, Outcome::Fail(reason)));
    }
    let clean = w.killed.is_none() && w.ended && w.status.is_some_and(|s| s.success());
    let outcome = if clean {
        Outcome::Pass
    } else if w.checks.is_empty() && w.status.is_some_and(|s| s.success()) {
        Outcome::Fail(format!(
            "the worker {how} without reporting a check: does the worker command call \
             run_worker with the same target?{stderr}"
        ))
    } else {
        let killed = w.killed.as_deref().map(|k| format!("was {k}"));
        let ended = if w.ended {
            ""
        } else {
            "; the checks after it did not run"
        };
        Outcome::Fail(format!(
            "the worker {}{ended}{stderr}",
            killed.unwrap_or(how)
        ))
    };
    let mut checks = w.checks;
    checks.push(Check::new("run", "worker processes exit cleanly", outcome));
    Report { checks }
}
