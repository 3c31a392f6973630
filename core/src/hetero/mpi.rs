//! The bridge across hosts: MPI (`[bridge] ccl = "mpi"`, or `auto` when the ranks are not all on
//! one host).
//!
//! Clusters on different hosts share no memory, so the shared-memory plan of [`super`] cannot
//! run. Here every rank of the job joins one more communicator of the `mpi` CCL adaptor, over
//! the whole job (global rank = its rank there), made when the job's communicator is made; each
//! collective across clusters is that communicator's collective of the same kind, enqueued on
//! the caller's stream, so it runs in stream order as a non-blocking MPI call driven by the
//! host device's stream worker (the calling thread only enqueues). The clusters' own CCLs take
//! no part in it. Every collective of the shared-memory bridge maps to one MPI collective:
//! all_reduce, reduce, broadcast, gather, all_gather, scatter, reduce_scatter, all_to_all(v),
//! barrier (a one-word all-reduce), and send/recv between ranks of different clusters (in a
//! group of the communicator's, started together with the cluster's own sends and receives: a
//! send and a receive that depend on each other must be grouped, as on any CCL). Every type
//! and reduce op of the ABI is taken (the adaptor reduces f16 and bf16 in f32).
//!
//! The MPI operations run on the host device's streams, so the cluster's device must be the
//! host device the `mpi` adaptor enqueues on (`device = "host"` with the built-in adaptor;
//! `device = "mpi"` with its plugin, which carries its own host device). A call on another
//! stream than the previous call's is ordered after that one (every rank starts its MPI
//! collectives in the same order).
//!
//! **Failures:** each MPI operation fails when its peers do not answer within `timeout_ms` (or
//! as soon as MPI reports a peer gone). To say *which* rank is gone, every rank keeps a
//! heartbeat in the job's store (a counter it bumps every `timeout_ms / 16`, 5 to 250 ms); the
//! first failure that reaches [`MpiBridge::explain`] watches the counters for three beats, and
//! a rank whose counter did not move is named, with its cluster. The MPI operations' own
//! deadline is `timeout_ms` less those beats, so the error comes within `timeout_ms`. When the store itself is unreachable, its
//! host (rank 0, unless the launcher hosts it) is named.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::abi::{Comm, DataType, DevicePtr, MemKind, ReduceOp, Stream};
use crate::adaptor::{Ccl, Device};
use crate::bootstrap::{JobInfo, Store};
use crate::registry::Registry;
use crate::route::Collective;

use super::pool::EventPool;
use super::topo::Topology;
use super::HeteroError;

/// The name of the CCL adaptor the bridge takes.
pub const ADAPTOR: &str = "mpi";

/// Intervals of the heartbeat a look at the counters waits for them to move.
const LOOK_INTERVALS: u32 = 3;

/// One rank's MPI bridge (see the module docs).
pub struct MpiBridge {
    topo: Topology,
    device: Device,
    mpi: Ccl,
    comm: Comm,
    /// `true` when the bridge's CCL is not the cluster's: groups are started on it too.
    own_group: bool,
    events: Mutex<EventPool>,
    /// The caller's stream of the latest call.
    last: Mutex<Option<Stream>>,
    /// One word of host memory the barrier all-reduces.
    word: DevicePtr,
    heart: Heartbeat,
    /// What [`MpiBridge::explain`] found, once it looked.
    explained: Mutex<Option<Option<HeteroError>>>,
}

impl MpiBridge {
    /// The `mpi` CCL adaptor, or an error naming why it is missing.
    fn adaptor(registry: &Registry) -> Result<Ccl, HeteroError> {
        let entry = registry.ccl(ADAPTOR).ok_or_else(|| {
            HeteroError::Bridge(format!(
                "the bridge between hosts needs the `{ADAPTOR}` CCL adaptor, which is not \
                 available: {}",
                registry.why_missing(ADAPTOR)
            ))
        })?;
        Ok(entry.ccl().expect("ccl() checked the table"))
    }

