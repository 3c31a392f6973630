//! `ferrocx bench`: an nccl-tests-style benchmark of the collectives of a configuration.
//!
//! With `-n N` this process is the front-end: it checks the arguments, then runs
//! `ferrocx launch -n N -- ferrocx bench --worker ...` with `FERROCX_CONFIG` set to `--config`,
//! relays rank 0's report and exits with the launcher's code. Without `-n` (or with the hidden
//! `--worker`) it is one rank of a job: a launcher's `RANK`/`WORLD_SIZE`, or the only rank.
//!
//! Every rank times `--iters` back-to-back operations per size and placement (out-of-place,
//! then in-place), checks one result against a reference computed here, and rank 0 prints
//! the table (or `--json`) and writes `--plot`. Any wrong element makes the exit code 1.
//! `--graph` times launches of a graph of the `--iters` operations instead (the device's graph
//! group), and `--direct` times NCCL called directly next to ferrocx in the same run (see
//! `worker` for how runs are timed and paired).

mod data;
mod direct;
mod front;
mod ops;
mod overlap;
mod plot;
mod progress;
mod table;
mod worker;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::ValueEnum;
use ferrocx::abi::{DataType, ReduceOp};

pub use ops::Op;

/// Exit code of invalid arguments (as clap's own usage errors).
const USAGE_EXIT: u8 = 2;

