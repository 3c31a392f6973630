//! The CUDA driver, loaded at run time: finding `libcuda` without ever panicking, and turning a
//! `CUresult` into the SDK's [`Error`].

use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUresult, Lib};
use ferrocx_plugin_sdk::{Error, Result};

/// The loaded driver: every entry point of cudarc's CUDA 12.8 bindings.
pub(crate) type Driver = &'static Lib;

/// The outcome of the one load of the process.
static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
/// The library to load instead of the system's driver (a test's stand-in): decided once, by
/// [`set_library`] or else by the load itself (as `None`), whichever comes first.
static LIBRARY: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Loads the driver once; every later call returns the same outcome (a library is never
/// unloaded, and a missing one is not looked for again).
pub(crate) fn load() -> Result<Driver> {
    DRIVER.get_or_init(open).clone().map_err(Error::vendor)
}

/// Has the one load open `path` instead of the system's driver; refused once it happened.
pub(crate) fn set_library(path: &Path) -> Result<()> {
    if LIBRARY.set(Some(path.to_path_buf())).is_err() {
        return Err(Error::invalid_argument(format!(
            "the CUDA driver was already chosen; {} can only be named before the first load",
            path.display()
        )));
    }
    Ok(())
}

/// `true` when a CUDA driver can be loaded in this process.
pub fn is_present() -> bool {
    load().is_ok()
}

fn open() -> std::result::Result<Driver, String> {
    if let Some(path) = LIBRARY.get_or_init(|| None) {
        // SAFETY: opening a library runs its initialisers only; the process named this one
        // (a stand-in whose initialisers do nothing, or a driver, whose are sound at any time).
        return match catch_unwind(AssertUnwindSafe(|| unsafe { Lib::new(path) })) {
            Ok(Ok(lib)) => Ok(Box::leak(Box::new(lib))),
            Ok(Err(e)) => Err(format!("{} not found: {e}", path.display())),
            Err(panic) => Err(too_old(panic)),
        };
    }
    // cudarc's search first, asked whether it finds a library before `culib()` is called (which
    // panics when it does not). Both resolve every symbol of the 12.8 bindings and panic when the
    // driver lacks one (a driver older than 12.8): that panic is caught here, never propagated.
    // SAFETY: opening the system's CUDA driver library runs no code of ours.
    match catch_unwind(|| unsafe { sys::is_culib_present() }) {
        Ok(true) => {
            // SAFETY: as above; `is_culib_present` just found a library that loads.
            return catch_unwind(|| unsafe { sys::culib() }).map_err(too_old);
        }
        Ok(false) => {}
        Err(panic) => return Err(too_old(panic)),
    }
    // `libcuda.so` is a development link; a driver installation always has the versioned name.
    // SAFETY: as above.
    match catch_unwind(AssertUnwindSafe(|| unsafe { Lib::new("libcuda.so.1") })) {
        Ok(Ok(lib)) => Ok(Box::leak(Box::new(lib))),
        Ok(Err(e)) => Err(format!(
            "libcuda.so.1 not found: {e} (no NVIDIA driver on this machine, or not on the loader path)"
        )),
        Err(panic) => Err(too_old(panic)),
    }
}

fn too_old(panic: Box<dyn std::any::Any + Send>) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("libcuda found but unusable (a driver older than CUDA 12.8 lacks symbols the adaptor binds): {what}")
}

/// `Ok` for `CUDA_SUCCESS`, else the error of `op` (see [`error`]).
pub(crate) fn check(lib: Driver, op: &str, r: CUresult) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(error(lib, op, r))
    }
}

/// `"cuXxx failed: CUDA_ERROR_NAME (code)"`, with the ABI status the error means: the driver's
/// out-of-memory, invalid-value, invalid-handle and not-ready errors keep their meaning (a
/// caller can fall back, knows it passed a bad argument or handle, or asks again later:
/// `cuEventElapsedTime` of a record not completed); everything else is a vendor error.
pub(crate) fn error(lib: Driver, op: &str, r: CUresult) -> Error {
    let message = format!("{op} failed: {} ({})", error_name(lib, r), r as u32);
    match r {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::out_of_memory(message),
        CUresult::CUDA_ERROR_INVALID_VALUE => Error::invalid_argument(message),
        CUresult::CUDA_ERROR_INVALID_HANDLE => Error::invalid_handle(message),
        CUresult::CUDA_ERROR_NOT_READY => {
            Error::new(ferrocx_plugin_sdk::abi::Status::NOT_READY, message)
        }
        _ => Error::vendor(message),
    }
}

fn error_name(lib: Driver, r: CUresult) -> String {
    let mut name = std::ptr::null();
    // SAFETY: `name` is a valid out-pointer; the driver stores a static string in it.
    let rc = unsafe { (lib.cuGetErrorName)(r, &mut name) };
    if rc == CUresult::CUDA_SUCCESS && !name.is_null() {
        // SAFETY: a non-null, NUL-terminated string of static storage, from the driver.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("{r:?}")
    }
}

/// Looks `symbol` up through `cuGetProcAddress` at the driver API version `version` (12010 for
/// CUDA 12.1): the address, or why there is none (the driver lacks it, or it is older than
/// `version`). A missing symbol is never a panic: the capability it serves is simply absent.
pub(crate) fn proc_address(
    lib: Driver,
    symbol: &CStr,
    version: i32,
) -> std::result::Result<std::ptr::NonNull<std::ffi::c_void>, String> {
    use sys::CUdriverProcAddressQueryResult as Found;
    let mut pfn = std::ptr::null_mut();
    // Read back as an integer: a value this build does not know is then a value, not UB.
    let mut found: u32 = u32::MAX;
    // SAFETY: a NUL-terminated name and valid out-pointers (`found` is a 32-bit slot, the size
    // of the driver's enum); the call only reads the driver's symbol table.
    let r = unsafe {
        (lib.cuGetProcAddress_v2)(
            symbol.as_ptr(),
            &mut pfn,
            version,
            sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
            (&mut found as *mut u32).cast(),
        )
    };
    let name = symbol.to_string_lossy();
    if r != CUresult::CUDA_SUCCESS {
        return Err(format!(
            "cuGetProcAddress({name}) failed: {} ({})",
            error_name(lib, r),
            r as u32
        ));
    }
    if found == Found::CU_GET_PROC_ADDRESS_SUCCESS as u32 {
        std::ptr::NonNull::new(pfn)
            .ok_or_else(|| format!("cuGetProcAddress({name}) returned a null address"))
    } else if found == Found::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT as u32 {
        Err(format!(
            "the driver's {name} is older than CUDA {}.{}",
            version / 1000,
            version % 1000 / 10
        ))
    } else {
        Err(format!("the driver has no {name}"))
    }
}
