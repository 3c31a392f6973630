//! ferrocx core: the stable ABI between ferrocx and its adaptors, the plugin loader and
//! registry, and the configuration that chooses adaptors per cluster.

pub mod abi;

#[cfg(feature = "runtime")]
pub mod config;
