//! `ferrocx._ferrocx`: the native module of the `ferrocx` Python package.
//!
//! [`PyCommunicator`] is a [`Communicator`] made from the environment (as
//! [`Communicator::from_env`]), with its rank, world and cluster, and every collective on raw
//! addresses (integers) and a stream (an integer handle of the communicator's device adaptor, or
//! `None` for the communicator's own). Collectives are enqueued, not waited for: a caller orders
//! them with events ([`PyCommunicator::record`], [`PyCommunicator::event_wait`]) as it would a
//! CUDA kernel. The interpreter's lock is released while ferrocx works.
//!
//! `info()` is what `ferrocx info` shows: the configuration's clusters with their adaptors, and
//! every adaptor this module knows (built-in or found on disk).
//!
//! Every failure is a `ferrocx.Error` (a `RuntimeError`) with ferrocx's message.

use std::ffi::c_void;

use ferrocx::abi::{DataType, DevicePtr, Event, ReduceOp, Stream};
use ferrocx::comm::{Call, CommError, Communicator};
use ferrocx::config::Config;
use ferrocx::registry::{Registry, Source};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

pyo3::create_exception!(
    _ferrocx,
    Error,
    pyo3::exceptions::PyRuntimeError,
    "A ferrocx call failed; the message is ferrocx's."
);

/// The message of `e` with its sources, as one line.
fn message(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        src = cause.source();
    }
    s
}

fn err(e: impl std::error::Error) -> PyErr {
    Error::new_err(message(&e))
}

fn dtype(code: u32) -> PyResult<DataType> {
    let d = DataType(code);
    match d.size() {
        Some(_) => Ok(d),
        None => Err(Error::new_err(format!("unknown ferrocx dtype code {code}"))),
    }
}

fn redop(code: u32) -> PyResult<ReduceOp> {
    if ReduceOp::ALL.contains(&ReduceOp(code)) {
        Ok(ReduceOp(code))
    } else {
        Err(Error::new_err(format!(
            "unknown ferrocx reduce op code {code}"
        )))
    }
}

fn ptr(addr: u64) -> DevicePtr {
    DevicePtr(addr)
}

/// A stream handle from Python: an adaptor stream as an integer.
fn stream_of(handle: u64) -> Stream {
    Stream(handle as usize as *mut c_void)
}

fn handle_of(stream: Stream) -> u64 {
    stream.0 as usize as u64
}

/// One rank's communicator over its cluster's CCL (see the module docs).
#[pyclass(name = "Communicator", module = "ferrocx._ferrocx", frozen)]
pub struct PyCommunicator {
    comm: Communicator,
    /// Events of [`PyCommunicator::order`], oldest record first; one is taken again once its
    /// record has completed (so no wait can see a later record than its own).
    events: std::sync::Mutex<std::collections::VecDeque<Event>>,
}

impl Drop for PyCommunicator {
    fn drop(&mut self) {
        let events = self.events.get_mut().unwrap_or_else(|p| p.into_inner());
        for e in events.drain(..) {
            // Teardown: the streams they were recorded on are the caller's (CUDA keeps an
            // event's pending record valid after its destruction).
            let _ = self.comm.device().event_destroy(e);
        }
    }
}

impl PyCommunicator {
    fn call(&self, stream: Option<u64>) -> Call<'_> {
        match stream {
            Some(s) => self.comm.on(stream_of(s)),
            None => self.comm.call(),
        }
    }

    /// Runs `f` with the interpreter's lock released, mapping its error.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Communicator) -> Result<R, CommError> + Send,
    ) -> PyResult<R> {
        py.detach(|| f(&self.comm)).map_err(err)
    }
}

