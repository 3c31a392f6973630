//! Opening a plugin library and probing its tables.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use abi_stable::library::{lib_header_from_path, RootModule, ROOT_MODULE_LOADER_NAME};
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use crate::abi::{
    AbiTable, CclAdaptorV1, CclWindowV1, DeviceAdaptorV1, DeviceFlatMapV1, DeviceGraphV1,
    DeviceKernelV1, DeviceMemOpsV1, DeviceMulticastV1, DeviceVmmV1, PluginModuleRef, ABI_MAJOR,
    CCL_ROOT_PREFIX, DEVICE_ROOT_PREFIX,
};

use super::error::{LoadError, LoadErrorKind};
use super::table::Table;

/// The device tables of one adaptor: the root table and the optional groups it exports.
pub struct DeviceTables {
    /// `ferrocx_device_adaptor_v1`.
    pub root: Table<DeviceAdaptorV1>,
    /// `ferrocx_device_vmm_v1`, if exported.
    pub vmm: Option<Table<DeviceVmmV1>>,
    /// `ferrocx_device_flatmap_v1`, if exported.
    pub flatmap: Option<Table<DeviceFlatMapV1>>,
    /// `ferrocx_device_multicast_v1`, if exported.
    pub multicast: Option<Table<DeviceMulticastV1>>,
    /// `ferrocx_device_graph_v1`, if exported.
    pub graph: Option<Table<DeviceGraphV1>>,
    /// `ferrocx_device_kernel_v1`, if exported (ABI 1.2).
    pub kernel: Option<Table<DeviceKernelV1>>,
    /// `ferrocx_device_memops_v1`, if exported (ABI 1.3).
    pub memops: Option<Table<DeviceMemOpsV1>>,
    /// The capabilities, probed once after `init` (see [`crate::caps`]).
    pub(crate) caps: crate::caps::Cached<crate::caps::DeviceCaps>,
}

/// The CCL tables of one adaptor.
pub struct CclTables {
    /// `ferrocx_ccl_adaptor_v1`.
    pub root: Table<CclAdaptorV1>,
    /// `ferrocx_ccl_window_v1`, if exported.
    pub window: Option<Table<CclWindowV1>>,
    /// The capabilities, probed once after `init` (see [`crate::caps`]).
    pub(crate) caps: crate::caps::Cached<crate::caps::CclCaps>,
}

impl DeviceTables {
    /// Tables with no capabilities probed yet.
    pub fn new(root: Table<DeviceAdaptorV1>) -> Self {
        DeviceTables {
            root,
            vmm: None,
            flatmap: None,
            multicast: None,
            graph: None,
            kernel: None,
            memops: None,
            caps: Default::default(),
        }
    }
}

impl CclTables {
    /// Tables with no capabilities probed yet.
    pub fn new(root: Table<CclAdaptorV1>) -> Self {
        CclTables {
            root,
            window: None,
            caps: Default::default(),
        }
    }
}

/// How a plugin's types were checked before any call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// A Rust plugin: `abi_stable` checked its version and the layout of the shared types, and
    /// its root module lists exactly the tables found by symbol.
    AbiStable,
    /// A C/C++ plugin (no `abi_stable` root module): checked by the tables' headers only.
    HeaderOnly,
    /// Compiled into this program.
    Builtin,
}

/// A library that loaded: the tables it exports, checked and copied.
pub struct LoadedPlugin {
    /// The library's path as given.
    pub path: PathBuf,
    /// The adaptor's name (from the tables' headers).
    pub name: String,
    /// How the library was checked.
    pub checked: Checked,
    /// Device tables, if the library exports a device adaptor.
    pub device: Option<Arc<DeviceTables>>,
    /// CCL tables, if the library exports a CCL adaptor.
    pub ccl: Option<Arc<CclTables>>,
    /// Things worth saying that did not prevent loading (a newer major ignored, a group dropped).
    pub notes: Vec<String>,
}

