//! An out-of-tree ferrocx adaptor: a device whose memory is host memory, built in its own
//! repository against the plugin SDK, as a vendor's adaptor is.
//!
//! It is the SDK template filled in: [`HostMemDevice`] implements every method of
//! [`DeviceAdaptor`], and `export_plugin!` exports its table as
//! `libferrocx_adaptor_outoftree.so`. Streams are trivially complete: every operation enqueued
//! on one runs before the call returns, which is stream order, so CUDA's ordering semantics hold
//! (see [`stream`]). IPC and stream wrapping are exported as absent (`device_absent`): the core
//! knows up front that they are not supported, without calling them.
//!
//! [`OneRankCcl`] is a minimal CCL paired with that device: communicators of one rank, whose
//! collectives are copies enqueued on the device's streams. It declares its limits (one rank,
//! some data types and reductions) in `CclAdaptor::LIMITS`, so the conformance kit reports the
//! rest as "not claimed", and exports point-to-point and registration as absent.
//!
//! ```sh
//! cargo build --release
//! FERROCX_PLUGIN_PATH=target/release ferrocx info
//! ferrocx conformance --plugin target/release/libferrocx_adaptor_outoftree.so
//! ```

mod ccl;
mod device;
mod memory;
pub mod stream;

pub use ccl::OneRankCcl;
pub use device::HostMemDevice;

ferrocx_plugin_sdk::export_plugin! {
    name: "outoftree",
    device: HostMemDevice,
    device_absent: [stream_wrap, ipc_export, ipc_import, ipc_close],
    ccl: OneRankCcl,
    ccl_absent: [send, recv, group_start, group_end, mem_alloc, mem_free, mem_register, mem_deregister],
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use ferrocx_plugin_sdk::abi::{DevicePtr, MemKind, Status, Stream};

    use super::ferrocx_device_adaptor_v1 as table;

    #[test]
    fn the_library_is_named_for_the_adaptor() {
        // SAFETY: the header's name is a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(table.header.name.0) };
        assert_eq!(
            env!("CARGO_CRATE_NAME").strip_prefix("ferrocx_adaptor_"),
            name.to_str().ok(),
            "the adaptor name in export_plugin! and the library name in Cargo.toml must agree"
        );
    }

    #[test]
    fn copies_through_the_table_land_in_stream_order() {
        let (alloc, copy_async, sync, free) = (
            table.mem_alloc.unwrap(),
            table.mem_copy_async.unwrap(),
            table.stream_synchronize.unwrap(),
            table.mem_free.unwrap(),
        );
        let src = [7u8; 64];
        let mut dst = [0u8; 64];
        let mut dev = DevicePtr::NULL;
        let s = Stream::NULL;
        // SAFETY: valid out-pointers and 64-byte ranges that outlive the synchronize, as the
        // ABI requires.
        unsafe {
            assert_eq!(alloc(64, MemKind::DEVICE, &mut dev), Status::SUCCESS);
            let host_src = DevicePtr(src.as_ptr() as u64);
            let host_dst = DevicePtr(dst.as_mut_ptr() as u64);
            assert_eq!(copy_async(dev, host_src, 64, s), Status::SUCCESS);
            assert_eq!(copy_async(host_dst, dev, 64, s), Status::SUCCESS);
            assert_eq!(sync(s), Status::SUCCESS);
            assert_eq!(free(dev, MemKind::DEVICE), Status::SUCCESS);
            assert_eq!(free(dev, MemKind::DEVICE), Status::INVALID_HANDLE);
        }
        assert_eq!(dst, src);
        assert!(table.ipc_export.is_none(), "exported as absent");
    }
}
