//! Traits for the CCL adaptor and its window group, and the trampolines that build their tables.

use std::ffi::c_char;

use ferrocx::abi::{
    AbiHeader, CclAdaptorV1, CclLimits, CclWindowV1, Comm, CommInitArgs, DataType, DevicePtr,
    KeyValue, ReduceOp, RegHandle, Status, Stream, WindowHandle,
};

use crate::boundary::{call, guard, read_bytes, write_bytes, write_out};
use crate::error::{last_error_ptr, Error, Result};
use crate::options::Options;

/// Arguments of [`CclAdaptor::comm_init_rank`].
#[derive(Clone, Debug)]
pub struct CommInit<'a> {
    /// This process's rank.
    pub rank: i32,
    /// Number of ranks.
    pub nranks: i32,
    /// Device of the paired device adaptor.
    pub device: i32,
    /// The unique id from rank 0.
    pub unique_id: &'a [u8],
    /// Deadline for a wait on a peer, in milliseconds (0: the adaptor's default).
    pub timeout_ms: u64,
    /// The cluster's options for this adaptor.
    pub options: Options,
}

/// The limits a CCL adaptor declares ([`CclAdaptor::LIMITS`], ABI 1.3's `get_limits`): the
/// most ranks a communicator may have, the data types and the reductions its collectives
/// accept. Built at compile time:
///
/// ```
/// use ferrocx_plugin_sdk::prelude::*;
/// const LIMITS: Limits = Limits::NONE
///     .max_ranks(1)
///     .dtypes(&[DataType::F32, DataType::I32])
///     .reduce_ops(&[ReduceOp::SUM]);
/// assert!(LIMITS.abi().allows_dtype(DataType::F32));
/// assert!(!LIMITS.abi().allows_ranks(2));
/// ```
///
/// The trampolines refuse what lies outside with `UNSUPPORTED` before the adaptor is called
/// (a `comm_init_rank` of more ranks, a collective of another type or reduction), and the
/// conformance kit reports it as "not claimed" instead of calling it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits(CclLimits);

impl Limits {
    /// No limits (the default of [`CclAdaptor::LIMITS`]).
    pub const NONE: Limits = Limits(CclLimits::NONE);

    /// At most `n` ranks per communicator (`n` at least 1).
    pub const fn max_ranks(self, n: u64) -> Limits {
        assert!(n >= 1, "max_ranks must be at least 1");
        let mut l = self.0;
        l.max_ranks = n;
        Limits(l)
    }

    /// Only these data types.
    pub const fn dtypes(self, dtypes: &[DataType]) -> Limits {
        let mut bits = 0u64;
        let mut i = 0;
        while i < dtypes.len() {
            assert!(
                dtypes[i].0 < 64,
                "a data type beyond the 64 the limits can name"
            );
            bits |= 1 << dtypes[i].0;
            i += 1;
        }
        let mut l = self.0;
        l.dtypes = bits;
        Limits(l)
    }

    /// Only these reductions.
    pub const fn reduce_ops(self, ops: &[ReduceOp]) -> Limits {
        let mut bits = 0u64;
        let mut i = 0;
        while i < ops.len() {
            assert!(
                ops[i].0 < 64,
                "a reduction beyond the 64 the limits can name"
            );
            bits |= 1 << ops[i].0;
            i += 1;
        }
        let mut l = self.0;
        l.reduce_ops = bits;
        Limits(l)
    }

    /// The ABI's struct.
    pub const fn abi(&self) -> CclLimits {
        self.0
    }

