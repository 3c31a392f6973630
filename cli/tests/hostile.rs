//! Hostile and careless uses of the `ferrocx` command (issue 17); each test here failed before
//! its fix. The library-level ones (loader, store, config reading) are in `tests/tests/hostile.rs`.
//!
//! Limits are tested with small configured limits, a tmpfs of a few MiB in a private mount
//! namespace (skipped, saying why, where that cannot be made), and short deadlines: nothing here
//! fills the machine's memory, disk or descriptors, and all traffic stays on loopback.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ferrocx_tests::c_plugin;

const BIN: &str = env!("CARGO_BIN_EXE_ferrocx");

fn ferrocx(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("FERROCX_CONFIG")
        .env_remove("FERROCX_PLUGIN_PATH")
        .env_remove("FERROCX_LOG")
        .env_remove("FERROCX_HOST_STREAM_DEPTH");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run ferrocx")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// ---- 1. Memory ----

/// Runs `ferrocx ARGS` with a tmpfs of `size` as its /dev/shm, in a mount namespace of its own;
/// `None` (the reason printed) where one cannot be made here (not root, no unshare).
fn with_small_shm(size: &str, args: &[&str]) -> Option<Output> {
    let script =
        format!("mount -t tmpfs -o size={size} ferrocx-test /dev/shm && exec \"$0\" \"$@\"");
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script, BIN])
        .args(args)
        .env_remove("FERROCX_CONFIG")
        .env_remove("FERROCX_PLUGIN_PATH")
        .output();
    match out {
        Ok(o) if o.status.code() == Some(1) && text(&o.stderr).contains("unshare") => {
            eprintln!("SKIP: no private mount namespace here: {}", text(&o.stderr));
            None
        }
        Ok(o) if text(&o.stderr).contains("mount:") => {
            eprintln!("SKIP: cannot mount a tmpfs here: {}", text(&o.stderr));
            None
        }
        Ok(o) => Some(o),
        Err(e) => {
            eprintln!("SKIP: cannot run unshare: {e}");
            None
        }
    }
}

#[test]
fn bench_buffers_larger_than_shm_are_refused_with_the_amounts() {
    // 2 ranks × 2 buffers of 1 GiB against an 8 MiB /dev/shm: refused before any allocation
    // (before, the buffers were reserved until the OOM killer ended other processes).
    let Some(out) = with_small_shm("8m", &["bench", "-n", "2", "-b", "1G", "-e", "1G"]) else {
        return;
    };
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("the buffers need 2147483680 bytes (2.0 GiB) per rank"),
        "{err}"
    );
    assert!(err.contains("but the device has"), "{err}");
    assert!(err.contains("free of 8388608 bytes (8.0 MiB)"), "{err}");
}

#[test]
fn a_single_rank_bench_checks_its_buffers_against_shm_too() {
    // The worker's path without the front-end (one rank, no launcher): a 4 MiB /dev/shm and
    // buffers of 16 MiB fail with the amounts, not with SIGBUS or the OOM killer. The device's
    // own check under it is unit-tested in the host crate (shm.rs).
    let Some(out) = with_small_shm("4m", &["bench", "-b", "16M", "-e", "16M", "--iters", "1"])
    else {
        return;
    };
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("free of 4194304 bytes (4.0 MiB)"), "{err}");
}

#[test]
fn a_bench_with_a_tiny_stream_queue_still_runs_and_checks() {
    // Each host stream holds at most 4 operations: every enqueue past it waits for room.
    let out = ferrocx(
        &[
            "bench", "-n", "2", "-b", "8", "-e", "256", "--op", "all", "--iters", "50", "--warmup",
            "2",
        ],
        &[("FERROCX_HOST_STREAM_DEPTH", "4")],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
}

// ---- 4. info probes in a child ----

#[test]
fn info_names_a_plugin_whose_init_crashes_exits_or_hangs() {
    for (variant, what) in [
        ("initcrash", "crashed with signal 11 (SIGSEGV)"),
        ("initexit", "exited with code 3 before answering"),
        ("initloop", "did not answer within 1500 ms"),
    ] {
        let path = c_plugin(variant);
        let start = Instant::now();
        let out = ferrocx(
            &["info"],
            &[
                ("FERROCX_PLUGIN_PATH", path.to_str().unwrap()),
                ("FERROCX_INFO_PROBE_TIMEOUT_MS", "1500"),
            ],
        );
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{variant}: {stdout}\n{}",
            text(&out.stderr)
        );
        let expected = format!(
            "    device: unavailable: the probe of adaptor \"{variant}\" ({}) {what}",
            path.display()
        );
        assert!(
            stdout.contains(&expected),
            "{variant}: no {expected:?} in\n{stdout}"
        );
        // The other adaptors are still described.
        assert!(stdout.contains("  host  [built-in]"), "{stdout}");
        assert!(start.elapsed() < Duration::from_secs(60));
    }
}

// ---- 5. Launcher ----

