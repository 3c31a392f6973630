//! The NCCL CCL adaptor: every collective of the ABI over libnccl, opened with `dlopen` at
//! `init` so that one build runs on machines with and without NCCL.
//!
//! - Library: the `library` option, else `FERROCX_NCCL_LIBRARY`, else `libnccl.so.2`, then
//!   `libnccl.so`. A library named explicitly is the only one tried. When none loads, `init`
//!   fails with every path tried and why, and `ferrocx info` shows the CCL as unavailable.
//! - Safety on shared hosts: `init` sets `NCCL_NVLS_ENABLE=0` when the environment does not set
//!   it, before libnccl is loaded, so NCCL never creates NVLink SHARP multicast objects.
//! - Probing: required symbols are resolved at `init`; `ncclMemAlloc`/`ncclMemFree`,
//!   `ncclCommRegister`/`ncclCommDeregister`, `ncclCommWindowRegister`/`…Deregister` and
//!   `ncclCommInitRankConfig` are optional. A missing one makes its entry fail with
//!   `UNSUPPORTED` ("libnccl X.Y.Z has no ncclMemAlloc"). What was found is logged at DEBUG.
//! - Pairing: buffers are CUDA device addresses (`CUdeviceptr`) and a [`ferrocx::abi::Stream`]
//!   is the `cudaStream_t` of the `cuda` device adaptor. NCCL uses the calling thread's current
//!   device: the core sets it (device adaptor's `set_device`) before `comm_init_rank`.
//! - Not yet: the window group (`ferrocx_ccl_window_v1` is not exported, windows fall back to
//!   the sym-heap), and a watchdog enforcing `timeout_ms` (the core polls
//!   `comm_get_async_error` and aborts a communicator whose peer hangs).
//!
//! Linked into a program it is a built-in adaptor; `adaptors/nccl/plugin` builds the same code
//! as `libferrocx_adaptor_nccl.so`.
//!
//! ```
//! use ferrocx_adaptor_nccl::NcclCcl;
//! use ferrocx_plugin_sdk::prelude::*;
//!
//! let ccl = NcclCcl::instance();
//! let options = Options::new(vec![("library".into(), "/nonexistent/libnccl.so.2".into())]);
//! let err = ccl.init(&options).expect_err("no such library");
//! assert!(err.message().contains("/nonexistent/libnccl.so.2"));
//! assert_eq!(ccl.version().expect_err("not initialised").status(), Status::NOT_INITIALIZED);
//! ```

mod ccl;
mod conv;
mod library;
mod sys;

pub use ccl::NcclCcl;
pub use library::{DEFAULT_LIBRARIES, LIBRARY_ENV};

use ferrocx::abi::CclAdaptorV1;
use ferrocx::registry::BuiltinAdaptor;

const NAME: &std::ffi::CStr = c"nccl";

// Every entry is exported: those backed by optional NCCL symbols answer UNSUPPORTED at run time
// when the loaded libnccl lacks them.
static CCL: CclAdaptorV1 = ferrocx_plugin_sdk::ccl_table::<NcclCcl>(NAME, &[]);

ferrocx::register_builtin!(BuiltinAdaptor {
    name: "nccl",
    priority: 50,
    ccl: Some(&CCL),
    ..BuiltinAdaptor::EMPTY
});

/// Makes sure this crate is linked (and its built-in registration kept) by a program that
/// otherwise names nothing from it.
pub fn link() {}