/// The collectives all take addresses in this communicator's device's address space (host
/// memory for the host device, device or pinned memory for CUDA) that stay valid, unread and
/// unwritten by anything else until the call has completed on its stream.
#[pymethods]
impl PyCommunicator {
    /// The communicator of this process, from the environment: the configuration
    /// (`FERROCX_CONFIG`, else the local one), the rank and world (`RANK`/`WORLD_SIZE`, ...) and
    /// the job's store (`MASTER_ADDR`/`MASTER_PORT`). Collective: every rank calls it.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Self> {
        let comm = py.detach(Communicator::from_env).map_err(err)?;
        Ok(PyCommunicator {
            comm,
            events: Default::default(),
        })
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    #[getter]
    fn world(&self) -> usize {
        self.comm.world()
    }

    /// The name of this rank's cluster.
    #[getter]
    fn cluster(&self) -> String {
        self.comm.cluster().to_owned()
    }

    /// The device adaptor's name (`host`, `cuda`, ...).
    #[getter]
    fn device(&self) -> String {
        self.comm.device().name().to_owned()
    }

    /// The CCL adaptor's name.
    #[getter]
    fn ccl(&self) -> String {
        self.comm.ccl().name().to_owned()
    }

    /// The device this rank works on (an index of the device adaptor).
    #[getter]
    fn device_index(&self) -> PyResult<i32> {
        self.comm.device().get_device().map_err(err)
    }

    /// Whether the job spans clusters.
    #[getter]
    fn spans_clusters(&self) -> bool {
        self.comm.hetero().is_some()
    }

    /// The deadline of any wait on a peer, in milliseconds.
    #[getter]
    fn timeout_ms(&self) -> u64 {
        self.comm.timeout().as_millis() as u64
    }

    /// The communicator's own stream, as an integer handle.
    #[getter]
    fn stream(&self) -> u64 {
        handle_of(self.comm.stream())
    }

    /// Wraps a stream another library made (a `CUstream` from `torch.cuda.current_stream()`)
    /// as a stream of the device adaptor; returns its handle. The native stream must stay alive
    /// while calls use the handle.
    fn wrap_stream(&self, native: u64) -> PyResult<u64> {
        let native = native as usize as *mut c_void;
        // SAFETY: the caller passes a live stream of the device's runtime (the class docs:
        // torch's current CUDA stream), which outlives the calls made on the wrapper.
        let s = unsafe { self.comm.device().stream_wrap(native) }.map_err(err)?;
        Ok(handle_of(s))
    }

    /// Records a new event on `stream` (`None`: the communicator's); returns its handle, for
    /// [`event_wait`](Self::event_wait), `event_query` and `event_destroy`.
    #[pyo3(signature = (stream=None))]
    fn record(&self, py: Python<'_>, stream: Option<u64>) -> PyResult<u64> {
        let s = stream.map(stream_of).unwrap_or(self.comm.stream());
        py.detach(|| {
            let d = self.comm.device();
            let e = d.event_create(1)?;
            if let Err(x) = d.event_record(e, s) {
                let _ = d.event_destroy(e);
                return Err(x);
            }
            Ok(e.0 as usize as u64)
        })
        .map_err(err)
    }

    /// Orders the work enqueued on stream `to` from now on after the work enqueued on stream
    /// `from` so far (handles of this communicator's device, as from `wrap_stream`), with no
    /// host wait: an event recorded on `from` and waited for on `to` (CUDA's
    /// `cudaStreamWaitEvent`), from a pool of the communicator's. What torch's
    /// `Stream.wait_stream` does, without a Python event or stream object.
    fn order(&self, py: Python<'_>, from: u64, to: u64) -> PyResult<()> {
        py.detach(|| {
            let d = self.comm.device();
            let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
            let e = match events.front() {
                Some(&e) if d.event_query(e)? => {
                    events.pop_front();
                    e
                }
                _ => d.event_create(1)?,
            };
            let r = d
                .event_record(e, stream_of(from))
                .and_then(|()| d.stream_wait_event(stream_of(to), e));
            events.push_back(e);
            r
        })
        .map_err(err)
    }

    /// Waits (without the interpreter's lock) for an event's record; raises the failure of the
    /// work before it, if one.
    fn event_wait(&self, py: Python<'_>, event: u64) -> PyResult<()> {
        let e = Event(event as usize as *mut c_void);
        py.detach(|| self.comm.device().event_synchronize(e))
            .map_err(err)
    }

