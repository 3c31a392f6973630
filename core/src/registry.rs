//! The registry: built-in adaptors (registered with `inventory`) and plugins found on disk, and
//! the selection of one device and one CCL adaptor per cluster.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::abi::{
    CclAdaptorV1, CclWindowV1, DeviceAdaptorV1, DeviceFlatMapV1, DeviceGraphV1, DeviceKernelV1,
    DeviceMemOpsV1, DeviceMulticastV1, DeviceVmmV1,
};
use crate::adaptor::{Ccl, Device};
use crate::config::{ClusterConfig, Config, ConfigErrorKind, RuntimeConfig};
use crate::loader::{
    load_plugin, CclTables, Checked, DeviceTables, LoadError, LoadErrorKind, Table,
};

/// An adaptor compiled into the program, submitted with [`register_builtin!`](crate::register_builtin).
/// It goes through the same tables and checks as a plugin.
pub struct BuiltinAdaptor {
    /// The adaptor's name (must match its tables' headers).
    pub name: &'static str,
    /// Lower sorts first among built-ins.
    pub priority: i32,
    /// Device adaptor table.
    pub device: Option<&'static DeviceAdaptorV1>,
    /// VMM group.
    pub vmm: Option<&'static DeviceVmmV1>,
    /// Flat-map group.
    pub flatmap: Option<&'static DeviceFlatMapV1>,
    /// Multicast group.
    pub multicast: Option<&'static DeviceMulticastV1>,
    /// Graph group.
    pub graph: Option<&'static DeviceGraphV1>,
    /// Kernel group (ABI 1.2).
    pub kernel: Option<&'static DeviceKernelV1>,
    /// Memops group (ABI 1.3).
    pub memops: Option<&'static DeviceMemOpsV1>,
    /// CCL adaptor table.
    pub ccl: Option<&'static CclAdaptorV1>,
    /// Window group.
    pub window: Option<&'static CclWindowV1>,
}

impl BuiltinAdaptor {
    /// A registration with no tables, to fill with struct-update syntax.
    pub const EMPTY: BuiltinAdaptor = BuiltinAdaptor {
        name: "",
        priority: 0,
        device: None,
        vmm: None,
        flatmap: None,
        multicast: None,
        graph: None,
        kernel: None,
        memops: None,
        ccl: None,
        window: None,
    };
}

inventory::collect!(BuiltinAdaptor);

/// Registers a built-in adaptor: `ferrocx::register_builtin!(BuiltinAdaptor { name: "host",
/// device: Some(&HOST_DEVICE), ..BuiltinAdaptor::EMPTY });`
#[macro_export]
macro_rules! register_builtin {
    ($adaptor:expr) => {
        $crate::inventory::submit! { $adaptor }
    };
}

/// Where an adaptor came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Compiled into this program.
    Builtin,
    /// Loaded from a library.
    Plugin(PathBuf),
}

/// One registered adaptor.
pub struct AdaptorEntry {
    /// The adaptor's name.
    pub name: String,
    /// Built-in or the plugin's path.
    pub source: Source,
    /// How its types were checked.
    pub checked: Checked,
    /// Its device tables, if it is a device adaptor.
    pub device: Option<Arc<DeviceTables>>,
    /// Its CCL tables, if it is a CCL adaptor.
    pub ccl: Option<Arc<CclTables>>,
    /// Notes from loading (ignored newer majors, dropped groups).
    pub notes: Vec<String>,
}

impl AdaptorEntry {
    /// A safe handle on its device adaptor.
    pub fn device(&self) -> Option<Device> {
        self.device.clone().map(Device::new)
    }

    /// A safe handle on its CCL adaptor.
    pub fn ccl(&self) -> Option<Ccl> {
        self.ccl.clone().map(Ccl::new)
    }

    /// The ABI `(major, minor)` of its root table(s).
    pub fn abi_version(&self) -> (u16, u16) {
        self.device
            .as_ref()
            .map(|d| d.root.version())
            .or_else(|| self.ccl.as_ref().map(|c| c.root.version()))
            .unwrap_or((0, 0))
    }

