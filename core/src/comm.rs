//! [`Communicator`]: one rank's view of a job, from the launcher's environment to a CCL
//! communicator on a stream of the cluster's device.
//!
//! `Communicator::from_env()` reads the configuration (`FERROCX_CONFIG`, else the local one),
//! the rank and world (`RANK`/`WORLD_SIZE`, Open MPI's, Slurm's), finds the cluster of this
//! rank and its adaptors, initialises them with the cluster's options, rendezvouses through the
//! job's TCP store to share rank 0's unique id, and creates the communicator.
//!
//! Windows ([`crate::window`]): [`Communicator::alloc_symmetric`],
//! [`Communicator::register_window`] and [`Communicator::deregister_window`].
//!
//! Window collectives ([`crate::window::collectives`]): [`Communicator::all_reduce`] hands an
//! all-reduce to the window algorithms when the CCL has none (the sym-heap fallback) or, below
//! the crossover, when the cluster's `small_message` says so; [`Communicator::all_reduce_window`]
//! always does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::abi::{Comm, DataType, DevicePtr, ReduceOp, Stream};
use crate::adaptor::{AdaptorError, Ccl, Device};
use crate::bootstrap::{BootstrapError, JobInfo, RankInfo, Store, StoreServer};
use crate::config::{Config, ConfigError};
use crate::registry::Registry;
use crate::window::collectives::{
    self, AllReduceCall, CollectiveError, Measured, Route, WindowAlgo, WindowCollectives,
    WindowCollectivesConfig, WindowCollectivesProvider,
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
    windows: Windows,
    collectives: Collectives,
    _server: Option<Arc<StoreServer>>,
}

