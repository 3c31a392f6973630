//! [`Communicator`]: one rank's view of a job, from the launcher's environment to a CCL
//! communicator on a stream of the cluster's device, and the entry of every collective.
//!
//! `Communicator::from_env()` reads the configuration (`FERROCX_CONFIG`, else the local one),
//! the rank and world (`RANK`/`WORLD_SIZE`, Open MPI's, Slurm's), finds the cluster of this
//! rank and its adaptors, initialises them with the cluster's options, rendezvouses through the
//! job's TCP store to share rank 0's unique id, and creates the communicator.
//!
//! Collectives ([`Call`]): every collective of the CCL table, on the communicator's stream
//! ([`Communicator::all_reduce`], ...) or a caller's ([`Communicator::on`]). Each asks the
//! communicator's [`Router`] where it goes: the CCL's table, the window algorithms
//! ([`crate::window::collectives`]: the sym-heap fallback and small messages), or (for jobs
//! across clusters) the cross-cluster plan.
//!
//! All-gather as point-to-point transfers on a few streams of the communicator, each slice's
//! arrival an event a consumer waits for ([`p2p`]): [`Communicator::all_gather_p2p`],
//! [`Call::all_gather_p2p`], [`Call::all_gather_p2p_each`].
//!
//! Windows ([`crate::window`]): [`Communicator::alloc_symmetric`],
//! [`Communicator::register_window`] and [`Communicator::deregister_window`].

mod call;
pub mod p2p;

pub use call::Call;
pub use p2p::{AllGatherP2p, Slice, DEFAULT_P2P_STREAMS};

/// Environment variable: an all-gather ([`Call::all_gather`], and the short gathers of
/// [`Call::all_gather_p2p`]) whose whole output is below this many bytes runs the window
/// collectives' all-gather where a provider runs on the device and each rank's input fits its
/// scratch window; `0` never. Unset, the cluster's `small_message` decides (`window`: every
/// size that fits; `auto`, the default: the provider's measurement for the device and world,
/// `Measured::all_gather_below`: on 2 GPUs every size that fits, on 4 below 12 MiB,
/// elsewhere none yet);
/// `small_message = "ccl"` keeps the CCL whatever this says. Read once per process.
pub const ALL_GATHER_WINDOW_BELOW_ENV: &str = "FERROCX_ALL_GATHER_WINDOW_BELOW";

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::abi::{Comm, DataType, DevicePtr, MemKind, ReduceOp, Stream};
use crate::adaptor::{AdaptorError, Ccl, Device};
use crate::bootstrap::{BootstrapError, JobInfo, RankInfo, Store, StoreServer};
use crate::caps::{CclCaps, DeviceCaps};
use crate::config::{BridgeCcl, Config, ConfigError, ConfigErrorKind};
use crate::hetero::bridge::Bridge;
use crate::hetero::mpi::MpiBridge;
use crate::hetero::topo::Topology;
use crate::hetero::{BridgeKind, Hetero, HeteroError};
use crate::registry::Registry;
use crate::route::{CclEntries, Collective, Route, Router, WindowRoute};
use crate::window::collectives::{
    self, CollectiveError, Scratch, WindowAlgo, WindowCollectives, WindowCollectivesConfig,
    WindowCollectivesProvider, WindowContext,
};
use crate::window::{
    self, SymHeap, SymHeapStep, SymmetricBuffer, Window, WindowError, WindowFlags, WindowPlan,
};

/// Communicators this process has made, in order: the n-th of every rank is the same one.
static COMMUNICATORS: AtomicU64 = AtomicU64::new(0);

