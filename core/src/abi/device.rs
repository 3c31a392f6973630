//! The device adaptor table and its optional groups (VMM, flat mapping, multicast, graphs,
//! kernels).
//!
//! The device adaptor is process-wide, like the CUDA runtime: `init` once, then `set_device`
//! selects the device the calling thread works on.

use std::ffi::{c_char, c_void};

use super::header::AbiHeader;
use super::types::{
    Capabilities, DevicePtr, Event, FunctionHandle, GraphHandle, HostFn, ImageFormat, KeyValue,
    McHandle, MemKind, ModuleHandle, Status, Stream, VmmHandle,
};

/// Properties of one device, filled by `get_properties`.
///
/// The caller sets `struct_size` to the size it knows; the adaptor writes no byte past it, so the
/// struct can grow in later minors.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeviceProperties {
    /// Set by the caller: `sizeof(DeviceProperties)` as it was compiled.
    pub struct_size: u32,
    /// Zero.
    pub reserved: u32,
    /// Vendor name, NUL-terminated (`"NVIDIA"`, `"host"`).
    pub vendor: [c_char; 32],
    /// Device name, NUL-terminated (`"NVIDIA H200"`).
    pub name: [c_char; 64],
    /// [`Capabilities`] bits.
    pub capabilities: Capabilities,
    /// Device memory in bytes (0 when unknown).
    pub total_memory: u64,
    /// Vendor's architecture number (CUDA: major*10+minor), 0 when not applicable.
    pub arch: u32,
    /// Devices visible to this process.
    pub device_count: i32,
}

impl Default for DeviceProperties {
    fn default() -> Self {
        DeviceProperties {
            struct_size: std::mem::size_of::<DeviceProperties>() as u32,
            reserved: 0,
            vendor: [0; 32],
            name: [0; 64],
            capabilities: Capabilities(0),
            total_memory: 0,
            arch: 0,
            device_count: 0,
        }
    }
}

/// The device adaptor table, exported as `ferrocx_device_adaptor_v1`.
///
/// Every entry returns a [`Status`]; on failure `get_last_error` returns the message on the
/// calling thread. A `None` entry means the operation is not supported.
///
/// The contract of every entry:
/// - Entries may be called from any thread, concurrently. The current device is per thread.
/// - Before a successful `init`, an entry either works or returns `NOT_INITIALIZED` (with a
///   message); it never crashes.
/// - A null `Stream` is the default stream: every entry that takes a stream accepts it, work
///   enqueued on it runs in order, `stream_synchronize(NULL)` waits for it; it is never
///   destroyed.
/// - A handle or pointer the adaptor did not give out, or already released, is
///   `INVALID_HANDLE`; a bad value (zero size, unknown kind or flag, null address) is
///   `INVALID_ARGUMENT`. `UNSUPPORTED` from a present entry means "not at run time" (the
///   runtime lacks it); what the adaptor never does is a `NULL` entry.
///
/// Fields are only ever appended, one minor at a time: ABI 1.0 ends at `ipc_close`
/// (`struct_size` = `offsetof(mem_get_info)`), ABI 1.1 adds `mem_get_info`.
#[repr(C)]
pub struct DeviceAdaptorV1 {
    /// Header: magic, ABI version, `sizeof` this table, adaptor name.
    pub header: AbiHeader,

    /// Initialises the adaptor with the configuration's options. Called once before anything
    /// else; an entry called before it works or returns `NOT_INITIALIZED`.
    pub init: Option<unsafe extern "C" fn(options: *const KeyValue, n_options: usize) -> Status>,
    /// Releases everything the adaptor holds. No call follows it but `init`.
    pub finalize: Option<unsafe extern "C" fn() -> Status>,
    /// The message of the last failed call on this thread (static or thread-local storage, valid
    /// until the next call on this thread); never null.
    pub get_last_error: Option<unsafe extern "C" fn() -> *const c_char>,
    /// Number of devices visible to this process.
    pub device_count: Option<unsafe extern "C" fn(count: *mut i32) -> Status>,
    /// Selects the device the calling thread works on.
    pub set_device: Option<unsafe extern "C" fn(device: i32) -> Status>,
    /// The device the calling thread works on.
    pub get_device: Option<unsafe extern "C" fn(device: *mut i32) -> Status>,
    /// Vendor, name and capabilities of a device.
    pub get_properties:
        Option<unsafe extern "C" fn(device: i32, props: *mut DeviceProperties) -> Status>,

