/* ferrocx plugin ABI v1: the tables a C or C++ adaptor plugin exports.
 *
 * Export `const FerrocxDeviceAdaptorV1 ferrocx_device_adaptor_v1` and/or
 * `const FerrocxCclAdaptorV1 ferrocx_ccl_adaptor_v1` (and optional groups under their own
 * symbols), each starting with a FerrocxAbiHeader. A NULL entry means "not supported". */

#ifndef FERROCX_PLUGIN_H
#define FERROCX_PLUGIN_H

/* Generated from the Rust ABI types (core/src/abi/) by cbindgen: do not edit.
   Regenerate with: FERROCX_BLESS=1 cargo test -p ferrocx-plugin-sdk --test c_header */

#include <stddef.h>
#include <stdint.h>

/*
 `"FRCX"` read as a little-endian `u32`: the first field of every table.
 */
#define Ferrocx_ABI_MAGIC 1480806982

/*
 The ABI major this build speaks. A table of another major is refused.
 */
#define Ferrocx_ABI_MAJOR 1

/*
 The ABI minor this build knows. A table of a newer minor is read up to the fields this build
 knows; a table of an older minor has the fields past its `struct_size` treated as absent.

 History: 1.0, the first release; 1.1 appends `mem_get_info` to the device adaptor table;
 1.2 adds the kernel group (`ferrocx_device_kernel_v1`) and appends `query_support` to the
 CCL adaptor table; 1.3 adds the memops group (`ferrocx_device_memops_v1`: 32-bit stores and
 waits on host memory in stream order) and appends `get_limits` (the CCL's declared maximum
 ranks, data types and reductions) to the CCL adaptor table.
 */
#define Ferrocx_ABI_MINOR 3

/*
 `flags` of `stream_wait_value32`: wait until `(int32_t)(*addr - value) >= 0`, the
 comparison with wrap-around of CUDA's `CU_STREAM_WAIT_VALUE_GEQ` (a counter that wrapped
 past `u32::MAX` is still "at or past" a value a little below it). *Since ABI 1.3.*
 */
#define Ferrocx_WAIT_VALUE_GEQ 0

/*
 `flags` of `stream_wait_value32`: wait until `*addr == value`. *Since ABI 1.3.*
 */
#define Ferrocx_WAIT_VALUE_EQ 1

/*
 A NUL-terminated string with static storage, readable from any thread.
 */
typedef const char *FerrocxStaticCStr;

/*
 The first field of every table (`#[repr(C)]`, 24 bytes on 64-bit targets).
 */
typedef struct {
  /*
   Always [`ABI_MAGIC`].
   */
  uint32_t magic;
  /*
   ABI major the table was built against.
   */
  uint16_t abi_major;
  /*
   ABI minor the table was built against.
   */
  uint16_t abi_minor;
  /*
   `sizeof` the whole table, header included, as the plugin was compiled.
   */
  uint32_t struct_size;
  /*
   Zero; keeps `name` aligned in C and leaves room for flags.
   */
  uint32_t reserved;
  /*
   The adaptor's name (`"host"`, `"cuda"`, …): lowercase, NUL-terminated, static.
   */
  FerrocxStaticCStr name;
} FerrocxAbiHeader;

/*
 The result of every ABI entry. `SUCCESS` is zero; anything else is a failure whose message
 the plugin's `get_last_error` returns.
 */
typedef int32_t FerrocxStatus;
/*
 The call completed.
 */
#define FerrocxStatus_SUCCESS 0
/*
 The adaptor does not implement this operation (or this variant of it).
 */
#define FerrocxStatus_UNSUPPORTED 1
/*
 An argument was out of range, null where a value is required, or inconsistent.
 */
#define FerrocxStatus_INVALID_ARGUMENT 2
/*
 A handle (stream, event, communicator, pointer) is unknown or already released.
 */
#define FerrocxStatus_INVALID_HANDLE 3
/*
 Memory could not be allocated.
 */
#define FerrocxStatus_OUT_OF_MEMORY 4
/*
 Asynchronous work is still pending (`stream_query`, `event_query`).
 */
#define FerrocxStatus_NOT_READY 5
/*
 A wait passed its deadline.
 */
#define FerrocxStatus_TIMEOUT 6
/*
 A peer failed or disappeared.
 */
#define FerrocxStatus_PEER_FAILURE 7
/*
 The communicator was aborted.
 */
#define FerrocxStatus_ABORTED 8
/*
 The vendor runtime (driver, library) reported an error.
 */
#define FerrocxStatus_VENDOR_ERROR 9
/*
 An operating-system call failed.
 */
#define FerrocxStatus_SYSTEM_ERROR 10
/*
 A bug in the adaptor, including a Rust panic caught at the boundary.
 */
#define FerrocxStatus_INTERNAL_ERROR 11
/*
 The output buffer is too small; the required size was written back.
 */
#define FerrocxStatus_BUFFER_TOO_SMALL 12
/*
 The adaptor was not initialised (`init` not called, or it failed).
 */
#define FerrocxStatus_NOT_INITIALIZED 13

/*
 Element type of a collective's buffers.
 */
typedef uint32_t FerrocxDataType;
/*
 IEEE-754 binary32.
 */
#define FerrocxDataType_F32 0
/*
 IEEE-754 binary64.
 */
#define FerrocxDataType_F64 1
/*
 IEEE-754 binary16.
 */
#define FerrocxDataType_F16 2
/*
 bfloat16.
 */
#define FerrocxDataType_BF16 3
/*
 Signed 8-bit integer.
 */
#define FerrocxDataType_I8 4
/*
 Unsigned 8-bit integer.
 */
