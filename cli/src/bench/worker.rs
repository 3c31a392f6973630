//! One rank of `ferrocx bench`: buffers from the device adaptor, timed operations, the check
//! against a reference, and (rank 0) the report.
//!
//! Inputs and outputs move between host `Vec`s and device memory with the device's `mem_copy`,
//! so the same code runs on any device adaptor, host-addressable or not.
//!
//! Timing, as nccl-tests: the host clock around enqueuing `--iters` operations and one
//! synchronisation of the stream, divided by `--iters`, after `--warmup` untimed operations.
//! With `--graph` the `--iters` operations are captured into one graph per size and placement
//! (after an eager warm-up, and launched once untimed so its upload is not timed), and a timed
//! run is one launch of it. Each size and placement is timed `--repeats` times; a run's time is
//! the slowest rank's, and the table reports the median of the runs. With `--direct` every run
//! of ferrocx is paired with one of NCCL called directly on the same buffers and stream, in
//! alternating order (ferrocx first in even runs, direct first in odd ones), so drift in the
//! machine's state hits both alike.

use std::error::Error;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use ferrocx::abi::{DataType, DevicePtr, MemKind, ReduceOp};
use ferrocx::adaptor::{AdaptorError, Device, DeviceGraph, Graph};
use ferrocx::bootstrap::{JobInfo, RankInfo};
use ferrocx::comm::{CommError, Communicator};
use ferrocx::registry::Registry;
use ferrocx::route::Route;
use ferrocx::window::{SymmetricBuffer, Window, WindowFlags};
use serde_json::json;

use super::data::Pattern;
use super::direct::Direct;
use super::ops::{Geometry, Op};
use super::progress::Progress;
use super::table::{self, Group, OpResult, RankDevice, Row, Setup};
use super::{plan_sizes, redop_name, sizes, usage_error, AlgoArg, BenchArgs, OpSizes};

/// Byte that fills an output before a checked run: all-ones is NaN in every float type and -1
/// or the maximum in integer ones, which no reference here produces.
const POISON: u8 = 0xff;

/// Test hook: the rank named here spoils the first checked element of each checked run, as a
/// faulty CCL would, so that the wrong-result path can be tested end to end.
pub const ENV_INJECT_FAULT: &str = "FERROCX_BENCH_INJECT_FAULT";

/// Device memory, freed on drop when the device adaptor allocated it.
struct Buffer {
    device: Device,
    ptr: DevicePtr,
    /// Whether `ptr` came from the device adaptor (else its owner frees it:
    /// `--direct-symmetric`'s buffers belong to the direct communicator).
    owned: bool,
}

impl Buffer {
    fn new(device: &Device, bytes: usize) -> Result<Buffer, AdaptorError> {
        let ptr = device.mem_alloc(bytes.max(8), MemKind::DEVICE)?;
        Ok(Buffer {
            device: device.clone(),
            ptr,
            owned: true,
        })
    }

    /// Memory that another owner frees, after this buffer is dropped.
    fn borrowed(device: &Device, ptr: DevicePtr) -> Buffer {
        Buffer {
            device: device.clone(),
            ptr,
            owned: false,
        }
    }