    /// Whether everything enqueued on `stream` (`None`: the communicator's) has completed,
    /// without waiting.
    #[pyo3(signature = (stream=None))]
    fn query(&self, stream: Option<u64>) -> PyResult<bool> {
        let s = stream.map(stream_of).unwrap_or(self.comm.stream());
        self.comm.device().stream_query(s).map_err(err)
    }

    /// Destroys an event.
    fn event_destroy(&self, event: u64) -> PyResult<()> {
        let e = Event(event as usize as *mut c_void);
        self.comm.device().event_destroy(e).map_err(err)
    }

    /// Makes later work of `stream` wait for an event's record (no host wait).
    fn stream_wait_event(&self, stream: u64, event: u64) -> PyResult<()> {
        let e = Event(event as usize as *mut c_void);
        self.comm
            .device()
            .stream_wait_event(stream_of(stream), e)
            .map_err(err)
    }

    /// The C entries of this communicator, for a native caller that must not take the
    /// interpreter's lock on its hot path (the torch backend's C++ side):
    /// `(version, communicator, all_reduce, wrap_stream, synchronize)`, each an address.
    /// The communicator's address is valid while this object lives (the caller keeps a
    /// reference); the functions are those of [`native`], with its contracts.
    fn c_entries(slf: &Bound<'_, Self>) -> (u32, u64, u64, u64, u64) {
        let comm: *const PyCommunicator = slf.get();
        (
            native::VERSION,
            comm as usize as u64,
            native::fx_all_reduce as *const () as usize as u64,
            native::fx_wrap_stream as *const () as usize as u64,
            native::fx_synchronize as *const () as usize as u64,
        )
    }

    /// Waits for everything enqueued on `stream` (`None`: the communicator's).
    #[pyo3(signature = (stream=None))]
    fn synchronize(&self, py: Python<'_>, stream: Option<u64>) -> PyResult<()> {
        match stream {
            None => self.run(py, |c| c.synchronize()),
            Some(s) => self.run(py, |c| Ok(c.device().stream_synchronize(stream_of(s))?)),
        }
    }

    /// Starts a group of calls issued together at `group_end` (sends and receives in a group
    /// cannot deadlock whatever their order).
    fn group_start(&self) -> PyResult<()> {
        self.comm.group_start().map_err(err)
    }

