//! One rank of `ferrocx bench`: buffers from the device adaptor, timed back-to-back
//! operations, the check against a reference, and (rank 0) the report.
//!
//! Inputs and outputs move between host `Vec`s and device memory with the device's `mem_copy`,
//! so the same code runs on any device adaptor, host-addressable or not.

use std::error::Error;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use ferrocx::abi::{DataType, DevicePtr, MemKind, ReduceOp};
use ferrocx::adaptor::{AdaptorError, Device};
use ferrocx::bootstrap::{JobInfo, RankInfo};
use ferrocx::comm::{CommError, Communicator};
use ferrocx::registry::Registry;
use serde_json::json;

use super::data::Pattern;
use super::ops::{Geometry, Op};
use super::progress::Progress;
use super::table::{self, Group, OpResult, RankDevice, Row, Setup};
use super::{redop_name, sizes, usage_error, BenchArgs};

/// Byte that fills an output before a checked run: all-ones is NaN in every float type and -1
/// or the maximum in integer ones, which no reference here produces.
const POISON: u8 = 0xff;

/// Test hook: the rank named here spoils the first checked element of each checked run, as a
/// faulty CCL would, so that the wrong-result path can be tested end to end.
pub const ENV_INJECT_FAULT: &str = "FERROCX_BENCH_INJECT_FAULT";

/// Device memory, freed on drop.
struct Buffer {
    device: Device,
    ptr: DevicePtr,
}

impl Buffer {
    fn new(device: &Device, bytes: usize) -> Result<Buffer, AdaptorError> {
        let ptr = device.mem_alloc(bytes.max(8), MemKind::DEVICE)?;
        Ok(Buffer {
            device: device.clone(),
            ptr,
        })
    }

    /// The address `offset` bytes in.
    fn at(&self, offset: usize) -> DevicePtr {
        DevicePtr(self.ptr.0 + offset as u64)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // A failed free at exit is not actionable; the adaptor logs it.
        let _ = self.device.mem_free(self.ptr, MemKind::DEVICE);
    }
}

/// The address of host memory, for `mem_copy`.
fn host_ptr(bytes: &[u8]) -> DevicePtr {
    DevicePtr(bytes.as_ptr() as u64)
}

/// Writes a line to stdout; a closed stdout must not stop the rank (`println!` panics).
fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The communicator: from the environment, with `--config` in place of `FERROCX_CONFIG`.
fn connect(args: &BenchArgs) -> Result<Communicator, CommError> {
    let Some(path) = &args.config else {
        return Communicator::from_env();
    };
    let config = crate::load_config(Some(path))?;
    let lookup = |k: &str| std::env::var(k).ok();
    let rank = RankInfo::from_env(lookup)?;
    let job = JobInfo::from_env(lookup, &rank);
    let registry = Registry::discover(&config.runtime);
    Communicator::init(&config, &registry, &rank, &job)
}

/// Inputs of every rank and the reduction's reference, for one op.
struct Patterns {
    inputs: Vec<Pattern>,
    reduced: Option<Pattern>,
}

/// A run of output elements that must repeat `pattern` from `phase`.
struct Expect<'p> {
    start: usize,
    len: usize,
    pattern: &'p Pattern,
    phase: usize,
}

/// One rank's benchmark state.
struct Bench<'a> {
    comm: &'a Communicator,
    args: &'a BenchArgs,
    dtype: DataType,
    es: usize,
    redop: ReduceOp,
    root: usize,
    /// Out-of-place input.
    a: Buffer,
    /// Output, and in-place input.
    b: Buffer,
    /// Times and wrong counts shared between ranks.
    stats: Buffer,
    host: Vec<u8>,
    /// [`ENV_INJECT_FAULT`] names this rank.
    fault: bool,
}

