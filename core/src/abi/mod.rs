//! ABI v1: the `#[repr(C)]` tables between ferrocx and its adaptors.
//!
//! A plugin exports one table per symbol: the root tables [`DeviceAdaptorV1`]
//! (`ferrocx_device_adaptor_v1`) and [`CclAdaptorV1`] (`ferrocx_ccl_adaptor_v1`), and optional
//! groups, each its own symbol ([`DeviceVmmV1`], [`DeviceFlatMapV1`], [`DeviceMulticastV1`],
//! [`DeviceGraphV1`], [`DeviceKernelV1`], [`DeviceMemOpsV1`], [`CclWindowV1`]). Every table starts with an [`AbiHeader`]; every other field is an
//! `Option<unsafe extern "C" fn …>` where `None` means "not supported". A table of another
//! major is refused; fields past a table's `struct_size` are treated as absent.
//!
//! The C header `plugin-sdk/include/ferrocx_plugin.h` is generated from these types.

mod ccl;
mod device;
mod header;
mod root;
mod types;

pub use ccl::{CclAdaptorV1, CclLimits, CclWindowV1, CommInitArgs};
pub use device::{
    DeviceAdaptorV1, DeviceFlatMapV1, DeviceGraphV1, DeviceKernelV1, DeviceMemOpsV1,
    DeviceMulticastV1, DeviceProperties, DeviceVmmV1, KernelLaunch, WAIT_VALUE_EQ, WAIT_VALUE_GEQ,
};
pub use header::{AbiHeader, AbiTable, ABI_MAGIC, ABI_MAJOR, ABI_MINOR};
pub use root::{AbiScalars, ExportedTable, PluginModule, PluginModuleRef};
pub use types::{
    Capabilities, Comm, DataType, DevicePtr, Event, FunctionHandle, GraphHandle, HostFn,
    ImageFormat, KeyValue, McHandle, MemKind, ModuleHandle, ReduceOp, RegHandle, StaticCStr,
    Status, Stream, VmmHandle, WindowHandle,
};

/// Implements [`AbiTable`] for a table, listing its entries in field order.
macro_rules! abi_table {
    ($ty:ty, $symbol:literal, $kind:literal, [$($field:ident),* $(,)?]) => {
        // SAFETY: the type is #[repr(C)], starts with `header: AbiHeader`, and every listed field
        // is an Option of an extern "C" fn pointer; `entries_cover_the_whole_table` checks the
        // list is complete.
        unsafe impl AbiTable for $ty {
            const SYMBOL: &'static str = $symbol;
            const KIND: &'static str = $kind;
            const MAJOR: u16 = 1;
            fn entries() -> &'static [(&'static str, usize)] {
                const ENTRIES: &[(&str, usize)] =
                    &[$((stringify!($field), std::mem::offset_of!($ty, $field))),*];
                ENTRIES
            }
            fn header(&self) -> &AbiHeader {
                &self.header
            }
        }
    };
}

abi_table!(
    DeviceAdaptorV1,
    "ferrocx_device_adaptor_v1",
    "device adaptor",
    [
        init,
        finalize,
        get_last_error,
        device_count,
        set_device,
        get_device,
        get_properties,
        mem_alloc,
        mem_free,
        mem_copy,
        mem_copy_async,
        mem_set,
        mem_set_async,
        stream_create,
        stream_wrap,
        stream_destroy,
        stream_synchronize,
        stream_query,
        stream_wait_event,
        event_create,
        event_destroy,
        event_record,
        event_synchronize,
        event_query,
        event_elapsed_ms,
        launch_host_func,
        ipc_export,
        ipc_import,
        ipc_close,
        // ABI 1.1
        mem_get_info,
    ]
);
abi_table!(
    DeviceVmmV1,
    "ferrocx_device_vmm_v1",
    "VMM group",
    [
        vmm_granularity,
        vmm_alloc,
        vmm_export_fd,
        vmm_import_fd,
        vmm_release,
    ]
);
abi_table!(
    DeviceFlatMapV1,
    "ferrocx_device_flatmap_v1",
    "flat-map group",
    [flat_reserve, flat_map, flat_unmap, flat_release,]
);
abi_table!(
    DeviceMulticastV1,
    "ferrocx_device_multicast_v1",
    "multicast group",
    [
        mc_supported,
        mc_create,
        mc_export_fd,
        mc_import_fd,
        mc_add_device,
        mc_bind,
        mc_map,
        mc_unmap,
        mc_unbind,
        mc_release,
    ]
);
abi_table!(
    DeviceGraphV1,
    "ferrocx_device_graph_v1",
    "graph group",
    [
        graph_begin_capture,
        graph_end_capture,
        graph_launch,
        graph_destroy,
    ]
);
abi_table!(
    DeviceKernelV1,
    "ferrocx_device_kernel_v1",
    "kernel group",
    [
        kernel_image_formats,
        module_load,
        module_unload,
        module_get_function,
        launch_kernel,
    ]
);
abi_table!(
    DeviceMemOpsV1,
    "ferrocx_device_memops_v1",
    "memops group",
    [stream_write_value32, stream_wait_value32,]
);
abi_table!(
    CclAdaptorV1,
    "ferrocx_ccl_adaptor_v1",
    "CCL adaptor",
    [
        init,
        finalize,
        get_last_error,
        get_version,
        get_unique_id,
        comm_init_rank,
        comm_finalize,
        comm_destroy,
        comm_abort,
        comm_get_async_error,
        comm_count,
        comm_user_rank,
        comm_device,
        all_reduce,
        all_gather,
        reduce_scatter,
        broadcast,
        reduce,
        gather,
        scatter,
        all_to_all,
        all_to_allv,
        send,
        recv,
        group_start,
        group_end,
        mem_alloc,
        mem_free,
        mem_register,
        mem_deregister,
        // ABI 1.2
        query_support,
        // ABI 1.3
        get_limits,
    ]
);
abi_table!(
    CclWindowV1,
    "ferrocx_ccl_window_v1",
    "window group",
    [window_register, window_deregister,]
);