#define FerrocxDataType_U8 5
/*
 Signed 32-bit integer.
 */
#define FerrocxDataType_I32 6
/*
 Unsigned 32-bit integer.
 */
#define FerrocxDataType_U32 7
/*
 Signed 64-bit integer.
 */
#define FerrocxDataType_I64 8
/*
 Unsigned 64-bit integer.
 */
#define FerrocxDataType_U64 9
/*
 Every data type of ABI v1, in constant order.
 */
#define FerrocxDataType_ALL { FerrocxDataType_F32, FerrocxDataType_F64, FerrocxDataType_F16, FerrocxDataType_BF16, FerrocxDataType_I8, FerrocxDataType_U8, FerrocxDataType_I32, FerrocxDataType_U32, FerrocxDataType_I64, FerrocxDataType_U64, }

/*
 Reduction operator of a reducing collective.
 */
typedef uint32_t FerrocxReduceOp;
/*
 Sum of all contributions.
 */
#define FerrocxReduceOp_SUM 0
/*
 Product of all contributions.
 */
#define FerrocxReduceOp_PROD 1
/*
 Minimum.
 */
#define FerrocxReduceOp_MIN 2
/*
 Maximum.
 */
#define FerrocxReduceOp_MAX 3
/*
 Sum divided by the number of ranks.
 */
#define FerrocxReduceOp_AVG 4
/*
 Every reduction op of ABI v1, in constant order.
 */
#define FerrocxReduceOp_ALL { FerrocxReduceOp_SUM, FerrocxReduceOp_PROD, FerrocxReduceOp_MIN, FerrocxReduceOp_MAX, FerrocxReduceOp_AVG, }

/*
 Where an allocation lives.
 */
typedef uint32_t FerrocxMemKind;
/*
 Device memory.
 */
#define FerrocxMemKind_DEVICE 0
/*
 Ordinary (pageable) host memory.
 */
#define FerrocxMemKind_HOST 1
/*
 Page-locked host memory the device can reach directly.
 */
#define FerrocxMemKind_PINNED 2

/*
 Capability bits reported in [`crate::abi::DeviceProperties::capabilities`].
 */
typedef uint64_t FerrocxCapabilities;
/*
 Memory handles can be exported to and imported by other processes (`ipc_*`).
 */
#define FerrocxCapabilities_IPC (1 << 0)
/*
 Exportable physical allocations with POSIX file descriptors (VMM group).
 */
#define FerrocxCapabilities_VMM (1 << 1)
/*
 Peers' allocations can be mapped into one reserved range (flat-map group).
 */
#define FerrocxCapabilities_FLAT_MAP (1 << 2)
/*
 Multicast objects are supported by the hardware (multicast group).
 */
#define FerrocxCapabilities_MULTICAST (1 << 3)
/*
 Host functions can be launched on a stream.
 */
#define FerrocxCapabilities_HOST_FUNC (1 << 4)
/*
 A stream created by another library can be wrapped.
 */
#define FerrocxCapabilities_STREAM_WRAP (1 << 5)
/*
 Events can measure elapsed time.
 */
#define FerrocxCapabilities_TIMED_EVENTS (1 << 6)
/*
 Device memory is directly addressable from the host (CPU devices).
 */
#define FerrocxCapabilities_HOST_ADDRESSABLE (1 << 7)

/*
 An address in the adaptor's unified address space: device memory, pinned or ordinary host
 memory. `memcpy` takes any two of them, as CUDA's unified addressing does.
 */
typedef uint64_t FerrocxDevicePtr;
/*
 The null address.
 */
#define FerrocxDevicePtr_NULL 0

/*
 A stream of the device adaptor. For CUDA, the `CUstream` itself, so a CCL adaptor of the
 same vendor can pass it on unchanged. Null is the adaptor's default stream.
 */
typedef void *FerrocxStream;

/*
 An event of the device adaptor.
 */
typedef void *FerrocxEvent;

/*
 A communicator of the CCL adaptor.
 */
typedef void *FerrocxComm;

/*
 A buffer registration of the CCL adaptor (`mem_register`).
 */
typedef void *FerrocxRegHandle;

/*
 A window registered by the CCL adaptor's window group.
 */
typedef void *FerrocxWindowHandle;

/*
 A physical allocation of the VMM group (exportable, mappable).
 */
typedef uint64_t FerrocxVmmHandle;

/*
 A multicast object of the multicast group.
 */
typedef uint64_t FerrocxMcHandle;

/*
 An executable graph of the graph group: work captured from a stream, instantiated, ready to
 launch on any stream of the same device any number of times (for CUDA, the `CUgraphExec`).
 */
typedef void *FerrocxGraphHandle;

/*
 A module of the kernel group: code loaded from an image onto one device (for CUDA, the
 `CUmodule`). *Since ABI 1.2.*
 */
typedef void *FerrocxModuleHandle;

/*
 A function of a loaded module, ready to launch (for CUDA, the `CUfunction`). Valid until its
 module is unloaded. *Since ABI 1.2.*
 */
typedef void *FerrocxFunctionHandle;

/*
 The format of a kernel image given to the kernel group's `module_load`. Values from
 [`ImageFormat::VENDOR_BASE`] up are a vendor's own formats. *Since ABI 1.2.*
 */
typedef uint32_t FerrocxImageFormat;
/*
 NVIDIA PTX assembly text (the image need not be NUL-terminated: its length is given).
 */
#define FerrocxImageFormat_PTX 1
/*
 An NVIDIA CUBIN for one architecture (what NVRTC's `nvrtcGetCUBIN` returns).
 */
