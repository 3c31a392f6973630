//! The report: results as data, printed as an nccl-tests table or as JSON.

use std::fmt::Write;

use serde_json::{json, Value};

use super::ops::Op;

/// One placement's (out-of-place or in-place) measurement at one size, over all ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Group {
    /// Time per operation in microseconds: for each timed run the slowest rank's average, then
    /// the median over the runs (`--repeats`).
    pub time_us: f64,
    /// Wrong elements over all ranks; `None` when not checked.
    pub wrong: Option<u64>,
    /// The same measurement through NCCL called directly (`--direct`), timed interleaved with
    /// this one.
    pub direct: Option<Direct>,
}

/// The `--direct` reference of one placement at one size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Direct {
    /// Time per operation in microseconds, as [`Group::time_us`].
    pub time_us: f64,
    /// Wrong elements over all ranks; `None` when not checked.
    pub wrong: Option<u64>,
}

impl Group {
    /// A placement the CCL adaptor does not support (e.g. an in-place all-to-all on NCCL): no
    /// time (NaN), nothing checked, and the same for the direct reference when there is one.
    pub fn not_supported(direct: bool) -> Group {
        Group {
            time_us: f64::NAN,
            wrong: None,
            direct: direct.then_some(Direct {
                time_us: f64::NAN,
                wrong: None,
            }),
        }
    }

    /// Whether the placement ran (see [`Group::not_supported`]).
    pub fn ran(&self) -> bool {
        self.time_us.is_finite()
    }

    /// ferrocx's bus bandwidth over the direct reference's (= direct time / ferrocx time).
    pub fn busbw_ratio(&self) -> Option<f64> {
        self.direct
            .filter(|_| self.time_us > 0.0)
            .map(|d| d.time_us / self.time_us)
    }

    /// Microseconds ferrocx adds to each operation over the direct reference (negative when
    /// it is faster).
    pub fn added_latency_us(&self) -> Option<f64> {
        self.direct
            .filter(|_| self.ran())
            .map(|d| self.time_us - d.time_us)
    }
}

/// One size of one op.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Bytes of the largest buffer.
    pub size: usize,
    /// The count passed to the CCL.
    pub count: usize,
    /// Out-of-place.
    pub out_of_place: Group,
    /// In-place.
    pub in_place: Group,
}

/// Every size of one op.
#[derive(Clone, Debug)]
pub struct OpResult {
    /// The op.
    pub op: Op,
    /// busbw / algbw at this job's size.
    pub bus_factor: f64,
    /// One row per size.
    pub rows: Vec<Row>,
}

/// One rank's process and device, for the header.
#[derive(Clone, Debug)]
pub struct RankDevice {
    /// Rank.
    pub rank: usize,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// Device index.
    pub device: i32,
    /// Vendor and model, as the device adaptor says.
    pub name: String,
}

/// What the header says about the run.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The configuration file, or where the configuration came from.
    pub config: String,
    /// This job's cluster.
    pub cluster: String,
    /// Ranks.
    pub ranks: usize,
    /// Device adaptor name.
    pub device: String,
    /// CCL adaptor name.
    pub ccl: String,
    /// The CCL's version, where it says.
    pub ccl_version: Option<i32>,
    /// Per rank.
    pub devices: Vec<RankDevice>,
    /// `--op` as given (`all` or an op).
    pub op: String,
    /// Element type name.
    pub dtype: String,
    /// Reduction op name.
    pub redop: String,
    /// Root of rooted ops.
    pub root: usize,
    /// `-b`.
    pub min_bytes: u64,
    /// `-e`.
    pub max_bytes: u64,
    /// `-f`.
    pub step_factor: u64,
    /// Untimed iterations.
    pub warmup: u32,
    /// Timed iterations.
    pub iters: u32,
    /// Checked runs.
    pub check_iters: u32,
    /// `--graph`: the timed operations of each run are one graph launch.
    pub graph: bool,
    /// Timed runs per size and placement (the median is reported).
    pub repeats: u32,
    /// `--direct`: the libnccl called directly, and its version (`None` without `--direct`).
    pub direct: Option<String>,
}

/// Sizes from which the bus-bandwidth ratio is summarised (1 MiB).
pub const RATIO_FROM_BYTES: usize = 1 << 20;

