//! The CUDA driver as this adaptor loads it, for the adaptors that pair with CUDA devices (the
//! NCCL adaptor's watchdog): one loader, so one minimum driver version (CUDA 12.8), per process.
//!
//! [`Driver::get`] fails as the device adaptor's `init` does ("libcuda.so.1 not found: …", or
//! "libcuda found but unusable (a driver older than CUDA 12.8 …)"). Its methods are the few
//! entry points another adaptor needs to follow work on the streams of this adaptor's devices:
//! contexts, events and capture status. Each is one call through the loaded driver's function
//! table: nothing is looked up or locked per call, and a failure is an error naming the call
//! ("cuEventRecord failed: CUDA_ERROR_INVALID_HANDLE (400)").
//!
//! ```
//! use ferrocx_adaptor_cuda::shared::{Driver, EVENT_DISABLE_TIMING};
//!
//! match Driver::get() {
//!     Ok(driver) => match driver.event_create(EVENT_DISABLE_TIMING) {
//!         Ok(_) => println!("an event of the current context"),
//!         Err(e) => println!("{e}"), // no current context on this thread
//!     },
//!     Err(e) => println!("no CUDA driver here: {e}"),
//! }
//! ```

use std::ffi::c_uint;
use std::path::Path;
use std::sync::OnceLock;

pub use cudarc::driver::sys::{CUcontext, CUevent, CUresult, CUstream};
use cudarc::driver::sys::{CUstreamCaptureMode, CUstreamCaptureStatus, Lib};
use ferrocx_plugin_sdk::{Error, Result};

use crate::driver;

/// `CU_EVENT_DISABLE_TIMING`: an event that only orders and signals, the cheapest kind.
pub const EVENT_DISABLE_TIMING: c_uint = 0x2;

/// The process's CUDA driver, loaded and initialised (`cuInit`); a copy is one pointer.
#[derive(Clone, Copy)]
pub struct Driver {
    lib: &'static Lib,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Driver")
    }
}

impl Driver {
    /// The driver, loaded by this adaptor's loader (the same load as the device adaptor's
    /// `init`) and initialised once; every later call returns the first outcome.
    pub fn get() -> Result<Driver> {
        static INIT: OnceLock<Result<()>> = OnceLock::new();
        let lib = driver::load()?;
        INIT.get_or_init(|| {
            // SAFETY: no pointers; initialising twice is a no-op.
            driver::check(lib, "cuInit", unsafe { (lib.cuInit)(0) })
        })
        .clone()?;
        Ok(Driver { lib })
    }

