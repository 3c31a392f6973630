//! Jobs across clusters: every collective of a [`Communicator`](crate::comm::Communicator)
//! whose ranks span several `[[cluster]]`s, each with its own device and CCL adaptors.
//!
//! Each rank holds its cluster's communicator (its CCL over the cluster's ranks, cluster-local
//! rank = its position in the cluster's rank list) and the **bridge** ([`bridge`]): host memory
//! shared by every rank of the job (on one host: a POSIX shared-memory segment), with staging
//! slots and monotonic signal words per rank. Each call runs a **plan**:
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
//! **Ordering:** the calling thread only enqueues. The stages run on the communicator's own
//! streams (the cluster stream for the CCL, the bridge stream for the bridge steps, a send and
//! a receive stream for point-to-point), ordered by `event_record` + `stream_wait_event` with
//! events from a per-communicator [`pool`] (an event is taken again only once its record
//! completed). A bridge step is a host function on the bridge stream (`launch_host_func`: the
//! documented fallback of a device without stream memory operations); on a device whose
//! memory the host addresses (`HOST_ADDRESSABLE`, the host device) it reads and writes the
//! device buffers directly. Streams, events and staging are made once per communicator.
//!
//! **The other collectives** run over the bridge alone, every rank reading what it needs from
//! the others' slots, chunk by chunk through the same epochs: broadcast (root in any cluster),
//! reduce, gather, scatter, all_gather, reduce_scatter, all_to_all; all_to_allv and send/recv
//! between ranks of different clusters go through per-pair channels (a sub-slot per
//! destination in the sender's p2p slot). Send/recv inside a cluster take its CCL.
//!
//! **Checks and failures:** each collective first publishes a descriptor (collective, count,
//! dtype, op, root) and compares it with every rank's, so a count or dtype that differs across
//! clusters fails on every rank with the same error naming both ranks. A wait on a peer that
//! does not arrive within `timeout_ms` (or whose process is gone) fails naming the rank and its
//! cluster, and records the failure in the bridge so every other rank fails with it too. A
//! failed step breaks the communicator's bridge: later steps do nothing and report it.

pub mod bridge;
pub mod plan;
pub mod pool;
pub mod reduce;
pub mod topo;

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::abi::{Capabilities, Comm, DataType, DevicePtr, ReduceOp, Stream};
use crate::adaptor::{AdaptorError, Ccl, Device};
use crate::config::{BridgeCcl, BridgeConfig};
use crate::route::Collective;

use bridge::{Bridge, Descriptor};
use plan::AllReducePlan;
use pool::EventPool;
use topo::Topology;

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

/// Runs a [`Job`] boxed by [`Hetero::host`], on the stream's thread.
unsafe extern "C" fn run_job(user: *mut c_void) {
    // SAFETY: `user` is the box `Hetero::host` leaked; the adaptor calls this once.
    let job = unsafe { Box::from_raw(user.cast::<Job>()) };
    let Job { shared, work } = *job;
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

/// The streams of the plans.
struct Streams {
    cluster: Stream,
    bridge: Stream,
    send: Stream,
    recv: Stream,
}

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
}

/// The cross-cluster side of one communicator.
pub struct Hetero {
    topo: Topology,
    device: Device,
    ccl: Ccl,
    comm: Comm,
    shared: Arc<Shared>,
    streams: Streams,
    events: Mutex<EventPool>,
    state: Mutex<State>,
    host_addressable: bool,
    depth: usize,
    slot_bytes: usize,
}

/// One copy or reduction of a bridge step: `dst` gets `n` elements (bytes for a copy) read
/// from `srcs` (rank, byte offset in that rank's slot).
struct Out {
    dst: u64,
    n: usize,
    srcs: Vec<(usize, usize)>,
    reduce: Option<(DataType, ReduceOp, usize)>,
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
}

