//! The CCL adaptor table and its optional window group.
//!
//! Buffers are [`DevicePtr`]s of the cluster's device adaptor and streams are that adaptor's
//! [`Stream`] handles, passed through unchanged: a CCL is always paired with a device adaptor
//! that understands its memory and streams (NCCL with CUDA, host with host).

use std::ffi::c_char;

use super::header::AbiHeader;
use super::types::{
    Comm, DataType, DevicePtr, KeyValue, ReduceOp, RegHandle, Status, Stream, WindowHandle,
};

/// Arguments of `comm_init_rank`. The caller sets `struct_size`; the adaptor reads no field past
/// it, so later minors can append fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommInitArgs {
    /// `sizeof(CommInitArgs)` as the caller compiled it.
    pub struct_size: u32,
    /// This process's rank in the communicator, `0..nranks`.
    pub rank: i32,
    /// Number of ranks.
    pub nranks: i32,
    /// Device (of the paired device adaptor) the communicator uses.
    pub device: i32,
    /// Bytes from rank 0's `get_unique_id`, identical on every rank.
    pub unique_id: *const u8,
    /// Length of `unique_id`.
    pub unique_id_len: usize,
    /// Deadline for any wait on a peer, in milliseconds (0: the adaptor's default).
    pub timeout_ms: u64,
    /// The cluster's options for this adaptor.
    pub options: *const KeyValue,
    /// Number of `options`.
    pub n_options: usize,
}

/// What a CCL adaptor claims to support, from `get_limits` (*since ABI 1.3*). Outside these
/// limits the adaptor may refuse a call (with `UNSUPPORTED` or `INVALID_ARGUMENT`); callers
/// (the core, the conformance kit) treat what lies outside as "not claimed", not as a failure.
///
/// The caller sets `struct_size` and fills every field with "no limit" ([`CclLimits::NONE`])
/// before the call; the adaptor writes no byte past the caller's `struct_size`, so later minors
/// can append fields. A table without `get_limits` (ABI 1.0 to 1.2, or an adaptor without
/// limits) has no limits.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CclLimits {
    /// Set by the caller: `sizeof(CclLimits)` as it was compiled.
    pub struct_size: u32,
    /// Zero.
    pub reserved: u32,
    /// The most ranks a communicator may have; 0 means no limit.
    pub max_ranks: u64,
    /// The data types the collectives accept: bit `d` set when `DataType(d)` is supported
    /// (`1 << FERROCX_F32 | ...`); all ones means every type, this build's and later ones.
    pub dtypes: u64,
    /// The reductions accepted: bit `o` set when `ReduceOp(o)` is supported; all ones means
    /// every reduction.
    pub reduce_ops: u64,
}

impl CclLimits {
    /// No limits: what the caller fills in, and what a table without `get_limits` means.
    pub const NONE: CclLimits = CclLimits {
        struct_size: std::mem::size_of::<CclLimits>() as u32,
        reserved: 0,
        max_ranks: 0,
        dtypes: u64::MAX,
        reduce_ops: u64::MAX,
    };

    /// `true` when a communicator of `nranks` ranks is within the limits.
    pub fn allows_ranks(&self, nranks: usize) -> bool {
        self.max_ranks == 0 || nranks as u64 <= self.max_ranks
    }

    /// `true` when `dtype` is claimed.
    pub fn allows_dtype(&self, dtype: DataType) -> bool {
        dtype.0 < 64 && self.dtypes & (1 << dtype.0) != 0
    }

    /// `true` when `op` is claimed.
    pub fn allows_op(&self, op: ReduceOp) -> bool {
        op.0 < 64 && self.reduce_ops & (1 << op.0) != 0
    }

    /// `true` when nothing is limited.
    pub fn is_none(&self) -> bool {
        self.max_ranks == 0 && self.dtypes == u64::MAX && self.reduce_ops == u64::MAX
    }
}

impl Default for CclLimits {
    fn default() -> Self {
        CclLimits::NONE
    }
}

/// The CCL adaptor table, exported as `ferrocx_ccl_adaptor_v1`.
///
/// Collectives are asynchronous on `stream` (NCCL semantics): they return once enqueued.
/// Counts are in elements of `dtype`. `send == recv` means in place.
///
/// Fields are only ever appended, one minor at a time: ABI 1.0 and 1.1 end at `mem_deregister`
/// (`struct_size` = `offsetof(query_support)`), ABI 1.2 adds `query_support`, ABI 1.3 adds
/// `get_limits`.
#[repr(C)]
pub struct CclAdaptorV1 {
    /// Header: magic, ABI version, `sizeof` this table, adaptor name.
    pub header: AbiHeader,

