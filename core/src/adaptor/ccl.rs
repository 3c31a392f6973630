//! Safe calls through a CCL adaptor's table.

use std::sync::Arc;

use crate::abi::{Comm, CommInitArgs, DataType, DevicePtr, ReduceOp, Status, Stream};
use crate::caps::{CclCaps, RuntimeSupport, TableCaps, COLLECTIVES, RUNTIME_DEPENDENT};
use crate::loader::CclTables;

use super::device::last_error;
use super::error::AdaptorError;

/// A CCL adaptor, ready to call. Cheap to clone.
#[derive(Clone)]
pub struct Ccl {
    tables: Arc<CclTables>,
}

impl Ccl {
    /// Wraps checked tables.
    pub fn new(tables: Arc<CclTables>) -> Self {
        Ccl { tables }
    }

    /// The adaptor's name.
    pub fn name(&self) -> &str {
        self.tables.root.name()
    }

    /// The tables, for callers that dispatch themselves.
    pub fn tables(&self) -> &CclTables {
        &self.tables
    }

    #[inline]
    pub(crate) fn check(&self, op: &'static str, status: Status) -> Result<(), AdaptorError> {
        if status.is_success() {
            Ok(())
        } else {
            Err(self.failed(op, status))
        }
    }

    /// The error of a failed `op`, with the adaptor's message (out of line: the failure path).
    #[cold]
    #[inline(never)]
    fn failed(&self, op: &'static str, status: Status) -> AdaptorError {
        AdaptorError::Failed {
            adaptor: self.name().to_string(),
            op,
            status,
            message: last_error(self.tables.root.get().get_last_error),
        }
    }

    pub(crate) fn entry<T>(&self, op: &'static str, f: Option<T>) -> Result<T, AdaptorError> {
        f.ok_or_else(|| AdaptorError::Unsupported {
            adaptor: self.name().to_string(),
            op,
        })
    }

    /// `init` with no options.
    pub fn init(&self) -> Result<(), AdaptorError> {
        self.init_with(&[])
    }

    /// `init` with the configuration's options for this adaptor (e.g. NCCL's `library`).
    pub fn init_with(&self, options: &[(String, String)]) -> Result<(), AdaptorError> {
        let f = self.entry("init", self.tables.root.get().init)?;
        let opts = super::options::CallOptions::new(options);
        // SAFETY: `opts` and the strings it points to live across the call.
        let status = unsafe { f(opts.as_ptr(), opts.len()) };
        self.check("init", status)
    }

    /// The vendor library's version.
    pub fn version(&self) -> Result<i32, AdaptorError> {
        let f = self.entry("get_version", self.tables.root.get().get_version)?;
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        let status = unsafe { f(&mut v) };
        self.check("get_version", status)?;
        Ok(v)
    }

