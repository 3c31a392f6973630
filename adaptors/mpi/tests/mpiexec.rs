//! The MPI CCL under `mpiexec` (the `mpich` wheel's, on loopback): every collective on random
//! data against a reference each rank computes itself from every rank's seed, with 2, 3 and 4
//! ranks, every type and op, several sizes (odd ones included), in place and not; grouped
//! sends and receives; a dead rank failing the others within the timeout; and the errors of a
//! missing library, an unknown ABI and a communicator larger than the MPI world.
//!
//! The ranks are this test binary run again by `mpiexec` with `FERROCX_MPI_TEST_ROLE` set; they
//! go through the core's `Communicator` (config `device = "host"`, `ccl = "mpi"`, store at
//! `MASTER_PORT`), forcing every call onto the CCL.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ferrocx::abi::{DataType, DevicePtr, MemKind, ReduceOp};
use ferrocx::comm::Communicator;
use ferrocx::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use ferrocx::hetero::BridgeKind;
use ferrocx::route::Route;

const ROLE: &str = "FERROCX_MPI_TEST_ROLE";
const SEED: &str = "FERROCX_MPI_TEST_SEED";
/// Set (to `mpi`) when the job spans clusters and must cross them over that bridge.
const BRIDGE: &str = "FERROCX_MPI_TEST_BRIDGE";

/// `mpiexec` from `PATH` (the test script puts the virtual environment's `bin` first) or
/// `$FERROCX_VENV/bin`; a clear failure when neither has it.
/// Each report in `t` that starts with `prefix`, to the end of its line, wherever it starts:
/// the ranks' output shares one pipe, so a report may follow another rank's unfinished line.
fn reports<'a>(t: &'a str, prefix: &str) -> Vec<&'a str> {
    t.match_indices(prefix)
        .map(|(at, _)| t[at..].lines().next().unwrap_or(""))
        .collect()
}

fn mpiexec() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(v) = std::env::var_os("FERROCX_VENV") {
        dirs.insert(0, PathBuf::from(v).join("bin"));
    }
    // MPICH's (Hydra): its options are the ones used here; another MPI's mpiexec on PATH
    // (a system Open MPI) is passed over.
    dirs.into_iter()
        .map(|d| d.join("mpiexec"))
        .find(|p| p.is_file() && p.parent().is_some_and(|d| d.join("mpichversion").is_file()))
        .expect(
            "the mpich wheel's mpiexec was not found on PATH or in $FERROCX_VENV/bin: run the \
             tests with `bash scripts/test.sh`, which installs it and puts it on PATH",
        )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn config(dir: &tempfile::TempDir, timeout_ms: u64) -> PathBuf {
    let p = dir.path().join("mpi.toml");
    std::fs::write(
        &p,
        format!(
            "[runtime]\ntimeout_ms = {timeout_ms}\n\n[[cluster]]\nname = \"cpu\"\ndevice = \
             \"host\"\nccl = \"mpi\"\nfallback = \"none\"\nmulticast = \"off\"\n"
        ),
    )
    .unwrap();
    p
}

/// Runs `n` ranks of role `role` under mpiexec; returns the output (killed after `limit`).
fn launch(n: usize, role: &str, timeout_ms: u64, extra: &[&str], limit: Duration) -> Output {
    launch_with(&mpiexec(), "-genv", n, role, timeout_ms, extra, limit)
}

/// As [`launch`], with the launcher `exe` whose option setting a variable for every rank is
/// `genv` (Hydra's `-genv NAME VALUE`; Open MPI's `-x NAME=VALUE`).
fn launch_with(
    exe: &std::path::Path,
    genv: &str,
    n: usize,
    role: &str,
    timeout_ms: u64,
    extra: &[&str],
    limit: Duration,
) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir, timeout_ms);
    let seed = format!("{}", std::process::id() as u64 * 7919 + n as u64);
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(extra).arg("-n").arg(n.to_string());
    let port = free_port().to_string();
    let job = format!("mpitest{seed}");
    for (k, v) in [
        (ROLE, role),
        (SEED, &seed),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", &port),
        ("FERROCX_JOB_ID", &job),
        ("FERROCX_JOB_TOKEN", "mpi-test"),
        ("FERROCX_CONFIG", cfg.to_str().unwrap()),
    ] {
        // A config given in `extra` replaces the default one.
        if k == "FERROCX_CONFIG" && extra.contains(&"FERROCX_CONFIG") {
            continue;
        }
        match genv {
            "-x" => cmd.arg("-x").arg(format!("{k}={v}")),
            _ => cmd.args([genv, k, v]),
        };
    }
    cmd.arg(&me)
        .args(["--exact", "rank_entry", "--nocapture", "--test-threads=1"])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start mpiexec");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    sweep(&job);
    assert!(
        start.elapsed() <= limit,
        "mpiexec -n {n} ({role}) did not finish within {limit:?}:\n{}",
        text(&out)
    );
    out
}