#[test]
fn a_long_line_is_forwarded_in_bounded_pieces_and_carriage_returns_end_lines() {
    // 3 MiB without a newline, then progress with \r.
    let out = ferrocx(
        &[
            "launch",
            "-n",
            "1",
            "--",
            "sh",
            "-c",
            "head -c 3145728 /dev/zero | tr '\\000' x; printf '10%%\\r20%%\\rdone\\n'",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = out.stdout;
    let pieces: Vec<&[u8]> = stdout.split(|&b| b == b'\n' || b == b'\r').collect();
    let xs: Vec<&&[u8]> = pieces.iter().filter(|p| p.ends_with(b"x")).collect();
    assert_eq!(xs.len(), 3, "3 MiB in pieces of 1 MiB");
    assert!(xs
        .iter()
        .all(|p| p.len() == 4 + (1 << 20) && p.starts_with(b"[0] ")));
    let tail = text(&stdout[stdout.len() - 40..]);
    assert!(tail.ends_with("[0] 10%\r[0] 20%\r[0] done\n"), "{tail:?}");
}

/// Whether `pid` is a live process (a zombie counts as gone).
fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

#[test]
fn a_launcher_killed_with_sigkill_takes_the_ranks_children_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = format!(
        "sleep 300 & echo $! >> {p}; sleep 300 & echo $! >> {p}; wait",
        p = pids.display()
    );
    let mut launcher = Command::new(BIN)
        .args(["launch", "-n", "2", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let read_pids = || -> Vec<i32> {
        std::fs::read_to_string(&pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let start = Instant::now();
    while read_pids().len() < 4 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let children = read_pids();
    assert_eq!(children.len(), 4, "the ranks did not start their children");
    assert!(children.iter().all(|&p| alive(p)));
    launcher.kill().unwrap(); // SIGKILL: no handler runs
    launcher.wait().unwrap();
    let start = Instant::now();
    while children.iter().any(|&p| alive(p)) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<i32> = children.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &left {
        // SAFETY: our own test's leftovers, by pid; kill has no memory effects.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "still running after the launcher's SIGKILL: {left:?}"
    );
}

// ---- 6. Config through the command ----

#[test]
fn config_check_refuses_dev_zero_and_a_fifo_at_once() {
    let out = ferrocx(&["config", "check", "/dev/zero"], &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("it is a character device"),
        "{}",
        text(&out.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("c.toml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; mkfifo touches no memory of this process.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut child = Command::new(BIN)
        .args(["config", "check"])
        .arg(&fifo)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let status = status.expect("config check blocked on a FIFO");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success());
    assert!(err.contains("it is a FIFO"), "{err}");
}

#[test]
fn info_of_a_plugin_answering_a_negative_device_count_says_so() {
    let path = c_plugin("negcount");
    let out = ferrocx(
        &["info"],
        &[("FERROCX_PLUGIN_PATH", path.to_str().unwrap())],
    );
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("-5 device(s)"), "{stdout}");
    assert!(
        stdout.contains("device_count failed with INTERNAL_ERROR: returned success with -5"),
        "{stdout}"
    );
}

// ---- 7. Bench sizes ----

#[test]
fn a_bench_size_that_holds_no_element_is_refused_not_reported_correct() {
    let out = ferrocx(
        &["bench", "-n", "2", "-b", "7", "-e", "7", "--op", "all"],
        &[],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}\n{err}", text(&out.stdout));
    assert!(
        err.contains(
            "no size from -b 7 to -e 7 holds an element of all_gather over 2 rank(s) of f32"
        ),
        "{err}"
    );
    assert!(!text(&out.stdout).contains("#wrong"), "it ran anyway");
}

#[test]
fn bench_sizes_too_small_for_some_op_are_skipped_with_a_note() {
    let out = ferrocx(
        &[
            "bench", "-n", "2", "-b", "4", "-e", "8", "--op", "all", "--iters", "2", "--warmup",
            "0",
        ],
        &[],
    );
    let (stdout, err) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{err}");
    assert!(
        err.contains("note: all_gather skips size(s) 4: below 8 bytes they hold no element over 2 rank(s) of f32"),
        "{err}"
    );
    // No row of 0 elements anywhere.
    for line in stdout.lines().filter(|l| !l.starts_with('#')) {
        let count = line.split_whitespace().nth(1);
        assert_ne!(count, Some("0"), "{line}");
    }
}

// ---- 9. Default plugin directories ----

#[test]
fn a_shipped_configs_missing_build_directory_is_not_warned_about() {
    // configs/local.toml names ../target/release and ../target/debug; on a fresh checkout
    // neither exists. A copy beside a directory without them is that fresh checkout.
    let dir = tempfile::tempdir().unwrap();
    let configs = dir.path().join("configs");
    std::fs::create_dir(&configs).unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/local.toml");
    std::fs::copy(shipped, configs.join("local.toml")).unwrap();
    let config = configs.join("local.toml");
    let out = ferrocx(&["info"], &[("FERROCX_CONFIG", config.to_str().unwrap())]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("cannot be read"), "{err}");
    assert!(
        text(&out.stdout).contains("rejected (0):"),
        "{}",
        text(&out.stdout)
    );

    // One the user names is still worth a warning.
    let out = ferrocx(
        &["info"],
        &[
            ("FERROCX_CONFIG", config.to_str().unwrap()),
            ("FERROCX_PLUGIN_PATH", "/nonexistent/ferrocx-plugins"),
        ],
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("/nonexistent/ferrocx-plugins: plugin directory cannot be read"),
        "{err}"
    );
}
