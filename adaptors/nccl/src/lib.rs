//! The NCCL CCL adaptor: every collective of the ABI over libnccl, opened with `dlopen` at
//! `init` so that one build runs on machines with and without NCCL.
//!
//! - Library: the `library` option, else `FERROCX_NCCL_LIBRARY`, else `libnccl.so.2`, then
//!   `libnccl.so`. A library named explicitly is the only one tried. When none loads, `init`
//!   fails with every path tried and why, and `ferrocx info` shows the CCL as unavailable.
//! - Safety on shared hosts: `init` sets `NCCL_NVLS_ENABLE=0` when the environment does not set
//!   it, before libnccl is loaded, so NCCL never creates NVLink SHARP multicast objects.
//! - Probing: required symbols are resolved at `init`; `ncclMemAlloc`/`ncclMemFree` and
//!   `ncclCommRegister`/`ncclCommDeregister` (NCCL >= 2.19), `ncclCommWindowRegister`/
//!   `…Deregister` (>= 2.27) and `ncclCommInitRankConfig` (>= 2.14) are optional. Every entry
//!   is exported; one whose symbol the loaded libnccl lacks fails with `UNSUPPORTED`, naming the
//!   symbol and the release that has it ("libnccl 2.26.5 lacks ncclCommWindowRegister (needs
//!   2.27)") before it looks at its arguments, so a call with the null communicator probes it
//!   (`ferrocx info` does). What was found is logged at DEBUG.
//! - Windows: the window group (`ferrocx_ccl_window_v1`) is `ncclCommWindowRegister` /
//!   `ncclCommWindowDeregister`; the flags pass through as NCCL's (1 = `NCCL_WIN_COLL_SYMMETRIC`,
//!   ferrocx's `WindowFlags::COLL_SYMMETRIC`). NCCL wants window buffers from `ncclMemAlloc` (the
//!   `mem_alloc` entry) or CUDA VMM allocations; where it registers nothing, `UNSUPPORTED`.
//! - Pairing: buffers are CUDA device addresses (`CUdeviceptr`) and a [`ferrocx::abi::Stream`]
//!   is the `CUstream` of the `cuda` device adaptor. NCCL uses the calling thread's current
//!   device: the core sets it (device adaptor's `set_device`) before `comm_init_rank`.
//! - Watchdog (option `watchdog = "on" | "off"`, on by default; `FERROCX_NCCL_WATCHDOG=0` turns
//!   it off whatever the file says): a hung peer surfaces as an error within the communicator's
//!   `timeout_ms` (0: the core's default, 30 s), not as a hang. After each operation (or at the
//!   end of a group) a pooled `CU_EVENT_DISABLE_TIMING` event is recorded on its stream (not
//!   while the stream is captured into a CUDA graph); one thread per process polls the oldest
//!   outstanding event of each communicator every few milliseconds, and NCCL's asynchronous
//!   error. An operation's clock starts when it becomes the oldest outstanding one, so
//!   operations queued behind long ones get their full timeout (device work queued on the same
//!   stream before a collective counts towards it). When the oldest made no progress for the
//!   timeout, or NCCL reports an error, the communicator is aborted (`ncclCommAbort`: NCCL's
//!   kernels exit, so a stream synchronize returns) and marked broken: every later call on it
//!   fails with the error ("rank 1 of 2: all_reduce (op #7) made no progress for 30.0 s
//!   (timeout 30000 ms): communicator aborted; a peer failed or never joined"),
//!   `comm_get_async_error` reports its status (`TIMEOUT`, or NCCL's, e.g. `PEER_FAILURE`), and
//!   `comm_destroy`/`comm_abort` only release the handle. The events go through the CUDA
//!   adaptor's driver ([`ferrocx_adaptor_cuda::shared`], the one libcuda loader, loaded with
//!   `dlopen`: nothing links CUDA); without a driver, or with one older than CUDA 12.8 (that
//!   loader's minimum), the watchdog is off with a warning. Cost per
//!   enqueued operation on the calling thread: one `cuStreamIsCapturing`, one `cuEventRecord`
//!   under a lock that only the watchdog's poll shares (which, on one stream, queries only the
//!   newest event: operations on a stream complete in order). `comm_init_rank` is bounded
//!   too: `ncclCommInitRank` runs on a thread of its own, and when it has not returned within
//!   the timeout (a peer failed or never joined) the call fails with `TIMEOUT` naming the rank,
//!   and the communicator is aborted if NCCL ever hands it back. Not watched: operations
//!   replayed from a CUDA graph, and a `comm_destroy` with operations still pending
//!   (synchronize first). With the watchdog on, NCCL connects peers at init
//!   (`NCCL_RUNTIME_CONNECT=0` unless set), so a failed peer hangs kernels, which are aborted
//!   with no call inside NCCL. A call that stays inside NCCL for longer than the timeout (e.g.
//!   a window registration waiting for a peer) is aborted under it, the only way to release
//!   it; NCCL may then free what that call still uses, so this last resort can crash the
//!   process rather than hang it. A call blocked inside NCCL when an abort for another reason
//!   starts gets 2 s to leave first.
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
mod comm;
pub mod conv;
pub mod library;
mod monitor;
pub mod sys;
mod watchdog;

pub use ccl::NcclCcl;
pub use library::{DEFAULT_LIBRARIES, LIBRARY_ENV};
pub use watchdog::{WATCHDOG_ENV, WATCHDOG_OPTION};

use ferrocx::abi::{CclAdaptorV1, CclWindowV1};
use ferrocx::registry::BuiltinAdaptor;

const NAME: &std::ffi::CStr = c"nccl";

// Every entry is exported: those backed by optional NCCL symbols answer UNSUPPORTED at run time
// when the loaded libnccl lacks them (the tables are fixed before `init` chooses the libnccl).
static CCL: CclAdaptorV1 = ferrocx_plugin_sdk::ccl_table::<NcclCcl>(NAME, &[]);
static WINDOW: CclWindowV1 = ferrocx_plugin_sdk::window_table::<NcclCcl>(NAME);

ferrocx::register_builtin!(BuiltinAdaptor {
    name: "nccl",
    priority: 50,
    ccl: Some(&CCL),
    window: Some(&WINDOW),
    ..BuiltinAdaptor::EMPTY
});

/// Makes sure this crate is linked (and its built-in registration kept) by a program that
/// otherwise names nothing from it.
pub fn link() {}
