//! `libferrocx_adaptor_cuda.so`: the CUDA adaptor exported under the ABI's symbols.
//!
//! Only the root device table is exported: the VMM, flat-map and multicast groups are absent.

ferrocx_plugin_sdk::export_plugin! {
    name: "cuda",
    device: cuda::CudaDevice,
}