    /// Allocates `bytes` of memory of `kind` on the current device.
    pub mem_alloc:
        Option<unsafe extern "C" fn(bytes: usize, kind: MemKind, ptr: *mut DevicePtr) -> Status>,
    /// Frees memory from `mem_alloc` of the same kind (a null `ptr` does nothing). A pointer
    /// not allocated (or already freed) is `INVALID_HANDLE`; a live allocation given with
    /// another kind is `INVALID_ARGUMENT` (or `INVALID_HANDLE`) and stays allocated.
    pub mem_free: Option<unsafe extern "C" fn(ptr: DevicePtr, kind: MemKind) -> Status>,
    /// Copies `bytes` between any two addresses; returns when the copy is done.
    pub mem_copy:
        Option<unsafe extern "C" fn(dst: DevicePtr, src: DevicePtr, bytes: usize) -> Status>,
    /// Enqueues a copy on `stream` (null: the default stream); returns once enqueued.
    pub mem_copy_async: Option<
        unsafe extern "C" fn(
            dst: DevicePtr,
            src: DevicePtr,
            bytes: usize,
            stream: Stream,
        ) -> Status,
    >,
    /// Sets `bytes` bytes to `value`; returns when done.
    pub mem_set: Option<unsafe extern "C" fn(dst: DevicePtr, value: u8, bytes: usize) -> Status>,
    /// Enqueues a memset on `stream` (null: the default stream); returns once enqueued.
    pub mem_set_async: Option<
        unsafe extern "C" fn(dst: DevicePtr, value: u8, bytes: usize, stream: Stream) -> Status,
    >,

    /// Creates a stream (`flags`: 0 = default, 1 = non-blocking).
    pub stream_create: Option<unsafe extern "C" fn(flags: u32, stream: *mut Stream) -> Status>,
    /// Wraps a stream created by another library (a `CUstream`); destroying the wrapper does not
    /// destroy the native stream.
    pub stream_wrap:
        Option<unsafe extern "C" fn(native: *mut c_void, stream: *mut Stream) -> Status>,
    /// Destroys a stream after the work enqueued on it completes (returns at once). The null
    /// (default) stream cannot be destroyed: `INVALID_HANDLE`.
    pub stream_destroy: Option<unsafe extern "C" fn(stream: Stream) -> Status>,
    /// Blocks until all work enqueued on `stream` (null: the default stream) has completed;
    /// returns the first failure of that work, if any.
    pub stream_synchronize: Option<unsafe extern "C" fn(stream: Stream) -> Status>,
    /// `SUCCESS` when all work on `stream` has completed, `NOT_READY` otherwise.
    pub stream_query: Option<unsafe extern "C" fn(stream: Stream) -> Status>,
    /// Makes future work on `stream` wait for the most recent record of `event` made before this
    /// call (CUDA semantics: a later re-record does not affect this wait).
    pub stream_wait_event: Option<unsafe extern "C" fn(stream: Stream, event: Event) -> Status>,

    /// Creates an event (`flags`: bit 0 = disable timing). An event never recorded counts as
    /// complete (queries, synchronizes and waits on it return at once).
    pub event_create: Option<unsafe extern "C" fn(flags: u32, event: *mut Event) -> Status>,
    /// Destroys an event.
    pub event_destroy: Option<unsafe extern "C" fn(event: Event) -> Status>,
    /// Records `event` at the current end of `stream`.
    pub event_record: Option<unsafe extern "C" fn(event: Event, stream: Stream) -> Status>,
    /// Blocks until the most recent record of `event` has completed.
    pub event_synchronize: Option<unsafe extern "C" fn(event: Event) -> Status>,
    /// `SUCCESS` when the most recent record has completed, `NOT_READY` otherwise.
    pub event_query: Option<unsafe extern "C" fn(event: Event) -> Status>,
    /// Milliseconds between two completed records of timing events (negative when `end`
    /// completed first). An event created with timing disabled, or never recorded, is
    /// `INVALID_ARGUMENT` or `INVALID_HANDLE` (CUDA's); a record not completed yet is
    /// `NOT_READY`.
    pub event_elapsed_ms:
        Option<unsafe extern "C" fn(start: Event, end: Event, ms: *mut f32) -> Status>,

    /// Enqueues a host function on `stream`; it runs once, in stream order.
    pub launch_host_func:
        Option<unsafe extern "C" fn(stream: Stream, func: HostFn, user: *mut c_void) -> Status>,

