//! Jobs across clusters: every collective of a [`Communicator`](crate::comm::Communicator)
//! whose ranks span several `[[cluster]]`s, each with its own device and CCL adaptors.
//!
//! Each rank holds its cluster's communicator (its CCL over the cluster's ranks, cluster-local
//! rank = its position in the cluster's rank list) and the **bridge** between clusters, which
//! `[bridge] ccl` chooses when the communicator is made (the same choice on every rank: each
//! rank's host identity goes through the job's store): `host`, or `auto` with every rank on
//! one host, takes shared memory (below); `mpi`, or `auto` across hosts, takes MPI ([`mpi`]:
//! every collective across clusters is one MPI collective over the whole job, through the
//! `mpi` CCL adaptor).
//!
//! The shared-memory bridge ([`bridge`]) is host memory shared by every rank of the job (a
//! POSIX shared-memory segment), with staging slots and monotonic signal words per rank. Each
//! call runs a **plan**:
//!
//! ```text
//! all_reduce, chunk k of the message (E elements, the same cut in every cluster)
//!
//!   cluster stream   RS(k) ─ev─┐        RS(k+1) ─ev─┐      ┌─► AG(k)   RS(k+2) ...
//!   (the CCL's)                ▼                    ▼      │ ev
//!   bridge stream          [bridge(k)]──────────────[bridge(k+1)] ...
//!                          publish my share of chunk k in staging slot k % depth,
//!                          reduce each piece with its owners in the other clusters,
//!                          signal "done" to the slots read
//!
//!   RS  = reduce-scatter inside the cluster (its CCL): rank i gets share i of the chunk
//!   AG  = all-gather inside the cluster: every rank gets the whole reduced chunk
//! ```
//!
//! Every rank carries the cross-cluster traffic of its own share: no leader. Shares of clusters
//! of different sizes are cut into pieces with one owner per cluster ([`plan`] draws the split).
//! While chunk k crosses the bridge, chunk k+1 is reduced in the cluster (up to `depth` chunks
//! in flight, `[bridge] depth`; `chunk_bytes` per rank and slot).
//!
//! **The flat and hybrid plans.** A cluster on the host device gains nothing from reducing
//! inside first (its CCL moves the same host memory the bridge does), nor does a cluster of
//! one rank: their ranks take part **flat** ([`plan::Roles`]). Each chunk (a slot's
//! elements) is then two epochs:
//!
//! ```text
//!   step A  flat rank: publish the whole chunk; reduce its flat share (1/F of the chunk, F
//!           flat ranks) from every flat rank's slot and, per cluster through its CCL, the
//!           owner's reduced share, in rank order
//!           rank through its cluster: after RS(k), publish its share
//!   step B  flat rank: publish its reduced share; copy every other flat rank's
//!           rank through its cluster: copy the pieces of its share from the flat ranks'
//!           slots (where they were reduced), then AG(k)
//! ```
//!
//! Each element is reduced once, by one flat rank, so every rank gets the same bits.
//!
//! **Inputs read in place.** Where every flat rank is on the host device (`Roles::direct`)
//! and the pipeline has two slots or more, a flat rank does not publish its chunk in step A:
//! its input's IPC handle goes with the call's descriptor (host `DEVICE`/`PINNED` memory is
//! a shared-memory segment), the other flat ranks map it once (module `inputs`) and reduce from it
//! where it lies, and step A writes the reduced share straight into the rank's slot of step B
//! (and its output), so step B publishes nothing either. A full copy of every input per call
//! is gone: on the 2-core development VM a 4-rank job of two host clusters all-reduces 4 MiB
//! in 1.32 ms against 2.04 with the copies. An input the device cannot export (C-heap memory)
//! is published as before, rank by rank (`FERROCX_BRIDGE_DIRECT=0`: every rank publishes,
//! for comparisons; the same value must reach every rank).
//!
//! When every cluster is flat this is the **flat plan** (every rank reduces 1/W and copies the
//! rest; run on the caller's stream, one step after the other). Otherwise the plan through the
//! clusters above, unless `FERROCX_BRIDGE_PLAN=hybrid` asks for the **hybrid plan**: the host
//! clusters' ranks flat, skipping their two in-cluster calls per chunk, and the GPU clusters
//! keeping RS → bridge → AG, pipelined `depth` chunks deep; a GPU rank's step A (publish, on
//! the bridge stream) and step B (collect its pieces, on the **collect stream** with a proxy
//! of its own) share chunk k's staging slot (k % depth), so the next chunk's step A does not
//! wait behind a step B that waits for the flat ranks' results; the GPU ranks do no reduction
//! on the host. Opt-in: on 2 H200 + 4 CPU ranks it has been as fast as the plan through the
//! clusters, not clearly faster (docs/perf.md). `FERROCX_BRIDGE_PLAN=clusters|flat|hybrid|
//! hybrid=a,b` forces one (`hybrid=a,b`: clusters `a` and `b` through their CCL, the others
//! flat), for comparisons; the same value must reach every rank.
//!
//! (Issuing a GPU rank's step B on the bridge stream after the next chunk's step A, one
//! proxy for both, stopped jobs on 2 GPUs: the host thread hands step B to the proxy only
//! after it has enqueued the next chunk's NCCL reduce-scatter, and the flat ranks waited for
//! that step's reads while the proxy had nothing to run. Every step a peer waits for is handed
//! over before the next chunk's in-cluster calls are enqueued.)
//!
//! **Small all-reduces** (up to 64 KiB per rank, and a slot) skip the plan: one step on the
//! caller's stream, in which every rank publishes its whole input and reduces every rank's in
//! rank order (the same bits everywhere), the descriptor check included. No in-cluster step,
//! no hop between streams.
//!
//! **Ordering:** the calling thread only enqueues. The stages run on the communicator's own
//! streams (the cluster stream for the CCL, the bridge stream for the bridge steps, a send and
//! a receive stream for point-to-point), ordered by `event_record` + `stream_wait_event` with
//! events from a per-communicator [`pool`] (an event is taken again only once its record
//! completed). A call on another stream than the previous call's first orders its stream after
//! that one (steps run in call order on every rank). On a device whose memory the host
//! addresses (`HOST_ADDRESSABLE`, the host device) a bridge step is a host function on the
//! stream and reads and writes the device buffers directly. On any other device (CUDA) the
//! step's sources are copied device → staging on the communicator's **copy stream** before it,
//! and its results staging → device after it, each hand-over an event:
//!
//! ```text
//!   cluster stream  RS(k) ─ev─┐                              ┌─► AG(k)
//!   copy stream               D→H(k) ─ev─┐        ┌─► H→D(k) ─ev
//!   bridge stream                        bridge(k) ─ev
//! ```
//!
//! and the step itself runs on the communicator's **proxy thread** (module `proxy`) where the device
//! has the stream-memory-operations group (`ferrocx_device_memops_v1`: CUDA's
//! `cuStreamWriteValue32` / `cuStreamWaitValue32`): the bridge stream writes a sequence number
//! to a pinned word, the proxy (which sleeps until the host thread hands it the step) sees it,
//! runs the step and writes the acknowledgement the stream waits for — no host function, no
//! driver callback thread. A device without the group gets the documented fallback: the step
//! as a host function on the bridge stream (`launch_host_func`; `FERROCX_BRIDGE_PROXY=0`
//! chooses it on any device, for comparisons).
//!
//! `FERROCX_BRIDGE_TRACE=1` prints a line per step phase (and per in-cluster stage, from host
//! functions on the cluster stream), `steps` the step phases only, `ring` keeps the latest
//! phases (and the proxies' waits) in memory and prints them when a wait on a peer gives up
//! (module `ring`): the lines on stderr slow the steps enough to hide a race that the ring shows.
//!
//! A step's copies and reductions are cut into parts of 64 KiB or more and shared among the
//! process's bridge threads ([`workers`]: the cores this process may use divided by the job's
//! ranks, at most 8, or `FERROCX_BRIDGE_THREADS`): a rank alone in its cluster carries its
//! cluster's whole share across the bridge.
//!
//! The staging is host memory (pinned where the device allocates `MemKind::PINNED`), one slot
//! per pipeline slot plus the p2p and all_to_allv slots, made once per communicator; a slot is
//! written again only after the copy stream has waited for the step that used it.
//! Streams, events, staging, the proxy and its words are made once per communicator.
//!
//! **The other collectives** run over the bridge alone, every rank reading what it needs from
//! the others' slots, chunk by chunk through the same epochs: broadcast (root in any cluster),
//! reduce, gather, scatter, all_gather, reduce_scatter, all_to_all; all_to_allv and send/recv
//! between ranks of different clusters go through per-pair channels (a sub-slot per
//! destination in the sender's p2p slot). Send/recv inside a cluster take its CCL. Sends run
//! on the send stream and receives on the receive stream; inside a group
//! ([`Hetero::group_start`]) neither hands the caller's stream back until the group ends, so a
//! receive never waits for a send of the same group.
//!
//! **Checks and failures:** each collective's first step publishes a descriptor (collective,
//! count, dtype, op, root) and compares it with every rank's, so a count or dtype that differs across
//! clusters fails on every rank with the same error naming both ranks. A wait on a peer that
//! does not arrive within `timeout_ms` (or whose process is gone) fails naming the rank and its
//! cluster, and records the failure in the bridge so every other rank fails with it too. A
//! failed step breaks the communicator's bridge: later steps do nothing and report it. The
//! earliest failed step's epoch is kept in the bridge too: the failing rank's in-cluster
//! stages go on with its share unreduced, so a rank of its cluster whose own steps all ran
//! fails at its next `synchronize` if it took part in that epoch, instead of reporting wrong
//! values as done (a failure in an epoch it has not reached is left to that call).

pub mod bridge;
mod enqueue;
mod inputs;
pub mod mpi;
pub mod plan;
pub mod pool;
mod proxy;
pub mod reduce;
mod ring;
pub mod topo;
mod words;
pub mod workers;

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::abi::{
    Capabilities, Comm, DataType, DevicePtr, Event, MemKind, ReduceOp, Stream, WAIT_VALUE_GEQ,
};
use crate::adaptor::{AdaptorError, Ccl, Device};
use crate::config::{BridgeCcl, BridgeConfig};
use crate::route::Collective;
use crate::window;

use bridge::{Bridge, Descriptor};
use enqueue::Enqueuer;
use plan::{AllReducePlan, HybridPlan};
use pool::EventPool;
use proxy::Proxy;
use topo::Topology;

/// A bridge step on the bridge stream: its staged results' copies back to the device, and the
/// mark of its end ([`HeteroCore::issue_step`]).
struct Issued {
    back: Vec<Move>,
    done: Event,
}

/// Why a cross-cluster call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HeteroError {
    /// A rank did not arrive within the timeout.
    #[error("{} (cluster {cluster:?}) did not arrive at {what} within {} ms", rank_word(*rank), waited.as_millis())]
    Absent {
        /// The global rank.
        rank: usize,
        /// Its cluster.
        cluster: String,
        /// What it did not arrive at.
        what: String,
        /// How long this rank waited.
        waited: Duration,
    },
    /// A rank's process is gone.
    #[error("{} (cluster {cluster:?}) died before {what}", rank_word(*rank))]
    Died {
        /// The global rank.
        rank: usize,
        /// Its cluster.
        cluster: String,
        /// What it did not arrive at.
        what: String,
    },
    /// Another rank found a failure (of `rank`) first.
    #[error("{message}")]
    PeerFailed {
        /// The rank the failure is about.
        rank: usize,
        /// Its cluster.
        cluster: String,
        /// The failure as that rank reported it.
        message: String,
    },
    /// A stage of a call failed on this rank (`rank`): every other rank fails with the same
    /// text (recorded in the bridge).
    #[error("{} (cluster {cluster:?}) failed at {stage}: {message}", rank_word(*rank))]
    Stage {
        /// The global rank.
        rank: usize,
        /// Its cluster.
        cluster: String,
        /// Where it failed (`the bridge step of an all_reduce`).
        stage: String,
        /// Why.
        message: String,
    },
    /// Ranks called different collectives, counts or dtypes.
    #[error("{0}")]
    Mismatch(String),
    /// The bridge could not be made or used.
    #[error("bridge: {0}")]
    Bridge(String),
    /// The call cannot run across clusters (type, op, device).
    #[error("{0}")]
    Unsupported(String),
    /// A device or CCL call failed.
    #[error(transparent)]
    Adaptor(#[from] AdaptorError),
}

fn rank_word(r: usize) -> String {
    format!("rank {r}")
}

/// What a host function of the bridge shares with the communicator: the bridge and the first
/// failure.
struct Shared {
    bridge: Arc<Bridge>,
    failed: AtomicBool,
    error: Mutex<Option<HeteroError>>,
}

impl Shared {
    fn fail(&self, e: HeteroError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            tracing::error!("{e}");
            // A failure of this rank's own is named to every other rank through the bridge
            // (failures about a peer are recorded by the wait that found them).
            if let HeteroError::Stage { rank, .. } = &e {
                self.bridge.record_failure(*rank, &e);
            }
            *slot = Some(e);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn check(&self) -> Result<(), HeteroError> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let e = self.error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Err(e.unwrap_or_else(|| HeteroError::Bridge("an earlier step failed".into())))
    }
}

/// A host function queued on a stream.
type Work = Box<dyn FnOnce(&Bridge) -> Result<(), HeteroError> + Send>;

struct Job {
    shared: Arc<Shared>,
    work: Work,
}

impl Job {
    /// Runs the work unless an earlier step failed; records its failure (or panic).
    fn execute(self) {
        let Job { shared, work } = self;
        if shared.failed.load(Ordering::Acquire) {
            return;
        }
        let bridge = shared.bridge.clone();
        match catch_unwind(AssertUnwindSafe(|| work(&bridge))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => shared.fail(e),
            Err(_) => shared.fail(HeteroError::Bridge("a bridge step panicked".into())),
        }
    }
}

/// Runs a [`Job`] boxed by [`HeteroCore::host`], on the stream's thread.
unsafe extern "C" fn run_job(user: *mut c_void) {
    // SAFETY: `user` is the box `Hetero::host` leaked; the adaptor calls this once.
    let job = unsafe { Box::from_raw(user.cast::<Job>()) };
    job.execute();
}

/// The streams of the plans.
struct Streams {
    cluster: Stream,
    bridge: Stream,
    send: Stream,
    recv: Stream,
    /// The copy stream between device buffers and staging (a device the host cannot address).
    copy: Option<Stream>,
    /// The collect stream (a device the host cannot address): the hybrid plan's steps B of a
    /// rank through its cluster, which wait for the flat ranks' results, beside the bridge
    /// stream's steps A.
    collect: Option<Stream>,
}

impl Streams {
    fn all(&self) -> impl Iterator<Item = Stream> + '_ {
        [self.cluster, self.bridge, self.send, self.recv]
            .into_iter()
            .chain(self.copy)
            .chain(self.collect)
    }
}