    /// The symbols of the tables it exports, root tables first.
    pub fn groups(&self) -> Vec<&'static str> {
        use crate::abi::AbiTable;
        let mut g = Vec::new();
        if let Some(d) = &self.device {
            g.push(DeviceAdaptorV1::SYMBOL);
            d.vmm.is_some().then(|| g.push(DeviceVmmV1::SYMBOL));
            d.flatmap.is_some().then(|| g.push(DeviceFlatMapV1::SYMBOL));
            d.multicast
                .is_some()
                .then(|| g.push(DeviceMulticastV1::SYMBOL));
            d.graph.is_some().then(|| g.push(DeviceGraphV1::SYMBOL));
            d.kernel.is_some().then(|| g.push(DeviceKernelV1::SYMBOL));
            d.memops.is_some().then(|| g.push(DeviceMemOpsV1::SYMBOL));
        }
        if let Some(c) = &self.ccl {
            g.push(CclAdaptorV1::SYMBOL);
            g.extend(c.window.as_ref().map(|_| CclWindowV1::SYMBOL));
        }
        g
    }
}

/// All adaptors known to this process, and every plugin that was refused.
#[derive(Default)]
pub struct Registry {
    entries: Vec<AdaptorEntry>,
    rejected: Vec<LoadError>,
    shadowed: Vec<(PathBuf, String)>,
}

/// The file name a plugin for adaptor `name` has: `libferrocx_adaptor_<name>.so`.
pub fn plugin_file_name(name: &str) -> String {
    format!("libferrocx_adaptor_{name}.so")
}

impl Registry {
    /// An empty registry (no built-ins).
    pub fn empty() -> Self {
        Registry::default()
    }

    /// The built-in adaptors, ordered by priority then name.
    pub fn with_builtins() -> Self {
        let mut r = Registry::empty();
        let mut builtins: Vec<&BuiltinAdaptor> = inventory::iter::<BuiltinAdaptor>().collect();
        builtins.sort_by(|a, b| (a.priority, a.name).cmp(&(b.priority, b.name)));
        for b in builtins {
            match builtin_entry(b) {
                Ok(e) => r.insert(e),
                Err(e) => {
                    tracing::warn!("built-in adaptor refused: {e}");
                    r.rejected.push(e);
                }
            }
        }
        r
    }

    /// Built-ins, then every plugin of `runtime.plugins` and `runtime.plugin_dirs`, in that order.
    /// Failures are logged at WARN and kept in [`Registry::rejected`]; discovery goes on.
    pub fn discover(runtime: &RuntimeConfig) -> Self {
        let mut r = Registry::with_builtins();
        for p in &runtime.plugins {
            // Errors are recorded in `rejected`.
            let _ = r.add_plugin(p);
        }
        for (i, d) in runtime.plugin_dirs.iter().enumerate() {
            match runtime.plugin_dir_is_explicit(i) {
                true => r.add_plugin_dir(d),
                false => r.search_plugin_dir(d),
            }
        }
        r
    }

    /// Loads one plugin library and registers its adaptor.
    pub fn add_plugin(&mut self, path: &Path) -> Result<&AdaptorEntry, LoadError> {
        let outcome = load_plugin(path).and_then(|p| {
            if let Some(existing) = self.find(&p.name) {
                let by = match &existing.source {
                    Source::Builtin => "a built-in adaptor".to_string(),
                    Source::Plugin(other) => other.display().to_string(),
                };
                return Err(LoadError {
                    kind: LoadErrorKind::Duplicate,
                    path: path.to_path_buf(),
                    symbol: None,
                    reason: format!("adaptor name {:?} is already registered by {by}", p.name),
                });
            }
            Ok(p)
        });
        match outcome {
            Ok(p) => {
                tracing::debug!(plugin = %path.display(), name = %p.name, "plugin loaded");
                self.insert(AdaptorEntry {
                    name: p.name.clone(),
                    source: Source::Plugin(path.to_path_buf()),
                    checked: p.checked.clone(),
                    device: p.device.clone(),
                    ccl: p.ccl.clone(),
                    notes: p.notes.clone(),
                });
                Ok(self.entries.last().expect("just inserted"))
            }
            Err(e) => {
                tracing::warn!("plugin refused: {e}");
                self.rejected.push(e.clone());
                Err(e)
            }
        }
    }