    /// Exports an allocation for another process. `handle` receives at most `*len` bytes and
    /// `*len` is set to the handle's size; a null `handle` (or a too-small `*len`, which returns
    /// `BUFFER_TOO_SMALL`) queries the size.
    pub ipc_export:
        Option<unsafe extern "C" fn(ptr: DevicePtr, handle: *mut u8, len: *mut usize) -> Status>,
    /// Opens a handle exported by another process.
    pub ipc_import:
        Option<unsafe extern "C" fn(handle: *const u8, len: usize, ptr: *mut DevicePtr) -> Status>,
    /// Closes a pointer from `ipc_import`.
    pub ipc_close: Option<unsafe extern "C" fn(ptr: DevicePtr) -> Status>,

    /// Bytes of device memory free and in total on the calling thread's current device, as
    /// `cuMemGetInfo` reports them; both pointers must be non-null. *Since ABI 1.1*: a 1.0 table
    /// ends before this field, so it reads as absent there.
    pub mem_get_info: Option<unsafe extern "C" fn(free: *mut usize, total: *mut usize) -> Status>,
}

/// Optional group `ferrocx_device_vmm_v1`: exportable physical allocations.
#[repr(C)]
pub struct DeviceVmmV1 {
    /// Header: magic, ABI version, `sizeof` this table, adaptor name.
    pub header: AbiHeader,
    /// Allocation granularity of `device` in bytes; sizes are rounded up to it.
    pub vmm_granularity: Option<unsafe extern "C" fn(device: i32, bytes: *mut usize) -> Status>,
    /// Allocates `bytes` of exportable physical memory on the current device.
    pub vmm_alloc: Option<unsafe extern "C" fn(bytes: usize, handle: *mut VmmHandle) -> Status>,
    /// Exports an allocation as a POSIX file descriptor owned by the caller.
    pub vmm_export_fd: Option<unsafe extern "C" fn(handle: VmmHandle, fd: *mut i32) -> Status>,
    /// Imports an allocation of `bytes` from a file descriptor (the fd stays the caller's).
    pub vmm_import_fd:
        Option<unsafe extern "C" fn(fd: i32, bytes: usize, handle: *mut VmmHandle) -> Status>,
    /// Releases an allocation or an imported handle (memory is freed once unmapped everywhere).
    pub vmm_release: Option<unsafe extern "C" fn(handle: VmmHandle) -> Status>,
}

/// Optional group `ferrocx_device_flatmap_v1`: peers mapped into one virtual range.
#[repr(C)]
pub struct DeviceFlatMapV1 {
    /// Header: magic, ABI version, `sizeof` this table, adaptor name.
    pub header: AbiHeader,
    /// Reserves `bytes` of virtual address space.
    pub flat_reserve: Option<unsafe extern "C" fn(bytes: usize, base: *mut DevicePtr) -> Status>,
    /// Maps `handle` at `base + index * size` with read/write access for the current device.
    pub flat_map: Option<
        unsafe extern "C" fn(
            base: DevicePtr,
            index: usize,
            size: usize,
            handle: VmmHandle,
        ) -> Status,
    >,
    /// Unmaps the slot at `base + index * size`.
    pub flat_unmap:
        Option<unsafe extern "C" fn(base: DevicePtr, index: usize, size: usize) -> Status>,
    /// Releases a reservation whose slots are all unmapped.
    pub flat_release: Option<unsafe extern "C" fn(base: DevicePtr, bytes: usize) -> Status>,
}

/// Optional group `ferrocx_device_multicast_v1`: one store reaching every device, a load
/// reducing over all of them. The core calls it only when policy allows (see DESIGN.md).
#[repr(C)]
pub struct DeviceMulticastV1 {
    /// Header: magic, ABI version, `sizeof` this table, adaptor name.
    pub header: AbiHeader,
    /// Writes 1 to `supported` when `device` can take part in multicast objects.
    pub mc_supported: Option<unsafe extern "C" fn(device: i32, supported: *mut i32) -> Status>,
    /// Creates a multicast object of `bytes` for `num_devices` devices.
    pub mc_create:
        Option<unsafe extern "C" fn(bytes: usize, num_devices: i32, mc: *mut McHandle) -> Status>,
    /// Exports a multicast object as a POSIX file descriptor.
    pub mc_export_fd: Option<unsafe extern "C" fn(mc: McHandle, fd: *mut i32) -> Status>,
    /// Imports a multicast object from a file descriptor.
    pub mc_import_fd:
        Option<unsafe extern "C" fn(fd: i32, bytes: usize, mc: *mut McHandle) -> Status>,
    /// Adds a device of this process to the object.
    pub mc_add_device: Option<unsafe extern "C" fn(mc: McHandle, device: i32) -> Status>,
    /// Binds `bytes` of a VMM allocation (from `mem_offset`) at `mc_offset` of the object.
    pub mc_bind: Option<
        unsafe extern "C" fn(
            mc: McHandle,
            mc_offset: usize,
            mem: VmmHandle,
            mem_offset: usize,
            bytes: usize,
        ) -> Status,
    >,
    /// Maps the object into this process's address space.
    pub mc_map:
        Option<unsafe extern "C" fn(mc: McHandle, bytes: usize, ptr: *mut DevicePtr) -> Status>,
    /// Unmaps a mapping from `mc_map`.
    pub mc_unmap: Option<unsafe extern "C" fn(ptr: DevicePtr, bytes: usize) -> Status>,
    /// Unbinds the memory bound at `mc_offset` for `device`.
    pub mc_unbind: Option<
        unsafe extern "C" fn(mc: McHandle, device: i32, mc_offset: usize, bytes: usize) -> Status,
    >,
    /// Releases the object.
    pub mc_release: Option<unsafe extern "C" fn(mc: McHandle) -> Status>,
}