impl Step {
    fn run(self, b: &Bridge) -> Result<(), HeteroError> {
        let me = b.topo().me;
        let slot = self.slot;
        if !self.publish.is_empty() {
            b.wait(
                b.done(me, slot),
                self.free_at,
                me,
                "the release of a staging slot",
            )?;
            let base = b.slot(me, slot);
            for &(src, off, bytes) in &self.publish {
                // SAFETY: `src` holds `bytes` by the collective's buffer contract; the slot
                // holds `off + bytes` (planned against the slot's size) and no reader reads it
                // until `arrive` below.
                unsafe { std::ptr::copy(src as *const u8, base.add(off), bytes) };
            }
        }
        b.arrive(me, slot).store(self.epoch + 1, Ordering::Release);
        let mut read: Vec<usize> = Vec::new();
        for out in &self.outs {
            let mut srcs = Vec::with_capacity(out.srcs.len());
            for &(r, off) in &out.srcs {
                if r != me {
                    b.wait(b.arrive(r, slot), self.epoch + 1, r, self.what)?;
                    if !read.contains(&r) {
                        read.push(r);
                    }
                }
                // SAFETY: inside rank r's slot (planned against its size).
                srcs.push(unsafe { b.slot(r, slot).add(off) }.cast_const());
            }
            match out.reduce {
                // SAFETY: `dst` holds `n` elements by the buffer contract; the sources hold
                // them (published by their ranks, not rewritten before our `done`).
                Some((dtype, op, div)) => unsafe {
                    reduce::reduce(out.dst as *mut u8, &srcs, out.n, dtype, op, div)
                },
                // SAFETY: as above, `n` bytes.
                None => unsafe { std::ptr::copy(srcs[0], out.dst as *mut u8, out.n) },
            }
        }
        for r in read {
            b.done(r, slot).fetch_add(1, Ordering::AcqRel);
        }
        Ok(())
    }
}

/// Packs a collective's kind, dtype, op and root into a descriptor word.
fn kind_word(op: Collective, dtype: DataType, redop: Option<ReduceOp>, root: Option<usize>) -> u64 {
    (op as u64)
        | (u64::from(dtype.0 as u8) << 8)
        | (redop.map_or(0xff, |o| u64::from(o.0 as u8)) << 16)
        | (root.map_or(0xffff_ffff, |r| r as u64 & 0xffff_ffff) << 32)
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
    s
}