    /// Ends a group and issues its calls.
    fn group_end(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |c| c.group_end())
    }

    /// `recv = op over ranks of send`, `count` elements of dtype code `dtype`.
    #[pyo3(signature = (send, recv, count, dtype, op, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn all_reduce(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: u32,
        op: u32,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let (d, o) = (self::dtype(dtype)?, redop(op)?);
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs): live buffers of `count` elements.
        py.detach(|| unsafe { call.all_reduce(ptr(send), ptr(recv), count, d, o) })
            .map_err(err)
    }

    /// `recv` on `root` = op over ranks of `send`.
    #[pyo3(signature = (send, recv, count, dtype, op, root, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: u32,
        op: u32,
        root: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let (d, o) = (self::dtype(dtype)?, redop(op)?);
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs).
        py.detach(|| unsafe { call.reduce(ptr(send), ptr(recv), count, d, o, root) })
            .map_err(err)
    }

    /// `recv` on every rank = `send` of `root`.
    #[pyo3(signature = (send, recv, count, dtype, root, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn broadcast(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: u32,
        root: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs).
        py.detach(|| unsafe { call.broadcast(ptr(send), ptr(recv), count, d, root) })
            .map_err(err)
    }

    /// `recv` (world * `count` elements) = every rank's `send` (`count` each), in rank order.
    #[pyo3(signature = (send, recv, count, dtype, stream=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: u32,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs).
        py.detach(|| unsafe { call.all_gather(ptr(send), ptr(recv), count, d) })
            .map_err(err)
    }

    /// `recv` (`count` elements) = op over ranks of this rank's block of `send` (world *
    /// `count`).
    #[pyo3(signature = (send, recv, count, dtype, op, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: u32,
        op: u32,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let (d, o) = (self::dtype(dtype)?, redop(op)?);
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs).
        py.detach(|| unsafe { call.reduce_scatter(ptr(send), ptr(recv), count, d, o) })
            .map_err(err)
    }

    /// The root's `recv` (world * `count` elements) = every rank's `send` (`count` each), in
    /// rank order.
    #[pyo3(signature = (send, recv, count, dtype, root, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: u32,
        root: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs).
        py.detach(|| unsafe { call.gather(ptr(send), ptr(recv), count, d, root) })
            .map_err(err)
    }

    /// Rank r's `recv` (`count` elements) = block r of the root's `send` (world * `count`).
    #[pyo3(signature = (send, recv, count, dtype, root, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn scatter(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: u32,
        root: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs).
        py.detach(|| unsafe { call.scatter(ptr(send), ptr(recv), count, d, root) })
            .map_err(err)
    }

    /// Block `j` of `send` (`count` elements each) goes to rank `j`, into block `i` of its
    /// `recv` (`i`: this rank).
    #[pyo3(signature = (send, recv, count, dtype, stream=None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: u32,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs).
        py.detach(|| unsafe { call.all_to_all(ptr(send), ptr(recv), count, d) })
            .map_err(err)
    }

    /// All-to-all with per-peer counts and element displacements.
    #[pyo3(signature = (send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_allv(
        &self,
        py: Python<'_>,
        send: u64,
        send_counts: Vec<usize>,
        send_displs: Vec<usize>,
        recv: u64,
        recv_counts: Vec<usize>,
        recv_displs: Vec<usize>,
        dtype: u32,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        let call = self.call(stream);
        py.detach(|| {
            // SAFETY: the caller's contract (the class docs), for the counts and displacements.
            unsafe {
                call.all_to_allv(
                    ptr(send),
                    &send_counts,
                    &send_displs,
                    ptr(recv),
                    &recv_counts,
                    &recv_displs,
                    d,
                )
            }
        })
        .map_err(err)
    }

    /// Sends `count` elements to `peer`.
    #[pyo3(signature = (buf, count, dtype, peer, stream=None))]
    fn send(
        &self,
        py: Python<'_>,
        buf: u64,
        count: usize,
        dtype: u32,
        peer: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs).
        py.detach(|| unsafe { call.send(ptr(buf), count, d, peer) })
            .map_err(err)
    }

    /// Receives `count` elements from `peer`.
    #[pyo3(signature = (buf, count, dtype, peer, stream=None))]
    fn recv(
        &self,
        py: Python<'_>,
        buf: u64,
        count: usize,
        dtype: u32,
        peer: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        let d = self::dtype(dtype)?;
        let call = self.call(stream);
        // SAFETY: the caller's contract (the class docs).
        py.detach(|| unsafe { call.recv(ptr(buf), count, d, peer) })
            .map_err(err)
    }

    /// Enqueues a barrier on `stream` (`None`: the communicator's).
    #[pyo3(signature = (stream=None))]
    fn barrier(&self, py: Python<'_>, stream: Option<u64>) -> PyResult<()> {
        let call = self.call(stream);
        py.detach(|| call.barrier()).map_err(err)
    }

    /// Returns once every rank has called it, through the job's store (no stream).
    fn host_barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |c| c.host_barrier())
    }

    /// Enqueues `iters` all-reduces of `count` elements in place at `buf` on `stream` from a
    /// Rust loop, waits for them, and returns the seconds the loop of enqueues took: the Rust
    /// side of the per-call overhead benchmark (`python/gpu/overhead.py`). With `sync_each`,
    /// the loop also waits for each call's stream after it (a synchronous call on the host
    /// device, as `torch.distributed.all_reduce` without `async_op` there).
    #[pyo3(signature = (buf, count, dtype, iters, stream=None, sync_each=false))]
    #[allow(clippy::too_many_arguments)]
    fn bench_all_reduce(
        &self,
        py: Python<'_>,
        buf: u64,
        count: usize,
        dtype: u32,
        iters: usize,
        stream: Option<u64>,
        sync_each: bool,
    ) -> PyResult<f64> {
        let d = self::dtype(dtype)?;
        let call = self.call(stream);
        let s = call.stream();
        py.detach(|| {
            let t = std::time::Instant::now();
            for _ in 0..iters {
                // SAFETY: the caller's contract (the class docs): `buf` holds `count` elements.
                unsafe { call.all_reduce(ptr(buf), ptr(buf), count, d, ReduceOp::SUM)? };
                if sync_each {
                    // As `synchronize` from Python: the communicator's own wait for its stream.
                    match stream {
                        None => self.comm.synchronize()?,
                        Some(_) => self.comm.device().stream_synchronize(s)?,
                    }
                }
            }
            let secs = t.elapsed().as_secs_f64();
            self.comm.device().stream_synchronize(s)?;
            Ok::<_, CommError>(secs)
        })
        .map_err(err)
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferrocx.Communicator rank {} of {} in cluster {:?} ({} + {})>",
            self.comm.rank(),
            self.comm.world(),
            self.comm.cluster(),
            self.comm.device().name(),
            self.comm.ccl().name()
        )
    }
}