/// A stage of the all-reduce plan, where a test injects a failure
/// ([`HeteroCore::inject_failure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The reduce-scatter inside the cluster (a copy in a one-rank cluster).
    Cluster,
    /// The copy of this rank's share from the device into staging (where the device's
    /// memory is not host-addressable; at the same point of the plan otherwise).
    Staging,
    /// The bridge step (a host function on the bridge stream).
    Bridge,
    /// The all-gather inside the cluster.
    Gather,
}

impl Stage {
    /// Every stage, in plan order.
    pub const ALL: [Stage; 4] = [Stage::Cluster, Stage::Staging, Stage::Bridge, Stage::Gather];

    /// `the in-cluster step of an all_reduce`, ….
    pub fn name(self) -> &'static str {
        match self {
            Stage::Cluster => "the in-cluster step of an all_reduce",
            Stage::Staging => "the staging copy of an all_reduce",
            Stage::Bridge => "the bridge step of an all_reduce",
            Stage::Gather => "the gather of an all_reduce",
        }
    }
}

/// Host memory between a device the host cannot address and the bridge: `slots` slots of
/// `slot_bytes` (the pipeline's `depth`, then the p2p send and receive slots and the
/// all_to_allv out and in slots), pinned where the device allocates `MemKind::PINNED`.
struct Staging {
    base: u64,
    slot_bytes: usize,
    /// The device's pinned allocation, or host memory of our own.
    memory: StagingMemory,
}

enum StagingMemory {
    Pinned,
    Host(#[allow(dead_code)] Vec<u64>),
}

impl Staging {
    /// Allocates `slots` slots of `slot_bytes` (a multiple of 8).
    fn new(device: &Device, slots: usize, slot_bytes: usize) -> Staging {
        let bytes = slots * slot_bytes;
        match device.mem_alloc(bytes, MemKind::PINNED) {
            Ok(p) => Staging {
                base: p.0,
                slot_bytes,
                memory: StagingMemory::Pinned,
            },
            Err(e) => {
                tracing::debug!("staging in pageable host memory: {e}");
                let v = vec![0u64; bytes.div_ceil(8)];
                Staging {
                    base: v.as_ptr() as u64,
                    slot_bytes,
                    memory: StagingMemory::Host(v),
                }
            }
        }
    }

    fn slot(&self, s: usize) -> u64 {
        self.base + (s * self.slot_bytes) as u64
    }

    fn free(&mut self, device: &Device) {
        if let StagingMemory::Pinned = self.memory {
            // SAFETY: our pinned allocation, freed once (the streams using it are drained).
            let _ = unsafe { device.mem_free(DevicePtr(self.base), MemKind::PINNED) };
            self.memory = StagingMemory::Host(Vec::new());
        }
    }
}

/// A copy between a device buffer and staging: (destination, source, bytes).
type Move = (u64, u64, usize);

/// What the host thread tracks between calls (under one lock): the next epoch, the reads each
/// slot of this rank must see before it is written again, the p2p sequence numbers, and the
/// plan cache.
struct State {
    epoch: u64,
    calls: u64,
    /// Per slot: reads of this rank's slot expected so far.
    expect: Vec<u64>,
    /// Chunks sent to each rank / received from each rank over the p2p channels.
    sent: Vec<u64>,
    received: Vec<u64>,
    plans: HashMap<(usize, DataType), Arc<AllReducePlan>>,
    /// The flat and hybrid plans.
    hybrid: HashMap<(usize, DataType), Arc<HybridPlan>>,
    /// Type and reduction of every all-reduce plan the caller's thread has enqueued in full
    /// where it would have gone to the enqueuer thread (see [`HeteroCore::enqueued_here_once`]).
    warm: HashSet<(DataType, ReduceOp)>,
    /// The caller's stream of the latest collective: it waits for everything that call
    /// enqueued, so the next call, if on another stream, starts after it.
    last: Option<Stream>,
}

/// Tasks handed to the enqueuer thread and tasks it has run: a call that enqueues on the
/// communicator's streams itself first waits until the enqueuer has enqueued everything
/// handed to it before (stream work stays in call order).
#[derive(Default)]
struct Backlog {
    counts: Mutex<(u64, u64)>,
    ran: std::sync::Condvar,
}

impl Backlog {
    fn handed(&self) {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
    }

    fn ran_one(&self) {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).1 += 1;
        self.ran.notify_all();
    }