/// Removes the host device's segments a job's ranks left in /dev/shm (ranks started by mpiexec
/// end without the host device's teardown, and each job here has a name of its own, so no
/// later start of the job would remove them), and MPICH's that no process maps any more.
fn sweep(job: &str) {
    drop(ferrocx_test_support::shm::JobCleanup(job.to_string()));
    // MPICH's own segments that ranks ended without `MPI_Finalize` left (any job's, once no
    // process maps them).
    ferrocx_test_support::shm::sweep_unmapped_mpich_segments();
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn collectives(n: usize) {
    let out = launch(n, "collectives", 20_000, &[], Duration::from_secs(90));
    expect_all_match(&out, n, "libmpi_abi.so.1 (standard)");
}

fn expect_all_match(out: &Output, n: usize, library: &str) {
    let t = text(out);
    assert!(out.status.success(), "{t}");
    for r in 0..n {
        assert!(
            t.contains(&format!("rank {r} of {n}: all cases match")),
            "rank {r} did not finish:\n{t}"
        );
    }
    assert!(
        t.contains(&format!("with {library}")),
        "not run on {library}:\n{t}"
    );
}

#[test]
fn every_collective_matches_the_reference_on_mpichs_own_abi() {
    // The wheel's libmpi.so.12: MPICH's int handles rather than the standard ABI's.
    let out = launch(
        3,
        "collectives",
        20_000,
        &["-genv", "FERROCX_MPI_LIBRARY", "libmpi.so.12"],
        Duration::from_secs(90),
    );
    expect_all_match(&out, 3, "libmpi.so.12 (mpich)");
}

#[test]
fn every_collective_matches_the_reference_on_open_mpi_where_installed() {
    // Open MPI is not part of the test set-up (no wheel ships it): run where the system has it.
    let Some(orterun) = ["/usr/bin/mpiexec.openmpi", "/usr/bin/orterun"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    else {
        eprintln!("Open MPI is not installed here (mpiexec.openmpi): not run");
        return;
    };
    let out = launch_with(
        &orterun,
        "-x",
        3,
        "collectives",
        20_000,
        &[
            "--allow-run-as-root",
            "--oversubscribe",
            "-x",
            "FERROCX_MPI_LIBRARY=libmpi.so.40",
        ],
        Duration::from_secs(90),
    );
    expect_all_match(&out, 3, "libmpi.so.40 (openmpi)");
}

#[test]
fn every_collective_matches_the_reference_on_2_ranks() {
    collectives(2);
}

#[test]
fn every_collective_matches_the_reference_on_3_ranks() {
    collectives(3);
}

#[test]
fn every_collective_matches_the_reference_on_4_ranks() {
    collectives(4);
}

#[test]
fn a_dead_rank_fails_the_others_within_the_timeout() {
    let out = launch(
        2,
        "dead",
        1500,
        // A killed rank cannot remove MPICH's shared-memory segment: no shared memory here.
        &["-disable-auto-cleanup", "-genv", "MPIR_CVAR_NOLOCAL", "1"],
        Duration::from_secs(40),
    );
    let t = text(&out);
    let line = t
        .lines()
        .find(|l| l.starts_with("survivor:"))
        .unwrap_or_else(|| panic!("rank 0 reported nothing:\n{t}"));
    assert!(
        line.contains("TIMEOUT") || line.contains("PEER_FAILURE"),
        "{line}\n{t}"
    );
    assert!(line.contains("all_reduce"), "{line}");
    let ms: u64 = line
        .rsplit("after ")
        .next()
        .and_then(|s| s.trim_end_matches(" ms").parse().ok())
        .unwrap_or_else(|| panic!("no time in {line}"));
    // The deadline is 1.5 s: the failure comes by then (MPI may see the peer gone sooner),
    // plus scheduling slack on a loaded machine; never a hang.
    assert!(ms < 15_000, "{line}");
}

#[test]
fn a_communicator_over_some_ranks_needs_nothing_of_the_others() {
    // MPI world of 4; world ranks 1..4 make a communicator of 3, world rank 0 never calls in.
    let out = launch(4, "subset", 10_000, &[], Duration::from_secs(60));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for r in 1..4 {
        assert!(
            t.contains(&format!(
                "world rank {r}: rank {} of 3, all_reduce matches",
                r - 1
            )),
            "world rank {r}:\n{t}"
        );
    }
    assert!(t.contains("world rank 0: stayed out"), "{t}");
}

#[test]
fn two_clusters_on_mpi_make_their_communicators_side_by_side_and_bridge() {
    // World ranks 0-1 and 2-3 are two clusters, each with its own MPI communicator (made at the
    // same time, each by its own ranks only); the shared-memory bridge joins them (`auto`: every
    // rank is on this host).
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("two.toml");
    std::fs::write(
        &cfg,
        "[runtime]\ntimeout_ms = 20000\n\n\
         [[cluster]]\nname = \"a\"\nranks = \"0-1\"\ndevice = \"host\"\nccl = \"mpi\"\n\
         fallback = \"none\"\nmulticast = \"off\"\n\n\
         [[cluster]]\nname = \"b\"\nranks = \"2-3\"\ndevice = \"host\"\nccl = \"mpi\"\n\
         fallback = \"none\"\nmulticast = \"off\"\n\n[bridge]\nccl = \"auto\"\n",
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap().to_string();
    let out = launch(
        4,
        "hetero",
        20_000,
        &["-genv", "FERROCX_CONFIG", &cfg],
        Duration::from_secs(60),
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(t.matches("bridge shared memory").count(), 4, "{t}");
    for r in 0..4 {
        assert!(
            t.contains(&format!(
                "rank {r} of 4 (cluster {}): across clusters, all match",
                if r < 2 { "a" } else { "b" }
            )),
            "rank {r}:\n{t}"
        );
    }
}

/// A config of two clusters on the host device (`a`: `ranks_a` on `ccl_a`, `b`: the others on
/// `ccl_b`) bridged by `bridge`.
fn two_clusters(
    dir: &tempfile::TempDir,
    timeout_ms: u64,
    ranks_a: &str,
    ranks_b: &str,
    (ccl_a, ccl_b): (&str, &str),
    bridge: &str,
) -> String {
    let cfg = dir.path().join("two.toml");
    std::fs::write(
        &cfg,
        format!(
            "[runtime]\ntimeout_ms = {timeout_ms}\n\n\
             [[cluster]]\nname = \"a\"\nranks = \"{ranks_a}\"\ndevice = \"host\"\n\
             ccl = \"{ccl_a}\"\nfallback = \"none\"\nmulticast = \"off\"\n\n\
             [[cluster]]\nname = \"b\"\nranks = \"{ranks_b}\"\ndevice = \"host\"\n\
             ccl = \"{ccl_b}\"\nfallback = \"none\"\nmulticast = \"off\"\n\n\
             [bridge]\nccl = \"{bridge}\"\n"
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_string()
}

fn every_collective_over_the_mpi_bridge(n: usize, ranks: (&str, &str), ccls: (&str, &str)) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = two_clusters(&dir, 20_000, ranks.0, ranks.1, ccls, "mpi");
    let out = launch(
        n,
        "collectives",
        20_000,
        &["-genv", "FERROCX_CONFIG", &cfg, "-genv", BRIDGE, "mpi"],
        Duration::from_secs(150),
    );
    expect_all_match(&out, n, "libmpi_abi.so.1 (standard)");
    let t = text(&out);
    for r in 0..n {
        assert!(
            t.contains(&format!("rank {r} (cluster ")) && t.contains("bridge MPI"),
            "rank {r} did not cross over MPI:\n{t}"
        );
    }
}

#[test]
fn every_collective_across_clusters_on_the_host_and_mpi_ccls_over_the_mpi_bridge() {
    // Cluster a: rank 0 alone on the MPI CCL; cluster b: ranks 1-2 on the host CCL. Every
    // collective, type and op (odd sizes, in place and not) crosses them over MPI.
    every_collective_over_the_mpi_bridge(3, ("0", "1-2"), ("mpi", "host"));
}

#[test]
fn every_collective_across_interleaved_clusters_over_the_mpi_bridge() {
    // Clusters of non-contiguous ranks, both on the MPI CCL (the bridge's own adaptor: one
    // group covers sends and receives inside and across clusters).
    every_collective_over_the_mpi_bridge(4, ("0,2", "1,3"), ("mpi", "mpi"));
}

#[test]
fn every_collective_from_a_device_the_host_cannot_address_over_the_mpi_bridge() {
    // Cluster a: rank 0 on the `offhost` test device (memory the host cannot address, a
    // one-rank CCL), staged through host memory; cluster b: ranks 1-2 on the host device and
    // the MPI CCL. Every collective crosses them over MPI.
    let exe = std::env::current_exe().unwrap();
    let dir_of = exe.parent().unwrap();
    let so = [dir_of.to_path_buf(), dir_of.join("deps")]
        .iter()
        .map(|d| d.join("libferrocx_adaptor_offhost.so"))
        .find(|p| p.is_file())
        .expect("the offhost plugin is built beside the tests (a dev-dependency)");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("offhost.toml");
    std::fs::write(
        &cfg,
        format!(
            "[runtime]\ntimeout_ms = 20000\nplugins = [{so:?}]\n\n\
             [[cluster]]\nname = \"a\"\nranks = \"0\"\ndevice = \"offhost\"\nccl = \"offhost\"\n\
             fallback = \"none\"\nmulticast = \"off\"\n\n\
             [[cluster]]\nname = \"b\"\nranks = \"1-2\"\ndevice = \"host\"\nccl = \"mpi\"\n\
             fallback = \"none\"\nmulticast = \"off\"\n\n[bridge]\nccl = \"mpi\"\n"
        ),
    )
    .unwrap();
    let out = launch(
        3,
        "collectives",
        20_000,
        &[
            "-genv",
            "FERROCX_CONFIG",
            cfg.to_str().unwrap(),
            "-genv",
            BRIDGE,
            "mpi",
        ],
        Duration::from_secs(150),
    );
    expect_all_match(&out, 3, "libmpi_abi.so.1 (standard)");
    let t = text(&out);
    assert!(t.contains("rank 0 (cluster a): bridge MPI (staged)"), "{t}");
}

#[test]
fn the_mpi_bridge_without_an_mpi_library_is_an_error_naming_what_was_tried() {
    // Both clusters on the host CCL: only the bridge needs MPI, and the library named is not
    // there. Every rank fails at init, naming the bridge and the file tried.
    let dir = tempfile::tempdir().unwrap();
    let cfg = two_clusters(&dir, 10_000, "0", "1", ("host", "host"), "mpi");
    let missing = dir.path().join("libmpi_missing.so.1");
    let out = launch(
        2,
        "init",
        10_000,
        &[
            "-genv",
            "FERROCX_CONFIG",
            &cfg,
            "-genv",
            "FERROCX_MPI_LIBRARY",
            missing.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let t = text(&out);
    // Each rank's line (a rank's output may follow the test harness's on the same line).
    let lines: Vec<&str> = t
        .lines()
        .filter_map(|l| l.split_once("init: ").map(|x| x.1))
        .collect();
    assert_eq!(lines.len(), 2, "{t}");
    for l in lines {
        assert!(
            l.contains("the MPI bridge could not open MPI")
                && l.contains("libmpi_missing.so.1")
                && l.contains("pip install mpich"),
            "{l}"
        );
    }
}

#[test]
fn a_dead_rank_fails_the_mpi_bridge_naming_it_and_its_cluster() {
    // Rank 1 (cluster b) dies once the communicator exists; ranks 0 and 2 all-reduce across
    // the clusters over MPI: they fail within the timeout, naming rank 1 and cluster b.
    let dir = tempfile::tempdir().unwrap();
    let cfg = two_clusters(&dir, 1500, "0", "1-2", ("mpi", "host"), "mpi");
    let out = launch(
        3,
        "dead",
        1500,
        &[
            "-disable-auto-cleanup",
            "-genv",
            "MPIR_CVAR_NOLOCAL",
            "1",
            "-genv",
            "FERROCX_CONFIG",
            &cfg,
        ],
        Duration::from_secs(40),
    );
    let t = text(&out);
    let lines = reports(&t, "survivor:");
    assert_eq!(lines.len(), 2, "ranks 0 and 2 must both report:\n{t}");
    for line in lines {
        assert!(line.contains("rank 1 (cluster \"b\") died"), "{line}\n{t}");
        let ms: u64 = line
            .rsplit("after ")
            .next()
            .and_then(|s| s.trim_end_matches(" ms").parse().ok())
            .unwrap_or_else(|| panic!("no time in {line}"));
        // The operations' deadline and the look at the heartbeats fit in the 1.5 s timeout
        // (1.4 s on an idle machine); slack for a loaded one; never a hang.
        assert!(ms < 6_000, "{line}");
    }
}

/// Two simulated hosts: network namespaces joined by a veth pair (addresses only inside them),
/// each with its own IPC, mount (its own `/dev/shm`), UTS and PID namespaces. Hydra starts its
/// proxy on the other "host" through a launcher that enters that host's namespaces, in place of
/// ssh. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), `ip` and `unshare`.
struct Hosts {
    ns: [String; 2],
    dir: tempfile::TempDir,
}

const HOST_LAUNCHER: &str = r#"#!/bin/sh
# Hydra's ssh launcher stand-in: [-x] <host> <command line>. Runs the command line in that
# host's network namespace, with IPC, mount, UTS and PID namespaces and a /dev/shm of its own.
[ "$1" = "-x" ] && shift
host=$1; shift
ns=$(echo "$FX_HOSTS" | tr ' ' '
' | grep "^$host=" | cut -d= -f2)
[ -n "$ns" ] || { echo "no namespace for host $host" >&2; exit 1; }
exec ip netns exec "$ns" unshare --ipc --mount --uts --pid --fork --mount-proc     sh -c 'mount -t tmpfs -o size=256m tmpfs /dev/shm && hostname "$0" && eval "$1"' "$ns" "$*"
"#;

impl Hosts {
    /// Makes the two hosts, or says which step failed.
    fn new() -> Result<Hosts, String> {
        let id = std::process::id();
        let ns = [format!("fxa{id}"), format!("fxb{id}")];
        let run = |args: &[&str]| -> Result<(), String> {
            let o = Command::new(args[0])
                .args(&args[1..])
                .output()
                .map_err(|e| format!("{}: {e}", args.join(" ")))?;
            if o.status.success() {
                Ok(())
            } else {
                Err(format!("{}: {}", args.join(" "), text(&o).trim()))
            }
        };
        run(&["ip", "netns", "add", &ns[0]])?;
        let hosts = Hosts {
            ns: ns.clone(),
            dir: tempfile::tempdir().map_err(|e| e.to_string())?,
        };
        run(&["ip", "netns", "add", &ns[1]])?;
        let (va, vb) = (format!("v{}", ns[0]), format!("v{}", ns[1]));
        run(&[
            "ip", "link", "add", &va, "type", "veth", "peer", "name", &vb,
        ])?;
        for (v, n, a) in [(&va, &ns[0], "10.77.0.1/24"), (&vb, &ns[1], "10.77.0.2/24")] {
            run(&["ip", "link", "set", v, "netns", n])?;
            run(&["ip", "-n", n, "addr", "add", a, "dev", v])?;
            run(&["ip", "-n", n, "link", "set", v, "up"])?;
            run(&["ip", "-n", n, "link", "set", "lo", "up"])?;
        }
        let l = hosts.dir.path().join("launcher.sh");
        std::fs::write(&l, HOST_LAUNCHER).map_err(|e| e.to_string())?;
        run(&["chmod", "+x", l.to_str().unwrap()])?;
        Ok(hosts)
    }

    /// Bytes received by host A's end of the veth pair.
    fn rx_bytes(&self) -> u64 {
        let p = format!("/sys/class/net/v{}/statistics/rx_bytes", self.ns[0]);
        let o = Command::new("ip")
            .args(["netns", "exec", &self.ns[0], "cat", &p])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for n in &self.ns {
            // Deleting a namespace deletes its end of the veth pair, and so the pair.
            let _ = Command::new("ip").args(["netns", "delete", n]).output();
        }
    }
}

/// Runs 4 ranks of role `collectives` under mpiexec on host A, ranks 0-1 on host A and 2-3 on
/// host B, with the config `cfg` and the extra variables `env`.
fn on_two_hosts(hosts: &Hosts, cfg: &str, job: &str, env: &[(&str, &str)]) -> Output {
    let launcher = hosts.dir.path().join("launcher.sh");
    let me = std::env::current_exe().unwrap();
    let seed = format!("{}", std::process::id());
    let mut cmd = Command::new("timeout");
    // mpiexec runs on host A, in host A's namespaces, as the proxies do.
    cmd.arg("120")
        .args(["ip", "netns", "exec", &hosts.ns[0]])
        .args([
            "unshare",
            "--ipc",
            "--mount",
            "--uts",
            "--pid",
            "--fork",
            "--mount-proc",
        ])
        .args([
            "sh",
            "-c",
            "mount -t tmpfs -o size=256m tmpfs /dev/shm && hostname hostA && exec \"$@\"",
            "sh",
        ])
        .arg(mpiexec())
        .args(["-launcher", "ssh", "-launcher-exec"])
        .arg(&launcher)
        .args([
            "-localhost",
            "10.77.0.1",
            "-hosts",
            "10.77.0.1:2,10.77.0.2:2",
            "-n",
            "4",
        ])
        .args(["-genv", ROLE, "collectives", "-genv", SEED, &seed])
        .args([
            "-genv",
            "MASTER_ADDR",
            "10.77.0.1",
            "-genv",
            "MASTER_PORT",
            "29640",
        ])
        .args([
            "-genv",
            "FERROCX_JOB_ID",
            job,
            "-genv",
            "FERROCX_JOB_TOKEN",
            "t",
        ])
        .args(["-genv", "FERROCX_CONFIG", cfg]);
    for (k, v) in env {
        cmd.args(["-genv", k, v]);
    }
    cmd.arg(&me)
        .args(["--exact", "rank_entry", "--nocapture", "--test-threads=1"])
        .env(
            "FX_HOSTS",
            format!("10.77.0.1={} 10.77.0.2={}", hosts.ns[0], hosts.ns[1]),
        )
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `true` where network namespaces can be made (root); says why not otherwise.
fn can_make_hosts() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: network namespaces cannot be made here; not run");
        return false;
    }
    true
}

#[test]
fn a_cpu_cluster_across_two_simulated_hosts_runs_on_mpi() {
    if !can_make_hosts() {
        return;
    }
    let hosts = Hosts::new().unwrap_or_else(|e| panic!("making the two hosts failed: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir, 20_000);
    let before = hosts.rx_bytes();
    let out = on_two_hosts(&hosts, cfg.to_str().unwrap(), "twohosts", &[]);
    expect_all_match(&out, 4, "libmpi_abi.so.1 (standard)");
    // Ranks 2 and 3 ran on host B: the collectives crossed the veth pair.
    let crossed = hosts.rx_bytes() - before;
    assert!(
        crossed > 100_000,
        "only {crossed} bytes reached host A over the veth pair:\n{}",
        text(&out)
    );
}

#[test]
fn a_job_across_clusters_on_two_simulated_hosts_bridges_them_over_mpi_on_auto() {
    if !can_make_hosts() {
        return;
    }
    // Cluster a on host A, cluster b on host B, each on the host CCL (shared memory inside its
    // host); `[bridge] ccl = "auto"` sees two hosts and takes MPI: every collective crosses.
    let hosts = Hosts::new().unwrap_or_else(|e| panic!("making the two hosts failed: {e}"));
    let dir = tempfile::tempdir().unwrap();
    let cfg = two_clusters(&dir, 20_000, "0-1", "2-3", ("host", "host"), "auto");
    let before = hosts.rx_bytes();
    let out = on_two_hosts(&hosts, &cfg, "twohostsbridge", &[(BRIDGE, "mpi")]);
    expect_all_match(&out, 4, "libmpi_abi.so.1 (standard)");
    let t = text(&out);
    for r in 0..4 {
        let c = if r < 2 { "a" } else { "b" };
        assert!(
            t.contains(&format!("rank {r} (cluster {c}): bridge MPI")),
            "rank {r}:\n{t}"
        );
    }
    let crossed = hosts.rx_bytes() - before;
    assert!(
        crossed > 100_000,
        "only {crossed} bytes reached host A over the veth pair:\n{t}"
    );
}

#[test]
fn mpiexec_without_a_store_port_is_told_how_to_pass_one() {
    // Hydra gives the ranks (PMI_RANK, PMI_SIZE) but not the store's address.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir, 5000);
    let out = Command::new(mpiexec())
        .args(["-n", "2", "-genv", ROLE, "init"])
        .args(["-genv", "FERROCX_CONFIG", cfg.to_str().unwrap()])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "rank_entry", "--nocapture"])
        .env_remove("MASTER_PORT")
        .env_remove("MASTER_ADDR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let t = text(&out);
    let messages = reports(&t, "init: ");
    assert_eq!(messages.len(), 2, "{t}");
    for m in messages {
        assert!(
            m.contains("MASTER_PORT") && m.contains("mpiexec -genv MASTER_ADDR"),
            "{m}"
        );
    }
}

#[test]
fn a_rank_whose_peer_died_still_exits() {
    let start = Instant::now();
    let out = launch(
        2,
        "dead",
        1500,
        &[
            "-disable-auto-cleanup",
            "-genv",
            "MPIR_CVAR_NOLOCAL",
            "1",
            "-genv",
            "FERROCX_MPI_TEST_IDLE_SURVIVOR",
            "1",
        ],
        Duration::from_secs(40),
    );
    let t = text(&out);
    assert!(t.contains("survivor: exiting"), "{t}");
    // MPI_Finalize waits for the dead peer; the wait is given up after the timeout.
    assert!(
        t.contains("MPI_Finalize did not return within 1500 ms"),
        "{t}"
    );
    assert!(start.elapsed() < Duration::from_secs(40), "{t}");
}

/// Runs this binary's `rank_entry` alone (no mpiexec) with `env`, returning its output.
fn alone(role: &str, env: &[(&str, &str)], remove: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir, 3000);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "rank_entry", "--nocapture"])
        .env(ROLE, role)
        .env("FERROCX_CONFIG", &cfg)
        .env_remove("PMI_RANK")
        .env_remove("PMI_SIZE");
    for k in remove {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    text(&out)
}

#[test]
fn no_mpi_library_is_an_error_naming_what_was_tried() {
    let t = alone(
        "init",
        &[("FERROCX_MPI_LIBRARY", "/nonexistent/libmpi.so.99")],
        &[],
    );
    assert!(
        t.contains("/nonexistent/libmpi.so.99") && t.contains("no MPI library"),
        "{t}"
    );
}

#[test]
fn a_library_of_unknown_abi_is_refused_naming_it() {
    let t = alone("init", &[("FERROCX_MPI_LIBRARY", "libc.so.6")], &[]);
    let line = t.lines().find(|l| l.starts_with("init:")).unwrap_or(&t);
    assert!(
        line.contains("libc.so.6") && line.contains("unknown MPI ABI"),
        "{t}"
    );
    assert!(line.contains("standard") && line.contains("mpich"), "{t}");
}

#[test]
fn mpi_initialised_below_the_thread_level_needed_is_refused() {
    // Another part of the program (mpi4py, a C library) initialised MPI with
    // MPI_THREAD_FUNNELED: the adaptor finds MPI initialised and its level too low.
    let lib = mpiexec().parent().unwrap().join("../lib/libmpi_abi.so.1");
    let lib = std::fs::canonicalize(&lib).expect("the mpich wheel's libmpi_abi.so.1");
    let t = alone(
        "low-level",
        &[("FERROCX_MPI_LIBRARY", lib.to_str().unwrap())],
        &[],
    );
    let line = t
        .lines()
        .find(|l| l.starts_with("low-level:"))
        .unwrap_or(&t);
    assert!(
        line.contains("libmpi_abi.so.1")
            && line.contains("MPI_THREAD_FUNNELED")
            && line.contains("MPI_THREAD_SERIALIZED"),
        "{t}"
    );
}

#[test]
fn a_communicator_larger_than_the_mpi_world_is_refused() {
    // Two ranks by the launcher's variables, but each process is an MPI world of one.
    let port = free_port().to_string();
    let t0 = std::thread::spawn({
        let port = port.clone();
        move || {
            alone(
                "outside",
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_PORT", &port),
                    ("FERROCX_JOB_ID", "mpioutside"),
                ],
                &[],
            )
        }
    });
    let t1 = alone(
        "outside",
        &[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", &port),
            ("FERROCX_JOB_ID", "mpioutside"),
        ],
        &[],
    );
    let t0 = t0.join().unwrap();
    // Rank 1 is outside a world of one; rank 0 is inside it, but its communicator of two is not.
    for (t, says) in [
        (t0, "does not fit in the MPI world"),
        (
            t1,
            "rank 1 of 2 (from the launcher's variables) is outside the MPI world",
        ),
    ] {
        let line = t.lines().find(|l| l.starts_with("outside:")).unwrap_or(&t);
        assert!(line.contains(says) && line.contains("mpiexec -n 2"), "{t}");
        assert!(line.contains("libmpi"), "the library is not named: {t}");
    }
}

// ---- the ranks ------------------------------------------------------------------------------

/// The body of every rank: does nothing unless started by one of the tests above.
#[test]
fn rank_entry() {
    host::link();
    ferrocx_adaptor_mpi::link();
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "collectives" => rank_collectives(),
        "dead" => rank_dead(),
        "subset" => rank_subset(),
        "hetero" => rank_hetero(),
        "init" => {
            let e = Communicator::from_env().err().map(|e| e.to_string());
            println!("init: {}", e.unwrap_or_else(|| "ok".into()));
        }
        "low-level" => rank_low_level(),
        "outside" => {
            let e = Communicator::from_env().err().map(|e| e.to_string());
            println!("outside: {}", e.unwrap_or_else(|| "ok".into()));
        }
        r => panic!("unknown role {r}"),
    }
    let _ = std::io::stdout().flush();
}

/// Initialises MPI itself at MPI_THREAD_FUNNELED, then makes a communicator.
fn rank_low_level() {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let path = std::env::var("FERROCX_MPI_LIBRARY").unwrap();
    // SAFETY: opening the MPI library runs its initialisers only.
    let lib = unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) }.unwrap();
    type InitThread = unsafe extern "C" fn(
        *mut std::ffi::c_int,
        *mut std::ffi::c_void,
        std::ffi::c_int,
        *mut std::ffi::c_int,
    ) -> std::ffi::c_int;
    // SAFETY: MPI_Init_thread has this signature in the standard ABI.
    let init: libloading::os::unix::Symbol<InitThread> =
        unsafe { lib.get(b"MPI_Init_thread\0") }.unwrap();
    let mut provided = -1;
    // MPI_THREAD_FUNNELED is 1024 in the standard ABI.
    // SAFETY: MPI is not initialised; null argc/argv are allowed.
    let rc = unsafe {
        init(
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            1024,
            &mut provided,
        )
    };
    assert_eq!((rc, provided), (0, 1024));
    let e = Communicator::from_env().err().map(|e| e.to_string());
    println!("low-level: {}", e.unwrap_or_else(|| "ok".into()));
    std::mem::forget(lib);
}

/// A small deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
}

fn unsigned(d: DataType) -> bool {
    matches!(d, DataType::U8 | DataType::U32 | DataType::U64)
}

/// Integer values every type holds exactly, in a range where `ranks` of them sum (or
/// multiply) without overflow.
fn values(seed: u64, rank: usize, case: usize, n: usize, d: DataType, op: ReduceOp) -> Vec<i64> {
    let mut r = Rng(seed ^ ((rank as u64) << 40) ^ ((case as u64) << 8));
    let (lo, hi) = match (op, unsigned(d)) {
        (ReduceOp::PROD, true) => (0, 2),
        (ReduceOp::PROD, false) => (-2, 2),
        (_, true) => (0, 30),
        (_, false) => (-30, 30),
    };
    (0..n).map(|_| r.range(lo, hi)).collect()
}

fn enc(d: DataType, v: &[i64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &x in v {
        match d {
            DataType::F32 => out.extend((x as f32).to_ne_bytes()),
            DataType::F64 => out.extend((x as f64).to_ne_bytes()),
            DataType::F16 => out.extend(f32_to_f16(x as f32).to_ne_bytes()),
            DataType::BF16 => out.extend(f32_to_bf16(x as f32).to_ne_bytes()),
            DataType::I8 => out.extend((x as i8).to_ne_bytes()),
            DataType::U8 => out.extend((x as u8).to_ne_bytes()),
            DataType::I32 => out.extend((x as i32).to_ne_bytes()),
            DataType::U32 => out.extend((x as u32).to_ne_bytes()),
            DataType::I64 => out.extend(x.to_ne_bytes()),
            DataType::U64 => out.extend((x as u64).to_ne_bytes()),
            _ => unreachable!(),
        }
    }
    out
}

/// The reference reduction of `vals` (one vector per rank), encoded as `d`.
fn reference(d: DataType, op: ReduceOp, vals: &[Vec<i64>]) -> Vec<u8> {
    let n = vals[0].len();
    let p = vals.len();
    let mut out = Vec::new();
    for i in 0..n {
        let col = vals.iter().map(|v| v[i]);
        let sum: i64 = vals.iter().map(|v| v[i]).sum();
        let x = match op {
            ReduceOp::SUM | ReduceOp::AVG => sum,
            ReduceOp::PROD => col.product(),
            ReduceOp::MIN => col.min().unwrap(),
            _ => col.max().unwrap(),
        };
        let float = matches!(
            d,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
        );
        if op == ReduceOp::PROD && float {
            // In floating point a zero product keeps the sign of the factors (-0).
            let f: f64 = vals.iter().map(|v| v[i] as f64).product();
            match d {
                DataType::F32 => out.extend((f as f32).to_ne_bytes()),
                DataType::F64 => out.extend(f.to_ne_bytes()),
                DataType::F16 => out.extend(f32_to_f16(f as f32).to_ne_bytes()),
                _ => out.extend(f32_to_bf16(f as f32).to_ne_bytes()),
            }
            continue;
        }
        if op != ReduceOp::AVG {
            out.extend(enc(d, &[x]));
            continue;
        }
        match d {
            DataType::F32 => out.extend((sum as f32 / p as f32).to_ne_bytes()),
            DataType::F64 => out.extend((sum as f64 / p as f64).to_ne_bytes()),
            DataType::F16 => out.extend(f32_to_f16(sum as f32 / p as f32).to_ne_bytes()),
            DataType::BF16 => out.extend(f32_to_bf16(sum as f32 / p as f32).to_ne_bytes()),
            _ => out.extend(enc(d, &[sum / p as i64])),
        }
    }
    out
}

fn show(d: DataType, b: &[u8]) -> String {
    let s = d.size().unwrap();
    let v: Vec<String> = b
        .chunks(s)
        .take(8)
        .map(|c| match d {
            DataType::F16 => f16_to_f32(u16::from_ne_bytes([c[0], c[1]])).to_string(),
            DataType::BF16 => bf16_to_f32(u16::from_ne_bytes([c[0], c[1]])).to_string(),
            _ => format!("{c:?}"),
        })
        .collect();
    v.join(",")
}

/// Host-device memory of the communicator, filled with `data`.
struct Buf {
    ptr: DevicePtr,
    len: usize,
    dev: ferrocx::adaptor::Device,
}

/// `len` bytes of device memory holding `data` then 0xA5s (through copies: the device may
/// be one the host cannot address).
fn alloc(comm: &Communicator, data: &[u8], len: usize) -> Buf {
    let dev = comm.device().clone();
    let ptr = dev
        .mem_alloc(len.max(1), MemKind::DEVICE)
        .expect("device memory");
    let mut v = vec![0xA5u8; len.max(1)];
    v[..data.len()].copy_from_slice(data);
    // SAFETY: `ptr` holds `len.max(1)` bytes, `v` as many.
    unsafe { dev.mem_copy(ptr, DevicePtr(v.as_ptr() as u64), v.len()) }.expect("copy in");
    Buf { ptr, len, dev }
}

fn read(b: &Buf) -> Vec<u8> {
    let mut v = vec![0u8; b.len];
    if b.len > 0 {
        // SAFETY: `b` holds `len` bytes, `v` as many.
        unsafe {
            b.dev
                .mem_copy(DevicePtr(v.as_mut_ptr() as u64), b.ptr, b.len)
        }
        .expect("copy out");
    }
    v
}

/// Writes `data` at byte `off` of `b`.
fn write_at(b: &Buf, off: usize, data: &[u8]) {
    assert!(off + data.len() <= b.len);
    // SAFETY: inside `b`, from `data`.
    unsafe {
        b.dev.mem_copy(
            DevicePtr(b.ptr.0 + off as u64),
            DevicePtr(data.as_ptr() as u64),
            data.len(),
        )
    }
    .expect("copy in");
}

fn at(b: &Buf, off: usize) -> DevicePtr {
    DevicePtr(b.ptr.0 + off as u64)
}

fn rank_collectives() {
    let seed: u64 = std::env::var(SEED).unwrap().parse().unwrap();
    let comm = Communicator::from_env().expect("communicator");
    let (me, p) = (comm.rank(), comm.world());
    match std::env::var(BRIDGE).ok().as_deref() {
        // A job across clusters: every call below crosses them, over the MPI bridge.
        Some("mpi") => {
            let h = comm.hetero().expect("a job across clusters");
            assert_eq!(h.kind(), BridgeKind::Mpi, "rank {me}");
            let staged = if h.staged() { " (staged)" } else { "" };
            println!(
                "rank {me} (cluster {}): bridge {}{staged}",
                comm.cluster(),
                h.kind()
            );
        }
        Some(b) => panic!("unknown bridge {b}"),
        None => assert_eq!(comm.ccl().name(), "mpi"),
    }
    let mut case = 0usize;
    let mut fails: Vec<String> = Vec::new();
    let mut check = |what: String, got: &[u8], want: &[u8], d: DataType| {
        if got != want {
            fails.push(format!(
                "{what}: got [{}] want [{}]",
                show(d, got),
                show(d, want)
            ));
        }
    };
    let call = || comm.call().via(Route::Ccl);
    // A count beyond MPI's int is refused when enqueued, naming the limit, and the
    // communicator stays usable (the cases below run on it).
    let small = alloc(&comm, &[], 16);
    // SAFETY: refused before any element is touched (the count is checked at enqueue).
    let e = unsafe { call().all_gather(small.ptr, small.ptr, (1usize << 31) / 4, DataType::F32) }
        .expect_err("a count past MPI's int");
    assert!(e.to_string().contains("exceeds MPI's int count"), "{e}");
    let sizes = [1usize, 7, 1001];
    // Reductions: every type and op.
    for d in DataType::ALL {
        let s = d.size().unwrap();
        for op in ReduceOp::ALL {
            for (k, &n) in sizes.iter().enumerate() {
                if k == 2 && op != ReduceOp::SUM && d != DataType::F16 {
                    continue;
                }
                case += 1;
                let vals: Vec<Vec<i64>> = (0..p).map(|r| values(seed, r, case, n, d, op)).collect();
                let want = reference(d, op, &vals);
                let mine = enc(d, &vals[me]);
                // all_reduce, out of place and (odd cases) in place.
                let send = alloc(&comm, &mine, n * s);
                let inplace = case % 2 == 1;
                let recv = if inplace {
                    None
                } else {
                    Some(alloc(&comm, &[], n * s))
                };
                let rp = recv.as_ref().map_or(send.ptr, |b| b.ptr);
                // SAFETY: both buffers hold `n` elements of `d`.
                unsafe { call().all_reduce(send.ptr, rp, n, d, op) }.expect("all_reduce");
                comm.synchronize().expect("synchronize");
                let got = read(recv.as_ref().unwrap_or(&send));
                check(
                    format!("all_reduce {d:?} {op:?} n={n} inplace={inplace}"),
                    &got,
                    &want,
                    d,
                );
                // reduce to the last rank.
                let root = p - 1;
                let send = alloc(&comm, &mine, n * s);
                let recv = alloc(&comm, &[], n * s);
                // SAFETY: as above.
                unsafe { call().reduce(send.ptr, recv.ptr, n, d, op, root) }.expect("reduce");
                comm.synchronize().expect("synchronize");
                if me == root {
                    check(format!("reduce {d:?} {op:?} n={n}"), &read(&recv), &want, d);
                }
                // reduce_scatter: every rank gives p*n, gets its block of n.
                let vals: Vec<Vec<i64>> = (0..p)
                    .map(|r| values(seed ^ 0x55, r, case, n * p, d, op))
                    .collect();
                let want_all = reference(d, op, &vals);
                let send = alloc(&comm, &enc(d, &vals[me]), n * p * s);
                let recv = alloc(&comm, &[], n * s);
                // SAFETY: `send` holds p*n elements, `recv` n.
                unsafe { call().reduce_scatter(send.ptr, recv.ptr, n, d, op) }
                    .expect("reduce_scatter");
                comm.synchronize().expect("synchronize");
                check(
                    format!("reduce_scatter {d:?} {op:?} n={n}"),
                    &read(&recv),
                    &want_all[me * n * s..(me + 1) * n * s],
                    d,
                );
            }
        }
    }
    // The same all-reduce again and again (a persistent request made once and started for each
    // call on MPI 4), new data each time, in place on odd rounds, sizes around the persistent
    // limit (64 KiB) included.
    for (k, &n) in [3usize, 3, 16383, 16384, 16385, 3].iter().enumerate() {
        for (d, op) in [
            (DataType::F32, ReduceOp::SUM),
            (DataType::I64, ReduceOp::AVG),
        ] {
            case += 1;
            let s = d.size().unwrap();
            let vals: Vec<Vec<i64>> = (0..p).map(|r| values(seed, r, case, n, d, op)).collect();
            let want = reference(d, op, &vals);
            let send = alloc(&comm, &enc(d, &vals[me]), n * s);
            let recv = alloc(&comm, &[], n * s);
            let rp = if k % 2 == 1 { send.ptr } else { recv.ptr };
            // SAFETY: both buffers hold `n` elements of `d`.
            unsafe { call().all_reduce(send.ptr, rp, n, d, op) }.expect("all_reduce");
            comm.synchronize().expect("synchronize");
            let got = read(if k % 2 == 1 { &send } else { &recv });
            check(
                format!("all_reduce again {d:?} {op:?} n={n} round {k}"),
                &got,
                &want,
                d,
            );
        }
    }
    // Data movement: a few types (bytes are bytes), odd sizes.
    for d in [DataType::F16, DataType::I32, DataType::F64, DataType::U8] {
        let s = d.size().unwrap();
        for &n in &[1usize, 13, 4099] {
            case += 1;
            let vals: Vec<Vec<u8>> = (0..p)
                .map(|r| {
                    enc(
                        d,
                        &values(seed ^ 0xAA, r, case, n * p + 8 * p, d, ReduceOp::SUM),
                    )
                })
                .collect();
            let blk = n * s;
            // all_gather (in place on odd cases): rank r's first block.
            let want: Vec<u8> = (0..p).flat_map(|r| vals[r][..blk].to_vec()).collect();
            let recv = alloc(&comm, &[], blk * p);
            let inplace = case % 2 == 1;
            let send = if inplace {
                // `recv` has p blocks; this rank's block is filled before the call.
                write_at(&recv, me * blk, &vals[me][..blk]);
                None
            } else {
                Some(alloc(&comm, &vals[me][..blk], blk))
            };
            let sp = send.as_ref().map_or(at(&recv, me * blk), |b| b.ptr);
            // SAFETY: sizes as allocated.
            unsafe { call().all_gather(sp, recv.ptr, n, d) }.expect("all_gather");
            comm.synchronize().expect("synchronize");
            check(
                format!("all_gather {d:?} n={n} inplace={inplace}"),
                &read(&recv),
                &want,
                d,
            );
            // broadcast from rank 1 % p.
            let root = 1 % p;
            let send = alloc(&comm, &vals[me][..blk], blk);
            let recv = alloc(&comm, &[], blk);
            // SAFETY: sizes as allocated.
            unsafe { call().broadcast(send.ptr, recv.ptr, n, d, root) }.expect("broadcast");
            comm.synchronize().expect("synchronize");
            check(
                format!("broadcast {d:?} n={n}"),
                &read(&recv),
                &vals[root][..blk],
                d,
            );
            // gather to rank 0.
            let send = alloc(&comm, &vals[me][..blk], blk);
            let recv = alloc(&comm, &[], blk * p);
            // SAFETY: sizes as allocated.
            unsafe { call().gather(send.ptr, recv.ptr, n, d, 0) }.expect("gather");
            comm.synchronize().expect("synchronize");
            if me == 0 {
                check(format!("gather {d:?} n={n}"), &read(&recv), &want, d);
            }
            // scatter from the last rank: rank r gets block r of the root's p blocks.
            let root = p - 1;
            let send = alloc(&comm, &vals[me][..blk * p], blk * p);
            let recv = alloc(&comm, &[], blk);
            // SAFETY: sizes as allocated.
            unsafe { call().scatter(send.ptr, recv.ptr, n, d, root) }.expect("scatter");
            comm.synchronize().expect("synchronize");
            check(
                format!("scatter {d:?} n={n}"),
                &read(&recv),
                &vals[root][me * blk..(me + 1) * blk],
                d,
            );
            // all_to_all: block j of rank r goes to rank j.
            let send = alloc(&comm, &vals[me][..blk * p], blk * p);
            let recv = alloc(&comm, &[], blk * p);
            // SAFETY: sizes as allocated.
            unsafe { call().all_to_all(send.ptr, recv.ptr, n, d) }.expect("all_to_all");
            comm.synchronize().expect("synchronize");
            let want: Vec<u8> = (0..p)
                .flat_map(|r| vals[r][me * blk..(me + 1) * blk].to_vec())
                .collect();
            check(format!("all_to_all {d:?} n={n}"), &read(&recv), &want, d);
            // all_to_allv: rank r sends (r + j) % 3 + k elements to rank j, packed in order.
            let cnt = |r: usize, j: usize| (r + j) % 3 + n % 5;
            let displ = |r: usize, j: usize, to: bool| -> usize {
                (0..j).map(|x| if to { cnt(r, x) } else { cnt(x, r) }).sum()
            };
            let sc: Vec<usize> = (0..p).map(|j| cnt(me, j)).collect();
            let sd: Vec<usize> = (0..p).map(|j| displ(me, j, true)).collect();
            let rc: Vec<usize> = (0..p).map(|j| cnt(j, me)).collect();
            let rd: Vec<usize> = (0..p).map(|j| displ(me, j, false)).collect();
            let stot: usize = sc.iter().sum();
            let rtot: usize = rc.iter().sum();
            let send = alloc(&comm, &vals[me][..stot * s], stot * s);
            let recv = alloc(&comm, &[], rtot * s);
            // SAFETY: counts and displacements within the buffers.
            unsafe { call().all_to_allv(send.ptr, &sc, &sd, recv.ptr, &rc, &rd, d) }
                .expect("all_to_allv");
            comm.synchronize().expect("synchronize");
            let want: Vec<u8> = (0..p)
                .flat_map(|j| {
                    let off = displ(j, me, true) * s;
                    vals[j][off..off + cnt(j, me) * s].to_vec()
                })
                .collect();
            check(format!("all_to_allv {d:?} n={n}"), &read(&recv), &want, d);
            // A ring of grouped send/recv: send to the right, receive from the left.
            let right = (me + 1) % p;
            let left = (me + p - 1) % p;
            let send = alloc(&comm, &vals[me][..blk], blk);
            let recv = alloc(&comm, &[], blk);
            comm.group(|| {
                let c = call();
                // SAFETY: sizes as allocated.
                unsafe {
                    c.send(send.ptr, n, d, right)?;
                    c.recv(recv.ptr, n, d, left)
                }
            })
            .expect("grouped send/recv");
            comm.synchronize().expect("synchronize");
            check(
                format!("send/recv ring {d:?} n={n}"),
                &read(&recv),
                &vals[left][..blk],
                d,
            );
        }
    }
    let (lib, abi) = ferrocx_adaptor_mpi::loaded_library().expect("MPI is initialised");
    if fails.is_empty() {
        println!(
            "rank {me} of {p}: all cases match ({case} cases) with {} ({})",
            std::path::Path::new(&lib)
                .file_name()
                .unwrap()
                .to_string_lossy(),
            abi.name()
        );
    } else {
        for f in fails.iter().take(20) {
            println!("rank {me} MISMATCH {f}");
        }
        std::process::exit(1);
    }
}

/// World rank 0 stays out; world ranks 1..4 make a communicator of three straight through the
/// adaptor (the id names world rank 1 as the root; its random part comes from the seed).
fn rank_subset() {
    use ferrocx::registry::Registry;
    let world: usize = std::env::var("PMI_RANK").unwrap().parse().unwrap();
    let reg = Registry::with_builtins();
    let ccl = reg.ccl("mpi").and_then(|e| e.ccl()).expect("the mpi CCL");
    let dev = reg
        .device("host")
        .and_then(|e| e.device())
        .expect("the host device");
    dev.init(&[]).unwrap();
    ccl.init_with(&[]).unwrap();
    if world == 0 {
        std::thread::sleep(Duration::from_millis(500));
        println!("world rank 0: stayed out");
        return;
    }
    let mut uid = b"fxm1".to_vec();
    uid.extend_from_slice(&1u32.to_le_bytes());
    let mut rng = Rng(std::env::var(SEED).unwrap().parse().unwrap());
    for _ in 0..2 {
        uid.extend_from_slice(&rng.next().to_le_bytes());
    }
    let rank = world - 1;
    let comm = ccl
        .comm_init_rank(rank as i32, 3, 0, &uid, 10_000, &[])
        .expect("comm_init_rank over world ranks 1..4");
    let stream = dev.stream_create().unwrap();
    let n = 777;
    let vals: Vec<Vec<i64>> = (0..3)
        .map(|r| values(9, r, 1, n, DataType::I64, ReduceOp::SUM))
        .collect();
    let want = reference(DataType::I64, ReduceOp::SUM, &vals);
    let buf = dev.mem_alloc(n * 8, MemKind::DEVICE).unwrap();
    // SAFETY: `buf` is host memory of n * 8 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(
            enc(DataType::I64, &vals[rank]).as_ptr(),
            buf.0 as *mut u8,
            n * 8,
        )
    };
    // SAFETY: `buf` holds `n` i64, in place; synchronized before it is read.
    unsafe { ccl.all_reduce(buf, buf, n, DataType::I64, ReduceOp::SUM, comm, stream) }.unwrap();
    dev.stream_synchronize(stream).unwrap();
    // SAFETY: as above.
    let got = unsafe { std::slice::from_raw_parts(buf.0 as *const u8, n * 8) };
    assert_eq!(got, &want[..], "world rank {world}");
    ccl.comm_destroy(comm).unwrap();
    println!("world rank {world}: rank {rank} of 3, all_reduce matches");
}

