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