    /// Waits until every task handed over has run (a host-side wait on enqueue calls, not on
    /// the device).
    fn flush(&self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        while c.1 < c.0 {
            c = self.ran.wait(c).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The cross-cluster side of one communicator: its bridge, streams, pools and plans (shared
/// with the enqueuer thread; [`Hetero`] is the communicator's handle on it).
pub struct HeteroCore {
    topo: Topology,
    device: Device,
    ccl: Ccl,
    comm: Comm,
    shared: Arc<Shared>,
    streams: Streams,
    events: Mutex<EventPool>,
    state: Mutex<State>,
    depth: usize,
    slot_bytes: usize,
    /// Staging between the device and the bridge (`None` on a host-addressable device).
    staging: Option<Staging>,
    /// A failure the next all_reduce injects (tests).
    inject: Mutex<Option<Stage>>,
    /// Whether the next all_reduce through the clusters holds its second chunk's bridge step
    /// (tests: [`HeteroCore::inject_hold`]).
    hold: AtomicBool,
    /// The thread that runs the bridge steps of a staged device with stream memory
    /// operations (`None`: steps are host functions on the streams).
    proxy: Option<Proxy>,
    /// The collect stream's proxy (see [`Streams`]; `None` where `proxy` is).
    collector: Option<Proxy>,
    /// What the enqueuer thread has yet to enqueue.
    backlog: Backlog,
    /// Who takes part in all-reduces past one step how: flat or through its cluster (the flat
    /// and hybrid plans; `None`: every rank through its cluster).
    roles: Option<plan::Roles>,
    /// Open groups, per thread ([`HeteroCore::group_start`]).
    groups: Mutex<HashMap<std::thread::ThreadId, Group>>,
    /// The other flat ranks' inputs mapped here ([`inputs`]).
    imports: Arc<inputs::Imports>,
}

/// A thread's open group of sends and receives across clusters: how deep it nests, and the
/// hand-backs from the send and receive streams to the callers' streams it defers to its end.
#[derive(Default)]
struct Group {
    depth: usize,
    /// `(from, to)`: `to` (a caller's stream) waits for `from` at the group's end.
    deferred: Vec<(Stream, Stream)>,
}

/// One copy or reduction of a bridge step: `dst` gets `n` elements (bytes for a copy) read
/// from `srcs` (rank, byte offset in that rank's slot).
struct Out {
    dst: u64,
    n: usize,
    srcs: Vec<(usize, usize)>,
    reduce: Option<(DataType, ReduceOp, usize)>,
}

/// How an all-reduce's stages hang on the caller's stream: by events (enqueued by the caller's
/// thread), or by two words of the enqueuer's (enqueued by the enqueuer thread: the caller's
/// stream writes `start = seq` and waits for `end >= seq`).
#[derive(Clone, Copy)]
enum Link {
    Stream(Stream),
    Words { start: usize, end: usize, seq: u32 },
}

/// The plan a rank through its cluster runs (its in-cluster reduce-scatter and all-gather
/// around the bridge).
#[derive(Clone)]
enum ThroughPlan {
    /// The plan through the clusters: one bridge step per chunk, in which each rank reduces
    /// its share with its owners in the other clusters.
    Clusters(Arc<AllReducePlan>),
    /// The hybrid plan: two epochs per chunk, taken as one step (publish the share in the
    /// first, copy its pieces back from the flat ranks that reduced them in the second).
    Hybrid(Arc<HybridPlan>),
}

impl ThroughPlan {
    fn chunks(&self) -> usize {
        match self {
            ThroughPlan::Clusters(p) => p.chunks,
            ThroughPlan::Hybrid(p) => p.chunks,
        }
    }

    /// Epochs of the call.
    fn epochs(&self) -> usize {
        match self {
            ThroughPlan::Clusters(p) => p.chunks,
            ThroughPlan::Hybrid(p) => 2 * p.chunks,
        }
    }

    /// Reads of this rank's slot in epoch `j` of the call.
    fn readers(&self, j: usize) -> u64 {
        match self {
            ThroughPlan::Clusters(p) => p.chunk(j).1.readers,
            ThroughPlan::Hybrid(p) => p.readers(j),
        }
    }

    /// Chunk `k`'s first element and elements.
    fn at(&self, k: usize) -> (usize, usize) {
        match self {
            ThroughPlan::Clusters(p) => {
                let (off, s) = p.chunk(k);
                (off, s.elems)
            }
            ThroughPlan::Hybrid(p) => {
                let (off, s) = p.chunk(k);
                (off, s.elems)
            }
        }
    }
}

/// What an all-reduce enqueues with (see [`HeteroCore::all_reduce`]).
struct AllReduceArgs<'a> {
    send: DevicePtr,
    recv: DevicePtr,
    dtype: DataType,
    op: ReduceOp,
    es: usize,
    call: u64,
    count: usize,
    first: u64,
    free: &'a [u64],
    link: Link,
    fault: Option<Stage>,
}

/// One epoch of the bridge on this rank.
struct Step {
    epoch: u64,
    slot: usize,
    /// `done[me][slot]` to wait for before writing the slot.
    free_at: u64,
    /// (source address, byte offset in the slot, bytes).
    publish: Vec<(u64, usize, usize)>,
    outs: Vec<Out>,
    what: &'static str,
    /// A failure to report instead of running (injected by a test).
    fault: Option<HeteroError>,
    /// The call's descriptor check, run first (the first step of a call carries it: no
    /// separate hop on the stream).
    check: Option<(u64, Descriptor)>,
    /// A gate the step waits for before it starts, at most the bridge's timeout (a test's
    /// hold: [`HeteroCore::inject_hold`]).
    gate: Option<Arc<AtomicBool>>,
    /// Where the outs read a later epoch's slots than the one published in (a rank through its
    /// cluster in the hybrid plan: it publishes in step A and copies in step B, as one step).
    then: Option<Then>,
    /// Where the step reads flat ranks' inputs in place and writes its reductions into its
    /// slot of the next epoch (a flat rank's step A, `plan::Roles::direct`).
    direct: Option<Direct>,
}

/// A flat rank's step A reading the flat ranks' inputs where they lie ([`inputs`]).
struct Direct {
    /// The call's inputs (resolved by its first step).
    inputs: Arc<inputs::CallInputs>,
    /// The mappings, for the first step's resolving.
    imports: Arc<inputs::Imports>,
    /// Bytes from an input's start to this chunk's.
    chunk_at: usize,
    /// Per out, per source: the source is a flat rank's input (element offset in the chunk,
    /// as bytes), read in place where that rank gave its handle.
    inputs_of: Vec<Vec<bool>>,
    /// The slot the outs write (step B's), and `done` to wait for before writing it.
    out_slot: usize,
    out_free_at: u64,
    /// Per out: its byte offset in that slot; the out also writes `Out::dst` (this rank's
    /// share of the output), copied from the slot while it is in the cache.
    out_at: Vec<usize>,
}

/// The later epoch a [`Step`]'s outs read, and the staging slot the step's copies go through
/// (a chunk's own, where the step's epoch's slot is not).
#[derive(Clone, Copy)]
struct Then {
    epoch: u64,
    slot: usize,
    staging: usize,
}

impl Step {
    /// The staging slot of the step's copies.
    fn staging_slot(&self) -> usize {
        self.then.map_or(self.slot, |t| t.staging)
    }

    /// Points the step's sources and destinations at a staging slot (`base`, `cap` bytes):
    /// returns the copies device → staging to run before the step and staging → device
    /// after it. The two directions share the slot: a step publishes every source before it
    /// writes its first destination.
    fn stage(&mut self, base: u64, cap: usize) -> Result<(Vec<Move>, Vec<Move>), HeteroError> {
        let mut before = Vec::with_capacity(self.publish.len());
        let mut at = 0usize;
        for p in &mut self.publish {
            before.push((base + at as u64, p.0, p.2));
            p.0 = base + at as u64;
            at += p.2;
        }
        let published = at;
        let mut after = Vec::with_capacity(self.outs.len());
        at = 0;
        for out in &mut self.outs {
            let bytes = match out.reduce {
                Some((dtype, _, _)) => out.n * dtype.size().unwrap_or(0),
                None => out.n,
            };
            after.push((out.dst, base + at as u64, bytes));
            out.dst = base + at as u64;
            at += bytes;
        }
        if published.max(at) > cap {
            return Err(HeteroError::Bridge(format!(
                "{}: {} bytes do not fit a staging slot of {cap}",
                self.what,
                published.max(at)
            )));
        }
        Ok((before, after))
    }

    fn run(self, b: &Bridge) -> Result<(), HeteroError> {
        let epoch = self.epoch;
        let r = self.execute(b);
        if r.is_err() {
            b.mark_failed_step(epoch);
        }
        r
    }

    fn execute(self, b: &Bridge) -> Result<(), HeteroError> {
        if let Some(e) = self.fault {
            return Err(e);
        }
        if let Some(gate) = &self.gate {
            let start = std::time::Instant::now();
            while !gate.load(Ordering::Acquire) {
                if start.elapsed() >= b.timeout() {
                    return Err(HeteroError::Bridge(format!(
                        "the held bridge step of epoch {} was not released within {} ms (its \
                         cluster stream never got past the chunk before)",
                        self.epoch,
                        b.timeout().as_millis()
                    )));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let trace = |phase: &'static str| {
            ring::note(self.epoch, phase);
            if step_trace() {
                eprintln!(
                    "bridge step epoch={} phase={phase} t_us={}",
                    self.epoch,
                    now_us()
                );
            }
        };
        trace("start");
        let me = b.topo().me;
        if let Some((call, d)) = self.check {
            if let Some(dir) = &self.direct {
                // Checked against MAX_HANDLE when the step was made.
                b.set_handle(call, &dir.inputs.mine);
            }
            b.check_call(call, d, &describe)?;
            if let Some(dir) = &self.direct {
                dir.inputs.resolve(b, &dir.imports, me)?;
            }
        }
        let slot = self.slot;
        if !self.publish.is_empty() {
            b.wait(
                b.done(me, slot),
                self.free_at,
                me,
                "the release of a staging slot",
            )?;
            let base = b.slot(me, slot) as usize;
            let copies: Vec<Part> = self
                .publish
                .iter()
                .flat_map(|&(src, off, bytes)| {
                    Part::cut(base + off, vec![src as usize], bytes, None, 0)
                })
                .collect();
            // SAFETY: each source holds its bytes by the collective's buffer contract; the slot
            // holds `off + bytes` (planned against the slot's size) and no reader reads it
            // until `arrive` below.
            unsafe { Part::run_all(&copies) };
        }
        b.publish(b.arrive(me, slot), self.epoch + 1);
        trace("published");
        // The outs read this step's epoch, or the later one of `then`.
        let (slot, epoch) = self.then.map_or((slot, self.epoch), |t| (t.slot, t.epoch));
        let inputs: &[u64] = match &self.direct {
            Some(dir) => {
                b.wait(
                    b.done(me, dir.out_slot),
                    dir.out_free_at,
                    me,
                    "the release of a staging slot",
                )?;
                ring::note(self.epoch, "slot of step B free");
                dir.inputs.at.get().ok_or_else(|| {
                    HeteroError::Bridge(format!(
                        "{}: the flat ranks' inputs were not resolved by the call's first step",
                        self.what
                    ))
                })?
            }
            None => &[],
        };
        let mut read: Vec<usize> = Vec::new();
        let mut parts: Vec<Part> = Vec::new();
        for (i, out) in self.outs.iter().enumerate() {
            let mut srcs = Vec::with_capacity(out.srcs.len());
            for (j, &(r, off)) in out.srcs.iter().enumerate() {
                if r != me {
                    b.wait(b.arrive(r, slot), epoch + 1, r, self.what)?;
                    if !read.contains(&r) {
                        read.push(r);
                    }
                }
                // A flat rank's input in place, where it gave its handle; else its slot.
                let input = self
                    .direct
                    .as_ref()
                    .filter(|dir| dir.inputs_of[i][j] && inputs[r] != 0)
                    .map(|dir| inputs[r] as usize + dir.chunk_at);
                srcs.push(input.unwrap_or(b.slot(r, slot) as usize) + off);
            }
            let (dst, also) = match &self.direct {
                Some(dir) => (
                    b.slot(me, dir.out_slot) as usize + dir.out_at[i],
                    out.dst as usize,
                ),
                None => (out.dst as usize, 0),
            };
            parts.extend(Part::cut(dst, srcs, out.n, out.reduce, also));
        }
        trace("peers");
        // SAFETY: every `dst` (and `also`) holds its `n` elements (bytes for a copy) by the
        // buffer contract or lies in this rank's slot of the next epoch (free: waited for
        // above; planned against the slot's size); the sources lie in slots their ranks
        // published for this epoch (planned against the slot's size), not rewritten before our
        // `done` below, or in flat ranks' inputs, which no rank writes before every flat rank
        // is past this step (a rank writes its output's share of chunk k, which may be its
        // input in place, only in step B of chunk k, after the owner of that share published
        // step B, after its step A).
        unsafe { Part::run_all(&parts) };
        for r in read {
            b.add_one(b.done(r, slot));
        }
        trace("done");
        Ok(())
    }
}

/// Whether `FERROCX_BRIDGE_TRACE=1` asks for a line on stderr at each phase of every bridge
/// step (start, published, peers arrived, done) with the wall clock in microseconds: every
/// rank's steps on one time line, to see where a pipelined collective waits.
fn step_trace() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("FERROCX_BRIDGE_TRACE").is_ok_and(|v| v == "1" || v == "steps")
    })
}

/// Microseconds of the wall clock (the same on every process of a host), for the step traces.
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A share of a step's copy or reduction, for the bridge's threads ([`workers`]): `dst` gets
/// `n` elements (bytes for a copy) read from `srcs`, and `also` (unless 0) a copy of `dst`.
struct Part {
    dst: usize,
    srcs: Vec<usize>,
    n: usize,
    reduce: Option<(DataType, ReduceOp, usize)>,
    also: usize,
}

impl Part {
    /// `dst = op over srcs` (`n` elements, or `n` bytes copied from `srcs[0]`), then `also`
    /// (unless 0) `= dst`, cut for the bridge's threads.
    fn cut(
        dst: usize,
        srcs: Vec<usize>,
        n: usize,
        reduce: Option<(DataType, ReduceOp, usize)>,
        also: usize,
    ) -> Vec<Part> {
        let unit = match reduce {
            Some((dtype, _, _)) => dtype.size().unwrap_or(1),
            None => 1,
        };
        let (parts, per) = workers::cut(n * unit, unit);
        if parts <= 1 {
            return vec![Part {
                dst,
                srcs,
                n,
                reduce,
                also,
            }];
        }
        (0..parts)
            .filter_map(|k| {
                let first = k * per;
                (first < n).then(|| {
                    let at = first * unit;
                    Part {
                        dst: dst + at,
                        srcs: srcs.iter().map(|s| s + at).collect(),
                        n: per.min(n - first),
                        reduce,
                        also: if also == 0 { 0 } else { also + at },
                    }
                })
            })
            .collect()
    }

    /// Runs every part, sharing them among the bridge's threads.
    ///
    /// # Safety
    /// Each part's `dst` (and `also`, unless 0) holds its `n` elements (bytes) and each source
    /// as many; a `dst` overlaps no other part's `dst` or `also`, and no source unless it is
    /// that source; an `also` overlaps nothing else.
    unsafe fn run_all(parts: &[Part]) {
        workers::run(parts.len(), &|i| {
            let p = &parts[i];
            let srcs: Vec<*const u8> = p.srcs.iter().map(|&s| s as *const u8).collect();
            let bytes = match p.reduce {
                // SAFETY: this function's contract.
                Some((dtype, op, div)) => unsafe {
                    reduce::reduce(p.dst as *mut u8, &srcs, p.n, dtype, op, div);
                    p.n * dtype.size().unwrap_or(0)
                },
                // SAFETY: as above, `n` bytes.
                None => unsafe {
                    std::ptr::copy(srcs[0], p.dst as *mut u8, p.n);
                    p.n
                },
            };
            if p.also != 0 {
                // SAFETY: `also` holds as many bytes as `dst` and overlaps no other part's
                // `dst` or `also`, nor any source (this function's contract).
                unsafe {
                    std::ptr::copy_nonoverlapping(p.dst as *const u8, p.also as *mut u8, bytes)
                };
            }
        });
    }
}

/// The largest all-reduce (bytes per rank) that runs as one step over the bridge: every rank
/// publishes its whole input and reduces every rank's, on the caller's stream (no stream hops,
/// no in-cluster steps). Past it, the pipelined plan moves less data per rank.
const ONE_SHOT_BYTES: usize = 64 << 10;

/// Staging slots past the pipeline's: p2p send, p2p receive, all_to_allv out and in.
const STAGING_EXTRA: usize = 4;
const SEND_SLOT: usize = 0;
const RECV_SLOT: usize = 1;
const A2A_OUT_SLOT: usize = 2;
const A2A_IN_SLOT: usize = 3;

/// Packs a collective's kind, dtype, op and root into a descriptor word.
fn kind_word(op: Collective, dtype: DataType, redop: Option<ReduceOp>, root: Option<usize>) -> u64 {
    (op as u64)
        | (u64::from(dtype.0 as u8) << 8)
        | (redop.map_or(0xff, |o| u64::from(o.0 as u8)) << 16)
        | (root.map_or(0xffff_ffff, |r| r as u64 & 0xffff_ffff) << 32)
}

/// Bits 24..31 of an all-reduce's descriptor word past one step: its plan (bits 24–25: 1
/// through the clusters, 2 flat or hybrid with the inputs published, 3 with the inputs read in
/// place) and six bits of a hash of the flat ranks, so that ranks that chose different plans
/// (`FERROCX_BRIDGE_PLAN`, `FERROCX_BRIDGE_DIRECT` not the same everywhere) fail alike at the
/// call's check instead of reading slots the others never wrote.
fn plan_word(roles: Option<&plan::Roles>, depth: usize) -> u64 {
    let (kind, hash) = match roles {
        None => (1u64, 0u64),
        Some(r) => (
            if r.direct && depth >= 2 { 3 } else { 2 },
            r.flat.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
                (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
            }),
        ),
    };
    (kind | (hash & 0x3f) << 2) << 24
}

fn describe(d: Descriptor) -> String {
    let op = Collective::ALL
        .get((d.kind & 0xff) as usize)
        .map_or("?", |c| c.name());
    let dtype = DataType(((d.kind >> 8) & 0xff) as _).name().unwrap_or("?");
    let mut s = format!("{op} of {} x {dtype}", d.count);
    let redop = (d.kind >> 16) & 0xff;
    if redop != 0xff {
        s.push_str(&format!(
            " ({})",
            ReduceOp(redop as _).name().unwrap_or("?")
        ));
    }
    let root = d.kind >> 32;
    if root != 0xffff_ffff {
        s.push_str(&format!(" to/from root {root}"));
    }
    let plan = (d.kind >> 24) & 0xff;
    if plan != 0 {
        s.push_str(match plan & 3 {
            1 => " through the clusters",
            2 => " flat or hybrid, inputs published",
            _ => " flat or hybrid, inputs read in place",
        });
        if plan & 3 != 1 {
            s.push_str(&format!(" (flat ranks #{})", plan >> 2));
        }
    }
    s
}

impl HeteroCore {
    /// Makes the cross-cluster side of a communicator over shared memory: its streams and the
    /// bridge (collective: every rank of the job calls it, in the same communicator order).
    /// `comm` is the cluster's communicator, on `device` and `ccl`; `name` the bridge
    /// segment's name.
    #[allow(clippy::too_many_arguments)]
    fn make(
        topo: Topology,
        device: Device,
        ccl: Ccl,
        comm: Comm,
        config: &BridgeConfig,
        local_device: i32,
        name: &str,
        timeout: Duration,
    ) -> Result<HeteroCore, HeteroError> {
        // The communicator chose this bridge (`ccl = "mpi"` takes [`mpi`] instead).
        debug_assert!(config.ccl != BridgeCcl::Mpi);
        let props = device.properties(local_device)?;
        let host_addressable = props.capabilities.contains(Capabilities::HOST_ADDRESSABLE);
        let world = topo.world();
        let depth = config.depth as usize;
        let max_cluster = topo.sizes().into_iter().max().unwrap_or(1);
        // A share is at most a slot plus the tail (fewer elements than ranks).
        let slot_bytes = config.chunk_bytes as usize + 16 * max_cluster;
        let bridge = Arc::new(Bridge::attach(
            name,
            topo.clone(),
            depth,
            slot_bytes,
            timeout,
        )?);
        let slot_bytes = bridge.slot_bytes();
        workers::init(world);
        let mut made: Vec<Stream> = Vec::new();
        let mut stream = || -> Result<Stream, HeteroError> {
            let s = device.stream_create()?;
            made.push(s);
            Ok(s)
        };
        let streams = (|| -> Result<Streams, HeteroError> {
            Ok(Streams {
                cluster: stream()?,
                bridge: stream()?,
                send: stream()?,
                recv: stream()?,
                copy: if host_addressable {
                    None
                } else {
                    Some(stream()?)
                },
                collect: if host_addressable {
                    None
                } else {
                    Some(stream()?)
                },
            })
        })();
        let streams = match streams {
            Ok(s) => s,
            Err(e) => {
                for s in made {
                    let _ = device.stream_destroy(s);
                }
                return Err(e);
            }
        };
        // Pipeline slots, then the p2p send and receive slots and the all_to_allv out and
        // in slots.
        let staging =
            (!host_addressable).then(|| Staging::new(&device, depth + STAGING_EXTRA, slot_bytes));
        // `FERROCX_BRIDGE_PROXY=0` keeps the host-function fallback (for comparisons).
        let proxy_off = std::env::var("FERROCX_BRIDGE_PROXY").is_ok_and(|v| v.trim() == "0");
        let proxy = if host_addressable || proxy_off {
            None
        } else {
            Proxy::start(&device)
        };
        // The collect stream's own proxy (a step there waits for peers while the bridge
        // stream's proxy runs the next step).
        let collector = proxy.as_ref().and_then(|_| Proxy::start(&device));
        tracing::debug!(
            clusters = topo.clusters.len(),
            world,
            depth,
            slot_bytes,
            host_addressable,
            "bridge ready: {name}"
        );
        Ok(HeteroCore {
            imports: Arc::new(inputs::Imports::new(device.clone())),
            device,
            ccl,
            comm,
            shared: Arc::new(Shared {
                bridge,
                failed: AtomicBool::new(false),
                error: Mutex::new(None),
            }),
            streams,
            events: Mutex::new(EventPool::default()),
            state: Mutex::new(State {
                epoch: 0,
                calls: 0,
                expect: vec![0; depth],
                sent: vec![0; world],
                received: vec![0; world],
                plans: HashMap::new(),
                hybrid: HashMap::new(),
                warm: HashSet::new(),
                last: None,
            }),
            depth,
            slot_bytes,
            staging,
            inject: Mutex::new(None),
            hold: AtomicBool::new(false),
            proxy,
            collector,
            backlog: Backlog::default(),
            roles: plan::Roles::choose(&topo, std::env::var("FERROCX_BRIDGE_PLAN").ok().as_deref())
                .map(|mut r| {
                    // `FERROCX_BRIDGE_DIRECT=0`: every flat rank publishes its chunks (for
                    // comparisons; the same value must reach every rank).
                    r.direct &=
                        std::env::var("FERROCX_BRIDGE_DIRECT").map_or(true, |v| v.trim() != "0");
                    r
                }),
            groups: Mutex::new(HashMap::new()),
            topo,
        })
    }

    /// Opens (or nests) the calling thread's group: until its end, a send or receive across
    /// clusters does not order the caller's stream after itself, so a receive enqueued after a
    /// send in the group does not wait for the send (a ring of sends and receives, each rank
    /// sending before it receives, would otherwise wait on itself once a message needs more
    /// than one chunk of a channel).
    pub fn group_start(&self) {
        let mut g = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        g.entry(std::thread::current().id()).or_default().depth += 1;
    }

    /// Closes the calling thread's group; the outermost end orders every caller's stream
    /// after the sends and receives the group enqueued.
    pub fn group_end(&self) -> Result<(), HeteroError> {
        let deferred = {
            let mut g = self.groups.lock().unwrap_or_else(|p| p.into_inner());
            let id = std::thread::current().id();
            let Some(group) = g.get_mut(&id) else {
                return Ok(());
            };
            group.depth = group.depth.saturating_sub(1);
            if group.depth > 0 {
                return Ok(());
            }
            g.remove(&id)
                .map(|group| group.deferred)
                .unwrap_or_default()
        };
        deferred
            .into_iter()
            .try_for_each(|(from, to)| self.order(from, to))
    }

    /// Orders `to` (a caller's stream) after `from` (the send or receive stream) now, or at the
    /// end of the calling thread's group.
    fn hand_back(&self, from: Stream, to: Stream) -> Result<(), HeteroError> {
        {
            let mut g = self.groups.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(group) = g.get_mut(&std::thread::current().id()) {
                if !group.deferred.contains(&(from, to)) {
                    group.deferred.push((from, to));
                }
                return Ok(());
            }
        }
        self.order(from, to)
    }

    /// The clusters and this rank's place.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// Events the pool has made so far (bounded by the sync points in flight).
    pub fn events_made(&self) -> usize {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).made()
    }

    /// Plans in the cache.
    pub fn plans_cached(&self) -> usize {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.plans.len() + st.hybrid.len()
    }

