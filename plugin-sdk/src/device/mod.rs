//! Traits for the device adaptor and its optional groups, and the trampolines that build their
//! tables: one file per table.
//!
//! - [`root`](self): [`DeviceAdaptor`] (`ferrocx_device_adaptor_v1`) and the values it returns;
//! - `vmm`: [`DeviceVmm`]; `flatmap`: [`DeviceFlatMap`]; `multicast`: [`DeviceMulticast`];
//!   `graph`: [`DeviceGraph`]; `kernel`: [`DeviceKernel`] (ABI 1.2); `memops`: [`DeviceMemOps`]
//!   (ABI 1.3).

mod flatmap;
mod graph;
mod kernel;
mod memops;
mod multicast;
mod root;
mod vmm;

pub use flatmap::{flatmap_table, DeviceFlatMap};
pub use graph::{graph_table, DeviceGraph};
pub use kernel::{kernel_table, DeviceKernel, Launch};
pub use memops::{memops_table, DeviceMemOps, WaitCondition};
pub use multicast::{multicast_table, DeviceMulticast};
pub use root::{device_table, DeviceAdaptor, HostCall, MemInfo, Properties};
pub use vmm::{vmm_table, DeviceVmm};
