//! ferrocx core: the stable ABI between ferrocx and its adaptors, the plugin loader and
//! registry, and the configuration that chooses adaptors per cluster.
//!
//! ```no_run
//! use ferrocx::config::Config;
//! use ferrocx::registry::Registry;
//!
//! // The configuration from FERROCX_CONFIG (or the built-in local one) and the environment.
//! let (config, _warnings) = Config::from_process_env().expect("valid configuration");
//! // Built-in adaptors plus every plugin in the configured directories.
//! let registry = Registry::discover(&config.runtime);
//! for (i, cluster) in config.clusters.iter().enumerate() {
//!     match registry.select(&config, i) {
//!         Ok(sel) => println!("{}: device {} + ccl {}", cluster.name, sel.device.name(), sel.ccl.name()),
//!         Err(e) => eprintln!("{e}"),
//!     }
//! }
//! ```

pub mod abi;
pub mod element;
pub mod half;

#[cfg(feature = "runtime")]
pub mod adaptor;
#[cfg(feature = "runtime")]
pub mod bootstrap;
#[cfg(feature = "runtime")]
pub mod caps;
#[cfg(feature = "runtime")]
pub mod comm;
#[cfg(feature = "runtime")]
pub mod config;
#[cfg(all(feature = "runtime", target_os = "linux"))]
pub mod futex;
#[cfg(feature = "runtime")]
pub mod hetero;
#[cfg(feature = "runtime")]
pub mod loader;
#[cfg(feature = "runtime")]
pub mod registry;
#[cfg(feature = "runtime")]
pub mod route;
#[cfg(feature = "runtime")]
pub mod window;

#[cfg(feature = "runtime")]
#[doc(hidden)]
pub use inventory;