impl Bench<'_> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn patterns(&self, op: Op) -> Patterns {
        let prod = op.reduces() && self.redop == ReduceOp::PROD;
        let n = self.comm.world();
        Patterns {
            inputs: (0..n)
                .map(|r| Pattern::input(self.dtype, r, prod))
                .collect(),
            reduced: op
                .reduces()
                .then(|| Pattern::reduced(self.dtype, n, self.redop)),
        }
    }

    /// (input, output) addresses of `op` at `g`; in place, as nccl-tests places them.
    fn layout(&self, op: Op, g: &Geometry, in_place: bool) -> (DevicePtr, DevicePtr) {
        let block = g.count * self.es * self.rank();
        match (in_place, op) {
            (false, _) => (self.a.at(0), self.b.at(0)),
            (true, Op::AllGather) => (self.b.at(block), self.b.at(0)),
            (true, Op::ReduceScatter) => (self.b.at(0), self.b.at(block)),
            (true, _) => (self.b.at(0), self.b.at(0)),
        }
    }

    /// Copies this rank's input into `send`.
    fn write_input(
        &mut self,
        pats: &Patterns,
        g: &Geometry,
        send: DevicePtr,
    ) -> Result<(), AdaptorError> {
        let bytes = g.send * self.es;
        pats.inputs[self.rank()].fill(&mut self.host[..bytes], 0);
        self.comm
            .device()
            .mem_copy(send, host_ptr(&self.host), bytes)
    }

    fn issue(
        &self,
        op: Op,
        g: &Geometry,
        send: DevicePtr,
        recv: DevicePtr,
    ) -> Result<(), AdaptorError> {
        op.issue(
            self.comm,
            send,
            recv,
            g.count,
            self.dtype,
            self.redop,
            self.root as i32,
        )
    }

    /// What this rank's output must hold after `op`.
    fn expected<'p>(&self, op: Op, g: &Geometry, pats: &'p Patterns) -> Vec<Expect<'p>> {
        let (c, me, n) = (g.count, self.rank(), self.comm.world());
        let whole = |pattern: &'p Pattern, phase: usize| Expect {
            start: 0,
            len: c,
            pattern,
            phase,
        };
        let per_source = |phase: usize| {
            (0..n)
                .map(|s| Expect {
                    start: s * c,
                    len: c,
                    pattern: &pats.inputs[s],
                    phase,
                })
                .collect()
        };
        match (op, &pats.reduced) {
            (Op::AllReduce, Some(r)) => vec![whole(r, 0)],
            (Op::Reduce, Some(r)) if me == self.root => vec![whole(r, 0)],
            (Op::ReduceScatter, Some(r)) => vec![whole(r, me * c)],
            (Op::Broadcast, _) => vec![whole(&pats.inputs[self.root], 0)],
            (Op::AllGather, _) => per_source(0),
            (Op::AllToAll, _) => per_source(me * c),
            _ => Vec::new(),
        }
    }

    /// One checked run: poisoned output, fresh input, the op, and the elements that differ.
    fn check_once(
        &mut self,
        op: Op,
        g: &Geometry,
        pats: &Patterns,
        in_place: bool,
    ) -> Result<u64, Box<dyn Error>> {
        let (send, recv) = self.layout(op, g, in_place);
        let recv_bytes = g.recv * self.es;
        let device = self.comm.device().clone();
        device.mem_set(recv, POISON, recv_bytes)?;
        // In place, a broadcast's non-root input is its output: leaving it poisoned shows
        // whether the root's data arrived.
        if !(in_place && op == Op::Broadcast && self.rank() != self.root) {
            self.write_input(pats, g, send)?;
        }
        self.issue(op, g, send, recv)?;
        self.comm.synchronize()?;
        let expect = self.expected(op, g, pats);
        if expect.is_empty() {
            return Ok(0);
        }
        if self.fault {
            if let Some(e) = expect.iter().find(|e| e.len > 0) {
                device.mem_set(
                    DevicePtr(recv.0 + (e.start * self.es) as u64),
                    POISON,
                    self.es,
                )?;
            }
        }
        device.mem_copy(DevicePtr(self.host.as_mut_ptr() as u64), recv, recv_bytes)?;
        let es = self.es;
        Ok(expect
            .iter()
            .map(|e| {
                e.pattern
                    .wrong(&self.host[e.start * es..(e.start + e.len) * es], e.phase)
            })
            .sum())
    }

    /// Average microseconds per operation on this rank, and the wrong elements of the checks.
    fn measure(
        &mut self,
        op: Op,
        g: &Geometry,
        pats: &Patterns,
        in_place: bool,
    ) -> Result<(f64, Option<u64>), Box<dyn Error>> {
        let (send, recv) = self.layout(op, g, in_place);
        self.write_input(pats, g, send)?;
        for _ in 0..self.args.warmup {
            self.issue(op, g, send, recv)?;
        }
        self.comm.synchronize()?;
        let start = Instant::now();
        for _ in 0..self.args.iters {
            self.issue(op, g, send, recv)?;
        }
        self.comm.synchronize()?;
        let us = start.elapsed().as_secs_f64() * 1e6 / f64::from(self.args.iters);
        let wrong = match self.args.check_iters {
            0 => None,
            k => {
                let mut sum = 0;
                for _ in 0..k {
                    sum += self.check_once(op, g, pats, in_place)?;
                }
                Some(sum)
            }
        };
        Ok((us, wrong))
    }

    /// The slowest rank's times and every rank's wrong elements, on every rank.
    fn share(
        &mut self,
        times: [f64; 2],
        wrong: [u64; 2],
    ) -> Result<([f64; 2], [u64; 2]), Box<dyn Error>> {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&times[0].to_ne_bytes());
        bytes[8..16].copy_from_slice(&times[1].to_ne_bytes());
        bytes[16..24].copy_from_slice(&wrong[0].to_ne_bytes());
        bytes[24..].copy_from_slice(&wrong[1].to_ne_bytes());
        let device = self.comm.device();
        device.mem_copy(self.stats.at(0), host_ptr(&bytes), 32)?;
        let (t, w) = (self.stats.at(0), self.stats.at(16));
        self.comm
            .all_reduce(t, t, 2, DataType::F64, ReduceOp::MAX)?;
        self.comm
            .all_reduce(w, w, 2, DataType::U64, ReduceOp::SUM)?;
        self.comm.synchronize()?;
        device.mem_copy(DevicePtr(bytes.as_mut_ptr() as u64), self.stats.at(0), 32)?;
        let f = |i: usize| f64::from_ne_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
        let u = |i: usize| u64::from_ne_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
        Ok(([f(0), f(8)], [u(16), u(24)]))
    }
}

