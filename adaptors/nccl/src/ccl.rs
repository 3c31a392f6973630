//! [`NcclCcl`]: the SDK's [`CclAdaptor`] and [`CclWindow`] over libnccl.
//!
//! Collectives map one to one onto NCCL's; gather, scatter, all-to-all and all-to-allv are
//! grouped `ncclSend`/`ncclRecv` (as nccl-tests and PyTorch build them). Every call is enqueued
//! on the stream and returns at once (NCCL's semantics); with the watchdog on, an event recorded
//! after it lets the watchdog see it complete (see `monitor`).

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::prelude::*;

use crate::comm::{NcclComm, Teardown};
use crate::library::{Api, Candidates};
use crate::watchdog::{self, Label, WATCHDOG_ENV, WATCHDOG_OPTION};
use crate::{conv, monitor, sys};

/// The NCCL CCL adaptor. One per process ([`CclAdaptor::instance`]).
///
/// Options (`[cluster.options.nccl]`): `library` — the libnccl to load (else
/// `FERROCX_NCCL_LIBRARY`, else `libnccl.so.2`, then `libnccl.so`); `watchdog` — `"on"` (the
/// default) or `"off"` (`FERROCX_NCCL_WATCHDOG=0` turns it off whatever the file says).
pub struct NcclCcl {
    state: RwLock<State>,
    comms: HandleTable<Arc<NcclComm>>,
    /// Whether a library is loaded (`state.api` is set): the calls on a communicator read this
    /// instead of taking the state's lock.
    live: AtomicBool,
}

#[derive(Default)]
struct State {
    /// The loaded library (leaked: never unloaded), `None` before `init` or after `finalize`.
    api: Option<&'static Api>,
    /// Why the last `init` failed, for the `NOT_INITIALIZED` errors that follow.
    failure: Option<String>,
    /// The watchdog setting from `init`'s options and the environment.
    watchdog: bool,
}

thread_local! {
    /// Depth of the caller's `group_start` … `group_end` on this thread (NCCL's groups are
    /// per thread too).
    static GROUP_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Operations issued inside the caller's group: NCCL launches them at the outermost
    /// `group_end`, where their events are recorded and their gates left.
    static GROUPED: RefCell<Vec<Deferred>> = const { RefCell::new(Vec::new()) };
}

/// An operation issued inside a group, waiting for its `group_end`.
struct Deferred {
    comm: Arc<NcclComm>,
    stream: Stream,
    /// `None` when the communicator is not watched.
    label: Option<Label>,
}

/// Keeps NVLink SHARP (NVLS, multicast objects) off unless the operator set
/// `NCCL_NVLS_ENABLE` themselves: multicast objects can put shared GPU hosts out of service.
/// Runs before libnccl is loaded, so NCCL reads it at its first call.
fn keep_nvls_off() {
    match std::env::var_os("NCCL_NVLS_ENABLE") {
        None => {
            // Mutating the environment races only with C code reading it on another thread;
            // this runs in `init`, before NCCL (the reader that matters) is loaded.
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
            tracing::debug!("nccl: NCCL_NVLS_ENABLE unset, set to 0 (multicast off)");
        }
        Some(v) if v != "0" => {
            tracing::warn!(value = ?v, "nccl: NCCL_NVLS_ENABLE is set by the environment and not 0: NVLink SHARP may create multicast objects");
        }
        Some(_) => {}
    }
}

/// With the watchdog on, has NCCL connect its peers inside `ncclCommInitRank` rather than at a
/// communicator's first collective (`NCCL_RUNTIME_CONNECT=0`, unless the operator set it): a
/// peer that fails after init then hangs kernels, which the watchdog aborts once no call is
/// inside NCCL, instead of a host call waiting inside NCCL for the connection, which only an
/// abort underneath it releases (and NCCL may free what that call still uses).
fn connect_at_init() {
    if std::env::var_os("NCCL_RUNTIME_CONNECT").is_none() {
        // As in `keep_nvls_off`: before NCCL is loaded.
        std::env::set_var("NCCL_RUNTIME_CONNECT", "0");
        tracing::debug!(
            "nccl: NCCL_RUNTIME_CONNECT unset, set to 0 (connect at init, watchdog on)"
        );
    }
}

/// The watchdog setting of `options` (see [`NcclCcl`]), the environment included.
fn watchdog_setting(options: &Options) -> Result<bool> {
    let env = std::env::var(WATCHDOG_ENV).ok();
    watchdog::enabled(options.get(WATCHDOG_OPTION), env.as_deref())
}

fn ptr(p: DevicePtr) -> *mut c_void {
    p.0 as usize as *mut c_void
}