/// Arguments of `ferrocx bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Configuration file; the ranks get it as FERROCX_CONFIG (default: $FERROCX_CONFIG, else
    /// the built-in local configuration).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Start N ranks on this host through `ferrocx launch`. Without it, this process is one
    /// rank of a job a launcher started (RANK/WORLD_SIZE), or the only rank.
    #[arg(short = 'n', long = "nproc", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub nproc: Option<u32>,
    /// The collective to measure, or `all` for each in turn.
    #[arg(long, value_enum, default_value = "all_reduce")]
    pub op: OpArg,
    /// Smallest size in bytes (suffixes K, M, G: powers of 2). A size is the bytes of the op's
    /// largest buffer (all_gather: the output; reduce_scatter: the input).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub min_bytes: u64,
    /// Largest size in bytes (suffixes K, M, G).
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Factor between successive sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(2..))]
    pub step_factor: u64,
    /// Element type.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DtypeArg,
    /// Reduction of the reducing ops (all_reduce, reduce_scatter, reduce).
    #[arg(long, value_enum, default_value = "sum")]
    pub redop: RedopArg,
    /// Root rank of broadcast and reduce.
    #[arg(long, default_value_t = 0)]
    pub root: u32,
    /// Timed iterations per size and placement.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Untimed iterations before the timed ones.
    #[arg(long, default_value_t = 5)]
    pub warmup: u32,
    /// Checked runs per size and placement (0: no check, `#wrong` is N/A).
    #[arg(long, default_value_t = 1)]
    pub check_iters: u32,
    /// Capture the `--iters` operations of each size and placement into one graph (after an
    /// eager warm-up) and time its launches; needs a device adaptor with the graph group
    /// (`ferrocx_device_graph_v1`, e.g. cuda).
    #[arg(long)]
    pub graph: bool,
    /// Also time NCCL called directly (its own communicator, the same buffers, sizes and
    /// stream), interleaved with ferrocx in the same run: the table gains its time, the
    /// ferrocx/direct bus-bandwidth ratio and the latency ferrocx adds. nccl backend only.
    #[arg(long)]
    pub direct: bool,
    /// With --direct: the bench's buffers come from `ncclMemAlloc` and are registered on the
    /// direct communicator as symmetric windows (`ncclCommWindowRegister` with
    /// `NCCL_WIN_COLL_SYMMETRIC`, NCCL >= 2.27), so NCCL called directly may run its symmetric
    /// kernels: the reference at its fastest. ferrocx runs on the same buffers.
    #[arg(long, requires = "direct")]
    pub direct_symmetric: bool,
    /// How all_reduce runs: `ccl` (the CCL's own), `auto` (where the communicator's router
    /// sends it, as a program's call goes), `window` (ferrocx's window algorithm the size
    /// picks: one-shot, two-shot, then the ring), or one of `one-shot`, `two-shot`, `ring`
    /// forced. Other ops always run on the CCL. With --direct, NCCL called directly is timed
    /// next to it in the same run. For all_gather, `p2p` runs `all_gather_p2p` on --streams
    /// streams by the router's route (grouped receive/send per peer on the CCL, or copies out
    /// of the peers' windows where the device has stream memory operations and is not
    /// host-addressable), `window-copies` and `window-reads` force those routes.
    #[arg(long, value_enum, default_value = "ccl")]
    pub algo: AlgoArg,
    /// Streams of `--algo p2p` and of `--overlap`'s pipelined gather.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub streams: u32,
    /// all_gather only: per size, time the all-gather (by --algo), a matmul of the gathered
    /// rows (`--matmul-k` columns) by a `--matmul-k` x `--matmul-n` matrix, and the two
    /// pipelined (`all_gather_p2p`, each slice's matmul on its stream after its event; on the
    /// route --algo window-copies or window-reads forces, else the router's), and print
    /// (t_all_gather + t_matmul) / t_pipelined.
    #[arg(long)]
    pub overlap: bool,
    /// `--overlap`: columns of the gathered rows (rows per rank: the size over 4 bytes, the
    /// ranks and this).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub matmul_k: u32,
    /// `--overlap`: columns of the matmul's output.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub matmul_n: u32,
    /// `--overlap`: cut each peer's slice into this many pieces, each with its own matmul as
    /// soon as it lands (the window-copies route; 1: whole slices).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub pieces: u32,
    /// `--overlap`: where the pipelined matmul reads this rank's own rows: `gathered` (its
    /// slice of the output, after the gather's local copy, on the slice's stream) or `input`
    /// (its input, at once, on the communicator's stream, as a tensor-parallel layer may).
    #[arg(long, value_enum, default_value = "gathered")]
    pub own_rows: OwnRows,
    /// all_gather by `--algo p2p` or `window-copies`, and `--overlap`: the gathered output is
    /// symmetric memory registered as a window on every rank (`Call::output_window`), so the
    /// window-copies route pushes each rank's input straight into it (the router takes that
    /// route on a GPU).
    #[arg(long)]
    pub output_window: bool,
    /// `--overlap`: gather in place (this rank's input is its rows of the gathered output), so
    /// no copy of its own rows into the output takes the device beside the matmul.
    #[arg(long, requires = "overlap")]
    pub in_place: bool,
    /// `--overlap`: after the table, one more pipelined run of each size with an event at
    /// each slice's (or piece's) arrival and after each matmul, printed as microseconds from
    /// the start on rank 0.
    #[arg(long)]
    pub timeline: bool,
    /// Timed runs per size and placement; the median is reported (default: 1, or 5 with
    /// --direct).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeats: Option<u32>,
    /// Print a JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG plot (bus bandwidth and time against size, one series per op).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Run as one rank of the job (what the front-end starts).
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// `--op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OpArg {
    /// All-reduce.
    #[value(name = "all_reduce", alias = "allreduce", alias = "all-reduce")]
    AllReduce,
    /// All-gather.
    #[value(name = "all_gather", alias = "allgather", alias = "all-gather")]
    AllGather,
    /// Reduce-scatter.
    #[value(
        name = "reduce_scatter",
        alias = "reducescatter",
        alias = "reduce-scatter"
    )]
    ReduceScatter,
    /// Broadcast from `--root`.
    #[value(name = "broadcast")]
    Broadcast,
    /// Reduce to `--root`.
    #[value(name = "reduce")]
    Reduce,
    /// All-to-all.
    #[value(name = "all_to_all", alias = "alltoall", alias = "all-to-all")]
    AllToAll,
    /// Each op in turn.
    #[value(name = "all")]
    All,
}