type Cache = Mutex<HashMap<PathBuf, Result<Arc<LoadedPlugin>, LoadError>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Loads the plugin at `path`, or returns the outcome of an earlier load of the same file: a
/// library is opened once and never unloaded.
pub fn load_plugin(path: &Path) -> Result<Arc<LoadedPlugin>, LoadError> {
    let key = std::fs::canonicalize(path).map_err(|e| {
        LoadError::new(
            LoadErrorKind::NotFound,
            path,
            format!("cannot read the plugin: {e}"),
        )
    })?;
    let mut cache = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(done) = cache.get(&key) {
        return done.clone();
    }
    let outcome = open_and_probe(path).map(Arc::new);
    cache.insert(key, outcome.clone());
    outcome
}

struct Opened {
    path: PathBuf,
    lib: Library,
}

impl Opened {
    fn symbol(&self, name: &str) -> Option<*const c_void> {
        // SAFETY: the symbol's address is only read, as data of the type its name promises
        // (checked by the table header before any field is used).
        unsafe { self.lib.get::<*const c_void>(name.as_bytes()) }
            .ok()
            .map(|s| *s)
            .filter(|p| !p.is_null())
    }

    /// Reads the table `T` at its symbol, if exported.
    fn table<T: AbiTable>(&self) -> Result<Option<Table<T>>, LoadError> {
        let Some(ptr) = self.symbol(T::SYMBOL) else {
            return Ok(None);
        };
        // SAFETY: the symbol is exported under T's versioned name, so it promises a table of T's
        // major; `Table::read` checks the magic and major before copying only `struct_size` bytes.
        unsafe { Table::<T>::read(ptr as *const T) }
            .map(Some)
            .map_err(|e| {
                LoadError::new(LoadErrorKind::BadHeader, &self.path, e.to_string()).at(T::SYMBOL)
            })
    }

    /// The root symbols of majors newer than this build's that the library exports.
    fn newer_roots(&self, prefix: &str) -> Vec<String> {
        // Probed newest to oldest; a handful of future majors is plenty to say "too new".
        ((ABI_MAJOR + 1)..=(ABI_MAJOR + 8))
            .rev()
            .map(|v| format!("{prefix}{v}"))
            .filter(|s| self.symbol(s).is_some())
            .collect()
    }
}

fn open_and_probe(path: &Path) -> Result<LoadedPlugin, LoadError> {
    if !path.is_file() {
        return Err(LoadError::new(LoadErrorKind::NotFound, path, "not a file"));
    }
    // RTLD_NOW: an unresolved symbol is an error here, not a crash at the first call.
    // SAFETY: loading runs the library's initialisers; a plugin directory is trusted code, as
    // NCCL's plugin path is. The library is never unloaded (leaked below).
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
        .map_err(|e| LoadError::new(LoadErrorKind::Open, path, format!("dlopen failed: {e}")))?;
    let opened = Opened {
        path: path.to_path_buf(),
        lib,
    };
    let result = probe(&opened);
    // Never unloaded: function pointers copied out of it must stay valid, and unloading Rust
    // libraries that use thread-locals is unsound.
    std::mem::forget(opened);
    result
}