/// Why a communicator could not be made or used.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// The configuration is invalid, or names an adaptor that is not available.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Rank detection or the rendezvous failed.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    /// An adaptor call failed.
    #[error(transparent)]
    Adaptor(#[from] AdaptorError),
    /// The job does not fit the configuration.
    #[error("{0}")]
    Topology(String),
    /// A window could not be registered or deregistered.
    #[error(transparent)]
    Window(#[from] WindowError),
    /// A window collective failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A collective across clusters failed.
    #[error(transparent)]
    Hetero(#[from] HeteroError),
    /// A point-to-point all-gather ([`p2p`]) was refused or failed.
    #[error("{0}")]
    PointToPoint(String),
}

/// What a communicator works with, probed once when it was made: its adaptors' capabilities
/// and the window-collective provider its router may take (the router's inputs are in
/// [`Communicator::router`]).
#[derive(Clone, Debug)]
pub struct CommCaps {
    /// The device adaptor's tables, groups and devices.
    pub device: Arc<DeviceCaps>,
    /// The CCL adaptor's entries and their runtime support.
    pub ccl: Arc<CclCaps>,
    /// The window-collective provider that runs on the device, if one.
    pub window_collectives: Option<&'static str>,
}

/// One rank's communicator over its cluster's CCL, with a stream of its device.
pub struct Communicator {
    rank: usize,
    world: usize,
    cluster: String,
    device: Device,
    ccl: Ccl,
    comm: Comm,
    stream: Stream,
    store: Store,
    caps: CommCaps,
    router: Router,
    windows: Windows,
    collectives: Collectives,
    /// One word of device memory the barrier all-reduces, made at the first barrier.
    barrier_word: Mutex<Option<DevicePtr>>,
    /// The cross-cluster side of a job that spans clusters (`None`: one cluster).
    hetero: Option<Hetero>,
    /// The streams, events and staging window of the point-to-point all-gathers.
    p2p: p2p::P2pState,
    _server: Option<Arc<StoreServer>>,
}

/// The window collectives of a communicator: the provider that runs on its device, and the
/// backend, made at the first call routed to it (a collective step: it registers the scratch
/// window).
struct Collectives {
    provider: Option<&'static WindowCollectivesProvider>,
    backend: OnceLock<Result<Box<dyn WindowCollectives>, CollectiveError>>,
    making: Mutex<()>,
}

/// What the communicator's windows share.
struct Windows {
    /// The device this rank works on.
    device: i32,
    /// The job's id (names the window sockets).
    job: String,
    /// A digest of the unique id: keeps this communicator's sockets and store keys apart.
    tag: u64,
    timeout: Duration,
    plan: WindowPlan,
    heap: SymHeap,
    /// Windows registered so far (the next one's number).
    seq: AtomicU64,
    /// A sym-heap step to fail once on this rank (tests).
    inject: Mutex<Option<SymHeapStep>>,
}

fn options(map: Option<&std::collections::BTreeMap<String, String>>) -> Vec<(String, String)> {
    map.map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

impl Communicator {
    /// Everything from the process environment (see the module docs).
    pub fn from_env() -> Result<Self, CommError> {
        let (config, warnings) = Config::from_process_env()?;
        for w in warnings {
            tracing::warn!("{w}");
        }
        let lookup = |k: &str| std::env::var(k).ok();
        let rank = RankInfo::from_env(lookup)?;
        let job = JobInfo::from_env(lookup, &rank);
        let registry = Registry::discover(&config.runtime);
        Self::init(&config, &registry, &rank, &job)
    }

    /// Builds the communicator of `rank` in the job `job` under `config`.
    pub fn init(
        config: &Config,
        registry: &Registry,
        rank: &RankInfo,
        job: &JobInfo,
    ) -> Result<Self, CommError> {
        let me = rank.rank;
        let world = rank.world_size;
        let index = config
            .clusters
            .iter()
            .position(|c| c.ranks.contains(me))
            .ok_or_else(|| {
                CommError::Topology(format!("rank {me} is in no cluster of {}", config.origin))
            })?;
        let cluster = &config.clusters[index];
        // A job across clusters: this rank's communicator is its cluster's, over the cluster's
        // ranks, plus the bridge between clusters (see `crate::hetero`).
        let topo = if (0..world).any(|r| !cluster.ranks.contains(r)) {
            Some(Topology::new(config, world, me).map_err(CommError::Topology)?)
        } else {
            None
        };
        let sel = registry.select(config, index)?;
        let timeout = Duration::from_millis(config.runtime.timeout_ms);
        sel.device
            .init(&options(cluster.options_for(&cluster.device)))?;
        let local_device = rank.local_rank as i32 % sel.device.device_count()?.max(1);
        sel.device.set_device(local_device)?;
        let (store, server) = Store::from_env(rank, job, timeout)?;
        // Communicators are made collectively, in the same order on every rank, so the n-th of
        // each process is the same communicator: its id travels under a key of its own (a new
        // `Store` starts its rounds at 0, and would read an earlier communicator's id).
        let seq = COMMUNICATORS.fetch_add(1, Ordering::Relaxed);
        let bridge = match &topo {
            Some(_) => Some(choose_bridge(config, &store, seq, me, world)?),
            None => None,
        };
        let ccl_options = options(cluster.options_for(&cluster.ccl));
        if bridge == Some(BridgeKind::Mpi) {
            // Every rank opens MPI here, at the same point (MPI's initialisation waits for
            // every process of the MPI job), whatever its cluster's CCL; the store is up
            // already (rank 0 hosts it: no rank may block in MPI before it binds).
            MpiBridge::open(registry, &sel.ccl, &ccl_options)?;
        }
        if sel.ccl.tables().root.get().init.is_some() {
            sel.ccl.init_with(&ccl_options)?;
        }
        // Across clusters each cluster has its own id, under a key naming the cluster.
        let (uid_key, ccl_rank, ccl_world) = match &topo {
            None => (format!("ferrocx/unique_id/{seq}"), me, world),
            Some(t) => (
                format!("ferrocx/unique_id/{seq}/{}", cluster.name),
                t.my_local(),
                t.clusters[t.my_cluster()].ranks.len(),
            ),
        };
        let uid = if ccl_rank == 0 {
            let id = sel.ccl.unique_id()?;
            store.broadcast(&uid_key, true, Some(&id))?
        } else {
            store.broadcast(&uid_key, false, None)?
        };
        let comm = sel.ccl.comm_init_rank(
            ccl_rank as i32,
            ccl_world as i32,
            local_device,
            &uid,
            config.runtime.timeout_ms,
            &options(cluster.options_for(&cluster.ccl)),
        )?;
        let hetero = match topo {
            None => None,
            Some(t) => {
                let made = match bridge {
                    Some(BridgeKind::Mpi) => MpiBridge::make(
                        t,
                        sel.device.clone(),
                        &sel.ccl,
                        local_device,
                        registry,
                        &store,
                        job,
                        seq,
                        config.runtime.timeout_ms,
                    )
                    .map(Hetero::over_mpi),
                    _ => Hetero::new(
                        t,
                        sel.device.clone(),
                        sel.ccl.clone(),
                        comm,
                        &config.bridge,
                        local_device,
                        &Bridge::name_of(&job.id, seq),
                        timeout,
                    ),
                };
                match made {
                    Ok(h) => Some(h),
                    Err(e) => {
                        let _ = sel.ccl.comm_destroy(comm);
                        return Err(e.into());
                    }
                }
            }
        };
        let clusters = hetero.as_ref().map_or(1, |h| h.topology().clusters.len());
        let stream = sel.device.stream_create()?;
        let plan = window::plan(cluster, &sel.device, &sel.ccl, |v| std::env::var(v).ok());
        if let Some(w) = &plan.multicast.warning {
            tracing::warn!(cluster = %cluster.name, "{w}");
        }
        tracing::debug!(cluster = %cluster.name, "windows: {plan}");
        let provider = collectives::provider_for(&sel.device, world);
        let caps = CommCaps {
            device: sel.device.caps(),
            ccl: sel.ccl.caps(),
            window_collectives: provider.map(|(p, _)| p.name),
        };
        let router = Router {
            ccl: CclEntries::of(&caps.ccl),
            config: WindowCollectivesConfig {
                small_message: cluster.small_message,
                one_shot_max: cluster.window_one_shot_max,
                two_shot_max: cluster.window_two_shot_max,
                fallback: cluster.fallback,
            },
            window: provider.map(|(p, measured)| WindowRoute {
                measured,
                supports: p.supports,
            }),
            clusters,
        };
        tracing::debug!(rank = me, world, cluster = %cluster.name, device = sel.device.name(), ccl = sel.ccl.name(), "communicator ready");
        let device_for_p2p = sel.device.clone();
        Ok(Communicator {
            rank: me,
            world,
            cluster: cluster.name.clone(),
            device: sel.device,
            ccl: sel.ccl,
            comm,
            stream,
            store,
            caps,
            router,
            windows: Windows {
                device: local_device,
                job: job.id.clone(),
                tag: window::tag_of(&uid),
                timeout,
                plan,
                heap: SymHeap::default(),
                seq: AtomicU64::new(0),
                inject: Mutex::new(None),
            },
            collectives: Collectives {
                provider: provider.map(|(p, _)| p),
                backend: OnceLock::new(),
                making: Mutex::new(()),
            },
            barrier_word: Mutex::new(None),
            hetero,
            p2p: p2p::P2pState::new(device_for_p2p, local_device, timeout),
            _server: server,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }
    /// The name of this rank's cluster.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }
    /// The device adaptor.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The CCL adaptor (its name, version and capabilities; collectives go through
    /// [`Communicator`]'s methods, which route them).
    pub fn ccl(&self) -> &Ccl {
        &self.ccl
    }
    /// What this communicator's adaptors can do, probed once when it was made.
    pub fn caps(&self) -> &CommCaps {
        &self.caps
    }
    /// The router that decides where each collective goes.
    pub fn router(&self) -> &Router {
        &self.router
    }
    /// The stream the collectives are enqueued on unless a call names another.
    pub fn stream(&self) -> Stream {
        self.stream
    }
    /// The job's store, for small out-of-band exchanges.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The deadline of any wait on a peer (`timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.windows.timeout
    }

    /// Collectives on `stream` (a stream of this communicator's device) instead of the
    /// communicator's own.
    pub fn on(&self, stream: Stream) -> Call<'_> {
        Call::new(self, stream)
    }

    /// Collectives on the communicator's stream (what the methods below use).
    pub fn call(&self) -> Call<'_> {
        Call::new(self, self.stream)
    }

    /// Where [`Communicator::all_reduce`] sends an all-reduce of `count` elements (see
    /// [`Router::all_reduce`]). The same on every rank. (Where the window backend cannot be
    /// made, e.g. ranks on several nodes, the CCL takes the call anyway.)
    pub fn all_reduce_route(&self, count: usize, dtype: DataType, op: ReduceOp) -> Route {
        let bytes = count.saturating_mul(dtype.size().unwrap_or(0));
        self.router
            .route(Collective::AllReduce, bytes, dtype, Some(op))
    }

    /// Enqueues an all-reduce on a window algorithm whatever the CCL has: `algo`, or the one
    /// the size calls for when `None` (one-shot, two-shot, then the ring, at the cluster's
    /// thresholds). Collective: the first window call of a communicator registers its scratch
    /// window on every rank.
    ///
    /// # Safety
    /// As [`Call::all_reduce`].
    pub unsafe fn all_reduce_window(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        algo: Option<WindowAlgo>,
    ) -> Result<(), CommError> {
        let algo = match algo {
            Some(a) => a,
            None => {
                let bytes = count.saturating_mul(dtype.size().unwrap_or(0));
                let w = self.router.window.ok_or_else(|| self.no_provider())?;
                let t = self.router.config.thresholds(w.measured.thresholds);
                if bytes <= t.one_shot_max {
                    WindowAlgo::OneShot
                } else if bytes <= t.two_shot_max {
                    WindowAlgo::TwoShot
                } else {
                    WindowAlgo::Ring
                }
            }
        };
        // SAFETY: the caller's contract is the call's.
        unsafe {
            self.call()
                .via(Route::Window(algo))
                .all_reduce(send, recv, count, dtype, op)
        }
    }

    /// Starts a group of point-to-point calls (and collectives) issued together at
    /// [`Communicator::group_end`] (NCCL's `ncclGroupStart`): sends and receives in a group
    /// cannot deadlock whatever their order. Groups are per thread and nest.
    pub fn group_start(&self) -> Result<(), CommError> {
        self.ccl.group_start()?;
        if let Some(h) = &self.hetero {
            if let Err(e) = h.group_start() {
                let _ = self.ccl.group_end();
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Ends a group and issues its calls.
    pub fn group_end(&self) -> Result<(), CommError> {
        let ended = self.ccl.group_end();
        let bridge = self.hetero.as_ref().map_or(Ok(()), |h| h.group_end());
        ended?;
        Ok(bridge?)
    }

    /// Runs `calls` inside a group: [`Communicator::group_start`], `calls`, then
    /// [`Communicator::group_end`] even when `calls` fails (its error wins).
    pub fn group<R>(&self, calls: impl FnOnce() -> Result<R, CommError>) -> Result<R, CommError> {
        self.group_start()?;
        let r = calls();
        let ended = self.group_end();
        let r = r?;
        ended?;
        Ok(r)
    }

    /// Registers a window that ferrocx's own algorithms address peer by peer: as
    /// [`Communicator::register_window`], but never through the CCL's window group (whose
    /// windows have no peer addresses): the symmetric heap, else IPC handles. Collective.
    pub(crate) fn register_peer_window(
        &self,
        buffer: DevicePtr,
        size: usize,
        flags: WindowFlags,
    ) -> Result<Window, CommError> {
        let seq = self.windows.seq.fetch_add(1, Ordering::Relaxed);
        self.device.set_device(self.windows.device)?;
        let own = &self.windows.plan;
        let plan = match own.backing {
            window::Backing::Vendor | window::Backing::Unavailable => WindowPlan {
                backing: window::Backing::SymHeap,
                reason: format!(
                    "a window addressed peer by peer (the cluster's own windows: {})",
                    own.reason
                ),
                multicast: own.multicast.clone(),
            },
            _ => own.clone(),
        };
        let mut context = self.window_context(seq);
        context.plan = &plan;
        Ok(window::register(&context, buffer, size, flags)?)
    }

    fn no_provider(&self) -> CollectiveError {
        CollectiveError::Unavailable(format!(
            "no window-collective provider runs on the device adaptor `{}` (link \
             ferrocx-kernels and call ferrocx_kernels::link())",
            self.device.name()
        ))
    }

    /// The error of a call routed across clusters (no plan runs them yet).
    fn across_clusters(&self, op: Collective) -> CommError {
        CommError::Topology(format!(
            "{op}: collectives across clusters are not available yet (cluster {:?})",
            self.cluster
        ))
    }

    /// `peer` as the CCL's rank type, checked against the world.
    fn peer(&self, peer: usize) -> Result<i32, CommError> {
        if peer >= self.world {
            return Err(CommError::Topology(format!(
                "peer {peer} is not a rank of this {}-rank communicator",
                self.world
            )));
        }
        Ok(peer as i32)
    }

    /// The word the barrier all-reduces, allocated (and zeroed) at the first barrier.
    fn barrier_word(&self) -> Result<DevicePtr, CommError> {
        let mut word = self.barrier_word.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = *word {
            return Ok(w);
        }
        self.device.set_device(self.windows.device)?;
        let w = self.device.mem_alloc(8, MemKind::DEVICE)?;
        // SAFETY: `w` is the 8-byte allocation just made, used by nothing else yet.
        if let Err(e) = unsafe { self.device.mem_set(w, 0, 8) } {
            // SAFETY: as above; freed once, here.
            let _ = unsafe { self.device.mem_free(w, MemKind::DEVICE) };
            return Err(e.into());
        }
        *word = Some(w);
        Ok(w)
    }

    /// Allocates, zeroes and registers a scratch window of `bytes` addressed peer by peer
    /// (collective): what [`WindowContext::scratch`] does for a provider.
    fn scratch_window(&self, bytes: usize) -> Result<Scratch, CommError> {
        let buffer = self.alloc_symmetric(bytes)?;
        // Signal slots start at 0; every peer waits for a value of at least 1.
        // SAFETY: `buffer` is a live symmetric allocation of `buffer.size()` bytes that no
        // stream uses yet.
        unsafe { self.device.mem_set(buffer.ptr(), 0, buffer.size()) }?;
        let window =
            self.register_peer_window(buffer.ptr(), buffer.size(), WindowFlags::NO_MULTICAST)?;
        tracing::debug!(
            kind = %window.kind(),
            bytes,
            "window collectives: scratch window registered ({})",
            window.reason()
        );
        Ok(Scratch::new(window, buffer))
    }

    /// The window-collective backend, made at the first call (on every rank alike).
    fn window_backend(&self) -> Result<&dyn WindowCollectives, CollectiveError> {
        let c = &self.collectives;
        if c.backend.get().is_none() {
            let _making = c.making.lock().unwrap_or_else(|p| p.into_inner());
            if c.backend.get().is_none() {
                let made = match c.provider {
                    None => Err(self.no_provider()),
                    Some(p) => {
                        let scratch = |bytes: usize| {
                            self.scratch_window(bytes)
                                .map_err(|e| CollectiveError::Unavailable(e.to_string()))
                        };
                        let ctx = WindowContext {
                            device: &self.device,
                            stream: self.stream,
                            rank: self.rank,
                            world: self.world,
                            timeout: self.windows.timeout,
                            store: &self.store,
                            scratch: &scratch,
                        };
                        (p.create)(&ctx)
                            .map_err(|e| CollectiveError::Unavailable(format!("{}: {e}", p.name)))
                    }
                };
                match &made {
                    Ok(b) => tracing::debug!(backend = b.backend(), "window collectives ready"),
                    Err(e) => tracing::warn!("{e}"),
                }
                let _ = c.backend.set(made);
            }
        }
        match c.backend.get() {
            Some(Ok(b)) => Ok(b.as_ref()),
            Some(Err(e)) => Err(e.clone()),
            None => Err(self.no_provider()),
        }
    }

    /// Waits for everything enqueued on the communicator's stream; reports a window
    /// collective's failure among it.
    pub fn synchronize(&self) -> Result<(), CommError> {
        let synced = self.device.stream_synchronize(self.stream);
        if let Some(h) = &self.hetero {
            // A failure across clusters is named by the bridge (rank and cluster), even when
            // the stream reports it as a cluster CCL's error (which names local ranks).
            h.check()?;
            if synced.is_err() {
                if let Some(e) = h.explain() {
                    return Err(e.into());
                }
            }
        }
        synced?;
        if let Some(Ok(b)) = self.collectives.backend.get() {
            b.check()?;
        }
        Ok(())
    }

    /// The cross-cluster side of a job that spans clusters (`None` for one cluster): its
    /// topology, plan cache and bridge.
    pub fn hetero(&self) -> Option<&Hetero> {
        self.hetero.as_ref()
    }

    /// Returns once every rank has called it, with everything enqueued on the communicator's
    /// stream before it done on every rank: [`Call::barrier`] on the stream, then a synchronize
    /// (as `torch.distributed.barrier`). For ordering host-side steps, such as writing a
    /// window before peers read it.
    pub fn barrier(&self) -> Result<(), CommError> {
        self.call().barrier()?;
        self.synchronize()
    }

    /// Returns once every rank has called it, through the job's store on the host, without
    /// touching any stream. A rank that does not arrive within the timeout is named in the
    /// error.
    pub fn host_barrier(&self) -> Result<(), CommError> {
        self.agreement().gather("barrier", &[])?;
        Ok(())
    }

    /// `bytes` of this rank's memory in the symmetric heap: exportable memory that a window
    /// maps into every peer's flat range (see [`crate::window`]). Local, not collective. Where
    /// the device cannot export and map memory (no VMM or flat-map group) it is plain device
    /// memory and windows over it use IPC ([`SymmetricBuffer::is_heap`] says which).
    pub fn alloc_symmetric(&self, bytes: usize) -> Result<SymmetricBuffer, CommError> {
        if bytes == 0 {
            return Err(WindowError::InvalidArgument(
                "alloc_symmetric: cannot allocate 0 bytes".into(),
            )
            .into());
        }
        self.device.set_device(self.windows.device)?;
        Ok(self
            .windows
            .heap
            .alloc(&self.device, self.windows.device, bytes)?)
    }

    /// Registers `size` bytes at `buffer` as a window; collective: every rank calls it, in the
    /// same order as its other window calls, with the same `size`.
    ///
    /// # Safety
    /// `buffer` is a live allocation of this communicator's device (from
    /// [`Communicator::alloc_symmetric`] or the device's `mem_alloc`), valid for `size` bytes,
    /// and stays allocated until the window is deregistered: peers map and write it.
    ///
    /// The window is [`Vendor`](window::WindowKind::Vendor) where the cluster's plan
    /// ([`Communicator::window_plan`]) says so and `flags` lacks [`WindowFlags::PEERS`];
    /// otherwise it is
    /// [`Symmetric`](window::WindowKind::Symmetric) when every rank's buffer lies in memory of
    /// [`Communicator::alloc_symmetric`] (at the same offset of allocations of the same size),
    /// and [`Ipc`](window::WindowKind::Ipc) when one does not (any other device buffer, reached
    /// through IPC handles) or when the symmetric heap failed somewhere: every rank gets the
    /// same kind. Errors are the same on every rank: sizes that differ (naming each rank's),
    /// a rank that passes a null buffer or 0 bytes, IPC that cannot work either.
    pub unsafe fn register_window(
        &self,
        buffer: DevicePtr,
        size: usize,
        flags: WindowFlags,
    ) -> Result<Window, CommError> {
        if flags.contains(WindowFlags::PEERS) {
            return self.register_peer_window(buffer, size, flags);
        }
        let seq = self.windows.seq.fetch_add(1, Ordering::Relaxed);
        self.device.set_device(self.windows.device)?;
        Ok(window::register(
            &self.window_context(seq),
            buffer,
            size,
            flags,
        )?)
    }

    /// Deregisters a window; collective. Waits for this rank's stream and for every rank to
    /// arrive before anything is unmapped, so no rank unmaps memory a peer still reads (work
    /// on other streams must be finished by the caller).
    pub fn deregister_window(&self, window: Window) -> Result<(), CommError> {
        let seq = window.seq;
        Ok(window::deregister(&self.window_context(seq), window)?)
    }

    /// What backs this communicator's windows and why, and whether they may have multicast.
    pub fn window_plan(&self) -> &WindowPlan {
        &self.windows.plan
    }

    /// Makes `step` of the next window registration fail on this rank, once (tests of the
    /// fallback and of what failed steps release).
    #[doc(hidden)]
    pub fn inject_window_failure(&self, step: SymHeapStep) {
        *self
            .windows
            .inject
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(step);
    }

    fn agreement(&self) -> window::Agreement<'_> {
        window::Agreement {
            store: &self.store,
            rank: self.rank,
            world: self.world,
            tag: self.windows.tag,
        }
    }

    fn window_context(&self, seq: u64) -> window::Context<'_> {
        window::Context {
            device: &self.device,
            device_index: self.windows.device,
            ccl: &self.ccl,
            comm: self.comm,
            stream: self.stream,
            agree: self.agreement(),
            job: &self.windows.job,
            seq,
            timeout: self.windows.timeout,
            plan: &self.windows.plan,
            heap: &self.windows.heap,
            inject: &self.windows.inject,
        }
    }
}

/// This host's identity for the bridge's choice: the host name, the boot id, and the IPC
/// namespace and `/dev/shm` this process sees (two ranks share memory through a POSIX segment
/// only when all agree: containers and network namespaces on one machine count as hosts).
fn host_identity() -> String {
    let mut name = [0u8; 256];
    // SAFETY: a writable buffer of the length given; the name is NUL-terminated within it
    // (or truncated, which still identifies).
    unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len() - 1) };
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let host = String::from_utf8_lossy(&name[..end]).into_owned();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let ipc = std::fs::read_link("/proc/self/ns/ipc")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let shm = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/dev/shm").map_or(0, |m| m.dev())
    };
    format!("{host}|{}|{ipc}|{shm:x}", boot.trim())
}