    /// [`add_plugin_dir`](Self::add_plugin_dir) for a directory of a search path (a config
    /// file's `plugin_dirs`): one that does not exist is skipped quietly (a DEBUG line), as a
    /// missing entry of `PATH` is; one that exists but cannot be read is still rejected.
    pub fn search_plugin_dir(&mut self, dir: &Path) {
        if let Err(e) = std::fs::metadata(dir) {
            if e.kind() == std::io::ErrorKind::NotFound {
                tracing::debug!(dir = %dir.display(), "plugin directory does not exist; skipped");
                return;
            }
        }
        self.add_plugin_dir(dir);
    }

    /// Loads every `libferrocx_adaptor_*.so` in `dir`, in name order. A missing or unreadable
    /// directory is recorded as rejected, with the reason.
    pub fn add_plugin_dir(&mut self, dir: &Path) {
        let listing = match std::fs::read_dir(dir) {
            Ok(l) => l,
            Err(e) => {
                let err = LoadError::new(
                    LoadErrorKind::NotFound,
                    dir,
                    format!("plugin directory cannot be read: {e}"),
                );
                tracing::warn!("{err}");
                self.rejected.push(err);
                return;
            }
        };
        let mut found: Vec<PathBuf> = listing
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libferrocx_adaptor_") && n.ends_with(".so"))
            })
            .collect();
        found.sort();
        for p in found {
            if self.is_loaded_from(&p) {
                continue;
            }
            // First match wins: a file named for an adaptor already registered (a built-in, or
            // the same plugin in an earlier directory) is not opened at all.
            let stem = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("libferrocx_adaptor_"))
                .and_then(|n| n.strip_suffix(".so"))
                .unwrap_or_default();
            if let Some(existing) = self.find(stem) {
                let by = match &existing.source {
                    Source::Builtin => "the built-in adaptor".to_string(),
                    Source::Plugin(other) => other.display().to_string(),
                };
                tracing::debug!(plugin = %p.display(), "shadowed by {by}");
                self.shadowed.push((p, by));
                continue;
            }
            // Errors are recorded in `rejected`.
            let _ = self.add_plugin(&p);
        }
    }

    fn is_loaded_from(&self, path: &Path) -> bool {
        let canon = std::fs::canonicalize(path).ok();
        self.entries.iter().any(|e| match &e.source {
            Source::Plugin(p) => std::fs::canonicalize(p).ok() == canon,
            Source::Builtin => false,
        })
    }

    fn insert(&mut self, e: AdaptorEntry) {
        self.entries.push(e);
    }

    fn find(&self, name: &str) -> Option<&AdaptorEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Every registered adaptor, built-ins first.
    pub fn entries(&self) -> &[AdaptorEntry] {
        &self.entries
    }

    /// Plugin files not opened because an adaptor of their name was already registered (first
    /// match wins), with what registered it.
    pub fn shadowed(&self) -> &[(PathBuf, String)] {
        &self.shadowed
    }

    /// Every plugin (or directory) that was refused, with the reason.
    pub fn rejected(&self) -> &[LoadError] {
        &self.rejected
    }

    /// The adaptor named `name` that has a device table.
    pub fn device(&self, name: &str) -> Option<&AdaptorEntry> {
        self.entries
            .iter()
            .find(|e| e.name == name && e.device.is_some())
    }

    /// The adaptor named `name` that has a CCL table.
    pub fn ccl(&self, name: &str) -> Option<&AdaptorEntry> {
        self.entries
            .iter()
            .find(|e| e.name == name && e.ccl.is_some())
    }

    /// Names of the device adaptors.
    pub fn device_names(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|e| e.device.is_some())
            .map(|e| e.name.as_str())
            .collect()
    }

    /// Names of the CCL adaptors.
    pub fn ccl_names(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|e| e.ccl.is_some())
            .map(|e| e.name.as_str())
            .collect()
    }

    /// The reason a name is not available: a rejected plugin of that file name, or "not found".
    pub fn why_missing(&self, name: &str) -> String {
        let file = plugin_file_name(name);
        match self
            .rejected
            .iter()
            .find(|e| e.path.file_name().and_then(|f| f.to_str()) == Some(file.as_str()))
        {
            Some(e) => format!("its plugin was refused: {e}"),
            None => format!("no built-in adaptor and no {file} in the plugin directories"),
        }
    }

    /// The device and CCL adaptors a cluster of `config` would use; an error names the file,
    /// line and key of the cluster's `device` or `ccl`, or of `multicast = "on"` where the device
    /// adaptor has no multicast group.
    pub fn select(
        &self,
        config: &Config,
        index: usize,
    ) -> Result<Selection, crate::config::ConfigError> {
        let cluster: &ClusterConfig = &config.clusters[index];
        let device = self.device(&cluster.device).ok_or_else(|| {
            config.cluster_error(
                index,
                "device",
                ConfigErrorKind::UnknownAdaptor,
                format!(
                    "device adaptor {:?} is not available: {}; available: {}",
                    cluster.device,
                    self.why_missing(&cluster.device),
                    list(&self.device_names())
                ),
            )
        })?;
        let ccl = self.ccl(&cluster.ccl).ok_or_else(|| {
            config.cluster_error(
                index,
                "ccl",
                ConfigErrorKind::UnknownAdaptor,
                format!(
                    "CCL adaptor {:?} is not available: {}; available: {}",
                    cluster.ccl,
                    self.why_missing(&cluster.ccl),
                    list(&self.ccl_names())
                ),
            )
        })?;
        let device_handle = device.device().expect("device() checked the table");
        // `apply_env` has already turned `on` off where a kill-switch is set (with a warning).
        if cluster.multicast == crate::config::MulticastMode::On
            && device_handle.tables().multicast.is_none()
        {
            return Err(config.cluster_error(
                index,
                "multicast",
                ConfigErrorKind::InvalidValue,
                format!(
                    "multicast = \"on\", but the device adaptor {:?} has no multicast group; say \"auto\" or \"off\"",
                    cluster.device
                ),
            ));
        }
        Ok(Selection {
            cluster: cluster.name.clone(),
            device: device_handle,
            ccl: ccl.ccl().expect("ccl() checked the table"),
        })
    }
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// The adaptors one cluster uses.
#[derive(Clone)]
pub struct Selection {
    /// The cluster's name.
    pub cluster: String,
    /// Its device adaptor.
    pub device: Device,
    /// Its CCL adaptor.
    pub ccl: Ccl,
}