    /// Opens MPI (`MPI_Init_thread`, through the `mpi` adaptor's `init`; nothing if it is open
    /// already): every rank of the job calls it at the same point of the communicator's
    /// making, before its cluster's CCL is initialised. Where the cluster's CCL is the `mpi`
    /// adaptor itself, its options (`library`, `abi`, `thread_level`) apply; elsewhere
    /// `FERROCX_MPI_LIBRARY` or the adaptor's search. An error names the libraries tried.
    pub fn open(
        registry: &Registry,
        cluster_ccl: &Ccl,
        cluster_options: &[(String, String)],
    ) -> Result<(), HeteroError> {
        let mpi = Self::adaptor(registry)?;
        let own = std::ptr::eq(cluster_ccl.tables().root.get(), mpi.tables().root.get());
        mpi.init_with(if own { cluster_options } else { &[] })
            .map_err(|e| HeteroError::Bridge(format!("the MPI bridge could not open MPI: {e}")))
    }

    /// Makes this rank's MPI bridge: the `mpi` CCL's communicator over every rank of the job
    /// (collective: every rank of the job calls it, in the same communicator order). `device`
    /// is the cluster's device; `seq` the communicator's number (names its store keys).
    #[allow(clippy::too_many_arguments)]
    pub fn make(
        topo: Topology,
        device: Device,
        cluster_ccl: &Ccl,
        local_device: i32,
        registry: &Registry,
        store: &Store,
        job: &JobInfo,
        seq: u64,
        timeout_ms: u64,
    ) -> Result<MpiBridge, HeteroError> {
        let mpi = Self::adaptor(registry)?;
        // The host device the adaptor enqueues on: its plugin's own, else the built-in one.
        let host = registry
            .ccl(ADAPTOR)
            .and_then(|e| e.device())
            .or_else(|| registry.device("host").and_then(|e| e.device()));
        let same = host
            .as_ref()
            .is_some_and(|h| std::ptr::eq(h.tables().root.get(), device.tables().root.get()));
        if !same {
            return Err(HeteroError::Unsupported(format!(
                "the MPI bridge runs its operations on the host device's streams, but this \
                 rank's cluster ({}) is on the device adaptor `{}`: across hosts, every \
                 cluster must be on `device = \"host\"` (or `\"mpi\"`, the MPI plugin's own \
                 host device)",
                topo.cluster_name_of(topo.me),
                device.name()
            )));
        }
        // Opened already by [`MpiBridge::open`] (idempotent).
        Self::open(registry, cluster_ccl, &[])?;
        let me = topo.me;
        let world = topo.world();
        let key = format!("ferrocx/unique_id/{seq}/bridge");
        let uid = if me == 0 {
            let id = mpi.unique_id()?;
            store.broadcast(&key, true, Some(&id))
        } else {
            store.broadcast(&key, false, None)
        }
        .map_err(|e| HeteroError::Bridge(format!("the MPI bridge's id: {e}")))?;
        // A failed operation is followed by a look at the heartbeats (at most
        // `LOOK_INTERVALS` intervals): the operations' own deadline leaves room for it, so
        // that the error naming the dead rank comes within `timeout_ms`.
        let timeout = Duration::from_millis(timeout_ms);
        let interval = Heartbeat::interval(timeout);
        let op_ms = timeout_ms.saturating_sub((interval * (LOOK_INTERVALS + 1)).as_millis() as u64);
        let comm = mpi.comm_init_rank(
            me as i32,
            world as i32,
            local_device,
            &uid,
            op_ms.max(timeout_ms / 2).max(1),
            &[],
        )?;
        let word = match device.mem_alloc(4, MemKind::DEVICE) {
            Ok(w) => w,
            Err(e) => {
                let _ = mpi.comm_destroy(comm);
                return Err(e.into());
            }
        };
        let heart = Heartbeat::start(store.addr(), &job.token, seq, me, world, timeout);
        let own_group = !std::ptr::eq(cluster_ccl.tables().root.get(), mpi.tables().root.get());
        tracing::debug!(world, "bridge over MPI ready");
        Ok(MpiBridge {
            topo,
            device,
            mpi,
            comm,
            own_group,
            events: Mutex::new(EventPool::default()),
            last: Mutex::new(None),
            word,
            heart,
            explained: Mutex::new(None),
        })
    }