/// GB/s (1e9 B/s) of `bytes` in `us` microseconds.
pub fn gbps(bytes: usize, us: f64) -> f64 {
    if us > 0.0 {
        bytes as f64 / us / 1e3
    } else {
        0.0
    }
}

impl Row {
    /// (algbw, busbw) of a group.
    pub fn bandwidth(&self, g: &Group, bus_factor: f64) -> (f64, f64) {
        let alg = gbps(self.size, g.time_us);
        (alg, alg * bus_factor)
    }
}

impl OpResult {
    /// Mean busbw over rows and both placements (nccl-tests' "Avg bus bandwidth").
    pub fn avg_busbw(&self) -> f64 {
        let mut sum = 0.0;
        let mut n = 0usize;
        for r in &self.rows {
            for g in [&r.out_of_place, &r.in_place]
                .into_iter()
                .filter(|g| g.ran())
            {
                sum += r.bandwidth(g, self.bus_factor).1;
                n += 1;
            }
        }
        if n == 0 {
            0.0
        } else {
            sum / n as f64
        }
    }

    /// Wrong elements over all rows and placements.
    pub fn wrong(&self) -> u64 {
        self.rows
            .iter()
            .flat_map(|r| [r.out_of_place.wrong, r.in_place.wrong])
            .flatten()
            .sum()
    }

    /// Wrong elements of the direct reference over all rows and placements.
    pub fn direct_wrong(&self) -> u64 {
        self.rows
            .iter()
            .flat_map(|r| [&r.out_of_place, &r.in_place])
            .filter_map(|g| g.direct.and_then(|d| d.wrong))
            .sum()
    }

    /// Whether the rows carry the direct reference.
    pub fn has_direct(&self) -> bool {
        self.rows.iter().any(|r| r.out_of_place.direct.is_some())
    }

    /// Mean busbw of the direct reference over rows and both placements.
    pub fn avg_direct_busbw(&self) -> f64 {
        let bws: Vec<f64> = self
            .rows
            .iter()
            .flat_map(|r| [&r.out_of_place, &r.in_place].map(|g| (r, g)))
            .filter(|(_, g)| g.ran())
            .filter_map(|(r, g)| g.direct.map(|d| gbps(r.size, d.time_us) * self.bus_factor))
            .collect();
        if bws.is_empty() {
            0.0
        } else {
            bws.iter().sum::<f64>() / bws.len() as f64
        }
    }

    /// The lowest ferrocx/direct busbw ratio over the sizes of at least
    /// [`RATIO_FROM_BYTES`], with its size and placement.
    pub fn min_ratio_from_1m(&self) -> Option<(f64, usize, &'static str)> {
        self.rows
            .iter()
            .filter(|r| r.size >= RATIO_FROM_BYTES)
            .flat_map(|r| {
                [(&r.out_of_place, "out-of-place"), (&r.in_place, "in-place")]
                    .map(|(g, place)| g.busbw_ratio().map(|q| (q, r.size, place)))
            })
            .flatten()
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }

    fn redop<'a>(&self, setup: &'a Setup) -> &'a str {
        if self.op.reduces() {
            &setup.redop
        } else {
            "none"
        }
    }

    fn root(&self, setup: &Setup) -> i64 {
        if self.op.rooted() {
            setup.root as i64
        } else {
            -1
        }
    }
}

/// The header printed once, before the first op.
pub fn header(s: &Setup) -> String {
    let mut o = String::new();
    let version = s.ccl_version.map(|v| format!(" {v}")).unwrap_or_default();
    let _ = writeln!(o, "# ferrocx bench: {}", s.op);
    let _ = writeln!(
        o,
        "#  config: {}  cluster: {}  ranks: {}",
        s.config, s.cluster, s.ranks
    );
    let _ = writeln!(
        o,
        "#  device adaptor: {}  ccl adaptor: {}{version}",
        s.device, s.ccl
    );
    let _ = writeln!(
        o,
        "#  dtype: {}  redop: {}  root: {}  minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} check iters: {}",
        s.dtype, s.redop, s.root, s.min_bytes, s.max_bytes, s.step_factor, s.warmup, s.iters, s.check_iters
    );
    let mode = if s.graph {
        "graph launches (iters captured into one graph, after an eager warm-up)"
    } else {
        "back-to-back"
    };
    let _ = writeln!(
        o,
        "#  timing: {mode}, host clock around enqueue and synchronize; median of {} run(s) per size",
        s.repeats
    );
    if let Some(lib) = &s.direct {
        let _ = writeln!(
            o,
            "#  direct: {lib}, its own communicator, same buffers and stream, runs interleaved with ferrocx's"
        );
    }
    let _ = writeln!(o, "#");
    let _ = writeln!(o, "# Using devices");
    for d in &s.devices {
        let _ = writeln!(
            o,
            "#  Rank {:2} Pid {:6} on {:>10} device {:2} [{}]",
            d.rank, d.pid, d.host, d.device, d.name
        );
    }
    o
}