impl OpArg {
    /// The ops to run, in order.
    pub fn ops(self) -> Vec<Op> {
        match self {
            OpArg::AllReduce => vec![Op::AllReduce],
            OpArg::AllGather => vec![Op::AllGather],
            OpArg::ReduceScatter => vec![Op::ReduceScatter],
            OpArg::Broadcast => vec![Op::Broadcast],
            OpArg::Reduce => vec![Op::Reduce],
            OpArg::AllToAll => vec![Op::AllToAll],
            OpArg::All => Op::ALL.to_vec(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            OpArg::All => "all",
            one => one.ops()[0].name(),
        }
    }
}

/// `--own-rows`: where `--overlap`'s pipelined matmul reads this rank's own rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OwnRows {
    /// Its slice of the gathered output, on the slice's stream after the slice's event.
    Gathered,
    /// Its input, at once, on the communicator's stream.
    Input,
}

/// `--algo`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AlgoArg {
    /// The CCL's all-reduce.
    Ccl,
    /// Where the router sends each size.
    Auto,
    /// The window algorithm the size picks.
    Window,
    /// Window one-shot.
    #[value(name = "one-shot", alias = "one_shot")]
    OneShot,
    /// Window two-shot.
    #[value(name = "two-shot", alias = "two_shot")]
    TwoShot,
    /// Window ring.
    Ring,
    /// all_gather as grouped point-to-point transfers on several streams (`all_gather_p2p`,
    /// the route the router picks).
    P2p,
    /// `all_gather_p2p` forced onto copies out of the peers' staging windows by the copy
    /// engines, after stream-ordered waits on signal words (the memops group).
    #[value(name = "window-copies", alias = "window_copies")]
    WindowCopies,
    /// `all_gather_p2p` forced onto reads of the peers' staging windows by host functions
    /// (host-addressable devices).
    #[value(name = "window-reads", alias = "window_reads")]
    WindowReads,
}

impl AlgoArg {
    /// `None` for the CCL or the router's choice, else the window algorithm (`Some(None)`:
    /// by size).
    pub fn window(self) -> Option<Option<ferrocx::window::collectives::WindowAlgo>> {
        use ferrocx::window::collectives::WindowAlgo;
        match self {
            AlgoArg::Ccl
            | AlgoArg::Auto
            | AlgoArg::P2p
            | AlgoArg::WindowCopies
            | AlgoArg::WindowReads => None,
            AlgoArg::Window => Some(None),
            AlgoArg::OneShot => Some(Some(WindowAlgo::OneShot)),
            AlgoArg::TwoShot => Some(Some(WindowAlgo::TwoShot)),
            AlgoArg::Ring => Some(Some(WindowAlgo::Ring)),
        }
    }

    fn name(self) -> &'static str {
        match self {
            AlgoArg::Ccl => "ccl",
            AlgoArg::Auto => "auto",
            AlgoArg::Window => "window",
            AlgoArg::OneShot => "one-shot",
            AlgoArg::TwoShot => "two-shot",
            AlgoArg::Ring => "ring",
            AlgoArg::P2p => "p2p",
            AlgoArg::WindowCopies => "window-copies",
            AlgoArg::WindowReads => "window-reads",
        }
    }

    /// `Some(route)` for the point-to-point all-gathers (`None`: the router's route), `None`
    /// for the others.
    pub fn p2p(self) -> Option<Option<ferrocx::route::Route>> {
        use ferrocx::route::Route;
        match self {
            AlgoArg::P2p => Some(None),
            AlgoArg::WindowCopies => Some(Some(Route::WindowCopies)),
            AlgoArg::WindowReads => Some(Some(Route::WindowReads)),
            _ => None,
        }
    }
}