    /// The clusters and this rank's place.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// Streams the bridge made: none (it enqueues on its callers' streams).
    pub fn streams_made(&self) -> usize {
        0
    }

    /// Events made so far.
    pub fn events_made(&self) -> usize {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).made()
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

    /// Starts a collective on `stream`, after the previous one whatever its stream (every rank
    /// starts its MPI collectives in the same order).
    fn begin(&self, stream: Stream) -> Result<(), HeteroError> {
        let last = self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(stream);
        match last {
            Some(l) if l != stream => self.order(l, stream),
            _ => Ok(()),
        }
    }

    fn root(&self, root: usize) -> Result<i32, HeteroError> {
        let w = self.topo.world();
        if root >= w {
            return Err(HeteroError::Unsupported(format!(
                "root {root} is not a rank of this {w}-rank job"
            )));
        }
        Ok(root as i32)
    }

    /// Enqueues the all-reduce on `stream`.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        self.begin(stream)?;
        // SAFETY: this function's contract is the entry's.
        Ok(unsafe {
            self.mpi
                .all_reduce(send, recv, count, dtype, op, self.comm, stream)
        }?)
    }

    /// Enqueues a reduce to `root` on `stream`.
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
        let root = self.root(root)?;
        self.begin(stream)?;
        // SAFETY: this function's contract is the entry's.
        Ok(unsafe {
            self.mpi
                .reduce(send, recv, count, dtype, op, root, self.comm, stream)
        }?)
    }

    /// Enqueues a broadcast from `root` on `stream`.
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
        let root = self.root(root)?;
        self.begin(stream)?;
        // SAFETY: this function's contract is the entry's.
        Ok(unsafe {
            self.mpi
                .broadcast(send, recv, count, dtype, root, self.comm, stream)
        }?)
    }

    /// Enqueues an all-gather (`root` None) or a gather to `root` on `stream`.
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
        let root = root.map(|r| self.root(r)).transpose()?;
        self.begin(stream)?;
        // SAFETY: this function's contract is the entries'.
        Ok(unsafe {
            match root {
                None => self
                    .mpi
                    .all_gather(send, recv, count, dtype, self.comm, stream),
                Some(r) => self
                    .mpi
                    .gather(send, recv, count, dtype, r, self.comm, stream),
            }
        }?)
    }

    /// Enqueues a reduce-scatter (`op` Some), an all-to-all or a scatter from `root`; `count`
    /// elements per block.
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
        let root = root.map(|r| self.root(r)).transpose()?;
        self.begin(stream)?;
        let (c, s) = (self.comm, stream);
        // SAFETY: this function's contract is the entries'.
        Ok(unsafe {
            match (kind, op, root) {
                (Collective::ReduceScatter, Some(op), _) => {
                    self.mpi.reduce_scatter(send, recv, count, dtype, op, c, s)
                }
                (Collective::AllToAll, _, _) => self.mpi.all_to_all(send, recv, count, dtype, c, s),
                (Collective::Scatter, _, Some(r)) => {
                    self.mpi.scatter(send, recv, count, dtype, r, c, s)
                }
                (k, _, _) => {
                    return Err(HeteroError::Unsupported(format!(
                        "{k} is not a block exchange of the MPI bridge"
                    )))
                }
            }
        }?)
    }

    /// Enqueues an all-to-all with per-peer counts and displacements on `stream`.
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
        self.begin(stream)?;
        // SAFETY: this function's contract is the entry's.
        Ok(unsafe {
            self.mpi.all_to_allv(
                send,
                send_counts,
                send_displs,
                recv,
                recv_counts,
                recv_displs,
                dtype,
                self.comm,
                stream,
            )
        }?)
    }

    /// Enqueues a barrier of every rank of the job on `stream`.
    pub fn barrier(&self, stream: Stream) -> Result<(), HeteroError> {
        self.begin(stream)?;
        // SAFETY: the bridge's own word, live until it drops (after its streams drained);
        // barriers are ordered one after the other by `begin`.
        Ok(unsafe {
            self.mpi.all_reduce(
                self.word,
                self.word,
                1,
                DataType::F32,
                ReduceOp::SUM,
                self.comm,
                stream,
            )
        }?)
    }

    /// Enqueues a send of `bytes` at `buf` to rank `peer` (of another cluster) on `stream` (a
    /// send and a receive that depend on each other must be in one group, as on the CCL).
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
        self.p2p(buf, bytes, peer, stream, true)
    }

    /// Enqueues a receive of `bytes` at `buf` from rank `peer` (of another cluster) on
    /// `stream` (see [`MpiBridge::send`] for groups).
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
        self.p2p(buf, bytes, peer, stream, false)
    }

    fn p2p(
        &self,
        buf: DevicePtr,
        bytes: usize,
        peer: usize,
        stream: Stream,
        send: bool,
    ) -> Result<(), HeteroError> {
        let peer = self.root(peer)?;
        // SAFETY: the caller's buffer contract (`send`/`recv`), `bytes` bytes at `buf`.
        Ok(unsafe {
            if send {
                self.mpi
                    .send(buf, bytes, DataType::U8, peer, self.comm, stream)
            } else {
                self.mpi
                    .recv(buf, bytes, DataType::U8, peer, self.comm, stream)
            }
        }?)
    }

    /// Starts a group on the bridge's CCL where it is not the cluster's (whose group the
    /// communicator starts): sends and receives across clusters in a group are started
    /// together with the others.
    pub fn group_start(&self) -> Result<(), HeteroError> {
        if self.own_group {
            self.mpi.group_start()?;
        }
        Ok(())
    }

    /// Ends the group [`MpiBridge::group_start`] started.
    pub fn group_end(&self) -> Result<(), HeteroError> {
        if self.own_group {
            self.mpi.group_end()?;
        }
        Ok(())
    }

    /// Nothing to wait for: the bridge enqueues on its callers' streams.
    pub fn drain(&self) -> Result<(), crate::adaptor::AdaptorError> {
        Ok(())
    }

    /// Why an operation failed, as precisely as the bridge can tell: a rank of the job whose
    /// heartbeat stopped (or the store's host, when the store is gone). `None` when every
    /// rank is alive (the operation's own error says more). Looks once (a fraction of
    /// `timeout_ms`); later calls return the same answer.
    pub fn explain(&self) -> Option<HeteroError> {
        let mut seen = self.explained.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &*seen {
            return e.clone();
        }
        let found = self.heart.dead().map(|(rank, why)| HeteroError::Died {
            rank,
            cluster: self.topo.cluster_name_of(rank).to_string(),
            what: format!("a collective over MPI ({why})"),
        });
        *seen = Some(found.clone());
        found
    }
}