#define FerrocxImageFormat_CUBIN 2
/*
 An NVIDIA fat binary: CUBINs and PTX for several architectures.
 */
#define FerrocxImageFormat_FATBIN 3
/*
 The first value of the range left to vendors' own formats.
 */
#define FerrocxImageFormat_VENDOR_BASE 4096

/*
 A host function launched on a stream: called once, in stream order, with `user`.
 (`Option` so that a null pointer from C is a value, not undefined behaviour.)
 */
typedef void (*FerrocxHostFn)(void *user);

/*
 One `key = value` option from the configuration, passed to `init` and `comm_init_rank`.
 Both strings are NUL-terminated and valid for the duration of the call.
 */
typedef struct {
  /*
   Option name.
   */
  const char *key;
  /*
   Option value, as text.
   */
  const char *value;
} FerrocxKeyValue;

/*
 Properties of one device, filled by `get_properties`.

 The caller sets `struct_size` to the size it knows; the adaptor writes no byte past it, so the
 struct can grow in later minors.
 */
typedef struct {
  /*
   Set by the caller: `sizeof(DeviceProperties)` as it was compiled.
   */
  uint32_t struct_size;
  /*
   Zero.
   */
  uint32_t reserved;
  /*
   Vendor name, NUL-terminated (`"NVIDIA"`, `"host"`).
   */
  char vendor[32];
  /*
   Device name, NUL-terminated (`"NVIDIA H200"`).
   */
  char name[64];
  /*
   [`Capabilities`] bits.
   */
  FerrocxCapabilities capabilities;
  /*
   Device memory in bytes (0 when unknown).
   */
  uint64_t total_memory;
  /*
   Vendor's architecture number (CUDA: major*10+minor), 0 when not applicable.
   */
  uint32_t arch;
  /*
   Devices visible to this process.
   */
  int32_t device_count;
} FerrocxDeviceProperties;

/*
 The device adaptor table, exported as `ferrocx_device_adaptor_v1`.

 Every entry returns a [`Status`]; on failure `get_last_error` returns the message on the
 calling thread. A `None` entry means the operation is not supported.

 The contract of every entry:
 - Entries may be called from any thread, concurrently. The current device is per thread.
 - Before a successful `init`, an entry either works or returns `NOT_INITIALIZED` (with a
   message); it never crashes.
 - A null `Stream` is the default stream: every entry that takes a stream accepts it, work
   enqueued on it runs in order, `stream_synchronize(NULL)` waits for it; it is never
   destroyed.
 - A handle or pointer the adaptor did not give out, or already released, is
   `INVALID_HANDLE`; a bad value (zero size, unknown kind or flag, null address) is
   `INVALID_ARGUMENT`. `UNSUPPORTED` from a present entry means "not at run time" (the
   runtime lacks it); what the adaptor never does is a `NULL` entry.

 Fields are only ever appended, one minor at a time: ABI 1.0 ends at `ipc_close`
 (`struct_size` = `offsetof(mem_get_info)`), ABI 1.1 adds `mem_get_info`.
 */
