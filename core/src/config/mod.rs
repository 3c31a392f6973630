//! Configuration: where plugins are found, the runtime's deadlines, and which device and CCL
//! adaptor each cluster of ranks uses.
//!
//! A config is a TOML file, validated when it is loaded: every error names the file, the line
//! and the key (``configs/hetero.toml:28:9: key `cluster[1].ranks`: ...``). Environment variables
//! override it ([`Config::apply_env`]); [`Config::from_env`] does both the way a program
//! started by `ferrocx launch` should.
//!
//! ```toml
//! [runtime]
//! plugin_dirs = ["./target/release"]   # searched for libferrocx_adaptor_<name>.so
//! timeout_ms  = 30000                  # deadline for any wait on a peer
//!
//! [[cluster]]
//! name   = "gpu"
//! ranks  = "0-3"
//! device = "cuda"
//! ccl    = "nccl"
//! multicast = "off"
//!
//! [cluster.options.nccl]
//! library = "/opt/nccl/lib/libnccl.so.2"
//! ```
//!
//! ```
//! use std::path::Path;
//! use ferrocx::config::{Config, MulticastMode};
//!
//! let text = "[[cluster]]\nname = \"gpu\"\ndevice = \"cuda\"\nccl = \"nccl\"\n";
//! let mut config = Config::parse(text, Path::new("inline.toml"))?;
//! let warnings = config.apply_env(|var| (var == "FERROCX_MULTICAST").then(|| "0".to_string()))?;
//! assert!(warnings.is_empty());
//! let gpu = config.cluster_for_rank(7).expect("a single cluster takes every rank");
//! assert_eq!((gpu.device.as_str(), gpu.multicast), ("cuda", MulticastMode::Off));
//! # Ok::<(), ferrocx::config::ConfigError>(())
//! ```

mod bridge;
mod document;
mod env;
mod error;
mod position;
mod ranks;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use bridge::{
    BridgeCcl, BridgeConfig, DEFAULT_CHUNK_BYTES, DEFAULT_DEPTH, MAX_CHUNK_BYTES, MAX_DEPTH,
};
pub use env::{
    multicast_kill_switches, ENV_CONFIG, ENV_LOG, ENV_MULTICAST, ENV_NCCL_NVLS_ENABLE,
    ENV_PLUGIN_PATH, ENV_TIMEOUT_MS,
};
pub use error::{ConfigError, ConfigErrorKind, ErrorOrigin};
pub use ranks::{ParseRankSetError, RankSet};

use position::KeyPositions;

/// The deadline for any wait on a peer when neither the file nor the environment sets one.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// The values `runtime.log` and `FERROCX_LOG` accept, least verbose first.
pub const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// Where a [`Config`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigOrigin {
    /// Read from this file (or parsed from text said to come from it).
    File(PathBuf),
    /// Built in code, e.g. by [`Config::default_local`].
    Defaults,
}

impl ConfigOrigin {
    /// The file, if the config came from one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ConfigOrigin::File(path) => Some(path),
            ConfigOrigin::Defaults => None,
        }
    }

    /// The same place, as the origin of an error.
    pub(crate) fn to_error_origin(&self) -> ErrorOrigin {
        match self {
            ConfigOrigin::File(path) => ErrorOrigin::File(path.clone()),
            ConfigOrigin::Defaults => ErrorOrigin::Defaults,
        }
    }
}

impl fmt::Display for ConfigOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigOrigin::File(path) => write!(f, "{}", path.display()),
            ConfigOrigin::Defaults => f.write_str("<built-in defaults>"),
        }
    }
}

/// A validated configuration: the `[runtime]` table and every `[[cluster]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where it came from; errors found later name this file.
    pub origin: ConfigOrigin,
    /// Settings for the whole process.
    pub runtime: RuntimeConfig,
    /// The clusters, in file order; their rank sets do not overlap.
    pub clusters: Vec<ClusterConfig>,
    /// The `[bridge]` table: how clusters exchange data in a job that spans several.
    pub bridge: BridgeConfig,
}

