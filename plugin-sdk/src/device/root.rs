//! The device adaptor itself (`ferrocx_device_adaptor_v1`): its trait, the values its methods
//! return, and the trampolines that build its table.

use std::ffi::{c_char, c_void};

use ferrocx::abi::{
    AbiHeader, Capabilities, DeviceAdaptorV1, DeviceProperties, DevicePtr, Event, HostFn, KeyValue,
    MemKind, Status, Stream,
};

use crate::boundary::{call, guard, read_bytes, write_bytes, write_out};
use crate::error::{last_error_ptr, Error, Result};
use crate::options::Options;

/// What `get_properties` reports for one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Properties {
    /// Vendor name (at most 31 bytes are kept).
    pub vendor: String,
    /// Device name (at most 63 bytes are kept).
    pub name: String,
    /// Capability bits.
    pub capabilities: Capabilities,
    /// Device memory in bytes (0 when unknown).
    pub total_memory: u64,
    /// Vendor architecture number (0 when not applicable).
    pub arch: u32,
    /// Devices visible to this process.
    pub device_count: i32,
}

/// What `mem_get_info` reports for the current device, in bytes (ABI 1.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes that can still be allocated.
    pub free: usize,
    /// Bytes of memory the device has in all.
    pub total: usize,
}

/// A host function and its argument, to be called once in stream order.
#[derive(Debug)]
pub struct HostCall {
    func: unsafe extern "C" fn(user: *mut c_void),
    user: *mut c_void,
}

// SAFETY: the ABI requires a host function to be callable from the adaptor's worker thread
// with its `user` pointer; ownership of that contract is the enqueuer's.
unsafe impl Send for HostCall {}

impl HostCall {
    /// Wraps a function and its argument.
    pub fn new(func: unsafe extern "C" fn(user: *mut c_void), user: *mut c_void) -> Self {
        HostCall { func, user }
    }

    /// Calls the function.
    pub fn run(self) {
        // SAFETY: the enqueuer guaranteed `func(user)` is sound to call once, on any thread.
        unsafe { (self.func)(self.user) }
    }
}