/// A job across two clusters on MPI: all-reduce, all-gather and broadcast over the whole world.
fn rank_hetero() {
    let seed: u64 = std::env::var(SEED).unwrap().parse().unwrap();
    let comm = Communicator::from_env().expect("communicator");
    let (me, p) = (comm.rank(), comm.world());
    let kind = comm.hetero().expect("a job across clusters").kind();
    println!("rank {me}: bridge {kind}");
    assert_eq!(comm.ccl().name(), "mpi");
    let mut fails = Vec::new();
    for (case, (d, op, n)) in [
        (DataType::F32, ReduceOp::SUM, 1001usize),
        (DataType::I32, ReduceOp::MAX, 7),
        (DataType::F64, ReduceOp::MIN, 4099),
    ]
    .into_iter()
    .enumerate()
    {
        let s = d.size().unwrap();
        let vals: Vec<Vec<i64>> = (0..p).map(|r| values(seed, r, case, n, d, op)).collect();
        let want = reference(d, op, &vals);
        let send = alloc(&comm, &enc(d, &vals[me]), n * s);
        let recv = alloc(&comm, &[], n * s);
        // SAFETY: both buffers hold `n` elements of `d`.
        unsafe { comm.all_reduce(send.ptr, recv.ptr, n, d, op) }.expect("all_reduce");
        comm.synchronize().expect("synchronize");
        if read(&recv) != want {
            fails.push(format!("all_reduce {d:?} {op:?} n={n}"));
        }
        let blk = n * s;
        let mine = enc(d, &vals[me]);
        let send = alloc(&comm, &mine, blk);
        let recv = alloc(&comm, &[], blk * p);
        // SAFETY: `send` holds one block, `recv` p blocks.
        unsafe { comm.all_gather(send.ptr, recv.ptr, n, d) }.expect("all_gather");
        comm.synchronize().expect("synchronize");
        let want: Vec<u8> = (0..p).flat_map(|r| enc(d, &vals[r])).collect();
        if read(&recv) != want {
            fails.push(format!("all_gather {d:?} n={n}"));
        }
        let root = (case + 1) % p;
        let buf = alloc(&comm, &mine, blk);
        // SAFETY: `buf` holds one block, in place.
        unsafe { comm.broadcast(buf.ptr, buf.ptr, n, d, root) }.expect("broadcast");
        comm.synchronize().expect("synchronize");
        if read(&buf) != enc(d, &vals[root]) {
            fails.push(format!("broadcast {d:?} n={n} root={root}"));
        }
    }
    if fails.is_empty() {
        println!(
            "rank {me} of {p} (cluster {}): across clusters, all match",
            comm.cluster()
        );
    } else {
        println!("rank {me} MISMATCH {fails:?}");
        std::process::exit(1);
    }
}