/// The prefix of every root symbol; the version follows (`_v1`).
pub const DEVICE_ROOT_PREFIX: &str = "ferrocx_device_adaptor_v";
/// The prefix of every CCL root symbol.
pub const CCL_ROOT_PREFIX: &str = "ferrocx_ccl_adaptor_v";

#[cfg(test)]
mod tests {
    use super::*;

    fn covers<T: AbiTable>() {
        let entries = T::entries();
        let header = std::mem::size_of::<AbiHeader>();
        let ptr = std::mem::size_of::<usize>();
        assert_eq!(
            header + entries.len() * ptr,
            std::mem::size_of::<T>(),
            "{}",
            T::SYMBOL
        );
        for (i, (name, off)) in entries.iter().enumerate() {
            assert_eq!(*off, header + i * ptr, "{}.{name} out of order", T::SYMBOL);
        }
    }

    #[test]
    fn entries_cover_the_whole_table() {
        covers::<DeviceAdaptorV1>();
        covers::<DeviceVmmV1>();
        covers::<DeviceFlatMapV1>();
        covers::<DeviceMulticastV1>();
        covers::<DeviceGraphV1>();
        covers::<DeviceKernelV1>();
        covers::<DeviceMemOpsV1>();
        covers::<CclAdaptorV1>();
        covers::<CclWindowV1>();
    }

    #[test]
    fn ccl_limits_layout_is_frozen() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(CclLimits, max_ranks), 8);
        assert_eq!(offset_of!(CclLimits, dtypes), 16);
        assert_eq!(offset_of!(CclLimits, reduce_ops), 24);
        assert_eq!(size_of::<CclLimits>(), 32);
        let none = CclLimits::NONE;
        assert!(none.is_none() && none.allows_ranks(1 << 20));
        assert!(DataType::ALL.iter().all(|&d| none.allows_dtype(d)));
        let some = CclLimits {
            max_ranks: 1,
            dtypes: 1 << DataType::F32.0,
            reduce_ops: 1 << ReduceOp::SUM.0,
            ..CclLimits::NONE
        };
        assert!(some.allows_ranks(1) && !some.allows_ranks(2));
        assert!(some.allows_dtype(DataType::F32) && !some.allows_dtype(DataType::F64));
        assert!(some.allows_op(ReduceOp::SUM) && !some.allows_op(ReduceOp::MAX));
        assert!(!some.allows_dtype(DataType(99)));
    }

    #[test]
    fn header_layout_is_frozen() {
        assert_eq!(std::mem::size_of::<AbiHeader>(), 24);
        assert_eq!(std::mem::offset_of!(AbiHeader, struct_size), 8);
        assert_eq!(std::mem::offset_of!(AbiHeader, name), 16);
        assert_eq!(&ABI_MAGIC.to_le_bytes(), b"FRCX");
    }

    #[test]
    fn kernel_launch_layout_is_frozen() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(KernelLaunch, grid), 8);
        assert_eq!(offset_of!(KernelLaunch, block), 20);
        assert_eq!(offset_of!(KernelLaunch, shared_mem_bytes), 32);
        assert_eq!(offset_of!(KernelLaunch, args), 40);
        assert_eq!(size_of::<KernelLaunch>(), 56);
        assert_eq!(format!("{:?}", ImageFormat::CUBIN), "cubin");
        assert_eq!(format!("{:?}", ImageFormat(0x1002)), "vendor(0x1002)");
        assert_eq!(format!("{:?}", ImageFormat(7)), "ImageFormat(7)");
    }

    #[test]
    fn every_dtype_has_a_size_and_name() {
        for d in DataType::ALL {
            assert!(d.size().is_some() && d.name().is_some(), "{d:?}");
        }
        assert_eq!(DataType(99).size(), None);
        assert_eq!(format!("{:?}", Status(42)), "Status(42)");
    }
}
