//! Bootstrap: rank and world from the launcher's environment, and the TCP store ranks rendezvous
//! through.
//!
//! - [`RankInfo::from_env`] reads torchrun's, Open MPI's, PMI's or Slurm's variables.
//! - [`JobInfo::from_env`] gives the job's id (safe in file names) and the token that admits
//!   its ranks to the store.
//! - [`Store::from_env`] connects to the job's store, hosting it on rank 0 when the launcher
//!   does not ([`StoreServer`]); the store has `set`/`get`/`add`/`delete`/`check` and the
//!   rendezvous helpers `all_gather`, `broadcast` and `barrier`.
//!
//! ```
//! use std::time::Duration;
//! use ferrocx::bootstrap::{JobInfo, RankInfo, Store};
//!
//! // `|v| std::env::var(v).ok()` in a real program; here, no launcher: rank 0 of 1.
//! let lookup = |_: &str| None;
//! let rank = RankInfo::from_env(lookup)?;
//! let job = JobInfo::from_env(lookup, &rank);
//! let (store, _server) = Store::from_env_with(&rank, &job, Duration::from_secs(30), lookup)?;
//! let all = store.all_gather("hello", rank.rank, rank.world_size, b"hi")?;
//! assert_eq!(all, vec![b"hi".to_vec()]);
//! store.barrier("done", rank.world_size)?;
//! # Ok::<(), ferrocx::bootstrap::BootstrapError>(())
//! ```

mod error;
mod job;
mod rank;
mod server;
mod store;
mod wire;

pub use error::BootstrapError;
pub use job::JobInfo;
pub use rank::{RankInfo, RankSource};
pub use server::{StoreLimits, StoreServer};
pub use store::{resolve, Store};

/// The job's id (see [`JobInfo::from_env`]).
pub const ENV_JOB_ID: &str = "FERROCX_JOB_ID";
/// The secret each rank presents to the store.
pub const ENV_JOB_TOKEN: &str = "FERROCX_JOB_TOKEN";
/// `1`: the launcher hosts the store, so rank 0 must not.
pub const ENV_STORE_HOSTED: &str = "FERROCX_STORE_HOSTED";
/// Host of the store (torchrun's name).
pub const ENV_MASTER_ADDR: &str = "MASTER_ADDR";
/// Port of the store (torchrun's name).
pub const ENV_MASTER_PORT: &str = "MASTER_PORT";