/// The device adaptor (`ferrocx_device_adaptor_v1`). Every method is required: return
/// [`Error::unsupported`] for what the device cannot do at run time, or export the method as
/// absent (`device_absent: [method, …]` in [`export_plugin!`](crate::export_plugin)) for what
/// it never does.
///
/// # The contract every method keeps
///
/// - **Threads.** Any method may be called from any thread, concurrently; keep state behind
///   `Mutex`/atomics. The device a thread works on is per thread (`set_device`).
/// - **Before `init`.** A call before a successful `init` either works (a device with nothing to
///   initialise) or fails with `Status::NOT_INITIALIZED` and a message; it never crashes.
///   `finalize` ends what `init` started; after it, only `init` may follow.
/// - **Streams.** A null [`Stream`] (`Stream::NULL`) is the default stream: every method that
///   takes a stream accepts it, work on it runs in order, and `stream_synchronize(NULL)` waits
///   for it. It is never destroyed.
/// - **Errors.** Return an [`Error`] whose status says what went wrong: `INVALID_ARGUMENT` for a
///   bad value (a zero size, an unknown kind or flag, a null address), `INVALID_HANDLE` for a
///   handle or pointer this adaptor did not give out (or already released), `OUT_OF_MEMORY`,
///   `NOT_READY` where named below, `UNSUPPORTED` only for what depends on the runtime. The
///   message is what `get_last_error` reports: name the argument and the value.
/// - **Panics** never cross the boundary: the SDK turns one into `INTERNAL_ERROR` with the
///   panic's message.
pub trait DeviceAdaptor: Send + Sync + Sized + 'static {
    /// The process-wide instance (see [`crate::singleton!`]).
    fn instance() -> &'static Self;
    /// Initialises the adaptor with the configuration's options (`[cluster.options.<name>]`).
    /// Called once per process before anything else; a second call after success may return
    /// `Ok` again. Load the runtime here, not in a constructor.
    fn init(&self, options: &Options) -> Result<()>;
    /// Releases everything the adaptor holds (memory, streams, events it still has). No call
    /// but `init` follows it.
    fn finalize(&self) -> Result<()>;
    /// Number of devices visible to this process (at least 0).
    fn device_count(&self) -> Result<i32>;
    /// Selects the device the calling thread works on (`0..device_count`); a device out of
    /// range is `INVALID_ARGUMENT`. Allocations, streams and events are made on it.
    fn set_device(&self, device: i32) -> Result<()>;
    /// The device the calling thread works on (0 until `set_device`).
    fn get_device(&self) -> Result<i32>;
    /// Vendor, name, capability bits, memory and architecture of `device` (out of range:
    /// `INVALID_ARGUMENT`). Set a [`Capabilities`] bit only when the entries it promises work
    /// (`HOST_FUNC` with `launch_host_func`, `TIMED_EVENTS` with `event_elapsed_ms`, …): the
    /// conformance kit checks each bit against the table.
    fn properties(&self, device: i32) -> Result<Properties>;
    /// Allocates `bytes` of memory of `kind` on the current device: `DEVICE` (device memory),
    /// `HOST` (pageable host memory) or `PINNED` (page-locked host memory the device reaches
    /// directly). A zero size or an unknown kind is `INVALID_ARGUMENT`; a kind the runtime
    /// does not offer is `UNSUPPORTED`. Addresses are unified: any address works in
    /// `mem_copy`, whichever kind it is.
    fn mem_alloc(&self, bytes: usize, kind: MemKind) -> Result<DevicePtr>;
    /// Frees memory from `mem_alloc`, given with the kind it was allocated with. The null
    /// pointer is a no-op. A pointer this adaptor did not allocate (or already freed) is
    /// `INVALID_HANDLE`; a live allocation freed with another kind is `INVALID_ARGUMENT` (or
    /// `INVALID_HANDLE`) and stays allocated (it is freed later with its own kind).
    fn mem_free(&self, ptr: DevicePtr, kind: MemKind) -> Result<()>;
    /// Copies `bytes` from `src` to `dst` (any two addresses: device or host) and returns when
    /// the copy is done. A null address with a non-zero size is `INVALID_ARGUMENT`.
    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    /// Enqueues a copy on `stream` (null: the default stream) and returns at once; it runs in
    /// stream order. The buffers stay the caller's to keep alive until it has run.
    fn mem_copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> Result<()>;
    /// Sets `bytes` bytes at `dst` to `value` and returns when done.
    fn mem_set(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()>;
    /// Enqueues a memset on `stream` (null: the default stream); returns at once.
    fn mem_set_async(&self, dst: DevicePtr, value: u8, bytes: usize, stream: Stream) -> Result<()>;
    /// Creates a stream: `flags` 0 (blocking: it waits for the default stream, as CUDA's) or 1
    /// (non-blocking); other flags are `INVALID_ARGUMENT`. Never returns the null handle.
    fn stream_create(&self, flags: u32) -> Result<Stream>;
    /// Wraps a stream created by another library (a `CUstream`): the wrapper is a stream of
    /// this adaptor; destroying it does not destroy the native stream.
    fn stream_wrap(&self, native: *mut c_void) -> Result<Stream>;
    /// Destroys a stream once the work enqueued on it has completed (it returns at once). The
    /// null (default) stream or an unknown handle is `INVALID_HANDLE`.
    fn stream_destroy(&self, stream: Stream) -> Result<()>;
    /// Blocks until all work enqueued on `stream` (null: the default stream) before this call
    /// has completed; returns the first failure of that work, if any (sticky until reported).
    fn stream_synchronize(&self, stream: Stream) -> Result<()>;
    /// `true` when all work on `stream` has completed (the trampoline answers `SUCCESS`),
    /// `false` while some is pending (`NOT_READY`).
    fn stream_query(&self, stream: Stream) -> Result<bool>;
    /// Makes work enqueued on `stream` after this call wait for the most recent record of
    /// `event` made before this call (a later re-record does not change it). An event never
    /// recorded counts as complete: the wait does not wait.
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()>;
    /// Creates an event; `flags` bit 0 disables timing (such an event has no time for
    /// `event_elapsed_ms`). An event never recorded is complete.
    fn event_create(&self, flags: u32) -> Result<Event>;
    /// Destroys an event (a pending record still completes); an unknown handle is
    /// `INVALID_HANDLE`.
    fn event_destroy(&self, event: Event) -> Result<()>;
    /// Records `event` at the current end of `stream` (null: the default stream); a later
    /// record replaces the earlier one for later queries and waits.
    fn event_record(&self, event: Event, stream: Stream) -> Result<()>;
    /// Blocks until the most recent record of `event` has completed (at once if never
    /// recorded).
    fn event_synchronize(&self, event: Event) -> Result<()>;
    /// `true` when the most recent record has completed (or there is none), `false` while it
    /// is pending (`NOT_READY`).
    fn event_query(&self, event: Event) -> Result<bool>;
    /// Milliseconds from the completion of `start`'s most recent record to `end`'s (negative
    /// when `end` came first). An event created with timing disabled or never recorded is
    /// `INVALID_ARGUMENT` (CUDA says `INVALID_HANDLE`; both are accepted); a record not yet
    /// completed is `NOT_READY`.
    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32>;
    /// Enqueues a host function on `stream` (null: the default stream): it runs once, on a
    /// thread of the adaptor's choosing, after the work before it and before the work after
    /// it. Returns once enqueued; the function may enqueue more work itself.
    fn launch_host_func(&self, stream: Stream, call: HostCall) -> Result<()>;
    /// Exports an allocation (its base address) for another process of the same host: the
    /// bytes are a handle that process gives to `ipc_import`. A kind that cannot be exported
    /// is `UNSUPPORTED`.
    fn ipc_export(&self, ptr: DevicePtr) -> Result<Vec<u8>>;
    /// Maps an allocation exported by another process; the address is released with
    /// `ipc_close` (never `mem_free`). A malformed handle is `INVALID_ARGUMENT`.
    fn ipc_import(&self, handle: &[u8]) -> Result<DevicePtr>;
    /// Unmaps an address from `ipc_import`.
    fn ipc_close(&self, ptr: DevicePtr) -> Result<()>;
    /// Bytes free and in total on the calling thread's device, like `cuMemGetInfo` (ABI 1.1).
    fn mem_get_info(&self) -> Result<MemInfo>;
}

