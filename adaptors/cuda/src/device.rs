//! The CUDA device adaptor: the SDK's [`DeviceAdaptor`] over the driver API.

use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUevent_flags, CUipcMemHandle,
    CUipcMem_flags, CUresult, CUstream, CUstream_flags,
};
use ferrocx_plugin_sdk::prelude::*;

use crate::driver::{self, check, Driver};

/// Bytes of a CUDA IPC memory handle (`CUipcMemHandle`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// NVIDIA GPUs through the CUDA driver API, loaded at run time (`libcuda.so.1`).
///
/// - `init` loads the driver and calls `cuInit`; without a driver it fails with
///   `VENDOR_ERROR` ("libcuda.so.1 not found: …"), and every other entry returns
///   `NOT_INITIALIZED` until an `init` succeeds.
/// - Each device's primary context is retained on first use and made current on the calling
///   thread by `set_device`. A thread that never called it works on the device of the context
///   current on it (PyTorch's autograd threads set theirs), as the CUDA runtime does, else on
///   device 0.
/// - A [`Stream`] *is* the `CUstream` pointer and an [`Event`] the `CUevent`, so a CCL adaptor
///   of the same vendor (NCCL) passes them on unchanged; `stream_wrap` is the identity, and
///   `stream_destroy` destroys only the streams `stream_create` made. Null is the legacy default
///   stream.
/// - Memory: `DEVICE` is `cuMemAlloc`, `PINNED` is `cuMemAllocHost`, `HOST` is `malloc`; copies
///   take any two addresses (unified addressing).
/// - The VMM and flat-map groups are the driver's virtual memory management (`cuMemCreate`
///   with POSIX file descriptors, `cuMemAddressReserve`, `cuMemMap`): see [`crate::vmm`] and
///   [`crate::flatmap`]. A device without it reports neither capability, and their entries
///   return `UNSUPPORTED` with the reason.
/// - The multicast group is gated at every call (see [`crate::multicast`]): a kill-switch in
///   the environment, a device without multicast or a driver without the symbols refuses
///   before any multicast call reaches the driver.
#[derive(Default)]
pub struct CudaDevice {
    state: RwLock<Option<Arc<State>>>,
}