    /// A new unique id (variable length).
    pub fn unique_id(&self) -> Result<Vec<u8>, AdaptorError> {
        let f = self.entry("get_unique_id", self.tables.root.get().get_unique_id)?;
        let mut len = 0usize;
        // SAFETY: a null buffer queries the size into a valid `len`.
        let status = unsafe { f(std::ptr::null_mut(), &mut len) };
        self.check("get_unique_id", status)?;
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` holds `len` writable bytes.
        let status = unsafe { f(buf.as_mut_ptr(), &mut len) };
        self.check("get_unique_id", status)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Creates this rank's communicator from the unique id rank 0 made; collective.
    pub fn comm_init_rank(
        &self,
        rank: i32,
        nranks: i32,
        device: i32,
        unique_id: &[u8],
        timeout_ms: u64,
        options: &[(String, String)],
    ) -> Result<Comm, AdaptorError> {
        let f = self.entry("comm_init_rank", self.tables.root.get().comm_init_rank)?;
        let opts = super::options::CallOptions::new(options);
        let args = CommInitArgs {
            struct_size: std::mem::size_of::<CommInitArgs>() as u32,
            rank,
            nranks,
            device,
            unique_id: unique_id.as_ptr(),
            unique_id_len: unique_id.len(),
            timeout_ms,
            options: opts.as_ptr(),
            n_options: opts.len(),
        };
        let mut comm = Comm::NULL;
        // SAFETY: `args` and everything it points to live across the call; `comm` is writable.
        let status = unsafe { f(&args, &mut comm) };
        self.check("comm_init_rank", status)?;
        Ok(comm)
    }
}

/// Calls a CCL entry, turning `None` and failure statuses into errors.
macro_rules! ccl_call {
    ($self:ident, $op:ident ( $($arg:expr),* )) => {{
        let f = $self.entry(stringify!($op), $self.tables.root.get().$op)?;
        // SAFETY: the table was checked by the loader; the arguments follow the ABI's contract
        // for this entry (buffers valid until the operation completes on the stream).
        let status = unsafe { f($($arg),*) };
        $self.check(stringify!($op), status)
    }};
}

impl Ccl {
    /// Completes outstanding operations of `comm`.
    pub fn comm_finalize(&self, comm: Comm) -> Result<(), AdaptorError> {
        ccl_call!(self, comm_finalize(comm))
    }

    /// Frees `comm`.
    pub fn comm_destroy(&self, comm: Comm) -> Result<(), AdaptorError> {
        ccl_call!(self, comm_destroy(comm))
    }

    /// Fails every pending operation of `comm` and frees it.
    pub fn comm_abort(&self, comm: Comm) -> Result<(), AdaptorError> {
        ccl_call!(self, comm_abort(comm))
    }

    /// The asynchronous error of `comm` (`SUCCESS` if none).
    pub fn comm_async_error(&self, comm: Comm) -> Result<Status, AdaptorError> {
        let mut s = Status::SUCCESS;
        ccl_call!(self, comm_get_async_error(comm, &mut s))?;
        Ok(s)
    }

    /// Number of ranks of `comm`.
    pub fn comm_count(&self, comm: Comm) -> Result<i32, AdaptorError> {
        let mut n = 0;
        ccl_call!(self, comm_count(comm, &mut n))?;
        Ok(n)
    }

    /// This process's rank in `comm`.
    pub fn comm_user_rank(&self, comm: Comm) -> Result<i32, AdaptorError> {
        let mut r = 0;
        ccl_call!(self, comm_user_rank(comm, &mut r))?;
        Ok(r)
    }

    /// All-reduce of `count` elements.
    ///
    /// # Safety
    ///
    /// `send` is readable and `recv` writable for `count` elements of `dtype`
    /// ([valid ranges](crate::adaptor#valid-ranges)) until the operation completes on `stream`: not
    /// freed, and written (or, for `recv`, read) by nothing else in that time. `send == recv` is
    /// the in-place form; the ranges overlap in no other way.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(self, all_reduce(send, recv, count, dtype, op, comm, stream))
    }

    /// All-gather of `send_count` elements per rank.
    ///
    /// # Safety
    ///
    /// `send` is readable for `send_count` and `recv` writable for `send_count * nranks` elements
    /// of `dtype` ([valid ranges](crate::adaptor#valid-ranges)) until the operation completes on
    /// `stream`: not freed, and written (or, for `recv`, read) by nothing else in that time.
    /// `send == recv` is the in-place form; the ranges overlap in no other way.
    pub unsafe fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(
            self,
            all_gather(send, recv, send_count, dtype, comm, stream)
        )
    }

    /// Reduce-scatter of `recv_count` elements per rank.
    ///
    /// # Safety
    ///
    /// `send` is readable for `recv_count * nranks` and `recv` writable for `recv_count` elements
    /// of `dtype` ([valid ranges](crate::adaptor#valid-ranges)) until the operation completes on
    /// `stream`: not freed, and written (or, for `recv`, read) by nothing else in that time.
    /// `send == recv` is the in-place form; the ranges overlap in no other way.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(
            self,
            reduce_scatter(send, recv, recv_count, dtype, op, comm, stream)
        )
    }

    /// Broadcast from `root`.
    ///
    /// # Safety
    ///
    /// `recv` is writable for `count` elements of `dtype`, and on `root` `send` is readable for as
    /// many ([valid ranges](crate::adaptor#valid-ranges)) until the operation completes on
    /// `stream`: not freed, and written (or, for `recv`, read) by nothing else in that time.
    /// `send == recv` is the in-place form; the ranges overlap in no other way.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(
            self,
            broadcast(send, recv, count, dtype, root, comm, stream)
        )
    }

    /// Reduce to `root`.
    ///
    /// # Safety
    ///
    /// `send` is readable for `count` elements of `dtype`, and on `root` `recv` is writable for as
    /// many ([valid ranges](crate::adaptor#valid-ranges)) until the operation completes on
    /// `stream`: not freed, and written (or, for `recv`, read) by nothing else in that time.
    /// `send == recv` is the in-place form; the ranges overlap in no other way.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(
            self,
            reduce(send, recv, count, dtype, op, root, comm, stream)
        )
    }

    /// Gather to `root`.
    ///
    /// # Safety
    ///
    /// `send` is readable for `send_count` elements of `dtype`, and on `root` `recv` is writable
    /// for `send_count * nranks` ([valid ranges](crate::adaptor#valid-ranges)) until the operation
    /// completes on `stream`: not freed, and written (or, for `recv`, read) by nothing else in that
    /// time. `send == recv` is the in-place form; the ranges overlap in no other way.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(
            self,
            gather(send, recv, send_count, dtype, root, comm, stream)
        )
    }

    /// Scatter from `root`.
    ///
    /// # Safety
    ///
    /// `recv` is writable for `recv_count` elements of `dtype`, and on `root` `send` is readable
    /// for `recv_count * nranks` ([valid ranges](crate::adaptor#valid-ranges)) until the operation
    /// completes on `stream`: not freed, and written (or, for `recv`, read) by nothing else in that
    /// time. `send == recv` is the in-place form; the ranges overlap in no other way.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        root: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(
            self,
            scatter(send, recv, recv_count, dtype, root, comm, stream)
        )
    }

    /// All-to-all with `count` elements per peer.
    ///
    /// # Safety
    ///
    /// `send` is readable and `recv` writable for `count * nranks` elements of `dtype`
    /// ([valid ranges](crate::adaptor#valid-ranges)) until the operation completes on `stream`: not
    /// freed, and written (or, for `recv`, read) by nothing else in that time. `send == recv` is
    /// the in-place form; the ranges overlap in no other way.
    pub unsafe fn all_to_all(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(self, all_to_all(send, recv, count, dtype, comm, stream))
    }

    /// All-to-all with per-peer counts and displacements (elements; one entry per rank).
    ///
    /// # Safety
    ///
    /// For every rank `r`, `send` is readable for `send_counts[r]` elements of `dtype` from element
    /// `send_displs[r]`, and `recv` writable for `recv_counts[r]` from element `recv_displs[r]`
    /// ([valid ranges](crate::adaptor#valid-ranges)) until the operation completes on `stream`: not
    /// freed, and written (or, for `recv`, read) by nothing else in that time. `send == recv` is
    /// the in-place form; the ranges overlap in no other way.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_allv(
        &self,
        send: DevicePtr,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: DevicePtr,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        let n = self.comm_count(comm)? as usize;
        for (what, v) in [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ] {
            if v.len() != n {
                return Err(AdaptorError::Failed {
                    adaptor: self.name().to_string(),
                    op: "all_to_allv",
                    status: Status::INVALID_ARGUMENT,
                    message: format!("{what} has {} entries, the communicator {n} ranks", v.len()),
                });
            }
        }
        ccl_call!(
            self,
            all_to_allv(
                send,
                send_counts.as_ptr(),
                send_displs.as_ptr(),
                recv,
                recv_counts.as_ptr(),
                recv_displs.as_ptr(),
                dtype,
                comm,
                stream
            )
        )
    }

    /// Sends `count` elements to `peer`.
    ///
    /// # Safety
    ///
    /// `buf` is readable for `count` elements of `dtype`
    /// ([valid ranges](crate::adaptor#valid-ranges)) until the operation completes on `stream`: not
    /// freed, and written by nothing else in that time.
    pub unsafe fn send(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(self, send(buf, count, dtype, peer, comm, stream))
    }

    /// Receives `count` elements from `peer`.
    ///
    /// # Safety
    ///
    /// `buf` is writable for `count` elements of `dtype`
    /// ([valid ranges](crate::adaptor#valid-ranges)) until the operation completes on `stream`: not
    /// freed, and used by nothing else in that time.
    pub unsafe fn recv(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: i32,
        comm: Comm,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        ccl_call!(self, recv(buf, count, dtype, peer, comm, stream))
    }

    /// Starts a group.
    pub fn group_start(&self) -> Result<(), AdaptorError> {
        ccl_call!(self, group_start())
    }

    /// Ends a group and issues its operations.
    pub fn group_end(&self) -> Result<(), AdaptorError> {
        ccl_call!(self, group_end())
    }
}

impl Ccl {
    /// The adaptor's capabilities: its tables' entries, the collectives, point-to-point, group,
    /// registration and window entries present, and the runtime support of
    /// [`crate::caps::RUNTIME_DEPENDENT`] entries from `query_support`. Probed once, after
    /// `init` (a probe whose queries fail, as before `init`, is not kept).
    pub fn caps(&self) -> Arc<CclCaps> {
        self.tables.caps.get_or_probe(|| self.probe_caps())
    }

    /// The adaptor's declared limits (`get_limits`, ABI 1.3): the most ranks, the data types
    /// and the reductions it claims. A table without the entry (older minors) has no limits:
    /// [`CclLimits::NONE`](crate::abi::CclLimits::NONE). Callable before `init`.
    pub fn limits(&self) -> Result<crate::abi::CclLimits, AdaptorError> {
        let mut limits = crate::abi::CclLimits::NONE;
        let Some(f) = self.tables.root.get().get_limits else {
            return Ok(limits);
        };
        // SAFETY: the table was checked by the loader; `limits` is a live struct whose
        // `struct_size` says how much the adaptor may write.
        let status = unsafe { f(&mut limits) };
        self.check("get_limits", status)?;
        limits.struct_size = std::mem::size_of::<crate::abi::CclLimits>() as u32;
        limits.reserved = 0;
        Ok(limits)
    }

    fn probe_caps(&self) -> (CclCaps, bool) {
        let root = TableCaps::of(&self.tables.root);
        let window = self.tables.window.as_ref().map(TableCaps::of);
        let both = |t: &TableCaps, a: &str, b: &str| t.has(a) && t.has(b);
        let mut complete = true;
        let runtime = RUNTIME_DEPENDENT
            .iter()
            .map(|&entry| {
                let (support, answered) = self.query_support(entry);
                complete &= answered;
                (entry, support)
            })
            .collect();
        let caps = CclCaps {
            adaptor: self.name().to_string(),
            version: self.version().ok(),
            collectives: COLLECTIVES
                .iter()
                .copied()
                .filter(|c| root.has(c))
                .collect(),
            p2p: both(&root, "send", "recv"),
            group: both(&root, "group_start", "group_end"),
            registration: both(&root, "mem_register", "mem_deregister"),
            windows: window
                .as_ref()
                .is_some_and(|w| both(w, "window_register", "window_deregister")),
            limits: self.limits().unwrap_or_default(),
            root,
            window,
            runtime,
        };
        (caps, complete)
    }

    /// Whether `entry` works with the loaded vendor library, and whether the adaptor answered:
    /// absent is [`RuntimeSupport::Absent`]; present in a table without `query_support` (ABI
    /// 1.1) is supported; otherwise the adaptor's answer.
    fn query_support(&self, entry: &'static str) -> (RuntimeSupport, bool) {
        let present = match entry {
            "window_register" => self
                .tables
                .window
                .as_ref()
                .is_some_and(|w| w.get().window_register.is_some()),
            _ => self.tables.root.present().contains(&entry),
        };
        if !present {
            return (RuntimeSupport::Absent, true);
        }
        let Some(f) = self.tables.root.get().query_support else {
            return (RuntimeSupport::Supported, true);
        };
        let Ok(name) = std::ffi::CString::new(entry) else {
            return (RuntimeSupport::Supported, true);
        };
        let mut supported = 0i32;
        let mut reason = [0 as std::ffi::c_char; 512];
        // SAFETY: a NUL-terminated name, a writable flag, and `reason.len()` writable bytes.
        let status = unsafe {
            f(
                name.as_ptr(),
                &mut supported,
                reason.as_mut_ptr(),
                reason.len(),
            )
        };
        match self.check("query_support", status) {
            Ok(()) if supported != 0 => (RuntimeSupport::Supported, true),
            Ok(()) => {
                let bytes: Vec<u8> = reason
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                let why = String::from_utf8_lossy(&bytes).into_owned();
                (RuntimeSupport::Unsupported(why), true)
            }
            // The adaptor cannot answer yet (before its `init`, NCCL has no library to ask): the
            // table's presence stands, as for a table without the query, and the answer is not
            // kept, so the probe after `init` asks again.
            Err(e) => {
                tracing::debug!(
                    entry,
                    "query_support: {e}; taking the entry as supported until asked again"
                );
                (RuntimeSupport::Supported, false)
            }
        }
    }

    /// [`CclCaps::runtime`] of [`Ccl::caps`]: `(entry, support)` for `window_register` and
    /// `mem_register`, from the adaptor's `query_support` (never by calling the entries).
    pub fn runtime_support(&self) -> Vec<(&'static str, RuntimeSupport)> {
        self.caps().runtime.clone()
    }
}