fn builtin_entry(b: &BuiltinAdaptor) -> Result<AdaptorEntry, LoadError> {
    let path = PathBuf::from(format!("<built-in {}>", b.name));
    fn opt<T: crate::abi::AbiTable>(
        path: &Path,
        t: Option<&'static T>,
    ) -> Result<Option<Table<T>>, LoadError> {
        t.map(Table::builtin).transpose().map_err(|e| {
            LoadError::new(LoadErrorKind::BadHeader, path, e.to_string()).at(T::SYMBOL)
        })
    }
    let device = match opt(&path, b.device)? {
        Some(root) => Some(Arc::new(DeviceTables {
            vmm: opt(&path, b.vmm)?,
            flatmap: opt(&path, b.flatmap)?,
            multicast: opt(&path, b.multicast)?,
            graph: opt(&path, b.graph)?,
            kernel: opt(&path, b.kernel)?,
            memops: opt(&path, b.memops)?,
            ..DeviceTables::new(root)
        })),
        None => None,
    };
    let ccl = match opt(&path, b.ccl)? {
        Some(root) => Some(Arc::new(CclTables {
            window: opt(&path, b.window)?,
            ..CclTables::new(root)
        })),
        None => None,
    };
    for name in device
        .iter()
        .map(|d| d.root.name())
        .chain(ccl.iter().map(|c| c.root.name()))
    {
        if name != b.name {
            return Err(LoadError::new(
                LoadErrorKind::Inconsistent,
                &path,
                format!("registered as {:?} but its table is named {name:?}", b.name),
            ));
        }
    }
    Ok(AdaptorEntry {
        name: b.name.to_string(),
        source: Source::Builtin,
        checked: Checked::Builtin,
        device,
        ccl,
        notes: Vec::new(),
    })
}
