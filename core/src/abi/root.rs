//! The `abi_stable` root module every Rust plugin built with the SDK exports.
//!
//! The tables themselves are plain `#[repr(C)]` structs versioned by their [`AbiHeader`] (so a
//! C plugin can export them and a minor can append fields). The root module is what lets the
//! loader check, before any call, that a Rust plugin was built with a compatible `abi_stable`
//! and that the types it shares with the loader have the same layout. It is an `abi_stable`
//! prefix type, so it can itself grow fields without breaking older plugins.

use abi_stable::library::RootModule;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RSlice, RStr};
use abi_stable::{declare_root_module_statics, StableAbi};

use super::header::AbiHeader;
use super::types::{Capabilities, DataType, DevicePtr, ReduceOp, Status};

/// One table a plugin exports: its symbol name and a pointer to its header.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct ExportedTable {
    /// The exported symbol (`ferrocx_device_adaptor_v1`).
    pub symbol: RStr<'static>,
    /// The table's header, at the same address as the symbol.
    pub header: &'static AbiHeader,
}

/// Scalar types whose layout the root-module check covers along with the header.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct AbiScalars {
    /// Status code type.
    pub status: Status,
    /// Data type type.
    pub dtype: DataType,
    /// Reduction op type.
    pub op: ReduceOp,
    /// Address type.
    pub ptr: DevicePtr,
    /// Capability bits type.
    pub caps: Capabilities,
}

/// The root module of a Rust plugin.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(default))]
pub struct PluginModule {
    /// ABI major the plugin was built against.
    pub abi_major: u16,
    /// ABI minor the plugin was built against.
    pub abi_minor: u16,
    /// The plugin's name (the `<name>` of `libferrocx_adaptor_<name>.so`).
    #[sabi(last_prefix_field)]
    pub name: RStr<'static>,
    /// The tables the plugin exports, each also reachable by its symbol.
    pub tables: RSlice<'static, ExportedTable>,
    /// Never read; present so the layout check covers the scalar types.
    pub scalars: AbiScalars,
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "ferrocx_adaptor";
    const NAME: &'static str = "ferrocx plugin";
    const VERSION_STRINGS: VersionStrings = abi_stable::package_version_strings!();
}

impl AbiScalars {
    /// The value every plugin stores (its content is never read).
    pub const ZERO: AbiScalars = AbiScalars {
        status: Status::SUCCESS,
        dtype: DataType::F32,
        op: ReduceOp::SUM,
        ptr: DevicePtr::NULL,
        caps: Capabilities(0),
    };
}

impl Default for AbiScalars {
    fn default() -> Self {
        AbiScalars::ZERO
    }
}