fn copy_c_str<const N: usize>(dst: &mut [c_char; N], s: &str) {
    let bytes = s.as_bytes();
    let n = bytes.len().min(N - 1);
    for (d, b) in dst.iter_mut().zip(&bytes[..n]) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

/// The trampolines of [`DeviceAdaptorV1`], generic over the adaptor.
mod tramp {
    use super::*;

    pub unsafe extern "C" fn init<A: DeviceAdaptor>(opts: *const KeyValue, n: usize) -> Status {
        call("init", || {
            // SAFETY: the caller passes `n` valid options.
            A::instance().init(&unsafe { Options::from_raw(opts, n) }?)
        })
    }
    pub unsafe extern "C" fn finalize<A: DeviceAdaptor>() -> Status {
        call("finalize", || A::instance().finalize())
    }
    pub unsafe extern "C" fn get_last_error() -> *const c_char {
        last_error_ptr()
    }
    pub unsafe extern "C" fn device_count<A: DeviceAdaptor>(out: *mut i32) -> Status {
        // SAFETY: `out` is null or writable by the ABI's contract.
        call("device_count", || unsafe {
            write_out(out, "count", A::instance().device_count()?)
        })
    }
    pub unsafe extern "C" fn set_device<A: DeviceAdaptor>(device: i32) -> Status {
        call("set_device", || A::instance().set_device(device))
    }
    pub unsafe extern "C" fn get_device<A: DeviceAdaptor>(out: *mut i32) -> Status {
        // SAFETY: as above.
        call("get_device", || unsafe {
            write_out(out, "device", A::instance().get_device()?)
        })
    }
    pub unsafe extern "C" fn get_properties<A: DeviceAdaptor>(
        device: i32,
        out: *mut DeviceProperties,
    ) -> Status {
        call("get_properties", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`props` is null"));
            }
            let p = A::instance().properties(device)?;
            let mut full = DeviceProperties::default();
            copy_c_str(&mut full.vendor, &p.vendor);
            copy_c_str(&mut full.name, &p.name);
            full.capabilities = p.capabilities;
            full.total_memory = p.total_memory;
            full.arch = p.arch;
            full.device_count = p.device_count;
            // SAFETY: `out` is non-null and holds at least `struct_size` bytes the caller owns.
            let want = unsafe { (*out).struct_size } as usize;
            let n = want.min(std::mem::size_of::<DeviceProperties>());
            if n < 8 {
                return Err(Error::invalid_argument("`props.struct_size` is too small"));
            }
            // Copy everything after the caller's own struct_size/reserved words, up to its size.
            // SAFETY: both ranges are within their structs (n <= size of either).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&full as *const DeviceProperties as *const u8).add(8),
                    (out as *mut u8).add(8),
                    n - 8,
                )
            };
            Ok(())
        })
    }
    pub unsafe extern "C" fn mem_alloc<A: DeviceAdaptor>(
        bytes: usize,
        kind: MemKind,
        out: *mut DevicePtr,
    ) -> Status {
        call("mem_alloc", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`ptr` is null"));
            }
            let p = A::instance().mem_alloc(bytes, kind)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "ptr", p) }
        })
    }
    pub unsafe extern "C" fn mem_free<A: DeviceAdaptor>(ptr: DevicePtr, kind: MemKind) -> Status {
        call("mem_free", || A::instance().mem_free(ptr, kind))
    }
    pub unsafe extern "C" fn mem_copy<A: DeviceAdaptor>(
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Status {
        call("mem_copy", || A::instance().mem_copy(dst, src, bytes))
    }
    pub unsafe extern "C" fn mem_copy_async<A: DeviceAdaptor>(
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> Status {
        call("mem_copy_async", || {
            A::instance().mem_copy_async(dst, src, bytes, stream)
        })
    }
    pub unsafe extern "C" fn mem_set<A: DeviceAdaptor>(
        dst: DevicePtr,
        v: u8,
        bytes: usize,
    ) -> Status {
        call("mem_set", || A::instance().mem_set(dst, v, bytes))
    }
    pub unsafe extern "C" fn mem_set_async<A: DeviceAdaptor>(
        dst: DevicePtr,
        v: u8,
        bytes: usize,
        stream: Stream,
    ) -> Status {
        call("mem_set_async", || {
            A::instance().mem_set_async(dst, v, bytes, stream)
        })
    }
    pub unsafe extern "C" fn stream_create<A: DeviceAdaptor>(
        flags: u32,
        out: *mut Stream,
    ) -> Status {
        call("stream_create", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`stream` is null"));
            }
            let s = A::instance().stream_create(flags)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "stream", s) }
        })
    }
    pub unsafe extern "C" fn stream_wrap<A: DeviceAdaptor>(
        native: *mut c_void,
        out: *mut Stream,
    ) -> Status {
        call("stream_wrap", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`stream` is null"));
            }
            let s = A::instance().stream_wrap(native)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "stream", s) }
        })
    }
    pub unsafe extern "C" fn stream_destroy<A: DeviceAdaptor>(s: Stream) -> Status {
        call("stream_destroy", || A::instance().stream_destroy(s))
    }
    pub unsafe extern "C" fn stream_synchronize<A: DeviceAdaptor>(s: Stream) -> Status {
        call("stream_synchronize", || A::instance().stream_synchronize(s))
    }
    pub unsafe extern "C" fn stream_query<A: DeviceAdaptor>(s: Stream) -> Status {
        guard("stream_query", || Ok(ready(A::instance().stream_query(s)?)))
    }
    pub unsafe extern "C" fn stream_wait_event<A: DeviceAdaptor>(s: Stream, e: Event) -> Status {
        call("stream_wait_event", || {
            A::instance().stream_wait_event(s, e)
        })
    }
    pub unsafe extern "C" fn event_create<A: DeviceAdaptor>(flags: u32, out: *mut Event) -> Status {
        call("event_create", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`event` is null"));
            }
            let e = A::instance().event_create(flags)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "event", e) }
        })
    }
    pub unsafe extern "C" fn event_destroy<A: DeviceAdaptor>(e: Event) -> Status {
        call("event_destroy", || A::instance().event_destroy(e))
    }
    pub unsafe extern "C" fn event_record<A: DeviceAdaptor>(e: Event, s: Stream) -> Status {
        call("event_record", || A::instance().event_record(e, s))
    }
    pub unsafe extern "C" fn event_synchronize<A: DeviceAdaptor>(e: Event) -> Status {
        call("event_synchronize", || A::instance().event_synchronize(e))
    }
    pub unsafe extern "C" fn event_query<A: DeviceAdaptor>(e: Event) -> Status {
        guard("event_query", || Ok(ready(A::instance().event_query(e)?)))
    }
    pub unsafe extern "C" fn event_elapsed_ms<A: DeviceAdaptor>(
        a: Event,
        b: Event,
        ms: *mut f32,
    ) -> Status {
        call("event_elapsed_ms", || {
            if ms.is_null() {
                return Err(Error::invalid_argument("`ms` is null"));
            }
            let v = A::instance().event_elapsed_ms(a, b)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(ms, "ms", v) }
        })
    }
    pub unsafe extern "C" fn launch_host_func<A: DeviceAdaptor>(
        s: Stream,
        func: HostFn,
        user: *mut c_void,
    ) -> Status {
        call("launch_host_func", || {
            let func = func.ok_or_else(|| Error::invalid_argument("`func` is null"))?;
            A::instance().launch_host_func(s, HostCall::new(func, user))
        })
    }
    pub unsafe extern "C" fn ipc_export<A: DeviceAdaptor>(
        ptr: DevicePtr,
        handle: *mut u8,
        len: *mut usize,
    ) -> Status {
        guard("ipc_export", || {
            if len.is_null() {
                return Err(Error::invalid_argument("`len` is null"));
            }
            let h = A::instance().ipc_export(ptr)?;
            // SAFETY: `len` checked; `handle` null or `*len` bytes by the ABI's contract.
            unsafe { write_bytes(handle, len, &h) }
        })
    }
    pub unsafe extern "C" fn ipc_import<A: DeviceAdaptor>(
        handle: *const u8,
        len: usize,
        out: *mut DevicePtr,
    ) -> Status {
        call("ipc_import", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`ptr` is null"));
            }
            // SAFETY: `len` readable bytes by the ABI's contract.
            let h = unsafe { read_bytes(handle, len, "handle") }?;
            let p = A::instance().ipc_import(h)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "ptr", p) }
        })
    }
    pub unsafe extern "C" fn ipc_close<A: DeviceAdaptor>(ptr: DevicePtr) -> Status {
        call("ipc_close", || A::instance().ipc_close(ptr))
    }
    pub unsafe extern "C" fn mem_get_info<A: DeviceAdaptor>(
        free: *mut usize,
        total: *mut usize,
    ) -> Status {
        call("mem_get_info", || {
            if free.is_null() || total.is_null() {
                return Err(Error::invalid_argument("`free` or `total` is null"));
            }
            let info = A::instance().mem_get_info()?;
            // SAFETY: both checked non-null above; writable by the ABI's contract.
            unsafe {
                write_out(free, "free", info.free)?;
                write_out(total, "total", info.total)
            }
        })
    }

    fn ready(done: bool) -> Status {
        if done {
            Status::SUCCESS
        } else {
            Status::NOT_READY
        }
    }
}