fn probe(lib: &Opened) -> Result<LoadedPlugin, LoadError> {
    let path = &lib.path;
    let mut notes = Vec::new();
    let device_root = lib.table::<DeviceAdaptorV1>()?;
    let ccl_root = lib.table::<CclAdaptorV1>()?;
    let newer: Vec<String> = lib
        .newer_roots(DEVICE_ROOT_PREFIX)
        .into_iter()
        .chain(lib.newer_roots(CCL_ROOT_PREFIX))
        .collect();
    if device_root.is_none() && ccl_root.is_none() {
        if let Some(sym) = newer.first() {
            let major = sym.rsplit('v').next().unwrap_or("?");
            return Err(LoadError::new(
                LoadErrorKind::NewerMajor,
                path,
                format!(
                    "exports only ABI {major}.x tables ({}); this build reads ABI {ABI_MAJOR}.x",
                    newer.join(", ")
                ),
            )
            .at(sym.clone()));
        }
        return Err(LoadError::new(
            LoadErrorKind::NoSymbols,
            path,
            format!(
                "exports no ferrocx table (looked for `{}` and `{}`)",
                DeviceAdaptorV1::SYMBOL,
                CclAdaptorV1::SYMBOL
            ),
        ));
    }
    for sym in &newer {
        notes.push(format!(
            "ignored `{sym}` (a newer ABI major); using the v{ABI_MAJOR} tables"
        ));
    }

    let name = match (&device_root, &ccl_root) {
        (Some(d), Some(c)) if d.name() != c.name() => {
            return Err(LoadError::new(
                LoadErrorKind::Inconsistent,
                path,
                format!(
                    "the device table is named {:?} but the CCL table {:?}",
                    d.name(),
                    c.name()
                ),
            ));
        }
        (Some(d), _) => d.name().to_string(),
        (None, Some(c)) => c.name().to_string(),
        (None, None) => unreachable!("checked above"),
    };

    let checked = check_root_module(lib)?;

    // Optional groups: a broken one is dropped with a warning, the plugin still loads.
    fn group<T: AbiTable>(lib: &Opened, notes: &mut Vec<String>) -> Option<Table<T>> {
        match lib.table::<T>() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(plugin = %lib.path.display(), "optional group dropped: {e}");
                notes.push(format!("dropped: {e}"));
                None
            }
        }
    }
    let device = device_root.map(|root| {
        Arc::new(DeviceTables {
            vmm: group::<DeviceVmmV1>(lib, &mut notes),
            flatmap: group::<DeviceFlatMapV1>(lib, &mut notes),
            multicast: group::<DeviceMulticastV1>(lib, &mut notes),
            graph: group::<DeviceGraphV1>(lib, &mut notes),
            kernel: group::<DeviceKernelV1>(lib, &mut notes),
            memops: group::<DeviceMemOpsV1>(lib, &mut notes),
            ..DeviceTables::new(root)
        })
    });
    let ccl = ccl_root.map(|root| {
        Arc::new(CclTables {
            window: group::<CclWindowV1>(lib, &mut notes),
            ..CclTables::new(root)
        })
    });
    Ok(LoadedPlugin {
        path: path.clone(),
        name,
        checked,
        device,
        ccl,
        notes,
    })
}

/// For a Rust plugin (one that exports an `abi_stable` root module): checks the `abi_stable`
/// version and type layouts, then that the root module agrees with the exported symbols.
fn check_root_module(lib: &Opened) -> Result<Checked, LoadError> {
    let path = &lib.path;
    if lib.symbol(ROOT_MODULE_LOADER_NAME).is_none() {
        return Ok(Checked::HeaderOnly);
    }
    let fail =
        |kind, reason: String| LoadError::new(kind, path, reason).at(ROOT_MODULE_LOADER_NAME);
    // lib_header_from_path opens the same file again (the same handle, reference-counted) and
    // leaks it; init_root_module is per library, unlike load_from_file's per-type cache.
    let module = lib_header_from_path(path)
        .and_then(|h| h.init_root_module::<PluginModuleRef>())
        .map_err(|e| {
            fail(
                LoadErrorKind::LayoutCheck,
                format!("abi_stable check failed: {e}"),
            )
        })?;
    if module.abi_major() != ABI_MAJOR {
        return Err(fail(
            LoadErrorKind::NewerMajor,
            format!(
                "root module {:?} declares ABI {}.{}, this build reads ABI {ABI_MAJOR}.x",
                PluginModuleRef::NAME,
                module.abi_major(),
                module.abi_minor()
            ),
        ));
    }
    let tables = module.tables();
    let mut listed = Vec::new();
    for t in tables.as_slice() {
        let sym = t.symbol.as_str();
        let at = lib.symbol(sym);
        if at != Some(t.header as *const _ as *const c_void) {
            return Err(fail(
                LoadErrorKind::Inconsistent,
                format!("the root module lists `{sym}`, but the library's symbol of that name is elsewhere or missing"),
            ));
        }
        listed.push(sym.to_string());
    }
    for sym in [
        DeviceAdaptorV1::SYMBOL,
        DeviceVmmV1::SYMBOL,
        DeviceFlatMapV1::SYMBOL,
        DeviceMulticastV1::SYMBOL,
        DeviceGraphV1::SYMBOL,
        DeviceKernelV1::SYMBOL,
        DeviceMemOpsV1::SYMBOL,
        CclAdaptorV1::SYMBOL,
        CclWindowV1::SYMBOL,
    ] {
        if lib.symbol(sym).is_some() && !listed.iter().any(|l| l == sym) {
            return Err(fail(
                LoadErrorKind::Inconsistent,
                format!("exports `{sym}`, which its root module does not list"),
            ));
        }
    }
    Ok(Checked::AbiStable)
}