/// What `ferrocx info` shows, as a dict: the configuration (`config`, else `FERROCX_CONFIG`,
/// else the local one) with each cluster's adaptors, every adaptor known (built-in and found on
/// disk) and every plugin refused.
#[pyfunction]
#[pyo3(signature = (config=None))]
fn info<'py>(py: Python<'py>, config: Option<String>) -> PyResult<Bound<'py, PyDict>> {
    let lookup = |k: &str| {
        if k == "FERROCX_CONFIG" && config.is_some() {
            return config.clone();
        }
        std::env::var(k).ok()
    };
    let (cfg, warnings) = Config::from_env(lookup).map_err(err)?;
    let registry = Registry::discover(&cfg.runtime);
    let out = PyDict::new(py);
    out.set_item("version", env!("CARGO_PKG_VERSION"))?;
    let abi = (ferrocx::abi::ABI_MAJOR, ferrocx::abi::ABI_MINOR);
    out.set_item("abi", format!("{}.{}", abi.0, abi.1))?;
    out.set_item("config", cfg.origin.to_string())?;
    out.set_item("warnings", warnings)?;
    let clusters = PyList::empty(py);
    for (i, c) in cfg.clusters.iter().enumerate() {
        let d = PyDict::new(py);
        d.set_item("name", &c.name)?;
        d.set_item("ranks", c.ranks.to_string())?;
        d.set_item("device", &c.device)?;
        d.set_item("ccl", &c.ccl)?;
        d.set_item("fallback", c.fallback.to_string())?;
        d.set_item("multicast", c.multicast.to_string())?;
        match registry.select(&cfg, i) {
            Ok(_) => d.set_item("selected", true)?,
            Err(e) => {
                d.set_item("selected", false)?;
                d.set_item("error", message(&e))?;
            }
        }
        clusters.append(d)?;
    }
    out.set_item("clusters", clusters)?;
    let adaptors = PyList::empty(py);
    for e in registry.entries() {
        let d = PyDict::new(py);
        d.set_item("name", &e.name)?;
        let kinds: Vec<&str> = [
            e.device.as_ref().map(|_| "device"),
            e.ccl.as_ref().map(|_| "ccl"),
        ]
        .into_iter()
        .flatten()
        .collect();
        d.set_item("kinds", kinds)?;
        let (major, minor) = e.abi_version();
        d.set_item("abi", format!("{major}.{minor}"))?;
        d.set_item("groups", e.groups())?;
        let source = match &e.source {
            Source::Builtin => "built-in".to_owned(),
            Source::Plugin(p) => p.display().to_string(),
        };
        d.set_item("source", source)?;
        d.set_item("notes", e.notes.clone())?;
        adaptors.append(d)?;
    }
    out.set_item("adaptors", adaptors)?;
    let rejected: Vec<String> = registry.rejected().iter().map(|e| message(e)).collect();
    out.set_item("rejected", rejected)?;
    Ok(out)
}