    /// Every entry point of the bindings (cudarc's CUDA 12.8 `Lib`), for the calls the methods
    /// here do not cover (a benchmark comparing driver calls, say).
    pub fn raw(&self) -> &'static Lib {
        self.lib
    }

    /// `Ok` for `CUDA_SUCCESS`, else the error of `op`, built out of line.
    #[inline]
    fn check(&self, op: &str, r: CUresult) -> Result<()> {
        if r == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(op, r))
        }
    }

    #[cold]
    #[inline(never)]
    fn error(&self, op: &str, r: CUresult) -> Error {
        driver::error(self.lib, op, r)
    }

    /// The calling thread's current context (null when it has none).
    pub fn current_context(&self) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        if unsafe { (self.lib.cuCtxGetCurrent)(&mut ctx) } != CUresult::CUDA_SUCCESS {
            return std::ptr::null_mut();
        }
        ctx
    }

    /// Makes `ctx` the calling thread's current context; a null `ctx` leaves the thread's
    /// context as it is.
    ///
    /// # Safety
    /// `ctx` is null or a context of this process that is alive.
    pub unsafe fn set_context(&self, ctx: CUcontext) -> Result<()> {
        if ctx.is_null() {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        self.check("cuCtxSetCurrent", unsafe {
            (self.lib.cuCtxSetCurrent)(ctx)
        })
    }

    /// Runs `f` with `ctx` pushed on the calling thread's context stack, then pops it, so the
    /// thread's current context is left as it was; a null `ctx` (or a failed push) runs `f` as
    /// the thread stands.
    ///
    /// # Safety
    /// `ctx` is null or a context of this process that is alive; `f` leaves the context stack
    /// as it found it.
    pub unsafe fn with_context<T>(&self, ctx: CUcontext, f: impl FnOnce() -> T) -> T {
        if ctx.is_null() {
            return f();
        }
        // SAFETY: the caller's contract.
        let pushed = unsafe { (self.lib.cuCtxPushCurrent_v2)(ctx) } == CUresult::CUDA_SUCCESS;
        let out = f();
        if pushed {
            let mut old: CUcontext = std::ptr::null_mut();
            // SAFETY: pops what was pushed above (`f` left the stack as it found it); a valid
            // out-pointer.
            unsafe { (self.lib.cuCtxPopCurrent_v2)(&mut old) };
        }
        out
    }

    /// Sets the calling thread's stream capture mode to thread-local, so that its calls never
    /// invalidate a CUDA graph another thread is capturing in global mode.
    pub fn relax_capture_mode(&self) -> Result<()> {
        let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a valid in/out pointer to a capture mode.
        let r = unsafe { (self.lib.cuThreadExchangeStreamCaptureMode)(&mut mode) };
        self.check("cuThreadExchangeStreamCaptureMode", r)
    }

    /// A new event of the calling thread's current context, with `flags` (`cuEventCreate`).
    pub fn event_create(&self, flags: c_uint) -> Result<CUevent> {
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the driver checks the flags and the current context.
        let r = unsafe { (self.lib.cuEventCreate)(&mut event, flags) };
        self.check("cuEventCreate", r).map(|()| event)
    }

    /// Records `event` on `stream` (`cuEventRecord`).
    ///
    /// # Safety
    /// `event` is a live event and `stream` a live stream (or null, the legacy stream) of the
    /// same context.
    #[inline]
    pub unsafe fn event_record(&self, event: CUevent, stream: CUstream) -> Result<()> {
        // SAFETY: the caller's contract.
        let r = unsafe { (self.lib.cuEventRecord)(event, stream) };
        self.check("cuEventRecord", r)
    }

    /// Whether the work `event` last captured completed (`cuEventQuery`): `Ok(false)` while it
    /// is pending.
    ///
    /// # Safety
    /// `event` is a live event, its context current on the calling thread.
    #[inline]
    pub unsafe fn event_query(&self, event: CUevent) -> Result<bool> {
        // SAFETY: the caller's contract.
        match unsafe { (self.lib.cuEventQuery)(event) } {
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => self.check("cuEventQuery", r).map(|()| true),
        }
    }

    /// Destroys `event` (`cuEventDestroy`); one still pending is released when it completes.
    ///
    /// # Safety
    /// `event` is a live event, destroyed once, its context current on the calling thread.
    pub unsafe fn event_destroy(&self, event: CUevent) -> Result<()> {
        // SAFETY: the caller's contract.
        let r = unsafe { (self.lib.cuEventDestroy_v2)(event) };
        self.check("cuEventDestroy", r)
    }

    /// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`; a capture
    /// already invalidated counts as one).
    ///
    /// # Safety
    /// `stream` is a live stream, or null (the legacy stream).
    #[inline]
    pub unsafe fn stream_is_capturing(&self, stream: CUstream) -> Result<bool> {
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the caller's contract; a valid out-pointer.
        let r = unsafe { (self.lib.cuStreamIsCapturing)(stream, &mut status) };
        self.check("cuStreamIsCapturing", r)
            .map(|()| status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

/// Has this process load the driver from `path` instead of the system's `libcuda.so.1`, for
/// tests with a stand-in driver (which must define every symbol the CUDA 12.8 bindings resolve).
/// Refused once the driver was loaded or looked for, by this or by the device adaptor.
#[doc(hidden)]
pub fn use_library(path: &Path) -> Result<()> {
    driver::set_library(path)
}
