//! `libferrocx_adaptor_nccl.so`: the NCCL adaptor exported under the ABI's symbols.
//!
//! No window group yet (`ferrocx_ccl_window_v1` is not exported): windows fall back to the
//! sym-heap.

ferrocx_plugin_sdk::export_plugin! {
    name: "nccl",
    ccl: nccl::NcclCcl,
}