    /// The first failure of a bridge step already run on this rank, or a failed step of
    /// another rank in an epoch this rank has taken part in: that rank's in-cluster stages
    /// went on with its share unreduced, so a peer of its cluster whose own steps all ran
    /// would otherwise report wrong values as done. (A failure in a later epoch, of a call
    /// this rank has not made yet, is left to that call.)
    pub fn check(&self) -> Result<(), HeteroError> {
        self.shared.check()?;
        let b = &self.shared.bridge;
        let Some((epoch, rank)) = b.failed_step() else {
            return Ok(());
        };
        let reserved = self.state.lock().unwrap_or_else(|p| p.into_inner()).epoch;
        if epoch >= reserved {
            return Ok(());
        }
        let e = b.failure().unwrap_or_else(|| HeteroError::PeerFailed {
            rank,
            cluster: self.topo.cluster_name_of(rank).to_string(),
            message: format!(
                "{} failed a bridge step of a collective this rank took part in",
                self.topo.who(rank)
            ),
        });
        self.shared.fail(e.clone());
        Err(e)
    }

    /// Why a call failed, as precisely as the bridge knows: a failure another rank recorded,
    /// else a rank whose process is gone (for errors of a cluster's CCL, which name
    /// cluster-local ranks).
    pub fn explain(&self) -> Option<HeteroError> {
        let b = &self.shared.bridge;
        b.failure().or_else(|| {
            b.first_dead().map(|r| HeteroError::Died {
                rank: r,
                cluster: self.topo.cluster_name_of(r).to_string(),
                what: "a collective".into(),
            })
        })
    }

    /// `true` when the device's buffers move through staging (its memory is not
    /// host-addressable).
    pub fn staged(&self) -> bool {
        self.staging.is_some()
    }

    /// Peers' inputs this rank keeps mapped (the flat ranks' reads in place, module `inputs`).
    pub fn inputs_mapped(&self) -> usize {
        self.imports.kept()
    }

    /// This communicator's [`plan_word`] (the same on every rank that chose the same plan).
    fn plan_bits(&self) -> u64 {
        plan_word(self.roles(), self.depth)
    }