/// The `[runtime]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Directories searched for `libferrocx_adaptor_<name>.so`, first match wins; relative
    /// entries of a file are resolved against the file's directory.
    pub plugin_dirs: Vec<PathBuf>,
    /// Plugin libraries to load explicitly, resolved like `plugin_dirs`.
    pub plugins: Vec<PathBuf>,
    /// Deadline in milliseconds for any wait on a peer; never 0.
    pub timeout_ms: u64,
    /// Log level, one of [`LOG_LEVELS`]; `None` leaves the choice to the program.
    pub log: Option<String>,
    positions: KeyPositions,
    /// How many of the first `plugin_dirs` came from `FERROCX_PLUGIN_PATH`.
    env_plugin_dirs: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            plugin_dirs: Vec::new(),
            plugins: Vec::new(),
            timeout_ms: DEFAULT_TIMEOUT_MS,
            log: None,
            positions: KeyPositions::default(),
            env_plugin_dirs: 0,
        }
    }
}

impl RuntimeConfig {
    /// Whether `plugin_dirs[index]` was named explicitly (`FERROCX_PLUGIN_PATH`), so that its
    /// absence is worth a warning; the others are search paths of a config file (the shipped
    /// ones name the workspace's build directories, which need not exist).
    pub fn plugin_dir_is_explicit(&self, index: usize) -> bool {
        index < self.env_plugin_dirs
    }

    /// The line where `key` of `[runtime]` was written (`timeout_ms`, `plugin_dirs[1]`), if it
    /// came from a file and was not overridden since.
    pub fn line_of(&self, key: &str) -> Option<usize> {
        self.positions.key(key).map(|p| p.line)
    }
}

/// Where the operations a cluster's CCL lacks (windows, a missing collective) go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum Fallback {
    /// To the symmetric heap and the window kernels (`"symheap"`, the default).
    #[default]
    #[serde(rename = "symheap")]
    SymHeap,
    /// Nowhere: they fail with "not supported" (`"none"`).
    #[serde(rename = "none")]
    Disabled,
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fallback::SymHeap => "symheap",
            Fallback::Disabled => "none",
        })
    }
}

/// Whether a cluster may create multicast objects.
///
/// A kill-switch in the environment (`FERROCX_MULTICAST=0`, `NCCL_NVLS_ENABLE=0`) turns every
/// cluster [`Off`](MulticastMode::Off), whatever the file says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MulticastMode {
    /// Where the device supports it (the default).
    #[default]
    Auto,
    /// Never.
    Off,
    /// Always; a device that cannot is an error at selection.
    On,
}

impl fmt::Display for MulticastMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MulticastMode::Auto => "auto",
            MulticastMode::Off => "off",
            MulticastMode::On => "on",
        })
    }
}

/// What backs a cluster's windows (`window = ...`); see `ferrocx::window`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum WindowMode {
    /// The CCL's own window group where it has one, else the symmetric heap (`"auto"`, the
    /// default; `fallback = "none"` forbids the heap).
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// Always the CCL's window group; registering fails where the CCL has none (`"vendor"`).
    #[serde(rename = "vendor")]
    Vendor,
    /// Always the symmetric heap, even where the CCL has a window group (`"symheap"`).
    #[serde(rename = "symheap")]
    SymHeap,
    /// Per-peer pointers from IPC handles, never a flat range (`"ipc"`).
    #[serde(rename = "ipc")]
    Ipc,
}

impl fmt::Display for WindowMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WindowMode::Auto => "auto",
            WindowMode::Vendor => "vendor",
            WindowMode::SymHeap => "symheap",
            WindowMode::Ipc => "ipc",
        })
    }
}

/// Where a cluster's small all-reduces and all-gathers go (`small_message = ...`): the window
/// algorithms of `ferrocx-kernels` (one-shot / two-shot all-reduce, the all-gather, over a
/// scratch window) or the CCL. Above the crossover (`window_two_shot_max`) every all-reduce goes
/// to the CCL, unless the CCL has none (then the window ring takes it, with
/// `fallback = "symheap"`); an all-gather goes to the window where each rank's input fits its
/// chunk slot and (with `auto`) the output is below the provider's measured reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmallMessage {
    /// The window algorithms where they were measured faster than the device's CCL (the
    /// default), else the CCL.
    #[default]
    Auto,
    /// Always the window algorithms below the crossover (every all-gather that fits).
    Window,
    /// Always the CCL.
    Ccl,
}

