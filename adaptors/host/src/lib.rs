//! The host backend: a CPU "device" and a shared-memory CCL, usable on any Linux machine.
//!
//! - Device `host`: memory from POSIX shared memory (so other processes of the job can map it),
//!   streams as ordered queues run by worker threads, events with CUDA's semantics, host
//!   functions, IPC, VMM (named shared-memory segments), flat mapping, an emulated multicast
//!   (reached through [`multicast::store`] and [`multicast::load_reduce`]) and the memops group
//!   (32-bit stores and waits on host memory, run by the stream's worker).
//! - CCL `host`: a communicator over shared memory for N processes of one host, every
//!   collective of the ABI, point-to-point and groups, enqueued on the device's streams.
//!
//! Linked into a program it is a built-in adaptor (registered with `ferrocx::register_builtin!`);
//! `adaptors/host/plugin` builds the same code as `libferrocx_adaptor_host.so`.

mod ccl;
mod device;
mod event;
mod flatmap;
mod ipc;
mod memory;
pub mod multicast;
mod shm;
mod stream;
mod vmm;

pub use ccl::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, reads_in_place, HostCcl};
pub use device::HostDevice;

use ferrocx::abi::{
    CclAdaptorV1, DeviceAdaptorV1, DeviceFlatMapV1, DeviceMemOpsV1, DeviceMulticastV1, DeviceVmmV1,
};
use ferrocx::registry::BuiltinAdaptor;

const NAME: &std::ffi::CStr = c"host";

static DEVICE: DeviceAdaptorV1 = ferrocx_plugin_sdk::device_table::<HostDevice>(NAME, &[]);
static VMM: DeviceVmmV1 = ferrocx_plugin_sdk::vmm_table::<HostDevice>(NAME);
static FLATMAP: DeviceFlatMapV1 = ferrocx_plugin_sdk::flatmap_table::<HostDevice>(NAME);
static MULTICAST: DeviceMulticastV1 = ferrocx_plugin_sdk::multicast_table::<HostDevice>(NAME);
static MEMOPS: DeviceMemOpsV1 = ferrocx_plugin_sdk::memops_table::<HostDevice>(NAME);
// The host CCL has no memory of its own (the device's is already shared): those entries are absent.
static CCL: CclAdaptorV1 =
    ferrocx_plugin_sdk::ccl_table::<HostCcl>(NAME, &["mem_alloc", "mem_free"]);

ferrocx::register_builtin!(BuiltinAdaptor {
    name: "host",
    priority: 100,
    device: Some(&DEVICE),
    vmm: Some(&VMM),
    flatmap: Some(&FLATMAP),
    multicast: Some(&MULTICAST),
    memops: Some(&MEMOPS),
    ccl: Some(&CCL),
    ..BuiltinAdaptor::EMPTY
});

/// Enqueues `task` on the host device's stream `stream` (null: the default stream): it runs in
/// stream order on the stream's worker thread, and an error it returns stays on the stream until
/// `stream_synchronize` reports it. For CCL adaptors that pair with the host device (the MPI
/// CCL) and run their operations in the device's stream order.
pub fn enqueue_on_stream(
    stream: ferrocx::abi::Stream,
    task: Box<dyn FnOnce() -> ferrocx_plugin_sdk::Result<()> + Send>,
) -> ferrocx_plugin_sdk::Result<()> {
    stream::get(stream)?.enqueue(task)
}

/// Makes sure this crate is linked (and its built-in registration kept) by a program that
/// otherwise names nothing from it.
pub fn link() {}