    /// The plan of this rank's all-reduces past one step: `clusters`, `flat`, `hybrid flat`
    /// or `hybrid through` (see the module docs).
    pub fn all_reduce_plan_name(&self) -> &'static str {
        match self.roles() {
            None => "clusters",
            Some(r) if r.all_flat() => "flat",
            Some(r) if r.flat.contains(&self.topo.me) => "hybrid flat",
            Some(_) => "hybrid through",
        }
    }

    /// Streams the communicator made for its plans (fixed for its life).
    pub fn streams_made(&self) -> usize {
        self.streams.all().count()
    }

    /// Makes this rank's next all_reduce fail at `stage` (a test of failure handling: every
    /// rank must fail alike, and the call must release what it took).
    pub fn inject_failure(&self, stage: Stage) {
        *self.inject.lock().unwrap_or_else(|p| p.into_inner()) = Some(stage);
    }

    /// Makes this rank's next all_reduce through the clusters (two chunks or more) hold the
    /// bridge step of its second chunk (in the hybrid plan: its step A) until its cluster
    /// stream has gathered the first chunk (at most the timeout, then the call fails): a test
    /// that a chunk's gather waits for its own bridge steps only, never for a later chunk's.
    pub fn inject_hold(&self) {
        self.hold.store(true, Ordering::Release);
    }

    /// Waits for every stream of the plans (teardown and `synchronize`).
    pub fn drain(&self) -> Result<(), AdaptorError> {
        let mut first = Ok(());
        for st in self.streams.all() {
            let r = self.device.stream_synchronize(st);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    fn host(&self, stream: Stream, work: Work) -> Result<(), HeteroError> {
        let f = self
            .device
            .tables()
            .root
            .get()
            .launch_host_func
            .ok_or_else(|| {
                HeteroError::Unsupported(format!(
                    "the device adaptor `{}` has no launch_host_func: the bridge's steps need it",
                    self.device.name()
                ))
            })?;
        let job = Box::new(Job {
            shared: self.shared.clone(),
            work,
        });
        let user = Box::into_raw(job).cast::<c_void>();
        // SAFETY: a stream of this device, a function of the `HostFn` type, and a pointer the
        // function takes back exactly once.
        let status = unsafe { f(stream, Some(run_job), user) };
        if status.is_success() {
            return Ok(());
        }
        // SAFETY: refused, so the function never runs: the box is still ours.
        drop(unsafe { Box::from_raw(user.cast::<Job>()) });
        Err(HeteroError::Bridge(format!(
            "{}: launch_host_func failed with {status}",
            self.device.name()
        )))
    }

    /// Enqueues a bridge step on `stream`: handed to the proxy thread where there is one
    /// (the stream signals it and waits for it through host memory), else a host function.
    fn step(&self, stream: Stream, work: Work) -> Result<(), HeteroError> {
        self.step_via(self.proxy.as_ref(), stream, work)
    }

    /// [`HeteroCore::step`] with `proxy` (the bridge stream's or the collect stream's).
    fn step_via(
        &self,
        proxy: Option<&Proxy>,
        stream: Stream,
        work: Work,
    ) -> Result<(), HeteroError> {
        match proxy {
            Some(p) => p.enqueue(
                &self.device,
                stream,
                Job {
                    shared: self.shared.clone(),
                    work,
                },
            ),
            None => self.host(stream, work),
        }
    }

    /// `true` when the bridge steps run on the proxy thread (a staged device with the memops
    /// group), not as host functions.
    pub fn proxied(&self) -> bool {
        self.proxy.is_some()
    }

    /// Orders work enqueued on `to` from now on after the work enqueued on `from` so far.
    fn order(&self, from: Stream, to: Stream) -> Result<(), HeteroError> {
        let mut pool = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let e = pool.take(&self.device)?;
        if let Err(err) = self.device.event_record(e, from) {
            pool.unused(e);
            return Err(err.into());
        }
        pool.recorded(e);
        Ok(self.device.stream_wait_event(to, e)?)
    }

    /// An event recorded on `from` now, for a wait enqueued later ([`HeteroCore::wait_mark`]):
    /// kept out of the pool until then, so that no later record can take its place.
    fn mark(&self, from: Stream) -> Result<Event, HeteroError> {
        let mut pool = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let e = pool.take(&self.device)?;
        if let Err(err) = self.device.event_record(e, from) {
            pool.unused(e);
            return Err(err.into());
        }
        Ok(e)
    }

    /// Orders `to` after the point `e` (a [`HeteroCore::mark`]) was recorded at; gives `e`
    /// back to the pool.
    fn wait_mark(&self, to: Stream, e: Event) -> Result<(), HeteroError> {
        let r = self.device.stream_wait_event(to, e);
        self.drop_mark(e);
        Ok(r?)
    }

    /// Gives a [`HeteroCore::mark`] back to the pool without a wait.
    fn drop_mark(&self, e: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .recorded(e);
    }

    /// `e` as this rank's failure at `stage` (an error about a peer, or already named, is
    /// kept as it is).
    fn at_stage(&self, stage: &str, e: HeteroError) -> HeteroError {
        match e {
            HeteroError::Adaptor(_) | HeteroError::Bridge(_) | HeteroError::Unsupported(_) => {
                HeteroError::Stage {
                    rank: self.topo.me,
                    cluster: self.topo.cluster_name_of(self.topo.me).to_string(),
                    stage: stage.to_string(),
                    message: e.to_string(),
                }
            }
            e => e,
        }
    }

    /// Records the failure of a call whose epochs are reserved but not all enqueued (the
    /// bridge is out of step): this communicator's later calls fail at once, and the other
    /// ranks fail with the same text. Returns the error to report.
    fn fail_call(&self, stage: &str, e: HeteroError) -> HeteroError {
        let e = self.at_stage(stage, e);
        self.shared.fail(e.clone());
        e
    }

    /// Enqueues `moves` on `stream`.
    ///
    /// # Safety
    /// Each move's ranges are valid (ranges of the call's buffers, by the buffer contract of
    /// [`crate::comm::Call`], and of the staging), and ordered against their other users.
    unsafe fn moves(&self, moves: &[Move], stream: Stream) -> Result<(), HeteroError> {
        for &(dst, src, bytes) in moves {
            if bytes > 0 {
                // SAFETY: this function's contract.
                unsafe {
                    self.device
                        .mem_copy_async(DevicePtr(dst), DevicePtr(src), bytes, stream)
                }?;
            }
        }
        Ok(())
    }

    /// Enqueues `step` on the bridge stream after the work enqueued on `after` so far. With
    /// staging, its sources are first copied from the device into its staging slot on the
    /// copy stream; returns the copies back to the device and the mark of the step's end,
    /// which [`HeteroCore::finish_step`] takes once the caller has issued what may overlap the
    /// step (the next chunk's stages).
    ///
    /// # Safety
    /// The step's sources and destinations are ranges of the call's buffers (the buffer
    /// contract of [`crate::comm::Call`]).
    unsafe fn issue_step(
        &self,
        after: Option<Stream>,
        mut step: Step,
    ) -> Result<Issued, HeteroError> {
        let bs = self.streams.bridge;
        let (Some(st), Some(cp)) = (&self.staging, self.streams.copy) else {
            if let Some(a) = after {
                self.order(a, bs)?;
            }
            self.step(bs, Box::new(move |b: &Bridge| step.run(b)))?;
            return Ok(Issued {
                back: Vec::new(),
                done: self.mark(bs)?,
            });
        };
        let (before, back) = step.stage(st.slot(step.staging_slot()), st.slot_bytes)?;
        if let Some(a) = after {
            self.order(a, cp)?;
        }
        // SAFETY: the call's ranges (this function's contract) and the step's staging slot,
        // which the copy stream reaches only after the previous step of that slot ran
        // (`finish_step` ordered it after that step).
        unsafe { self.moves(&before, cp) }?;
        self.order(cp, bs)?;
        self.step(bs, Box::new(move |b: &Bridge| step.run(b)))?;
        Ok(Issued {
            back,
            done: self.mark(bs)?,
        })
    }

    /// Issues `step` after the step `before` (issued by [`HeteroCore::issue_step`]) on the
    /// collect stream, with its own proxy, where the device stages (so that a step that waits
    /// for peers' results does not hold up the next step on the bridge stream); on the bridge
    /// stream right after `before` otherwise. The two steps share a staging slot: `step`
    /// publishes nothing.
    ///
    /// # Safety
    /// As [`HeteroCore::issue_step`].
    unsafe fn issue_collect(&self, before: Issued, mut step: Step) -> Result<Issued, HeteroError> {
        debug_assert!(step.publish.is_empty() && before.back.is_empty());
        let (Some(st), Some(_), Some(co)) =
            (&self.staging, self.streams.copy, self.streams.collect)
        else {
            // Step A's end needs no mark: step B follows it on the bridge stream.
            self.drop_mark(before.done);
            // SAFETY: this function's contract.
            return unsafe { self.issue_step(None, step) };
        };
        let (_, back) = step.stage(st.slot(step.staging_slot()), st.slot_bytes)?;
        self.wait_mark(co, before.done)?;
        self.step_via(
            self.collector.as_ref(),
            co,
            Box::new(move |b: &Bridge| step.run(b)),
        )?;
        Ok(Issued {
            back,
            done: self.mark(co)?,
        })
    }

    /// Orders `to` (the copy stream when `None`) after the step `issued` (not after the steps
    /// issued since: those overlap what `to` does next), with a staged step's copies back to
    /// the device between.
    ///
    /// # Safety
    /// `issued` came from [`HeteroCore::issue_step`] of this call.
    unsafe fn finish_step(&self, issued: Issued, to: Option<Stream>) -> Result<(), HeteroError> {
        let Issued { back, done } = issued;
        let Some(cp) = self.streams.copy.filter(|_| self.staging.is_some()) else {
            return match to {
                Some(t) => self.wait_mark(t, done),
                None => {
                    self.drop_mark(done);
                    Ok(())
                }
            };
        };
        self.wait_mark(cp, done)?;
        // SAFETY: the call's ranges and the staging slot the step wrote (the copy stream
        // waits for the step above).
        unsafe { self.moves(&back, cp) }?;
        match to {
            Some(t) => self.order(cp, t),
            None => Ok(()),
        }
    }

    /// Gives back the marks of steps issued and not finished (a call that failed midway).
    fn drop_issued(&self, pending: impl IntoIterator<Item = Issued>) {
        for i in pending {
            self.drop_mark(i.done);
        }
    }

    /// Takes the next call number and `n` epochs; returns (call, first epoch, per epoch the
    /// `free_at` of its slot), adding `readers(k)` expected reads for epoch k.
    fn reserve(&self, n: usize, readers: &dyn Fn(usize) -> u64) -> (u64, u64, Vec<u64>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let call = st.calls;
        st.calls += 1;
        let first = st.epoch;
        let mut free = Vec::with_capacity(n);
        for k in 0..n {
            let slot = ((first + k as u64) % self.depth as u64) as usize;
            free.push(st.expect[slot]);
            st.expect[slot] += readers(k);
        }
        st.epoch += n as u64;
        (call, first, free)
    }

    /// Enqueues the descriptor check of a call on the bridge stream.
    fn check_step(&self, call: u64, d: Descriptor) -> Result<(), HeteroError> {
        self.step(
            self.streams.bridge,
            Box::new(move |b: &Bridge| b.check_call(call, d, &describe)),
        )
    }

    /// Fails at once if an earlier step failed (its rounds would be out of step).
    fn ready(&self) -> Result<(), HeteroError> {
        self.shared.check()
    }

    /// Starts a collective on `stream`: after the previous collective, whatever stream that
    /// one was called on (bridge steps run in call order on every rank; some run on the
    /// caller's stream).
    fn begin(&self, stream: Stream) -> Result<(), HeteroError> {
        // Whatever the enqueuer thread holds of earlier calls goes on the streams first.
        self.backlog.flush();
        self.begin_after(stream)
    }

    /// [`HeteroCore::begin`] for a call handed to the enqueuer (behind the earlier ones).
    fn begin_after(&self, stream: Stream) -> Result<(), HeteroError> {
        let last = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.last.replace(stream)
        };
        match last {
            Some(l) if l != stream => self.order(l, stream),
            _ => Ok(()),
        }
    }

    /// Messages up to this size are all-reduced in one step over the bridge.
    fn one_shot_bytes(&self) -> usize {
        ONE_SHOT_BYTES.min(self.slot_bytes)
    }

    /// Orders work enqueued on `to` from now on after the caller's stream reached the call.
    fn enter(&self, link: Link, to: Stream) -> Result<(), HeteroError> {
        match link {
            Link::Stream(s) => self.order(s, to),
            Link::Words { start, seq, .. } => {
                // SAFETY: the enqueuer's word, alive until its streams are drained.
                let r = unsafe {
                    self.device
                        .stream_wait_value32(to, start as *const u32, seq, WAIT_VALUE_GEQ)
                };
                Ok(r?)
            }
        }
    }

    /// Lets the caller's stream go on after the work enqueued on `from` so far.
    fn leave(&self, link: Link, from: Stream) -> Result<(), HeteroError> {
        match link {
            Link::Stream(s) => self.order(from, s),
            Link::Words { end, seq, .. } => {
                // SAFETY: as in `enter`.
                let r = unsafe { self.device.stream_write_value32(from, end as *mut u32, seq) };
                Ok(r?)
            }
        }
    }

    /// The roles of the flat and hybrid plans (`None`: every rank through its cluster): see
    /// [`plan::Roles::choose`] (`FERROCX_BRIDGE_PLAN=flat|clusters|hybrid[=a,b]` forces one,
    /// for comparisons). The same answer on every rank: it depends on the config and the
    /// environment only.
    fn roles(&self) -> Option<&plan::Roles> {
        self.roles.as_ref()
    }

    /// The flat or hybrid plan of `count` elements of `dtype` for this rank, from the cache:
    /// chunks of a slot's elements (a flat rank publishes a whole chunk).
    fn hybrid_plan(
        &self,
        roles: &plan::Roles,
        count: usize,
        dtype: DataType,
        es: usize,
    ) -> Arc<HybridPlan> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = st.hybrid.get(&(count, dtype)) {
            return p.clone();
        }
        let p = Arc::new(plan::hybrid(
            count,
            (self.slot_bytes / es).max(1),
            roles,
            self.topo.me,
        ));
        st.hybrid.insert((count, dtype), p.clone());
        p
    }

    /// The steps of a flat rank in the flat and hybrid plans (see the module docs): per chunk,
    /// step A publishes the chunk and reduces this rank's flat share from every flat rank's
    /// slot and the owners' shares of the clusters through their CCL; step B publishes the
    /// reduced share and copies every other flat rank's.
    #[allow(clippy::too_many_arguments)]
    fn flat_steps(
        &self,
        plan: &HybridPlan,
        send: DevicePtr,
        recv: DevicePtr,
        dtype: DataType,
        op: ReduceOp,
        es: usize,
        first: u64,
        free: &[u64],
        check: (u64, Descriptor),
    ) -> Vec<Step> {
        let w = self.topo.world();
        let at = |ptr: DevicePtr, elems: usize| ptr.0 + (elems * es) as u64;
        let slot = |ep: u64| (ep % self.depth as u64) as usize;
        let mut steps = Vec::with_capacity(2 * plan.chunks);
        // Every flat rank on the host device: the flat ranks read each other's inputs in place
        // (see [`inputs`]); this rank's input is read there when the device exports it. Step A
        // writes into step B's slot, so the two must differ (a pipeline of one slot does not
        // take this way: its step A would wait for the reads of the slot it reads from).
        let direct_ok = self.depth >= 2 && self.staging.is_none();
        let inputs = self.roles().filter(|r| r.direct && direct_ok).map(|roles| {
            // SAFETY: `send` is a valid range of this device (the call's contract).
            let mine = unsafe { window::resources::ipc_export(&self.device, send) }
                .ok()
                .filter(|h| !h.is_empty() && h.len() <= bridge::MAX_HANDLE)
                .unwrap_or_default();
            Arc::new(inputs::CallInputs {
                call: check.0,
                mine,
                mine_at: send.0,
                flat: roles.flat.clone(),
                at: std::sync::OnceLock::new(),
            })
        });
        let flat_rank = |r: usize| {
            self.roles()
                .is_some_and(|ro| ro.flat.binary_search(&r).is_ok())
        };
        for k in 0..plan.chunks {
            let (off, sh) = plan.chunk(k);
            let epoch = first + 2 * k as u64;
            let publish = |from: DevicePtr, (p0, p1): (usize, usize)| {
                if p1 > p0 {
                    vec![(at(from, off + p0), 0, (p1 - p0) * es)]
                } else {
                    Vec::new()
                }
            };
            let outs = |s: &plan::HybridStep| -> Vec<Out> {
                s.outs
                    .iter()
                    .map(|o| Out {
                        dst: at(recv, off + o.start),
                        n: if o.reduce { o.len } else { o.len * es },
                        srcs: o.srcs.iter().map(|&(r, x)| (r, x * es)).collect(),
                        reduce: o.reduce.then_some((dtype, op, w)),
                    })
                    .collect()
            };
            // Direct: step A publishes nothing where the input is read in place, and writes
            // its reductions into the slot of step B (at the share's offset, where step B
            // would publish them) and into the output; step B then publishes nothing.
            let direct = inputs.as_ref().map(|inp| {
                let f0 = sh.b.publish.0;
                Direct {
                    inputs: inp.clone(),
                    imports: self.imports.clone(),
                    chunk_at: off * es,
                    inputs_of: sh
                        .a
                        .outs
                        .iter()
                        .map(|o| o.srcs.iter().map(|&(r, _)| flat_rank(r)).collect())
                        .collect(),
                    out_slot: slot(epoch + 1),
                    out_free_at: free[2 * k + 1],
                    out_at: sh.a.outs.iter().map(|o| (o.start - f0) * es).collect(),
                }
            });
            let read_in_place = inputs.as_ref().is_some_and(|inp| !inp.mine.is_empty());
            steps.push(Step {
                epoch,
                slot: slot(epoch),
                free_at: free[2 * k],
                publish: if read_in_place {
                    Vec::new()
                } else {
                    publish(send, sh.a.publish)
                },
                outs: outs(&sh.a),
                what: "the bridge step of an all_reduce",
                fault: None,
                check: (k == 0).then_some(check),
                gate: None,
                then: None,
                direct,
            });
            steps.push(Step {
                epoch: epoch + 1,
                slot: slot(epoch + 1),
                free_at: free[2 * k + 1],
                publish: if inputs.is_some() {
                    Vec::new()
                } else {
                    publish(recv, sh.b.publish)
                },
                outs: outs(&sh.b),
                what: "the bridge step of an all_reduce",
                fault: None,
                check: None,
                gate: None,
                direct: None,
                then: None,
            });
        }
        steps
    }

    /// Enqueues `steps` in order, hung on the caller's stream by `link`. Where the host reaches
    /// the buffers they run on the caller's stream itself (or, from the enqueuer, on the bridge
    /// stream); staged, each step's copies run before and after it on the copy stream, one
    /// step at a time (a step's sources may be the previous step's results).
    ///
    /// # Safety
    /// The steps' ranges are the call's buffers (the buffer contract of
    /// [`crate::comm::Call`]).
    unsafe fn run_steps(&self, steps: Vec<Step>, link: Link) -> Result<(), HeteroError> {
        let bs = self.streams.bridge;
        match (self.streams.copy.filter(|_| self.staging.is_some()), link) {
            (None, Link::Stream(s)) => {
                for step in steps {
                    self.host(s, Box::new(move |b: &Bridge| step.run(b)))?;
                }
                Ok(())
            }
            (None, link) => {
                self.enter(link, bs)?;
                for step in steps {
                    self.host(bs, Box::new(move |b: &Bridge| step.run(b)))?;
                }
                self.leave(link, bs)
            }
            (Some(cp), link) => {
                self.enter(link, cp)?;
                for step in steps {
                    // SAFETY: this function's contract.
                    let issued = unsafe { self.issue_step(None, step) }?;
                    // SAFETY: the step just issued.
                    unsafe { self.finish_step(issued, None) }?;
                }
                self.leave(link, cp)
            }
        }
    }

    /// The all-reduce plan of `count` elements of `dtype`, from the cache.
    fn all_reduce_plan(&self, count: usize, dtype: DataType, es: usize) -> Arc<AllReducePlan> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = st.plans.get(&(count, dtype)) {
            return p.clone();
        }
        let sizes = self.topo.sizes();
        let slot_elems = (self.slot_bytes - 16 * sizes.iter().max().unwrap_or(&1)) / es;
        let topo = &self.topo;
        let p = Arc::new(plan::all_reduce(
            count,
            slot_elems,
            &sizes,
            topo.my_cluster(),
            topo.my_local(),
            &|c, i| topo.global(c, i),
        ));
        st.plans.insert((count, dtype), p.clone());
        p
    }

    /// Whether an all-reduce of `dtype` and `op` long enough for the enqueuer thread may go
    /// there: from the second such call on. The first is enqueued by the caller's thread, as
    /// short plans are. A plan handed to the enqueuer leaves the caller's stream waiting on a
    /// word that only its last stage writes; anything the enqueuer's device and CCL calls then
    /// wait for that waits for the whole device (a first use that loads code or allocates,
    /// done once per kind of call) would wait for that stream, which waits for the enqueuer. A
    /// job across a GPU cluster on NCCL and a CPU cluster stopped so when its first call was a
    /// 64 MiB all-reduce (eight chunks) and ran when a one-chunk call came first.
    fn enqueued_here_once(&self, dtype: DataType, op: ReduceOp) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        !st.warm.insert((dtype, op))
    }

    /// All-reduces this communicator has handed to the enqueuer thread so far.
    pub fn handed_to_enqueuer(&self) -> u64 {
        self.backlog
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
    }

    /// Enqueues the all-reduce plan on `stream` (see the module docs).
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn all_reduce_on(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: Stream,
        enqueuer: Option<&Enqueuer>,
    ) -> Result<(), HeteroError> {
        self.ready()?;
        let es = elem(dtype)?;
        if !reduce::supports(dtype, op) {
            return Err(HeteroError::Unsupported(format!(
                "all_reduce across clusters: {} with {} is not supported",
                dtype.name().unwrap_or("?"),
                op.name().unwrap_or("?")
            )));
        }
        let fault = self.inject.lock().unwrap_or_else(|p| p.into_inner()).take();
        let bytes = count * es;
        // An injected failure (tests) strikes the step of the one-step and flat plans, named
        // as the stage asked for (the plan must not depend on it: every rank takes the same).
        let injected = |s: Stage| HeteroError::Stage {
            rank: self.topo.me,
            cluster: self.topo.cluster_name_of(self.topo.me).to_string(),
            stage: s.name().to_string(),
            message: "an injected failure".into(),
        };
        if bytes <= self.one_shot_bytes() {
            let w = self.topo.world();
            let d = Descriptor {
                count: count as u64,
                kind: kind_word(Collective::AllReduce, dtype, Some(op), None),
            };
            return self.bridge_only(
                Collective::AllReduce,
                d,
                1,
                &|_| (w - 1) as u64,
                &|_, epoch, slot, free_at| Step {
                    epoch,
                    slot,
                    free_at,
                    publish: vec![(send.0, 0, bytes)],
                    outs: vec![Out {
                        dst: recv.0,
                        n: count,
                        srcs: (0..w).map(|r| (r, 0)).collect(),
                        reduce: Some((dtype, op, w)),
                    }],
                    what: "the bridge step of an all_reduce",
                    fault: fault.map(injected),
                    check: None,
                    gate: None,
                    direct: None,
                    then: None,
                },
                stream,
            );
        }
        let plan = match self.roles() {
            Some(roles) => {
                let hybrid = self.hybrid_plan(roles, count, dtype, es);
                if roles.flat.contains(&self.topo.me) {
                    let fault = fault.map(injected);
                    // SAFETY: this function's contract.
                    return unsafe {
                        self.flat_all_reduce(
                            hybrid, send, recv, count, dtype, op, es, stream, enqueuer, fault,
                        )
                    };
                }
                ThroughPlan::Hybrid(hybrid)
            }
            None => ThroughPlan::Clusters(self.all_reduce_plan(count, dtype, es)),
        };
        let queued =
            enqueuer.filter(|q| plan.chunks() >= q.chunks && self.enqueued_here_once(dtype, op));
        if queued.is_some() {
            self.begin_after(stream)?;
        } else {
            self.begin(stream)?;
        }
        let (call, first, free) = self.reserve(plan.epochs(), &|j| plan.readers(j));
        if let Some(q) = queued {
            // The enqueuer thread enqueues the stages; this thread hangs them on `stream`.
            let r = q.submit(self, stream, |seq, start, end| {
                Box::new(move |core: &HeteroCore| {
                    let mut stage = Stage::Cluster;
                    // SAFETY: the contract of the call, passed on (the caller's stream waits
                    // for the stages' last signal before it goes on).
                    let r = unsafe {
                        core.all_reduce_stages(
                            &plan,
                            AllReduceArgs {
                                send,
                                recv,
                                dtype,
                                op,
                                es,
                                call,
                                count,
                                first,
                                free: &free,
                                link: Link::Words { start, end, seq },
                                fault,
                            },
                            &mut stage,
                        )
                    };
                    if let Err(e) = r {
                        core.fail_call(stage.name(), e);
                        Enqueuer::release(end, seq);
                    }
                })
            });
            return r.map_err(|e| self.fail_call(Stage::Cluster.name(), e));
        }
        let mut stage = Stage::Cluster;
        // SAFETY: this function's contract, passed on.
        let r = unsafe {
            self.all_reduce_stages(
                &plan,
                AllReduceArgs {
                    send,
                    recv,
                    dtype,
                    op,
                    es,
                    call,
                    count,
                    first,
                    free: &free,
                    link: Link::Stream(stream),
                    fault,
                },
                &mut stage,
            )
        };
        r.map_err(|e| self.fail_call(stage.name(), e))
    }

    /// Enqueues a flat rank's side of the flat or hybrid all-reduce (see the module docs): its
    /// steps from the enqueuer thread when they are many, else from here.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn flat_all_reduce(
        &self,
        plan: Arc<HybridPlan>,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        es: usize,
        stream: Stream,
        enqueuer: Option<&Enqueuer>,
        fault: Option<HeteroError>,
    ) -> Result<(), HeteroError> {
        let chunks = plan.chunks;
        let queued = enqueuer.filter(|q| chunks >= q.chunks);
        if queued.is_some() {
            self.begin_after(stream)?;
        } else {
            self.begin(stream)?;
        }
        let (call, first, free) = self.reserve(2 * chunks, &|j| plan.readers(j));
        let d = Descriptor {
            count: count as u64,
            kind: kind_word(Collective::AllReduce, dtype, Some(op), None) | self.plan_bits(),
        };
        let steps = move |core: &HeteroCore| {
            let mut steps =
                core.flat_steps(&plan, send, recv, dtype, op, es, first, &free, (call, d));
            // An injected failure (tests): step A of the middle chunk.
            if let Some(e) = fault {
                let k = steps.len() / 4 * 2;
                steps[k].fault = Some(e);
            }
            steps
        };
        let what = Stage::Bridge.name();
        if let Some(q) = queued {
            // The steps are made by the enqueuer thread too: this thread's time does not grow
            // with the message.
            let r = q.submit(self, stream, |seq, start, end| {
                Box::new(move |core: &HeteroCore| {
                    let steps = steps(core);
                    // SAFETY: the contract of the call, passed on (the caller's stream waits
                    // for the steps' last signal before it goes on).
                    let r = unsafe { core.run_steps(steps, Link::Words { start, end, seq }) };
                    if let Err(e) = r {
                        core.fail_call(what, e);
                        Enqueuer::release(end, seq);
                    }
                })
            });
            return r.map_err(|e| self.fail_call(what, e));
        }
        // SAFETY: this function's contract.
        unsafe { self.run_steps(steps(self), Link::Stream(stream)) }
            .map_err(|e| self.fail_call(what, e))
    }

    /// The stages of an all-reduce, chunk by chunk; `stage` follows the stage being enqueued.
    ///
    /// # Safety
    /// As [`HeteroCore::all_reduce`]: `send` and `recv` hold the plan's `count` elements.
    unsafe fn all_reduce_stages(
        &self,
        plan: &ThroughPlan,
        a: AllReduceArgs<'_>,
        stage: &mut Stage,
    ) -> Result<(), HeteroError> {
        let AllReduceArgs {
            send,
            recv,
            dtype,
            op,
            es,
            call,
            count,
            first,
            free,
            link,
            fault,
        } = a;
        let cs = self.streams.cluster;
        let enter = |to: Stream| self.enter(link, to);
        let leave = |from: Stream| self.leave(link, from);
        let p = self.topo.sizes()[self.topo.my_cluster()];
        let i = self.topo.my_local();
        let me_c = self.topo.my_cluster();
        let world = self.topo.world();
        let cop = if op == ReduceOp::AVG {
            ReduceOp::SUM
        } else {
            op
        };
        let at = |ptr: DevicePtr, elems: usize| DevicePtr(ptr.0 + (elems * es) as u64);
        // The chunk where an injected failure strikes: one in the middle of the message.
        let faulty = plan.chunks() / 2;
        let injected = |s: Stage, k: usize| -> Result<(), HeteroError> {
            if fault == Some(s) && k == faulty {
                return Err(HeteroError::Stage {
                    rank: self.topo.me,
                    cluster: self.topo.cluster_name_of(self.topo.me).to_string(),
                    stage: s.name().to_string(),
                    message: "an injected failure".into(),
                });
            }
            Ok(())
        };
        if plan.chunks() == 0 {
            enter(self.streams.bridge)?;
            self.check_step(
                call,
                Descriptor {
                    count: count as u64,
                    kind: kind_word(Collective::AllReduce, dtype, Some(op), None),
                },
            )?;
            return leave(self.streams.bridge);
        }
        enter(cs)?;
        // A test's hold (`inject_hold`): chunk 1's step waits for a gate that the cluster
        // stream opens once it has gathered chunk 0.
        let gate = (plan.chunks() >= 2 && self.hold.swap(false, Ordering::AcqRel))
            .then(|| Arc::new(AtomicBool::new(false)));
        // With `FERROCX_BRIDGE_TRACE=1`, a line from the cluster stream as each of its stages
        // starts and ends (a host function between them: for finding where a pipeline waits).
        let mark = |what: &'static str, k: usize| -> Result<(), HeteroError> {
            if !step_trace() || std::env::var("FERROCX_BRIDGE_TRACE").is_ok_and(|v| v == "steps") {
                return Ok(());
            }
            self.host(
                cs,
                Box::new(move |_| {
                    eprintln!("cluster stage {what} chunk={k} t_us={}", now_us());
                    Ok(())
                }),
            )
        };
        let cell = std::cell::Cell::new(Stage::Cluster);
        let issue = |k: usize| -> Result<Issued, HeteroError> {
            let (off, elems) = plan.at(k);
            let (q, tail) = (elems / p, elems - elems / p * p);
            cell.set(Stage::Cluster);
            injected(Stage::Cluster, k)?;
            mark("rs", k)?;
            if p == 1 {
                if send != recv && elems > 0 {
                    // SAFETY: ranges of the caller's `send`/`recv` (the plan keeps every chunk
                    // inside `count` elements), live until the stages complete on the stream
                    // (the contract).
                    unsafe {
                        self.device
                            .mem_copy_async(at(recv, off), at(send, off), elems * es, cs)
                    }?;
                }
            } else {
                if q > 0 {
                    // SAFETY: as above.
                    unsafe {
                        self.ccl.reduce_scatter(
                            at(send, off),
                            at(recv, off + i * q),
                            q,
                            dtype,
                            cop,
                            self.comm,
                            cs,
                        )
                    }?;
                }
                if tail > 0 {
                    // SAFETY: as above.
                    unsafe {
                        self.ccl.all_reduce(
                            at(send, off + q * p),
                            at(recv, off + q * p),
                            tail,
                            dtype,
                            cop,
                            self.comm,
                            cs,
                        )
                    }?;
                }
            }
            mark("rs-done", k)?;
            cell.set(Stage::Staging);
            injected(Stage::Staging, k)?;
            let fault = (fault == Some(Stage::Bridge) && k == faulty).then(|| HeteroError::Stage {
                rank: self.topo.me,
                cluster: self.topo.cluster_name_of(self.topo.me).to_string(),
                stage: Stage::Bridge.name().to_string(),
                message: "an injected failure".into(),
            });
            let check = (k == 0).then_some((
                call,
                Descriptor {
                    count: count as u64,
                    kind: kind_word(Collective::AllReduce, dtype, Some(op), None)
                        | self.plan_bits(),
                },
            ));
            let gate = if k == 1 { gate.clone() } else { None };
            let slot = |epoch: u64| (epoch % self.depth as u64) as usize;
            let step = match plan {
                ThroughPlan::Clusters(plan) => {
                    let sh = plan.chunk(k).1;
                    let epoch = first + k as u64;
                    let share_bytes = (sh.share.1 - sh.share.0) * es;
                    // My own source is my slot (published from `recv` before it is
                    // overwritten).
                    debug_assert!(sh
                        .pieces
                        .iter()
                        .all(|pc| pc.owners[me_c].1 + pc.len <= sh.share.1 - sh.share.0));
                    Step {
                        epoch,
                        slot: slot(epoch),
                        free_at: free[k],
                        publish: if share_bytes > 0 {
                            vec![(at(recv, off + sh.share.0).0, 0, share_bytes)]
                        } else {
                            Vec::new()
                        },
                        outs: sh
                            .pieces
                            .iter()
                            .map(|pc| Out {
                                dst: at(recv, off + pc.start).0,
                                n: pc.len,
                                srcs: pc.owners.iter().map(|&(r, o)| (r, o * es)).collect(),
                                reduce: Some((dtype, op, world)),
                            })
                            .collect(),
                        what: "the bridge step of an all_reduce",
                        fault,
                        check,
                        gate,
                        direct: None,
                        then: None,
                    }
                }
                ThroughPlan::Hybrid(plan) => {
                    // Step A publishes my share; step B copies its pieces from the flat ranks'
                    // slots, where they wrote them reduced: on the collect stream (its own
                    // proxy), so that the next chunk's step A does not wait behind it.
                    let sh = plan.chunk(k).1;
                    let epoch = first + 2 * k as u64;
                    let (p0, p1) = sh.a.publish;
                    Step {
                        epoch,
                        slot: slot(epoch),
                        free_at: free[2 * k],
                        publish: if p1 > p0 {
                            vec![(at(recv, off + p0).0, 0, (p1 - p0) * es)]
                        } else {
                            Vec::new()
                        },
                        outs: Vec::new(),
                        what: "the bridge step of an all_reduce",
                        fault,
                        check,
                        gate,
                        direct: None,
                        then: Some(Then {
                            epoch,
                            slot: slot(epoch),
                            // A chunk's own staging slot (steps A and B): the next chunk's
                            // copies into staging may run while this chunk's steps do.
                            staging: k % self.depth.max(1),
                        }),
                    }
                }
            };
            // SAFETY: the step's ranges are the chunk's share and pieces in `recv`.
            let issued = unsafe { self.issue_step(Some(cs), step) }?;
            let ThroughPlan::Hybrid(plan) = plan else {
                return Ok(issued);
            };
            let (off, sh) = plan.chunk(k);
            let epoch = first + 2 * k as u64 + 1;
            let slot = slot(epoch);
            let step_b = Step {
                epoch,
                slot,
                free_at: free[2 * k + 1],
                publish: Vec::new(),
                outs: sh
                    .b
                    .outs
                    .iter()
                    .map(|o| Out {
                        dst: at(recv, off + o.start).0,
                        n: o.len * es,
                        srcs: o.srcs.iter().map(|&(r, x)| (r, x * es)).collect(),
                        reduce: None,
                    })
                    .collect(),
                what: "the bridge step of an all_reduce",
                fault: None,
                check: None,
                gate: None,
                direct: None,
                then: Some(Then {
                    epoch,
                    slot,
                    staging: k % self.depth.max(1),
                }),
            };
            // SAFETY: the step's ranges are the chunk's pieces in `recv`; it follows step A
            // (`issued`), whose staging slot it shares.
            unsafe { self.issue_collect(issued, step_b) }
        };
        let finish = |k: usize, issued: Issued| -> Result<(), HeteroError> {
            cell.set(Stage::Bridge);
            // SAFETY: `issued` is chunk k's, of `issue` (its step B in the hybrid plan).
            unsafe { self.finish_step(issued, Some(cs)) }?;
            cell.set(Stage::Gather);
            injected(Stage::Gather, k)?;
            mark("ag", k)?;
            let (off, elems) = plan.at(k);
            let (q, tail) = (elems / p, elems - elems / p * p);
            if p > 1 {
                if q > 0 {
                    // SAFETY: ranges of the caller's `recv` (the plan keeps every chunk inside
                    // `count` elements), live until the stages complete (the contract).
                    unsafe {
                        self.ccl.all_gather(
                            at(recv, off + i * q),
                            at(recv, off),
                            q,
                            dtype,
                            self.comm,
                            cs,
                        )
                    }?;
                }
                if tail > 0 {
                    // SAFETY: as above.
                    unsafe {
                        self.ccl.broadcast(
                            at(recv, off + q * p),
                            at(recv, off + q * p),
                            tail,
                            dtype,
                            (p - 1) as i32,
                            self.comm,
                            cs,
                        )
                    }?;
                }
            }
            if let (0, Some(g)) = (k, &gate) {
                let g = g.clone();
                self.host(
                    cs,
                    Box::new(move |_| {
                        g.store(true, Ordering::Release);
                        Ok(())
                    }),
                )?;
            }
            mark("ag-done", k)
        };
        let depth = self.depth.max(1);
        let mut pending = std::collections::VecDeque::with_capacity(depth);
        let r = (|| {
            for k in 0..plan.chunks() {
                pending.push_back((k, issue(k)?));
                if pending.len() >= depth {
                    let (j, issued) = pending.pop_front().expect("a chunk in flight");
                    finish(j, issued)?;
                }
            }
            while let Some((j, issued)) = pending.pop_front() {
                finish(j, issued)?;
            }
            leave(cs)
        })();
        self.drop_issued(pending.into_iter().map(|(_, i)| i));
        *stage = cell.get();
        r
    }

    /// Runs a bridge-only collective: `rounds` steps made by `step(round, epoch, slot,
    /// free_at)`, the first carrying the descriptor check (a lone check when `rounds` is 0).
    /// Where the host reaches the buffers, or for one round, the steps (and a staged round's
    /// copies) run on the caller's stream itself; staged rounds past one run on the copy and
    /// bridge streams, `depth` in flight, ordered after and before `stream`.
    fn bridge_only(
        &self,
        op: Collective,
        d: Descriptor,
        rounds: usize,
        readers: &dyn Fn(usize) -> u64,
        step: &dyn Fn(usize, u64, usize, u64) -> Step,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        self.ready()?;
        let (call, first, free) = self.reserve(rounds, readers);
        let r = (|| {
            self.begin(stream)?;
            if rounds == 0 {
                return self.step(
                    stream,
                    Box::new(move |b: &Bridge| b.check_call(call, d, &describe)),
                );
            }
            // The first step carries the call's descriptor check.
            let mut steps = (0..rounds).map(|k| {
                let epoch = first + k as u64;
                let mut s = step(k, epoch, (epoch % self.depth as u64) as usize, free[k]);
                if k == 0 {
                    s.check = Some((call, d));
                }
                s
            });
            let Some((st, cp)) = self.staging.as_ref().zip(self.streams.copy) else {
                // The host reaches the buffers: every step on the caller's stream, in order.
                for s in steps {
                    self.host(stream, Box::new(move |b: &Bridge| s.run(b)))?;
                }
                return Ok(());
            };
            if rounds == 1 {
                // One step: its copies and itself in order on the caller's stream (nothing to
                // overlap, no hops between streams).
                let mut s = steps.next().expect("one step");
                let (before, back) = s.stage(st.slot(s.slot), st.slot_bytes)?;
                // SAFETY: the step's ranges are the call's buffers (the callers' contract) and
                // its staging slot, which earlier calls' users reach before this stream goes on
                // (`begin`, and every call ends with its caller's stream waiting for it).
                unsafe { self.moves(&before, stream) }?;
                self.step(stream, Box::new(move |b: &Bridge| s.run(b)))?;
                // SAFETY: as above; the step wrote the staging slot.
                return unsafe { self.moves(&back, stream) };
            }
            let depth = self.depth.max(1);
            let mut pending = std::collections::VecDeque::with_capacity(depth);
            let r = (|| {
                for (k, s) in steps.enumerate() {
                    let after = (k == 0).then_some(stream);
                    // SAFETY: the steps' ranges are the call's buffers (the callers' contract).
                    pending.push_back(unsafe { self.issue_step(after, s) }?);
                    if pending.len() >= depth {
                        let issued = pending.pop_front().expect("a round in flight");
                        // SAFETY: a step of this call.
                        unsafe { self.finish_step(issued, None) }?;
                    }
                }
                while let Some(issued) = pending.pop_front() {
                    // SAFETY: as above.
                    unsafe { self.finish_step(issued, None) }?;
                }
                self.order(cp, stream)
            })();
            self.drop_issued(pending);
            r
        })();
        r.map_err(|e| self.fail_call(op.name(), e))
    }

    /// Bytes per sub-slot when a slot is cut in one per rank, a multiple of `es`.
    fn sub_slot(&self, es: usize) -> usize {
        (self.slot_bytes / self.topo.world() / 64 * 64) / es * es
    }

    /// Enqueues a barrier of every rank of the job on `stream`.
    pub fn barrier(&self, stream: Stream) -> Result<(), HeteroError> {
        let d = Descriptor {
            count: 0,
            kind: kind_word(Collective::Barrier, DataType::U8, None, None),
        };
        self.bridge_only(
            Collective::Barrier,
            d,
            0,
            &|_| 0,
            &|_, _, _, _| unreachable!(),
            stream,
        )
    }

    /// Enqueues a broadcast from `root` (any cluster) over the bridge.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        let es = elem(dtype)?;
        let root = self.root(root)?;
        let me = self.topo.me;
        let w = self.topo.world() as u64;
        let bytes = count * es;
        let per = self.slot_bytes / es * es;
        let rounds = bytes.div_ceil(per);
        let d = Descriptor {
            count: count as u64,
            kind: kind_word(Collective::Broadcast, dtype, None, Some(root)),
        };
        self.bridge_only(
            Collective::Broadcast,
            d,
            rounds,
            &|_| if me == root { w - 1 } else { 0 },
            &|k, epoch, slot, free_at| {
                let off = k * per;
                let m = per.min(bytes - off);
                Step {
                    epoch,
                    slot,
                    free_at,
                    publish: if me == root {
                        vec![(send.0 + off as u64, 0, m)]
                    } else {
                        Vec::new()
                    },
                    outs: vec![Out {
                        dst: recv.0 + off as u64,
                        n: m,
                        srcs: vec![(root, 0)],
                        reduce: None,
                    }],
                    what: "a broadcast",
                    fault: None,
                    check: None,
                    gate: None,
                    direct: None,
                    then: None,
                }
            },
            stream,
        )
    }

    /// Enqueues a reduce to `root` over the bridge.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        let es = elem(dtype)?;
        self.reducible(Collective::Reduce, dtype, op)?;
        let root = self.root(root)?;
        let me = self.topo.me;
        let w = self.topo.world();
        let bytes = count * es;
        let per = self.slot_bytes / es * es;
        let rounds = bytes.div_ceil(per);
        let d = Descriptor {
            count: count as u64,
            kind: kind_word(Collective::Reduce, dtype, Some(op), Some(root)),
        };
        self.bridge_only(
            Collective::Reduce,
            d,
            rounds,
            &|_| u64::from(me != root),
            &|k, epoch, slot, free_at| {
                let off = k * per;
                let m = per.min(bytes - off);
                Step {
                    epoch,
                    slot,
                    free_at,
                    publish: vec![(send.0 + off as u64, 0, m)],
                    outs: if me == root {
                        vec![Out {
                            dst: recv.0 + off as u64,
                            n: m / es,
                            srcs: (0..w).map(|r| (r, 0)).collect(),
                            reduce: Some((dtype, op, w)),
                        }]
                    } else {
                        Vec::new()
                    },
                    what: "a reduce",
                    fault: None,
                    check: None,
                    gate: None,
                    direct: None,
                    then: None,
                }
            },
            stream,
        )
    }

    /// Enqueues an all-gather (`all = true`) or a gather to `root` over the bridge.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: Option<usize>,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        let es = elem(dtype)?;
        let root = root.map(|r| self.root(r)).transpose()?;
        let me = self.topo.me;
        let w = self.topo.world();
        let bytes = count * es;
        // Every rank's block of a round fits one slot, so that a rank with staging receives a
        // round in one staging slot (the cut is the same on every rank, staged or not).
        let per = self.sub_slot(es).max(es);
        let rounds = bytes.div_ceil(per);
        let op = if root.is_some() {
            Collective::Gather
        } else {
            Collective::AllGather
        };
        let d = Descriptor {
            count: count as u64,
            kind: kind_word(op, dtype, None, root),
        };
        let readers = match root {
            None => w as u64 - 1,
            Some(r) => u64::from(me != r),
        };
        self.bridge_only(
            op,
            d,
            rounds,
            &|_| readers,
            &|k, epoch, slot, free_at| {
                let off = k * per;
                let m = per.min(bytes - off);
                Step {
                    epoch,
                    slot,
                    free_at,
                    publish: vec![(send.0 + off as u64, 0, m)],
                    outs: if root.is_none_or(|r| r == me) {
                        (0..w)
                            .map(|r| Out {
                                dst: recv.0 + (r * bytes + off) as u64,
                                n: m,
                                srcs: vec![(r, 0)],
                                reduce: None,
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                    what: op.name(),
                    fault: None,
                    check: None,
                    gate: None,
                    direct: None,
                    then: None,
                }
            },
            stream,
        )
    }

    /// Enqueues a block exchange over the bridge: reduce-scatter (`op` Some), all-to-all, or
    /// scatter from `root`; `count` elements per block.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn exchange(
        &self,
        kind: Collective,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
        root: Option<usize>,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        let es = elem(dtype)?;
        if let Some(op) = op {
            self.reducible(kind, dtype, op)?;
        }
        let root = root.map(|r| self.root(r)).transpose()?;
        let me = self.topo.me;
        let w = self.topo.world();
        let block = count * es;
        let sub = self.sub_slot(es);
        if sub == 0 {
            return Err(HeteroError::Unsupported(format!(
                "{kind} across clusters: [bridge] chunk_bytes is too small for {w} ranks"
            )));
        }
        let rounds = block.div_ceil(sub);
        let d = Descriptor {
            count: count as u64,
            kind: kind_word(kind, dtype, op, root),
        };
        let readers = match root {
            None => w as u64 - 1,
            Some(r) if r == me => w as u64 - 1,
            Some(_) => 0,
        };
        self.bridge_only(
            kind,
            d,
            rounds,
            &|_| readers,
            &|k, epoch, slot, free_at| {
                let off = k * sub;
                let m = sub.min(block - off);
                let publishes = root.is_none_or(|r| r == me);
                let outs = match (kind, root) {
                    (Collective::ReduceScatter, _) => vec![Out {
                        dst: recv.0 + off as u64,
                        n: m / es,
                        srcs: (0..w).map(|r| (r, me * sub)).collect(),
                        reduce: op.map(|o| (dtype, o, w)),
                    }],
                    (_, Some(r)) => vec![Out {
                        dst: recv.0 + off as u64,
                        n: m,
                        srcs: vec![(r, me * sub)],
                        reduce: None,
                    }],
                    _ => (0..w)
                        .map(|r| Out {
                            dst: recv.0 + (r * block + off) as u64,
                            n: m,
                            srcs: vec![(r, me * sub)],
                            reduce: None,
                        })
                        .collect(),
                };
                Step {
                    epoch,
                    slot,
                    free_at,
                    publish: if publishes {
                        (0..w)
                            .map(|dst| (send.0 + (dst * block + off) as u64, dst * sub, m))
                            .collect()
                    } else {
                        Vec::new()
                    },
                    outs,
                    what: kind.name(),
                    fault: None,
                    check: None,
                    gate: None,
                    direct: None,
                    then: None,
                }
            },
            stream,
        )
    }

    fn root(&self, root: usize) -> Result<usize, HeteroError> {
        if root >= self.topo.world() {
            return Err(HeteroError::Unsupported(format!(
                "root {root} is not a rank of this {}-rank job",
                self.topo.world()
            )));
        }
        Ok(root)
    }

    fn reducible(
        &self,
        op: Collective,
        dtype: DataType,
        redop: ReduceOp,
    ) -> Result<(), HeteroError> {
        if reduce::supports(dtype, redop) {
            return Ok(());
        }
        Err(HeteroError::Unsupported(format!(
            "{op} across clusters: {} with {} is not supported",
            dtype.name().unwrap_or("?"),
            redop.name().unwrap_or("?")
        )))
    }

    /// Bytes per chunk of a p2p channel (a sub-slot of the sender's p2p slot per receiver).
    fn channel_bytes(&self) -> usize {
        (self.slot_bytes / self.topo.world() / 64 * 64).max(64)
    }

    /// Chunks per round of a p2p transfer of `chunks` chunks of `ch` bytes, and the staging
    /// slot a round goes through (`None`: the device's memory is read and written directly).
    fn p2p_rounds(&self, chunks: usize, ch: usize, slot: usize) -> (usize, Option<u64>) {
        match &self.staging {
            Some(s) => ((s.slot_bytes / ch).max(1), Some(s.slot(self.depth + slot))),
            None => (chunks.max(1), None),
        }
    }

    /// Enqueues a send of `bytes` at `buf` to rank `peer` of another cluster, through the p2p
    /// channel, on the communicator's send stream (with staging: a staging slot at a time,
    /// copied from the device on the same stream).
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn send(
        &self,
        buf: DevicePtr,
        bytes: usize,
        peer: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        self.ready()?;
        let me = self.topo.me;
        let ch = self.channel_bytes();
        let chunks = bytes.div_ceil(ch).max(1);
        let first = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let f = st.sent[peer];
            st.sent[peer] += chunks as u64;
            f
        };
        let ss = self.streams.send;
        self.order(stream, ss)?;
        let (per, staging) = self.p2p_rounds(chunks, ch, SEND_SLOT);
        for j0 in (0..chunks).step_by(per) {
            let j1 = (j0 + per).min(chunks);
            let (off0, end) = ((j0 * ch).min(bytes), (j1 * ch).min(bytes));
            let src = match staging {
                Some(s) => {
                    if end > off0 {
                        // SAFETY: `buf` holds `bytes` (the contract); the send staging slot
                        // holds `per * ch` bytes and is used by this stream alone, in order.
                        unsafe {
                            self.device.mem_copy_async(
                                DevicePtr(s),
                                DevicePtr(buf.0 + off0 as u64),
                                end - off0,
                                ss,
                            )
                        }?;
                    }
                    s
                }
                None => buf.0 + off0 as u64,
            };
            self.host(
                ss,
                Box::new(move |b: &Bridge| {
                    for j in j0..j1 {
                        let seq = first + j as u64 + 1;
                        b.wait(b.p2p_acked(peer, me), seq - 1, peer, "a receive")?;
                        let off = (j * ch).min(bytes);
                        let m = ch.min(bytes - off);
                        // SAFETY: `src` holds this round's bytes (the caller's buffer or the
                        // staging slot); sub-slot `peer` of the p2p slot holds `ch`, free: the
                        // receiver acknowledged the previous chunk.
                        unsafe {
                            std::ptr::copy(
                                (src as *const u8).add(off - off0),
                                b.slot(me, b.depth()).add(peer * ch),
                                m,
                            )
                        };
                        b.publish(b.p2p_sent(me, peer), seq);
                    }
                    Ok(())
                }),
            )?;
        }
        self.hand_back(ss, stream)
    }

    /// Enqueues a receive of `bytes` at `buf` from rank `peer` of another cluster, on the
    /// communicator's receive stream (with staging: a staging slot at a time, copied to the
    /// device on the same stream).
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn recv(
        &self,
        buf: DevicePtr,
        bytes: usize,
        peer: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        self.ready()?;
        let me = self.topo.me;
        let ch = self.channel_bytes();
        let chunks = bytes.div_ceil(ch).max(1);
        let first = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let f = st.received[peer];
            st.received[peer] += chunks as u64;
            f
        };
        let rs = self.streams.recv;
        self.order(stream, rs)?;
        let (per, staging) = self.p2p_rounds(chunks, ch, RECV_SLOT);
        for j0 in (0..chunks).step_by(per) {
            let j1 = (j0 + per).min(chunks);
            let (off0, end) = ((j0 * ch).min(bytes), (j1 * ch).min(bytes));
            let dst = staging.unwrap_or(buf.0 + off0 as u64);
            self.host(
                rs,
                Box::new(move |b: &Bridge| {
                    for j in j0..j1 {
                        let seq = first + j as u64 + 1;
                        b.wait(b.p2p_sent(peer, me), seq, peer, "a send")?;
                        let off = (j * ch).min(bytes);
                        let m = ch.min(bytes - off);
                        // SAFETY: as in `send`: the sender published this chunk and waits
                        // for our acknowledgement before rewriting it; `dst` holds the round.
                        unsafe {
                            std::ptr::copy(
                                b.slot(peer, b.depth()).add(me * ch),
                                (dst as *mut u8).add(off - off0),
                                m,
                            )
                        };
                        b.publish(b.p2p_acked(me, peer), seq);
                    }
                    Ok(())
                }),
            )?;
            if let Some(s) = staging.filter(|_| end > off0) {
                // SAFETY: `buf` holds `bytes` (the contract); the receive staging slot is
                // used by this stream alone, in order (the step above wrote it).
                unsafe {
                    self.device.mem_copy_async(
                        DevicePtr(buf.0 + off0 as u64),
                        DevicePtr(s),
                        end - off0,
                        rs,
                    )
                }?;
            }
        }
        self.hand_back(rs, stream)
    }

    /// Enqueues an all-to-all with per-peer counts: every block through the p2p channels, by
    /// one step that makes progress on every send and receive at once (no order of peers can
    /// deadlock).
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_allv(
        &self,
        send: DevicePtr,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: DevicePtr,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        self.ready()?;
        let es = elem(dtype)?;
        let w = self.topo.world();
        for (name, v) in [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ] {
            if v.len() != w {
                return Err(HeteroError::Unsupported(format!(
                    "all_to_allv: {name} has {} entries for {w} ranks",
                    v.len()
                )));
            }
        }
        let me = self.topo.me;
        let ch = self.channel_bytes();
        let chunks = |bytes: usize| bytes.div_ceil(ch) as u64;
        // (peer, address, bytes, first seq).
        let (sends, recvs) = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let mut sends = Vec::new();
            let mut recvs = Vec::new();
            for r in 0..w {
                let sb = send_counts[r] * es;
                let rb = recv_counts[r] * es;
                if r == me {
                    continue;
                }
                sends.push((r, send.0 + (send_displs[r] * es) as u64, sb, st.sent[r]));
                st.sent[r] += chunks(sb);
                recvs.push((r, recv.0 + (recv_displs[r] * es) as u64, rb, st.received[r]));
                st.received[r] += chunks(rb);
            }
            (sends, recvs)
        };
        let own = (
            send.0 + (send_displs[me] * es) as u64,
            recv.0 + (recv_displs[me] * es) as u64,
            send_counts[me].min(recv_counts[me]) * es,
        );
        let d = Descriptor {
            count: 0,
            kind: kind_word(Collective::AllToAllv, dtype, None, None),
        };
        let bs = self.streams.bridge;
        let (call, _, _) = self.reserve(0, &|_| 0);
        let r = (|| {
            self.begin(stream)?;
            self.order(stream, bs)?;
            self.check_step(call, d)?;
            let (Some(st), Some(cp)) = (&self.staging, self.streams.copy) else {
                self.host(
                    bs,
                    Box::new(move |b: &Bridge| {
                        // SAFETY: own blocks, by the buffer contract.
                        unsafe { std::ptr::copy(own.0 as *const u8, own.1 as *mut u8, own.2) };
                        p2p_progress(b, me, ch, &sends, &recvs)
                    }),
                )?;
                return self.order(bs, stream);
            };
            // Staged: round k moves chunk k of every pair, through one sub-slot per peer of
            // the out and in staging slots (w · ch bytes fit a slot).
            let (out, inn) = (
                st.slot(self.depth + A2A_OUT_SLOT),
                st.slot(self.depth + A2A_IN_SLOT),
            );
            self.order(stream, cp)?;
            // SAFETY: own blocks, by the buffer contract (a copy on the device).
            unsafe { self.moves(&[(own.1, own.0, own.2)], cp) }?;
            let rounds = sends
                .iter()
                .chain(&recvs)
                .map(|x| x.2.div_ceil(ch))
                .max()
                .unwrap_or(0);
            for k in 0..rounds {
                let off = k * ch;
                let cut = |&(peer, addr, bytes, first): &(usize, u64, usize, u64), at: u64| {
                    (off < bytes).then(|| {
                        let m = ch.min(bytes - off);
                        (
                            (peer, at + (peer * ch) as u64, m, first + k as u64),
                            addr + off as u64,
                        )
                    })
                };
                let sk: Vec<_> = sends.iter().filter_map(|x| cut(x, out)).collect();
                let rk: Vec<_> = recvs.iter().filter_map(|x| cut(x, inn)).collect();
                let before: Vec<Move> = sk.iter().map(|(c, a)| (c.1, *a, c.2)).collect();
                let after: Vec<Move> = rk.iter().map(|(c, a)| (*a, c.1, c.2)).collect();
                let sk: Vec<_> = sk.into_iter().map(|x| x.0).collect();
                let rk: Vec<_> = rk.into_iter().map(|x| x.0).collect();
                // SAFETY: the blocks of the caller's buffers (the contract) and the out
                // staging slot, free: the previous round's step ran before the copy stream
                // went on.
                unsafe { self.moves(&before, cp) }?;
                self.order(cp, bs)?;
                self.step(
                    bs,
                    Box::new(move |b: &Bridge| p2p_progress(b, me, ch, &sk, &rk)),
                )?;
                self.order(bs, cp)?;
                // SAFETY: the step above wrote the in staging slot; the blocks are the
                // caller's (the contract).
                unsafe { self.moves(&after, cp) }?;
            }
            if rounds == 0 {
                self.order(bs, stream)?;
            }
            self.order(cp, stream)
        })();
        r.map_err(|e| self.fail_call(Collective::AllToAllv.name(), e))
    }

    /// Releases the streams and events (after draining them).
    fn release(&mut self) {
        let _ = self.drain();
        for p in [&mut self.proxy, &mut self.collector].into_iter().flatten() {
            p.stop(&self.device);
        }
        self.events
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .destroy(&self.device);
        if let Some(st) = &mut self.staging {
            st.free(&self.device);
        }
        for st in self.streams.all() {
            let _ = self.device.stream_destroy(st);
        }
    }
}