    /// The address `offset` bytes in.
    fn at(&self, offset: usize) -> DevicePtr {
        DevicePtr(self.ptr.0 + offset as u64)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // A failed free at exit is not actionable; the adaptor logs it.
        // SAFETY: the allocation `new` made, freed once; the worker synchronizes its stream before
        // its buffers drop.
        let _ = unsafe { self.device.mem_free(self.ptr, MemKind::DEVICE) };
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

/// What issues the operations of a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// ferrocx's CCL adaptor, through its table.
    Ferrocx,
    /// libnccl called directly (`--direct`).
    Direct,
}

/// The median of `v` (the mean of the two middle values for an even count; 0 for none).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The two placements, in the order they are measured.
const PLACEMENTS: [bool; 2] = [false, true];

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
    /// The paths measured: ferrocx, and with `--direct` libnccl called directly.
    paths: Vec<Path>,
    /// `--direct`'s communicator.
    direct: Option<Direct>,
    /// `--graph`: the device's graph group.
    graphs: Option<DeviceGraph>,
    /// Timed runs per size and placement.
    repeats: usize,
    /// Whether rank 0 said that the adaptor refuses a placement (once per run).
    refusal_shown: bool,
    /// `--output-window`: the window over `b` (symmetric memory), and that memory.
    out: Option<(Window, SymmetricBuffer)>,
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
        // SAFETY: `send` is one of `layout`'s addresses, in `a` or `b`, which hold the largest
        // geometry's input; `self.host` holds `bytes`.
        unsafe {
            self.comm
                .device()
                .mem_copy(send, host_ptr(&self.host), bytes)
        }
    }

    /// Enqueues one `op` on the communicator's stream through `path`.
    fn issue(
        &self,
        path: Path,
        op: Op,
        g: &Geometry,
        send: DevicePtr,
        recv: DevicePtr,
    ) -> Result<(), Box<dyn Error>> {
        let root = self.root as i32;
        match path {
            Path::Ferrocx => {
                let call = self.comm.call();
                let call = match (op, self.args.algo) {
                    (_, AlgoArg::Auto) => call,
                    (Op::AllGather, a) if a.p2p().is_some() => {
                        // A graph replays what was captured: the window routes' rounds
                        // cannot be replayed, so a captured `p2p` runs on the CCL.
                        let forced = a.p2p().flatten().or(self.args.graph.then_some(Route::Ccl));
                        let call = match forced {
                            Some(route) => call.via(route),
                            None => call,
                        };
                        let call = match &self.out {
                            Some((window, _)) => call.output_window(window),
                            None => call,
                        };
                        // SAFETY: the bench's buffers hold the geometry of the largest size
                        // and are freed only after the stream is synchronized; `join` orders
                        // the communicator's stream after every slice, so that synchronize
                        // covers the gather.
                        let h = unsafe {
                            call.all_gather_p2p(
                                send,
                                recv,
                                g.count,
                                self.dtype,
                                self.args.streams as usize,
                            )?
                        };
                        h.join(self.comm.stream())?;
                        return Ok(());
                    }
                    (Op::AllReduce, AlgoArg::Window) => {
                        // SAFETY: the bench's buffers hold the geometry of the largest size
                        // and are freed only after the stream is synchronized.
                        unsafe {
                            self.comm.all_reduce_window(
                                send, recv, g.count, self.dtype, self.redop, None,
                            )?
                        };
                        return Ok(());
                    }
                    (Op::AllReduce, a) => match a.window() {
                        Some(Some(algo)) => call.via(Route::Window(algo)),
                        _ => call.via(Route::Ccl),
                    },
                    _ => call.via(Route::Ccl),
                };
                // SAFETY: as above.
                unsafe {
                    op.issue(
                        call,
                        send,
                        recv,
                        g.count,
                        self.dtype,
                        self.redop,
                        root as usize,
                    )?
                };
            }
            Path::Direct => {
                let direct = self.direct.as_ref().ok_or("--direct is not set up")?;
                let stream = self.comm.stream();
                // SAFETY: the bench's buffers (sized for the largest geometry) on the
                // communicator's stream, freed only after it is synchronized.
                unsafe {
                    direct.issue(
                        op, send, recv, g.count, self.dtype, self.redop, root, stream,
                    )?
                };
            }
        }
        Ok(())
    }

    /// Enqueues `k` of `op` back to back through `path`.
    fn issue_k(
        &self,
        path: Path,
        op: Op,
        g: &Geometry,
        send: DevicePtr,
        recv: DevicePtr,
        k: u32,
    ) -> Result<(), Box<dyn Error>> {
        (0..k).try_for_each(|_| self.issue(path, op, g, send, recv))
    }

    /// A graph of `k` of `op` through `path`, captured on the communicator's stream.
    fn capture(
        &self,
        path: Path,
        op: Op,
        g: &Geometry,
        send: DevicePtr,
        recv: DevicePtr,
        k: u32,
    ) -> Result<Graph, Box<dyn Error>> {
        let graphs = self.graphs.as_ref().ok_or("--graph is not set up")?;
        graphs.capture(self.comm.stream(), || {
            self.issue_k(path, op, g, send, recv, k)
        })
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

    /// One checked run: poisoned output, fresh input, one op (with `--graph`, a launch of
    /// `graph`, which holds one op), and the elements that differ.
    #[allow(clippy::too_many_arguments)]
    fn check_once(
        &mut self,
        path: Path,
        op: Op,
        g: &Geometry,
        pats: &Patterns,
        in_place: bool,
        graph: Option<&Graph>,
    ) -> Result<u64, Box<dyn Error>> {
        let (send, recv) = self.layout(op, g, in_place);
        let recv_bytes = g.recv * self.es;
        let device = self.comm.device().clone();
        // SAFETY: `recv` is `layout`'s output address, with room for `g.recv` elements.
        unsafe { device.mem_set(recv, POISON, recv_bytes) }?;
        // In place, a broadcast's non-root input is its output: leaving it poisoned shows
        // whether the root's data arrived.
        if !(in_place && op == Op::Broadcast && self.rank() != self.root) {
            self.write_input(pats, g, send)?;
        }
        match graph {
            Some(graph) => graph.launch(self.comm.stream())?,
            None => self.issue(path, op, g, send, recv)?,
        }
        self.comm.synchronize()?;
        let expect = self.expected(op, g, pats);
        if expect.is_empty() {
            return Ok(0);
        }
        if self.fault {
            if let Some(e) = expect.iter().find(|e| e.len > 0) {
                // SAFETY: element `e.start < g.recv` of the output, after the synchronize above.
                unsafe {
                    device.mem_set(
                        DevicePtr(recv.0 + (e.start * self.es) as u64),
                        POISON,
                        self.es,
                    )
                }?;
            }
        }
        // SAFETY: `recv_bytes` of the output, after the synchronize above, into `self.host`, which
        // holds the largest buffer.
        unsafe { device.mem_copy(DevicePtr(self.host.as_mut_ptr() as u64), recv, recv_bytes) }?;
        let es = self.es;
        Ok(expect
            .iter()
            .map(|e| {
                e.pattern
                    .wrong(&self.host[e.start * es..(e.start + e.len) * es], e.phase)
            })
            .sum())
    }

    /// The wrong elements of `--check-iters` checked runs of `path` (`None` for none).
    fn check(
        &mut self,
        path: Path,
        op: Op,
        g: &Geometry,
        pats: &Patterns,
        in_place: bool,
    ) -> Result<Option<u64>, Box<dyn Error>> {
        let k = self.args.check_iters;
        if k == 0 {
            return Ok(None);
        }
        // With --graph the checked op runs from a graph too (of one op: a graph of `iters`
        // in-place ops would reduce its own output again).
        let graph = match self.graphs {
            Some(_) => {
                let (send, recv) = self.layout(op, g, in_place);
                Some(self.capture(path, op, g, send, recv, 1)?)
            }
            None => None,
        };
        let mut sum = 0;
        for _ in 0..k {
            sum += self.check_once(path, op, g, pats, in_place, graph.as_ref())?;
        }
        Ok(Some(sum))
    }

    /// One timed run of `path`: fresh input, `--warmup` eager ops, then `--iters` ops (or one
    /// launch of `graph`, which holds them) between the clock's reads; microseconds per op on
    /// this rank.
    #[allow(clippy::too_many_arguments)]
    fn time_run(
        &mut self,
        path: Path,
        op: Op,
        g: &Geometry,
        pats: &Patterns,
        in_place: bool,
        graph: Option<&Graph>,
    ) -> Result<f64, Box<dyn Error>> {
        let (send, recv) = self.layout(op, g, in_place);
        // Fresh input for each run keeps in-place reductions from growing without bound.
        self.write_input(pats, g, send)?;
        self.issue_k(path, op, g, send, recv, self.args.warmup)?;
        self.comm.synchronize()?;
        let start = Instant::now();
        match graph {
            Some(graph) => graph.launch(self.comm.stream())?,
            None => self.issue_k(path, op, g, send, recv, self.args.iters)?,
        }
        self.comm.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / f64::from(self.args.iters))
    }

    /// Every timed run and check of one placement on this rank: `times[p][run]` and
    /// `wrong[p]` for each path `p`.
    #[allow(clippy::type_complexity)]
    fn measure(
        &mut self,
        op: Op,
        g: &Geometry,
        pats: &Patterns,
        in_place: bool,
    ) -> Result<(Vec<Vec<f64>>, Vec<Option<u64>>), Box<dyn Error>> {
        let paths = self.paths.clone();
        // --graph: one graph of `iters` ops per path, captured after an eager warm-up and
        // launched once untimed (the first launch uploads it).
        let mut graphs: Vec<Option<Graph>> = Vec::new();
        for &p in &paths {
            if self.graphs.is_none() {
                graphs.push(None);
                continue;
            }
            let (send, recv) = self.layout(op, g, in_place);
            self.write_input(pats, g, send)?;
            self.issue_k(p, op, g, send, recv, self.args.warmup)?;
            self.comm.synchronize()?;
            let graph = self.capture(p, op, g, send, recv, self.args.iters)?;
            graph.launch(self.comm.stream())?;
            self.comm.synchronize()?;
            graphs.push(Some(graph));
        }
        let mut times = vec![Vec::with_capacity(self.repeats); paths.len()];
        for run in 0..self.repeats {
            let mut order: Vec<usize> = (0..paths.len()).collect();
            if run % 2 == 1 {
                order.reverse();
            }
            for i in order {
                let t = self.time_run(paths[i], op, g, pats, in_place, graphs[i].as_ref())?;
                times[i].push(t);
            }
        }
        drop(graphs);
        let mut wrong = Vec::with_capacity(paths.len());
        for &p in &paths {
            wrong.push(self.check(p, op, g, pats, in_place)?);
        }
        Ok((times, wrong))
    }

    /// Element-wise, the largest `times` and the sum of `wrong` over all ranks, on every rank.
    fn share(
        &mut self,
        times: &[f64],
        wrong: &[u64],
    ) -> Result<(Vec<f64>, Vec<u64>), Box<dyn Error>> {
        let (nt, nw) = (times.len(), wrong.len());
        let mut bytes: Vec<u8> = Vec::with_capacity(8 * (nt + nw));
        for t in times {
            bytes.extend_from_slice(&t.to_ne_bytes());
        }
        for w in wrong {
            bytes.extend_from_slice(&w.to_ne_bytes());
        }
        let device = self.comm.device();
        // SAFETY: `stats` holds 8 bytes per shared value, at least `bytes.len()`.
        unsafe { device.mem_copy(self.stats.at(0), host_ptr(&bytes), bytes.len()) }?;
        let (t, w) = (self.stats.at(0), self.stats.at(8 * nt));
        // SAFETY: the stats buffer holds `8 * (nt + nw)` bytes (the largest figures a run
        // shares) and lives as long as the worker; the stream is synchronized below.
        unsafe {
            self.comm
                .all_reduce(t, t, nt, DataType::F64, ReduceOp::MAX)?;
            self.comm
                .all_reduce(w, w, nw, DataType::U64, ReduceOp::SUM)?;
        }
        self.comm.synchronize()?;
        // SAFETY: as above, after the synchronize, into `bytes`.
        unsafe {
            device.mem_copy(
                DevicePtr(bytes.as_mut_ptr() as u64),
                self.stats.at(0),
                bytes.len(),
            )
        }?;
        let word = |i: usize| -> [u8; 8] { bytes[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]) };
        Ok((
            (0..nt).map(|i| f64::from_ne_bytes(word(i))).collect(),
            (nt..nt + nw).map(|i| u64::from_ne_bytes(word(i))).collect(),
        ))
    }

    /// One row: both placements of every path, timed, checked and shared between ranks.
    fn row(&mut self, op: Op, g: &Geometry, pats: &Patterns) -> Result<Row, Box<dyn Error>> {
        let np = self.paths.len();
        let mut times = Vec::new();
        let mut wrong = Vec::new();
        let mut ran = [true; PLACEMENTS.len()];
        for (place, in_place) in PLACEMENTS.into_iter().enumerate() {
            match self.measure(op, g, pats, in_place) {
                Ok((t, w)) => {
                    times.extend(t.into_iter().flatten());
                    wrong.extend(w.iter().map(|w| w.unwrap_or(0)));
                }
                // The adaptor refuses this placement before enqueuing anything (the same on
                // every rank: it depends on the arguments only), e.g. NCCL's in-place
                // all-to-all: its cells say N/A and the other placement still runs.
                Err(e) if in_place && refused(&*e) => {
                    ran[place] = false;
                    times.extend(std::iter::repeat_n(0.0, np * self.repeats));
                    wrong.extend(std::iter::repeat_n(0, np));
                    if self.rank() == 0 && !self.refusal_shown {
                        self.refusal_shown = true;
                        eprintln!("# {} in place: N/A ({e})", op.name());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let (times, wrong) = self.share(&times, &wrong)?;
        let r = self.repeats;
        let checked = |w: u64| (self.args.check_iters > 0).then_some(w);
        // Layout: placement-major, then path, then run.
        let time = |place: usize, path: usize| {
            let at = (place * np + path) * r;
            median(&times[at..at + r])
        };
        let wrong_of = |place: usize, path: usize| checked(wrong[place * np + path]);
        let group = |place: usize| {
            if !ran[place] {
                return Group::not_supported(np > 1);
            }
            Group {
                time_us: time(place, 0),
                wrong: wrong_of(place, 0),
                direct: (np > 1).then(|| table::Direct {
                    time_us: time(place, 1),
                    wrong: wrong_of(place, 1),
                }),
            }
        };
        Ok(Row {
            size: g.size,
            count: g.count,
            out_of_place: group(0),
            in_place: group(1),
        })
    }
}

/// Whether `e` is the CCL adaptor's refusal of an operation's arguments (`UNSUPPORTED`), rather
/// than a failure.
fn refused(e: &(dyn Error + 'static)) -> bool {
    e.downcast_ref::<AdaptorError>()
        .is_some_and(|a| a.status() == ferrocx::abi::Status::UNSUPPORTED)
}

/// The options of this rank's cluster for its CCL adaptor (what `--direct` opens libnccl
/// with, as the adaptor did).
fn ccl_options(
    args: &BenchArgs,
    comm: &Communicator,
) -> Result<Vec<(String, String)>, Box<dyn Error>> {
    let config = crate::load_config(args.config.as_ref())?;
    Ok(config
        .clusters
        .iter()
        .find(|c| c.name == comm.cluster())
        .and_then(|c| c.options_for(&c.ccl))
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default())
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

/// Why this rank's buffers (`need` bytes) cannot be allocated on its device, checked before any
/// is: the device's free memory (`mem_get_info`, where the adaptor has it) against what every
/// rank of this host on the same device needs, since they allocate at the same time (the host
/// device's ranks all share /dev/shm). `None` when they fit, or when the device cannot say.
fn memory_refusal(
    device: &Device,
    devices: &[RankDevice],
    rank: usize,
    need: usize,
) -> Option<String> {
    let (free, total) = device.mem_get_info().ok()?;
    let me = devices.get(rank)?;
    let sharing = devices
        .iter()
        .filter(|d| d.host == me.host && d.device == me.device && d.name == me.name)
        .count()
        .max(1);
    let all = need.saturating_mul(sharing);
    (all > free).then(|| {
        format!(
            "the buffers need {} per rank ({sharing} rank(s) on device {} of {}: {} in all), \
             but the device has {} free of {}: lower -e",
            show_bytes(need as u64),
            me.device,
            me.host,
            show_bytes(all as u64),
            show_bytes(free as u64),
            show_bytes(total as u64)
        )
    })
}

/// `N bytes (X.Y GiB)`.
fn show_bytes(bytes: u64) -> String {
    match [("GiB", 30), ("MiB", 20), ("KiB", 10)]
        .iter()
        .find(|(_, shift)| bytes >= 1u64 << shift)
    {
        Some((unit, shift)) => format!(
            "{bytes} bytes ({:.1} {unit})",
            bytes as f64 / (1u64 << shift) as f64
        ),
        None => format!("{bytes} bytes"),
    }
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
    let dev = comm.device();
    if let Some(why) = super::mode_refusal(
        args,
        comm.cluster(),
        dev.name(),
        dev.graph().is_some(),
        comm.ccl().name(),
    ) {
        // Every rank sees the same configuration and stops; rank 0 says why.
        return Ok(match rank {
            0 => usage_error(&why),
            _ => ExitCode::from(super::USAGE_EXIT),
        });
    }
    if args.overlap {
        return super::overlap::run(args, &comm);
    }
    let ops = args.op.ops();
    let root = args.root as usize;
    if ops.iter().any(|op| op.rooted()) && root >= n {
        return Ok(usage_error(&format!(
            "--root {root} is not a rank of a {n}-rank job"
        )));
    }
    let mut direct = match args.direct {
        true => Some(Direct::connect(&comm, &ccl_options(args, &comm)?)?),
        false => None,
    };
    let repeats = args.repeats() as usize;
    let paths = match &direct {
        Some(_) => vec![Path::Ferrocx, Path::Direct],
        None => vec![Path::Ferrocx],
    };
    let dtype = args.dtype.data_type();
    let es = dtype.size().ok_or("unknown data type")?;
    let redop = args.redop.reduce_op();
    let sweep = sizes(args.min_bytes, args.max_bytes, args.step_factor);
    let (plan, notes) = match plan_sizes(&ops, &sweep, es, n, dtype.name().unwrap_or("?")) {
        Ok(p) => p,
        Err(why) => {
            return Ok(match rank {
                0 => usage_error(&why),
                _ => ExitCode::from(super::USAGE_EXIT),
            })
        }
    };
    if rank == 0 {
        for note in &notes {
            let _ = writeln!(std::io::stderr(), "ferrocx bench: note: {note}");
        }
    }
    let largest = plan
        .iter()
        .flat_map(|p| p.sizes.iter().map(move |&s| p.op.geometry(s, es, n).size))
        .max()
        .unwrap_or(0);
    let device = comm.device().clone();
    let devices = gather_devices(&comm)?;
    let stats_bytes = 8 * 2 * paths.len() * (repeats + 1);
    if let Some(why) = memory_refusal(
        &device,
        &devices,
        rank,
        2 * largest.max(8) + stats_bytes.max(8),
    ) {
        return Err(why.into());
    }
    // `--output-window`: the output from the symmetric heap, registered as a window (every
    // rank alike), which the gathers push into.
    let out = match args.output_window {
        true => {
            let mem = comm.alloc_symmetric(largest.max(8))?;
            // SAFETY: a live symmetric allocation of its size, deregistered (or dropped with
            // its warning) before the memory is freed: `Bench` drops `out` after `b`.
            let window = unsafe {
                comm.register_window(
                    mem.ptr(),
                    mem.size(),
                    WindowFlags::NO_MULTICAST | WindowFlags::PEERS,
                )
            }?;
            Some((window, mem))
        }
        false => None,
    };
    // `--direct-symmetric`: both buffers from NCCL, registered as symmetric windows on the
    // direct communicator (which outlives them: `Bench` drops `a` and `b` before `direct`).
    let (a, b) = match direct.as_mut().filter(|_| args.direct_symmetric) {
        Some(d) => {
            let v = d.symmetric_buffers(largest.max(8), 2)?;
            (
                Buffer::borrowed(&device, v[0]),
                Buffer::borrowed(&device, v[1]),
            )
        }
        None => (
            Buffer::new(&device, largest)?,
            match &out {
                Some((_, mem)) => Buffer::borrowed(&device, mem.ptr()),
                None => Buffer::new(&device, largest)?,
            },
        ),
    };
    let direct_library = direct.as_ref().map(Direct::describe);
    let mut bench = Bench {
        comm: &comm,
        args,
        dtype,
        es,
        redop,
        root,
        a,
        b,
        // Per placement and path: each run's time and the wrong count.
        stats: Buffer::new(&device, stats_bytes)?,
        host: vec![0u8; largest.max(8)],
        fault: std::env::var(ENV_INJECT_FAULT).is_ok_and(|v| v.trim() == rank.to_string()),
        graphs: if args.graph { device.graph() } else { None },
        paths,
        direct,
        repeats,
        refusal_shown: false,
        out,
    };

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
        graph: args.graph,
        repeats: args.repeats(),
        direct: direct_library,
    };
    let report = rank == 0;
    let text = report && !args.json;
    if text {
        say(&table::header(&setup));
    }

    let mut progress = Progress::for_rank(rank);
    let mut results = Vec::new();
    for OpSizes { op, sizes } in plan {
        let pats = bench.patterns(op);
        let mut result = OpResult {
            op,
            bus_factor: op.bus_factor(n),
            rows: Vec::new(),
        };
        if text {
            say(&table::table_head(op, args.direct));
        }
        for (k, &size) in sizes.iter().enumerate() {
            progress.update(op.name(), k, sizes.len());
            let g = op.geometry(size, es, n);
            let row = bench.row(op, &g, &pats)?;
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
    if let Some((window, mem)) = bench.out.take() {
        comm.synchronize()?;
        comm.deregister_window(window)?;
        drop(mem);
    }

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
    let wrong: u64 = results.iter().map(|r| r.wrong() + r.direct_wrong()).sum();
    if wrong > 0 {
        let _ = writeln!(
            std::io::stderr(),
            "ferrocx bench: {wrong} wrong element(s): the results above do not match the reference"
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unsupported_status_counts_as_a_refusal() {
        let refusal: Box<dyn Error> = Box::new(AdaptorError::Failed {
            adaptor: "nccl".into(),
            op: "all_to_all",
            status: ferrocx::abi::Status::UNSUPPORTED,
            message: "in place: absent (use distinct buffers)".into(),
        });
        assert!(refused(&*refusal));
        let failure: Box<dyn Error> = Box::new(AdaptorError::Failed {
            adaptor: "nccl".into(),
            op: "all_to_all",
            status: ferrocx::abi::Status::VENDOR_ERROR,
            message: "unhandled cuda error".into(),
        });
        assert!(!refused(&*failure));
        let other: Box<dyn Error> = "not an adaptor error".into();
        assert!(!refused(&*other));
    }
}
