//! The few CUDA driver entry points the watchdog needs, opened with `dlopen` like libnccl: the
//! adaptor links no CUDA library, so it builds and loads on machines without a driver.
//!
//! Only symbols present since CUDA 10.1 are bound, so any driver NCCL itself runs on will do.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use ferrocx_plugin_sdk::prelude::*;
use libloading::Library;

/// `CUresult`.
pub(crate) type CUresult = c_int;
/// `CUDA_SUCCESS`.
pub(crate) const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_NOT_READY`: the event has not completed yet.
pub(crate) const CUDA_ERROR_NOT_READY: CUresult = 600;
/// `CUevent`.
pub(crate) type CUevent = *mut c_void;
/// `CUstream` (what a ferrocx `Stream` of the CUDA adaptor is).
pub(crate) type CUstream = *mut c_void;
/// `CUcontext`.
pub(crate) type CUcontext = *mut c_void;
/// `CU_EVENT_DISABLE_TIMING`: an event that only orders and signals, the cheapest kind.
pub(crate) const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_STREAM_CAPTURE_STATUS_NONE` (`CUstreamCaptureStatus`).
pub(crate) const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` (`CUstreamCaptureMode`): calls on this thread never
/// invalidate a capture another thread runs in global mode.
pub(crate) const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;

/// The bound entry points (their C names, as in `cuda.h`).
#[allow(non_snake_case)]
pub(crate) struct Driver {
    pub cuGetErrorName: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
    pub cuCtxGetCurrent: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
    pub cuCtxSetCurrent: unsafe extern "C" fn(CUcontext) -> CUresult,
    pub cuCtxPushCurrent_v2: unsafe extern "C" fn(CUcontext) -> CUresult,
    pub cuCtxPopCurrent_v2: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
    pub cuEventCreate: unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult,
    pub cuEventRecord: unsafe extern "C" fn(CUevent, CUstream) -> CUresult,
    pub cuEventQuery: unsafe extern "C" fn(CUevent) -> CUresult,
    pub cuEventDestroy_v2: unsafe extern "C" fn(CUevent) -> CUresult,
    pub cuStreamIsCapturing: unsafe extern "C" fn(CUstream, *mut c_int) -> CUresult,
    pub cuThreadExchangeStreamCaptureMode: unsafe extern "C" fn(*mut c_int) -> CUresult,
}

/// The driver, opened once per process (never unloaded); later calls return the first outcome.
pub(crate) fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<&'static Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(open)
        .clone()
        .map_err(|why| Error::new(Status::UNSUPPORTED, why))
}

#[allow(non_snake_case)]
fn open() -> std::result::Result<&'static Driver, String> {
    const PATH: &str = "libcuda.so.1";
    // SAFETY: loading the driver runs its initialisers, which are sound at any time; the handle
    // is leaked on purpose (never unloaded), so the pointers below stay valid.
    let lib: &'static Library = match unsafe { Library::new(PATH) } {
        Ok(lib) => Box::leak(Box::new(lib)),
        Err(e) => return Err(format!("{PATH} not found: {e}")),
    };
    let mut missing = Vec::new();
    macro_rules! bind {
        ($name:ident) => {{
            // SAFETY: the field's type is the symbol's declaration in `cuda.h`.
            match unsafe { lib.get(concat!(stringify!($name), "\0").as_bytes()) } {
                Ok(s) => Some(*s),
                Err(_) => {
                    missing.push(stringify!($name));
                    None
                }
            }
        }};
    }
    let cu_init: Option<unsafe extern "C" fn(c_uint) -> CUresult> = bind!(cuInit);
    let (
        Some(cuInit),
        Some(cuGetErrorName),
        Some(cuCtxGetCurrent),
        Some(cuCtxSetCurrent),
        Some(cuCtxPushCurrent_v2),
        Some(cuCtxPopCurrent_v2),
        Some(cuEventCreate),
        Some(cuEventRecord),
        Some(cuEventQuery),
        Some(cuEventDestroy_v2),
        Some(cuStreamIsCapturing),
        Some(cuThreadExchangeStreamCaptureMode),
    ) = (
        cu_init,
        bind!(cuGetErrorName),
        bind!(cuCtxGetCurrent),
        bind!(cuCtxSetCurrent),
        bind!(cuCtxPushCurrent_v2),
        bind!(cuCtxPopCurrent_v2),
        bind!(cuEventCreate),
        bind!(cuEventRecord),
        bind!(cuEventQuery),
        bind!(cuEventDestroy_v2),
        bind!(cuStreamIsCapturing),
        bind!(cuThreadExchangeStreamCaptureMode),
    )
    else {
        return Err(format!(
            "{PATH} lacks {} (a driver older than CUDA 10.1)",
            missing.join(", ")
        ));
    };
    // SAFETY: no pointers; initialising twice is a no-op.
    let rc = unsafe { cuInit(0) };
    if rc != CUDA_SUCCESS {
        return Err(format!("cuInit failed with CUresult {rc}"));
    }
    Ok(Box::leak(Box::new(Driver {
        cuGetErrorName,
        cuCtxGetCurrent,
        cuCtxSetCurrent,
        cuCtxPushCurrent_v2,
        cuCtxPopCurrent_v2,
        cuEventCreate,
        cuEventRecord,
        cuEventQuery,
        cuEventDestroy_v2,
        cuStreamIsCapturing,
        cuThreadExchangeStreamCaptureMode,
    })))
}

impl Driver {
    /// `"cuXxx failed: CUDA_ERROR_NAME (code)"`.
    pub(crate) fn describe(&self, op: &str, rc: CUresult) -> String {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: a valid out-pointer; the driver stores a static string in it.
        let ok = unsafe { (self.cuGetErrorName)(rc, &mut name) } == CUDA_SUCCESS;
        let name = if ok && !name.is_null() {
            // SAFETY: non-null, NUL-terminated, static storage.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        } else {
            "unknown error".to_string()
        };
        format!("{op} failed: {name} ({rc})")
    }

    /// The calling thread's current context (null when none).
    pub(crate) fn current_context(&self) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        if unsafe { (self.cuCtxGetCurrent)(&mut ctx) } != CUDA_SUCCESS {
            return std::ptr::null_mut();
        }
        ctx
    }

    /// Makes `ctx` current on the calling thread (a thread of the adaptor's own).
    pub(crate) fn set_context(&self, ctx: CUcontext) {
        if !ctx.is_null() {
            // SAFETY: a context of this process, alive while its communicator is.
            unsafe { (self.cuCtxSetCurrent)(ctx) };
        }
    }

    /// Runs `f` with `ctx` pushed on the calling thread's context stack (a user thread whose
    /// current context must be left as it was).
    pub(crate) fn with_context<T>(&self, ctx: CUcontext, f: impl FnOnce() -> T) -> T {
        if ctx.is_null() {
            return f();
        }
        // SAFETY: a context of this process, alive while its communicator is.
        let pushed = unsafe { (self.cuCtxPushCurrent_v2)(ctx) } == CUDA_SUCCESS;
        let out = f();
        if pushed {
            let mut old: CUcontext = std::ptr::null_mut();
            // SAFETY: pops what was pushed above; a valid out-pointer.
            unsafe { (self.cuCtxPopCurrent_v2)(&mut old) };
        }
        out
    }

    /// Sets the calling thread's capture mode to thread-local, so that its event queries never
    /// invalidate a CUDA graph another thread is capturing in global mode.
    pub(crate) fn relax_capture_mode(&self) {
        let mut mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a valid in/out pointer.
        unsafe { (self.cuThreadExchangeStreamCaptureMode)(&mut mode) };
    }
}