typedef struct {
  /*
   Header: magic, ABI version, `sizeof` this table, adaptor name.
   */
  FerrocxAbiHeader header;
  /*
   Initialises the adaptor with the configuration's options. Called once before anything
   else; an entry called before it works or returns `NOT_INITIALIZED`.
   */
  FerrocxStatus (*init)(const FerrocxKeyValue *options, size_t n_options);
  /*
   Releases everything the adaptor holds. No call follows it but `init`.
   */
  FerrocxStatus (*finalize)(void);
  /*
   The message of the last failed call on this thread (static or thread-local storage, valid
   until the next call on this thread); never null.
   */
  const char *(*get_last_error)(void);
  /*
   Number of devices visible to this process.
   */
  FerrocxStatus (*device_count)(int32_t *count);
  /*
   Selects the device the calling thread works on.
   */
  FerrocxStatus (*set_device)(int32_t device);
  /*
   The device the calling thread works on.
   */
  FerrocxStatus (*get_device)(int32_t *device);
  /*
   Vendor, name and capabilities of a device.
   */
  FerrocxStatus (*get_properties)(int32_t device, FerrocxDeviceProperties *props);
  /*
   Allocates `bytes` of memory of `kind` on the current device.
   */
  FerrocxStatus (*mem_alloc)(size_t bytes, FerrocxMemKind kind, FerrocxDevicePtr *ptr);
  /*
   Frees memory from `mem_alloc` of the same kind (a null `ptr` does nothing). A pointer
   not allocated (or already freed) is `INVALID_HANDLE`; a live allocation given with
   another kind is `INVALID_ARGUMENT` (or `INVALID_HANDLE`) and stays allocated.
   */
  FerrocxStatus (*mem_free)(FerrocxDevicePtr ptr, FerrocxMemKind kind);
  /*
   Copies `bytes` between any two addresses; returns when the copy is done.
   */
  FerrocxStatus (*mem_copy)(FerrocxDevicePtr dst, FerrocxDevicePtr src, size_t bytes);
  /*
   Enqueues a copy on `stream` (null: the default stream); returns once enqueued.
   */
  FerrocxStatus (*mem_copy_async)(FerrocxDevicePtr dst,
                                  FerrocxDevicePtr src,
                                  size_t bytes,
                                  FerrocxStream stream);
  /*
   Sets `bytes` bytes to `value`; returns when done.
   */
  FerrocxStatus (*mem_set)(FerrocxDevicePtr dst, uint8_t value, size_t bytes);
  /*
   Enqueues a memset on `stream` (null: the default stream); returns once enqueued.
   */
  FerrocxStatus (*mem_set_async)(FerrocxDevicePtr dst,
                                 uint8_t value,
                                 size_t bytes,
                                 FerrocxStream stream);
  /*
   Creates a stream (`flags`: 0 = default, 1 = non-blocking).
   */
  FerrocxStatus (*stream_create)(uint32_t flags, FerrocxStream *stream);
  /*
   Wraps a stream created by another library (a `CUstream`); destroying the wrapper does not
   destroy the native stream.
   */
  FerrocxStatus (*stream_wrap)(void *native, FerrocxStream *stream);
  /*
   Destroys a stream after the work enqueued on it completes (returns at once). The null
   (default) stream cannot be destroyed: `INVALID_HANDLE`.
   */
  FerrocxStatus (*stream_destroy)(FerrocxStream stream);
  /*
   Blocks until all work enqueued on `stream` (null: the default stream) has completed;
   returns the first failure of that work, if any.
   */
  FerrocxStatus (*stream_synchronize)(FerrocxStream stream);
  /*
   `SUCCESS` when all work on `stream` has completed, `NOT_READY` otherwise.
   */
  FerrocxStatus (*stream_query)(FerrocxStream stream);
  /*
   Makes future work on `stream` wait for the most recent record of `event` made before this
   call (CUDA semantics: a later re-record does not affect this wait).
   */
  FerrocxStatus (*stream_wait_event)(FerrocxStream stream, FerrocxEvent event);
  /*
   Creates an event (`flags`: bit 0 = disable timing). An event never recorded counts as
   complete (queries, synchronizes and waits on it return at once).
   */
  FerrocxStatus (*event_create)(uint32_t flags, FerrocxEvent *event);
  /*
   Destroys an event.
   */
  FerrocxStatus (*event_destroy)(FerrocxEvent event);
  /*
   Records `event` at the current end of `stream`.
   */
  FerrocxStatus (*event_record)(FerrocxEvent event, FerrocxStream stream);
  /*
   Blocks until the most recent record of `event` has completed.
   */
  FerrocxStatus (*event_synchronize)(FerrocxEvent event);
  /*
   `SUCCESS` when the most recent record has completed, `NOT_READY` otherwise.
   */
  FerrocxStatus (*event_query)(FerrocxEvent event);
  /*
   Milliseconds between two completed records of timing events (negative when `end`
   completed first). An event created with timing disabled, or never recorded, is
   `INVALID_ARGUMENT` or `INVALID_HANDLE` (CUDA's); a record not completed yet is
   `NOT_READY`.
   */
  FerrocxStatus (*event_elapsed_ms)(FerrocxEvent start, FerrocxEvent end, float *ms);
  /*
   Enqueues a host function on `stream`; it runs once, in stream order.
   */
  FerrocxStatus (*launch_host_func)(FerrocxStream stream, FerrocxHostFn func, void *user);
  /*
   Exports an allocation for another process. `handle` receives at most `*len` bytes and
   `*len` is set to the handle's size; a null `handle` (or a too-small `*len`, which returns
   `BUFFER_TOO_SMALL`) queries the size.
   */
  FerrocxStatus (*ipc_export)(FerrocxDevicePtr ptr, uint8_t *handle, size_t *len);
  /*
   Opens a handle exported by another process.
   */
  FerrocxStatus (*ipc_import)(const uint8_t *handle, size_t len, FerrocxDevicePtr *ptr);
  /*
   Closes a pointer from `ipc_import`.
   */
  FerrocxStatus (*ipc_close)(FerrocxDevicePtr ptr);
  /*
   Bytes of device memory free and in total on the calling thread's current device, as
   `cuMemGetInfo` reports them; both pointers must be non-null. *Since ABI 1.1*: a 1.0 table
   ends before this field, so it reads as absent there.
   */
  FerrocxStatus (*mem_get_info)(size_t *free, size_t *total);
} FerrocxDeviceAdaptorV1;

/*
 Optional group `ferrocx_device_vmm_v1`: exportable physical allocations.
 */
typedef struct {
  /*
   Header: magic, ABI version, `sizeof` this table, adaptor name.
   */
  FerrocxAbiHeader header;
  /*
   Allocation granularity of `device` in bytes; sizes are rounded up to it.
   */
  FerrocxStatus (*vmm_granularity)(int32_t device, size_t *bytes);
  /*
   Allocates `bytes` of exportable physical memory on the current device.
   */
  FerrocxStatus (*vmm_alloc)(size_t bytes, FerrocxVmmHandle *handle);
  /*
   Exports an allocation as a POSIX file descriptor owned by the caller.
   */
  FerrocxStatus (*vmm_export_fd)(FerrocxVmmHandle handle, int32_t *fd);
  /*
   Imports an allocation of `bytes` from a file descriptor (the fd stays the caller's).
   */
  FerrocxStatus (*vmm_import_fd)(int32_t fd, size_t bytes, FerrocxVmmHandle *handle);
  /*
   Releases an allocation or an imported handle (memory is freed once unmapped everywhere).
   */
  FerrocxStatus (*vmm_release)(FerrocxVmmHandle handle);
} FerrocxDeviceVmmV1;

/*
 Optional group `ferrocx_device_flatmap_v1`: peers mapped into one virtual range.
 */