/// `p + elems * elem` bytes, checked.
fn at(p: DevicePtr, elems: usize, elem: usize) -> Result<DevicePtr> {
    elems
        .checked_mul(elem)
        .and_then(|b| p.0.checked_add(b as u64))
        .map(DevicePtr)
        .ok_or_else(|| Error::invalid_argument(format!("offset of {elems} elements overflows")))
}

fn elem_size(t: DataType) -> Result<usize> {
    t.size()
        .ok_or_else(|| Error::invalid_argument(format!("unknown data type {t:?}")))
}

fn in_place_unsupported(op: &str, rule: &str) -> Error {
    Error::unsupported(format!(
        "{op} with send == recv: NCCL's in-place form is {rule}"
    ))
}

impl Default for NcclCcl {
    fn default() -> Self {
        NcclCcl {
            state: Default::default(),
            comms: HandleTable::new("communicator"),
            live: Default::default(),
        }
    }
}

/// Where an `ncclCommInitRank` running on its own thread stands.
enum Init {
    /// Still inside NCCL.
    Running,
    /// Returned: NCCL's result and the handle (as a number, to cross threads).
    Returned(sys::ncclResult_t, usize),
    /// The caller gave up waiting: the thread aborts whatever NCCL hands back.
    Abandoned,
}

/// `ncclCommInitRank` bounded by `timeout` (the watchdog's reach: NCCL's init waits for every
/// peer, and a peer that failed or never joined would hold it forever). It runs on a thread of
/// its own with this thread's CUDA context current; when it has not returned by the deadline
/// this call fails with `TIMEOUT`, and the thread aborts the communicator if NCCL ever hands it
/// back. Without the CUDA driver (no context to carry over) it runs here, unbounded.
fn init_rank_bounded(
    api: &'static Api,
    id: sys::ncclUniqueId,
    nranks: i32,
    rank: i32,
    timeout: std::time::Duration,
) -> Result<sys::ncclComm_t> {
    // NCCL's result and the handle of one `ncclCommInitRank` on the calling thread.
    let init = move || {
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id is passed by value as `nccl.h` declares.
        let rc = unsafe { (api.ncclCommInitRank)(&mut raw, nranks, id, rank) };
        (rc, raw as usize)
    };
    let direct = || {
        let (rc, raw) = init();
        let raw = raw as sys::ncclComm_t;
        api.check("ncclCommInitRank", rc, raw).map(|()| raw)
    };
    let Ok(cuda) = ferrocx_adaptor_cuda::shared::Driver::get() else {
        return direct();
    };
    let ctx = cuda.current_context() as usize;
    let shared = Arc::new((Mutex::new(Init::Running), std::sync::Condvar::new()));
    let theirs = Arc::clone(&shared);
    let spawned = std::thread::Builder::new()
        .name("ferrocx-nccl-init".into())
        .spawn(move || {
            // SAFETY: the calling thread's context, alive while it waits for this init (or, once
            // it gave up, while the communicator NCCL may still hand back is aborted).
            let _ = unsafe { cuda.set_context(ctx as ferrocx_adaptor_cuda::shared::CUcontext) };
            let (rc, raw) = init();
            let (state, returned) = &*theirs;
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(*st, Init::Abandoned) {
                drop(st);
                if raw != 0 {
                    // SAFETY: a communicator nobody else holds (its caller gave up on it).
                    unsafe { (api.ncclCommAbort)(raw as sys::ncclComm_t) };
                }
                tracing::debug!(
                    rank,
                    "nccl: an abandoned ncclCommInitRank returned; aborted"
                );
                return;
            }
            *st = Init::Returned(rc, raw);
            returned.notify_all();
        });
    if let Err(e) = spawned {
        tracing::debug!("nccl: no thread for a bounded init ({e}); initialising unbounded");
        return direct();
    }
    let (state, returned) = &*shared;
    let st = state.lock().unwrap_or_else(|p| p.into_inner());
    let (mut st, _) = returned
        .wait_timeout_while(st, timeout, |s| matches!(s, Init::Running))
        .unwrap_or_else(|p| p.into_inner());
    match *st {
        Init::Returned(rc, raw) => {
            let raw = raw as sys::ncclComm_t;
            api.check("ncclCommInitRank", rc, raw).map(|()| raw)
        }
        _ => {
            *st = Init::Abandoned;
            Err(Error::new(
                Status::TIMEOUT,
                format!(
                    "rank {rank} of {nranks}: ncclCommInitRank did not return within {:.1} s \
                     (timeout {} ms): a peer failed or never joined; the communicator is \
                     abandoned",
                    timeout.as_secs_f64(),
                    timeout.as_millis()
                ),
            ))
        }
    }
}

