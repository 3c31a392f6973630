//! [`Communicator`]: one rank's view of a job, from the launcher's environment to a CCL
//! communicator on a stream of the cluster's device.
//!
//! `Communicator::from_env()` reads the configuration (`FERROCX_CONFIG`, else the local one),
//! the rank and world (`RANK`/`WORLD_SIZE`, Open MPI's, Slurm's), finds the cluster of this
//! rank and its adaptors, initialises them with the cluster's options, rendezvouses through the
//! job's TCP store to share rank 0's unique id, and creates the communicator.

use std::time::Duration;

use crate::abi::{Comm, DataType, DevicePtr, ReduceOp, Stream};
use crate::adaptor::{AdaptorError, Ccl, Device};
use crate::bootstrap::{BootstrapError, JobInfo, RankInfo, Store, StoreServer};
use crate::config::{Config, ConfigError};
use crate::registry::Registry;

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
    _server: Option<StoreServer>,
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
        let uid = if me == 0 {
            let id = sel.ccl.unique_id()?;
            store.broadcast("ferrocx/unique_id", true, Some(&id))?
        } else {
            store.broadcast("ferrocx/unique_id", false, None)?
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

    /// Enqueues an all-reduce on the communicator's stream.
    pub fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        Ok(self
            .ccl
            .all_reduce(send, recv, count, dtype, op, self.comm, self.stream)?)
    }

    /// Waits for everything enqueued on the communicator's stream.
    pub fn synchronize(&self) -> Result<(), CommError> {
        Ok(self.device.stream_synchronize(self.stream)?)
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