impl fmt::Display for SmallMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SmallMessage::Auto => "auto",
            SmallMessage::Window => "window",
            SmallMessage::Ccl => "ccl",
        })
    }
}

/// One `[[cluster]]`: a set of ranks and the adaptors they use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Unique, non-empty name.
    pub name: String,
    /// The ranks in this cluster; every rank when the file has one cluster and leaves it out.
    pub ranks: RankSet,
    /// Device adaptor name (`"cuda"`, `"host"`, ...).
    pub device: String,
    /// CCL adaptor name (`"nccl"`, `"host"`, ...).
    pub ccl: String,
    /// Where operations the CCL lacks go.
    pub fallback: Fallback,
    /// Whether multicast objects may be created.
    pub multicast: MulticastMode,
    /// What backs windows.
    pub window: WindowMode,
    /// Where small all-reduces go.
    pub small_message: SmallMessage,
    /// Bytes up to which a window all-reduce is one-shot (`None`: the measured default of the
    /// device and world size).
    pub window_one_shot_max: Option<u64>,
    /// Bytes up to which a window all-reduce is two-shot, and the crossover of
    /// `small_message` (`None`: the measured default).
    pub window_two_shot_max: Option<u64>,
    /// Options per adaptor name (the cluster's device or CCL), values as strings.
    pub options: BTreeMap<String, BTreeMap<String, String>>,
    positions: KeyPositions,
}

impl ClusterConfig {
    /// A cluster with the default fallback, multicast and window modes and no options.
    pub fn new(
        name: impl Into<String>,
        ranks: RankSet,
        device: impl Into<String>,
        ccl: impl Into<String>,
    ) -> Self {
        ClusterConfig {
            name: name.into(),
            ranks,
            device: device.into(),
            ccl: ccl.into(),
            fallback: Fallback::default(),
            multicast: MulticastMode::default(),
            window: WindowMode::default(),
            small_message: SmallMessage::default(),
            window_one_shot_max: None,
            window_two_shot_max: None,
            options: BTreeMap::new(),
            positions: KeyPositions::default(),
        }
    }

    /// The options given for adaptor `adaptor` (`[cluster.options.<adaptor>]`), if any.
    pub fn options_for(&self, adaptor: &str) -> Option<&BTreeMap<String, String>> {
        self.options.get(adaptor)
    }

    /// The line where `key` of this cluster was written (`ccl`, `options.nccl.library`), or
    /// else the line of its `[[cluster]]` header; `None` for a cluster built in code.
    pub fn line_of(&self, key: &str) -> Option<usize> {
        self.positions.key_or_table(key).map(|p| p.line)
    }
}

/// Largest config file read: far more than any real one (8000 clusters take about 1 MiB).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The text of config file `path`, or why it cannot be read. Opened without blocking (a FIFO
/// would wait for a writer), then refused unless a regular file no larger than
/// [`MAX_CONFIG_BYTES`]; read through a bound too, in case it grows meanwhile.
fn read_config_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(format!("it is {what}; a config is a regular file"));
    }
    let too_big = |n: u64| {
        format!("it has {n} bytes or more, over the limit of {MAX_CONFIG_BYTES} bytes for a config")
    };
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "it is not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}

