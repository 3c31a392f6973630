//! The `[bridge]` table: how the clusters of a heterogeneous job exchange data (see
//! `ferrocx::hetero`).
//!
//! ```toml
//! [bridge]
//! ccl         = "auto"      # host | mpi | auto: shared memory on one host, MPI across hosts
//! chunk_bytes = 4194304     # bytes per rank and pipeline slot (shared memory)
//! depth       = 2           # chunks in flight (shared memory)
//! ```
//!
//! `auto` is decided when a communicator is made, the same way on every rank: each rank's host
//! identity (host name, boot id, IPC namespace, `/dev/shm`) goes through the job's store, and
//! shared memory is taken when all are equal, MPI otherwise. `mpi` needs the `mpi` CCL adaptor
//! (built in, or its plugin) and an MPI library it can open, and every cluster on the host
//! device; the job is then started by `mpiexec`. `chunk_bytes` and `depth` shape the
//! shared-memory bridge only (MPI cuts its own messages).

use std::fmt;

use serde::Deserialize;

use super::position::KeyPositions;

/// The bridge's default chunk: bytes per rank and pipeline slot.
pub const DEFAULT_CHUNK_BYTES: u64 = 4 << 20;
/// The bridge's default pipeline depth.
pub const DEFAULT_DEPTH: u64 = 2;
/// The largest chunk accepted (a bridge segment holds `world * depth` of them).
pub const MAX_CHUNK_BYTES: u64 = 1 << 30;
/// The largest pipeline depth accepted.
pub const MAX_DEPTH: u64 = 16;

/// What carries the bridge between clusters (`[bridge] ccl = ...`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BridgeCcl {
    /// Shared memory when every rank is on one host, MPI otherwise (the default).
    #[default]
    Auto,
    /// POSIX shared memory: every rank of the job on one host.
    Host,
    /// MPI through the `mpi` CCL adaptor, one communicator over the whole job (across hosts).
    Mpi,
}

impl fmt::Display for BridgeCcl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BridgeCcl::Auto => "auto",
            BridgeCcl::Host => "host",
            BridgeCcl::Mpi => "mpi",
        })
    }
}

/// The `[bridge]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConfig {
    /// What carries the bridge.
    pub ccl: BridgeCcl,
    /// Bytes per rank and pipeline slot of the bridge's staging memory; a multiple of 64,
    /// at least 4096 and at most [`MAX_CHUNK_BYTES`].
    pub chunk_bytes: u64,
    /// Chunks in flight per rank (1 = no pipelining), 1 to [`MAX_DEPTH`].
    pub depth: u64,
    pub(super) positions: KeyPositions,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        BridgeConfig {
            ccl: BridgeCcl::default(),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            depth: DEFAULT_DEPTH,
            positions: KeyPositions::default(),
        }
    }
}

impl BridgeConfig {
    /// The line where `key` of `[bridge]` was written, if it came from a file.
    pub fn line_of(&self, key: &str) -> Option<usize> {
        self.positions.key(key).map(|p| p.line)
    }

    /// Why `chunk_bytes` is not acceptable, if it is not.
    pub(super) fn chunk_problem(&self) -> Option<String> {
        let c = self.chunk_bytes;
        if !(4096..=MAX_CHUNK_BYTES).contains(&c) {
            return Some(format!(
                "{c} bytes is outside 4096..={MAX_CHUNK_BYTES} (bytes per rank and pipeline slot)"
            ));
        }
        (c % 64 != 0).then(|| format!("{c} bytes is not a multiple of 64"))
    }

    /// Why `depth` is not acceptable, if it is not.
    pub(super) fn depth_problem(&self) -> Option<String> {
        let d = self.depth;
        (!(1..=MAX_DEPTH).contains(&d))
            .then(|| format!("{d} is outside 1..={MAX_DEPTH} (chunks in flight)"))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{Config, ConfigErrorKind};

    const BASE: &str = "[[cluster]]\nname = \"a\"\ndevice = \"host\"\nccl = \"host\"\n\n";

    #[test]
    fn defaults_and_values_are_read() -> Result<(), crate::config::ConfigError> {
        let c = Config::parse(BASE, Path::new("b.toml"))?;
        assert_eq!(
            (c.bridge.ccl, c.bridge.chunk_bytes, c.bridge.depth),
            (BridgeCcl::Auto, DEFAULT_CHUNK_BYTES, DEFAULT_DEPTH)
        );
        let text = format!("{BASE}[bridge]\nccl = \"host\"\nchunk_bytes = 65536\ndepth = 3\n");
        let c = Config::parse(&text, Path::new("b.toml"))?;
        assert_eq!(
            (c.bridge.ccl, c.bridge.chunk_bytes, c.bridge.depth),
            (BridgeCcl::Host, 65536, 3)
        );
        assert_eq!(c.bridge.line_of("depth"), Some(9));
        assert_eq!(BridgeCcl::Mpi.to_string(), "mpi");
        Ok(())
    }

    #[test]
    fn bad_values_name_the_file_line_and_key() {
        let cases = [
            (
                "ccl = \"nccl\"",
                ConfigErrorKind::InvalidValue,
                "bridge.ccl",
            ),
            (
                "chunk_bytes = 100",
                ConfigErrorKind::InvalidValue,
                "bridge.chunk_bytes",
            ),
            (
                "chunk_bytes = 4100",
                ConfigErrorKind::InvalidValue,
                "bridge.chunk_bytes",
            ),
            ("depth = 0", ConfigErrorKind::InvalidValue, "bridge.depth"),
            ("depth = 17", ConfigErrorKind::InvalidValue, "bridge.depth"),
            ("chunk = 4096", ConfigErrorKind::UnknownKey, "bridge.chunk"),
        ];
        for (line, kind, key) in cases {
            let text = format!("{BASE}[bridge]\n{line}\n");
            let e = Config::parse(&text, Path::new("b.toml")).expect_err(line);
            assert_eq!(
                (e.kind(), e.line(), e.key()),
                (kind, Some(7), Some(key)),
                "{e}"
            );
            assert!(e.to_string().starts_with("b.toml:7:"), "{e}");
        }
    }
}
