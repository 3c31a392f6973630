//! The graph group of the CUDA adaptor (`ferrocx_device_graph_v1`): stream capture into CUDA
//! graphs, launched again as one unit.
//!
//! - `graph_begin_capture` is `cuStreamBeginCapture` in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`:
//!   a call that is unsafe during a capture (`cuMemAlloc`, a synchronous copy, a stream
//!   synchronisation) fails when the *capturing* thread makes it, so a capture never silently
//!   records the wrong thing, while other threads of the process (NCCL's proxy threads, other
//!   communicators, a profiler) go on unaffected. `GLOBAL` would fail their legitimate calls
//!   too, and `RELAXED` would let the capturing thread's mistakes through. NCCL switches its
//!   thread to relaxed mode itself around the allocations it makes during a capture.
//! - `graph_end_capture` is `cuStreamEndCapture`, then `cuGraphInstantiateWithFlags` (no
//!   flags); the captured `CUgraph` is destroyed at once (the executable graph does not need it)
//!   and the handle is the `CUgraphExec`.
//! - `graph_launch` is `cuGraphLaunch`; `graph_destroy` is `cuGraphExecDestroy`.
//!
//! The legacy default stream (null) cannot be captured: it is refused with `INVALID_ARGUMENT`.

use cudarc::driver::sys::{CUgraph, CUgraphExec, CUstream, CUstreamCaptureMode};
use ferrocx_plugin_sdk::prelude::*;

use crate::driver::{self, check, Driver};
use crate::CudaDevice;

/// The driver, with the calling thread's device current (what the graph calls need).
fn ready(dev: &CudaDevice) -> Result<Driver> {
    // `set_device` of the thread's own device makes its primary context current (another
    // library may have changed it) and fails with NOT_INITIALIZED before a successful `init`.
    dev.set_device(dev.get_device()?)?;
    driver::load()
}

fn capturable(s: Stream) -> Result<CUstream> {
    if s.is_null() {
        return Err(Error::invalid_argument(
            "the default (null) stream cannot be captured: capture a stream from stream_create",
        ));
    }
    Ok(s.0.cast())
}

fn exec(g: GraphHandle) -> Result<CUgraphExec> {
    if g.is_null() {
        return Err(Error::invalid_handle("a null graph handle"));
    }
    Ok(g.0.cast())
}

impl DeviceGraph for CudaDevice {
    fn graph_begin_capture(&self, s: Stream) -> Result<()> {
        let lib = ready(self)?;
        let stream = capturable(s)?;
        // SAFETY: a stream of this adaptor (or a wrapped one) on the current context.
        let r = unsafe {
            (lib.cuStreamBeginCapture_v2)(
                stream,
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        };
        check(lib, "cuStreamBeginCapture", r)
    }

    fn graph_end_capture(&self, s: Stream) -> Result<GraphHandle> {
        let lib = ready(self)?;
        let stream = capturable(s)?;
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the driver ends the stream's capture whatever it returns.
        let r = unsafe { (lib.cuStreamEndCapture)(stream, &mut graph) };
        check(lib, "cuStreamEndCapture", r)?;
        if graph.is_null() {
            return Err(Error::vendor("cuStreamEndCapture returned no graph"));
        }
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and the graph just captured.
        let instantiated = unsafe { (lib.cuGraphInstantiateWithFlags)(&mut exec, graph, 0) };
        // SAFETY: the captured graph, ours, destroyed once; an executable graph instantiated
        // from it does not depend on it.
        let destroyed = unsafe { (lib.cuGraphDestroy)(graph) };
        check(lib, "cuGraphInstantiateWithFlags", instantiated)?;
        if let Err(e) = check(lib, "cuGraphDestroy", destroyed) {
            tracing::warn!("cuda: the captured graph was not released: {e}");
        }
        Ok(GraphHandle(exec.cast()))
    }

    fn graph_launch(&self, g: GraphHandle, s: Stream) -> Result<()> {
        let lib = ready(self)?;
        let graph = exec(g)?;
        // SAFETY: an executable graph of this adaptor and a stream of the same context (the
        // legacy default stream included: launching there is allowed).
        check(lib, "cuGraphLaunch", unsafe {
            (lib.cuGraphLaunch)(graph, s.0.cast())
        })
    }

    fn graph_destroy(&self, g: GraphHandle) -> Result<()> {
        let lib = ready(self)?;
        let graph = exec(g)?;
        // SAFETY: an executable graph of this adaptor, destroyed once by the ABI's contract;
        // launches already enqueued complete first (the driver's rule).
        check(lib, "cuGraphExecDestroy", unsafe {
            (lib.cuGraphExecDestroy)(graph)
        })
    }
}

/// The graph group table of the built-in adaptor.
pub(crate) static GRAPH: ferrocx::abi::DeviceGraphV1 =
    ferrocx_plugin_sdk::graph_table::<CudaDevice>(crate::NAME);
