//! The kernel group (`ferrocx_device_kernel_v1`, ABI 1.2): modules loaded from images, their
//! functions launched on streams.

use std::ffi::{c_char, c_void, CStr};

use ferrocx::abi::{
    AbiHeader, DeviceKernelV1, FunctionHandle, ImageFormat, KernelLaunch, ModuleHandle, Status,
    Stream,
};

use crate::boundary::{call, read_bytes, write_out};
use crate::error::{Error, Result};

use super::DeviceAdaptor;

/// A launch as the trampoline read it from the caller's [`KernelLaunch`] (fields past the
/// caller's `struct_size` take their defaults).
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// Blocks in x, y, z (each at least 1: checked before the adaptor is called).
    pub grid: [u32; 3],
    /// Threads per block in x, y, z (each at least 1: checked).
    pub block: [u32; 3],
    /// Bytes of dynamic shared memory per block.
    pub shared_mem_bytes: u32,
    /// One pointer per kernel parameter, each to the parameter's value (null when `n_args` is
    /// 0; otherwise non-null, checked).
    pub args: *mut *mut c_void,
    /// Number of `args`.
    pub n_args: usize,
}

/// The kernel group (`ferrocx_device_kernel_v1`): device code loaded from an image (PTX,
/// CUBIN, a vendor's format) and launched on a stream.
pub trait DeviceKernel: DeviceAdaptor {
    /// The image formats `device` loads, best first.
    fn kernel_image_formats(&self, device: i32) -> Result<Vec<ImageFormat>>;
    /// Loads `image` of `format` onto the calling thread's current device. Refuse an image the
    /// device cannot run with `INVALID_ARGUMENT` and the reason.
    fn module_load(&self, image: &[u8], format: ImageFormat) -> Result<ModuleHandle>;
    /// Unloads a module.
    fn module_unload(&self, module: ModuleHandle) -> Result<()>;
    /// The function `name` of a loaded module.
    fn module_get_function(&self, module: ModuleHandle, name: &CStr) -> Result<FunctionHandle>;
    /// Enqueues one run of `function` on `stream`.
    ///
    /// # Safety
    /// `launch.args` holds `launch.n_args` pointers, each to a value of the matching parameter
    /// of the kernel: the caller's contract, which the adaptor cannot check.
    unsafe fn launch_kernel(
        &self,
        function: FunctionHandle,
        launch: &Launch,
        stream: Stream,
    ) -> Result<()>;
}

/// Reads a caller's launch: at most its `struct_size` bytes, the rest from the defaults.
///
/// # Safety
/// `launch` is non-null and holds at least its `struct_size` readable bytes.
unsafe fn read_launch(launch: *const KernelLaunch) -> Result<Launch> {
    // SAFETY: the first word is readable by the caller's contract.
    let declared = unsafe { std::ptr::read_unaligned(launch.cast::<u32>()) } as usize;
    if declared < std::mem::offset_of!(KernelLaunch, grid) {
        return Err(Error::invalid_argument("`launch.struct_size` is too small"));
    }
    let mut full = KernelLaunch::default();
    let n = declared.min(std::mem::size_of::<KernelLaunch>());
    // SAFETY: `n` bytes are readable at `launch` and fit in `full`; every field is a plain
    // integer or pointer, so any bytes are a valid value.
    unsafe {
        std::ptr::copy_nonoverlapping(
            launch.cast::<u8>(),
            (&mut full as *mut KernelLaunch).cast::<u8>(),
            n,
        )
    };
    if full.grid.contains(&0) || full.block.contains(&0) {
        return Err(Error::invalid_argument(format!(
            "grid {:?} and block {:?} need at least 1 in every dimension",
            full.grid, full.block
        )));
    }
    if full.n_args > 0 && full.args.is_null() {
        return Err(Error::invalid_argument(format!(
            "`launch.args` is null with {} arguments",
            full.n_args
        )));
    }
    Ok(Launch {
        grid: full.grid,
        block: full.block,
        shared_mem_bytes: full.shared_mem_bytes,
        args: full.args,
        n_args: full.n_args,
    })
}

