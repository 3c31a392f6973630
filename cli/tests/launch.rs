//! `ferrocx launch` as a user runs it: the ranks' environment and output, a failing rank that
//! stops the job and leaves nothing behind, the timeout, and ranks that rendezvous through the
//! launcher's store with `Store::from_env`.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ferrocx::bootstrap::{JobInfo, RankInfo, RankSource, Store};

/// Set for the ranks of `ranks_rendezvous_through_the_launchers_store`: the test binary itself
/// is the rank's program.
const CHILD_VAR: &str = "FERROCX_LAUNCH_TEST_RANK";

fn launch(args: &[&str], env: &[(&str, &Path)]) -> (Output, Duration) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrocx"));
    cmd.arg("launch").args(args).env_remove("FERROCX_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let out = cmd.output().expect("run ferrocx launch");
    (out, start.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn sorted_lines(b: &[u8]) -> Vec<String> {
    let mut lines: Vec<String> = text(b).lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

/// Whether `pid` is a live process (a zombie waiting for a reaper counts as gone).
fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

#[test]
fn every_rank_gets_its_environment_and_its_output_is_prefixed() {
    let (out, _) = launch(
        &[
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            "echo rank=$RANK of $WORLD_SIZE; echo local=$LOCAL_RANK/$LOCAL_WORLD_SIZE hosted=$FERROCX_STORE_HOSTED >&2",
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        sorted_lines(&out.stdout),
        ["[0] rank=0 of 3", "[1] rank=1 of 3", "[2] rank=2 of 3"]
    );
    let stderr = sorted_lines(&out.stderr);
    for r in 0..3 {
        let want = format!("[{r}] local={r}/3 hosted=1");
        assert!(stderr.contains(&want), "{stderr:?}");
    }
}

#[test]
fn every_rank_sees_the_same_store_and_job_and_a_fresh_token() {
    let script = "echo $MASTER_ADDR:$MASTER_PORT $FERROCX_JOB_ID ${#FERROCX_JOB_TOKEN}";
    let (out, _) = launch(&["-n", "2", "--", "sh", "-c", script], &[]);
    assert!(out.status.success(), "{out:?}");
    let lines = sorted_lines(&out.stdout);
    let rest: Vec<&str> = lines.iter().map(|l| &l[4..]).collect();
    assert_eq!(rest[0], rest[1], "{lines:?}");
    let fields: Vec<&str> = rest[0].split(' ').collect();
    assert!(fields[0].starts_with("127.0.0.1:"), "{lines:?}");
    assert!(fields[1].starts_with("launch-"), "{lines:?}");
    assert_eq!(fields[2], "64", "token length: {lines:?}");

    let (again, _) = launch(&["-n", "1", "--", "sh", "-c", script], &[]);
    let again = text(&again.stdout);
    assert_ne!(&again.trim_end()[4..], rest[0], "each job has its own id");
}

#[test]
fn lines_from_several_ranks_never_interleave() {
    let script = "awk -v r=$RANK 'BEGIN { s = \"\"; for (i = 0; i < 3000; i++) s = s r; \
                  for (j = 0; j < 200; j++) print s }'";
    let (out, _) = launch(&["-n", "4", "--", "sh", "-c", script], &[]);
    assert!(out.status.success(), "{out:?}");
    let mut counts = [0usize; 4];
    for line in text(&out.stdout).lines() {
        let r: usize = line[1..2].parse().expect("a rank prefix");
        let want = format!("[{r}] {}", r.to_string().repeat(3000));
        assert!(
            line == want,
            "a mixed line: {}",
            &line[..line.len().min(80)]
        );
        counts[r] += 1;
    }
    assert_eq!(counts, [200; 4]);
}

#[test]
fn a_failing_rank_stops_the_job_and_gives_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    // Every rank starts a background sleep and records both pids; rank 1 fails once the
    // others have recorded theirs.
    let script = r#"
        sleep 30 &
        echo "$$ $!" > "$PIDDIR/$RANK.tmp" && mv "$PIDDIR/$RANK.tmp" "$PIDDIR/$RANK.pid"
        if [ "$RANK" = 1 ]; then
            while [ ! -f "$PIDDIR/0.pid" ] || [ ! -f "$PIDDIR/2.pid" ]; do sleep 0.05; done
            exit 3
        fi
        wait
    "#;
    let (out, took) = launch(
        &["-n", "3", "--", "sh", "-c", script],
        &[("PIDDIR", dir.path())],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("ferrocx launch: rank 1 exited with code 3"),
        "{stderr}"
    );

    let mut pids = Vec::new();
    for r in 0..3 {
        let f = std::fs::read_to_string(dir.path().join(format!("{r}.pid"))).unwrap();
        pids.extend(f.split_whitespace().map(|p| p.parse::<i32>().unwrap()));
    }
    assert_eq!(pids.len(), 6);
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[test]
fn a_rank_killed_by_a_signal_gives_128_plus_the_signal() {
    let script = "if [ $RANK = 2 ]; then kill -9 $$; fi; sleep 30";
    let (out, took) = launch(&["-n", "3", "--", "sh", "-c", script], &[]);
    assert_eq!(out.status.code(), Some(128 + 9), "{out:?}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        text(&out.stderr).contains("ferrocx launch: rank 2 killed by signal 9"),
        "{out:?}"
    );
}

#[test]
fn a_job_past_its_timeout_is_stopped_with_124_naming_the_ranks_still_running() {
    let script = "if [ $RANK = 0 ]; then exit 0; fi; sleep 30";
    let (out, took) = launch(
        &["-n", "3", "--timeout-s", "1", "--", "sh", "-c", script],
        &[],
    );
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        text(&out.stderr).contains("ranks still running: 1, 2"),
        "{out:?}"
    );
}

#[test]
fn a_command_that_cannot_start_is_an_error() {
    let (out, _) = launch(&["-n", "2", "--", "/nonexistent/ferrocx-test-cmd"], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text(&out.stderr).contains("could not start rank 0 (/nonexistent/ferrocx-test-cmd)"),
        "{out:?}"
    );
}

#[test]
fn ranks_rendezvous_through_the_launchers_store() {
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrocx"));
    cmd.args(["launch", "-n", "3", "--timeout-s", "120", "--", exe])
        .args([
            "launched_rank",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_VAR, "1")
        .env_remove("FERROCX_LOG");
    let out = cmd.output().expect("run ferrocx launch");
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<String> = sorted_lines(&out.stdout)
        .into_iter()
        .filter_map(|l| {
            // libtest's "test launched_rank ... " may precede the rank's line.
            let at = l.find("STORE-OK")?;
            Some(format!("{} {}", &l[..3], &l[at..]))
        })
        .collect();
    assert_eq!(
        lines,
        [
            "[0] STORE-OK rank=0 gathered=r0,r1,r2 root=hello from 0",
            "[1] STORE-OK rank=1 gathered=r0,r1,r2 root=hello from 0",
            "[2] STORE-OK rank=2 gathered=r0,r1,r2 root=hello from 0",
        ],
        "{}",
        text(&out.stderr)
    );
}

/// A rank of `ranks_rendezvous_through_the_launchers_store`; passes at once when run otherwise.
#[test]
fn launched_rank() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    let rank = RankInfo::from_env(|v| std::env::var(v).ok()).unwrap();
    assert_eq!(rank.source(), RankSource::Torchrun);
    assert_eq!(rank.world_size, 3);
    let job = JobInfo::from_env(|v| std::env::var(v).ok(), &rank);
    assert!(job.id.starts_with("launch-"), "{}", job.id);
    assert_eq!(job.token.len(), 64);
    let (store, server) = Store::from_env(&rank, &job, Duration::from_secs(60)).unwrap();
    assert!(server.is_none(), "the launcher hosts the store, not rank 0");

    let all = store
        .all_gather(
            "ranks",
            rank.rank,
            rank.world_size,
            format!("r{}", rank.rank).as_bytes(),
        )
        .unwrap();
    let all: Vec<String> = all.iter().map(|v| text(v)).collect();
    let root = match rank.rank {
        0 => store.broadcast("greeting", true, Some(b"hello from 0")),
        _ => store.broadcast("greeting", false, None),
    }
    .unwrap();
    store.barrier("end", rank.world_size).unwrap();
    println!(
        "STORE-OK rank={} gathered={} root={}",
        rank.rank,
        all.join(","),
        text(&root)
    );
}
