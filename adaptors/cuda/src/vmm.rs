//! The VMM group (`ferrocx_device_vmm_v1`): physical allocations of the driver's virtual memory
//! management, exportable as POSIX file descriptors.
//!
//! - `vmm_granularity` is `cuMemGetAllocationGranularity` (minimum granularity) for a pinned
//!   allocation on the device that requests POSIX file descriptor handles; every size is
//!   rounded up to it.
//! - `vmm_alloc` is `cuMemCreate` on the calling thread's device with
//!   `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` as the requested handle type.
//! - `vmm_export_fd` is `cuMemExportToShareableHandle`: a new descriptor, the caller's to close
//!   (pass it to another process with `SCM_RIGHTS`).
//! - `vmm_import_fd` is `cuMemImportFromShareableHandle`; the descriptor stays the caller's.
//! - `vmm_release` is `cuMemRelease`: the memory is freed once every handle is released and
//!   every mapping of it is gone, in every process.
//!
//! A [`VmmHandle`] is an id of this adaptor (never a driver handle), so an unknown or released
//! one is refused with `INVALID_HANDLE` instead of reaching the driver. A device without
//! `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` and
//! `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED` gets `UNSUPPORTED` with the
//! attribute that is missing.

use std::ffi::c_void;

use cudarc::driver::sys::{
    CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationProp,
    CUmemAllocationType, CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType,
};
use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::prelude::*;

use crate::device::State;
use crate::CudaDevice;

/// The handle type every allocation of this adaptor requests and exports.
pub(crate) const POSIX_FD: CUmemAllocationHandleType =
    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// One allocation or import.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Physical {
    /// The driver's handle.
    pub(crate) handle: CUmemGenericAllocationHandle,
    /// Bytes, rounded up to the granularity.
    pub(crate) size: usize,
    /// `true` for a handle from `vmm_import_fd`.
    pub(crate) imported: bool,
}

/// The VMM handles of this adaptor, by id.
pub(crate) struct Handles(HandleTable<Physical>);

impl Default for Handles {
    fn default() -> Self {
        Handles(HandleTable::new("VMM"))
    }
}

impl Handles {
    fn insert(&self, p: Physical) -> VmmHandle {
        VmmHandle(self.0.insert(p))
    }

    /// The allocation behind `h`, or `INVALID_HANDLE`.
    pub(crate) fn get(&self, h: VmmHandle) -> Result<Physical> {
        self.0.get(h.0)
    }

    /// `true` when no handle is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The allocation properties of a pinned allocation on device `ordinal` that can be exported as
/// a POSIX file descriptor.
pub(crate) fn allocation_prop(st: &State, ordinal: usize) -> CUmemAllocationProp {
    // SAFETY: a plain C struct of integers and one pointer, for which all-zero is valid (and is
    // what the driver's documentation asks of the fields not set below).
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = POSIX_FD;
    prop.location = CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: st.devices[ordinal],
    };
    prop
}

/// `Ok` when device `ordinal` supports the VMM and flat-map groups, else `UNSUPPORTED` with
/// the reason probed at `init`.
pub(crate) fn require(st: &State, ordinal: usize) -> Result<()> {
    st.vmm_support[ordinal].clone().map_err(|why| {
        Error::unsupported(format!(
            "virtual memory management with POSIX file descriptors is not supported: {why}"
        ))
    })
}