typedef struct {
  /*
   Header: magic, ABI version, `sizeof` this table, adaptor name.
   */
  FerrocxAbiHeader header;
  /*
   Reserves `bytes` of virtual address space.
   */
  FerrocxStatus (*flat_reserve)(size_t bytes, FerrocxDevicePtr *base);
  /*
   Maps `handle` at `base + index * size` with read/write access for the current device.
   */
  FerrocxStatus (*flat_map)(FerrocxDevicePtr base,
                            size_t index,
                            size_t size,
                            FerrocxVmmHandle handle);
  /*
   Unmaps the slot at `base + index * size`.
   */
  FerrocxStatus (*flat_unmap)(FerrocxDevicePtr base, size_t index, size_t size);
  /*
   Releases a reservation whose slots are all unmapped.
   */
  FerrocxStatus (*flat_release)(FerrocxDevicePtr base, size_t bytes);
} FerrocxDeviceFlatMapV1;

/*
 Optional group `ferrocx_device_multicast_v1`: one store reaching every device, a load
 reducing over all of them. The core calls it only when policy allows (see DESIGN.md).
 */
typedef struct {
  /*
   Header: magic, ABI version, `sizeof` this table, adaptor name.
   */
  FerrocxAbiHeader header;
  /*
   Writes 1 to `supported` when `device` can take part in multicast objects.
   */
  FerrocxStatus (*mc_supported)(int32_t device, int32_t *supported);
  /*
   Creates a multicast object of `bytes` for `num_devices` devices.
   */
  FerrocxStatus (*mc_create)(size_t bytes, int32_t num_devices, FerrocxMcHandle *mc);
  /*
   Exports a multicast object as a POSIX file descriptor.
   */
  FerrocxStatus (*mc_export_fd)(FerrocxMcHandle mc, int32_t *fd);
  /*
   Imports a multicast object from a file descriptor.
   */
  FerrocxStatus (*mc_import_fd)(int32_t fd, size_t bytes, FerrocxMcHandle *mc);
  /*
   Adds a device of this process to the object.
   */
  FerrocxStatus (*mc_add_device)(FerrocxMcHandle mc, int32_t device);
  /*
   Binds `bytes` of a VMM allocation (from `mem_offset`) at `mc_offset` of the object.
   */
  FerrocxStatus (*mc_bind)(FerrocxMcHandle mc,
                           size_t mc_offset,
                           FerrocxVmmHandle mem,
                           size_t mem_offset,
                           size_t bytes);
  /*
   Maps the object into this process's address space.
   */
  FerrocxStatus (*mc_map)(FerrocxMcHandle mc, size_t bytes, FerrocxDevicePtr *ptr);
  /*
   Unmaps a mapping from `mc_map`.
   */
  FerrocxStatus (*mc_unmap)(FerrocxDevicePtr ptr, size_t bytes);
  /*
   Unbinds the memory bound at `mc_offset` for `device`.
   */
  FerrocxStatus (*mc_unbind)(FerrocxMcHandle mc, int32_t device, size_t mc_offset, size_t bytes);
  /*
   Releases the object.
   */
  FerrocxStatus (*mc_release)(FerrocxMcHandle mc);
} FerrocxDeviceMulticastV1;

/*
 Optional group `ferrocx_device_graph_v1`: work captured from a stream into a graph that is
 launched again as one unit (CUDA graphs), which takes the host's per-call cost out of
 repeated sequences of operations.

 Between `graph_begin_capture` and `graph_end_capture`, work enqueued on the stream by this
 thread (through this adaptor or a CCL paired with it) is recorded, not run. A capture that
 fails must still be ended, which discards it.
 */
typedef struct {
  /*
   Header: magic, ABI version, `sizeof` this table, adaptor name.
   */
  FerrocxAbiHeader header;
  /*
   Starts recording the work enqueued on `stream` (which must not be capturing already).
   */
  FerrocxStatus (*graph_begin_capture)(FerrocxStream stream);
  /*
   Ends the capture of `stream` and writes the executable graph of what was recorded to
   `graph`; the caller owns it (`graph_destroy`). On failure nothing is written and the
   stream is no longer capturing.
   */
  FerrocxStatus (*graph_end_capture)(FerrocxStream stream, FerrocxGraphHandle *graph);
  /*
   Enqueues one run of `graph` on `stream`.
   */
  FerrocxStatus (*graph_launch)(FerrocxGraphHandle graph, FerrocxStream stream);
  /*
   Destroys a graph; launches already enqueued complete first.
   */
  FerrocxStatus (*graph_destroy)(FerrocxGraphHandle graph);
} FerrocxDeviceGraphV1;

/*
 How a kernel is launched: the grid, the block, dynamic shared memory and the arguments. Read
 by the kernel group's `launch_kernel`. *Since ABI 1.2.*

 The caller sets `struct_size`; the adaptor reads no byte past it, so later minors can
 append fields (a field past a caller's `struct_size` takes its zero default).
 */
typedef struct {
  /*
   Set by the caller: `sizeof(KernelLaunch)` as it was compiled.
   */
  uint32_t struct_size;
  /*
   Zero.
   */
  uint32_t reserved;
  /*
   Blocks in x, y, z; each at least 1.
   */
  uint32_t grid[3];
  /*
   Threads per block in x, y, z; each at least 1.
   */
  uint32_t block[3];
  /*
   Bytes of dynamic shared memory per block.
   */
  uint32_t shared_mem_bytes;
  /*
   Zero (room for launch flags).
   */
  uint32_t flags;
  /*
   One pointer per kernel parameter, in order, each to a value of that parameter's type
   (CUDA's `kernelParams`); the adaptor copies the values before `launch_kernel` returns.
   */
  void **args;
  /*
   Number of `args` (the kernel's parameter count).
   */
  size_t n_args;
} FerrocxKernelLaunch;

