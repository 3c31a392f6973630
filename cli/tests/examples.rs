//! The examples as a user runs them: `ferrocx launch -n N -- examples/all_reduce` on the host
//! backend, every rank's results checked by the example itself.

use std::path::PathBuf;
use std::process::Command;

/// An example built beside the `ferrocx` binary: `cargo test` builds the package's examples,
/// and a run of this test alone (`--test examples`) builds it here.
fn example(name: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ferrocx"));
    let path = bin
        .parent()
        .expect("target dir")
        .join("examples")
        .join(name);
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "ferrocx-cli", "--example", name])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo");
        assert!(status.success(), "cargo build --example {name}: {status}");
    }
    path
}

#[test]
fn the_all_reduce_example_runs_every_route_and_the_ring_on_3_ranks() {
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs/local.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocx"))
        .args(["launch", "-n", "3", "--"])
        .arg(example("all_reduce"))
        .env("FERROCX_CONFIG", &config)
        .env_remove("FERROCX_LOG")
        .output()
        .expect("run ferrocx launch");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for count in [1, 1000, 100_003, 1 << 20] {
        assert!(
            stdout.contains(&format!(
                "all_reduce of {count} f32 on 3 ranks: correct (route: "
            )),
            "{stdout}"
        );
    }
    // The host CCL is faster than the window algorithms at every size on the host device.
    assert_eq!(stdout.matches("(route: ccl)").count(), 4, "{stdout}");
    for (rank, left) in [(0, 2), (1, 0), (2, 1)] {
        assert!(
            stdout.contains(&format!(
                "[{rank}] rank {rank}: token {} from rank {left}",
                left * 1000
            )),
            "{stdout}"
        );
    }
}

/// The pipelined all-gather + matmul on 1, 3 and 4 ranks (odd shapes, 1 to 3 streams), on the
/// router's route (the host CCL's send/recv) and forced onto the window copies, in pieces, and
/// with X_full in a window (gathered in place, the copies pushing into it): the example checks
/// both ways against its reference on every rank and fails otherwise.
#[test]
fn the_allgather_matmul_example_checks_both_ways() {
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs/local.toml");
    for (ranks, streams, route, more) in [
        ("1", "2", "auto", &[][..]),
        ("3", "2", "auto", &[]),
        ("4", "3", "auto", &[]),
        ("3", "1", "auto", &[]),
        ("1", "2", "window-copies", &[]),
        ("3", "2", "window-copies", &[]),
        ("4", "3", "window-copies", &[]),
        ("3", "2", "window-copies", &["--pieces", "4"]),
        ("2", "2", "auto", &["--in-window"]),
        ("3", "2", "window-copies", &["--in-window", "--pieces", "3"]),
        ("4", "1", "window-copies", &["--in-window"]),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ferrocx"))
            .args(["launch", "-n", ranks, "--"])
            .arg(example("allgather_matmul"))
            .args(["--m", "17", "--k", "33", "--n", "29", "--iters", "1"])
            .args(["--streams", streams, "--route", route])
            .args(more)
            .env("FERROCX_CONFIG", &config)
            .env_remove("FERROCX_LOG")
            .output()
            .expect("run ferrocx launch");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let world: usize = ranks.parse().unwrap();
        for rank in 0..world {
            assert!(
                stdout.contains(&format!("[{rank}] rank {rank}: both ways correct")),
                "{stdout}"
            );
        }
        let took = match route {
            "auto" => "ccl",
            forced => forced,
        };
        assert!(
            stdout.contains(&format!(
                "pipelined all_gather_p2p (route {took}) + per-slice matmul: correct"
            )),
            "{stdout}"
        );
        assert!(
            stdout.contains("plain all_gather + matmul: correct"),
            "{stdout}"
        );
    }
    // A bad option is named.
    for (args, needle) in [
        (&["--m", "0"][..], "--m: expected a positive integer, not 0"),
        (
            &["--route", "nvlink"][..],
            "--route: expected auto, ccl, window-copies or window-reads, not nvlink",
        ),
    ] {
        let out = Command::new(example("allgather_matmul"))
            .args(args)
            .output()
            .expect("run the example");
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(needle),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `ferrocx bench` on a job across two clusters (1 + 3 ranks, host adaptors in both) runs
/// unchanged: every op's results checked, through the cross-cluster plans (the bench's forced
/// CCL route does not cut a cluster off from the others).
#[test]
fn the_bench_runs_across_two_clusters_with_every_result_right() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("two-clusters.toml");
    std::fs::write(
        &config,
        "[runtime]\ntimeout_ms = 30000\n\n\
         [[cluster]]\nname = \"one\"\nranks = \"0\"\ndevice = \"host\"\nccl = \"host\"\n\n\
         [[cluster]]\nname = \"three\"\nranks = \"1-3\"\ndevice = \"host\"\nccl = \"host\"\n\n\
         [bridge]\nchunk_bytes = 4096\n",
    )
    .expect("write the config");
    let out = Command::new(env!("CARGO_BIN_EXE_ferrocx"))
        .arg("bench")
        .arg("--config")
        .arg(&config)
        .args([
            "-n", "4", "--op", "all", "-b", "64", "-e", "64K", "-f", "32", "--iters", "2",
        ])
        .args(["--warmup", "1"])
        .env_remove("FERROCX_LOG")
        .output()
        .expect("run ferrocx bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.matches("Out of bounds values : 0 OK").count(),
        6,
        "{stdout}"
    );
}
