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
/// `name: "<name>"`, `device: Type`, `device_absent: [method, …]` (entries exported as
/// `None`), `device_vmm: Type`, `device_flatmap: Type`, `device_multicast: Type`,
/// `device_graph: Type`, `device_kernel: Type`, `device_memops: Type`, `ccl: Type`,
/// `ccl_absent: [method, …]`, `ccl_window: Type`.
///
/// The absent lists name the trait's methods (`device_absent: [properties, stream_wrap]`), or
/// the ABI's entry names (`get_properties`), bare or quoted (`"stream_wrap"`, the form of
/// earlier SDKs). Each name is checked at compile time: one that is neither a method of the
/// trait nor an entry of its table fails the build with a message naming it.
///
/// ```compile_fail
/// # use ferrocx_plugin_sdk::prelude::*;
/// # #[derive(Default)] pub struct D;
/// # impl DeviceAdaptor for D {
/// #   fn instance() -> &'static Self { singleton!(D) }
/// #   fn init(&self, _: &Options) -> Result<()> { Ok(()) }
/// #   fn finalize(&self) -> Result<()> { Ok(()) }
/// #   fn device_count(&self) -> Result<i32> { Ok(1) }
/// #   fn set_device(&self, _: i32) -> Result<()> { Ok(()) }
/// #   fn get_device(&self) -> Result<i32> { Ok(0) }
/// #   fn properties(&self, _: i32) -> Result<Properties> { todo!() }
/// #   fn mem_alloc(&self, _: usize, _: MemKind) -> Result<DevicePtr> { todo!() }
/// #   fn mem_free(&self, _: DevicePtr, _: MemKind) -> Result<()> { todo!() }
/// #   fn mem_copy(&self, _: DevicePtr, _: DevicePtr, _: usize) -> Result<()> { todo!() }
/// #   fn mem_copy_async(&self, _: DevicePtr, _: DevicePtr, _: usize, _: Stream) -> Result<()> { todo!() }
/// #   fn mem_set(&self, _: DevicePtr, _: u8, _: usize) -> Result<()> { todo!() }
/// #   fn mem_set_async(&self, _: DevicePtr, _: u8, _: usize, _: Stream) -> Result<()> { todo!() }
/// #   fn stream_create(&self, _: u32) -> Result<Stream> { todo!() }
/// #   fn stream_wrap(&self, _: *mut std::ffi::c_void) -> Result<Stream> { todo!() }
/// #   fn stream_destroy(&self, _: Stream) -> Result<()> { todo!() }
/// #   fn stream_synchronize(&self, _: Stream) -> Result<()> { todo!() }
/// #   fn stream_query(&self, _: Stream) -> Result<bool> { todo!() }
/// #   fn stream_wait_event(&self, _: Stream, _: Event) -> Result<()> { todo!() }
/// #   fn event_create(&self, _: u32) -> Result<Event> { todo!() }
/// #   fn event_destroy(&self, _: Event) -> Result<()> { todo!() }
/// #   fn event_record(&self, _: Event, _: Stream) -> Result<()> { todo!() }
/// #   fn event_synchronize(&self, _: Event) -> Result<()> { todo!() }
/// #   fn event_query(&self, _: Event) -> Result<bool> { todo!() }
/// #   fn event_elapsed_ms(&self, _: Event, _: Event) -> Result<f32> { todo!() }
/// #   fn launch_host_func(&self, _: Stream, _: HostCall) -> Result<()> { todo!() }
/// #   fn ipc_export(&self, _: DevicePtr) -> Result<Vec<u8>> { todo!() }
/// #   fn ipc_import(&self, _: &[u8]) -> Result<DevicePtr> { todo!() }
/// #   fn ipc_close(&self, _: DevicePtr) -> Result<()> { todo!() }
/// #   fn mem_get_info(&self) -> Result<MemInfo> { todo!() }
/// # }
/// ferrocx_plugin_sdk::export_plugin! {
///     name: "typo",
///     device: D,
///     device_absent: [stream_wrapp], // error: `stream_wrapp` is neither a DeviceAdaptor method ...
/// }
/// ```
#[macro_export]
macro_rules! export_plugin {
    (
        name: $name:literal
        $(, device: $dev:ty)?
        $(, device_absent: [$($dabs:tt),* $(,)?])?
        $(, device_vmm: $vmm:ty)?
        $(, device_flatmap: $flat:ty)?
        $(, device_multicast: $mc:ty)?
        $(, device_graph: $graph:ty)?
        $(, device_kernel: $kern:ty)?
        $(, device_memops: $memops:ty)?
        $(, ccl: $ccl:ty)?
        $(, ccl_absent: [$($cabs:tt),* $(,)?])?
        $(, ccl_window: $win:ty)?
        $(,)?
    ) => {
        #[doc(hidden)]
        pub const __FERROCX_PLUGIN_NAME: &'static ::std::ffi::CStr =
            $crate::table::cstr(concat!($name, "\0"));
        #[doc(hidden)]
        const __FERROCX_DEVICE_ABSENT: &[&str] = &[$($($crate::__absent_name!($dabs)),*)?];
        #[doc(hidden)]
        const __FERROCX_CCL_ABSENT: &[&str] = &[$($($crate::__absent_name!($cabs)),*)?];
        $($(
            const _: () = $crate::table::must_be_known(
                $crate::__absent_name!($dabs),
                $crate::table::DEVICE_ENTRIES,
                $crate::table::DEVICE_ALIASES,
                concat!(
                    "device_absent: `", $crate::__absent_name!($dabs),
                    "` is neither a DeviceAdaptor method nor an entry of the device table"
                ),
            );
        )*)?
        $($(
            const _: () = $crate::table::must_be_known(
                $crate::__absent_name!($cabs),
                $crate::table::CCL_ENTRIES,
                $crate::table::CCL_ALIASES,
                concat!(
                    "ccl_absent: `", $crate::__absent_name!($cabs),
                    "` is neither a CclAdaptor method nor an entry of the CCL table"
                ),
            );
        )*)?

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
macro_rules! __absent_name {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:literal) => {
        $name
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