/// `--dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// IEEE binary32.
    #[value(name = "f32", alias = "float", alias = "float32")]
    F32,
    /// IEEE binary64.
    #[value(name = "f64", alias = "double", alias = "float64")]
    F64,
    /// IEEE binary16.
    #[value(name = "f16", alias = "half", alias = "float16")]
    F16,
    /// bfloat16.
    #[value(name = "bf16", alias = "bfloat16")]
    Bf16,
    /// Signed 8-bit.
    #[value(name = "i8", alias = "int8")]
    I8,
    /// Unsigned 8-bit.
    #[value(name = "u8", alias = "uint8")]
    U8,
    /// Signed 32-bit.
    #[value(name = "i32", alias = "int32", alias = "int")]
    I32,
    /// Unsigned 32-bit.
    #[value(name = "u32", alias = "uint32")]
    U32,
    /// Signed 64-bit.
    #[value(name = "i64", alias = "int64")]
    I64,
    /// Unsigned 64-bit.
    #[value(name = "u64", alias = "uint64")]
    U64,
}

impl DtypeArg {
    /// The ABI's data type.
    pub fn data_type(self) -> DataType {
        match self {
            DtypeArg::F32 => DataType::F32,
            DtypeArg::F64 => DataType::F64,
            DtypeArg::F16 => DataType::F16,
            DtypeArg::Bf16 => DataType::BF16,
            DtypeArg::I8 => DataType::I8,
            DtypeArg::U8 => DataType::U8,
            DtypeArg::I32 => DataType::I32,
            DtypeArg::U32 => DataType::U32,
            DtypeArg::I64 => DataType::I64,
            DtypeArg::U64 => DataType::U64,
        }
    }
}

/// `--redop`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RedopArg {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks.
    Avg,
}

impl RedopArg {
    /// The ABI's reduction op.
    pub fn reduce_op(self) -> ReduceOp {
        match self {
            RedopArg::Sum => ReduceOp::SUM,
            RedopArg::Prod => ReduceOp::PROD,
            RedopArg::Min => ReduceOp::MIN,
            RedopArg::Max => ReduceOp::MAX,
            RedopArg::Avg => ReduceOp::AVG,
        }
    }
}