/*
 Optional group `ferrocx_device_kernel_v1`: device code loaded from an image and launched on
 a stream (CUDA's `cuModuleLoadData`, `cuModuleGetFunction`, `cuLaunchKernel`). *Since ABI
 1.2*: a plugin of an older minor does not export it.

 Modules belong to the device current on the calling thread when they are loaded; their
 functions launch on streams of that device. A caller learns which image formats a device
 loads from `kernel_image_formats` (so it needs no vendor-name check).
 */
typedef struct {
  /*
   Header: magic, ABI version, `sizeof` this table, adaptor name.
   */
  FerrocxAbiHeader header;
  /*
   The image formats `device` loads, best first. `formats` receives at most `*len` values
   and `*len` is set to their number; a null `formats` (or a too-small `*len`:
   `BUFFER_TOO_SMALL`) queries the number.
   */
  FerrocxStatus (*kernel_image_formats)(int32_t device, FerrocxImageFormat *formats, size_t *len);
  /*
   Loads the `bytes` of `image`, of `format`, onto the calling thread's current device. An
   image the device cannot run (another architecture, a format it does not load) is
   refused with `INVALID_ARGUMENT` and the reason; the image is not used after the call.
   */
  FerrocxStatus (*module_load)(const uint8_t *image,
                               size_t bytes,
                               FerrocxImageFormat format,
                               FerrocxModuleHandle *module);
  /*
   Unloads a module; its functions are invalid afterwards. Launches already enqueued
   complete first.
   */
  FerrocxStatus (*module_unload)(FerrocxModuleHandle module);
  /*
   Looks up the function `name` (NUL-terminated, the symbol's name in the image) of a
   loaded module; an unknown name is `INVALID_ARGUMENT`.
   */
  FerrocxStatus (*module_get_function)(FerrocxModuleHandle module,
                                       const char *name,
                                       FerrocxFunctionHandle *function);
  /*
   Enqueues one run of `function` on `stream` as `launch` describes. The arguments must
   match the kernel's parameters in number, order and type: the adaptor cannot check them.
   */
  FerrocxStatus (*launch_kernel)(FerrocxFunctionHandle function,
                                 const FerrocxKernelLaunch *launch,
                                 FerrocxStream stream);
} FerrocxDeviceKernelV1;

/*
 Optional group `ferrocx_device_memops_v1`: 32-bit stores and waits on host memory, in stream
 order (CUDA's `cuStreamWriteValue32` and `cuStreamWaitValue32`). *Since ABI 1.3*: a plugin
 of an older minor does not export it.

 They let one stream (or one device, or another process) signal another without the host
 thread in between: a producer stream writes a flag or counter when its work is done, a
 consumer stream waits for it before its own. `addr` is host memory the host can read and
 write: for the host device, any host memory; for a GPU, pinned or registered host memory
 (page-locked, mapped for the device). It must be 4-byte aligned.
 */
typedef struct {
  /*
   Header: magic, ABI version, `sizeof` this table, adaptor name.
   */
  FerrocxAbiHeader header;
  /*
   Enqueues on `stream` (null: the default stream) a store of `value` to the 32-bit word at
   `addr`, with release ordering: when another agent reads `value` there, every write of
   the work enqueued on `stream` before this call is visible to it. Returns once enqueued.
   A null or misaligned `addr` is `INVALID_ARGUMENT`.
   */
  FerrocxStatus (*stream_write_value32)(FerrocxStream stream, uint32_t *addr, uint32_t value);
  /*
   Enqueues on `stream` (null: the default stream) a wait: work enqueued on `stream` after
   this call does not start until the 32-bit word at `addr` satisfies the condition of
   `flags` ([`WAIT_VALUE_GEQ`], 0: `(int32_t)(*addr - value) >= 0`; [`WAIT_VALUE_EQ`], 1:
   `*addr == value`), read with acquire ordering. Returns once enqueued: it never blocks
   the calling thread. Other `flags`, or a null or misaligned `addr`, are
   `INVALID_ARGUMENT`. A wait that is never satisfied holds the stream as an unsignalled
   event would; destroying the stream must still be possible (the host adaptor abandons
   the wait, with an error on the stream).
   */
  FerrocxStatus (*stream_wait_value32)(FerrocxStream stream,
                                       const uint32_t *addr,
                                       uint32_t value,
                                       uint32_t flags);
} FerrocxDeviceMemOpsV1;

/*
 Arguments of `comm_init_rank`. The caller sets `struct_size`; the adaptor reads no field past
 it, so later minors can append fields.
 */
typedef struct {
  /*
   `sizeof(CommInitArgs)` as the caller compiled it.
   */
  uint32_t struct_size;
  /*
   This process's rank in the communicator, `0..nranks`.
   */
  int32_t rank;
  /*
   Number of ranks.
   */
  int32_t nranks;
  /*
   Device (of the paired device adaptor) the communicator uses.
   */
  int32_t device;
  /*
   Bytes from rank 0's `get_unique_id`, identical on every rank.
   */
  const uint8_t *unique_id;
  /*
   Length of `unique_id`.
   */
  size_t unique_id_len;
  /*
   Deadline for any wait on a peer, in milliseconds (0: the adaptor's default).
   */
  uint64_t timeout_ms;
  /*
   The cluster's options for this adaptor.
   */
  const FerrocxKeyValue *options;
  /*
   Number of `options`.
   */
  size_t n_options;
} FerrocxCommInitArgs;