/// Width of the columns before the groups (size to root).
const PREFIX_WIDTH: usize = 52;
/// Width of one group's ferrocx columns (time, algbw, busbw, #wrong).
const GROUP_WIDTH: usize = 32;
/// Width of one group's direct columns (time, ratio, added latency, #wrong).
const DIRECT_WIDTH: usize = 33;

/// `text` centred in `width` columns starting at `start` of `line` (which grows as needed).
fn centre(line: &mut Vec<u8>, start: usize, width: usize, text: &str) {
    let at = start + width.saturating_sub(text.len()) / 2;
    if line.len() < at + text.len() {
        line.resize(at + text.len(), b' ');
    }
    line[at..at + text.len()].copy_from_slice(text.as_bytes());
}

/// The column headers of one op's table; `direct` adds the reference's columns to each group.
pub fn table_head(op: Op, direct: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "#");
    let _ = writeln!(o, "# {}", op.name());
    if !direct {
        // Each group's name centred over its four columns.
        let _ = writeln!(o, "#{:>73}{:>30}", "out-of-place", "in-place");
        let _ = writeln!(
            o,
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
        );
        let _ = writeln!(
            o,
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"
        );
        return o;
    }
    let group = GROUP_WIDTH + DIRECT_WIDTH;
    let mut places = vec![b'#'];
    let mut paths = vec![b'#'];
    for (k, place) in ["out-of-place", "in-place"].iter().enumerate() {
        let start = PREFIX_WIDTH + k * group;
        centre(&mut places, start, group, place);
        centre(&mut paths, start, GROUP_WIDTH, "ferrocx");
        centre(&mut paths, start + GROUP_WIDTH, DIRECT_WIDTH, "nccl direct");
    }
    let _ = writeln!(o, "{}", String::from_utf8_lossy(&places));
    let _ = writeln!(o, "{}", String::from_utf8_lossy(&paths));
    let mut names = String::from("#       size         count      type   redop    root");
    let mut units = format!("{:<PREFIX_WIDTH$}", "#        (B)    (elements)");
    for _ in 0..2 {
        let _ = write!(
            names,
            "{:>9}{:>8}{:>8}{:>7}{:>9}{:>8}{:>9}{:>7}",
            "time", "algbw", "busbw", "#wrong", "time", "ratio", "+lat", "#wrong"
        );
        let _ = write!(
            units,
            "{:>9}{:>8}{:>8}{:>7}{:>9}{:>8}{:>9}{:>7}",
            "(us)", "(GB/s)", "(GB/s)", "", "(us)", "", "(us)", ""
        );
    }
    let _ = writeln!(o, "{names}");
    let _ = writeln!(o, "{}", units.trim_end());
    o
}

/// Time in nccl-tests' widths: fewer decimals as it grows.
fn show_time(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// One row of the table (no newline).
pub fn row_line(s: &Setup, r: &OpResult, row: &Row) -> String {
    let mut o = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
        row.size,
        row.count,
        s.dtype,
        r.redop(s),
        r.root(s)
    );
    for g in [&row.out_of_place, &row.in_place] {
        if !g.ran() {
            // Not supported by the adaptor: every column of the group (and of its direct
            // reference) says so.
            let _ = write!(
                o,
                "  {:>7}  {:>6}  {:>6}  {:>5}",
                "N/A", "N/A", "N/A", "N/A"
            );
            if g.direct.is_some() {
                let _ = write!(
                    o,
                    "  {:>7}  {:>6}  {:>7}  {:>5}",
                    "N/A", "N/A", "N/A", "N/A"
                );
            }
            continue;
        }
        let (alg, bus) = row.bandwidth(g, r.bus_factor);
        let _ = write!(
            o,
            "  {}  {alg:6.2}  {bus:6.2}  {:>5}",
            show_time(g.time_us),
            show_wrong(g.wrong)
        );
        if let Some(d) = g.direct {
            let ratio = g.busbw_ratio().unwrap_or(0.0);
            let lat = g.added_latency_us().unwrap_or(0.0);
            let _ = write!(
                o,
                "  {}  {ratio:6.3}  {lat:7.2}  {:>5}",
                show_time(d.time_us),
                show_wrong(d.wrong)
            );
        }
    }
    o
}

