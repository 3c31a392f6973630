//! `libferrocx_adaptor_mpi.so`: the MPI CCL exported under the ABI's symbols, with the host
//! device its operations run on (a plugin's streams are its own: the CCL enqueues on the host
//! device compiled into the same library, so a cluster names this plugin as both its device and
//! its CCL: `device = "mpi"`, `ccl = "mpi"`).

ferrocx_plugin_sdk::export_plugin! {
    name: "mpi",
    device: host::HostDevice,
    device_vmm: host::HostDevice,
    device_flatmap: host::HostDevice,
    device_multicast: host::HostDevice,
    ccl: mpi::MpiCcl,
    ccl_absent: ["mem_alloc", "mem_free"],
}