/// Sets `key` to `value` (when given) in the job's store, then returns the value under `key`,
/// waiting for some rank to set it: a small exchange among the ranks of a job before any
/// communicator exists (`ferrocx launch` hosts the store; `import ferrocx.torch` agrees on
/// torch's port through it).
#[pyfunction]
#[pyo3(signature = (key, value=None))]
fn store_exchange(py: Python<'_>, key: String, value: Option<String>) -> PyResult<String> {
    use ferrocx::bootstrap::{JobInfo, RankInfo, Store};
    py.detach(|| {
        let lookup = |k: &str| std::env::var(k).ok();
        let (cfg, _) = Config::from_env(lookup).map_err(|e| message(&e))?;
        let rank = RankInfo::from_env(lookup).map_err(|e| message(&e))?;
        let job = JobInfo::from_env(lookup, &rank);
        let timeout = std::time::Duration::from_millis(cfg.runtime.timeout_ms);
        let (store, _server) = Store::from_env(&rank, &job, timeout).map_err(|e| message(&e))?;
        if let Some(v) = &value {
            store.set(&key, v.as_bytes()).map_err(|e| message(&e))?;
        }
        let got = store.get(&key).map_err(|e| message(&e))?;
        Ok::<_, String>(String::from_utf8_lossy(&got).into_owned())
    })
    .map_err(Error::new_err)
}

/// The native module.
/// C entries for native callers (see [`PyCommunicator::c_entries`]): no interpreter, no
/// unwinding across the boundary. Each returns 0, or 1 with a NUL-terminated message in
/// `err` (at most `err_len` bytes, cut on a character boundary).
mod native {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// The version of these entries' signatures: a caller built for another refuses them.
    pub const VERSION: u32 = 2;

    /// The `stream` argument that means the communicator's own stream.
    pub const OWN_STREAM: u64 = u64::MAX;

