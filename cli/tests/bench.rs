//! `ferrocx bench` as a user runs it: ranks started through `ferrocx launch` on the host
//! backend, the nccl-tests table and its arithmetic, JSON for every op, the SVG plot, a wrong
//! result making the exit code 1, and argument errors caught before anything is launched.

use std::path::PathBuf;
use std::process::{Command, Output};

fn config() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs/local.toml")
}

fn bench(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrocx"));
    cmd.arg("bench")
        .arg("--config")
        .arg(config())
        .args(args)
        .env_remove("FERROCX_CONFIG")
        .env_remove("FERROCX_LOG")
        .env_remove("FERROCX_BENCH_PROGRESS")
        .env_remove("FERROCX_BENCH_INJECT_FAULT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run ferrocx bench")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The table's rows: every line that is not a comment, split into its 13 columns.
fn rows(stdout: &str) -> Vec<Vec<String>> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .inspect(|f| assert_eq!(f.len(), 13, "a row has 13 columns: {f:?}"))
        .collect()
}

fn num(s: &str) -> f64 {
    s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

#[test]
fn all_reduce_on_two_ranks_prints_a_checked_row_per_size_with_nccl_tests_bandwidths() {
    let out = bench(
        &[
            "-n",
            "2",
            "--op",
            "all_reduce",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "4",
            "--iters",
            "3",
            "--warmup",
            "1",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    // The launcher's rank prefix is gone from rank 0's report.
    assert!(
        stdout.starts_with("# ferrocx bench: all_reduce\n"),
        "{stdout}"
    );
    assert!(stdout.contains("ranks: 2"), "{stdout}");
    assert!(
        stdout.contains("device adaptor: host") && stdout.contains("ccl adaptor: host"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
        ),
        "{stdout}"
    );
    let rows = rows(&stdout);
    let sizes: Vec<u64> = rows.iter().map(|r| num(&r[0]) as u64).collect();
    // 8 × 4^k up to 64K.
    assert_eq!(sizes, [8, 32, 128, 512, 2048, 8192, 32768]);
    let n = 2.0;
    for r in &rows {
        let size = num(&r[0]);
        assert_eq!(num(&r[1]), size / 4.0, "count of f32 elements: {r:?}");
        assert_eq!(
            (r[2].as_str(), r[3].as_str(), r[4].as_str()),
            ("f32", "sum", "-1")
        );
        for g in [5, 9] {
            let (time, alg, bus) = (num(&r[g]), num(&r[g + 1]), num(&r[g + 2]));
            assert!(time > 0.0, "{r:?}");
            assert_eq!(r[g + 3], "0", "#wrong: {r:?}");
            // algbw = size / time (GB/s), busbw = algbw × 2(n-1)/n, to the table's 2 decimals.
            assert!(
                (alg - size / time / 1e3).abs() <= 0.006 + 1e-3 * alg,
                "algbw: {r:?}"
            );
            assert!(
                (bus - alg * 2.0 * (n - 1.0) / n).abs() <= 0.011,
                "busbw: {r:?}"
            );
        }
    }
    assert!(stdout.contains("# Avg bus bandwidth : "), "{stdout}");
}

#[test]
fn every_op_on_three_ranks_gives_json_with_no_wrong_element() {
    let out = bench(
        &[
            "--op", "all", "-n", "3", "-b", "4", "-e", "4K", "--json", "--iters", "2", "--warmup",
            "1",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let doc: serde_json::Value =
        serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(doc["ranks"], 3);
    assert_eq!(doc["adaptors"]["device"], "host");
    assert_eq!(doc["adaptors"]["ccl"], "host");
    assert_eq!(doc["dtype"], "f32");
    let results = doc["results"].as_array().expect("results");
    let ops: Vec<&str> = results.iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(
        ops,
        [
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "broadcast",
            "reduce",
            "all_to_all"
        ]
    );
    for r in results {
        let rows = r["rows"].as_array().expect("rows");
        // 4, 8, ..., 4096; the ops that split a buffer among the 3 ranks skip 4 and 8, which
        // hold no element per rank.
        let split =
            ["all_gather", "reduce_scatter", "all_to_all"].contains(&r["op"].as_str().unwrap());
        assert_eq!(rows.len(), if split { 9 } else { 11 }, "{r}");
        for row in rows {
            for g in ["out_of_place", "in_place"] {
                assert_eq!(row[g]["wrong"], 0, "{} {row}", r["op"]);
                assert!(row[g]["time_us"].as_f64().unwrap() > 0.0, "{row}");
            }
        }
        // all_gather's size is its output: whole blocks of 3 ranks.
        if r["op"] == "all_gather" {
            let last = rows.last().unwrap();
            assert_eq!(last["count"], 341, "{last}");
            assert_eq!(last["size"], 341 * 3 * 4, "{last}");
        }
    }
    assert_eq!(doc["wrong"], 0);
}

#[test]
fn plot_writes_an_svg_with_the_op() {
    let dir = tempfile::tempdir().expect("temp dir");
    let svg = dir.path().join("bench.svg");
    let out = bench(
        &[
            "-n",
            "2",
            "--op",
            "all_gather",
            "-b",
            "64",
            "-e",
            "16K",
            "-f",
            "4",
            "--iters",
            "2",
            "--warmup",
            "0",
            "--plot",
            svg.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let s = std::fs::read_to_string(&svg).expect("the plot was written");
    assert!(s.starts_with("<svg"), "{s}");
    assert!(s.contains("all_gather"), "{s}");
    assert!(s.contains("busbw (GB/s)") && s.contains("time (µs"), "{s}");
    assert!(s.trim_end().ends_with("</svg>"));
}

#[test]
fn a_wrong_result_is_reported_and_makes_the_exit_code_1() {
    // Rank 1 spoils one element of every checked output, as a faulty CCL would.
    let out = bench(
        &[
            "-n",
            "2",
            "--op",
            "all_reduce",
            "-b",
            "64",
            "-e",
            "256",
            "--iters",
            "1",
            "--warmup",
            "0",
        ],
        &[("FERROCX_BENCH_INJECT_FAULT", "1")],
    );
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let rows = rows(&stdout);
    assert_eq!(rows.len(), 3, "{stdout}");
    for r in &rows {
        assert_eq!((r[8].as_str(), r[12].as_str()), ("1", "1"), "{r:?}");
    }
    assert!(
        stdout.contains("# Out of bounds values : 6 FAILED"),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains("6 wrong element(s)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_arguments_exit_2_naming_them_before_anything_is_launched() {
    let cases: [(&[&str], &str); 6] = [
        (
            &[
                "-n",
                "2",
                "--op",
                "all_gather",
                "--algo",
                "window-copies",
                "--graph",
            ],
            "--algo window-copies cannot run under --graph",
        ),
        (&["-n", "2", "-b", "1Q"], "1Q"),
        (
            &["-n", "2", "-b", "1M", "-e", "64K"],
            "-b 1M is larger than -e 64K",
        ),
        (&["-n", "2", "--op", "all_sum"], "all_sum"),
        (&["-n", "2", "--dtype", "f128"], "f128"),
        (&["-n", "2", "--op", "broadcast", "--root", "2"], "--root 2"),
    ];
    for (args, needle) in cases {
        let out = bench(args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        // Nothing ran: no rank printed anything.
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        assert!(!stderr.contains("[0]"), "{args:?}: {stderr}");
    }
}

#[test]
fn graph_and_direct_are_refused_on_the_host_backend_before_anything_is_launched() {
    let cases: [(&[&str], &[&str]); 5] = [
        (
            &["-n", "2", "--graph"],
            &["--graph", "graph group", "\"host\"", "run without --graph"],
        ),
        // NCCL's symmetric windows only make sense next to NCCL called directly.
        (
            &["-n", "2", "--direct-symmetric"],
            &["--direct-symmetric", "--direct"],
        ),
        (
            &["-n", "2", "--direct", "--direct-symmetric"],
            &["--direct", "CCL adaptor \"host\"", "not \"nccl\""],
        ),
        (
            &["-n", "2", "--direct"],
            &[
                "--direct",
                "CCL adaptor \"host\"",
                "not \"nccl\"",
                "configs/nccl.toml",
            ],
        ),
        (
            &["-n", "2", "--direct", "--repeats", "3", "--graph"],
            &["--graph"],
        ),
    ];
    for (args, needles) in cases {
        let out = bench(args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {needle:?} in {stderr}");
        }
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        assert!(!stderr.contains("[0]"), "{args:?}: {stderr}");
    }
    // A rank started without the front-end (one process, no -n) refuses the same way.
    let out = bench(&["--graph"], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("graph group"), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

#[test]
fn repeats_report_the_median_and_say_so() {
    let out = bench(
        &[
            "-n",
            "2",
            "-b",
            "64",
            "-e",
            "256",
            "--iters",
            "2",
            "--warmup",
            "0",
            "--repeats",
            "3",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("#  timing: back-to-back, host clock around enqueue and synchronize; median of 3 run(s) per size"),
        "{stdout}"
    );
    assert_eq!(rows(&stdout).len(), 3, "{stdout}");
    let out = bench(
        &["-n", "1", "-b", "8", "-e", "8", "--repeats", "2", "--json"],
        &[],
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["repeats"], 2);
    assert_eq!(doc["mode"], "back-to-back");
    assert_eq!(doc["direct"], serde_json::Value::Null);
    assert_eq!(doc["results"][0]["rows"][0]["in_place"]["wrong"], 0);
}

#[test]
fn all_gather_p2p_on_three_ranks_checks_every_size_in_both_placements() {
    // The router's route (the host CCL's send/recv), then the copies out of the peers'
    // windows, forced.
    for algo in ["p2p", "window-copies"] {
        let out = bench(
            &[
                "-n",
                "3",
                "--op",
                "all_gather",
                "--algo",
                algo,
                "--streams",
                "2",
                "-b",
                "12",
                "-e",
                "300K",
                "-f",
                "7",
                "--iters",
                "3",
                "--warmup",
                "1",
                "--check-iters",
                "2",
            ],
            &[],
        );
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "{algo}: {stdout}\n{}",
            text(&out.stderr)
        );
        let rows = rows(&stdout);
        assert_eq!(rows.len(), 6, "{algo}: {stdout}");
        for r in &rows {
            assert_eq!((r[8].as_str(), r[12].as_str()), ("0", "0"), "{algo}: {r:?}");
        }
        assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    }
}

/// The table's rows (not comments, not blank), split into fields.
fn data_rows(stdout: &str) -> Vec<Vec<&str>> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// `bench --op all_gather --overlap` on 2 ranks by `--algo algo` with `pieces` pieces, sizes
/// `-b lo -e hi -f 4`, 2 timed iterations after 1 warm-up, a 24 x 9 matmul, and `extra`.
fn overlap(algo: &str, pieces: &str, (lo, hi): (&str, &str), extra: &[&str]) -> Output {
    let mut args = vec![
        "-n",
        "2",
        "--op",
        "all_gather",
        "--overlap",
        "--algo",
        algo,
        "-b",
        lo,
        "-e",
        hi,
        "-f",
        "4",
        "--iters",
        "2",
        "--warmup",
        "1",
        "--matmul-k",
        "24",
        "--matmul-n",
        "9",
        "--pieces",
        pieces,
    ];
    args.extend_from_slice(extra);
    bench(&args, &[])
}

#[test]
fn overlap_prints_the_ratio_per_size_with_the_pipelined_output_checked() {
    // Pieces: each peer's slice in 3 (uneven) pieces, each with its own matmul.
    for (algo, pieces) in [
        ("ccl", "1"),
        ("p2p", "1"),
        ("window-copies", "1"),
        ("window-copies", "3"),
    ] {
        let out = overlap(algo, pieces, ("1K", "40K"), &["--streams", "3"]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        assert!(
            stdout.contains(&format!(
                "all_gather (--algo {algo}, 3 stream(s), {pieces} piece(s) a slice) + matmul"
            )),
            "{stdout}"
        );
        // The router leaves the host device to its CCL's send/recv; the algo forces the copies.
        let route = match algo {
            "window-copies" => "window-copies",
            _ => "ccl",
        };
        assert!(
            stdout.contains(&format!("# pipelined all_gather_p2p route: {route}\n")),
            "{stdout}"
        );
        // 1K, 4K, 16K: rows of 24 f32 per rank on 2 ranks (192 bytes each).
        let rows = data_rows(&stdout);
        assert_eq!(rows.len(), 3, "{stdout}");
        for (r, size) in rows.iter().zip([1024usize, 4096, 16384]) {
            assert_eq!(r.len(), 7, "{r:?}");
            let m = size / 192;
            assert_eq!(
                (num(r[0]) as usize, num(r[1]) as usize),
                (m * 192, m),
                "{r:?}"
            );
            let (g, mm, p, ratio) = (num(r[2]), num(r[3]), num(r[4]), num(r[5]));
            assert!(g > 0.0 && mm > 0.0 && p > 0.0, "{r:?}");
            assert!((ratio - (g + mm) / p).abs() < 0.01 + ratio * 0.01, "{r:?}");
            assert_eq!(r[6], "0", "{r:?}");
        }
    }
}

#[test]
fn overlap_timeline_marks_every_slice_and_piece_and_own_rows_from_the_input_stay_right() {
    // Own rows multiplied from the input; a timeline of each size's extra run: one line per
    // slice (or piece) with its arrival and the end of its matmul, then the end.
    for (algo, pieces, marks) in [("p2p", "1", 2), ("window-copies", "3", 4)] {
        let out = overlap(
            algo,
            pieces,
            ("4K", "16K"),
            &["--own-rows", "input", "--timeline"],
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        let rows = data_rows(&stdout);
        assert_eq!(rows.len(), 2, "{stdout}");
        assert!(rows.iter().all(|r| r[6] == "0"), "{stdout}");
        let from: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("#   from rank"))
            .collect();
        assert_eq!(from.len(), 2 * marks, "{stdout}");
        assert_eq!(
            stdout.lines().filter(|l| l.starts_with("#   end")).count(),
            2,
            "{stdout}"
        );
        for line in from {
            let w: Vec<&str> = line.split_whitespace().collect();
            // "#   from rank R rows A..B arrived T us matmul done T us"
            let (arrived, done) = (num(w[7]), num(w[11]));
            assert!(arrived >= 0.0 && done >= 0.0, "{line}");
        }
    }
}

#[test]
fn p2p_and_overlap_arguments_are_checked_before_anything_is_launched() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["-n", "2", "--op", "all_reduce", "--algo", "p2p"],
            "--algo p2p runs all_gather only, not --op all_reduce",
        ),
        (
            &["-n", "2", "--op", "all", "--algo", "window-copies"],
            "--algo window-copies runs all_gather only, not --op all",
        ),
        (
            &["-n", "2", "--op", "broadcast", "--overlap"],
            "--overlap times all_gather with a matmul, not --op broadcast",
        ),
        (
            &[
                "-n",
                "2",
                "--op",
                "all_gather",
                "--overlap",
                "--dtype",
                "f64",
            ],
            "--overlap multiplies f32",
        ),
        (
            &["-n", "2", "--op", "all_gather", "--streams", "0"],
            "--streams",
        ),
        (
            &["-n", "2", "--op", "all_gather", "--timeline"],
            "--timeline and --own-rows belong to --overlap",
        ),
    ];
    for (args, needle) in cases {
        let out = bench(args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
}