/// Moves every chunk of `sends` and `recvs` (peer, address, bytes, first seq) through the p2p
/// channels, polling all of them, until all are done or a peer fails.
fn p2p_progress(
    b: &Bridge,
    me: usize,
    ch: usize,
    sends: &[(usize, u64, usize, u64)],
    recvs: &[(usize, u64, usize, u64)],
) -> Result<(), HeteroError> {
    let mut sent = vec![0usize; sends.len()];
    let mut got = vec![0usize; recvs.len()];
    let total_s: Vec<usize> = sends.iter().map(|s| s.2.div_ceil(ch)).collect();
    let total_r: Vec<usize> = recvs.iter().map(|r| r.2.div_ceil(ch)).collect();
    let start = std::time::Instant::now();
    let mut idle: u32 = 0;
    loop {
        let mut progress = false;
        for (i, &(peer, addr, bytes, first)) in sends.iter().enumerate() {
            while sent[i] < total_s[i] {
                let seq = first + sent[i] as u64 + 1;
                if b.p2p_acked(peer, me).load(Ordering::Acquire) < seq - 1 {
                    break;
                }
                let off = sent[i] * ch;
                let m = ch.min(bytes - off);
                // SAFETY: `addr` holds `bytes`; the sub-slot is free (acknowledged).
                unsafe {
                    std::ptr::copy(
                        (addr as *const u8).add(off),
                        b.slot(me, b.depth()).add(peer * ch),
                        m,
                    )
                };
                b.publish(b.p2p_sent(me, peer), seq);
                sent[i] += 1;
                progress = true;
            }
        }
        for (i, &(peer, addr, bytes, first)) in recvs.iter().enumerate() {
            while got[i] < total_r[i] {
                let seq = first + got[i] as u64 + 1;
                if b.p2p_sent(peer, me).load(Ordering::Acquire) < seq {
                    break;
                }
                let off = got[i] * ch;
                let m = ch.min(bytes - off);
                // SAFETY: the peer published this chunk and waits for our acknowledgement.
                unsafe {
                    std::ptr::copy(
                        b.slot(peer, b.depth()).add(me * ch),
                        (addr as *mut u8).add(off),
                        m,
                    )
                };
                b.publish(b.p2p_acked(me, peer), seq);
                got[i] += 1;
                progress = true;
            }
        }
        let pending_s = sends
            .iter()
            .enumerate()
            .find(|(i, _)| sent[*i] < total_s[*i]);
        let pending_r = recvs
            .iter()
            .enumerate()
            .find(|(i, _)| got[*i] < total_r[*i]);
        let whom = match (pending_r, pending_s) {
            (None, None) => return Ok(()),
            (Some((_, r)), _) => r.0,
            (None, Some((_, s))) => s.0,
        };
        if progress {
            idle = 0;
            continue;
        }
        idle += 1;
        if idle > 2_000 {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::hint::spin_loop();
        }
        if idle % 100 == 0 {
            if let Some(e) = b.failure() {
                return Err(e);
            }
            if !b.alive(whom) || start.elapsed() > b.timeout() {
                let e = b.absent_or_dead(whom, "an all_to_allv");
                b.record_failure(whom, &e);
                return Err(e);
            }
        }
    }
}