/// This host's name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// Every rank's process and device, through the job's store.
fn gather_devices(comm: &Communicator) -> Result<Vec<RankDevice>, Box<dyn Error>> {
    let dev = comm.device();
    let index = dev.get_device().unwrap_or(0);
    let name = match dev.properties(index) {
        Ok(p) if p.vendor.is_empty() || p.name.starts_with(&p.vendor) => p.name,
        Ok(p) => format!("{} {}", p.vendor, p.name),
        Err(_) => dev.name().to_string(),
    };
    let mine =
        json!({ "pid": std::process::id(), "host": host_name(), "device": index, "name": name });
    let all = comm.store().all_gather(
        "ferrocx-bench/devices",
        comm.rank(),
        comm.world(),
        mine.to_string().as_bytes(),
    )?;
    Ok(all
        .iter()
        .enumerate()
        .map(|(rank, bytes)| {
            let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
            RankDevice {
                rank,
                pid: v["pid"].as_u64().unwrap_or(0) as u32,
                host: v["host"].as_str().unwrap_or("?").to_string(),
                device: v["device"].as_i64().unwrap_or(0) as i32,
                name: v["name"].as_str().unwrap_or("?").to_string(),
            }
        })
        .collect())
}

/// Runs this rank; its exit code (rank 0: 1 if any element was wrong).
pub fn run(args: &BenchArgs) -> Result<ExitCode, Box<dyn Error>> {
    let comm = connect(args)?;
    let (rank, n) = (comm.rank(), comm.world());
    let ops = args.op.ops();
    let root = args.root as usize;
    if ops.iter().any(|op| op.rooted()) && root >= n {
        return Ok(usage_error(&format!(
            "--root {root} is not a rank of a {n}-rank job"
        )));
    }
    let dtype = args.dtype.data_type();
    let es = dtype.size().ok_or("unknown data type")?;
    let redop = args.redop.reduce_op();
    let sizes = sizes(args.min_bytes, args.max_bytes, args.step_factor);
    let largest = sizes
        .iter()
        .flat_map(|&s| ops.iter().map(move |op| op.geometry(s, es, n).size))
        .max()
        .unwrap_or(0);
    let device = comm.device().clone();
    let mut bench = Bench {
        comm: &comm,
        args,
        dtype,
        es,
        redop,
        root,
        a: Buffer::new(&device, largest)?,
        b: Buffer::new(&device, largest)?,
        stats: Buffer::new(&device, 32)?,
        host: vec![0u8; largest.max(8)],
        fault: std::env::var(ENV_INJECT_FAULT).is_ok_and(|v| v.trim() == rank.to_string()),
    };

    let devices = gather_devices(&comm)?;
    let config = match &args.config {
        Some(p) => p.display().to_string(),
        None => std::env::var(ferrocx::config::ENV_CONFIG)
            .ok()
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| "(built-in local configuration)".into()),
    };
    let setup = Setup {
        config,
        cluster: comm.cluster().to_string(),
        ranks: n,
        device: device.name().to_string(),
        ccl: comm.ccl().name().to_string(),
        ccl_version: comm.ccl().version().ok(),
        devices,
        op: args.op.name().to_string(),
        dtype: dtype.name().unwrap_or("?").to_string(),
        redop: redop_name(redop).to_string(),
        root,
        min_bytes: args.min_bytes,
        max_bytes: args.max_bytes,
        step_factor: args.step_factor,
        warmup: args.warmup,
        iters: args.iters,
        check_iters: args.check_iters,
    };
    let report = rank == 0;
    let text = report && !args.json;
    if text {
        say(&table::header(&setup));
    }

    let mut progress = Progress::for_rank(rank);
    let mut results = Vec::new();
    for &op in &ops {
        let pats = bench.patterns(op);
        let mut result = OpResult {
            op,
            bus_factor: op.bus_factor(n),
            rows: Vec::new(),
        };
        if text {
            say(&table::table_head(op));
        }
        for (k, &size) in sizes.iter().enumerate() {
            progress.update(op.name(), k, sizes.len());
            let g = op.geometry(size, es, n);
            let (t_out, w_out) = bench.measure(op, &g, &pats, false)?;
            let (t_in, w_in) = bench.measure(op, &g, &pats, true)?;
            let (t, w) = bench.share([t_out, t_in], [w_out.unwrap_or(0), w_in.unwrap_or(0)])?;
            let checked = |w: u64| (args.check_iters > 0).then_some(w);
            let row = Row {
                size: g.size,
                count: g.count,
                out_of_place: Group {
                    time_us: t[0],
                    wrong: checked(w[0]),
                },
                in_place: Group {
                    time_us: t[1],
                    wrong: checked(w[1]),
                },
            };
            if text {
                progress.clear();
                say(&format!("{}\n", table::row_line(&setup, &result, &row)));
            }
            result.rows.push(row);
        }
        progress.clear();
        if text {
            say(&table::table_foot(&result));
        }
        results.push(result);
    }
    drop(progress);

    if !report {
        return Ok(ExitCode::SUCCESS);
    }
    if args.json {
        let doc = table::json(&setup, &results);
        say(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "ferrocx bench: {n} ranks, device {} + ccl {}, {}",
            setup.device, setup.ccl, setup.dtype
        );
        std::fs::write(path, super::plot::svg(&title, &results))
            .map_err(|e| format!("cannot write the plot to {}: {e}", path.display()))?;
    }
    let wrong: u64 = results.iter().map(OpResult::wrong).sum();
    if wrong > 0 {
        let _ = writeln!(
            std::io::stderr(),
            "ferrocx bench: {wrong} wrong element(s): the results above do not match the reference"
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
