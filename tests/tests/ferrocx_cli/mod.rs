//! The `ferrocx` command and out-of-tree cargo builds, for the integration tests that need them.
//!
//! `ferrocx-tests` cannot use `CARGO_BIN_EXE_ferrocx` (the binary belongs to `ferrocx-cli`), and
//! a `ferrocx` found beside the test executable may be stale (`cargo test -p ferrocx-tests` does
//! not rebuild it). So the CLI is built here, with the `cargo` that runs the tests, into a target
//! directory of its own under `CARGO_TARGET_TMPDIR`: that build takes no lock the running
//! `cargo test` holds, and cargo's fingerprints keep it current. Each test executable builds it
//! at most once, on first use. Out-of-tree plugin builds (`examples.rs`) share the directory.

// Each test executable that includes this module uses a different part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The repository root (the root workspace).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The target directory every build started by these tests shares.
pub fn build_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("ferrocx-builds")
}

/// The `cargo` that runs these tests (cargo sets `CARGO` for them), else the one on `PATH`.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// The last `n` lines of a process's stderr, for failure messages.
pub fn tail(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `cargo build --offline --target-dir <build_dir()>` with `args` (the registry is already
/// populated, and a test must not reach the network). Errors carry the end of cargo's output.
pub fn cargo_build<I, S>(args: I, what: &str) -> Result<(), String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = cargo()
        .arg("build")
        .arg("--offline")
        .arg("--target-dir")
        .arg(build_dir())
        .args(args)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .map_err(|e| format!("could not run cargo for {what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cargo build of {what} failed ({}):\n{}",
            out.status,
            tail(&out.stderr, 40)
        ))
    }
}

/// The `ferrocx` binary, built from this checkout on first use.
pub fn ferrocx() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BIN.get_or_init(|| {
        let manifest = repo_root().join("Cargo.toml");
        cargo_build(
            [
                OsStr::new("--manifest-path"),
                manifest.as_os_str(),
                OsStr::new("-p"),
                OsStr::new("ferrocx-cli"),
                OsStr::new("--bin"),
                OsStr::new("ferrocx"),
            ],
            "the ferrocx CLI",
        )?;
        Ok(build_dir().join("debug/ferrocx"))
    });
    match built {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// Runs `ferrocx ARGS` with `FERROCX_PLUGIN_PATH` set to `plugin_path` (and no configuration
/// file from the environment, so the built-in local configuration applies).
pub fn run_ferrocx(args: &[&str], plugin_path: &Path) -> Output {
    Command::new(ferrocx())
        .args(args)
        .env("FERROCX_PLUGIN_PATH", plugin_path)
        .env_remove("FERROCX_CONFIG")
        .env_remove("FERROCX_LOG")
        .output()
        .expect("run ferrocx")
}

/// `run_ferrocx`, asserting it succeeded; returns its stdout.
pub fn ferrocx_ok(args: &[&str], plugin_path: &Path) -> String {
    let out = run_ferrocx(args, plugin_path);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`ferrocx {}` failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        args.join(" "),
        out.status,
        tail(&out.stderr, 40)
    );
    stdout
}

/// The lines of `ferrocx info`'s text output that describe adaptor `name`: from its heading line
/// to the next adaptor's (or the next section's).
pub fn info_section<'a>(info: &'a str, name: &str) -> Vec<&'a str> {
    let heading = format!("  {name}  [");
    let mut lines = info.lines().skip_while(|l| !l.starts_with(&heading));
    let Some(first) = lines.next() else {
        panic!("adaptor {name:?} not listed by ferrocx info:\n{info}");
    };
    std::iter::once(first)
        .chain(lines.take_while(|l| l.starts_with("    ")))
        .collect()
}