    /// Writes `msg` into the caller's buffer.
    ///
    /// # Safety
    /// `err` is null or writable for `err_len` bytes.
    unsafe fn fail(err: *mut u8, err_len: u64, msg: &str) -> i32 {
        let cap = usize::try_from(err_len).unwrap_or(usize::MAX);
        if err.is_null() || cap == 0 {
            return 1;
        }
        let mut n = msg.len().min(cap - 1);
        while !msg.is_char_boundary(n) {
            n -= 1;
        }
        // SAFETY: the caller's buffer holds `cap` > `n` bytes (this function's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr(), err, n);
            *err.add(n) = 0;
        }
        1
    }

    /// Runs `f` on the communicator at `comm`, turning its error or panic into a message.
    ///
    /// # Safety
    /// `comm` is the address [`PyCommunicator::c_entries`] gave, of a communicator still
    /// alive; `err` as [`fail`] says.
    unsafe fn with(
        comm: *const PyCommunicator,
        err: *mut u8,
        err_len: u64,
        f: impl FnOnce(&PyCommunicator) -> Result<(), String>,
    ) -> i32 {
        if comm.is_null() {
            // SAFETY: the caller's buffer (this function's contract).
            return unsafe { fail(err, err_len, "ferrocx: no communicator") };
        }
        // SAFETY: a live communicator (this function's contract); it is `Sync` (frozen).
        let c = unsafe { &*comm };
        match catch_unwind(AssertUnwindSafe(|| f(c))) {
            Ok(Ok(())) => 0,
            // SAFETY: the caller's buffer (this function's contract).
            Ok(Err(m)) => unsafe { fail(err, err_len, &m) },
            // SAFETY: as above.
            Err(_) => unsafe {
                fail(
                    err,
                    err_len,
                    "ferrocx: internal error (a panic) in a native call",
                )
            },
        }
    }

    fn text(e: impl std::error::Error) -> String {
        message(&e)
    }

    /// `PyCommunicator::all_reduce` without the interpreter, on `stream`: a handle from
    /// [`fx_wrap_stream`] (0 is a stream too: CUDA's default one), or [`OWN_STREAM`].
    ///
    /// # Safety
    /// As [`with`]; `send` and `recv` hold `count` elements of `dtype` on the communicator's
    /// device and stay valid until the call completes on its stream (the class docs).
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn fx_all_reduce(
        comm: *const PyCommunicator,
        send: u64,
        recv: u64,
        count: u64,
        dtype: u32,
        op: u32,
        stream: u64,
        err: *mut u8,
        err_len: u64,
    ) -> i32 {
        // SAFETY: this function's contract is `with`'s and the collective's.
        unsafe {
            with(comm, err, err_len, |c| {
                let d = self::dtype(dtype).map_err(|e| e.to_string())?;
                let o = redop(op).map_err(|e| e.to_string())?;
                let count = usize::try_from(count)
                    .map_err(|_| format!("ferrocx: count {count} does not fit this machine"))?;
                let call = c.call((stream != OWN_STREAM).then_some(stream));
                call.all_reduce(ptr(send), ptr(recv), count, d, o)
                    .map_err(text)
            })
        }
    }

    /// `PyCommunicator::wrap_stream`: the device adaptor's handle of native stream `native`,
    /// written to `out`.
    ///
    /// # Safety
    /// As [`with`]; `native` is a live stream of the device's runtime that outlives the calls
    /// made on the handle; `out` is writable.
    pub unsafe extern "C" fn fx_wrap_stream(
        comm: *const PyCommunicator,
        native: u64,
        out: *mut u64,
        err: *mut u8,
        err_len: u64,
    ) -> i32 {
        // SAFETY: this function's contract is `with`'s and the stream's.
        unsafe {
            with(comm, err, err_len, |c| {
                let s = c
                    .comm
                    .device()
                    .stream_wrap(native as usize as *mut c_void)
                    .map_err(text)?;
                *out = handle_of(s);
                Ok(())
            })
        }
    }

    /// Waits for everything enqueued on the communicator's own stream (raising the failure of
    /// its work, as `PyCommunicator::synchronize`).
    ///
    /// # Safety
    /// As [`with`].
    pub unsafe extern "C" fn fx_synchronize(
        comm: *const PyCommunicator,
        err: *mut u8,
        err_len: u64,
    ) -> i32 {
        // SAFETY: this function's contract is `with`'s.
        unsafe { with(comm, err, err_len, |c| c.comm.synchronize().map_err(text)) }
    }
}

#[pymodule]
fn _ferrocx(m: &Bound<'_, PyModule>) -> PyResult<()> {
    ferrocx_adaptor_host::link();
    ferrocx_kernels::link();
    ferrocx_adaptor_cuda::link();
    ferrocx_adaptor_nccl::link();
    m.add("Error", m.py().get_type::<Error>())?;
    m.add_class::<PyCommunicator>()?;
    m.add_function(wrap_pyfunction!(info, m)?)?;
    m.add_function(wrap_pyfunction!(store_exchange, m)?)?;
    for (name, d) in [
        ("F32", DataType::F32),
        ("F64", DataType::F64),
        ("F16", DataType::F16),
        ("BF16", DataType::BF16),
        ("I8", DataType::I8),
        ("U8", DataType::U8),
        ("I32", DataType::I32),
        ("U32", DataType::U32),
        ("I64", DataType::I64),
        ("U64", DataType::U64),
    ] {
        m.add(name, d.0)?;
    }
    for (name, o) in [
        ("SUM", ReduceOp::SUM),
        ("PROD", ReduceOp::PROD),
        ("MIN", ReduceOp::MIN),
        ("MAX", ReduceOp::MAX),
        ("AVG", ReduceOp::AVG),
    ] {
        m.add(name, o.0)?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
