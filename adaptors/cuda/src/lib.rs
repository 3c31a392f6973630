//! The CUDA backend: a device adaptor over the CUDA driver API, loaded at run time.
//!
//! The driver (`libcuda.so.1`) is opened with `dlopen` through `cudarc`'s raw bindings on the
//! first `init`, so this crate builds, links and runs on a machine without CUDA: there `init`
//! fails with "libcuda.so.1 not found: …" and `ferrocx info` lists the device as unavailable.
//! See [`CudaDevice`] for what each entry does. Only the root device table is exported: VMM,
//! flat mapping and multicast are absent (multicast objects are never created by this crate).
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

pub use device::{CudaDevice, IPC_HANDLE_BYTES};
pub use driver::is_present;

use ferrocx::abi::DeviceAdaptorV1;
use ferrocx::registry::BuiltinAdaptor;

const NAME: &std::ffi::CStr = c"cuda";

static DEVICE: DeviceAdaptorV1 = ferrocx_plugin_sdk::device_table::<CudaDevice>(NAME, &[]);

ferrocx::register_builtin!(BuiltinAdaptor {
    name: "cuda",
    priority: 200,
    device: Some(&DEVICE),
    ..BuiltinAdaptor::EMPTY
});

/// Makes sure this crate is linked (and its built-in registration kept) by a program that
/// otherwise names nothing from it.
pub fn link() {}