    /// Initialises the adaptor with the configuration's options. Called once before anything else.
    pub init: Option<unsafe extern "C" fn(options: *const KeyValue, n_options: usize) -> Status>,
    /// Releases everything the adaptor holds.
    pub finalize: Option<unsafe extern "C" fn() -> Status>,
    /// The message of the last failed call on this thread; never null.
    pub get_last_error: Option<unsafe extern "C" fn() -> *const c_char>,
    /// The vendor library's version (NCCL: `major*10000 + minor*100 + patch`).
    pub get_version: Option<unsafe extern "C" fn(version: *mut i32) -> Status>,
    /// Creates a unique id on the root rank. `id` receives at most `*len` bytes and `*len` is set
    /// to the id's size; a null `id` (or a too-small `*len`: `BUFFER_TOO_SMALL`) queries the size.
    pub get_unique_id: Option<unsafe extern "C" fn(id: *mut u8, len: *mut usize) -> Status>,

    /// Creates this rank's communicator; collective over all ranks.
    pub comm_init_rank:
        Option<unsafe extern "C" fn(args: *const CommInitArgs, comm: *mut Comm) -> Status>,
    /// Completes outstanding operations; collective.
    pub comm_finalize: Option<unsafe extern "C" fn(comm: Comm) -> Status>,
    /// Frees the communicator's resources.
    pub comm_destroy: Option<unsafe extern "C" fn(comm: Comm) -> Status>,
    /// Stops every pending operation of the communicator with an error and frees it.
    pub comm_abort: Option<unsafe extern "C" fn(comm: Comm) -> Status>,
    /// Writes the communicator's asynchronous error (`SUCCESS` if none, `NOT_READY` while
    /// initialising).
    pub comm_get_async_error:
        Option<unsafe extern "C" fn(comm: Comm, error: *mut Status) -> Status>,
    /// Number of ranks.
    pub comm_count: Option<unsafe extern "C" fn(comm: Comm, count: *mut i32) -> Status>,
    /// This process's rank.
    pub comm_user_rank: Option<unsafe extern "C" fn(comm: Comm, rank: *mut i32) -> Status>,
    /// The device the communicator uses.
    pub comm_device: Option<unsafe extern "C" fn(comm: Comm, device: *mut i32) -> Status>,