/*
 What a CCL adaptor claims to support, from `get_limits` (*since ABI 1.3*). Outside these
 limits the adaptor may refuse a call (with `UNSUPPORTED` or `INVALID_ARGUMENT`); callers
 (the core, the conformance kit) treat what lies outside as "not claimed", not as a failure.

 The caller sets `struct_size` and fills every field with "no limit" ([`CclLimits::NONE`])
 before the call; the adaptor writes no byte past the caller's `struct_size`, so later minors
 can append fields. A table without `get_limits` (ABI 1.0 to 1.2, or an adaptor without
 limits) has no limits.
 */
typedef struct {
  /*
   Set by the caller: `sizeof(CclLimits)` as it was compiled.
   */
  uint32_t struct_size;
  /*
   Zero.
   */
  uint32_t reserved;
  /*
   The most ranks a communicator may have; 0 means no limit.
   */
  uint64_t max_ranks;
  /*
   The data types the collectives accept: bit `d` set when `DataType(d)` is supported
   (`1 << FERROCX_F32 | ...`); all ones means every type, this build's and later ones.
   */
  uint64_t dtypes;
  /*
   The reductions accepted: bit `o` set when `ReduceOp(o)` is supported; all ones means
   every reduction.
   */
  uint64_t reduce_ops;
} FerrocxCclLimits;

/*
 The CCL adaptor table, exported as `ferrocx_ccl_adaptor_v1`.

 Collectives are asynchronous on `stream` (NCCL semantics): they return once enqueued.
 Counts are in elements of `dtype`. `send == recv` means in place.

 Fields are only ever appended, one minor at a time: ABI 1.0 and 1.1 end at `mem_deregister`
 (`struct_size` = `offsetof(query_support)`), ABI 1.2 adds `query_support`, ABI 1.3 adds
 `get_limits`.
 */
