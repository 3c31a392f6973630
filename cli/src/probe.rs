//! `ferrocx info`'s probe of each adaptor (its `init`, device count, properties, CCL version),
//! run in a child process with a deadline, as the conformance kit runs its checks: a plugin
//! whose `init` crashes, exits or never returns costs its own entry ("unavailable", naming the
//! plugin, its path and what happened), not `info` itself.
//!
//! The child is this program again, `ferrocx info --probe NAME` (with the same `--config`): it
//! discovers the adaptors as `info` did, probes the one named and prints the result as JSON.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ferrocx::registry::{AdaptorEntry, Registry, Source};
use serde_json::{json, Value};

use crate::report::probe;

/// Milliseconds a probe may take before its child is killed (default 30 000).
pub const ENV_PROBE_TIMEOUT_MS: &str = "FERROCX_INFO_PROBE_TIMEOUT_MS";
/// Default deadline of one probe: a CUDA or NCCL `init` takes seconds, not tens of them.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of a child's stdout read (its JSON is a few KiB).
const MAX_ANSWER: u64 = 1 << 20;
/// Most characters of a child's last stderr line quoted in a failure.
const MAX_QUOTE: usize = 300;

fn deadline() -> Duration {
    std::env::var(ENV_PROBE_TIMEOUT_MS)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(DEFAULT_TIMEOUT, Duration::from_millis)
}

/// The child's side: probes adaptor `name` of the registry `config` gives and prints the JSON
/// (the probe's fields, and `ccl_runtime` where the CCL says).
pub fn child(config: Option<&PathBuf>, name: &str) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let config = crate::load_config(config)?;
    let registry = Registry::discover(&config.runtime);
    let entry = registry
        .entries()
        .iter()
        .find(|e| e.name == name)
        .ok_or_else(|| format!("no adaptor named {name:?}"))?;
    let mut v = probe(entry);
    if v["ccl_probe"]["available"] == true {
        if let Some(r) = crate::info::ccl_runtime(entry) {
            v["ccl_runtime"] = r;
        }
    }
    println!("{v}");
    Ok(ExitCode::SUCCESS)
}

/// Probes `entry` in a child process; the probe's JSON, or for each of its parts (device, CCL)
/// "unavailable" with what happened to the child.
pub fn isolated(entry: &AdaptorEntry, config: Option<&PathBuf>) -> Value {
    let what = match &entry.source {
        Source::Builtin => format!("adaptor {:?} (built-in)", entry.name),
        Source::Plugin(p) => format!("adaptor {:?} ({})", entry.name, p.display()),
    };
    let reason = match run_child(&entry.name, config) {
        Ok(v) => return v,
        Err(why) => format!("the probe of {what} {why}"),
    };
    tracing::warn!("{reason}");
    let mut out = serde_json::Map::new();
    let down = json!({ "available": false, "reason": reason });
    if entry.device.is_some() {
        out.insert("device_probe".into(), down.clone());
    }
    if entry.ccl.is_some() {
        out.insert("ccl_probe".into(), down);
    }
    Value::Object(out)
}

/// Runs the child and reads its answer, or says what went wrong ("crashed with signal 11
/// (SIGSEGV)", "exited with code 3", "did not answer within 30 s").
fn run_child(name: &str, config: Option<&PathBuf>) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("could not start: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("info").arg("--probe").arg(name);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start: {e}"))?;
    // Read both pipes on threads: a child that fills one must not block on it.
    let out = child.stdout.take().map(|o| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut o = o;
            let _ = (&mut o).take(MAX_ANSWER).read_to_end(&mut buf);
            let _ = std::io::copy(&mut o, &mut std::io::sink());
            buf
        })
    });
    let err = child.stderr.take().map(|e| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut e = e;
            let _ = (&mut e).take(MAX_ANSWER).read_to_end(&mut buf);
            let _ = std::io::copy(&mut e, &mut std::io::sink());
            buf
        })
    });
    let limit = deadline();
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() >= limit => {
                // Only this child, by its own handle.
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("could not be waited for: {e}")),
        }
    };
    let stdout = out.and_then(|t| t.join().ok()).unwrap_or_default();
    let stderr = err.and_then(|t| t.join().ok()).unwrap_or_default();
    let said = last_line(&stderr);
    let Some(status) = status else {
        return Err(format!(
            "did not answer within {} ms (its init or a call hung) and was killed",
            limit.as_millis()
        ));
    };
    if status.success() {
        return serde_json::from_slice(&stdout)
            .map_err(|e| format!("answered something that is not JSON ({e}){said}"));
    }
    Err(match (status.code(), status.signal()) {
        (_, Some(sig)) => format!("crashed with signal {sig} ({}){said}", signal_name(sig)),
        (Some(code), _) => format!("exited with code {code} before answering{said}"),
        (None, None) => format!("ended without a status{said}"),
    })
}

/// `; it said: <last line>` from a child's stderr, cut short; empty when it said nothing.
fn last_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    match text.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(l) => {
            let l: String = l
                .chars()
                .filter(|c| !c.is_control())
                .take(MAX_QUOTE)
                .collect();
            format!("; it said: {l}")
        }
        None => String::new(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGTRAP => "SIGTRAP",
        _ => "a signal",
    }
}