/// Optional group `ferrocx_device_graph_v1`: work captured from a stream into a graph that is
/// launched again as one unit (CUDA graphs), which takes the host's per-call cost out of
/// repeated sequences of operations.
///
/// Between `graph_begin_capture` and `graph_end_capture`, work enqueued on the stream by this
/// thread (through this adaptor or a CCL paired with it) is recorded, not run. A capture that
/// fails must still be ended, which discards it.
#[repr(C)]
pub struct DeviceGraphV1 {
    /// Header: magic, ABI version, `sizeof` this table, adaptor name.
    pub header: AbiHeader,
    /// Starts recording the work enqueued on `stream` (which must not be capturing already).
    pub graph_begin_capture: Option<unsafe extern "C" fn(stream: Stream) -> Status>,
    /// Ends the capture of `stream` and writes the executable graph of what was recorded to
    /// `graph`; the caller owns it (`graph_destroy`). On failure nothing is written and the
    /// stream is no longer capturing.
    pub graph_end_capture:
        Option<unsafe extern "C" fn(stream: Stream, graph: *mut GraphHandle) -> Status>,
    /// Enqueues one run of `graph` on `stream`.
    pub graph_launch: Option<unsafe extern "C" fn(graph: GraphHandle, stream: Stream) -> Status>,
    /// Destroys a graph; launches already enqueued complete first.
    pub graph_destroy: Option<unsafe extern "C" fn(graph: GraphHandle) -> Status>,
}

/// How a kernel is launched: the grid, the block, dynamic shared memory and the arguments. Read
/// by the kernel group's `launch_kernel`. *Since ABI 1.2.*
///
/// The caller sets `struct_size`; the adaptor reads no byte past it, so later minors can
/// append fields (a field past a caller's `struct_size` takes its zero default).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelLaunch {
    /// Set by the caller: `sizeof(KernelLaunch)` as it was compiled.
    pub struct_size: u32,
    /// Zero.
    pub reserved: u32,
    /// Blocks in x, y, z; each at least 1.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z; each at least 1.
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub shared_mem_bytes: u32,
    /// Zero (room for launch flags).
    pub flags: u32,
    /// One pointer per kernel parameter, in order, each to a value of that parameter's type
    /// (CUDA's `kernelParams`); the adaptor copies the values before `launch_kernel` returns.
    pub args: *mut *mut c_void,
    /// Number of `args` (the kernel's parameter count).
    pub n_args: usize,
}

impl Default for KernelLaunch {
    fn default() -> Self {
        KernelLaunch {
            struct_size: std::mem::size_of::<KernelLaunch>() as u32,
            reserved: 0,
            grid: [1; 3],
            block: [1; 3],
            shared_mem_bytes: 0,
            flags: 0,
            args: std::ptr::null_mut(),
            n_args: 0,
        }
    }
}