impl Hetero {
    /// Makes the cross-cluster side of a communicator: its streams and the bridge (collective:
    /// every rank of the job calls it, in the same communicator order). `comm` is the
    /// cluster's communicator, on `device` and `ccl`; `name` the bridge segment's name.
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
        match config.ccl {
            BridgeCcl::Host | BridgeCcl::Auto => {}
            BridgeCcl::Mpi => {
                return Err(HeteroError::Unsupported(
                    "[bridge] ccl = \"mpi\": the MPI bridge between hosts is not available yet \
                     (use \"host\": every rank on one host)"
                        .into(),
                ))
            }
        }
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
        tracing::debug!(
            clusters = topo.clusters.len(),
            world,
            depth,
            slot_bytes,
            host_addressable,
            "bridge ready: {name}"
        );
        Ok(Hetero {
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
            }),
            host_addressable,
            depth,
            slot_bytes,
            topo,
        })
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
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .plans
            .len()
    }

    /// The first failure of a bridge step already run, or one another rank recorded.
    pub fn check(&self) -> Result<(), HeteroError> {
        self.shared.check()
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

    /// Waits for every stream of the plans (teardown and `synchronize`).
    pub fn drain(&self) -> Result<(), AdaptorError> {
        let s = &self.streams;
        let mut first = Ok(());
        for st in [s.cluster, s.bridge, s.send, s.recv] {
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

    fn need_host_addressable(&self, op: Collective) -> Result<(), HeteroError> {
        if self.host_addressable {
            return Ok(());
        }
        Err(HeteroError::Unsupported(format!(
            "{op} across clusters: the device adaptor `{}` is not host-addressable, and \
             staging its buffers through the bridge's copy stream is not available yet",
            self.device.name()
        )))
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
        self.host(
            self.streams.bridge,
            Box::new(move |b: &Bridge| b.check_call(call, d, &describe)),
        )
    }

    /// Fails at once if an earlier step failed (its rounds would be out of step).
    fn ready(&self) -> Result<(), HeteroError> {
        self.shared.check()
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

    /// Enqueues the all-reduce plan on `stream` (see the module docs).
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
        self.ready()?;
        self.need_host_addressable(Collective::AllReduce)?;
        let es = elem(dtype)?;
        if !reduce::supports(dtype, op) {
            return Err(HeteroError::Unsupported(format!(
                "all_reduce across clusters: {} with {} is not supported",
                dtype.name().unwrap_or("?"),
                op.name().unwrap_or("?")
            )));
        }
        let plan = self.all_reduce_plan(count, dtype, es);
        let (call, first, free) = self.reserve(plan.chunks, &|k| plan.chunk(k).1.readers);
        self.check_step(
            call,
            Descriptor {
                count: count as u64,
                kind: kind_word(Collective::AllReduce, dtype, Some(op), None),
            },
        )?;
        // SAFETY: this function's contract, passed on.
        let r = unsafe {
            self.all_reduce_stages(&plan, send, recv, dtype, op, es, first, &free, stream)
        };
        if let Err(e) = &r {
            // The epochs reserved are not all enqueued: the bridge is out of step.
            self.shared.fail(e.clone());
        }
        r
    }

    /// The stages of an all-reduce, chunk by chunk.
    ///
    /// # Safety
    /// As [`Hetero::all_reduce`]: `send` and `recv` hold the plan's `count` elements.
    #[allow(clippy::too_many_arguments)]
    unsafe fn all_reduce_stages(
        &self,
        plan: &AllReducePlan,
        send: DevicePtr,
        recv: DevicePtr,
        dtype: DataType,
        op: ReduceOp,
        es: usize,
        first: u64,
        free: &[u64],
        stream: Stream,
    ) -> Result<(), HeteroError> {
        let cs = self.streams.cluster;
        let bs = self.streams.bridge;
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
        self.order(stream, cs)?;
        let issue = |k: usize| -> Result<(), HeteroError> {
            let (off, sh) = plan.chunk(k);
            let (q, tail) = (sh.q, sh.tail);
            if p == 1 {
                if send != recv && sh.elems > 0 {
                    // SAFETY: ranges of the caller's `send`/`recv` (the plan keeps every chunk inside `count`
                    // elements), live until the stages complete on the stream (the contract).
                    unsafe {
                        self.device
                            .mem_copy_async(at(recv, off), at(send, off), sh.elems * es, cs)
                    }?;
                }
            } else {
                if q > 0 {
                    // SAFETY: ranges of the caller's `send`/`recv` (the plan keeps every chunk inside `count`
                    // elements), live until the stages complete on the stream (the contract).
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
                    // SAFETY: ranges of the caller's `send`/`recv` (the plan keeps every chunk inside `count`
                    // elements), live until the stages complete on the stream (the contract).
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
            self.order(cs, bs)?;
            let epoch = first + k as u64;
            let share_bytes = (sh.share.1 - sh.share.0) * es;
            let step = Step {
                epoch,
                slot: (epoch % self.depth as u64) as usize,
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
            };
            // My own source is my slot (published from `recv` before it is overwritten).
            debug_assert!(sh
                .pieces
                .iter()
                .all(|pc| pc.owners[me_c].1 + pc.len <= sh.share.1 - sh.share.0));
            self.host(bs, Box::new(move |b: &Bridge| step.run(b)))?;
            Ok(())
        };
        let finish = |k: usize| -> Result<(), HeteroError> {
            self.order(bs, cs)?;
            let (off, sh) = plan.chunk(k);
            let (q, tail) = (sh.q, sh.tail);
            if p > 1 {
                if q > 0 {
                    // SAFETY: ranges of the caller's `send`/`recv` (the plan keeps every chunk inside `count`
                    // elements), live until the stages complete on the stream (the contract).
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
                    // SAFETY: ranges of the caller's `send`/`recv` (the plan keeps every chunk inside `count`
                    // elements), live until the stages complete on the stream (the contract).
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
            Ok(())
        };
        let depth = self.depth.max(1);
        for k in 0..plan.chunks {
            issue(k)?;
            if k + 1 >= depth {
                finish(k + 1 - depth)?;
            }
        }
        for k in (plan.chunks + 1).saturating_sub(depth)..plan.chunks {
            finish(k)?;
        }
        self.order(cs, stream)
    }

    /// Runs a bridge-only collective: the descriptor check, then `rounds` steps made by
    /// `step(round, epoch, slot, free_at)` on the bridge stream, ordered after and before
    /// `stream`.
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
        self.need_host_addressable(op)?;
        let (call, first, free) = self.reserve(rounds, readers);
        let r = (|| {
            self.order(stream, self.streams.bridge)?;
            self.check_step(call, d)?;
            for (k, &free_at) in free.iter().enumerate() {
                let epoch = first + k as u64;
                let s = step(k, epoch, (epoch % self.depth as u64) as usize, free_at);
                self.host(self.streams.bridge, Box::new(move |b: &Bridge| s.run(b)))?;
            }
            self.order(self.streams.bridge, stream)
        })();
        if let Err(e) = &r {
            self.shared.fail(e.clone());
        }
        r
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
        let per = self.slot_bytes / es * es;
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

    /// Enqueues a send of `bytes` at `buf` to rank `peer` of another cluster, through the p2p
    /// channel, on the communicator's send stream.
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
        self.need_host_addressable(Collective::Send)?;
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
        self.host(
            ss,
            Box::new(move |b: &Bridge| {
                for j in 0..chunks {
                    let seq = first + j as u64 + 1;
                    b.wait(b.p2p_acked(peer, me), seq - 1, peer, "a receive")?;
                    let off = j * ch;
                    let m = ch.min(bytes - off.min(bytes));
                    // SAFETY: `buf` holds `bytes`; sub-slot `peer` of the p2p slot holds `ch`,
                    // free: the receiver acknowledged the previous chunk.
                    unsafe {
                        std::ptr::copy(
                            (buf.0 as *const u8).add(off),
                            b.slot(me, b.depth()).add(peer * ch),
                            m,
                        )
                    };
                    b.p2p_sent(me, peer).store(seq, Ordering::Release);
                }
                Ok(())
            }),
        )?;
        self.order(ss, stream)
    }

    /// Enqueues a receive of `bytes` at `buf` from rank `peer` of another cluster, on the
    /// communicator's receive stream.
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
        self.need_host_addressable(Collective::Recv)?;
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
        self.host(
            rs,
            Box::new(move |b: &Bridge| {
                for j in 0..chunks {
                    let seq = first + j as u64 + 1;
                    b.wait(b.p2p_sent(peer, me), seq, peer, "a send")?;
                    let off = j * ch;
                    let m = ch.min(bytes - off.min(bytes));
                    // SAFETY: as in `send`: the sender published this chunk and waits for our
                    // acknowledgement before rewriting it.
                    unsafe {
                        std::ptr::copy(
                            b.slot(peer, b.depth()).add(me * ch),
                            (buf.0 as *mut u8).add(off),
                            m,
                        )
                    };
                    b.p2p_acked(me, peer).store(seq, Ordering::Release);
                }
                Ok(())
            }),
        )?;
        self.order(rs, stream)
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
        self.need_host_addressable(Collective::AllToAllv)?;
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
            self.order(stream, bs)?;
            self.check_step(call, d)?;
            self.host(
                bs,
                Box::new(move |b: &Bridge| {
                    // SAFETY: own blocks, by the buffer contract.
                    unsafe { std::ptr::copy(own.0 as *const u8, own.1 as *mut u8, own.2) };
                    p2p_progress(b, me, ch, &sends, &recvs)
                }),
            )?;
            self.order(bs, stream)
        })();
        if let Err(e) = &r {
            self.shared.fail(e.clone());
        }
        r
    }

    /// Releases the streams and events (after draining them).
    fn release(&mut self) {
        let _ = self.drain();
        self.events
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .destroy(&self.device);
        let s = &self.streams;
        for st in [s.cluster, s.bridge, s.send, s.recv] {
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
                b.p2p_sent(me, peer).store(seq, Ordering::Release);
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
                b.p2p_acked(me, peer).store(seq, Ordering::Release);
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

fn elem(dtype: DataType) -> Result<usize, HeteroError> {
    dtype
        .size()
        .ok_or_else(|| HeteroError::Unsupported(format!("unknown data type {}", dtype.0)))
}

impl Drop for Hetero {
    fn drop(&mut self) {
        self.release();
    }
}
