//! `libferrocx_adaptor_cuda.so`: the CUDA adaptor exported under the ABI's symbols.
//!
//! The root device table, the VMM, flat-map and multicast groups (multicast gated: see
//! `ferrocx_adaptor_cuda::multicast`), the graph group, the kernel group and the memops group are exported.

ferrocx_plugin_sdk::export_plugin! {
    name: "cuda",
    device: cuda::CudaDevice,
    device_vmm: cuda::CudaDevice,
    device_flatmap: cuda::CudaDevice,
    device_multicast: cuda::CudaDevice,
    device_graph: cuda::CudaDevice,
    device_kernel: cuda::CudaDevice,
    device_memops: cuda::CudaDevice,
}
