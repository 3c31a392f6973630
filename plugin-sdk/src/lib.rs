//! The ferrocx plugin SDK: implement safe traits, export C-ABI tables.
//!
//! An adaptor implements [`DeviceAdaptor`] and/or [`CclAdaptor`], plus one trait per optional
//! group it supports ([`DeviceVmm`], [`DeviceFlatMap`], [`DeviceMulticast`], [`DeviceGraph`],
//! [`DeviceKernel`], [`DeviceMemOps`], [`CclWindow`]);
//! a group it does not support is simply a trait it does not implement. [`export_plugin!`] then
//! generates the `#[repr(C)]` tables, the exported symbols the loader probes, and the
//! `abi_stable` root module the loader layout-checks before any call. Every entry goes through a
//! trampoline that catches panics (returning `INTERNAL_ERROR` with the panic message in
//! `get_last_error`), checks out-pointers for null, and turns [`Error`] into a status code.
//!
//! ```ignore
//! use ferrocx_plugin_sdk::prelude::*;
//!
//! #[derive(Default)]
//! pub struct MyDevice { /* … */ }
//!
//! impl DeviceAdaptor for MyDevice {
//!     fn instance() -> &'static Self { singleton!(MyDevice) }
//!     fn init(&self, _options: &Options) -> Result<()> { Ok(()) }
//!     // … every other method, returning Error::unsupported("…") where the device cannot …
//! }
//!
//! export_plugin! {
//!     name: "mydevice",
//!     device: MyDevice,
//! }
//! ```
//!
//! Build the crate as a `cdylib` named `ferrocx_adaptor_<name>` and `ferrocx info` lists it.
//! An adaptor that is also linked into a program as a built-in keeps the `export_plugin!` call
//! in a separate cdylib crate: exported symbols of the same name in two linked crates collide.

mod boundary;
mod ccl;
mod device;
mod error;
#[doc(hidden)]
pub mod flat;
pub mod handles;
mod options;
pub mod table;

pub use ccl::{ccl_table, window_table, CclAdaptor, CclWindow, CommInit, Limits, VCounts};
pub use device::{
    device_table, flatmap_table, graph_table, kernel_table, memops_table, multicast_table,
    vmm_table, DeviceAdaptor, DeviceFlatMap, DeviceGraph, DeviceKernel, DeviceMemOps,
    DeviceMulticast, DeviceVmm, HostCall, Launch, MemInfo, Properties, WaitCondition,
};
pub use error::{Error, Result};
pub use options::Options;

/// The ABI types, re-exported so a plugin needs no other dependency.
pub use ferrocx::abi;

#[doc(hidden)]
pub use abi_stable;

/// Everything a plugin usually needs.
pub mod prelude {
    pub use crate::abi::{
        Capabilities, Comm, DataType, DevicePtr, Event, FunctionHandle, GraphHandle, ImageFormat,
        McHandle, MemKind, ModuleHandle, ReduceOp, RegHandle, Status, Stream, VmmHandle,
        WindowHandle,
    };
    pub use crate::{
        export_plugin, singleton, CclAdaptor, CclWindow, CommInit, DeviceAdaptor, DeviceFlatMap,
        DeviceGraph, DeviceKernel, DeviceMemOps, DeviceMulticast, DeviceVmm, Error, HostCall,
        Launch, Limits, MemInfo, Options, Properties, Result, VCounts, WaitCondition,
    };
}

/// Expands to a `&'static T` for a process-wide instance built with `Default` on first use.
#[macro_export]
macro_rules! singleton {
    ($ty:ty) => {{
        static INSTANCE: ::std::sync::OnceLock<$ty> = ::std::sync::OnceLock::new();
        INSTANCE.get_or_init(<$ty as ::std::default::Default>::default)
    }};
}