/// Which bridge a job across clusters takes (the same answer on every rank: every rank's host
/// identity is gathered through the job's store): `[bridge] ccl = "host"` needs one host,
/// `"mpi"` takes MPI, `"auto"` shared memory when every rank is on one host, MPI otherwise.
fn choose_bridge(
    config: &Config,
    store: &Store,
    seq: u64,
    me: usize,
    world: usize,
) -> Result<BridgeKind, CommError> {
    let ids = store.all_gather(
        &format!("ferrocx/host/{seq}"),
        me,
        world,
        host_identity().as_bytes(),
    )?;
    let other = ids.iter().position(|id| *id != ids[0]);
    let host_of = |r: usize| {
        String::from_utf8_lossy(&ids[r])
            .split('|')
            .next()
            .unwrap_or("")
            .to_string()
    };
    Ok(match (config.bridge.ccl, other) {
        (BridgeCcl::Mpi, _) | (BridgeCcl::Auto, Some(_)) => BridgeKind::Mpi,
        (BridgeCcl::Host, Some(r)) => {
            return Err(config
                .bridge_error(
                    "ccl",
                    ConfigErrorKind::InvalidValue,
                    format!(
                        "\"host\" (shared memory) needs every rank of the job on one host, but \
                         rank 0 is on {:?} and rank {r} on {:?} (another host, container or IPC \
                         namespace): say \"mpi\" or \"auto\"",
                        host_of(0),
                        host_of(r)
                    ),
                )
                .into())
        }
        _ => BridgeKind::SharedMemory,
    })
}

