//! The CUDA backend: a device adaptor over the CUDA driver API, loaded at run time.
//!
//! The driver (`libcuda.so.1`) is opened with `dlopen` through `cudarc`'s raw bindings on the
//! first `init`, so this crate builds, links and runs on a machine without CUDA: there `init`
//! fails with "libcuda.so.1 not found: …" and `ferrocx info` lists the device as unavailable.
//! See [`CudaDevice`] for what each entry does. The root device table, the graph group (stream
//! capture into CUDA graphs), the kernel group (modules from CUBIN/PTX images launched on
//! streams), the VMM and flat-map groups ([`vmm`], [`flatmap`]) and the
//! multicast group ([`multicast`]) are exported. Whether a device supports VMM and multicast is
//! probed at run time (device attributes, driver symbols through `cuGetProcAddress`); where it
//! does not, the entries return `UNSUPPORTED` with the reason. Multicast is refused before any
//! driver call while `NCCL_NVLS_ENABLE=0` or `FERROCX_MULTICAST=0` is in the environment.
//!
//! This crate is the only one that opens libcuda: the adaptors that pair with CUDA devices (the
//! NCCL adaptor's watchdog) reach the driver through [`shared::Driver`], the same load.
//!
//! Linked into a program it is a built-in adaptor (registered with `ferrocx::register_builtin!`);
//! `adaptors/cuda/plugin` builds the same code as `libferrocx_adaptor_cuda.so`.
//!
//! ```
//! use ferrocx_adaptor_cuda::CudaDevice;
//! use ferrocx_plugin_sdk::{DeviceAdaptor, Options};
//!
//! let dev = CudaDevice::instance();
//! match dev.init(&Options::default()) {
//!     Ok(()) => println!("{} CUDA device(s)", dev.device_count().unwrap()),
//!     Err(e) => println!("no CUDA here: {e}"),
//! }
//! ```

mod device;
mod driver;
pub mod flatmap;
mod graph;
mod kernel;
mod memops;
pub mod multicast;
pub mod shared;
pub mod vmm;

pub use device::{CudaDevice, IPC_HANDLE_BYTES};
pub use driver::is_present;

use ferrocx::abi::{DeviceAdaptorV1, DeviceFlatMapV1, DeviceMulticastV1, DeviceVmmV1};
use ferrocx::registry::BuiltinAdaptor;

const NAME: &std::ffi::CStr = c"cuda";

static DEVICE: DeviceAdaptorV1 = ferrocx_plugin_sdk::device_table::<CudaDevice>(NAME, &[]);
// The optional groups are static: what a device or driver lacks is an `UNSUPPORTED` with the
// reason at run time (and the multicast entries are gated at every call).
static VMM: DeviceVmmV1 = ferrocx_plugin_sdk::vmm_table::<CudaDevice>(NAME);
static FLATMAP: DeviceFlatMapV1 = ferrocx_plugin_sdk::flatmap_table::<CudaDevice>(NAME);
static MULTICAST: DeviceMulticastV1 = ferrocx_plugin_sdk::multicast_table::<CudaDevice>(NAME);

ferrocx::register_builtin!(BuiltinAdaptor {
    name: "cuda",
    priority: 200,
    device: Some(&DEVICE),
    vmm: Some(&VMM),
    flatmap: Some(&FLATMAP),
    multicast: Some(&MULTICAST),
    graph: Some(&graph::GRAPH),
    kernel: Some(&kernel::KERNEL),
    memops: Some(&memops::MEMOPS),
    ..BuiltinAdaptor::EMPTY
});

/// Makes sure this crate is linked (and its built-in registration kept) by a program that
/// otherwise names nothing from it.
pub fn link() {}