/// The window collectives of a communicator: the cluster's choices, the provider that runs on
/// its device, and the backend, made at the first call routed to it (a collective step: it
/// registers the scratch window).
struct Collectives {
    config: WindowCollectivesConfig,
    provider: Option<(&'static WindowCollectivesProvider, Measured)>,
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
        if let Some(other) = (0..world).find(|r| !cluster.ranks.contains(*r)) {
            return Err(CommError::Topology(format!(
                "rank {other} of this {world}-rank job is not in cluster {:?} (ranks {}): collectives across clusters are not available yet",
                cluster.name, cluster.ranks
            )));
        }
        let sel = registry.select(config, index)?;
        let timeout = Duration::from_millis(config.runtime.timeout_ms);
        sel.device
            .init(&options(cluster.options_for(&cluster.device)))?;
        let local_device = rank.local_rank as i32 % sel.device.device_count()?.max(1);
        sel.device.set_device(local_device)?;
        if sel.ccl.tables().root.get().init.is_some() {
            sel.ccl
                .init_with(&options(cluster.options_for(&cluster.ccl)))?;
        }
        let (store, server) = Store::from_env(rank, job, timeout)?;
        // Communicators are made collectively, in the same order on every rank, so the n-th of
        // each process is the same communicator: its id travels under a key of its own (a new
        // `Store` starts its rounds at 0, and would read an earlier communicator's id).
        let uid_key = format!(
            "ferrocx/unique_id/{}",
            COMMUNICATORS.fetch_add(1, Ordering::Relaxed)
        );
        let uid = if me == 0 {
            let id = sel.ccl.unique_id()?;
            store.broadcast(&uid_key, true, Some(&id))?
        } else {
            store.broadcast(&uid_key, false, None)?
        };
        let comm = sel.ccl.comm_init_rank(
            me as i32,
            world as i32,
            local_device,
            &uid,
            config.runtime.timeout_ms,
            &options(cluster.options_for(&cluster.ccl)),
        )?;
        let stream = sel.device.stream_create()?;
        let plan = window::plan(cluster, &sel.device, &sel.ccl, |v| std::env::var(v).ok());
        if let Some(w) = &plan.multicast.warning {
            tracing::warn!(cluster = %cluster.name, "{w}");
        }
        tracing::debug!(cluster = %cluster.name, "windows: {plan}");
        let provider = collectives::provider_for(&sel.device, world);
        tracing::debug!(rank = me, world, cluster = %cluster.name, device = sel.device.name(), ccl = sel.ccl.name(), "communicator ready");
        Ok(Communicator {
            rank: me,
            world,
            cluster: cluster.name.clone(),
            device: sel.device,
            ccl: sel.ccl,
            comm,
            stream,
            store,
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
                config: WindowCollectivesConfig {
                    small_message: cluster.small_message,
                    one_shot_max: cluster.window_one_shot_max,
                    two_shot_max: cluster.window_two_shot_max,
                    fallback: cluster.fallback,
                },
                provider,
                backend: OnceLock::new(),
                making: Mutex::new(()),
            },
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
    /// The CCL adaptor.
    pub fn ccl(&self) -> &Ccl {
        &self.ccl
    }
    /// The CCL communicator handle.
    pub fn handle(&self) -> Comm {
        self.comm
    }
    /// The stream the collectives below are enqueued on.
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

    /// Enqueues an all-reduce on the communicator's stream: on the CCL, or on a window
    /// algorithm where [`Communicator::all_reduce_route`] says so.
    pub fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let has_ccl = self.ccl.tables().root.get().all_reduce.is_some();
        if let Route::Window(algo) = self.all_reduce_route(count, dtype, op) {
            match self.window_backend() {
                Ok(_) => return self.run_window(send, recv, count, dtype, op, algo),
                // The backend could not be made (the same on every rank: its window
                // registration failed alike everywhere): the CCL takes small messages.
                Err(e) if !has_ccl => return Err(e.into()),
                Err(_) => {}
            }
        }
        // SAFETY: the caller's buffers, passed on as given: this function's contract is
        // `Ccl::all_reduce`'s (to be spelled out as an `unsafe fn` with the router).
        Ok(unsafe {
            self.ccl
                .all_reduce(send, recv, count, dtype, op, self.comm, self.stream)
        }?)
    }

    /// Where [`Communicator::all_reduce`] sends an all-reduce of `count` elements: the CCL, or
    /// a window algorithm (when the CCL has no all-reduce and `fallback = "symheap"`, or below
    /// the crossover when `small_message` chooses the window and the window algorithms run
    /// the type and op; see [`collectives::route`]). The same on every rank. (Where the window
    /// backend cannot be made, e.g. ranks on several nodes, the CCL takes the call anyway.)
    pub fn all_reduce_route(&self, count: usize, dtype: DataType, op: ReduceOp) -> Route {
        let has_ccl = self.ccl.tables().root.get().all_reduce.is_some();
        let bytes = count.saturating_mul(dtype.size().unwrap_or(0));
        let measured = self
            .collectives
            .provider
            .filter(|(p, _)| !has_ccl || (p.supports)(dtype, op))
            .map(|(_, m)| m);
        collectives::route(bytes, has_ccl, &self.collectives.config, measured)
    }

    /// Enqueues an all-reduce on a window algorithm whatever the CCL has: `algo`, or the one
    /// the size calls for when `None` (one-shot, two-shot, then the ring, at the cluster's
    /// thresholds). Collective: the first window call of a communicator registers its scratch
    /// window on every rank.
    pub fn all_reduce_window(
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
                let (_, measured) = self
                    .collectives
                    .provider
                    .ok_or_else(|| self.no_provider())?;
                let t = self.collectives.config.thresholds(measured.thresholds);
                if bytes <= t.one_shot_max {
                    WindowAlgo::OneShot
                } else if bytes <= t.two_shot_max {
                    WindowAlgo::TwoShot
                } else {
                    WindowAlgo::Ring
                }
            }
        };
        self.run_window(send, recv, count, dtype, op, algo)
    }

    /// Registers a window that ferrocx's own algorithms address peer by peer: as
    /// [`Communicator::register_window`], but never through the CCL's window group (whose
    /// windows have no peer addresses): the symmetric heap, else IPC handles. Collective.
    pub fn register_peer_window(
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

    fn run_window(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        algo: WindowAlgo,
    ) -> Result<(), CommError> {
        let backend = self.window_backend()?;
        let call = AllReduceCall {
            send,
            recv,
            count,
            dtype,
            op,
            stream: self.stream,
        };
        Ok(backend.all_reduce(&call, algo)?)
    }

    /// The window-collective backend, made at the first call (on every rank alike).
    fn window_backend(&self) -> Result<&dyn WindowCollectives, CollectiveError> {
        let c = &self.collectives;
        if c.backend.get().is_none() {
            let _making = c.making.lock().unwrap_or_else(|p| p.into_inner());
            if c.backend.get().is_none() {
                let made = match c.provider {
                    None => Err(self.no_provider()),
                    Some((p, _)) => (p.create)(self)
                        .map_err(|e| CollectiveError::Unavailable(format!("{}: {e}", p.name))),
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
        self.device.stream_synchronize(self.stream)?;
        if let Some(Ok(b)) = self.collectives.backend.get() {
            b.check()?;
        }
        Ok(())
    }

    /// Returns once every rank has called it (through the job's store, on the host): for
    /// ordering host-side steps, such as writing a window before peers read it. A rank that does
    /// not arrive within the timeout is named in the error.
    pub fn barrier(&self) -> Result<(), CommError> {
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
    /// The window is [`Vendor`](window::WindowKind::Vendor) where the cluster's plan
    /// ([`Communicator::window_plan`]) says so; otherwise it is
    /// [`Symmetric`](window::WindowKind::Symmetric) when every rank's buffer lies in memory of
    /// [`Communicator::alloc_symmetric`] (at the same offset of allocations of the same size),
    /// and [`Ipc`](window::WindowKind::Ipc) when one does not (any other device buffer, reached
    /// through IPC handles) or when the symmetric heap failed somewhere: every rank gets the
    /// same kind. Errors are the same on every rank: sizes that differ (naming each rank's),
    /// a rank that passes a null buffer or 0 bytes, IPC that cannot work either.
    pub fn register_window(
        &self,
        buffer: DevicePtr,
        size: usize,
        flags: WindowFlags,
    ) -> Result<Window, CommError> {
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

impl Drop for Communicator {
    fn drop(&mut self) {
        // Teardown failures are not actionable here; the adaptor logs them.
        let _ = self.device.stream_synchronize(self.stream);
        let _ = self.ccl.comm_destroy(self.comm);
        let _ = self.device.stream_destroy(self.stream);
    }
}