    /// `UNSUPPORTED` naming what is not claimed, for a collective of `dtype` (and `op`).
    fn claim(&self, entry: &str, dtype: DataType, op: Option<ReduceOp>) -> Result<()> {
        // An unknown type or reduction is the adaptor's to refuse (INVALID_ARGUMENT).
        if dtype.size().is_some() && !self.0.allows_dtype(dtype) {
            return Err(Error::new(
                Status::UNSUPPORTED,
                format!(
                    "{entry} of {dtype:?}: this adaptor does not claim that data type (its LIMITS)"
                ),
            ));
        }
        match op {
            Some(op) if ReduceOp::ALL.contains(&op) && !self.0.allows_op(op) => Err(Error::new(
                Status::UNSUPPORTED,
                format!(
                    "{entry} with {op:?}: this adaptor does not claim that reduction (its LIMITS)"
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::NONE
    }
}

/// Per-peer counts and displacements of `all_to_allv`, in elements.
#[derive(Clone, Copy, Debug)]
pub struct VCounts<'a> {
    /// Elements for (or from) each peer.
    pub counts: &'a [usize],
    /// Offset of each peer's block, in elements.
    pub displs: &'a [usize],
}

/// The CCL adaptor (`ferrocx_ccl_adaptor_v1`). Every method is required: return
/// [`Error::unsupported`] for what the library cannot do at run time, export it as absent
/// (`ccl_absent: [method, …]`) for what it never does, and declare narrower support in
/// [`CclAdaptor::LIMITS`].
///
/// # Pairing with a device adaptor
///
/// A CCL always runs on a device adaptor: its own (an adaptor exporting both tables, as the
/// host adaptor does) or another one named beside it in the cluster's configuration (NCCL on
/// CUDA). Buffers are [`DevicePtr`]s of that device adaptor's `mem_alloc` (or its `PINNED` /
/// `HOST` memory), streams are that device adaptor's [`Stream`] handles, passed through
/// unchanged: a CCL must accept every stream its device adaptor creates or wraps, and the null
/// stream as that adaptor's default stream. `CommInit::device` is an ordinal of that device
/// adaptor (`set_device`'s numbering). A CCL meant for someone else's device adaptor documents
/// which one; one over its own device can keep its stream handles in its own table.
///
/// # The contract every method keeps
///
/// - **Asynchronous.** Collectives and `send`/`recv` return once enqueued on `stream`; they run
///   in stream order with the device's other work, and their failures surface at
///   `stream_synchronize` (or `comm_async_error`).
/// - **Collective calls** are made by every rank of the communicator in the same order.
/// - **Before `init`**, a method either works or fails with `NOT_INITIALIZED`.
/// - **Bad arguments** fail at once, before anything is enqueued: an unknown data type or
///   reduction, a root or peer out of range, a null buffer with a non-zero count are
///   `INVALID_ARGUMENT`; an unknown communicator is `INVALID_HANDLE`.
#[allow(clippy::too_many_arguments)]
pub trait CclAdaptor: Send + Sync + Sized + 'static {
    /// What the adaptor claims (ABI 1.3's `get_limits`): the most ranks, the data types and
    /// the reductions. The default claims everything; a CCL that supports less declares it
    /// here (see [`Limits`]), and calls outside are refused for it.
    const LIMITS: Limits = Limits::NONE;
    /// The process-wide instance (see [`crate::singleton!`]).
    fn instance() -> &'static Self;
    /// Initialises the adaptor with the configuration's options (load the vendor library
    /// here). Called once per process before anything else.
    fn init(&self, options: &Options) -> Result<()>;
    /// Releases everything the adaptor holds (communicators still live included). No call but
    /// `init` follows it.
    fn finalize(&self) -> Result<()>;
    /// The vendor library's version (NCCL: `major*10000 + minor*100 + patch`), at least 0.
    fn version(&self) -> Result<i32>;
    /// A new unique id: called once per communicator on one process (the root), whose bytes
    /// every rank then passes to `comm_init_rank`. Two calls give two distinct ids.
    fn unique_id(&self) -> Result<Vec<u8>>;
    /// Creates this rank's communicator (collective over `init.nranks` processes, which all
    /// pass the same `unique_id`); a wait on a peer gives up after `init.timeout_ms`
    /// (`TIMEOUT`). More ranks than [`CclAdaptor::LIMITS`] allow never reach this method.
    fn comm_init_rank(&self, init: &CommInit<'_>) -> Result<Comm>;
    /// Completes the communicator's outstanding operations (collective); `comm_destroy`
    /// follows.
    fn comm_finalize(&self, comm: Comm) -> Result<()>;
    /// Frees a communicator; an unknown handle is `INVALID_HANDLE`.
    fn comm_destroy(&self, comm: Comm) -> Result<()>;
    /// Fails every pending operation of the communicator (its peers' waits end with an error
    /// within their timeout) and frees it.
    fn comm_abort(&self, comm: Comm) -> Result<()>;
    /// The communicator's asynchronous error: `SUCCESS` if none, `NOT_READY` while it is
    /// still being set up, else the failure (`PEER_FAILURE`, `ABORTED`, `TIMEOUT`, …).
    fn comm_async_error(&self, comm: Comm) -> Result<Status>;
    /// Number of ranks.
    fn comm_count(&self, comm: Comm) -> Result<i32>;
    /// This process's rank, `0..comm_count`.
    fn comm_user_rank(&self, comm: Comm) -> Result<i32>;
    /// The device (of the paired device adaptor) the communicator was made on.
    fn comm_device(&self, comm: Comm) -> Result<i32>;
    /// `recv[i]` = `op` over the ranks of `send[i]`, `count` elements of `dtype`; `send ==
    /// recv` is in place. Enqueued on `stream`; returns at once.
    fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// `recv[r*count..]` = rank `r`'s `count` elements of `send`.
    fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// Reduce-scatter.
    fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// Broadcast.
    fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// Reduce to a root.
    fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// Gather to a root.
    fn gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// Scatter from a root.
    fn scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// All-to-all with equal blocks.
    fn all_to_all(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// All-to-all with per-peer counts.
    fn all_to_allv(
        &self,
        send: DevicePtr,
        send_v: VCounts<'_>,
        recv: DevicePtr,
        recv_v: VCounts<'_>,
        dtype: DataType,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// Point-to-point send.
    fn send(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// Point-to-point receive.
    fn recv(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<()>;
    /// Starts a group.
    fn group_start(&self) -> Result<()>;
    /// Ends a group.
    fn group_end(&self) -> Result<()>;
    /// Allocates CCL-suited memory.
    fn mem_alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Frees memory from `mem_alloc`.
    fn mem_free(&self, ptr: DevicePtr) -> Result<()>;
    /// Registers a buffer.
    fn mem_register(&self, comm: Comm, buf: DevicePtr, bytes: usize) -> Result<RegHandle>;
    /// Releases a registration.
    fn mem_deregister(&self, comm: Comm, handle: RegHandle) -> Result<()>;
    /// Whether `entry` (an entry name of the CCL tables, e.g. `"window_register"`) works with
    /// the vendor library `init` loaded: `Ok(None)` when it does, `Ok(Some(reason))` when it
    /// does not (ABI 1.2's `query_support`). Called after `init`. The default says every entry
    /// works: override it only where support depends on the runtime (NCCL's windows need
    /// 2.27); the trampoline refuses a name that is not an entry before calling it.
    fn query_support(&self, entry: &str) -> Result<Option<String>> {
        let _ = entry;
        Ok(None)
    }
}

/// The window group (`ferrocx_ccl_window_v1`).
pub trait CclWindow: CclAdaptor {
    /// Registers a window (collective).
    fn window_register(
        &self,
        comm: Comm,
        buf: DevicePtr,
        bytes: usize,
        flags: u32,
    ) -> Result<WindowHandle>;
    /// Deregisters a window (collective).
    fn window_deregister(&self, comm: Comm, window: WindowHandle) -> Result<()>;
}

mod tramp {
    use super::*;

    fn nranks<A: CclAdaptor>(comm: Comm) -> Result<usize> {
        let n = A::instance().comm_count(comm)?;
        usize::try_from(n).map_err(|_| Error::internal(format!("comm_count returned {n}")))
    }

    /// # Safety
    /// Each pointer must be null or valid for `n` reads.
    unsafe fn counts<'a>(
        c: *const usize,
        d: *const usize,
        n: usize,
        what: &str,
    ) -> Result<VCounts<'a>> {
        if c.is_null() || d.is_null() {
            return Err(Error::invalid_argument(format!(
                "`{what}` counts or displacements are null"
            )));
        }
        // SAFETY: non-null, `n` elements by the caller's contract.
        Ok(unsafe {
            VCounts {
                counts: std::slice::from_raw_parts(c, n),
                displs: std::slice::from_raw_parts(d, n),
            }
        })
    }

    pub unsafe extern "C" fn init<A: CclAdaptor>(opts: *const KeyValue, n: usize) -> Status {
        call("init", || {
            // SAFETY: the caller passes `n` valid options.
            A::instance().init(&unsafe { Options::from_raw(opts, n) }?)
        })
    }
    pub unsafe extern "C" fn finalize<A: CclAdaptor>() -> Status {
        call("finalize", || A::instance().finalize())
    }
    pub unsafe extern "C" fn get_last_error() -> *const c_char {
        last_error_ptr()
    }
    pub unsafe extern "C" fn get_version<A: CclAdaptor>(out: *mut i32) -> Status {
        // SAFETY: `out` null or writable by the ABI's contract.
        call("get_version", || unsafe {
            write_out(out, "version", A::instance().version()?)
        })
    }
    pub unsafe extern "C" fn get_unique_id<A: CclAdaptor>(id: *mut u8, len: *mut usize) -> Status {
        guard("get_unique_id", || {
            if len.is_null() {
                return Err(Error::invalid_argument("`len` is null"));
            }
            let bytes = A::instance().unique_id()?;
            // SAFETY: `len` checked; `id` null or `*len` writable bytes.
            unsafe { write_bytes(id, len, &bytes) }
        })
    }
    pub unsafe extern "C" fn comm_init_rank<A: CclAdaptor>(
        args: *const CommInitArgs,
        out: *mut Comm,
    ) -> Status {
        call("comm_init_rank", || {
            if args.is_null() || out.is_null() {
                return Err(Error::invalid_argument("`args` or `comm` is null"));
            }
            // SAFETY: non-null; the caller's struct is at least `struct_size` bytes.
            let a = unsafe { &*args };
            if (a.struct_size as usize) < std::mem::size_of::<CommInitArgs>() {
                return Err(Error::invalid_argument(format!(
                    "`args.struct_size` {} is smaller than this plugin's CommInitArgs ({})",
                    a.struct_size,
                    std::mem::size_of::<CommInitArgs>()
                )));
            }
            let limits = A::LIMITS.abi();
            if a.nranks > 0 && !limits.allows_ranks(a.nranks as usize) {
                return Err(Error::new(
                    Status::UNSUPPORTED,
                    format!(
                        "a communicator of {} ranks: this adaptor claims at most {} (its LIMITS)",
                        a.nranks, limits.max_ranks
                    ),
                ));
            }
            let init = CommInit {
                rank: a.rank,
                nranks: a.nranks,
                device: a.device,
                // SAFETY: `unique_id_len` readable bytes by the ABI's contract.
                unique_id: unsafe { read_bytes(a.unique_id, a.unique_id_len, "unique_id") }?,
                timeout_ms: a.timeout_ms,
                // SAFETY: `n_options` valid options by the ABI's contract.
                options: unsafe { Options::from_raw(a.options, a.n_options) }?,
            };
            let comm = A::instance().comm_init_rank(&init)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "comm", comm) }
        })
    }
    pub unsafe extern "C" fn comm_finalize<A: CclAdaptor>(c: Comm) -> Status {
        call("comm_finalize", || A::instance().comm_finalize(c))
    }
    pub unsafe extern "C" fn comm_destroy<A: CclAdaptor>(c: Comm) -> Status {
        call("comm_destroy", || A::instance().comm_destroy(c))
    }
    pub unsafe extern "C" fn comm_abort<A: CclAdaptor>(c: Comm) -> Status {
        call("comm_abort", || A::instance().comm_abort(c))
    }
    pub unsafe extern "C" fn comm_get_async_error<A: CclAdaptor>(
        c: Comm,
        out: *mut Status,
    ) -> Status {
        // SAFETY: `out` null or writable.
        call("comm_get_async_error", || unsafe {
            write_out(out, "error", A::instance().comm_async_error(c)?)
        })
    }
    pub unsafe extern "C" fn comm_count<A: CclAdaptor>(c: Comm, out: *mut i32) -> Status {
        // SAFETY: `out` null or writable.
        call("comm_count", || unsafe {
            write_out(out, "count", A::instance().comm_count(c)?)
        })
    }
    pub unsafe extern "C" fn comm_user_rank<A: CclAdaptor>(c: Comm, out: *mut i32) -> Status {
        // SAFETY: `out` null or writable.
        call("comm_user_rank", || unsafe {
            write_out(out, "rank", A::instance().comm_user_rank(c)?)
        })
    }
    pub unsafe extern "C" fn comm_device<A: CclAdaptor>(c: Comm, out: *mut i32) -> Status {
        // SAFETY: `out` null or writable.
        call("comm_device", || unsafe {
            write_out(out, "device", A::instance().comm_device(c)?)
        })
    }
    pub unsafe extern "C" fn all_reduce<A: CclAdaptor>(
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        op: ReduceOp,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("all_reduce", || {
            A::LIMITS.claim("all_reduce", t, Some(op))?;
            A::instance().all_reduce(s, r, n, t, op, c, st)
        })
    }
    pub unsafe extern "C" fn all_gather<A: CclAdaptor>(
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("all_gather", || {
            A::LIMITS.claim("all_gather", t, None)?;
            A::instance().all_gather(s, r, n, t, c, st)
        })
    }
    pub unsafe extern "C" fn reduce_scatter<A: CclAdaptor>(
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        op: ReduceOp,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("reduce_scatter", || {
            A::LIMITS.claim("reduce_scatter", t, Some(op))?;
            A::instance().reduce_scatter(s, r, n, t, op, c, st)
        })
    }
    pub unsafe extern "C" fn broadcast<A: CclAdaptor>(
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        root: i32,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("broadcast", || {
            A::LIMITS.claim("broadcast", t, None)?;
            A::instance().broadcast(s, r, n, t, root, c, st)
        })
    }
    pub unsafe extern "C" fn reduce<A: CclAdaptor>(
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        op: ReduceOp,
        root: i32,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("reduce", || {
            A::LIMITS.claim("reduce", t, Some(op))?;
            A::instance().reduce(s, r, n, t, op, root, c, st)
        })
    }
    pub unsafe extern "C" fn gather<A: CclAdaptor>(
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        root: i32,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("gather", || {
            A::LIMITS.claim("gather", t, None)?;
            A::instance().gather(s, r, n, t, root, c, st)
        })
    }
    pub unsafe extern "C" fn scatter<A: CclAdaptor>(
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        root: i32,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("scatter", || {
            A::LIMITS.claim("scatter", t, None)?;
            A::instance().scatter(s, r, n, t, root, c, st)
        })
    }
    pub unsafe extern "C" fn all_to_all<A: CclAdaptor>(
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("all_to_all", || {
            A::LIMITS.claim("all_to_all", t, None)?;
            A::instance().all_to_all(s, r, n, t, c, st)
        })
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe extern "C" fn all_to_allv<A: CclAdaptor>(
        s: DevicePtr,
        sc: *const usize,
        sd: *const usize,
        r: DevicePtr,
        rc: *const usize,
        rd: *const usize,
        t: DataType,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("all_to_allv", || {
            A::LIMITS.claim("all_to_allv", t, None)?;
            let n = nranks::<A>(c)?;
            // SAFETY: the ABI requires `nranks` elements behind each array.
            let (sv, rv) = unsafe { (counts(sc, sd, n, "send")?, counts(rc, rd, n, "recv")?) };
            A::instance().all_to_allv(s, sv, r, rv, t, c, st)
        })
    }
    pub unsafe extern "C" fn send<A: CclAdaptor>(
        b: DevicePtr,
        n: usize,
        t: DataType,
        peer: i32,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("send", || {
            A::LIMITS.claim("send", t, None)?;
            A::instance().send(b, n, t, peer, c, st)
        })
    }
    pub unsafe extern "C" fn recv<A: CclAdaptor>(
        b: DevicePtr,
        n: usize,
        t: DataType,
        peer: i32,
        c: Comm,
        st: Stream,
    ) -> Status {
        call("recv", || {
            A::LIMITS.claim("recv", t, None)?;
            A::instance().recv(b, n, t, peer, c, st)
        })
    }
    pub unsafe extern "C" fn group_start<A: CclAdaptor>() -> Status {
        call("group_start", || A::instance().group_start())
    }
    pub unsafe extern "C" fn group_end<A: CclAdaptor>() -> Status {
        call("group_end", || A::instance().group_end())
    }
    pub unsafe extern "C" fn mem_alloc<A: CclAdaptor>(bytes: usize, out: *mut DevicePtr) -> Status {
        call("mem_alloc", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`ptr` is null"));
            }
            let p = A::instance().mem_alloc(bytes)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "ptr", p) }
        })
    }
    pub unsafe extern "C" fn mem_free<A: CclAdaptor>(p: DevicePtr) -> Status {
        call("mem_free", || A::instance().mem_free(p))
    }
    pub unsafe extern "C" fn mem_register<A: CclAdaptor>(
        c: Comm,
        b: DevicePtr,
        bytes: usize,
        out: *mut RegHandle,
    ) -> Status {
        call("mem_register", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`handle` is null"));
            }
            let h = A::instance().mem_register(c, b, bytes)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "handle", h) }
        })
    }
    pub unsafe extern "C" fn mem_deregister<A: CclAdaptor>(c: Comm, h: RegHandle) -> Status {
        call("mem_deregister", || A::instance().mem_deregister(c, h))
    }
    pub unsafe extern "C" fn query_support<A: CclAdaptor>(
        entry: *const c_char,
        supported: *mut i32,
        reason: *mut c_char,
        reason_len: usize,
    ) -> Status {
        use ferrocx::abi::AbiTable;
        call("query_support", || {
            if entry.is_null() || supported.is_null() {
                return Err(Error::invalid_argument("`entry` or `supported` is null"));
            }
            // SAFETY: non-null and NUL-terminated by the ABI's contract.
            let name = unsafe { std::ffi::CStr::from_ptr(entry) }.to_string_lossy();
            let known = CclAdaptorV1::entries()
                .iter()
                .chain(CclWindowV1::entries())
                .any(|(e, _)| *e == name);
            if !known {
                return Err(Error::invalid_argument(format!(
                    "{name:?} is not an entry of the CCL tables"
                )));
            }
            let answer = A::instance().query_support(&name)?;
            // SAFETY: checked non-null above; writable by the ABI's contract.
            unsafe { write_out(supported, "supported", i32::from(answer.is_none())) }?;
            if let (Some(why), false) = (answer, reason.is_null() || reason_len == 0) {
                let n = why.len().min(reason_len - 1);
                // SAFETY: `reason` holds `reason_len` > `n` writable bytes by the contract.
                unsafe {
                    std::ptr::copy_nonoverlapping(why.as_ptr().cast::<c_char>(), reason, n);
                    reason.add(n).write(0);
                }
            }
            Ok(())
        })
    }
    pub unsafe extern "C" fn get_limits<A: CclAdaptor>(out: *mut CclLimits) -> Status {
        call("get_limits", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`limits` is null"));
            }
            // SAFETY: non-null; the caller's struct holds at least `struct_size` bytes.
            let want = unsafe { (*out).struct_size } as usize;
            let n = want.min(std::mem::size_of::<CclLimits>());
            if n < 8 {
                return Err(Error::invalid_argument("`limits.struct_size` is too small"));
            }
            let full = A::LIMITS.abi();
            // Everything after the caller's own struct_size/reserved words, up to its size.
            // SAFETY: both ranges lie within their structs (n <= the size of either).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&full as *const CclLimits as *const u8).add(8),
                    (out as *mut u8).add(8),
                    n - 8,
                )
            };
            Ok(())
        })
    }
    pub unsafe extern "C" fn window_register<A: CclWindow>(
        c: Comm,
        b: DevicePtr,
        bytes: usize,
        flags: u32,
        out: *mut WindowHandle,
    ) -> Status {
        call("window_register", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`window` is null"));
            }
            let w = A::instance().window_register(c, b, bytes, flags)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "window", w) }
        })
    }
    pub unsafe extern "C" fn window_deregister<A: CclWindow>(c: Comm, w: WindowHandle) -> Status {
        call("window_deregister", || {
            A::instance().window_deregister(c, w)
        })
    }
}