impl NcclCcl {
    fn api(&self) -> Result<&'static Api> {
        let st = self.state.read().unwrap_or_else(|p| p.into_inner());
        st.api.ok_or_else(|| {
            let why = st.failure.as_deref().map_or_else(
                || "init was not called".to_string(),
                |f| format!("init failed: {f}"),
            );
            Error::new(
                Status::NOT_INITIALIZED,
                format!("nccl: not initialised ({why})"),
            )
        })
    }

    fn comm(&self, c: Comm) -> Result<(&'static Api, Arc<NcclComm>)> {
        let id = c.0 as usize as u64;
        match self.comms.get(id) {
            // The library a communicator was made with stays loaded (never unloaded).
            Ok(comm) if self.live.load(Ordering::Acquire) => Ok((comm.api, comm)),
            _ => {
                self.api()?;
                Err(self.comms.unknown(id))
            }
        }
    }

    fn take(&self, c: Comm) -> Result<Arc<NcclComm>> {
        self.api()?;
        let id = c.0 as usize as u64;
        self.comms.remove(id)
    }

    /// Runs `f` on the communicator inside its gate (refused with the watchdog's error once it
    /// broke the communicator).
    fn call<T>(&self, c: Comm, f: impl FnOnce(&'static Api, &NcclComm) -> Result<T>) -> Result<T> {
        let (api, comm) = self.comm(c)?;
        comm.gate.enter()?;
        let r = f(api, &comm).map_err(|e| comm.watchdog_error(e));
        comm.gate.exit();
        r
    }

    /// Runs `f`, which enqueues operation `op` on `stream`, inside the communicator's gate; then
    /// (watchdog on) records its completion event, or defers that to the caller's `group_end`.
    #[inline]
    fn enqueue(
        &self,
        c: Comm,
        op: &'static str,
        stream: Stream,
        f: impl FnOnce(&'static Api, &NcclComm) -> Result<()>,
    ) -> Result<()> {
        let (api, comm) = self.comm(c)?;
        comm.gate.enter()?;
        let r = f(api, &comm);
        if let Err(e) = r {
            let e = comm.watchdog_error(e);
            comm.gate.exit();
            return Err(e);
        }
        let label = comm.watch.as_ref().map(|w| Label::one(op, w.next_seq()));
        if GROUP_DEPTH.with(Cell::get) > 0 {
            // Launched at the group's end: the gate stays entered until then.
            GROUPED.with(|g| {
                g.borrow_mut().push(Deferred {
                    comm,
                    stream,
                    label,
                })
            });
        } else {
            if let (Some(w), Some(label)) = (&comm.watch, label) {
                w.record(stream, label);
            }
            comm.gate.exit();
        }
        r
    }

    /// The peer deadline `comm` was created with, in milliseconds (0: the core's default), or
    /// `None` for an unknown handle.
    pub fn comm_timeout_ms(&self, comm: Comm) -> Option<u64> {
        self.comm(comm).ok().map(|(_, c)| c.timeout_ms)
    }

    /// Whether the watchdog watches `comm`, and how many of its operations it has not yet seen
    /// complete; `None` for an unknown handle or an unwatched communicator.
    pub fn watchdog_outstanding(&self, comm: Comm) -> Option<usize> {
        let (_, c) = self.comm(comm).ok()?;
        c.watch.as_ref().map(|w| w.outstanding())
    }

    fn query(&self, c: Comm, op: &str, f: impl Fn(&Api) -> sys::CommQuery) -> Result<i32> {
        self.call(c, |api, comm| {
            let mut v = 0;
            // SAFETY: a live communicator and a valid out-pointer.
            api.check(op, unsafe { f(api)(comm.raw, &mut v) }, comm.raw)?;
            Ok(v)
        })
    }

    /// Runs `f` between `ncclGroupStart` and `ncclGroupEnd`; the group is closed on every path.
    fn grouped(api: &Api, op: &str, comm: &NcclComm, f: impl FnOnce() -> Result<()>) -> Result<()> {
        // SAFETY: no arguments; groups nest.
        api.check(op, unsafe { (api.ncclGroupStart)() }, comm.raw)?;
        let issued = f();
        // SAFETY: closes the group opened above.
        let ended = api.check(op, unsafe { (api.ncclGroupEnd)() }, comm.raw);
        issued.and(ended)
    }

    /// `ncclSend` of `count` elements at `buf` (nothing for zero).
    fn p2p_send(
        api: &Api,
        comm: &NcclComm,
        buf: DevicePtr,
        count: usize,
        t: sys::ncclDataType_t,
        peer: i32,
        stream: Stream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        // SAFETY: `buf` holds `count` elements on the communicator's device until the
        // operation completes on `stream` (the ABI's contract).
        let rc = unsafe { (api.ncclSend)(ptr(buf), count, t, peer, comm.raw, stream.0) };
        api.check("ncclSend", rc, comm.raw)
    }

    /// `ncclRecv` of `count` elements into `buf` (nothing for zero).
    fn p2p_recv(
        api: &Api,
        comm: &NcclComm,
        buf: DevicePtr,
        count: usize,
        t: sys::ncclDataType_t,
        peer: i32,
        stream: Stream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        // SAFETY: as in `p2p_send`, for writes.
        let rc = unsafe { (api.ncclRecv)(ptr(buf), count, t, peer, comm.raw, stream.0) };
        api.check("ncclRecv", rc, comm.raw)
    }

    /// Ends the caller's outermost group: records one event per communicator and stream the
    /// group used (once NCCL launched it) and leaves their gates.
    fn finish_group(launched: bool) {
        let deferred = GROUPED.with(|g| std::mem::take(&mut *g.borrow_mut()));
        let mut records: Vec<(&Arc<NcclComm>, Stream, Label)> = Vec::new();
        for d in &deferred {
            let Some(label) = d.label else { continue };
            match records
                .iter_mut()
                .find(|(c, s, _)| Arc::ptr_eq(c, &d.comm) && *s == d.stream)
            {
                Some(r) => r.2 = r.2.and(label),
                None => records.push((&d.comm, d.stream, label)),
            }
        }
        if launched {
            for (comm, stream, label) in records {
                if let Some(w) = &comm.watch {
                    w.record(stream, label);
                }
            }
        }
        for d in &deferred {
            d.comm.gate.exit();
        }
    }
}

impl CclAdaptor for NcclCcl {
    fn instance() -> &'static Self {
        singleton!(NcclCcl)
    }

    /// Loads libnccl (see [`NcclCcl`] for where from) after making sure `NCCL_NVLS_ENABLE` is
    /// set (to `0` unless the environment already says otherwise). A second `init` after a
    /// successful one keeps the library already loaded (and takes its `watchdog` setting).
    fn init(&self, options: &Options) -> Result<()> {
        let watchdog = watchdog_setting(options)?;
        let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
        st.watchdog = watchdog;
        if st.api.is_some() {
            return Ok(());
        }
        keep_nvls_off();
        if watchdog {
            connect_at_init();
        }
        match Api::load(&Candidates::from(options)) {
            Ok(api) => {
                st.api = Some(Box::leak(Box::new(api)));
                st.failure = None;
                self.live.store(true, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                st.failure = Some(e.message().to_string());
                Err(e)
            }
        }
    }

    fn finalize(&self) -> Result<()> {
        self.api()?;
        let left = self.comms.len();
        if left > 0 {
            tracing::warn!(
                communicators = left,
                "nccl: finalize with communicators still alive; they are left to the process exit"
            );
        }
        let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
        st.api = None;
        self.live.store(false, Ordering::Release);
        Ok(())
    }

    fn version(&self) -> Result<i32> {
        Ok(self.api()?.version)
    }

    fn unique_id(&self) -> Result<Vec<u8>> {
        let api = self.api()?;
        let mut id = sys::ncclUniqueId {
            internal: [0; sys::NCCL_UNIQUE_ID_BYTES],
        };
        api.check(
            "ncclGetUniqueId",
            // SAFETY: a valid out-pointer to a whole `ncclUniqueId`.
            unsafe { (api.ncclGetUniqueId)(&mut id) },
            std::ptr::null_mut(),
        )?;
        Ok(id.internal.iter().map(|&b| b as u8).collect())
    }

    /// Creates the communicator with `ncclCommInitRank`. NCCL uses the calling thread's current
    /// CUDA device: the core calls the device adaptor's `set_device(init.device)` on this thread
    /// first; a communicator that lands on another device is destroyed and refused. With the
    /// watchdog on (and a CUDA driver to record events with), the communicator is watched with
    /// `timeout_ms` (0: the core's default) as its deadline.
    fn comm_init_rank(&self, init: &CommInit<'_>) -> Result<Comm> {
        let api = self.api()?;
        if init.unique_id.len() != sys::NCCL_UNIQUE_ID_BYTES {
            return Err(Error::invalid_argument(format!(
                "unique id of {} bytes; NCCL's has {}",
                init.unique_id.len(),
                sys::NCCL_UNIQUE_ID_BYTES
            )));
        }
        if init.nranks < 1 || init.rank < 0 || init.rank >= init.nranks {
            return Err(Error::invalid_argument(format!(
                "rank {} is not in 0..{}",
                init.rank, init.nranks
            )));
        }
        let watched = match init.options.get(WATCHDOG_OPTION) {
            Some(_) => watchdog_setting(&init.options)?,
            None => {
                self.state
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .watchdog
            }
        };
        let mut id = sys::ncclUniqueId {
            internal: [0; sys::NCCL_UNIQUE_ID_BYTES],
        };
        for (d, s) in id.internal.iter_mut().zip(init.unique_id) {
            *d = *s as _;
        }
        let timeout = watchdog::timeout(init.timeout_ms);
        let raw = if watched {
            init_rank_bounded(api, id, init.nranks, init.rank, timeout)?
        } else {
            let mut raw: sys::ncclComm_t = std::ptr::null_mut();
            // SAFETY: a valid out-pointer; the id is passed by value as `nccl.h` declares.
            let rc = unsafe { (api.ncclCommInitRank)(&mut raw, init.nranks, id, init.rank) };
            api.check("ncclCommInitRank", rc, raw)?;
            raw
        };
        let mut device = -1;
        // SAFETY: the communicator just created; a valid out-pointer.
        let rc = unsafe { (api.ncclCommCuDevice)(raw, &mut device) };
        if let Err(e) = api.check("ncclCommCuDevice", rc, raw) {
            // SAFETY: the communicator is ours and unused.
            unsafe { (api.ncclCommDestroy)(raw) };
            return Err(e);
        }
        if device != init.device {
            // SAFETY: as above.
            unsafe { (api.ncclCommDestroy)(raw) };
            return Err(Error::invalid_argument(format!(
                "the communicator of rank {} landed on CUDA device {device}, not {}: set the device on this thread first",
                init.rank, init.device
            )));
        }
        let watch = if watched {
            match monitor::prepare() {
                // This thread's current context is the communicator's (NCCL just used it).
                Ok(cuda) => Some(monitor::Watch::new(cuda, timeout)),
                Err(e) => {
                    tracing::warn!(
                        rank = init.rank,
                        "nccl: the watchdog cannot run ({}): a hung peer will hang this rank",
                        e.message()
                    );
                    None
                }
            }
        } else {
            None
        };
        let comm = Arc::new(NcclComm {
            raw,
            rank: init.rank,
            nranks: init.nranks,
            timeout_ms: init.timeout_ms,
            api,
            gate: Default::default(),
            watch,
        });
        if comm.watch.is_some() {
            monitor::watch(comm.clone());
        }
        let id = self.comms.insert(comm.clone());
        tracing::debug!(
            rank = init.rank,
            nranks = init.nranks,
            device,
            watchdog = comm.watch.is_some(),
            timeout_ms = timeout.as_millis() as u64,
            "nccl: communicator created"
        );
        Ok(Comm(id as usize as *mut c_void))
    }

    fn comm_finalize(&self, c: Comm) -> Result<()> {
        self.call(c, |api, comm| {
            // SAFETY: a live communicator.
            api.check(
                "ncclCommFinalize",
                unsafe { (api.ncclCommFinalize)(comm.raw) },
                comm.raw,
            )
        })
    }

    /// `ncclCommDestroy`; after the watchdog aborted the communicator, releases the handle only.
    fn comm_destroy(&self, c: Comm) -> Result<()> {
        self.take(c)?.release(Teardown::Destroy)
    }

    /// `ncclCommAbort`; after the watchdog aborted the communicator, releases the handle only.
    fn comm_abort(&self, c: Comm) -> Result<()> {
        self.take(c)?.release(Teardown::Abort)
    }

    /// NCCL's asynchronous error; once the watchdog broke the communicator, the status of its
    /// verdict (`TIMEOUT` for an operation that made no progress within the deadline, NCCL's
    /// own for an asynchronous error, e.g. `PEER_FAILURE`).
    fn comm_async_error(&self, c: Comm) -> Result<Status> {
        self.comm(c)?.1.async_error()
    }

    fn comm_count(&self, c: Comm) -> Result<i32> {
        self.query(c, "ncclCommCount", |a| a.ncclCommCount)
    }

    fn comm_user_rank(&self, c: Comm) -> Result<i32> {
        self.query(c, "ncclCommUserRank", |a| a.ncclCommUserRank)
    }

    fn comm_device(&self, c: Comm) -> Result<i32> {
        self.query(c, "ncclCommCuDevice", |a| a.ncclCommCuDevice)
    }

    fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "all_reduce", stream, |api, comm| {
            let (t, o) = (conv::dtype(dtype, api.version)?, conv::op(op, api.version)?);
            // SAFETY: buffers of `count` elements on the device until the operation completes
            // on `stream` (the ABI's contract); NCCL supports send == recv.
            let rc = unsafe {
                (api.ncclAllReduce)(ptr(send), ptr(recv), count, t, o, comm.raw, stream.0)
            };
            api.check("ncclAllReduce", rc, comm.raw)
        })
    }

    fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "all_gather", stream, |api, comm| {
            let t = conv::dtype(dtype, api.version)?;
            if send == recv && comm.rank != 0 {
                return Err(in_place_unsupported(
                    "all_gather",
                    "send == recv + rank * send_count",
                ));
            }
            // SAFETY: `send` holds `send_count` and `recv` `nranks * send_count` elements until
            // the operation completes on `stream`.
            let rc = unsafe {
                (api.ncclAllGather)(ptr(send), ptr(recv), send_count, t, comm.raw, stream.0)
            };
            api.check("ncclAllGather", rc, comm.raw)
        })
    }

    fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "reduce_scatter", stream, |api, comm| {
            let (t, o) = (conv::dtype(dtype, api.version)?, conv::op(op, api.version)?);
            if send == recv && comm.rank != 0 {
                return Err(in_place_unsupported(
                    "reduce_scatter",
                    "recv == send + rank * recv_count",
                ));
            }
            // SAFETY: `send` holds `nranks * recv_count` and `recv` `recv_count` elements until
            // the operation completes on `stream`.
            let rc = unsafe {
                (api.ncclReduceScatter)(ptr(send), ptr(recv), recv_count, t, o, comm.raw, stream.0)
            };
            api.check("ncclReduceScatter", rc, comm.raw)
        })
    }

    fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "broadcast", stream, |api, comm| {
            let t = conv::dtype(dtype, api.version)?;
            // SAFETY: buffers of `count` elements until the operation completes on `stream`.
            let rc = unsafe {
                (api.ncclBroadcast)(ptr(send), ptr(recv), count, t, root, comm.raw, stream.0)
            };
            api.check("ncclBroadcast", rc, comm.raw)
        })
    }

    fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "reduce", stream, |api, comm| {
            let (t, o) = (conv::dtype(dtype, api.version)?, conv::op(op, api.version)?);
            // SAFETY: buffers of `count` elements until the operation completes on `stream`.
            let rc = unsafe {
                (api.ncclReduce)(ptr(send), ptr(recv), count, t, o, root, comm.raw, stream.0)
            };
            api.check("ncclReduce", rc, comm.raw)
        })
    }

    fn gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        root: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "gather", stream, |api, comm| {
            let t = conv::dtype(dtype, api.version)?;
            let size = elem_size(dtype)?;
            check_root(root, comm.nranks)?;
            if comm.rank != root {
                return Self::p2p_send(api, comm, send, send_count, t, root, stream);
            }
            let own = at(recv, root as usize * send_count, size)?;
            if send == recv && own != send {
                return Err(in_place_unsupported(
                    "gather",
                    "send == recv + root * send_count",
                ));
            }
            Self::grouped(api, "gather", comm, || {
                for r in 0..comm.nranks {
                    let block = at(recv, r as usize * send_count, size)?;
                    if r == root {
                        if block != send {
                            Self::p2p_send(api, comm, send, send_count, t, r, stream)?;
                            Self::p2p_recv(api, comm, block, send_count, t, r, stream)?;
                        }
                    } else {
                        Self::p2p_recv(api, comm, block, send_count, t, r, stream)?;
                    }
                }
                Ok(())
            })
        })
    }

    fn scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        root: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "scatter", stream, |api, comm| {
            let t = conv::dtype(dtype, api.version)?;
            let size = elem_size(dtype)?;
            check_root(root, comm.nranks)?;
            if comm.rank != root {
                return Self::p2p_recv(api, comm, recv, recv_count, t, root, stream);
            }
            let own = at(send, root as usize * recv_count, size)?;
            if send == recv && own != recv {
                return Err(in_place_unsupported(
                    "scatter",
                    "recv == send + root * recv_count",
                ));
            }
            Self::grouped(api, "scatter", comm, || {
                for r in 0..comm.nranks {
                    let block = at(send, r as usize * recv_count, size)?;
                    if r == root {
                        if block != recv {
                            Self::p2p_send(api, comm, block, recv_count, t, r, stream)?;
                            Self::p2p_recv(api, comm, recv, recv_count, t, r, stream)?;
                        }
                    } else {
                        Self::p2p_send(api, comm, block, recv_count, t, r, stream)?;
                    }
                }
                Ok(())
            })
        })
    }

    fn all_to_all(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "all_to_all", stream, |api, comm| {
            let t = conv::dtype(dtype, api.version)?;
            let size = elem_size(dtype)?;
            if send == recv {
                return Err(in_place_unsupported(
                    "all_to_all",
                    "absent (use distinct buffers)",
                ));
            }
            Self::grouped(api, "all_to_all", comm, || {
                for r in 0..comm.nranks {
                    let off = r as usize * count;
                    Self::p2p_send(api, comm, at(send, off, size)?, count, t, r, stream)?;
                    Self::p2p_recv(api, comm, at(recv, off, size)?, count, t, r, stream)?;
                }
                Ok(())
            })
        })
    }

    fn all_to_allv(
        &self,
        send: DevicePtr,
        send_v: VCounts<'_>,
        recv: DevicePtr,
        recv_v: VCounts<'_>,
        dtype: DataType,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "all_to_allv", stream, |api, comm| {
            let t = conv::dtype(dtype, api.version)?;
            let size = elem_size(dtype)?;
            let n = comm.nranks as usize;
            for (v, what) in [(&send_v, "send"), (&recv_v, "recv")] {
                if v.counts.len() != n || v.displs.len() != n {
                    return Err(Error::invalid_argument(format!(
                        "{what} counts/displacements must have {n} entries"
                    )));
                }
            }
            if send == recv {
                return Err(in_place_unsupported(
                    "all_to_allv",
                    "absent (use distinct buffers)",
                ));
            }
            Self::grouped(api, "all_to_allv", comm, || {
                for r in 0..comm.nranks {
                    let i = r as usize;
                    let s = at(send, send_v.displs[i], size)?;
                    let d = at(recv, recv_v.displs[i], size)?;
                    Self::p2p_send(api, comm, s, send_v.counts[i], t, r, stream)?;
                    Self::p2p_recv(api, comm, d, recv_v.counts[i], t, r, stream)?;
                }
                Ok(())
            })
        })
    }

    fn send(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "send", stream, |api, comm| {
            let t = conv::dtype(dtype, api.version)?;
            // SAFETY: `buf` holds `count` elements until the operation completes on `stream`.
            let rc = unsafe { (api.ncclSend)(ptr(buf), count, t, peer, comm.raw, stream.0) };
            api.check("ncclSend", rc, comm.raw)
        })
    }

    fn recv(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        self.enqueue(c, "recv", stream, |api, comm| {
            let t = conv::dtype(dtype, api.version)?;
            // SAFETY: `buf` has room for `count` elements until the operation completes on
            // `stream`.
            let rc = unsafe { (api.ncclRecv)(ptr(buf), count, t, peer, comm.raw, stream.0) };
            api.check("ncclRecv", rc, comm.raw)
        })
    }

    fn group_start(&self) -> Result<()> {
        let api = self.api()?;
        api.check(
            "ncclGroupStart",
            // SAFETY: no arguments.
            unsafe { (api.ncclGroupStart)() },
            std::ptr::null_mut(),
        )?;
        GROUP_DEPTH.with(|d| d.set(d.get() + 1));
        Ok(())
    }

    /// `ncclGroupEnd`; the outermost one records the group's events (one per communicator and
    /// stream it used).
    fn group_end(&self) -> Result<()> {
        let api = self.api()?;
        // SAFETY: no arguments.
        let rc = unsafe { (api.ncclGroupEnd)() };
        // NCCL closes the group even when it reports an error.
        let depth = GROUP_DEPTH.with(|d| {
            let n = d.get().saturating_sub(1);
            d.set(n);
            n
        });
        let ended = api.check("ncclGroupEnd", rc, std::ptr::null_mut());
        if depth == 0 {
            Self::finish_group(ended.is_ok());
        }
        ended
    }

    /// `ncclMemAlloc` on the calling thread's current device (NCCL >= 2.19).
    fn mem_alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let api = self.api()?;
        let f = api.ncclMemAlloc.ok_or_else(|| api.lacks("ncclMemAlloc"))?;
        let mut p: *mut c_void = std::ptr::null_mut();
        api.check(
            "ncclMemAlloc",
            // SAFETY: a valid out-pointer.
            unsafe { f(&mut p, bytes) },
            std::ptr::null_mut(),
        )?;
        Ok(DevicePtr(p as usize as u64))
    }

    fn mem_free(&self, p: DevicePtr) -> Result<()> {
        let api = self.api()?;
        let f = api.ncclMemFree.ok_or_else(|| api.lacks("ncclMemFree"))?;
        // SAFETY: `p` came from `mem_alloc` (the ABI's contract).
        api.check("ncclMemFree", unsafe { f(ptr(p)) }, std::ptr::null_mut())
    }

    /// `ncclCommRegister` (NCCL >= 2.19). A libnccl without it answers `UNSUPPORTED` (and
    /// `query_support("mem_register")` says so up front).
    fn mem_register(&self, c: Comm, buf: DevicePtr, bytes: usize) -> Result<RegHandle> {
        let api = self.api()?;
        let f = api
            .ncclCommRegister
            .ok_or_else(|| api.lacks("ncclCommRegister"))?;
        self.call(c, |api, comm| {
            let mut h: *mut c_void = std::ptr::null_mut();
            api.check(
                "ncclCommRegister",
                // SAFETY: a live communicator, `bytes` of device memory at `buf`, a valid
                // out-pointer.
                unsafe { f(comm.raw, ptr(buf), bytes, &mut h) },
                comm.raw,
            )?;
            Ok(RegHandle(h))
        })
    }

    fn mem_deregister(&self, c: Comm, handle: RegHandle) -> Result<()> {
        let api = self.api()?;
        let f = api
            .ncclCommDeregister
            .ok_or_else(|| api.lacks("ncclCommDeregister"))?;
        self.call(c, |api, comm| {
            // SAFETY: a live communicator and a handle from its `ncclCommRegister`.
            api.check(
                "ncclCommDeregister",
                unsafe { f(comm.raw, handle.0) },
                comm.raw,
            )
        })
    }

    /// Which optional NCCL symbols an entry needs, answered from the loaded libnccl: the
    /// window group needs `ncclCommWindowRegister`/`Deregister` (2.27), registration
    /// `ncclCommRegister`/`Deregister` (2.19), `mem_alloc`/`mem_free` `ncclMemAlloc`/`Free`
    /// (2.19). Every other entry works with any supported libnccl.
    fn query_support(&self, entry: &str) -> Result<Option<String>> {
        let api = self.api()?;
        let needs: &[(&str, bool)] = match entry {
            "window_register" | "window_deregister" => &[
                (
                    "ncclCommWindowRegister",
                    api.ncclCommWindowRegister.is_some(),
                ),
                (
                    "ncclCommWindowDeregister",
                    api.ncclCommWindowDeregister.is_some(),
                ),
            ],
            "mem_register" | "mem_deregister" => &[
                ("ncclCommRegister", api.ncclCommRegister.is_some()),
                ("ncclCommDeregister", api.ncclCommDeregister.is_some()),
            ],
            "mem_alloc" | "mem_free" => &[
                ("ncclMemAlloc", api.ncclMemAlloc.is_some()),
                ("ncclMemFree", api.ncclMemFree.is_some()),
            ],
            _ => &[],
        };
        Ok(needs
            .iter()
            .find(|(_, has)| !has)
            .map(|(symbol, _)| api.lacks(symbol).message().to_string()))
    }
}