/// The cross-cluster side of one communicator (see the module docs): over shared memory, its
/// [`HeteroCore`] and the enqueuer thread that enqueues large all-reduces for the caller; or
/// the MPI bridge between hosts ([`mpi`]).
pub struct Hetero {
    imp: Imp,
}

enum Imp {
    Shm {
        core: Arc<HeteroCore>,
        enqueuer: Option<Enqueuer>,
    },
    Mpi(Box<mpi::MpiBridge>),
}

/// Which bridge carries a job's collectives across clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BridgeKind {
    /// The POSIX shared-memory segment (every rank on one host).
    SharedMemory,
    /// MPI, through the `mpi` CCL adaptor (across hosts).
    Mpi,
}

impl std::fmt::Display for BridgeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BridgeKind::SharedMemory => "shared memory",
            BridgeKind::Mpi => "MPI",
        })
    }
}

/// Forwards a collective to the bridge in use.
macro_rules! both {
    ($self:ident, $name:ident ( $($arg:expr),* )) => {
        match &$self.imp {
            Imp::Shm { core, .. } => core.$name($($arg),*),
            Imp::Mpi(m) => m.$name($($arg),*),
        }
    };
}

impl Hetero {
    /// Makes the cross-cluster side of a communicator over shared memory: its streams and the
    /// bridge segment (collective: every rank of the job calls it, in the same communicator
    /// order). `comm` is the cluster's communicator, on `device` and `ccl`; `name` the bridge
    /// segment's name.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        topo: Topology,
        device: Device,
        ccl: Ccl,
        comm: Comm,
        config: &BridgeConfig,
        local_device: i32,
        name: &str,
        timeout: Duration,
    ) -> Result<Hetero, HeteroError> {
        let core = Arc::new(HeteroCore::make(
            topo,
            device,
            ccl,
            comm,
            config,
            local_device,
            name,
            timeout,
        )?);
        let enqueuer = Enqueuer::start(&core, local_device);
        Ok(Hetero {
            imp: Imp::Shm { core, enqueuer },
        })
    }

    /// The cross-cluster side of a communicator over MPI (see [`mpi`]).
    pub fn over_mpi(bridge: mpi::MpiBridge) -> Hetero {
        Hetero {
            imp: Imp::Mpi(Box::new(bridge)),
        }
    }

    /// Which bridge this communicator uses.
    pub fn kind(&self) -> BridgeKind {
        match self.imp {
            Imp::Shm { .. } => BridgeKind::SharedMemory,
            Imp::Mpi(_) => BridgeKind::Mpi,
        }
    }

    /// The shared-memory side, when that is the bridge (plans, staging, events: for tests
    /// and reports).
    pub fn shm(&self) -> Option<&HeteroCore> {
        match &self.imp {
            Imp::Shm { core, .. } => Some(core),
            Imp::Mpi(_) => None,
        }
    }

    /// The clusters and this rank's place.
    pub fn topology(&self) -> &Topology {
        both!(self, topology())
    }

    /// `true` when large all-reduces are enqueued by the enqueuer thread.
    pub fn enqueued(&self) -> bool {
        matches!(
            &self.imp,
            Imp::Shm {
                enqueuer: Some(_),
                ..
            }
        )
    }

    /// Plans in the shared-memory bridge's cache (none over MPI).
    pub fn plans_cached(&self) -> usize {
        self.shm().map_or(0, |c| c.plans_cached())
    }

    /// Peers' inputs this rank keeps mapped ([`HeteroCore::inputs_mapped`]; 0 over MPI).
    pub fn inputs_mapped(&self) -> usize {
        self.shm().map_or(0, HeteroCore::inputs_mapped)
    }

    /// The plan of this rank's all-reduces past one step over the shared-memory bridge
    /// ([`HeteroCore::all_reduce_plan_name`]); `None` over MPI.
    pub fn all_reduce_plan_name(&self) -> Option<&'static str> {
        self.shm().map(HeteroCore::all_reduce_plan_name)
    }

    /// `true` when the device's buffers move through staging (host memory between the
    /// device and the bridge).
    pub fn staged(&self) -> bool {
        match &self.imp {
            Imp::Shm { core, .. } => core.staged(),
            Imp::Mpi(m) => m.staged(),
        }
    }

    /// `true` when the bridge steps run on the proxy thread.
    pub fn proxied(&self) -> bool {
        self.shm().is_some_and(|c| c.proxied())
    }

    /// Streams the communicator made for its plans.
    pub fn streams_made(&self) -> usize {
        both!(self, streams_made())
    }

    /// Events the bridge has made so far.
    pub fn events_made(&self) -> usize {
        both!(self, events_made())
    }

    /// All-reduces handed to the enqueuer thread so far (0 over MPI, which has none).
    pub fn handed_to_enqueuer(&self) -> u64 {
        self.shm().map_or(0, |c| c.handed_to_enqueuer())
    }

    /// Makes this rank's next all_reduce fail at `stage` (the shared-memory bridge's tests).
    pub fn inject_failure(&self, stage: Stage) {
        if let Some(c) = self.shm() {
            c.inject_failure(stage);
        }
    }

    /// Makes this rank's next all_reduce through the clusters hold its second chunk's bridge
    /// step until its cluster stream has gathered the first chunk (the shared-memory bridge's
    /// tests; see [`HeteroCore::inject_hold`]).
    pub fn inject_hold(&self) {
        if let Some(c) = self.shm() {
            c.inject_hold();
        }
    }

    /// The first failure of a bridge step already run, or one another rank recorded (over
    /// MPI, failures come with the stream's error: see [`Hetero::explain`]).
    pub fn check(&self) -> Result<(), HeteroError> {
        both!(self, check())
    }

    /// Why a call failed, as precisely as the bridge knows (a rank and its cluster).
    pub fn explain(&self) -> Option<HeteroError> {
        both!(self, explain())
    }

    /// Waits for every stream of the bridge.
    pub fn drain(&self) -> Result<(), AdaptorError> {
        both!(self, drain())
    }

    /// Enqueues the all-reduce on `stream` (see the module docs): over shared memory one step
    /// for a small one, the plan otherwise (its stages enqueued by the enqueuer thread for a
    /// large one); over MPI one `MPI_Iallreduce` of the whole job.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        match &self.imp {
            // SAFETY: this function's contract.
            Imp::Shm { core, enqueuer } => unsafe {
                core.all_reduce_on(send, recv, count, dtype, op, stream, enqueuer.as_ref())
            },
            // SAFETY: this function's contract.
            Imp::Mpi(m) => unsafe { m.all_reduce(send, recv, count, dtype, op, stream) },
        }
    }

    /// Enqueues a barrier of every rank of the job on `stream`.
    pub fn barrier(&self, stream: Stream) -> Result<(), HeteroError> {
        both!(self, barrier(stream))
    }

    /// Starts a group: on the shared-memory bridge, sends and receives across clusters hand
    /// the caller's stream back only at the group's end ([`HeteroCore::group_start`]); on the
    /// bridge's own CCL where it has one apart from the cluster's (MPI), its group. The
    /// communicator's [`group_start`](crate::comm::Communicator::group_start).
    pub fn group_start(&self) -> Result<(), HeteroError> {
        match &self.imp {
            Imp::Shm { core, .. } => {
                core.group_start();
                Ok(())
            }
            Imp::Mpi(m) => m.group_start(),
        }
    }

    /// Ends the group [`Hetero::group_start`] started.
    pub fn group_end(&self) -> Result<(), HeteroError> {
        match &self.imp {
            Imp::Shm { core, .. } => core.group_end(),
            Imp::Mpi(m) => m.group_end(),
        }
    }

    /// Enqueues a broadcast from `root` (any cluster).
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        // SAFETY: this function's contract.
        unsafe { both!(self, broadcast(send, recv, count, dtype, root, stream)) }
    }

    /// Enqueues a reduce to `root` (any cluster).
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        // SAFETY: this function's contract.
        unsafe { both!(self, reduce(send, recv, count, dtype, op, root, stream)) }
    }

    /// Enqueues an all-gather (`root` None) or a gather to `root`.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: Option<usize>,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        // SAFETY: this function's contract.
        unsafe { both!(self, gather(send, recv, count, dtype, root, stream)) }
    }

    /// Enqueues a block exchange: reduce-scatter (`op` Some), all-to-all, or scatter from
    /// `root`; `count` elements per block.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn exchange(
        &self,
        kind: Collective,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
        root: Option<usize>,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        // SAFETY: this function's contract.
        unsafe {
            both!(
                self,
                exchange(kind, send, recv, count, dtype, op, root, stream)
            )
        }
    }

    /// Enqueues an all-to-all with per-peer counts and displacements.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_allv(
        &self,
        send: DevicePtr,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: DevicePtr,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        // SAFETY: this function's contract.
        unsafe {
            both!(
                self,
                all_to_allv(
                    send,
                    send_counts,
                    send_displs,
                    recv,
                    recv_counts,
                    recv_displs,
                    dtype,
                    stream
                )
            )
        }
    }

    /// Enqueues a send of `bytes` at `buf` to rank `peer` of another cluster.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn send(
        &self,
        buf: DevicePtr,
        bytes: usize,
        peer: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        // SAFETY: this function's contract.
        unsafe { both!(self, send(buf, bytes, peer, stream)) }
    }

    /// Enqueues a receive of `bytes` at `buf` from rank `peer` of another cluster.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn recv(
        &self,
        buf: DevicePtr,
        bytes: usize,
        peer: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        // SAFETY: this function's contract.
        unsafe { both!(self, recv(buf, bytes, peer, stream)) }
    }
}

impl Drop for Hetero {
    fn drop(&mut self) {
        if let Imp::Shm {
            core,
            enqueuer: Some(q),
        } = &mut self.imp
        {
            let core = &*core;
            q.stop(&core.device, || {
                let _ = core.drain();
                let last = core.state.lock().unwrap_or_else(|p| p.into_inner()).last;
                if let Some(s) = last {
                    let _ = core.device.stream_synchronize(s);
                }
            });
        }
    }
}

fn elem(dtype: DataType) -> Result<usize, HeteroError> {
    dtype
        .size()
        .ok_or_else(|| HeteroError::Unsupported(format!("unknown data type {}", dtype.0)))
}

impl Drop for HeteroCore {
    fn drop(&mut self) {
        self.release();
    }
}