/// What a successful `init` holds.
pub(crate) struct State {
    pub(crate) lib: Driver,
    /// `CUdevice` of each ordinal.
    pub(crate) devices: Vec<CUdevice>,
    /// Per ordinal: `Ok` when the device has virtual memory management with POSIX file
    /// descriptors (the VMM and flat-map groups), else why not.
    pub(crate) vmm_support: Vec<std::result::Result<(), String>>,
    /// VMM allocations and imports of this adaptor.
    pub(crate) vmm: crate::vmm::Handles,
    /// Flat reservations and their mapped slots.
    pub(crate) flat: crate::flatmap::Reservations,
    /// Multicast entry points (or why there are none), objects and mappings.
    pub(crate) mc: crate::multicast::Multicast,
    /// Primary contexts retained so far, by ordinal.
    contexts: Mutex<Vec<Option<Context>>>,
    /// Streams made by `stream_create` (the only ones `stream_destroy` destroys).
    streams: Mutex<HashSet<usize>>,
    /// `HOST` allocations, so that a wrong `mem_free` is refused rather than corrupting the heap.
    host_allocations: Mutex<HashSet<u64>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Context(CUcontext);
// SAFETY: a primary context handle is usable from any thread (the driver is thread-safe).
unsafe impl Send for Context {}

thread_local! {
    /// The device `set_device` selected on this thread (-1: none yet).
    static THREAD_DEVICE: Cell<i32> = const { Cell::new(-1) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The sets stay consistent whatever a panicking holder did: take them back.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    pub(crate) fn ordinal(&self, device: i32) -> Result<usize> {
        usize::try_from(device)
            .ok()
            .filter(|&d| d < self.devices.len())
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "device {device} does not exist ({} CUDA device(s) visible)",
                    self.devices.len()
                ))
            })
    }

    /// The primary context of `device`, retained on first use.
    fn context(&self, device: i32) -> Result<CUcontext> {
        let ordinal = self.ordinal(device)?;
        let mut contexts = lock(&self.contexts);
        if let Some(ctx) = contexts[ordinal] {
            return Ok(ctx.0);
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and a device handle from `cuDeviceGet`.
        let r = unsafe { (self.lib.cuDevicePrimaryCtxRetain)(&mut ctx, self.devices[ordinal]) };
        check(self.lib, "cuDevicePrimaryCtxRetain", r)?;
        contexts[ordinal] = Some(Context(ctx));
        Ok(ctx)
    }

    /// Makes `device`'s primary context current on this thread, unless it already is (another
    /// library on the thread may have changed it since).
    pub(crate) fn make_current(&self, device: i32) -> Result<()> {
        let ctx = self.context(device)?;
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let r = unsafe { (self.lib.cuCtxGetCurrent)(&mut current) };
        check(self.lib, "cuCtxGetCurrent", r)?;
        if current != ctx {
            // SAFETY: a context retained above and not yet released.
            let r = unsafe { (self.lib.cuCtxSetCurrent)(ctx) };
            check(self.lib, "cuCtxSetCurrent", r)?;
        }
        Ok(())
    }

    pub(crate) fn check(&self, op: &str, r: CUresult) -> Result<()> {
        check(self.lib, op, r)
    }

    /// Waits for what a "synchronous" `cuMemcpy` / `cuMemsetD8` left running: for a copy
    /// between device memory and for a memset of device memory the driver returns before the
    /// work is done (it runs on the legacy default stream), while the ABI's `mem_copy` and
    /// `mem_set` return when it is, so that another process, or the host, sees the result.
    fn finish_legacy_stream(&self, op: &str) -> Result<()> {
        // SAFETY: the legacy default stream (null) of the current context.
        let r = unsafe { (self.lib.cuStreamSynchronize)(std::ptr::null_mut()) };
        self.check(&format!("cuStreamSynchronize after {op}"), r)
    }

    /// An integer attribute of the device of `ordinal`.
    pub(crate) fn attribute(&self, ordinal: usize, a: CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: a valid out-pointer and a device handle from `cuDeviceGet`.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.lib.cuDeviceGetAttribute)(&mut v, a, self.devices[ordinal])
        })?;
        Ok(v)
    }

    /// The ordinal of the calling thread's device (checked against the device count).
    pub(crate) fn thread_ordinal(&self) -> Result<usize> {
        self.ordinal(self.thread_device())
    }

    /// The calling thread's device: the one `set_device` chose on it, else the device of the
    /// context current on it (another library's choice, which the CUDA runtime follows too:
    /// a PyTorch thread that set its device), else device 0.
    pub(crate) fn thread_device(&self) -> i32 {
        let chosen = THREAD_DEVICE.with(Cell::get);
        if chosen >= 0 {
            return chosen;
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        if unsafe { (self.lib.cuCtxGetCurrent)(&mut ctx) } != CUresult::CUDA_SUCCESS
            || ctx.is_null()
        {
            return 0;
        }
        let mut dev: CUdevice = 0;
        // SAFETY: a valid out-pointer; the thread has a current context (checked above).
        if unsafe { (self.lib.cuCtxGetDevice)(&mut dev) } != CUresult::CUDA_SUCCESS {
            return 0;
        }
        self.devices
            .iter()
            .position(|&d| d == dev)
            .map_or(0, |i| i as i32)
    }
}

/// `Ok` when device `ordinal` has virtual memory management with POSIX file descriptors, else
/// the attribute that is missing.
fn probe_vmm(st: &State, ordinal: usize) -> std::result::Result<(), String> {
    type A = CUdevice_attribute;
    for (a, name) in [
        (
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
        ),
    ] {
        match st.attribute(ordinal, a) {
            Ok(1) => {}
            Ok(v) => return Err(format!("device {ordinal}: {name} is {v}")),
            Err(e) => return Err(format!("device {ordinal}: {name}: {}", e.message())),
        }
    }
    Ok(())
}

pub(crate) fn stream(s: Stream) -> CUstream {
    s.0.cast()
}

fn event(e: Event) -> CUevent {
    e.0.cast()
}

fn not_initialized() -> Error {
    Error::new(
        Status::NOT_INITIALIZED,
        "the CUDA adaptor is not initialised (init not called, or it failed)",
    )
}

