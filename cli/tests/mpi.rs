//! The MPI CCL through the `ferrocx` binary: the conformance kit on its plugin (one rank through
//! the kit's driver; 2 and 3 ranks as the kit's workers started by `mpiexec`, which the driver
//! cannot do: its workers would each be an MPI world of one), and `ferrocx info` saying why it
//! is unavailable when no MPI library opens.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn ferrocx() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ferrocx"));
    c.env_remove("FERROCX_CONFIG");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `mpiexec` from `PATH` or `$FERROCX_VENV/bin`, else a failure saying how to get it.
fn mpiexec() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(v) = std::env::var_os("FERROCX_VENV") {
        dirs.insert(0, PathBuf::from(v).join("bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("mpiexec"))
        .find(|p| p.is_file() && p.parent().is_some_and(|d| d.join("mpichversion").is_file()))
        .expect(
            "the mpich wheel's mpiexec was not found on PATH or in $FERROCX_VENV/bin: run the \
             tests with `bash scripts/test.sh`, which installs it",
        )
}

#[test]
fn the_mpi_plugin_conforms_on_one_rank_through_the_driver() {
    mpiexec();
    let so = ferrocx_tests::mpi_plugin();
    let o = ferrocx()
        .args([
            "conformance",
            "--plugin",
            so.to_str().unwrap(),
            "--ranks",
            "1",
        ])
        .output()
        .unwrap();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("0 failed") && out.contains("CONFORMANT"),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.contains("all_reduce bf16 avg"))
        .unwrap_or_else(|| panic!("no all_reduce bf16 avg row:\n{out}"));
    assert!(row.contains(" pass"), "{row}");
}

fn unique_id() -> String {
    use std::io::Read;
    // The MPI CCL's id: "fxm1", the root's MPI world rank (0 under mpiexec), 16 random bytes.
    let mut id = b"fxm1\0\0\0\0".to_vec();
    let mut r = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut r))
        .unwrap();
    id.extend_from_slice(&r);
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn conformance_under_mpiexec(n: usize) {
    let so = ferrocx_tests::mpi_plugin();
    let ids = format!("{}:{}", unique_id(), unique_id());
    let worker = format!(
        "FERROCX_CONFORMANCE_RANK=$PMI_RANK exec '{}' conformance --worker --plugin '{}'",
        env!("CARGO_BIN_EXE_ferrocx"),
        so.display()
    );
    let o = Command::new(mpiexec())
        // The abort check leaves ranks that skip MPI_Finalize (a peer may still wait on them):
        // Hydra must not end the others when the first of them exits.
        .args([
            "-prepend-rank",
            "-disable-auto-cleanup",
            "-n",
            &n.to_string(),
        ])
        .args(["-genv", "FERROCX_CONFORMANCE_ROLE", "rank"])
        .args(["-genv", "FERROCX_CONFORMANCE_WORLD", &n.to_string()])
        .args(["-genv", "FERROCX_CONFORMANCE_UNIQUE_IDS", &ids])
        .args(["-genv", "FERROCX_CONFORMANCE_TIMEOUT_MS", "2000"])
        .args(["sh", "-c", &worker])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // The ranks the abort check leaves skip MPI_Finalize: MPICH's segment stays behind them.
    ferrocx_test_support::shm::sweep_unmapped_mpich_segments();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for r in 0..n {
        let mine: Vec<serde_json::Value> = out
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("[{r}] FERROCX_CONFORMANCE_CHECK ")))
            .map(|j| serde_json::from_str(j).unwrap())
            .collect();
        assert!(
            out.contains(&format!("[{r}] FERROCX_CONFORMANCE_END")),
            "rank {r} did not finish:\n{out}"
        );
        let failed: Vec<&serde_json::Value> =
            mine.iter().filter(|c| c["outcome"] == "fail").collect();
        assert!(failed.is_empty(), "rank {r}: {failed:#?}");
        for name in [
            "all_reduce f32 sum",
            "all_reduce bf16 avg",
            "reduce_scatter f32 sum",
            "all_to_allv i64",
            "grouped send/recv ring f32",
            "comm_abort unblocks the peers of an aborted rank",
        ] {
            let c = mine
                .iter()
                .find(|c| c["name"] == name)
                .unwrap_or_else(|| panic!("rank {r} has no check {name:?}:\n{out}"));
            assert_eq!(c["outcome"], "pass", "rank {r} {name}: {c}");
        }
    }
}

#[test]
fn the_mpi_plugin_conforms_on_two_ranks_under_mpiexec() {
    conformance_under_mpiexec(2);
}

#[test]
fn the_mpi_plugin_conforms_on_three_ranks_under_mpiexec() {
    conformance_under_mpiexec(3);
}

#[test]
fn info_says_why_mpi_is_unavailable() {
    let o = ferrocx()
        .arg("info")
        .env("FERROCX_MPI_LIBRARY", "/nonexistent/libmpi_abi.so.1")
        .output()
        .unwrap();
    let out = text(&o);
    let at = out
        .find("  mpi  [built-in]")
        .unwrap_or_else(|| panic!("{out}"));
    let block = &out[at..];
    let line = block
        .lines()
        .find(|l| l.contains("ccl: unavailable"))
        .unwrap_or_else(|| panic!("mpi not shown unavailable:\n{out}"));
    assert!(
        line.contains("/nonexistent/libmpi_abi.so.1")
            && line.contains("No such file")
            && line.contains("pip install mpich"),
        "{line}"
    );
}