/// The allocation granularity of device `ordinal` (checked to be supported).
pub(crate) fn granularity(st: &State, ordinal: usize) -> Result<usize> {
    require(st, ordinal)?;
    let prop = allocation_prop(st, ordinal);
    let mut g = 0usize;
    // SAFETY: valid pointers to an out-value and a filled property struct.
    st.check("cuMemGetAllocationGranularity", unsafe {
        (st.lib.cuMemGetAllocationGranularity)(
            &mut g,
            &prop,
            CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    if g == 0 {
        return Err(Error::vendor(
            "cuMemGetAllocationGranularity reported a granularity of 0",
        ));
    }
    Ok(g)
}

/// `bytes` rounded up to a multiple of `g` (non-zero), or `INVALID_ARGUMENT` on overflow.
pub(crate) fn round_up(bytes: usize, g: usize) -> Result<usize> {
    bytes.checked_next_multiple_of(g).ok_or_else(|| {
        Error::invalid_argument(format!("{bytes} bytes overflow when rounded up to {g}"))
    })
}

/// Releases every handle still held (at `finalize`): the first error, if any.
pub(crate) fn release_all(st: &State) -> Result<()> {
    let all: Vec<Physical> = st.vmm.0.take_all();
    let mut first = Ok(());
    for p in all {
        // SAFETY: a handle of this adaptor, removed from the registry so released once.
        let r = st.check("cuMemRelease", unsafe { (st.lib.cuMemRelease)(p.handle) });
        if first.is_ok() {
            first = r;
        }
    }
    first
}

impl DeviceVmm for CudaDevice {
    fn vmm_granularity(&self, device: i32) -> Result<usize> {
        let st = self.state()?;
        let ordinal = st.ordinal(device)?;
        granularity(&st, ordinal)
    }

    fn vmm_alloc(&self, bytes: usize) -> Result<VmmHandle> {
        let st = self.ready()?;
        if bytes == 0 {
            return Err(Error::invalid_argument("cannot allocate 0 bytes"));
        }
        let ordinal = st.thread_ordinal()?;
        let size = round_up(bytes, granularity(&st, ordinal)?)?;
        let prop = allocation_prop(&st, ordinal);
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer and property struct; `size` is a multiple of the
        // granularity; flags must be 0.
        st.check("cuMemCreate", unsafe {
            (st.lib.cuMemCreate)(&mut handle, size, &prop, 0)
        })?;
        Ok(st.vmm.insert(Physical {
            handle,
            size,
            imported: false,
        }))
    }

    fn vmm_export_fd(&self, h: VmmHandle) -> Result<i32> {
        let st = self.ready()?;
        let p = st.vmm.get(h)?;
        let mut fd: libc::c_int = -1;
        // SAFETY: for POSIX file descriptors the driver writes one `int` through the pointer;
        // the handle is live (looked up above); flags must be 0.
        st.check("cuMemExportToShareableHandle", unsafe {
            (st.lib.cuMemExportToShareableHandle)(
                (&mut fd as *mut libc::c_int).cast::<c_void>(),
                p.handle,
                POSIX_FD,
                0,
            )
        })?;
        if fd < 0 {
            return Err(Error::vendor(format!(
                "cuMemExportToShareableHandle returned descriptor {fd}"
            )));
        }
        Ok(fd)
    }

    fn vmm_import_fd(&self, fd: i32, bytes: usize) -> Result<VmmHandle> {
        if fd < 0 {
            return Err(Error::invalid_argument(format!(
                "{fd} is not a file descriptor"
            )));
        }
        if bytes == 0 {
            return Err(Error::invalid_argument("cannot import 0 bytes"));
        }
        let st = self.ready()?;
        let ordinal = st.thread_ordinal()?;
        let size = round_up(bytes, granularity(&st, ordinal)?)?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer; for POSIX file descriptors the "OS handle" is the
        // descriptor's value cast to a pointer, which the driver only reads (it does not take
        // ownership: the caller keeps and closes `fd`).
        st.check("cuMemImportFromShareableHandle", unsafe {
            (st.lib.cuMemImportFromShareableHandle)(
                &mut handle,
                fd as isize as *mut c_void,
                POSIX_FD,
            )
        })?;
        Ok(st.vmm.insert(Physical {
            handle,
            size,
            imported: true,
        }))
    }

    fn vmm_release(&self, h: VmmHandle) -> Result<()> {
        let st = self.ready()?;
        let p = st.vmm.0.remove(h.0)?;
        tracing::trace!(
            handle = h.0,
            size = p.size,
            imported = p.imported,
            "VMM release"
        );
        // SAFETY: a handle of this adaptor, removed from the registry so released once; the
        // driver keeps the memory while a mapping of it remains.
        st.check("cuMemRelease", unsafe { (st.lib.cuMemRelease)(p.handle) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_the_granularity() {
        let g = 2 << 20;
        assert_eq!(round_up(1, g).unwrap(), g);
        assert_eq!(round_up(g, g).unwrap(), g);
        assert_eq!(round_up(g + 1, g).unwrap(), 2 * g);
        let e = round_up(usize::MAX - 3, g).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_ARGUMENT);
    }

    #[test]
    fn handles_are_ids_of_this_adaptor() {
        let h = Handles::default();
        assert!(h.is_empty());
        let a = h.insert(Physical {
            handle: 0xdead,
            size: 4096,
            imported: true,
        });
        assert_ne!(a, VmmHandle(0), "0 is never a handle");
        let p = h.get(a).unwrap();
        assert_eq!((p.handle, p.size, p.imported), (0xdead, 4096, true));
        let e = h.get(VmmHandle(a.0 + 1)).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_HANDLE);
        assert!(e.message().contains(&format!("{:#x}", a.0 + 1)), "{e}");
    }
}