    /// `recv[i] = op over ranks of send[i]`, `count` elements.
    pub all_reduce: Option<
        unsafe extern "C" fn(
            send: DevicePtr,
            recv: DevicePtr,
            count: usize,
            dtype: DataType,
            op: ReduceOp,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// `recv[r*send_count..]` = rank r's `send`.
    pub all_gather: Option<
        unsafe extern "C" fn(
            send: DevicePtr,
            recv: DevicePtr,
            send_count: usize,
            dtype: DataType,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// `recv` = this rank's block (of `recv_count`) of the reduction of every rank's `send`.
    pub reduce_scatter: Option<
        unsafe extern "C" fn(
            send: DevicePtr,
            recv: DevicePtr,
            recv_count: usize,
            dtype: DataType,
            op: ReduceOp,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// `recv` = root's `send` on every rank.
    pub broadcast: Option<
        unsafe extern "C" fn(
            send: DevicePtr,
            recv: DevicePtr,
            count: usize,
            dtype: DataType,
            root: i32,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// Root's `recv` = reduction of every rank's `send`.
    pub reduce: Option<
        unsafe extern "C" fn(
            send: DevicePtr,
            recv: DevicePtr,
            count: usize,
            dtype: DataType,
            op: ReduceOp,
            root: i32,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// Root's `recv[r*send_count..]` = rank r's `send`.
    pub gather: Option<
        unsafe extern "C" fn(
            send: DevicePtr,
            recv: DevicePtr,
            send_count: usize,
            dtype: DataType,
            root: i32,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// Rank r's `recv` = root's `send[r*recv_count..]`.
    pub scatter: Option<
        unsafe extern "C" fn(
            send: DevicePtr,
            recv: DevicePtr,
            recv_count: usize,
            dtype: DataType,
            root: i32,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// Block `r` of `send` goes to rank r; block `r` of `recv` comes from rank r; blocks of
    /// `count` elements.
    pub all_to_all: Option<
        unsafe extern "C" fn(
            send: DevicePtr,
            recv: DevicePtr,
            count: usize,
            dtype: DataType,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// As `all_to_all` with per-peer counts and displacements (host arrays of `nranks` elements,
    /// in elements).
    pub all_to_allv: Option<
        unsafe extern "C" fn(
            send: DevicePtr,
            send_counts: *const usize,
            send_displs: *const usize,
            recv: DevicePtr,
            recv_counts: *const usize,
            recv_displs: *const usize,
            dtype: DataType,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// Sends `count` elements to `peer`.
    pub send: Option<
        unsafe extern "C" fn(
            buf: DevicePtr,
            count: usize,
            dtype: DataType,
            peer: i32,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// Receives `count` elements from `peer`.
    pub recv: Option<
        unsafe extern "C" fn(
            buf: DevicePtr,
            count: usize,
            dtype: DataType,
            peer: i32,
            comm: Comm,
            stream: Stream,
        ) -> Status,
    >,
    /// Starts a group: operations until `group_end` are issued together.
    pub group_start: Option<unsafe extern "C" fn() -> Status>,
    /// Ends a group and issues its operations.
    pub group_end: Option<unsafe extern "C" fn() -> Status>,

    /// Allocates memory suited to the CCL (NCCL: `ncclMemAlloc`).
    pub mem_alloc: Option<unsafe extern "C" fn(bytes: usize, ptr: *mut DevicePtr) -> Status>,
    /// Frees memory from `mem_alloc`.
    pub mem_free: Option<unsafe extern "C" fn(ptr: DevicePtr) -> Status>,
    /// Registers a buffer with the communicator for faster collectives.
    pub mem_register: Option<
        unsafe extern "C" fn(
            comm: Comm,
            buf: DevicePtr,
            bytes: usize,
            handle: *mut RegHandle,
        ) -> Status,
    >,
    /// Releases a registration.
    pub mem_deregister: Option<unsafe extern "C" fn(comm: Comm, handle: RegHandle) -> Status>,

    /// Whether an entry whose support depends on the vendor library `init` loaded works with
    /// it: `entry` is the entry's name, NUL-terminated (`"window_register"`, `"mem_register"`);
    /// `*supported` is set to 1 or 0, and when 0 the reason (NUL-terminated, truncated to fit)
    /// is written to `reason` if it is non-null and `reason_len` > 0. Called after `init`, only
    /// for entries the tables provide (an absent entry is the only other "unsupported"); an
    /// entry whose support does not depend on the runtime is answered 1; a name that is not an
    /// entry of the CCL tables is `INVALID_ARGUMENT`. *Since ABI 1.2*: for an older table,
    /// every present entry is supported.
    pub query_support: Option<
        unsafe extern "C" fn(
            entry: *const c_char,
            supported: *mut i32,
            reason: *mut c_char,
            reason_len: usize,
        ) -> Status,
    >,

    /// The adaptor's declared limits: the most ranks a communicator may have, the data types
    /// and the reductions its collectives accept (see [`CclLimits`]). The caller fills
    /// `limits` with [`CclLimits::NONE`] and its `struct_size` first; the adaptor overwrites
    /// what it limits, writing no byte past `struct_size`. A static declaration: callable
    /// before `init`, the same answer every time. *Since ABI 1.3*: an older table (or a table
    /// leaving this `None`) has no limits.
    pub get_limits: Option<unsafe extern "C" fn(limits: *mut CclLimits) -> Status>,
}

/// Optional group `ferrocx_ccl_window_v1`: the CCL's own window registration.
#[repr(C)]
pub struct CclWindowV1 {
    /// Header: magic, ABI version, `sizeof` this table, adaptor name.
    pub header: AbiHeader,
    /// Registers `bytes` at `buf` as a window; collective over the communicator. An adaptor
    /// may require `buf` to come from its `mem_alloc` (NCCL registers windows only over
    /// `ncclMemAlloc` or VMM memory). Where the loaded vendor library may lack window
    /// registration (NCCL before 2.27), the adaptor answers the CCL table's `query_support`
    /// for `"window_register"`; the core asks that after `init` and never calls this entry
    /// to find out.
    pub window_register: Option<
        unsafe extern "C" fn(
            comm: Comm,
            buf: DevicePtr,
            bytes: usize,
            flags: u32,
            window: *mut WindowHandle,
        ) -> Status,
    >,
    /// Deregisters a window; collective.
    pub window_deregister: Option<unsafe extern "C" fn(comm: Comm, window: WindowHandle) -> Status>,
}
