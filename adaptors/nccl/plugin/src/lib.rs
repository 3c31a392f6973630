//! `libferrocx_adaptor_nccl.so`: the NCCL adaptor exported under the ABI's symbols, the window
//! group included (its entries answer `UNSUPPORTED` where libnccl is older than 2.27).

ferrocx_plugin_sdk::export_plugin! {
    name: "nccl",
    ccl: nccl::NcclCcl,
    ccl_window: nccl::NcclCcl,
}