impl Drop for MpiBridge {
    fn drop(&mut self) {
        let _ = self.drain();
        self.heart.stop();
        let _ = self.mpi.comm_destroy(self.comm);
        // SAFETY: the bridge's word, unused once its streams drained (the caller's streams
        // were synchronized by the communicator before its bridge is dropped).
        let _ = unsafe { self.device.mem_free(self.word, MemKind::DEVICE) };
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .destroy(&self.device);
    }
}

/// This rank's heartbeat in the job's store, and the look at everyone's that names a dead rank.
struct Heartbeat {
    addr: std::net::SocketAddr,
    token: String,
    seq: u64,
    me: usize,
    world: usize,
    interval: Duration,
    stop: Arc<(Mutex<bool>, Condvar)>,
    /// Set when the thread could not reach the store.
    lost: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    fn key(seq: u64, r: usize) -> String {
        format!("ferrocx/bridge/{seq}/alive/{r}")
    }

    /// How often a rank bumps its counter: `timeout / 16`, 5 ms to 250 ms.
    fn interval(timeout: Duration) -> Duration {
        (timeout / 16).clamp(Duration::from_millis(5), Duration::from_millis(250))
    }

    /// Starts the thread that bumps this rank's counter every [`Heartbeat::interval`].
    fn start(
        addr: std::net::SocketAddr,
        token: &str,
        seq: u64,
        me: usize,
        world: usize,
        timeout: Duration,
    ) -> Heartbeat {
        let interval = Heartbeat::interval(timeout);
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let lost = Arc::new(AtomicBool::new(false));
        let thread = {
            let (token, stop, lost) = (token.to_string(), stop.clone(), lost.clone());
            std::thread::Builder::new()
                .name("ferrocx-heartbeat".into())
                .spawn(move || {
                    let Ok(store) = Store::connect(addr, &token, timeout) else {
                        lost.store(true, Ordering::Release);
                        return;
                    };
                    let key = Heartbeat::key(seq, me);
                    let (flag, cv) = &*stop;
                    let mut stopped = flag.lock().unwrap_or_else(|p| p.into_inner());
                    let mut n = 0u64;
                    while !*stopped {
                        n += 1;
                        if store.set(&key, n.to_string().as_bytes()).is_err() {
                            lost.store(true, Ordering::Release);
                            return;
                        }
                        stopped = cv
                            .wait_timeout(stopped, interval)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                })
                .ok()
        };
        Heartbeat {
            addr,
            token: token.to_string(),
            seq,
            me,
            world,
            interval,
            stop,
            lost,
            thread,
        }
    }

    fn stop(&mut self) {
        *self.stop.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// The first rank whose counter does not move over [`LOOK_INTERVALS`] intervals, with
    /// why; `None` when all move.
    fn dead(&self) -> Option<(usize, &'static str)> {
        let store_host = || {
            // The launcher's store outlives the ranks; otherwise rank 0 hosts it.
            let hosted = std::env::var("FERROCX_STORE_HOSTED").is_ok_and(|v| v.trim() == "1");
            (!hosted && self.me != 0).then_some((0, "the job's store, which it hosts, is gone"))
        };
        if self.lost.load(Ordering::Acquire) {
            return store_host();
        }
        let Ok(store) = Store::connect(self.addr, &self.token, self.interval * 4) else {
            return store_host();
        };
        let read = |r: usize| -> Option<Vec<u8>> {
            let k = Heartbeat::key(self.seq, r);
            match store.check(&[&k]) {
                Ok(true) => store.get(&k).ok(),
                _ => None,
            }
        };
        let others: Vec<usize> = (0..self.world).filter(|&r| r != self.me).collect();
        let first: Vec<Option<Vec<u8>>> = others.iter().map(|&r| read(r)).collect();
        let until = Instant::now() + self.interval * LOOK_INTERVALS;
        let mut moved = vec![false; others.len()];
        while Instant::now() < until && moved.iter().any(|m| !m) {
            std::thread::sleep(self.interval / 2);
            for (i, &r) in others.iter().enumerate() {
                if !moved[i] && read(r) != first[i] {
                    moved[i] = true;
                }
            }
        }
        others
            .iter()
            .zip(&moved)
            .find(|(_, m)| !**m)
            .map(|(&r, _)| (r, "its heartbeat in the job's store stopped"))
    }
}
