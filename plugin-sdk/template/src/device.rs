//! The device adaptor: what a CUDA-like runtime provides. The vendor-marked `TODO` messages
//! name the CUDA driver call each method corresponds to; call your runtime's equivalent.

use std::ffi::c_void;

use ferrocx_plugin_sdk::prelude::*;

/// The device adaptor. One instance per process ([`DeviceAdaptor::instance`]); the SDK calls
/// it from any thread, so keep its state behind `Mutex`/atomics (e.g. the loaded runtime
/// library, contexts per device, a table of live streams and events).
#[derive(Default)]
pub struct VendorDevice {}

impl DeviceAdaptor for VendorDevice {
    fn instance() -> &'static Self {
        singleton!(VendorDevice)
    }

    // -- First: the device itself. With these, `ferrocx info` reports the device. --

    fn init(&self, _options: &Options) -> Result<()> {
        // `options` are the config's `[cluster.options.myvendor]` pairs (e.g. a library path).
        Err(Error::unsupported(
            "TODO(vendor): load the runtime and call cuInit(0)",
        ))
    }
    fn finalize(&self) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): release what init took: cuDevicePrimaryCtxRelease per device",
        ))
    }
    fn device_count(&self) -> Result<i32> {
        Err(Error::unsupported("TODO(vendor): call cuDeviceGetCount"))
    }
    fn set_device(&self, _device: i32) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): call cuDevicePrimaryCtxRetain + cuCtxSetCurrent (this thread only)",
        ))
    }
    fn get_device(&self) -> Result<i32> {
        Err(Error::unsupported("TODO(vendor): call cuCtxGetDevice"))
    }
    fn properties(&self, _device: i32) -> Result<Properties> {
        Err(Error::unsupported(
            "TODO(vendor): call cuDeviceGetName, cuDeviceTotalMem, cuDeviceGetAttribute \
             (capability bits: Capabilities::HOST_FUNC, TIMED_EVENTS, IPC, ...)",
        ))
    }
    fn mem_get_info(&self) -> Result<MemInfo> {
        Err(Error::unsupported("TODO(vendor): call cuMemGetInfo"))
    }

    // -- Second: memory. --

    fn mem_alloc(&self, _bytes: usize, _kind: MemKind) -> Result<DevicePtr> {
        Err(Error::unsupported(
            "TODO(vendor): call cuMemAlloc (MemKind::DEVICE), cuMemAllocHost (PINNED), \
             malloc (HOST)",
        ))
    }
    fn mem_free(&self, _ptr: DevicePtr, _kind: MemKind) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): call cuMemFree / cuMemFreeHost / free, by kind",
        ))
    }
    fn mem_copy(&self, _dst: DevicePtr, _src: DevicePtr, _bytes: usize) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): call cuMemcpy (any two addresses: unified addressing)",
        ))
    }
    fn mem_set(&self, _dst: DevicePtr, _value: u8, _bytes: usize) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuMemsetD8"))
    }

    // -- Third: streams and events (CUDA semantics), then the async operations on them. --

    fn stream_create(&self, _flags: u32) -> Result<Stream> {
        Err(Error::unsupported(
            "TODO(vendor): call cuStreamCreate (flags 1 = CU_STREAM_NON_BLOCKING)",
        ))
    }
    fn stream_wrap(&self, _native: *mut c_void) -> Result<Stream> {
        Err(Error::unsupported(
            "TODO(vendor): return the native CUstream as the Stream (do not take ownership)",
        ))
    }
    fn stream_destroy(&self, _stream: Stream) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuStreamDestroy"))
    }
    fn stream_synchronize(&self, _stream: Stream) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuStreamSynchronize"))
    }
    fn stream_query(&self, _stream: Stream) -> Result<bool> {
        Err(Error::unsupported(
            "TODO(vendor): call cuStreamQuery (CUDA_ERROR_NOT_READY -> Ok(false))",
        ))
    }
    fn stream_wait_event(&self, _stream: Stream, _event: Event) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuStreamWaitEvent"))
    }
    fn event_create(&self, _flags: u32) -> Result<Event> {
        Err(Error::unsupported(
            "TODO(vendor): call cuEventCreate (flags bit 0 = CU_EVENT_DISABLE_TIMING)",
        ))
    }
    fn event_destroy(&self, _event: Event) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuEventDestroy"))
    }
    fn event_record(&self, _event: Event, _stream: Stream) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuEventRecord"))
    }
    fn event_synchronize(&self, _event: Event) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuEventSynchronize"))
    }
    fn event_query(&self, _event: Event) -> Result<bool> {
        Err(Error::unsupported(
            "TODO(vendor): call cuEventQuery (CUDA_ERROR_NOT_READY -> Ok(false))",
        ))
    }
    fn event_elapsed_ms(&self, _start: Event, _end: Event) -> Result<f32> {
        Err(Error::unsupported("TODO(vendor): call cuEventElapsedTime"))
    }
    fn mem_copy_async(
        &self,
        _dst: DevicePtr,
        _src: DevicePtr,
        _bytes: usize,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuMemcpyAsync"))
    }
    fn mem_set_async(
        &self,
        _dst: DevicePtr,
        _value: u8,
        _bytes: usize,
        _stream: Stream,
    ) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuMemsetD8Async"))
    }
    fn launch_host_func(&self, _stream: Stream, _call: HostCall) -> Result<()> {
        Err(Error::unsupported(
            "TODO(vendor): call cuLaunchHostFunc with a trampoline that runs `call.run()`",
        ))
    }

    // -- Fourth: sharing memory with other processes of the node. --

    fn ipc_export(&self, _ptr: DevicePtr) -> Result<Vec<u8>> {
        Err(Error::unsupported(
            "TODO(vendor): call cuIpcGetMemHandle and return its bytes",
        ))
    }
    fn ipc_import(&self, _handle: &[u8]) -> Result<DevicePtr> {
        Err(Error::unsupported(
            "TODO(vendor): call cuIpcOpenMemHandle on the bytes ipc_export returned",
        ))
    }
    fn ipc_close(&self, _ptr: DevicePtr) -> Result<()> {
        Err(Error::unsupported("TODO(vendor): call cuIpcCloseMemHandle"))
    }
}
