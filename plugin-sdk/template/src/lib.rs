//! The ferrocx adaptor plugin for myvendor.
//!
//! [`VendorDevice`] (the device adaptor: memory, streams, events) and [`VendorCcl`] (the
//! collective library: communicators, collectives, point-to-point) implement every required
//! method of the SDK's traits. Each one still returns `UNSUPPORTED` with a message that names
//! the vendor call to make (`grep -rn 'TODO(vendor' src/` lists them), and each is exported as
//! absent (the lists in `export_plugin!` below) until it is implemented: the adaptor claims
//! nothing yet, and the conformance kit (`cargo test`) says so. README.md says what to
//! implement first and how to add the optional groups.

mod ccl;
mod device;

pub use ccl::VendorCcl;
pub use device::VendorDevice;

// The exported tables. A method named in an absent list is exported as a NULL entry: "not
// supported", so nothing calls it. Remove a method's name once it is implemented (the names are
// the traits' method names, checked when this compiles). An optional group is one more key,
// e.g. `device_vmm: VendorDevice` once `VendorDevice` implements `DeviceVmm` (README.md lists
// every key).
ferrocx_plugin_sdk::export_plugin! {
    name: "myvendor",
    device: VendorDevice,
    device_absent: [
        // The device itself.
        init, finalize, device_count, set_device, get_device, properties, mem_get_info,
        // Memory.
        mem_alloc, mem_free, mem_copy, mem_set,
        // Streams and events.
        stream_create, stream_wrap, stream_destroy, stream_synchronize, stream_query,
        stream_wait_event, event_create, event_destroy, event_record, event_synchronize,
        event_query, event_elapsed_ms, mem_copy_async, mem_set_async, launch_host_func,
        // IPC.
        ipc_export, ipc_import, ipc_close,
    ],
    ccl: VendorCcl,
    ccl_absent: [
        init, finalize, version, unique_id, comm_init_rank, comm_finalize, comm_destroy,
        comm_abort, comm_async_error, comm_count, comm_user_rank, comm_device,
        all_reduce, all_gather, reduce_scatter, broadcast, reduce, gather, scatter, all_to_all,
        all_to_allv, send, recv, group_start, group_end,
        mem_alloc, mem_free, mem_register, mem_deregister, query_support,
    ],
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    #[test]
    fn the_library_is_named_for_the_adaptor() {
        // SAFETY: the header's name is a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(super::ferrocx_device_adaptor_v1.header.name.0) };
        assert_eq!(
            env!("CARGO_CRATE_NAME").strip_prefix("ferrocx_adaptor_"),
            name.to_str().ok(),
            "the name in export_plugin! and the package name in Cargo.toml must agree: the \
             loader finds libferrocx_adaptor_<name>.so by the adaptor's name"
        );
    }
}