impl Config {
    /// Reads and validates the config file at `path`: a regular file (not a FIFO or a device,
    /// which could block or never end) of at most [`MAX_CONFIG_BYTES`].
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_config_file(path).map_err(|why| {
            ConfigError::new(
                ErrorOrigin::File(path.to_path_buf()),
                ConfigErrorKind::Io,
                format!("cannot read config file: {why}"),
            )
        })?;
        let config = Self::parse(&text, path)?;
        tracing::debug!(path = %path.display(), clusters = config.clusters.len(), "config loaded");
        Ok(config)
    }

    /// Parses and validates config `text`; `origin` is the file it came from, named in errors
    /// and used to resolve relative plugin paths.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let config = document::parse(text, origin)?;
        config.validate()?;
        Ok(config)
    }

    /// The config used when none is given: one cluster `local` of every rank on the host
    /// device and the host CCL.
    pub fn default_local() -> Config {
        Config {
            origin: ConfigOrigin::Defaults,
            runtime: RuntimeConfig::default(),
            clusters: vec![ClusterConfig::new("local", RankSet::all(), "host", "host")],
            bridge: BridgeConfig::default(),
        }
    }

    /// The cluster that `rank` belongs to, if any.
    pub fn cluster_for_rank(&self, rank: usize) -> Option<&ClusterConfig> {
        self.clusters.iter().find(|c| c.ranks.contains(rank))
    }

    /// The cluster called `name`, if any.
    pub fn cluster_named(&self, name: &str) -> Option<&ClusterConfig> {
        self.clusters.iter().find(|c| c.name == name)
    }

    /// An error about `key` of cluster `index` (`"ccl"`, `"options.nccl.library"`), located
    /// at the line it was written on: for checks made after loading (e.g. at selection).
    pub fn cluster_error(
        &self,
        index: usize,
        key: &str,
        kind: ConfigErrorKind,
        message: impl Into<String>,
    ) -> ConfigError {
        let pos = self
            .clusters
            .get(index)
            .and_then(|c| c.positions.key_or_table(key));
        ConfigError::new(self.origin.to_error_origin(), kind, message)
            .at(pos)
            .with_key(format!("cluster[{index}].{key}"))
    }

    /// An error about `key` of `[bridge]` (`"ccl"`, `"depth"`), located at the line it was
    /// written on.
    pub fn bridge_error(
        &self,
        key: &str,
        kind: ConfigErrorKind,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::new(self.origin.to_error_origin(), kind, message)
            .at(self.bridge.positions.key(key))
            .with_key(format!("bridge.{key}"))
    }

    /// An error about `key` of `[runtime]` (`"timeout_ms"`, `"plugin_dirs[0]"`), located at
    /// the line it was written on.
    pub fn runtime_error(
        &self,
        key: &str,
        kind: ConfigErrorKind,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::new(self.origin.to_error_origin(), kind, message)
            .at(self.runtime.positions.key(key))
            .with_key(format!("runtime.{key}"))
    }
}