/// Runs a [`HostCall`] boxed by `launch_host_func`, on the driver's thread.
unsafe extern "C" fn run_host_call(user: *mut c_void) {
    // SAFETY: `user` is the box `launch_host_func` leaked, and the driver calls this once.
    let call = unsafe { Box::from_raw(user.cast::<HostCall>()) };
    // A panic must not unwind into the driver.
    if catch_unwind(AssertUnwindSafe(move || call.run())).is_err() {
        tracing::error!("a host function launched on a CUDA stream panicked");
    }
}

impl CudaDevice {
    /// The state of a successful `init`, or `NOT_INITIALIZED`.
    pub(crate) fn state(&self) -> Result<Arc<State>> {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(not_initialized)
    }

    /// The state, with the thread's device current: what every call that touches memory,
    /// streams or events needs.
    pub(crate) fn ready(&self) -> Result<Arc<State>> {
        let st = self.state()?;
        st.make_current(st.thread_device())?;
        Ok(st)
    }

    fn start(lib: Driver) -> Result<State> {
        // SAFETY: flags must be 0.
        check(lib, "cuInit", unsafe { (lib.cuInit)(0) })?;
        let mut count = 0;
        // SAFETY: a valid out-pointer.
        check(lib, "cuDeviceGetCount", unsafe {
            (lib.cuDeviceGetCount)(&mut count)
        })?;
        let devices = (0..count)
            .map(|i| {
                let mut dev: CUdevice = 0;
                // SAFETY: a valid out-pointer and an ordinal below the count.
                check(lib, "cuDeviceGet", unsafe {
                    (lib.cuDeviceGet)(&mut dev, i)
                })?;
                Ok(dev)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut st = State {
            lib,
            contexts: Mutex::new(vec![None; devices.len()]),
            vmm_support: Vec::new(),
            vmm: Default::default(),
            flat: Default::default(),
            mc: crate::multicast::Multicast::probe(lib),
            devices,
            streams: Mutex::default(),
            host_allocations: Mutex::default(),
        };
        st.vmm_support = (0..st.devices.len()).map(|o| probe_vmm(&st, o)).collect();
        Ok(st)
    }
}

impl DeviceAdaptor for CudaDevice {
    fn instance() -> &'static Self {
        singleton!(CudaDevice)
    }

    fn init(&self, _options: &Options) -> Result<()> {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        if state.is_some() {
            return Ok(());
        }
        // Loading never panics: a missing or too old driver is an error with the reason.
        let lib = driver::load()?;
        let started = Self::start(lib)?;
        tracing::debug!(devices = started.devices.len(), "CUDA driver initialised");
        *state = Some(Arc::new(started));
        Ok(())
    }

    fn finalize(&self) -> Result<()> {
        let taken = self.state.write().unwrap_or_else(|e| e.into_inner()).take();
        let Some(st) = taken else {
            return Err(not_initialized());
        };
        // Mappings first, then what they map: multicast objects and mappings, flat slots and
        // reservations, then VMM handles (none of which a context release frees).
        if !(st.mc.is_empty() && st.flat.is_empty() && st.vmm.is_empty()) {
            // Best effort: a context current on this thread for the releases below.
            let _ = st.make_current(st.thread_device());
        }
        let mut first_error = crate::multicast::release_all(&st);
        let flat = crate::flatmap::release_all(&st);
        let vmm = crate::vmm::release_all(&st);
        for r in [flat, vmm] {
            if first_error.is_ok() {
                first_error = r;
            }
        }
        // Releasing the last reference to a primary context destroys it with its streams,
        // events and memory.
        let contexts = lock(&st.contexts).clone();
        for (ordinal, ctx) in contexts.iter().enumerate() {
            if ctx.is_some() {
                // SAFETY: a device whose primary context this adaptor retained once.
                let r = unsafe { (st.lib.cuDevicePrimaryCtxRelease_v2)(st.devices[ordinal]) };
                if first_error.is_ok() {
                    first_error = st.check("cuDevicePrimaryCtxRelease", r);
                }
            }
        }
        for &p in lock(&st.host_allocations).iter() {
            // SAFETY: a live `malloc` allocation of this adaptor, freed once.
            unsafe { libc::free(p as *mut c_void) };
        }
        first_error
    }

    fn device_count(&self) -> Result<i32> {
        let n = self.state()?.devices.len();
        i32::try_from(n).map_err(|_| Error::internal("device count overflows i32"))
    }

    fn set_device(&self, device: i32) -> Result<()> {
        self.state()?.make_current(device)?;
        THREAD_DEVICE.with(|d| d.set(device));
        Ok(())
    }

    fn get_device(&self) -> Result<i32> {
        Ok(self.state()?.thread_device())
    }

    fn properties(&self, device: i32) -> Result<Properties> {
        let st = self.state()?;
        let dev = st.devices[st.ordinal(device)?];
        let lib = st.lib;
        let mut name = [0 as c_char; 256];
        // SAFETY: `name` holds the length passed.
        st.check("cuDeviceGetName", unsafe {
            (lib.cuDeviceGetName)(name.as_mut_ptr(), name.len() as i32, dev)
        })?;
        let name: Vec<u8> = name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        let mut total = 0usize;
        // SAFETY: a valid out-pointer and device handle.
        st.check("cuDeviceTotalMem", unsafe {
            (lib.cuDeviceTotalMem_v2)(&mut total, dev)
        })?;
        let attribute = |a: CUdevice_attribute| -> Result<i32> {
            let mut v = 0;
            // SAFETY: a valid out-pointer and device handle.
            st.check("cuDeviceGetAttribute", unsafe {
                (lib.cuDeviceGetAttribute)(&mut v, a, dev)
            })?;
            Ok(v)
        };
        let major = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let ordinal = st.ordinal(device)?;
        let mut capabilities = Capabilities::IPC
            | Capabilities::HOST_FUNC
            | Capabilities::STREAM_WRAP
            | Capabilities::TIMED_EVENTS;
        if st.vmm_support[ordinal].is_ok() {
            capabilities = capabilities | Capabilities::VMM | Capabilities::FLAT_MAP;
        }
        // What the hardware and driver offer; the kill-switches are a policy checked at
        // every multicast call (and reported by `ferrocx info`).
        if crate::multicast::supported(&st, ordinal).is_ok() {
            capabilities = capabilities | Capabilities::MULTICAST;
        }
        Ok(Properties {
            vendor: "NVIDIA".into(),
            name: String::from_utf8_lossy(&name).into_owned(),
            capabilities,
            total_memory: total as u64,
            arch: u32::try_from(major * 10 + minor).unwrap_or(0),
            device_count: st.devices.len() as i32,
        })
    }

    fn mem_alloc(&self, bytes: usize, kind: MemKind) -> Result<DevicePtr> {
        let st = self.ready()?;
        if bytes == 0 {
            return Err(Error::invalid_argument("a zero-size allocation"));
        }
        match kind {
            MemKind::DEVICE => {
                let mut p: CUdeviceptr = 0;
                // SAFETY: a valid out-pointer; the thread's context is current.
                st.check("cuMemAlloc", unsafe {
                    (st.lib.cuMemAlloc_v2)(&mut p, bytes)
                })?;
                Ok(DevicePtr(p))
            }
            MemKind::PINNED => {
                let mut p: *mut c_void = std::ptr::null_mut();
                // SAFETY: as above.
                st.check("cuMemAllocHost", unsafe {
                    (st.lib.cuMemAllocHost_v2)(&mut p, bytes)
                })?;
                Ok(DevicePtr(p as u64))
            }
            MemKind::HOST => {
                // SAFETY: plain allocation of a non-zero size.
                let p = unsafe { libc::malloc(bytes) };
                if p.is_null() {
                    return Err(Error::out_of_memory(format!(
                        "malloc of {bytes} bytes failed"
                    )));
                }
                lock(&st.host_allocations).insert(p as u64);
                Ok(DevicePtr(p as u64))
            }
            other => Err(Error::invalid_argument(format!(
                "unknown memory kind {}",
                other.0
            ))),
        }
    }

    fn mem_free(&self, ptr: DevicePtr, kind: MemKind) -> Result<()> {
        let st = self.ready()?;
        match kind {
            // SAFETY: the driver checks that `ptr` is one of its allocations.
            MemKind::DEVICE => st.check("cuMemFree", unsafe { (st.lib.cuMemFree_v2)(ptr.0) }),
            MemKind::PINNED => st.check("cuMemFreeHost", unsafe {
                // SAFETY: as above.
                (st.lib.cuMemFreeHost)(ptr.0 as *mut c_void)
            }),
            MemKind::HOST => {
                if !lock(&st.host_allocations).remove(&ptr.0) {
                    return Err(Error::invalid_handle(format!(
                        "{:#x} is not a HOST allocation of this adaptor",
                        ptr.0
                    )));
                }
                // SAFETY: a live `malloc` allocation, removed from the set so freed once.
                unsafe { libc::free(ptr.0 as *mut c_void) };
                Ok(())
            }
            other => Err(Error::invalid_argument(format!(
                "unknown memory kind {}",
                other.0
            ))),
        }
    }

    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: the caller owns both ranges (ABI contract); unified addressing tells the
        // driver where each lives.
        st.check("cuMemcpy", unsafe {
            (st.lib.cuMemcpy)(dst.0, src.0, bytes)
        })?;
        st.finish_legacy_stream("cuMemcpy")
    }