/// Optional group `ferrocx_device_kernel_v1`: device code loaded from an image and launched on
/// a stream (CUDA's `cuModuleLoadData`, `cuModuleGetFunction`, `cuLaunchKernel`). *Since ABI
/// 1.2*: a plugin of an older minor does not export it.
///
/// Modules belong to the device current on the calling thread when they are loaded; their
/// functions launch on streams of that device. A caller learns which image formats a device
/// loads from `kernel_image_formats` (so it needs no vendor-name check).
#[repr(C)]
pub struct DeviceKernelV1 {
    /// Header: magic, ABI version, `sizeof` this table, adaptor name.
    pub header: AbiHeader,
    /// The image formats `device` loads, best first. `formats` receives at most `*len` values
    /// and `*len` is set to their number; a null `formats` (or a too-small `*len`:
    /// `BUFFER_TOO_SMALL`) queries the number.
    pub kernel_image_formats: Option<
        unsafe extern "C" fn(device: i32, formats: *mut ImageFormat, len: *mut usize) -> Status,
    >,
    /// Loads the `bytes` of `image`, of `format`, onto the calling thread's current device. An
    /// image the device cannot run (another architecture, a format it does not load) is
    /// refused with `INVALID_ARGUMENT` and the reason; the image is not used after the call.
    pub module_load: Option<
        unsafe extern "C" fn(
            image: *const u8,
            bytes: usize,
            format: ImageFormat,
            module: *mut ModuleHandle,
        ) -> Status,
    >,
    /// Unloads a module; its functions are invalid afterwards. Launches already enqueued
    /// complete first.
    pub module_unload: Option<unsafe extern "C" fn(module: ModuleHandle) -> Status>,
    /// Looks up the function `name` (NUL-terminated, the symbol's name in the image) of a
    /// loaded module; an unknown name is `INVALID_ARGUMENT`.
    pub module_get_function: Option<
        unsafe extern "C" fn(
            module: ModuleHandle,
            name: *const c_char,
            function: *mut FunctionHandle,
        ) -> Status,
    >,
    /// Enqueues one run of `function` on `stream` as `launch` describes. The arguments must
    /// match the kernel's parameters in number, order and type: the adaptor cannot check them.
    pub launch_kernel: Option<
        unsafe extern "C" fn(
            function: FunctionHandle,
            launch: *const KernelLaunch,
            stream: Stream,
        ) -> Status,
    >,
}

/// `flags` of `stream_wait_value32`: wait until `(int32_t)(*addr - value) >= 0`, the
/// comparison with wrap-around of CUDA's `CU_STREAM_WAIT_VALUE_GEQ` (a counter that wrapped
/// past `u32::MAX` is still "at or past" a value a little below it). *Since ABI 1.3.*
pub const WAIT_VALUE_GEQ: u32 = 0;
/// `flags` of `stream_wait_value32`: wait until `*addr == value`. *Since ABI 1.3.*
pub const WAIT_VALUE_EQ: u32 = 1;

/// Optional group `ferrocx_device_memops_v1`: 32-bit stores and waits on host memory, in stream
/// order (CUDA's `cuStreamWriteValue32` and `cuStreamWaitValue32`). *Since ABI 1.3*: a plugin
/// of an older minor does not export it.
///
/// They let one stream (or one device, or another process) signal another without the host
/// thread in between: a producer stream writes a flag or counter when its work is done, a
/// consumer stream waits for it before its own. `addr` is host memory the host can read and
/// write: for the host device, any host memory; for a GPU, pinned or registered host memory
/// (page-locked, mapped for the device). It must be 4-byte aligned.
#[repr(C)]
pub struct DeviceMemOpsV1 {
    /// Header: magic, ABI version, `sizeof` this table, adaptor name.
    pub header: AbiHeader,
    /// Enqueues on `stream` (null: the default stream) a store of `value` to the 32-bit word at
    /// `addr`, with release ordering: when another agent reads `value` there, every write of
    /// the work enqueued on `stream` before this call is visible to it. Returns once enqueued.
    /// A null or misaligned `addr` is `INVALID_ARGUMENT`.
    pub stream_write_value32:
        Option<unsafe extern "C" fn(stream: Stream, addr: *mut u32, value: u32) -> Status>,
    /// Enqueues on `stream` (null: the default stream) a wait: work enqueued on `stream` after
    /// this call does not start until the 32-bit word at `addr` satisfies the condition of
    /// `flags` ([`WAIT_VALUE_GEQ`], 0: `(int32_t)(*addr - value) >= 0`; [`WAIT_VALUE_EQ`], 1:
    /// `*addr == value`), read with acquire ordering. Returns once enqueued: it never blocks
    /// the calling thread. Other `flags`, or a null or misaligned `addr`, are
    /// `INVALID_ARGUMENT`. A wait that is never satisfied holds the stream as an unsignalled
    /// event would; destroying the stream must still be possible (the host adaptor abandons
    /// the wait, with an error on the stream).
    pub stream_wait_value32: Option<
        unsafe extern "C" fn(stream: Stream, addr: *const u32, value: u32, flags: u32) -> Status,
    >,
}