impl Default for Config {
    /// [`Config::default_local`].
    fn default() -> Self {
        Self::default_local()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_local_is_one_host_cluster_of_every_rank() {
        let c = Config::default_local();
        assert_eq!(c.origin, ConfigOrigin::Defaults);
        assert_eq!(c.clusters.len(), 1);
        let local = &c.clusters[0];
        assert_eq!(
            (
                local.name.as_str(),
                local.device.as_str(),
                local.ccl.as_str()
            ),
            ("local", "host", "host")
        );
        assert!(local.ranks.is_all());
        assert_eq!(c.runtime.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(
            c.cluster_for_rank(12345).map(|c| c.name.as_str()),
            Some("local")
        );
    }

    #[test]
    fn cluster_for_rank_picks_the_owner() -> Result<(), ConfigError> {
        let text = r#"
[[cluster]]
name = "gpu"
ranks = "0-3"
device = "cuda"
ccl = "nccl"

[[cluster]]
name = "cpu"
ranks = "4-7,10"
device = "host"
ccl = "host"
"#;
        let c = Config::parse(text, Path::new("x.toml"))?;
        let owner = |r| c.cluster_for_rank(r).map(|c| c.name.as_str());
        assert_eq!(owner(0), Some("gpu"));
        assert_eq!(owner(3), Some("gpu"));
        assert_eq!(owner(4), Some("cpu"));
        assert_eq!(owner(10), Some("cpu"));
        assert_eq!(owner(8), None);
        assert_eq!(
            c.cluster_named("cpu").map(|c| c.ranks.to_string()),
            Some("4-7,10".into())
        );
        Ok(())
    }

    #[test]
    fn later_errors_name_the_line() -> Result<(), ConfigError> {
        let text = "[runtime]\ntimeout_ms = 5\n\n[[cluster]]\nname = \"a\"\ndevice = \"cuda\"\nccl = \"nccl\"\n";
        let c = Config::parse(text, Path::new("dir/x.toml"))?;
        let e = c.cluster_error(
            0,
            "ccl",
            ConfigErrorKind::InvalidValue,
            "nccl cannot run here",
        );
        assert_eq!(
            e.to_string(),
            "dir/x.toml:7:7: key `cluster[0].ccl`: nccl cannot run here"
        );
        // A key that was not written points at the cluster's header.
        assert_eq!(c.clusters[0].line_of("multicast"), Some(4));
        assert_eq!(c.runtime.line_of("timeout_ms"), Some(2));
        let e = c.runtime_error("timeout_ms", ConfigErrorKind::InvalidValue, "too short");
        assert_eq!((e.line(), e.key()), (Some(2), Some("runtime.timeout_ms")));
        Ok(())
    }

    #[test]
    fn display_of_enums_uses_file_spelling() {
        assert_eq!(Fallback::SymHeap.to_string(), "symheap");
        assert_eq!(Fallback::Disabled.to_string(), "none");
        assert_eq!(MulticastMode::Auto.to_string(), "auto");
        assert_eq!(MulticastMode::On.to_string(), "on");
        assert_eq!(WindowMode::SymHeap.to_string(), "symheap");
        assert_eq!(WindowMode::Ipc.to_string(), "ipc");
    }

    #[test]
    fn small_message_keys_are_parsed_and_checked() -> Result<(), ConfigError> {
        let base = "[[cluster]]\nname = \"a\"\ndevice = \"host\"\nccl = \"host\"\n";
        let c = Config::parse(base, Path::new("s.toml"))?;
        let a = &c.clusters[0];
        assert_eq!(
            (
                a.small_message,
                a.window_one_shot_max,
                a.window_two_shot_max
            ),
            (SmallMessage::Auto, None, None)
        );
        let text = format!(
            "{base}small_message = \"window\"\nwindow_one_shot_max = 4096\nwindow_two_shot_max = 262144\n"
        );
        let c = Config::parse(&text, Path::new("s.toml"))?;
        let a = &c.clusters[0];
        assert_eq!(
            (
                a.small_message,
                a.window_one_shot_max,
                a.window_two_shot_max
            ),
            (SmallMessage::Window, Some(4096), Some(262144))
        );
        assert_eq!(a.line_of("window_two_shot_max"), Some(7));
        assert_eq!(SmallMessage::Ccl.to_string(), "ccl");
        let e = Config::parse(
            &format!("{base}small_message = \"nccl\"\n"),
            Path::new("s.toml"),
        )
        .expect_err("an unknown mode");
        assert_eq!(
            (e.line(), e.key()),
            (Some(5), Some("cluster[0].small_message"))
        );
        let e = Config::parse(
            &format!("{base}window_one_shot_max = 9000\nwindow_two_shot_max = 8192\n"),
            Path::new("s.toml"),
        )
        .expect_err("one-shot above two-shot");
        assert_eq!(
            (e.kind(), e.line(), e.key()),
            (
                ConfigErrorKind::InvalidValue,
                Some(5),
                Some("cluster[0].window_one_shot_max")
            )
        );
        assert!(e.message().contains("9000 bytes is above"), "{e}");
        Ok(())
    }

    #[test]
    fn window_key_is_parsed_and_checked() -> Result<(), ConfigError> {
        let base = "[[cluster]]\nname = \"a\"\ndevice = \"host\"\nccl = \"host\"\n";
        assert_eq!(
            Config::parse(base, Path::new("w.toml"))?.clusters[0].window,
            WindowMode::Auto
        );
        for (text, mode) in [
            ("auto", WindowMode::Auto),
            ("vendor", WindowMode::Vendor),
            ("symheap", WindowMode::SymHeap),
            ("ipc", WindowMode::Ipc),
        ] {
            let c = Config::parse(&format!("{base}window = \"{text}\"\n"), Path::new("w.toml"))?;
            assert_eq!(c.clusters[0].window, mode);
            assert_eq!(c.clusters[0].line_of("window"), Some(5));
        }
        let e = Config::parse(&format!("{base}window = \"flat\"\n"), Path::new("w.toml"))
            .expect_err("an unknown window mode");
        assert_eq!(
            (e.kind(), e.line(), e.key()),
            (
                ConfigErrorKind::InvalidValue,
                Some(5),
                Some("cluster[0].window")
            )
        );
        assert!(e.message().contains("symheap"), "{e}");
        Ok(())
    }
}