    fn mem_copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: Stream,
    ) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: as for `mem_copy`; `s` is a stream of this adaptor or a wrapped one.
        st.check("cuMemcpyAsync", unsafe {
            (st.lib.cuMemcpyAsync)(dst.0, src.0, bytes, stream(s))
        })
    }

    fn mem_set(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: the caller owns the range.
        st.check("cuMemsetD8", unsafe {
            (st.lib.cuMemsetD8_v2)(dst.0, value, bytes)
        })?;
        st.finish_legacy_stream("cuMemsetD8")
    }

    fn mem_set_async(&self, dst: DevicePtr, value: u8, bytes: usize, s: Stream) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: as above.
        st.check("cuMemsetD8Async", unsafe {
            (st.lib.cuMemsetD8Async)(dst.0, value, bytes, stream(s))
        })
    }

    /// Streams are always non-blocking: ordering is done with events, never by the legacy
    /// default stream's implicit synchronisation.
    fn stream_create(&self, flags: u32) -> Result<Stream> {
        let st = self.ready()?;
        if flags > 1 {
            return Err(Error::invalid_argument(format!(
                "unknown stream flags {flags:#x}"
            )));
        }
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the thread's context is current.
        st.check("cuStreamCreate", unsafe {
            (st.lib.cuStreamCreate)(&mut s, CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        lock(&st.streams).insert(s as usize);
        Ok(Stream(s.cast()))
    }

    fn stream_wrap(&self, native: *mut c_void) -> Result<Stream> {
        self.state()?;
        Ok(Stream(native))
    }

    fn stream_destroy(&self, s: Stream) -> Result<()> {
        let st = self.ready()?;
        if !lock(&st.streams).remove(&(s.0 as usize)) {
            // A wrapped stream (or the default one) belongs to whoever created it.
            return Ok(());
        }
        // SAFETY: a stream `stream_create` made, removed from the set so destroyed once.
        st.check("cuStreamDestroy", unsafe {
            (st.lib.cuStreamDestroy_v2)(stream(s))
        })
    }

    fn stream_synchronize(&self, s: Stream) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: a stream handle of this adaptor.
        st.check("cuStreamSynchronize", unsafe {
            (st.lib.cuStreamSynchronize)(stream(s))
        })
    }

    fn stream_query(&self, s: Stream) -> Result<bool> {
        let st = self.ready()?;
        // SAFETY: as above.
        match unsafe { (st.lib.cuStreamQuery)(stream(s)) } {
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => st.check("cuStreamQuery", r).map(|()| true),
        }
    }

    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: handles of this adaptor; flags must be 0.
        st.check("cuStreamWaitEvent", unsafe {
            (st.lib.cuStreamWaitEvent)(stream(s), event(e), 0)
        })
    }

    fn event_create(&self, flags: u32) -> Result<Event> {
        let st = self.ready()?;
        let cu_flags = match flags {
            0 => CUevent_flags::CU_EVENT_DEFAULT,
            1 => CUevent_flags::CU_EVENT_DISABLE_TIMING,
            _ => {
                return Err(Error::invalid_argument(format!(
                    "unknown event flags {flags:#x}"
                )))
            }
        };
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the thread's context is current.
        st.check("cuEventCreate", unsafe {
            (st.lib.cuEventCreate)(&mut e, cu_flags as u32)
        })?;
        Ok(Event(e.cast()))
    }

    fn event_destroy(&self, e: Event) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: an event of this adaptor.
        st.check("cuEventDestroy", unsafe {
            (st.lib.cuEventDestroy_v2)(event(e))
        })
    }

    fn event_record(&self, e: Event, s: Stream) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: handles of this adaptor.
        st.check("cuEventRecord", unsafe {
            (st.lib.cuEventRecord)(event(e), stream(s))
        })
    }

    fn event_synchronize(&self, e: Event) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: an event of this adaptor.
        st.check("cuEventSynchronize", unsafe {
            (st.lib.cuEventSynchronize)(event(e))
        })
    }

    fn event_query(&self, e: Event) -> Result<bool> {
        let st = self.ready()?;
        // SAFETY: as above.
        match unsafe { (st.lib.cuEventQuery)(event(e)) } {
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => st.check("cuEventQuery", r).map(|()| true),
        }
    }

    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32> {
        let st = self.ready()?;
        let mut ms = 0f32;
        // SAFETY: a valid out-pointer and events of this adaptor.
        st.check("cuEventElapsedTime", unsafe {
            (st.lib.cuEventElapsedTime)(&mut ms, event(start), event(end))
        })?;
        Ok(ms)
    }

    fn launch_host_func(&self, s: Stream, call: HostCall) -> Result<()> {
        let st = self.ready()?;
        let user = Box::into_raw(Box::new(call));
        // SAFETY: `run_host_call` takes back the box exactly once when the driver calls it.
        let r = unsafe { (st.lib.cuLaunchHostFunc)(stream(s), Some(run_host_call), user.cast()) };
        if r != CUresult::CUDA_SUCCESS {
            // SAFETY: the driver refused the launch, so it will never call `run_host_call`.
            drop(unsafe { Box::from_raw(user) });
        }
        st.check("cuLaunchHostFunc", r)
    }

    fn ipc_export(&self, ptr: DevicePtr) -> Result<Vec<u8>> {
        let st = self.ready()?;
        let mut handle = CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: a valid out-pointer; the driver checks `ptr` is a `cuMemAlloc` allocation.
        st.check("cuIpcGetMemHandle", unsafe {
            (st.lib.cuIpcGetMemHandle)(&mut handle, ptr.0)
        })?;
        Ok(handle.reserved.iter().map(|&c| c as u8).collect())
    }

    fn ipc_import(&self, bytes: &[u8]) -> Result<DevicePtr> {
        let st = self.ready()?;
        if bytes.len() != IPC_HANDLE_BYTES {
            return Err(Error::invalid_argument(format!(
                "a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, got {}",
                bytes.len()
            )));
        }
        let mut handle = CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        for (d, &b) in handle.reserved.iter_mut().zip(bytes) {
            *d = b as c_char;
        }
        let mut p: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; the driver validates the handle.
        st.check("cuIpcOpenMemHandle", unsafe {
            (st.lib.cuIpcOpenMemHandle_v2)(
                &mut p,
                handle,
                CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        })?;
        Ok(DevicePtr(p))
    }

    fn ipc_close(&self, ptr: DevicePtr) -> Result<()> {
        let st = self.ready()?;
        // SAFETY: the driver checks that `ptr` came from `cuIpcOpenMemHandle`.
        st.check("cuIpcCloseMemHandle", unsafe {
            (st.lib.cuIpcCloseMemHandle)(ptr.0)
        })
    }

    fn mem_get_info(&self) -> Result<MemInfo> {
        let st = self.ready()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers; the thread's context is current.
        st.check("cuMemGetInfo", unsafe {
            (st.lib.cuMemGetInfo_v2)(&mut free, &mut total)
        })?;
        Ok(MemInfo { free, total })
    }
}
