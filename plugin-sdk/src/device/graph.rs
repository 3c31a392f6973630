//! The graph group (`ferrocx_device_graph_v1`): stream capture into executable graphs.

use ferrocx::abi::{AbiHeader, DeviceGraphV1, GraphHandle, Status, Stream};

use crate::boundary::{call, write_out};
use crate::error::{Error, Result};

use super::DeviceAdaptor;

/// The graph group (`ferrocx_device_graph_v1`): stream capture into executable graphs.
pub trait DeviceGraph: DeviceAdaptor {
    /// Starts recording the work this thread enqueues on `stream`.
    fn graph_begin_capture(&self, stream: Stream) -> Result<()>;
    /// Ends the capture of `stream` (also after a failed one, which it discards) and returns the
    /// executable graph of what was recorded.
    fn graph_end_capture(&self, stream: Stream) -> Result<GraphHandle>;
    /// Enqueues one run of `graph` on `stream`.
    fn graph_launch(&self, graph: GraphHandle, stream: Stream) -> Result<()>;
    /// Destroys a graph.
    fn graph_destroy(&self, graph: GraphHandle) -> Result<()>;
}

/// The trampolines of the group, generic over the adaptor.
mod tramp {
    use super::*;

    pub unsafe extern "C" fn graph_begin_capture<A: DeviceGraph>(s: Stream) -> Status {
        call("graph_begin_capture", || {
            A::instance().graph_begin_capture(s)
        })
    }
    pub unsafe extern "C" fn graph_end_capture<A: DeviceGraph>(
        s: Stream,
        out: *mut GraphHandle,
    ) -> Status {
        call("graph_end_capture", || {
            // The capture is ended even when `out` is null, so the stream is not left capturing.
            let g = A::instance().graph_end_capture(s)?;
            if out.is_null() {
                // The caller cannot own the graph: release it rather than leak it.
                let _ = A::instance().graph_destroy(g);
                return Err(Error::invalid_argument("`graph` is null"));
            }
            // SAFETY: checked non-null above; writable by the ABI's contract.
            unsafe { write_out(out, "graph", g) }
        })
    }
    pub unsafe extern "C" fn graph_launch<A: DeviceGraph>(g: GraphHandle, s: Stream) -> Status {
        call("graph_launch", || A::instance().graph_launch(g, s))
    }
    pub unsafe extern "C" fn graph_destroy<A: DeviceGraph>(g: GraphHandle) -> Status {
        call("graph_destroy", || A::instance().graph_destroy(g))
    }
}

/// Builds the graph group table of `A`.
pub const fn graph_table<A: DeviceGraph>(name: &'static std::ffi::CStr) -> DeviceGraphV1 {
    use tramp::*;
    DeviceGraphV1 {
        header: AbiHeader::new::<DeviceGraphV1>(name),
        graph_begin_capture: Some(graph_begin_capture::<A>),
        graph_end_capture: Some(graph_end_capture::<A>),
        graph_launch: Some(graph_launch::<A>),
        graph_destroy: Some(graph_destroy::<A>),
    }
}