/// Exports a plugin's tables under their ABI symbols, plus the `abi_stable` root module.
///
/// Keys, each optional but `name`, in this order:
/// `name: "<name>"`, `device: Type`, `device_absent: ["entry", …]` (entries exported as
/// `None`), `device_vmm: Type`, `device_flatmap: Type`, `device_multicast: Type`,
/// `device_graph: Type`, `device_kernel: Type`, `device_memops: Type`, `ccl: Type`,
/// `ccl_absent: [...]`, `ccl_window: Type`.
#[macro_export]
macro_rules! export_plugin {
    (
        name: $name:literal
        $(, device: $dev:ty)?
        $(, device_absent: [$($dabs:literal),* $(,)?])?
        $(, device_vmm: $vmm:ty)?
        $(, device_flatmap: $flat:ty)?
        $(, device_multicast: $mc:ty)?
        $(, device_graph: $graph:ty)?
        $(, device_kernel: $kern:ty)?
        $(, device_memops: $memops:ty)?
        $(, ccl: $ccl:ty)?
        $(, ccl_absent: [$($cabs:literal),* $(,)?])?
        $(, ccl_window: $win:ty)?
        $(,)?
    ) => {
        #[doc(hidden)]
        pub const __FERROCX_PLUGIN_NAME: &'static ::std::ffi::CStr =
            $crate::table::cstr(concat!($name, "\0"));
        #[doc(hidden)]
        const __FERROCX_DEVICE_ABSENT: &[&str] = &[$($($dabs),*)?];
        #[doc(hidden)]
        const __FERROCX_CCL_ABSENT: &[&str] = &[$($($cabs),*)?];

        $(
            /// The device adaptor table of this plugin.
            #[allow(non_upper_case_globals)]
            #[no_mangle]
            pub static ferrocx_device_adaptor_v1: $crate::abi::DeviceAdaptorV1 =
                $crate::device_table::<$dev>(__FERROCX_PLUGIN_NAME, __FERROCX_DEVICE_ABSENT);
        )?
        $(
            /// The VMM group table of this plugin.
            #[allow(non_upper_case_globals)]
            #[no_mangle]
            pub static ferrocx_device_vmm_v1: $crate::abi::DeviceVmmV1 =
                $crate::vmm_table::<$vmm>(__FERROCX_PLUGIN_NAME);
        )?
        $(
            /// The flat-map group table of this plugin.
            #[allow(non_upper_case_globals)]
            #[no_mangle]
            pub static ferrocx_device_flatmap_v1: $crate::abi::DeviceFlatMapV1 =
                $crate::flatmap_table::<$flat>(__FERROCX_PLUGIN_NAME);
        )?
        $(
            /// The multicast group table of this plugin.
            #[allow(non_upper_case_globals)]
            #[no_mangle]
            pub static ferrocx_device_multicast_v1: $crate::abi::DeviceMulticastV1 =
                $crate::multicast_table::<$mc>(__FERROCX_PLUGIN_NAME);
        )?
        $(
            /// The graph group table of this plugin.
            #[allow(non_upper_case_globals)]
            #[no_mangle]
            pub static ferrocx_device_graph_v1: $crate::abi::DeviceGraphV1 =
                $crate::graph_table::<$graph>(__FERROCX_PLUGIN_NAME);
        )?
        $(
            /// The kernel group table of this plugin.
            #[allow(non_upper_case_globals)]
            #[no_mangle]
            pub static ferrocx_device_kernel_v1: $crate::abi::DeviceKernelV1 =
                $crate::kernel_table::<$kern>(__FERROCX_PLUGIN_NAME);
        )?
        $(
            /// The memops group table of this plugin.
            #[allow(non_upper_case_globals)]
            #[no_mangle]
            pub static ferrocx_device_memops_v1: $crate::abi::DeviceMemOpsV1 =
                $crate::memops_table::<$memops>(__FERROCX_PLUGIN_NAME);
        )?
        $(
            /// The CCL adaptor table of this plugin.
            #[allow(non_upper_case_globals)]
            #[no_mangle]
            pub static ferrocx_ccl_adaptor_v1: $crate::abi::CclAdaptorV1 =
                $crate::ccl_table::<$ccl>(__FERROCX_PLUGIN_NAME, __FERROCX_CCL_ABSENT);
        )?
        $(
            /// The window group table of this plugin.
            #[allow(non_upper_case_globals)]
            #[no_mangle]
            pub static ferrocx_ccl_window_v1: $crate::abi::CclWindowV1 =
                $crate::window_table::<$win>(__FERROCX_PLUGIN_NAME);
        )?

        #[doc(hidden)]
        static __FERROCX_TABLES: &[$crate::abi::ExportedTable] = &[
            $($crate::__exported!(ferrocx_device_adaptor_v1, $dev),)?
            $($crate::__exported!(ferrocx_device_vmm_v1, $vmm),)?
            $($crate::__exported!(ferrocx_device_flatmap_v1, $flat),)?
            $($crate::__exported!(ferrocx_device_multicast_v1, $mc),)?
            $($crate::__exported!(ferrocx_device_graph_v1, $graph),)?
            $($crate::__exported!(ferrocx_device_kernel_v1, $kern),)?
            $($crate::__exported!(ferrocx_device_memops_v1, $memops),)?
            $($crate::__exported!(ferrocx_ccl_adaptor_v1, $ccl),)?
            $($crate::__exported!(ferrocx_ccl_window_v1, $win),)?
        ];

        #[doc(hidden)]
        fn __ferrocx_root_module() -> $crate::abi::PluginModuleRef {
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::abi::PluginModule {
                abi_major: $crate::abi::ABI_MAJOR,
                abi_minor: $crate::abi::ABI_MINOR,
                name: $crate::abi_stable::std_types::RStr::from_str($name),
                tables: $crate::abi_stable::std_types::RSlice::from_slice(__FERROCX_TABLES),
                scalars: $crate::abi::AbiScalars::ZERO,
            }
            .leak_into_prefix()
        }

        /// The `abi_stable` library header (what `#[export_root_module]` generates).
        #[allow(non_upper_case_globals)]
        #[no_mangle]
        pub static _1as_0lib_1header_0root_bmodule_bloader: $crate::abi_stable::library::LibHeader = {
            extern "C" fn erased() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(__ferrocx_root_module)
            }
            // SAFETY: `erased` returns the root module of type `PluginModuleRef`, as declared.
            unsafe {
                $crate::abi_stable::library::LibHeader::from_constructor::<$crate::abi::PluginModuleRef>(
                    erased,
                    $crate::abi_stable::library::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __exported {
    ($sym:ident, $ty:ty) => {
        $crate::abi::ExportedTable {
            symbol: $crate::abi_stable::std_types::RStr::from_str(stringify!($sym)),
            header: &$sym.header,
        }
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_module_loader_name_matches_abi_stable() {
        // export_plugin! spells the symbol out; it must be the one abi_stable looks up.
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }
}