/// A byte count with an optional K, M or G suffix (powers of 2; a trailing `B` or `iB` is
/// accepted): `8`, `64K`, `1M`, `2GiB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "invalid size {text:?}: expected a byte count with an optional K, M or G suffix \
             (powers of 2), e.g. 8, 64K, 1M"
        )
    };
    let t = text.trim();
    let upper = t.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match body.chars().last() {
        Some('K') => (&body[..body.len() - 1], 10),
        Some('M') => (&body[..body.len() - 1], 20),
        Some('G') => (&body[..body.len() - 1], 30),
        _ => (body, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

/// `bytes` with the largest power-of-2 suffix that divides it: `64K`, `1M`, `12`.
pub fn show_size(bytes: u64) -> String {
    for (shift, suffix) in [(30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// The sizes measured: from `min` to `max`, multiplying by `factor`.
pub fn sizes(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut s = min;
    while s <= max && s > 0 {
        out.push(s);
        match s.checked_mul(factor) {
            Some(next) if factor > 1 => s = next,
            _ => break,
        }
    }
    out
}

/// The sizes of one op, and the notes about the ones left out.
#[derive(Debug, PartialEq, Eq)]
pub struct OpSizes {
    /// The op.
    pub op: Op,
    /// Its sizes: those of the sweep that hold at least one element (per rank, for the ops
    /// that split a buffer among ranks).
    pub sizes: Vec<u64>,
}

/// The sizes each op of `ops` runs at over `n` ranks with elements of `es` bytes: a size that
/// holds no element of the op (`-b 7` for all_gather of f32 on 2 ranks: 3 elements, none per
/// rank) would run on nothing and check nothing, so it is left out with a note; an op left
/// with no size at all is an error naming the smallest size that works.
pub fn plan_sizes(
    ops: &[Op],
    sweep: &[u64],
    es: usize,
    n: usize,
    dtype: &str,
) -> Result<(Vec<OpSizes>, Vec<String>), String> {
    let mut plan = Vec::new();
    let mut notes = Vec::new();
    for &op in ops {
        let (kept, dropped): (Vec<u64>, Vec<u64>) = sweep
            .iter()
            .partition(|&&s| op.geometry(s, es, n).count > 0);
        // The smallest size with one element (per rank where the op splits the buffer).
        let least = (1..=n as u64 * es as u64)
            .find(|&s| op.geometry(s, es, n).count > 0)
            .unwrap_or(es as u64);
        if kept.is_empty() {
            return Err(format!(
                "no size from -b {} to -e {} holds an element of {} over {n} rank(s) of {dtype} \
                 (it needs at least {least} bytes): raise -e to {least} or more",
                sweep.first().map_or("?".into(), |&s| show_size(s)),
                sweep.last().map_or("?".into(), |&s| show_size(s)),
                op.name()
            ));
        }
        if !dropped.is_empty() {
            let shown: Vec<String> = dropped.iter().map(|&s| show_size(s)).collect();
            notes.push(format!(
                "{} skips size(s) {}: below {least} bytes they hold no element over {n} \
                 rank(s) of {dtype}",
                op.name(),
                shown.join(", ")
            ));
        }
        plan.push(OpSizes { op, sizes: kept });
    }
    Ok((plan, notes))
}

impl BenchArgs {
    /// Errors the arguments have whatever the job (checked before anything is launched).
    fn validate(&self) -> Result<(), String> {
        if self.min_bytes == 0 {
            return Err("-b 0: the smallest size must be at least 1 byte".into());
        }
        if self.min_bytes > self.max_bytes {
            return Err(format!(
                "-b {} is larger than -e {}: the smallest size must not exceed the largest",
                show_size(self.min_bytes),
                show_size(self.max_bytes)
            ));
        }
        if usize::try_from(self.max_bytes).is_err() {
            return Err(format!("-e {}: too large for this machine", self.max_bytes));
        }
        let gather_only = self.op == OpArg::AllGather;
        if self.algo.p2p().is_some() && !gather_only {
            return Err(format!(
                "--algo {} runs all_gather only, not --op {}: add --op all_gather",
                self.algo.name(),
                self.op.name()
            ));
        }
        if self.graph && matches!(self.algo, AlgoArg::WindowCopies | AlgoArg::WindowReads) {
            return Err(format!(
                "--algo {} cannot run under --graph: each call numbers its round when it is \
                 enqueued, and a graph's launches would replay the first call's rounds; drop \
                 --graph (--algo p2p under --graph runs on the CCL)",
                self.algo.name()
            ));
        }
        if self.overlap {
            if !gather_only {
                return Err(format!(
                    "--overlap times all_gather with a matmul, not --op {}: add --op all_gather",
                    self.op.name()
                ));
            }
            if !matches!(self.algo, AlgoArg::Ccl | AlgoArg::Auto) && self.algo.p2p().is_none() {
                return Err(format!(
                    "--overlap times the all-gather by --algo ccl, auto, p2p, window-copies or \
                     window-reads, not {}",
                    self.algo.name()
                ));
            }
            if self.dtype != DtypeArg::F32 {
                return Err("--overlap multiplies f32: drop --dtype or pass --dtype f32".into());
            }
            if self.graph || self.direct {
                return Err("--overlap runs without --graph and --direct".into());
            }
        } else if self.output_window && !(gather_only && self.algo.p2p().is_some()) {
            return Err(
                "--output-window belongs to all_gather by --algo p2p, window-copies or \
                 window-reads, or to --overlap: add --op all_gather and one of them"
                    .into(),
            );
        } else if self.timeline || self.own_rows != OwnRows::Gathered {
            return Err("--timeline and --own-rows belong to --overlap: add --overlap".into());
        }
        Ok(())
    }

    /// Whether `--root` is needed (broadcast or reduce is among the ops).
    fn rooted(&self) -> bool {
        self.op.ops().iter().any(|op| op.rooted())
    }

    /// The arguments the front-end gives each rank (after `bench --worker`).
    fn worker_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |k: &str, v: String| {
            a.push(k.into());
            a.push(v.into());
        };
        push("--op", self.op.name().into());
        push("--minbytes", self.min_bytes.to_string());
        push("--maxbytes", self.max_bytes.to_string());
        push("--stepfactor", self.step_factor.to_string());
        push("--dtype", self.dtype_name().into());
        push("--redop", redop_name(self.redop.reduce_op()).into());
        push("--root", self.root.to_string());
        push("--iters", self.iters.to_string());
        push("--warmup", self.warmup.to_string());
        push("--check-iters", self.check_iters.to_string());
        push("--repeats", self.repeats().to_string());
        push("--algo", self.algo.name().into());
        push("--streams", self.streams.to_string());
        push("--matmul-k", self.matmul_k.to_string());
        push("--matmul-n", self.matmul_n.to_string());
        push("--pieces", self.pieces.to_string());
        if self.own_rows == OwnRows::Input {
            push("--own-rows", "input".into());
        }
        if self.timeline {
            a.push("--timeline".into());
        }
        if self.output_window {
            a.push("--output-window".into());
        }
        if self.in_place {
            a.push("--in-place".into());
        }
        if self.overlap {
            a.push("--overlap".into());
        }
        if self.graph {
            a.push("--graph".into());
        }
        if self.direct {
            a.push("--direct".into());
        }
        if self.direct_symmetric {
            a.push("--direct-symmetric".into());
        }
        if self.json {
            a.push("--json".into());
        }
        if let Some(p) = &self.plot {
            a.push("--plot".into());
            a.push(p.clone().into_os_string());
        }
        a
    }

    fn dtype_name(&self) -> &'static str {
        self.dtype.data_type().name().unwrap_or("?")
    }

    /// Timed runs per size and placement (`--repeats`, else 5 with `--direct`, else 1).
    pub fn repeats(&self) -> u32 {
        self.repeats.unwrap_or(if self.direct { 5 } else { 1 })
    }
}

/// Why `--graph` or `--direct` cannot run on cluster `cluster`, whose device adaptor is `device`
/// (`has_graph`: it exports the graph group) and whose CCL adaptor is `ccl`; `None` when they
/// can (or are not asked for).
pub fn mode_refusal(
    args: &BenchArgs,
    cluster: &str,
    device: &str,
    has_graph: bool,
    ccl: &str,
) -> Option<String> {
    if args.graph && !has_graph {
        return Some(format!(
            "--graph needs a device adaptor that captures operations into graphs (the graph \
             group, ferrocx_device_graph_v1), and the device adaptor {device:?} of cluster \
             {cluster:?} has none; run without --graph, or on a device that has it (cuda)"
        ));
    }
    if args.direct && ccl != "nccl" {
        return Some(format!(
            "--direct times NCCL called directly next to ferrocx, but cluster {cluster:?} uses \
             the CCL adaptor {ccl:?}, not \"nccl\"; run without --direct, or with a \
             configuration whose cluster has ccl = \"nccl\" (configs/nccl.toml)"
        ));
    }
    if args.direct && !direct::AVAILABLE {
        return Some(direct::UNAVAILABLE.to_string());
    }
    None
}

/// [`mode_refusal`] for every cluster of `config` that ranks `0..n` fall in, as the ranks would
/// select it (a cluster whose adaptors are not available is left to the ranks to report).
fn check_modes(args: &BenchArgs, config: &ferrocx::config::Config, n: u32) -> Option<String> {
    if !args.graph && !args.direct {
        return None;
    }
    let registry = ferrocx::registry::Registry::discover(&config.runtime);
    config
        .clusters
        .iter()
        .enumerate()
        .filter(|(_, c)| (0..n as usize).any(|r| c.ranks.contains(r)))
        .find_map(|(i, c)| {
            let sel = registry.select(config, i).ok()?;
            mode_refusal(
                args,
                &c.name,
                sel.device.name(),
                sel.device.graph().is_some(),
                sel.ccl.name(),
            )
        })
}

/// The short name of a reduction op.
pub fn redop_name(op: ReduceOp) -> &'static str {
    op.name().unwrap_or("?")
}

/// Prints a usage error and gives the usage exit code.
fn usage_error(msg: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "ferrocx bench: {msg}");
    ExitCode::from(USAGE_EXIT)
}

/// Runs `ferrocx bench`.
pub fn run(args: BenchArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if let Err(msg) = args.validate() {
        return Ok(usage_error(&msg));
    }
    match args.nproc {
        Some(n) if !args.worker => {
            if args.rooted() && args.root >= n {
                return Ok(usage_error(&format!(
                    "--root {} is not a rank of a {n}-rank job",
                    args.root
                )));
            }
            let config = match crate::load_config(args.config.as_ref()) {
                Ok(c) => c,
                Err(e) => return Ok(usage_error(&e.to_string())),
            };
            if let Some(why) = check_modes(&args, &config, n) {
                return Ok(usage_error(&why));
            }
            let es = args.dtype.data_type().size().unwrap_or(1);
            let sweep = sizes(args.min_bytes, args.max_bytes, args.step_factor);
            if let Err(why) = plan_sizes(&args.op.ops(), &sweep, es, n as usize, args.dtype_name())
            {
                return Ok(usage_error(&why));
            }
            front::run(&args, n)
        }
        _ => worker::run(&args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_suffixes_in_powers_of_two() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("4KiB"), Ok(4 << 10));
        assert_eq!(parse_size("16B"), Ok(16));
        for bad in ["", "K", "1Q", "-1", "1.5M", "M1", "1 M"] {
            let e = parse_size(bad).expect_err(bad);
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn a_size_that_holds_no_element_is_skipped_and_an_op_with_none_is_refused() {
        // -b 7 -e 7 --op all on 2 ranks of f32: all_gather, reduce_scatter and all_to_all get
        // 3 elements, none per rank.
        let e = plan_sizes(&Op::ALL, &[7], 4, 2, "f32").unwrap_err();
        assert_eq!(
            e,
            "no size from -b 7 to -e 7 holds an element of all_gather over 2 rank(s) of f32 (it \
             needs at least 8 bytes): raise -e to 8 or more"
        );
        let (plan, notes) = plan_sizes(&[Op::AllReduce], &[7], 4, 2, "f32").unwrap();
        assert_eq!(
            plan,
            vec![OpSizes {
                op: Op::AllReduce,
                sizes: vec![7]
            }]
        );
        assert!(notes.is_empty());
        // The default -b 8 on 4 ranks: all_to_all starts at 16 bytes, with a note.
        let (plan, notes) =
            plan_sizes(&[Op::AllToAll, Op::Broadcast], &[8, 16, 32], 4, 4, "f32").unwrap();
        assert_eq!(plan[0].sizes, vec![16, 32]);
        assert_eq!(plan[1].sizes, vec![8, 16, 32]);
        assert_eq!(
            notes,
            vec!["all_to_all skips size(s) 8: below 16 bytes they hold no element over 4 rank(s) of f32"]
        );
        // Every kept size has elements for every op.
        for op in Op::ALL {
            for n in 1..9 {
                if let Ok((plan, _)) = plan_sizes(&[op], &sizes(1, 1 << 10, 2), 8, n, "f64") {
                    assert!(plan[0]
                        .sizes
                        .iter()
                        .all(|&s| op.geometry(s, 8, n).count > 0));
                }
            }
        }
    }

    #[test]
    fn sizes_run_from_min_to_max_by_the_factor() {
        assert_eq!(
            sizes(8, 64 << 10, 4),
            vec![8, 32, 128, 512, 2048, 8192, 32768]
        );
        assert_eq!(sizes(8, 8, 2), vec![8]);
        assert_eq!(sizes(3, 20, 3), vec![3, 9]);
        assert_eq!(sizes(1 << 62, u64::MAX, 4), vec![1 << 62]);
        assert_eq!(show_size(64 << 10), "64K");
        assert_eq!(show_size(3 << 20), "3M");
        assert_eq!(show_size(1000), "1000");
    }
}
