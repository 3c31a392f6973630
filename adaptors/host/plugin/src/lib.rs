//! `libferrocx_adaptor_host.so`: the host adaptor exported under the ABI's symbols.

ferrocx_plugin_sdk::export_plugin! {
    name: "host",
    device: host::HostDevice,
    device_vmm: host::HostDevice,
    device_flatmap: host::HostDevice,
    device_multicast: host::HostDevice,
    device_memops: host::HostDevice,
    ccl: host::HostCcl,
    ccl_absent: [mem_alloc, mem_free],
}