/// The communicator's collectives on its own stream: each forwards to the same method of
/// [`Call`], whose documentation (and the buffer contract in [`call`]'s module docs) applies.
macro_rules! on_own_stream {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*);)*) => {
        impl Communicator {
            $(
                $(#[$doc])*
                ///
                /// # Safety
                #[doc = concat!("As [`Call::", stringify!($name), "`].")]
                #[allow(clippy::too_many_arguments)]
                pub unsafe fn $name(&self, $($arg: $ty),*) -> Result<(), CommError> {
                    // SAFETY: the caller's contract is the call's.
                    unsafe { self.call().$name($($arg),*) }
                }
            )*
        }
    };
}

on_own_stream! {
    /// Enqueues an all-reduce on the communicator's stream (see [`Call::all_reduce`]).
    fn all_reduce(send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, op: ReduceOp);
    /// Enqueues a reduce to `root` on the communicator's stream (see [`Call::reduce`]).
    fn reduce(send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, op: ReduceOp, root: usize);
    /// Enqueues a broadcast from `root` on the communicator's stream (see [`Call::broadcast`]).
    fn broadcast(send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType, root: usize);
    /// Enqueues an all-gather on the communicator's stream (see [`Call::all_gather`]).
    fn all_gather(send: DevicePtr, recv: DevicePtr, send_count: usize, dtype: DataType);
    /// Enqueues a reduce-scatter on the communicator's stream (see [`Call::reduce_scatter`]).
    fn reduce_scatter(send: DevicePtr, recv: DevicePtr, recv_count: usize, dtype: DataType, op: ReduceOp);
    /// Enqueues a gather to `root` on the communicator's stream (see [`Call::gather`]).
    fn gather(send: DevicePtr, recv: DevicePtr, send_count: usize, dtype: DataType, root: usize);
    /// Enqueues a scatter from `root` on the communicator's stream (see [`Call::scatter`]).
    fn scatter(send: DevicePtr, recv: DevicePtr, recv_count: usize, dtype: DataType, root: usize);
    /// Enqueues an all-to-all on the communicator's stream (see [`Call::all_to_all`]).
    fn all_to_all(send: DevicePtr, recv: DevicePtr, count: usize, dtype: DataType);
    /// Enqueues an all-to-all with per-peer counts on the communicator's stream (see
    /// [`Call::all_to_allv`]).
    fn all_to_allv(send: DevicePtr, send_counts: &[usize], send_displs: &[usize], recv: DevicePtr, recv_counts: &[usize], recv_displs: &[usize], dtype: DataType);
    /// Enqueues a send to `peer` on the communicator's stream (see [`Call::send`]).
    fn send(buf: DevicePtr, count: usize, dtype: DataType, peer: usize);
    /// Enqueues a receive from `peer` on the communicator's stream (see [`Call::recv`]).
    fn recv(buf: DevicePtr, count: usize, dtype: DataType, peer: usize);
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Teardown failures are not actionable here; the adaptor logs them.
        let _ = self.device.stream_synchronize(self.stream);
        self.p2p.teardown();
        // The plans' streams drain before the cluster communicator goes.
        drop(self.hetero.take());
        let word = self
            .barrier_word
            .get_mut()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(w) = word.take() {
            // SAFETY: the barrier word, allocated by `barrier_word`; the stream that used it
            // was synchronized above.
            let _ = unsafe { self.device.mem_free(w, MemKind::DEVICE) };
        }
        let _ = self.ccl.comm_destroy(self.comm);
        let _ = self.device.stream_destroy(self.stream);
    }
}