/// The trampolines of the group, generic over the adaptor.
mod tramp {
    use super::*;

    pub unsafe extern "C" fn kernel_image_formats<A: DeviceKernel>(
        device: i32,
        formats: *mut ImageFormat,
        len: *mut usize,
    ) -> Status {
        crate::boundary::guard("kernel_image_formats", || {
            if len.is_null() {
                return Err(Error::invalid_argument("`len` is null"));
            }
            let all = A::instance().kernel_image_formats(device)?;
            // SAFETY: checked non-null; readable and writable by the ABI's contract.
            let room = unsafe { *len };
            // SAFETY: as above.
            unsafe { write_out(len, "len", all.len()) }?;
            if formats.is_null() {
                return Ok(Status::SUCCESS);
            }
            if room < all.len() {
                return Ok(Status::BUFFER_TOO_SMALL);
            }
            // SAFETY: `formats` holds `room` >= `all.len()` writable values by the contract.
            unsafe { std::ptr::copy_nonoverlapping(all.as_ptr(), formats, all.len()) };
            Ok(Status::SUCCESS)
        })
    }
    pub unsafe extern "C" fn module_load<A: DeviceKernel>(
        image: *const u8,
        bytes: usize,
        format: ImageFormat,
        out: *mut ModuleHandle,
    ) -> Status {
        call("module_load", || {
            if out.is_null() {
                return Err(Error::invalid_argument("`module` is null"));
            }
            if bytes == 0 {
                return Err(Error::invalid_argument("the image is empty"));
            }
            // SAFETY: `bytes` readable bytes at `image` by the ABI's contract.
            let image = unsafe { read_bytes(image, bytes, "image") }?;
            let m = A::instance().module_load(image, format)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "module", m) }
        })
    }
    pub unsafe extern "C" fn module_unload<A: DeviceKernel>(m: ModuleHandle) -> Status {
        call("module_unload", || A::instance().module_unload(m))
    }
    pub unsafe extern "C" fn module_get_function<A: DeviceKernel>(
        m: ModuleHandle,
        name: *const c_char,
        out: *mut FunctionHandle,
    ) -> Status {
        call("module_get_function", || {
            if out.is_null() || name.is_null() {
                return Err(Error::invalid_argument("`name` or `function` is null"));
            }
            // SAFETY: non-null and NUL-terminated by the ABI's contract.
            let name = unsafe { CStr::from_ptr(name) };
            let f = A::instance().module_get_function(m, name)?;
            // SAFETY: checked non-null above.
            unsafe { write_out(out, "function", f) }
        })
    }
    pub unsafe extern "C" fn launch_kernel<A: DeviceKernel>(
        f: FunctionHandle,
        launch: *const KernelLaunch,
        s: Stream,
    ) -> Status {
        call("launch_kernel", || {
            if launch.is_null() {
                return Err(Error::invalid_argument("`launch` is null"));
            }
            // SAFETY: non-null; `struct_size` readable bytes by the ABI's contract.
            let l = unsafe { read_launch(launch) }?;
            // SAFETY: the arguments are the caller's, passed on as the ABI's contract requires.
            unsafe { A::instance().launch_kernel(f, &l, s) }
        })
    }
}

/// Builds the kernel group table of `A`.
pub const fn kernel_table<A: DeviceKernel>(name: &'static std::ffi::CStr) -> DeviceKernelV1 {
    use tramp::*;
    DeviceKernelV1 {
        header: AbiHeader::new::<DeviceKernelV1>(name),
        kernel_image_formats: Some(kernel_image_formats::<A>),
        module_load: Some(module_load::<A>),
        module_unload: Some(module_unload::<A>),
        module_get_function: Some(module_get_function::<A>),
        launch_kernel: Some(launch_kernel::<A>),
    }
}
