//! The report: results as data, printed as an nccl-tests table or as JSON.

use std::fmt::Write;

use serde_json::{json, Value};

use super::ops::Op;

/// One placement's (out-of-place or in-place) measurement at one size, over all ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Group {
    /// The slowest rank's average time per operation, in microseconds.
    pub time_us: f64,
    /// Wrong elements over all ranks; `None` when not checked.
    pub wrong: Option<u64>,
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
}

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
            for g in [&r.out_of_place, &r.in_place] {
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

/// The column headers of one op's table.
pub fn table_head(op: Op) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "#");
    let _ = writeln!(o, "# {}", op.name());
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
        let (alg, bus) = row.bandwidth(g, r.bus_factor);
        let wrong = g.wrong.map_or("N/A".to_string(), |w| w.to_string());
        let _ = write!(
            o,
            "  {}  {alg:6.2}  {bus:6.2}  {wrong:>5}",
            show_time(g.time_us)
        );
    }
    o
}

/// The lines after one op's rows.
pub fn table_foot(r: &OpResult) -> String {
    let wrong = r.wrong();
    let mut o = String::new();
    let verdict = if wrong == 0 { "OK" } else { "FAILED" };
    let _ = writeln!(o, "# Out of bounds values : {wrong} {verdict}");
    let _ = writeln!(o, "# Avg bus bandwidth : {:.4}", r.avg_busbw());
    o
}

/// The whole report as text.
#[cfg(test)]
pub fn text(s: &Setup, results: &[OpResult]) -> String {
    let mut o = header(s);
    for r in results {
        o += &table_head(r.op);
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
    json!({ "time_us": g.time_us, "algbw_gbps": alg, "busbw_gbps": bus, "wrong": g.wrong })
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
            json!({
                "op": r.op.name(),
                "bus_factor": r.bus_factor,
                "rows": rows,
                "avg_busbw_gbps": r.avg_busbw(),
                "wrong": r.wrong(),
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
                },
                in_place: Group {
                    time_us: 12345.6,
                    wrong: None,
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
}
