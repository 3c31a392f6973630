//! The front-end of `ferrocx bench -n N`: runs the ranks through `ferrocx launch` and relays
//! rank 0's report.
//!
//! The launcher prefixes every line of a rank with `[rank] `; rank 0's prefix is taken off its
//! stdout, so the table (or the JSON document) reads as if one process printed it. Other
//! ranks' lines, and everything on stderr, pass unchanged.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::process::{Command, ExitCode, Stdio};

use super::progress::{Progress, ENV_PROGRESS};
use super::BenchArgs;

/// What the launcher puts before rank 0's lines.
const RANK0_PREFIX: &str = "[0] ";

/// Runs `nproc` ranks of the benchmark; the launcher's exit code.
pub fn run(args: &BenchArgs, nproc: u32) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this executable to start the ranks: {e}"))?;
    let mut cmd = Command::new(&exe);
    cmd.arg("launch")
        .arg("-n")
        .arg(nproc.to_string())
        .arg("--")
        .arg(&exe)
        .arg("bench")
        .arg("--worker")
        .args(args.worker_args())
        .stdout(Stdio::piped());
    if let Some(config) = &args.config {
        cmd.env(ferrocx::config::ENV_CONFIG, config);
    }
    let terminal = std::io::stderr().is_terminal();
    if terminal {
        cmd.env(ENV_PROGRESS, "1");
    } else {
        cmd.env_remove(ENV_PROGRESS);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {} launch: {e}", exe.display()))?;
    let mut progress = Progress::terminal(terminal);
    if let Some(out) = child.stdout.take() {
        let mut reader = BufReader::new(out);
        let mut line = Vec::new();
        // After a write error (a closed stdout) the output is read and dropped, so that the
        // launcher never blocks on a full pipe.
        let mut broken = false;
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.strip_prefix(RANK0_PREFIX).unwrap_or(&text);
            if progress.relay(text) || broken {
                continue;
            }
            progress.clear();
            let mut stdout = std::io::stdout().lock();
            broken = stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
                .is_err();
        }
    }
    progress.clear();
    let status = child.wait()?;
    Ok(match status.code() {
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => {
            use std::os::unix::process::ExitStatusExt;
            ExitCode::from(
                status
                    .signal()
                    .map_or(1, |s| u8::try_from(128 + s).unwrap_or(255)),
            )
        }
    })
}
