//! The few CUDA driver entry points the kernels need beyond the device table (loading a
//! module, launching a kernel, the current context), from `libcuda.so.1` opened at run time.
//! The process's other users of the driver (the CUDA device adaptor) open the same library,
//! so contexts, streams and device pointers are shared.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use super::nvrtc::symbol;

/// `CUresult`.
pub(crate) type CuResult = c_int;
/// `CUmodule`, `CUfunction`, `CUcontext`, `CUstream`: opaque pointers.
pub(crate) type Handle = *mut c_void;

/// The bound entry points.
pub(crate) struct Driver {
    pub module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> CuResult,
    pub module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> CuResult,
    pub module_unload: unsafe extern "C" fn(Handle) -> CuResult,
    #[allow(clippy::type_complexity)]
    pub launch_kernel: unsafe extern "C" fn(
        Handle,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Handle,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    pub ctx_get_current: unsafe extern "C" fn(*mut Handle) -> CuResult,
    pub ctx_set_current: unsafe extern "C" fn(Handle) -> CuResult,
    error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    _lib: libloading::Library,
}

// SAFETY: function pointers into the driver, which is thread-safe; the library is never
// unloaded (the OnceLock holds it for the process's life).
unsafe impl Send for Driver {}
// SAFETY: as above.
unsafe impl Sync for Driver {}

/// The driver, opened once.
pub(crate) fn load() -> Result<&'static Driver, String> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER.get_or_init(open).as_ref().map_err(Clone::clone)
}

fn open() -> Result<Driver, String> {
    let path = "libcuda.so.1";
    // SAFETY: loading the driver runs only its own initialisers.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("{path} not found: {e} (no NVIDIA driver on this machine)"))?;
    // SAFETY: (every call) the field's type is the driver API's C signature for the name
    // (the `_v2` names where the driver has versioned ones).
    unsafe {
        Ok(Driver {
            module_load_data: symbol(&lib, path, "cuModuleLoadData")?,
            module_get_function: symbol(&lib, path, "cuModuleGetFunction")?,
            module_unload: symbol(&lib, path, "cuModuleUnload")?,
            launch_kernel: symbol(&lib, path, "cuLaunchKernel")?,
            ctx_get_current: symbol(&lib, path, "cuCtxGetCurrent")?,
            ctx_set_current: symbol(&lib, path, "cuCtxSetCurrent")?,
            error_name: symbol(&lib, path, "cuGetErrorName")?,
            _lib: lib,
        })
    }
}

impl Driver {
    /// `Ok` for `CUDA_SUCCESS`, else `"op failed: CUDA_ERROR_NAME (code)"`.
    pub(crate) fn check(&self, op: &str, r: CuResult) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: a valid out-pointer; the driver stores a static string in it.
        let known = unsafe { (self.error_name)(r, &mut name) } == 0 && !name.is_null();
        let name = if known {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        } else {
            "unknown error".to_string()
        };
        Err(format!("{op} failed: {name} ({r})"))
    }
}