/// Builds the CCL adaptor table of `A`. Entries named in `absent` (by entry name, e.g.
/// `get_version`, or by [`CclAdaptor`] method name, e.g. `version`) are exported as `None`. A
/// name that is neither fails compilation where the table is a `static`.
pub const fn ccl_table<A: CclAdaptor>(
    name: &'static std::ffi::CStr,
    absent: &[&str],
) -> CclAdaptorV1 {
    use crate::table::{CCL_ALIASES, CCL_ENTRIES};
    use tramp::*;
    crate::table::all_known(absent, CCL_ENTRIES, CCL_ALIASES);
    macro_rules! entry {
        ($f:ident) => {
            if crate::table::is_absent(absent, stringify!($f), CCL_ALIASES) {
                None
            } else {
                Some($f::<A>)
            }
        };
    }
    CclAdaptorV1 {
        header: AbiHeader::new::<CclAdaptorV1>(name),
        init: entry!(init),
        finalize: entry!(finalize),
        get_last_error: Some(get_last_error),
        get_version: entry!(get_version),
        get_unique_id: entry!(get_unique_id),
        comm_init_rank: entry!(comm_init_rank),
        comm_finalize: entry!(comm_finalize),
        comm_destroy: entry!(comm_destroy),
        comm_abort: entry!(comm_abort),
        comm_get_async_error: entry!(comm_get_async_error),
        comm_count: entry!(comm_count),
        comm_user_rank: entry!(comm_user_rank),
        comm_device: entry!(comm_device),
        all_reduce: entry!(all_reduce),
        all_gather: entry!(all_gather),
        reduce_scatter: entry!(reduce_scatter),
        broadcast: entry!(broadcast),
        reduce: entry!(reduce),
        gather: entry!(gather),
        scatter: entry!(scatter),
        all_to_all: entry!(all_to_all),
        all_to_allv: entry!(all_to_allv),
        send: entry!(send),
        recv: entry!(recv),
        group_start: entry!(group_start),
        group_end: entry!(group_end),
        mem_alloc: entry!(mem_alloc),
        mem_free: entry!(mem_free),
        mem_register: entry!(mem_register),
        mem_deregister: entry!(mem_deregister),
        query_support: entry!(query_support),
        get_limits: entry!(get_limits),
    }
}

/// Builds the window group table of `A`.
pub const fn window_table<A: CclWindow>(name: &'static std::ffi::CStr) -> CclWindowV1 {
    use tramp::*;
    CclWindowV1 {
        header: AbiHeader::new::<CclWindowV1>(name),
        window_register: Some(window_register::<A>),
        window_deregister: Some(window_deregister::<A>),
    }
}