fn show_wrong(wrong: Option<u64>) -> String {
    wrong.map_or("N/A".to_string(), |w| w.to_string())
}

fn verdict(wrong: u64) -> &'static str {
    if wrong == 0 {
        "OK"
    } else {
        "FAILED"
    }
}

/// The lines after one op's rows.
pub fn table_foot(r: &OpResult) -> String {
    let wrong = r.wrong();
    let mut o = String::new();
    let _ = writeln!(o, "# Out of bounds values : {wrong} {}", verdict(wrong));
    let _ = writeln!(o, "# Avg bus bandwidth : {:.4}", r.avg_busbw());
    if !r.has_direct() {
        return o;
    }
    let dw = r.direct_wrong();
    let _ = writeln!(
        o,
        "# Out of bounds values, nccl direct : {dw} {}",
        verdict(dw)
    );
    let _ = writeln!(
        o,
        "# Avg bus bandwidth, nccl direct : {:.4}",
        r.avg_direct_busbw()
    );
    match r.min_ratio_from_1m() {
        Some((q, size, place)) => {
            let _ = writeln!(
                o,
                "# Lowest ferrocx/direct busbw ratio from 1M : {q:.4} ({place}, {})",
                super::show_size(size as u64)
            );
        }
        None => {
            let _ = writeln!(
                o,
                "# Lowest ferrocx/direct busbw ratio from 1M : N/A (no size from 1M)"
            );
        }
    }
    if let Some(first) = r.rows.first() {
        let lat = |g: &Group| g.added_latency_us().unwrap_or(0.0);
        let _ = writeln!(
            o,
            "# Added latency at {} B (us) : {:.2} out-of-place, {:.2} in-place",
            first.size,
            lat(&first.out_of_place),
            lat(&first.in_place)
        );
    }
    o
}

/// The whole report as text.
#[cfg(test)]
pub fn text(s: &Setup, results: &[OpResult]) -> String {
    let mut o = header(s);
    for r in results {
        o += &table_head(r.op, r.has_direct());
        for row in &r.rows {
            o += &row_line(s, r, row);
            o.push('\n');
        }
        o += &table_foot(r);
    }
    o
}

fn group_json(row: &Row, g: &Group, bus_factor: f64) -> Value {
    let (alg, bus) = row.bandwidth(g, bus_factor);
    let direct = g.direct.map(|d| {
        let alg = gbps(row.size, d.time_us);
        json!({
            "time_us": d.time_us,
            "algbw_gbps": alg,
            "busbw_gbps": alg * bus_factor,
            "wrong": d.wrong,
            "busbw_ratio": g.busbw_ratio(),
            "added_latency_us": g.added_latency_us(),
        })
    });
    json!({
        "time_us": g.time_us,
        "algbw_gbps": alg,
        "busbw_gbps": bus,
        "wrong": g.wrong,
        "direct": direct,
    })
}

