//! The kernel group of the CUDA adaptor (`ferrocx_device_kernel_v1`): modules loaded from
//! images, their functions launched on streams.
//!
//! - `kernel_image_formats`: CUBIN, PTX (compiled by the driver's JIT) and FATBIN, on every
//!   device. An image for another architecture is refused by the driver at `module_load`.
//! - `module_load` is `cuModuleLoadData` in the primary context of the calling thread's device
//!   (made current as every other entry does); a PTX image is NUL-terminated first (the ABI
//!   passes its length, the driver wants a C string). The driver's "no binary for this GPU"
//!   and "invalid image" are `INVALID_ARGUMENT`.
//! - `module_get_function` is `cuModuleGetFunction`; `module_unload` is `cuModuleUnload`, in
//!   the module's context.
//! - `launch_kernel` is `cuLaunchKernel` with `kernelParams` in the primary context of the
//!   device the function's module was loaded on, whichever device the calling thread selected
//!   (a `CUfunction` launches only in its own context).

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys::{CUfunction, CUmodule, CUresult};
use ferrocx_plugin_sdk::prelude::*;

use crate::driver::error;
use crate::CudaDevice;

/// The formats every CUDA device loads, best first.
const FORMATS: [ImageFormat; 3] = [ImageFormat::CUBIN, ImageFormat::PTX, ImageFormat::FATBIN];

/// The device each loaded module and function belongs to (by handle value).
#[derive(Default)]
struct Owners {
    modules: HashMap<usize, i32>,
    functions: HashMap<usize, (i32, usize)>,
}

fn owners() -> std::sync::MutexGuard<'static, Owners> {
    static OWNERS: OnceLock<Mutex<Owners>> = OnceLock::new();
    OWNERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn module_device(m: ModuleHandle) -> Result<i32> {
    owners()
        .modules
        .get(&(m.0 as usize))
        .copied()
        .ok_or_else(|| Error::invalid_handle("a module this adaptor did not load (or unloaded)"))
}

impl DeviceKernel for CudaDevice {
    fn kernel_image_formats(&self, device: i32) -> Result<Vec<ImageFormat>> {
        let st = self.state()?;
        st.ordinal(device)?;
        Ok(FORMATS.to_vec())
    }

    fn module_load(&self, image: &[u8], format: ImageFormat) -> Result<ModuleHandle> {
        let st = self.ready()?;
        if !FORMATS.contains(&format) {
            return Err(Error::invalid_argument(format!(
                "the CUDA adaptor loads {FORMATS:?} images, not {format:?}"
            )));
        }
        let device = self.get_device()?;
        let terminated;
        let data: &[u8] = if format == ImageFormat::PTX && image.last() != Some(&0) {
            terminated = [image, &[0]].concat();
            &terminated
        } else {
            image
        };
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and a whole image in memory for the call (a NUL-terminated
        // one for PTX); the driver validates its contents. The thread's context is current.
        let r = unsafe { (st.lib.cuModuleLoadData)(&mut module, data.as_ptr().cast()) };
        match r {
            CUresult::CUDA_SUCCESS => {}
            CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU
            | CUresult::CUDA_ERROR_INVALID_IMAGE
            | CUresult::CUDA_ERROR_INVALID_PTX
            | CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
                let e = error(st.lib, "cuModuleLoadData", r);
                return Err(Error::invalid_argument(format!(
                    "{} (a {format:?} image device {device} cannot run)",
                    e.message()
                )));
            }
            _ => return Err(error(st.lib, "cuModuleLoadData", r)),
        }
        owners().modules.insert(module as usize, device);
        Ok(ModuleHandle(module.cast()))
    }

    fn module_unload(&self, m: ModuleHandle) -> Result<()> {
        let st = self.state()?;
        let device = module_device(m)?;
        st.make_current(device)?;
        // SAFETY: a module this adaptor loaded, in its own context, unloaded once (its record
        // is removed below, so a second unload is INVALID_HANDLE).
        let r = unsafe { (st.lib.cuModuleUnload)(m.0.cast()) };
        let mut o = owners();
        o.modules.remove(&(m.0 as usize));
        o.functions.retain(|_, (_, module)| *module != m.0 as usize);
        drop(o);
        st.check("cuModuleUnload", r)
    }

    fn module_get_function(&self, m: ModuleHandle, name: &CStr) -> Result<FunctionHandle> {
        let st = self.state()?;
        let device = module_device(m)?;
        let mut f: CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module, a NUL-terminated name and a valid out-pointer; looking a
        // function up needs no current context.
        let r = unsafe { (st.lib.cuModuleGetFunction)(&mut f, m.0.cast(), name.as_ptr()) };
        if r == CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(Error::invalid_argument(format!(
                "the module has no function {name:?}"
            )));
        }
        st.check("cuModuleGetFunction", r)?;
        owners()
            .functions
            .insert(f as usize, (device, m.0 as usize));
        Ok(FunctionHandle(f.cast()))
    }

    unsafe fn launch_kernel(&self, f: FunctionHandle, l: &Launch, s: Stream) -> Result<()> {
        let st = self.state()?;
        let (device, _) = owners()
            .functions
            .get(&(f.0 as usize))
            .copied()
            .ok_or_else(|| Error::invalid_handle("a function this adaptor did not look up"))?;
        st.make_current(device)?;
        // SAFETY: a function of a loaded module, in its context; the grid and block were
        // checked non-zero by the SDK; `args` is the caller's `kernelParams`, matching the
        // kernel by the ABI's contract (the driver copies the values before returning); the
        // stream is a CUstream of this adaptor (null: the legacy default stream).
        let r = unsafe {
            (st.lib.cuLaunchKernel)(
                f.0.cast(),
                l.grid[0],
                l.grid[1],
                l.grid[2],
                l.block[0],
                l.block[1],
                l.block[2],
                l.shared_mem_bytes,
                s.0.cast(),
                l.args,
                std::ptr::null_mut(),
            )
        };
        st.check("cuLaunchKernel", r)
    }
}

/// The kernel group table of the built-in adaptor.
pub(crate) static KERNEL: ferrocx::abi::DeviceKernelV1 =
    ferrocx_plugin_sdk::kernel_table::<CudaDevice>(crate::NAME);