/// Builds the device adaptor table of `A`. Entries named in `absent` (by entry name, e.g.
/// `get_properties`, or by [`DeviceAdaptor`] method name, e.g. `properties`) are exported as
/// `None` (not supported) instead of a trampoline. A name that is neither fails compilation
/// where the table is a `static`.
pub const fn device_table<A: DeviceAdaptor>(
    name: &'static std::ffi::CStr,
    absent: &[&str],
) -> DeviceAdaptorV1 {
    use crate::table::{DEVICE_ALIASES, DEVICE_ENTRIES};
    use tramp::*;
    crate::table::all_known(absent, DEVICE_ENTRIES, DEVICE_ALIASES);
    macro_rules! entry {
        ($f:ident) => {
            if crate::table::is_absent(absent, stringify!($f), DEVICE_ALIASES) {
                None
            } else {
                Some($f::<A>)
            }
        };
    }
    DeviceAdaptorV1 {
        header: AbiHeader::new::<DeviceAdaptorV1>(name),
        init: entry!(init),
        finalize: entry!(finalize),
        get_last_error: Some(get_last_error),
        device_count: entry!(device_count),
        set_device: entry!(set_device),
        get_device: entry!(get_device),
        get_properties: entry!(get_properties),
        mem_alloc: entry!(mem_alloc),
        mem_free: entry!(mem_free),
        mem_copy: entry!(mem_copy),
        mem_copy_async: entry!(mem_copy_async),
        mem_set: entry!(mem_set),
        mem_set_async: entry!(mem_set_async),
        stream_create: entry!(stream_create),
        stream_wrap: entry!(stream_wrap),
        stream_destroy: entry!(stream_destroy),
        stream_synchronize: entry!(stream_synchronize),
        stream_query: entry!(stream_query),
        stream_wait_event: entry!(stream_wait_event),
        event_create: entry!(event_create),
        event_destroy: entry!(event_destroy),
        event_record: entry!(event_record),
        event_synchronize: entry!(event_synchronize),
        event_query: entry!(event_query),
        event_elapsed_ms: entry!(event_elapsed_ms),
        launch_host_func: entry!(launch_host_func),
        ipc_export: entry!(ipc_export),
        ipc_import: entry!(ipc_import),
        ipc_close: entry!(ipc_close),
        mem_get_info: entry!(mem_get_info),
    }
}