/// The whole report as a JSON document.
pub fn json(s: &Setup, results: &[OpResult]) -> Value {
    let devices: Vec<Value> = s
        .devices
        .iter()
        .map(|d| json!({ "rank": d.rank, "pid": d.pid, "host": d.host, "device": d.device, "name": d.name }))
        .collect();
    let ops: Vec<Value> = results
        .iter()
        .map(|r| {
            let rows: Vec<Value> = r
                .rows
                .iter()
                .map(|row| {
                    json!({
                        "size": row.size,
                        "count": row.count,
                        "type": s.dtype,
                        "redop": r.redop(s),
                        "root": r.root(s),
                        "out_of_place": group_json(row, &row.out_of_place, r.bus_factor),
                        "in_place": group_json(row, &row.in_place, r.bus_factor),
                    })
                })
                .collect();
            let direct = r.has_direct().then(|| {
                let first = r.rows.first();
                json!({
                    "avg_busbw_gbps": r.avg_direct_busbw(),
                    "wrong": r.direct_wrong(),
                    "min_busbw_ratio_from_1m": r.min_ratio_from_1m().map(|(q, size, place)| {
                        json!({ "ratio": q, "size": size, "placement": place })
                    }),
                    "added_latency_us_at_smallest": first.map(|f| json!({
                        "size": f.size,
                        "out_of_place": f.out_of_place.added_latency_us(),
                        "in_place": f.in_place.added_latency_us(),
                    })),
                })
            });
            json!({
                "op": r.op.name(),
                "bus_factor": r.bus_factor,
                "rows": rows,
                "avg_busbw_gbps": r.avg_busbw(),
                "wrong": r.wrong(),
                "direct": direct,
            })
        })
        .collect();
    json!({
        "config": s.config,
        "cluster": s.cluster,
        "ranks": s.ranks,
        "adaptors": { "device": s.device, "ccl": s.ccl, "ccl_version": s.ccl_version },
        "devices": devices,
        "op": s.op,
        "dtype": s.dtype,
        "redop": s.redop,
        "root": s.root,
        "min_bytes": s.min_bytes,
        "max_bytes": s.max_bytes,
        "step_factor": s.step_factor,
        "warmup": s.warmup,
        "iters": s.iters,
        "check_iters": s.check_iters,
        "mode": if s.graph { "graph" } else { "back-to-back" },
        "repeats": s.repeats,
        "statistic": "median",
        "direct": s.direct,
        "results": ops,
        "wrong": results.iter().map(OpResult::wrong).sum::<u64>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> Setup {
        Setup {
            config: "configs/local.toml".into(),
            cluster: "local".into(),
            ranks: 4,
            device: "host".into(),
            ccl: "host".into(),
            ccl_version: Some(10000),
            devices: vec![],
            op: "all_reduce".into(),
            dtype: "f32".into(),
            redop: "sum".into(),
            root: 0,
            min_bytes: 8,
            max_bytes: 1024,
            step_factor: 2,
            warmup: 1,
            iters: 2,
            check_iters: 1,
            graph: false,
            repeats: 1,
            direct: None,
        }
    }

    #[test]
    fn rows_line_up_under_the_nccl_tests_header() {
        let r = OpResult {
            op: Op::AllReduce,
            bus_factor: Op::AllReduce.bus_factor(4),
            rows: vec![Row {
                size: 1 << 20,
                count: 1 << 18,
                out_of_place: Group {
                    time_us: 250.0,
                    wrong: Some(0),
                    direct: None,
                },
                in_place: Group {
                    time_us: 12345.6,
                    wrong: None,
                    direct: None,
                },
            }],
        };
        let t = text(&setup(), std::slice::from_ref(&r));
        let head = t.lines().find(|l| l.contains("#wrong")).unwrap();
        let row = t.lines().find(|l| !l.starts_with('#')).unwrap();
        assert_eq!(head.len(), row.len(), "\n{head}\n{row}");
        // Each column's last character sits under its header's.
        for (name, value) in [("size", "1048576"), ("count", "262144"), ("redop", "sum")] {
            assert_eq!(
                head.find(name).unwrap() + name.len(),
                row.find(value).unwrap() + value.len(),
                "{name}"
            );
        }
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            f,
            [
                "1048576", "262144", "f32", "sum", "-1", "250.0", "4.19", "6.29", "0", "12346",
                "0.08", "0.13", "N/A"
            ]
        );
        assert!(t.contains("# Avg bus bandwidth : "), "{t}");
        let v = json(&setup(), &[r]);
        assert_eq!(v["results"][0]["rows"][0]["in_place"]["wrong"], Value::Null);
        assert_eq!(v["results"][0]["rows"][0]["out_of_place"]["wrong"], 0);
    }

    #[test]
    fn a_placement_the_adaptor_refuses_reads_n_a_and_stays_out_of_the_summaries() {
        let ran = |t: f64, d: f64| Group {
            time_us: t,
            wrong: Some(0),
            direct: Some(Direct {
                time_us: d,
                wrong: Some(0),
            }),
        };
        let r = OpResult {
            op: Op::AllToAll,
            bus_factor: Op::AllToAll.bus_factor(2),
            rows: vec![Row {
                size: 1 << 20,
                count: 1 << 17,
                out_of_place: ran(100.0, 99.0),
                in_place: Group::not_supported(true),
            }],
        };
        assert!(!r.rows[0].in_place.ran());
        assert_eq!(r.rows[0].in_place.busbw_ratio(), None);
        assert_eq!(r.rows[0].in_place.added_latency_us(), None);
        let mut s = setup();
        s.direct = Some("libnccl 2.28.3 (libnccl.so.2)".into());
        let t = text(&s, std::slice::from_ref(&r));
        let head = t.lines().find(|l| l.contains("#wrong")).unwrap();
        let row = t.lines().find(|l| !l.starts_with('#')).unwrap();
        assert_eq!(head.len(), row.len(), "\n{head}\n{row}");
        let f: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(f[13..], ["N/A"; 8], "{row}");
        // The averages take the placement that ran only: 1 MiB in 100 us is 10.49 GB/s.
        let bus = gbps(1 << 20, 100.0) * r.bus_factor;
        assert!((r.avg_busbw() - bus).abs() < 1e-9, "{}", r.avg_busbw());
        let v = json(&s, &[r]);
        assert_eq!(
            v["results"][0]["rows"][0]["in_place"]["time_us"],
            Value::Null
        );
        assert!(svg_has_no_nan(&s));
    }

    /// The plot of a run with a refused placement draws no NaN coordinate.
    fn svg_has_no_nan(_s: &Setup) -> bool {
        let r = OpResult {
            op: Op::AllToAll,
            bus_factor: 1.0,
            rows: vec![Row {
                size: 1 << 20,
                count: 1 << 17,
                out_of_place: Group {
                    time_us: 100.0,
                    wrong: Some(0),
                    direct: None,
                },
                in_place: Group::not_supported(false),
            }],
        };
        !super::super::plot::svg("t", &[r]).contains("NaN")
    }

    fn direct_result() -> OpResult {
        let group = |t: f64, d: f64| Group {
            time_us: t,
            wrong: Some(0),
            direct: Some(Direct {
                time_us: d,
                wrong: Some(0),
            }),
        };
        OpResult {
            op: Op::AllReduce,
            bus_factor: Op::AllReduce.bus_factor(8),
            rows: vec![
                Row {
                    size: 8,
                    count: 2,
                    out_of_place: group(20.5, 20.0),
                    in_place: group(19.25, 19.75),
                },
                Row {
                    size: 1 << 20,
                    count: 1 << 18,
                    out_of_place: group(101.0, 100.0),
                    in_place: group(100.0, 100.0),
                },
                Row {
                    size: 4 << 20,
                    count: 1 << 20,
                    out_of_place: group(400.0, 400.0),
                    in_place: group(400.0, 398.0),
                },
            ],
        }
    }

    #[test]
    fn direct_columns_line_up_and_carry_the_ratio_and_the_added_latency() {
        let r = direct_result();
        let mut s = setup();
        s.direct = Some("libnccl 2.27.3 (libnccl.so.2)".into());
        s.repeats = 5;
        let t = text(&s, std::slice::from_ref(&r));
        assert!(t.contains("#  timing: back-to-back, host clock around enqueue and synchronize; median of 5 run(s) per size"), "{t}");
        assert!(
            t.contains("#  direct: libnccl 2.27.3 (libnccl.so.2)"),
            "{t}"
        );
        let head = t.lines().find(|l| l.contains("#wrong")).unwrap();
        let units = t.lines().find(|l| l.contains("(elements)")).unwrap();
        let rows: Vec<&str> = t.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), 3);
        for row in &rows {
            assert_eq!(head.len(), row.len(), "\n{head}\n{row}");
        }
        // Every column ends under its header: ferrocx's four, then direct's four, twice.
        let names: Vec<&str> = head.split_whitespace().skip(6).collect();
        assert_eq!(
            names,
            [
                "time", "algbw", "busbw", "#wrong", "time", "ratio", "+lat", "#wrong", "time",
                "algbw", "busbw", "#wrong", "time", "ratio", "+lat", "#wrong"
            ]
        );
        let ends = |line: &str| -> Vec<usize> {
            let mut v = Vec::new();
            let b = line.as_bytes();
            for i in 0..b.len() {
                if b[i] != b' ' && (i + 1 == b.len() || b[i + 1] == b' ') {
                    v.push(i);
                }
            }
            v
        };
        let head_ends = ends(head);
        assert_eq!(
            ends(rows[0]),
            head_ends[head_ends.len() - 21..],
            "{head}\n{}",
            rows[0]
        );
        // Units sit under their columns too: (us) under both times of each group.
        let unit_ends = ends(units);
        let time_cols: Vec<usize> = [0, 4, 8, 12].iter().map(|&k| head_ends[6 + k]).collect();
        for c in time_cols {
            assert!(
                unit_ends.contains(&c),
                "(us) under column ending at {c}\n{head}\n{units}"
            );
        }
        let f: Vec<&str> = rows[0].split_whitespace().collect();
        // 8 B: ferrocx 20.50 us against 20.00 us direct: ratio 0.976, +0.50 us; in place the
        // direct path is the slower one (-0.50 us).
        assert_eq!(
            f[5..],
            [
                "20.50", "0.00", "0.00", "0", "20.00", "0.976", "0.50", "0", "19.25", "0.00",
                "0.00", "0", "19.75", "1.026", "-0.50", "0"
            ]
        );
        assert!(
            t.contains("# Out of bounds values, nccl direct : 0 OK"),
            "{t}"
        );
        // From 1 MiB, the lowest ratio is 1M out of place: 100/101.
        assert!(
            t.contains("# Lowest ferrocx/direct busbw ratio from 1M : 0.9901 (out-of-place, 1M)"),
            "{t}"
        );
        assert!(
            t.contains("# Added latency at 8 B (us) : 0.50 out-of-place, -0.50 in-place"),
            "{t}"
        );
        let (q, size, place) = r.min_ratio_from_1m().unwrap();
        assert_eq!((size, place), (1 << 20, "out-of-place"));
        assert!((q - 100.0 / 101.0).abs() < 1e-12);
    }

    #[test]
    fn json_carries_the_direct_reference() {
        let r = direct_result();
        let mut s = setup();
        s.direct = Some("libnccl 2.27.3 (libnccl.so.2)".into());
        s.graph = true;
        s.repeats = 5;
        let v = json(&s, &[r]);
        assert_eq!(v["mode"], "graph");
        assert_eq!(v["repeats"], 5);
        assert_eq!(v["statistic"], "median");
        assert_eq!(v["direct"], "libnccl 2.27.3 (libnccl.so.2)");
        let row = &v["results"][0]["rows"][0];
        assert_eq!(row["out_of_place"]["time_us"], 20.5);
        let d = &row["out_of_place"]["direct"];
        assert_eq!(d["time_us"], 20.0);
        assert_eq!(d["wrong"], 0);
        assert_eq!(d["added_latency_us"], 0.5);
        assert!((d["busbw_ratio"].as_f64().unwrap() - 20.0 / 20.5).abs() < 1e-12);
        // busbw = size / time × 2(n-1)/n, here 8 B / 20 us × 1.75 = 0.0007 GB/s.
        assert!((d["busbw_gbps"].as_f64().unwrap() - 8.0 / 20.0 / 1e3 * 1.75).abs() < 1e-12);
        let summary = &v["results"][0]["direct"];
        assert_eq!(summary["wrong"], 0);
        assert_eq!(summary["min_busbw_ratio_from_1m"]["size"], 1 << 20);
        assert_eq!(summary["added_latency_us_at_smallest"]["in_place"], -0.5);
        // Without --direct the fields are null, not absent.
        let plain = json(
            &setup(),
            &[OpResult {
                rows: vec![],
                ..direct_result()
            }],
        );
        assert_eq!(plain["direct"], Value::Null);
        assert_eq!(plain["mode"], "back-to-back");
        assert_eq!(plain["results"][0]["direct"], Value::Null);
    }

    #[test]
    fn medians_and_ratios_of_groups() {
        let g = Group {
            time_us: 50.0,
            wrong: None,
            direct: Some(Direct {
                time_us: 49.0,
                wrong: None,
            }),
        };
        assert_eq!(g.added_latency_us(), Some(1.0));
        assert_eq!(g.busbw_ratio(), Some(0.98));
        let alone = Group { direct: None, ..g };
        assert_eq!(
            (alone.busbw_ratio(), alone.added_latency_us()),
            (None, None)
        );
    }
}
