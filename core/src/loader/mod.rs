//! The plugin loader: `dlopen` once, check before any call, never unload.
//!
//! A library is probed for its root tables (`ferrocx_device_adaptor_v1`,
//! `ferrocx_ccl_adaptor_v1`; newer majors are recognised and refused by name) and then for each
//! optional group by its own symbol. Rust plugins built with the SDK are also checked by
//! `abi_stable` (version and type layout) through their root module.

mod error;
mod plugin;
mod table;

pub use error::{LoadError, LoadErrorKind};
pub use plugin::{load_plugin, CclTables, Checked, DeviceTables, LoadedPlugin};
pub use table::{check_size, Table, TableError, MAX_APPENDED_ENTRIES, MAX_NAME};