typedef struct {
  /*
   Header: magic, ABI version, `sizeof` this table, adaptor name.
   */
  FerrocxAbiHeader header;
  /*
   Initialises the adaptor with the configuration's options. Called once before anything else.
   */
  FerrocxStatus (*init)(const FerrocxKeyValue *options, size_t n_options);
  /*
   Releases everything the adaptor holds.
   */
  FerrocxStatus (*finalize)(void);
  /*
   The message of the last failed call on this thread; never null.
   */
  const char *(*get_last_error)(void);
  /*
   The vendor library's version (NCCL: `major*10000 + minor*100 + patch`).
   */
  FerrocxStatus (*get_version)(int32_t *version);
  /*
   Creates a unique id on the root rank. `id` receives at most `*len` bytes and `*len` is set
   to the id's size; a null `id` (or a too-small `*len`: `BUFFER_TOO_SMALL`) queries the size.
   */
  FerrocxStatus (*get_unique_id)(uint8_t *id, size_t *len);
  /*
   Creates this rank's communicator; collective over all ranks.
   */
  FerrocxStatus (*comm_init_rank)(const FerrocxCommInitArgs *args, FerrocxComm *comm);
  /*
   Completes outstanding operations; collective.
   */
  FerrocxStatus (*comm_finalize)(FerrocxComm comm);
  /*
   Frees the communicator's resources.
   */
  FerrocxStatus (*comm_destroy)(FerrocxComm comm);
  /*
   Stops every pending operation of the communicator with an error and frees it.
   */
  FerrocxStatus (*comm_abort)(FerrocxComm comm);
  /*
   Writes the communicator's asynchronous error (`SUCCESS` if none, `NOT_READY` while
   initialising).
   */
  FerrocxStatus (*comm_get_async_error)(FerrocxComm comm, FerrocxStatus *error);
  /*
   Number of ranks.
   */
  FerrocxStatus (*comm_count)(FerrocxComm comm, int32_t *count);
  /*
   This process's rank.
   */
  FerrocxStatus (*comm_user_rank)(FerrocxComm comm, int32_t *rank);
  /*
   The device the communicator uses.
   */
  FerrocxStatus (*comm_device)(FerrocxComm comm, int32_t *device);
  /*
   `recv[i] = op over ranks of send[i]`, `count` elements.
   */
  FerrocxStatus (*all_reduce)(FerrocxDevicePtr send,
                              FerrocxDevicePtr recv,
                              size_t count,
                              FerrocxDataType dtype,
                              FerrocxReduceOp op,
                              FerrocxComm comm,
                              FerrocxStream stream);
  /*
   `recv[r*send_count..]` = rank r's `send`.
   */
  FerrocxStatus (*all_gather)(FerrocxDevicePtr send,
                              FerrocxDevicePtr recv,
                              size_t send_count,
                              FerrocxDataType dtype,
                              FerrocxComm comm,
                              FerrocxStream stream);
  /*
   `recv` = this rank's block (of `recv_count`) of the reduction of every rank's `send`.
   */
  FerrocxStatus (*reduce_scatter)(FerrocxDevicePtr send,
                                  FerrocxDevicePtr recv,
                                  size_t recv_count,
                                  FerrocxDataType dtype,
                                  FerrocxReduceOp op,
                                  FerrocxComm comm,
                                  FerrocxStream stream);
  /*
   `recv` = root's `send` on every rank.
   */
  FerrocxStatus (*broadcast)(FerrocxDevicePtr send,
                             FerrocxDevicePtr recv,
                             size_t count,
                             FerrocxDataType dtype,
                             int32_t root,
                             FerrocxComm comm,
                             FerrocxStream stream);
  /*
   Root's `recv` = reduction of every rank's `send`.
   */
  FerrocxStatus (*reduce)(FerrocxDevicePtr send,
                          FerrocxDevicePtr recv,
                          size_t count,
                          FerrocxDataType dtype,
                          FerrocxReduceOp op,
                          int32_t root,
                          FerrocxComm comm,
                          FerrocxStream stream);
  /*
   Root's `recv[r*send_count..]` = rank r's `send`.
   */
  FerrocxStatus (*gather)(FerrocxDevicePtr send,
                          FerrocxDevicePtr recv,
                          size_t send_count,
                          FerrocxDataType dtype,
                          int32_t root,
                          FerrocxComm comm,
                          FerrocxStream stream);
  /*
   Rank r's `recv` = root's `send[r*recv_count..]`.
   */
  FerrocxStatus (*scatter)(FerrocxDevicePtr send,
                           FerrocxDevicePtr recv,
                           size_t recv_count,
                           FerrocxDataType dtype,
                           int32_t root,
                           FerrocxComm comm,
                           FerrocxStream stream);
  /*
   Block `r` of `send` goes to rank r; block `r` of `recv` comes from rank r; blocks of
   `count` elements.
   */
  FerrocxStatus (*all_to_all)(FerrocxDevicePtr send,
                              FerrocxDevicePtr recv,
                              size_t count,
                              FerrocxDataType dtype,
                              FerrocxComm comm,
                              FerrocxStream stream);
  /*
   As `all_to_all` with per-peer counts and displacements (host arrays of `nranks` elements,
   in elements).
   */
  FerrocxStatus (*all_to_allv)(FerrocxDevicePtr send,
                               const size_t *send_counts,
                               const size_t *send_displs,
                               FerrocxDevicePtr recv,
                               const size_t *recv_counts,
                               const size_t *recv_displs,
                               FerrocxDataType dtype,
                               FerrocxComm comm,
                               FerrocxStream stream);
  /*
   Sends `count` elements to `peer`.
   */
  FerrocxStatus (*send)(FerrocxDevicePtr buf,
                        size_t count,
                        FerrocxDataType dtype,
                        int32_t peer,
                        FerrocxComm comm,
                        FerrocxStream stream);
  /*
   Receives `count` elements from `peer`.
   */
  FerrocxStatus (*recv)(FerrocxDevicePtr buf,
                        size_t count,
                        FerrocxDataType dtype,
                        int32_t peer,
                        FerrocxComm comm,
                        FerrocxStream stream);
  /*
   Starts a group: operations until `group_end` are issued together.
   */
  FerrocxStatus (*group_start)(void);
  /*
   Ends a group and issues its operations.
   */
  FerrocxStatus (*group_end)(void);
  /*
   Allocates memory suited to the CCL (NCCL: `ncclMemAlloc`).
   */
  FerrocxStatus (*mem_alloc)(size_t bytes, FerrocxDevicePtr *ptr);
  /*
   Frees memory from `mem_alloc`.
   */
  FerrocxStatus (*mem_free)(FerrocxDevicePtr ptr);
  /*
   Registers a buffer with the communicator for faster collectives.
   */
  FerrocxStatus (*mem_register)(FerrocxComm comm,
                                FerrocxDevicePtr buf,
                                size_t bytes,
                                FerrocxRegHandle *handle);
  /*
   Releases a registration.
   */
  FerrocxStatus (*mem_deregister)(FerrocxComm comm, FerrocxRegHandle handle);
  /*
   Whether an entry whose support depends on the vendor library `init` loaded works with
   it: `entry` is the entry's name, NUL-terminated (`"window_register"`, `"mem_register"`);
   `*supported` is set to 1 or 0, and when 0 the reason (NUL-terminated, truncated to fit)
   is written to `reason` if it is non-null and `reason_len` > 0. Called after `init`, only
   for entries the tables provide (an absent entry is the only other "unsupported"); an
   entry whose support does not depend on the runtime is answered 1; a name that is not an
   entry of the CCL tables is `INVALID_ARGUMENT`. *Since ABI 1.2*: for an older table,
   every present entry is supported.
   */
  FerrocxStatus (*query_support)(const char *entry,
                                 int32_t *supported,
                                 char *reason,
                                 size_t reason_len);
  /*
   The adaptor's declared limits: the most ranks a communicator may have, the data types
   and the reductions its collectives accept (see [`CclLimits`]). The caller fills
   `limits` with [`CclLimits::NONE`] and its `struct_size` first; the adaptor overwrites
   what it limits, writing no byte past `struct_size`. A static declaration: callable
   before `init`, the same answer every time. *Since ABI 1.3*: an older table (or a table
   leaving this `None`) has no limits.
   */
  FerrocxStatus (*get_limits)(FerrocxCclLimits *limits);
} FerrocxCclAdaptorV1;

/*
 Optional group `ferrocx_ccl_window_v1`: the CCL's own window registration.
 */
typedef struct {
  /*
   Header: magic, ABI version, `sizeof` this table, adaptor name.
   */
  FerrocxAbiHeader header;
  /*
   Registers `bytes` at `buf` as a window; collective over the communicator. An adaptor
   may require `buf` to come from its `mem_alloc` (NCCL registers windows only over
   `ncclMemAlloc` or VMM memory). Where the loaded vendor library may lack window
   registration (NCCL before 2.27), the adaptor answers the CCL table's `query_support`
   for `"window_register"`; the core asks that after `init` and never calls this entry
   to find out.
   */
  FerrocxStatus (*window_register)(FerrocxComm comm,
                                   FerrocxDevicePtr buf,
                                   size_t bytes,
                                   uint32_t flags,
                                   FerrocxWindowHandle *window);
  /*
   Deregisters a window; collective.
   */
  FerrocxStatus (*window_deregister)(FerrocxComm comm, FerrocxWindowHandle window);
} FerrocxCclWindowV1;

#endif  /* FERROCX_PLUGIN_H */