/// The window group over `ncclCommWindowRegister` (NCCL >= 2.27). The group is exported by
/// every build; a libnccl without the symbols answers `UNSUPPORTED` naming the missing symbol
/// and the release that has it, before the communicator is looked at.
impl CclWindow for NcclCcl {
    /// `ncclCommWindowRegister` of `bytes` at `buf`, collective. `flags` are NCCL's window flags,
    /// passed through (ferrocx's `WindowFlags` vendor bits: 0 for NCCL's default,
    /// `COLL_SYMMETRIC` = 1 = `NCCL_WIN_COLL_SYMMETRIC`, which lets NCCL use its symmetric
    /// kernels when every rank uses the same offsets). NCCL takes window buffers only from
    /// `ncclMemAlloc` (this adaptor's `mem_alloc`) or CUDA VMM allocations, and registers nothing
    /// where the ranks cannot map each other: that answers `UNSUPPORTED`.
    fn window_register(
        &self,
        c: Comm,
        buf: DevicePtr,
        bytes: usize,
        flags: u32,
    ) -> Result<WindowHandle> {
        let api = self.api()?;
        let f = api
            .ncclCommWindowRegister
            .ok_or_else(|| api.lacks("ncclCommWindowRegister"))?;
        self.call(c, |api, comm| {
            let win_flags = i32::try_from(flags).map_err(|_| {
                Error::invalid_argument(format!("window flags {flags:#x} are not NCCL's"))
            })?;
            let mut w: *mut c_void = std::ptr::null_mut();
            // SAFETY: a live communicator, `bytes` of device memory at `buf`, a valid
            // out-pointer.
            let rc = unsafe { f(comm.raw, ptr(buf), bytes, &mut w, win_flags) };
            api.check("ncclCommWindowRegister", rc, comm.raw)?;
            if w.is_null() {
                return Err(Error::unsupported(format!(
                    "ncclCommWindowRegister registered no window for {bytes} bytes at {:#x}: NCCL needs memory from ncclMemAlloc or CUDA VMM allocations, and ranks that can map each other's memory",
                    buf.0
                )));
            }
            Ok(WindowHandle(w))
        })
    }

    fn window_deregister(&self, c: Comm, window: WindowHandle) -> Result<()> {
        let api = self.api()?;
        let f = api
            .ncclCommWindowDeregister
            .ok_or_else(|| api.lacks("ncclCommWindowDeregister"))?;
        self.call(c, |api, comm| {
            // SAFETY: a live communicator and a window of its `ncclCommWindowRegister`.
            let rc = unsafe { f(comm.raw, window.0) };
            api.check("ncclCommWindowDeregister", rc, comm.raw)
        })
    }
}

/// Refuses a root outside `0..nranks` before NCCL sees it.
fn check_root(root: i32, nranks: i32) -> Result<()> {
    if (0..nranks).contains(&root) {
        Ok(())
    } else {
        Err(Error::invalid_argument(format!(
            "root {root} is not in 0..{nranks}"
        )))
    }
}