fn rank_dead() {
    let comm = Communicator::from_env().expect("communicator");
    let me = comm.rank();
    let n = 1024;
    let buf = alloc(&comm, &vec![1u8; n * 4], n * 4);
    if me == 1 {
        // Dies without a word once the communicator exists.
        println!("rank 1 dies");
        let _ = std::io::stdout().flush();
        // SAFETY: ends this process at once, as a crash would.
        unsafe { libc::_exit(3) };
    }
    std::thread::sleep(Duration::from_millis(300));
    if std::env::var_os("FERROCX_MPI_TEST_IDLE_SURVIVOR").is_some() {
        // Nothing failed here: exit normally (MPI_Finalize at exit, whose wait for the dead
        // peer is bounded).
        println!("survivor: exiting");
        return;
    }
    let start = Instant::now();
    // SAFETY: `buf` holds `n` f32.
    let r = unsafe {
        comm.call()
            .via(Route::Ccl)
            .all_reduce(buf.ptr, buf.ptr, n, DataType::F32, ReduceOp::SUM)
    }
    .and_then(|_| comm.synchronize());
    let ms = start.elapsed().as_millis();
    match r {
        Ok(()) => println!("survivor: the all_reduce completed without its peer after {ms} ms"),
        Err(e) => println!("survivor: {e} after {ms} ms"),
    }
    let _ = std::io::stdout().flush();
    // SAFETY: ends this process without waiting for the dead peer (MPI_Finalize would).
    unsafe { libc::_exit(0) };
}
