//! The multicast group (`ferrocx_device_multicast_v1`): NVLink multicast objects, gated.
//!
//! Creating a multicast object (`cuMulticastCreate`) can take every GPU of a host out of
//! service when other jobs share it, so every entry that creates, joins or fills one —
//! `mc_create`, `mc_import_fd`, `mc_add_device`, `mc_bind`, `mc_map` — refuses with
//! `UNSUPPORTED`, before any driver call, when
//!
//! 1. a kill-switch is set in the environment *at the time of the call*: `NCCL_NVLS_ENABLE=0`
//!    or `FERROCX_MULTICAST=0` (read with [`ferrocx::config::multicast_kill_switches`]; a
//!    `FERROCX_MULTICAST` value that is not understood counts as off), the message naming the
//!    switch;
//! 2. the driver lacks one of the multicast entry points, looked up through `cuGetProcAddress`
//!    (never through a statically bound symbol): `cuMulticastCreate`, `cuMulticastAddDevice`,
//!    `cuMulticastBindMem`, `cuMulticastUnbind`, `cuMulticastGetGranularity`;
//! 3. the device's `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` is not 1 (read at the call), or
//!    it lacks the VMM group.
//!
//! The policy of the configuration (`multicast = "off"`) is the core's to apply: it never calls
//! these entries for a cluster that says "off". The entries that only take down what exists —
//! `mc_unbind`, `mc_unmap`, `mc_release`, and `mc_export_fd` — are not gated, so a switch set
//! after an object was made does not leak it. `mc_supported` reports what the hardware and
//! driver offer (conditions 2 and 3), not the policy.
//!
//! Otherwise: `mc_create` is `cuMulticastCreate` for POSIX file descriptor handles, the size
//! rounded up to `cuMulticastGetGranularity` (minimum); `mc_export_fd` / `mc_import_fd` are
//! `cuMemExportToShareableHandle` / `cuMemImportFromShareableHandle`; `mc_add_device` is
//! `cuMulticastAddDevice`; `mc_bind` is `cuMulticastBindMem` of a VMM handle; `mc_map` reserves
//! a range, `cuMemMap`s the object and sets read/write access for the calling thread's device;
//! `mc_unmap` undoes that; `mc_unbind` is `cuMulticastUnbind`; `mc_release` is `cuMemRelease`.

use std::collections::BTreeMap;
use std::ffi::{c_ulonglong, c_void, CStr};
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::sys::{
    CUdevice, CUdevice_attribute, CUdeviceptr, CUmemGenericAllocationHandle,
    CUmulticastGranularity_flags, CUmulticastObjectProp, CUresult,
};
use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::prelude::*;

use crate::device::State;
use crate::driver::{self, Driver};
use crate::{flatmap, vmm, CudaDevice};

/// The driver API version the multicast entry points are looked up at (CUDA 12.1, where they
/// appeared).
const MULTICAST_API_VERSION: i32 = 12010;

type CreateFn = unsafe extern "C" fn(
    mc: *mut CUmemGenericAllocationHandle,
    prop: *const CUmulticastObjectProp,
) -> CUresult;
type AddDeviceFn =
    unsafe extern "C" fn(mc: CUmemGenericAllocationHandle, dev: CUdevice) -> CUresult;
type BindMemFn = unsafe extern "C" fn(
    mc: CUmemGenericAllocationHandle,
    mc_offset: usize,
    mem: CUmemGenericAllocationHandle,
    mem_offset: usize,
    size: usize,
    flags: c_ulonglong,
) -> CUresult;
type UnbindFn = unsafe extern "C" fn(
    mc: CUmemGenericAllocationHandle,
    dev: CUdevice,
    mc_offset: usize,
    size: usize,
) -> CUresult;
type GranularityFn = unsafe extern "C" fn(
    granularity: *mut usize,
    prop: *const CUmulticastObjectProp,
    option: CUmulticastGranularity_flags,
) -> CUresult;

/// The driver's multicast entry points, found through `cuGetProcAddress`.
#[derive(Clone, Copy)]
pub(crate) struct Api {
    create: CreateFn,
    add_device: AddDeviceFn,
    bind_mem: BindMemFn,
    unbind: UnbindFn,
    granularity: GranularityFn,
}

impl Api {
    /// Looks every entry point up; the first that is missing is the reason there is no API.
    fn resolve(lib: Driver) -> std::result::Result<Api, String> {
        fn find(lib: Driver, name: &CStr) -> std::result::Result<*mut c_void, String> {
            driver::proc_address(lib, name, MULTICAST_API_VERSION).map(|p| p.as_ptr())
        }
        let create = find(lib, c"cuMulticastCreate")?;
        let add_device = find(lib, c"cuMulticastAddDevice")?;
        let bind_mem = find(lib, c"cuMulticastBindMem")?;
        let unbind = find(lib, c"cuMulticastUnbind")?;
        let granularity = find(lib, c"cuMulticastGetGranularity")?;
        // SAFETY: each address is the driver's entry point of that name at the CUDA 12.1 ABI
        // (non-null, from cuGetProcAddress), whose C signature the function type spells out.
        unsafe {
            Ok(Api {
                create: std::mem::transmute::<*mut c_void, CreateFn>(create),
                add_device: std::mem::transmute::<*mut c_void, AddDeviceFn>(add_device),
                bind_mem: std::mem::transmute::<*mut c_void, BindMemFn>(bind_mem),
                unbind: std::mem::transmute::<*mut c_void, UnbindFn>(unbind),
                granularity: std::mem::transmute::<*mut c_void, GranularityFn>(granularity),
            })
        }
    }
}

/// One multicast object of this process.
#[derive(Clone, Copy, Debug)]
struct Object {
    handle: CUmemGenericAllocationHandle,
    /// Bytes, rounded up to `granularity`.
    size: usize,
    granularity: usize,
}

/// A range `mc_map` mapped: bytes reserved and mapped, and bytes asked for.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    size: usize,
    bytes: usize,
}

/// What the adaptor holds for the multicast group.
pub(crate) struct Multicast {
    api: std::result::Result<Api, String>,
    objects: HandleTable<Object>,
    mappings: Mutex<BTreeMap<u64, Mapping>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Multicast {
    /// Looks the driver's multicast entry points up (no multicast call is made).
    pub(crate) fn probe(lib: Driver) -> Multicast {
        let api = Api::resolve(lib);
        if let Err(why) = &api {
            tracing::debug!("CUDA multicast unavailable: {why}");
        }
        Multicast {
            api,
            objects: HandleTable::new("multicast"),
            mappings: Mutex::default(),
        }
    }

    /// `true` when no object or mapping is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.objects.is_empty() && lock(&self.mappings).is_empty()
    }

    fn insert(&self, o: Object) -> McHandle {
        McHandle(self.objects.insert(o))
    }

    fn get(&self, mc: McHandle) -> Result<Object> {
        self.objects.get(mc.0)
    }
}

/// Why the environment forbids multicast, read through `lookup`, or `None`.
fn refusal(lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
    match ferrocx::config::multicast_kill_switches(lookup) {
        Ok(switches) => switches.into_iter().next().map(|switch| {
            format!(
                "multicast is disabled by {switch} in the environment (a kill-switch): no \
                 multicast object is created or joined"
            )
        }),
        Err(e) => Some(format!(
            "multicast is disabled: {e} (a value that is not understood counts as off)"
        )),
    }
}

/// Why the process environment forbids multicast right now (`NCCL_NVLS_ENABLE=0`,
/// `FERROCX_MULTICAST=0`, or a `FERROCX_MULTICAST` value that is not understood), or `None`.
/// Read at every call of the gated entries, before anything else.
pub fn kill_switch() -> Option<String> {
    refusal(|var| std::env::var_os(var).map(|v| v.to_string_lossy().into_owned()))
}

/// The first gate: `UNSUPPORTED` naming the kill-switch while one is set.
fn gate() -> Result<()> {
    match kill_switch() {
        Some(why) => Err(Error::unsupported(why)),
        None => Ok(()),
    }
}

/// The driver's multicast entry points when device `ordinal` can take part in multicast
/// objects, else `UNSUPPORTED` with the reason.
pub(crate) fn supported(st: &State, ordinal: usize) -> Result<Api> {
    let api = st.mc.api.as_ref().map_err(|why| {
        Error::unsupported(format!("multicast is not supported by the driver: {why}"))
    })?;
    let a = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED;
    match st.attribute(ordinal, a) {
        Ok(1) => {}
        Ok(v) => {
            return Err(Error::unsupported(format!(
                "multicast is not supported by device {ordinal} \
                 (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is {v})"
            )))
        }
        Err(e) => {
            return Err(Error::unsupported(format!(
                "multicast is not supported by device {ordinal}: \
                 CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: {}",
                e.message()
            )))
        }
    }
    vmm::require(st, ordinal)?;
    Ok(*api)
}

/// The properties of an object of `bytes` for `num_devices` devices.
fn object_prop(bytes: usize, num_devices: u32) -> CUmulticastObjectProp {
    CUmulticastObjectProp {
        numDevices: num_devices,
        size: bytes,
        handleTypes: vmm::POSIX_FD as u64,
        flags: 0,
    }
}

/// The minimum granularity of an object with `prop`.
fn granularity(st: &State, api: &Api, prop: &CUmulticastObjectProp) -> Result<usize> {
    let mut g = 0usize;
    // SAFETY: valid pointers to an out-value and a filled property struct; an entry point
    // from cuGetProcAddress with this signature.
    st.check("cuMulticastGetGranularity", unsafe {
        (api.granularity)(
            &mut g,
            prop,
            CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_MINIMUM,
        )
    })?;
    if g == 0 {
        return Err(Error::vendor(
            "cuMulticastGetGranularity reported a granularity of 0",
        ));
    }
    Ok(g)
}

/// Unmaps every mapping and releases every object still held (at `finalize`): the first
/// error.
pub(crate) fn release_all(st: &State) -> Result<()> {
    let maps = std::mem::take(&mut *lock(&st.mc.mappings));
    let objects = st.mc.objects.take_all();
    let mut first = Ok(());
    let mut keep = |r: Result<()>| {
        if first.is_ok() {
            first = r;
        }
    };
    for (ptr, m) in maps {
        // SAFETY: a mapping this adaptor made; the adaptor is being finalised.
        keep(st.check("cuMemUnmap", unsafe { (st.lib.cuMemUnmap)(ptr, m.size) }));
        // SAFETY: its reservation, now unmapped.
        keep(st.check("cuMemAddressFree", unsafe {
            (st.lib.cuMemAddressFree)(ptr, m.size)
        }));
    }
    for o in objects {
        // SAFETY: an object handle of this adaptor, removed from the registry so released once.
        keep(st.check("cuMemRelease", unsafe { (st.lib.cuMemRelease)(o.handle) }));
    }
    first
}

impl DeviceMulticast for CudaDevice {
    fn mc_supported(&self, device: i32) -> Result<bool> {
        let st = self.state()?;
        let ordinal = st.ordinal(device)?;
        Ok(supported(&st, ordinal).is_ok())
    }

    fn mc_create(&self, bytes: usize, num_devices: i32) -> Result<McHandle> {
        gate()?;
        let st = self.ready()?;
        if bytes == 0 {
            return Err(Error::invalid_argument(
                "cannot create a multicast object of 0 bytes",
            ));
        }
        let n = u32::try_from(num_devices)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{num_devices} devices: a multicast object spans at least 1"
                ))
            })?;
        let api = supported(&st, st.thread_ordinal()?)?;
        let g = granularity(&st, &api, &object_prop(bytes, n))?;
        let size = vmm::round_up(bytes, g)?;
        let prop = object_prop(size, n);
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer and property struct (size a multiple of the
        // granularity); an entry point from cuGetProcAddress with this signature. Reached only
        // with no kill-switch set, on a device that reports multicast support.
        st.check("cuMulticastCreate", unsafe {
            (api.create)(&mut handle, &prop)
        })?;
        Ok(st.mc.insert(Object {
            handle,
            size,
            granularity: g,
        }))
    }

    fn mc_export_fd(&self, mc: McHandle) -> Result<i32> {
        let st = self.ready()?;
        let o = st.mc.get(mc)?;
        let mut fd: libc::c_int = -1;
        // SAFETY: for POSIX file descriptors the driver writes one `int` through the pointer;
        // the handle is live; flags must be 0.
        st.check("cuMemExportToShareableHandle", unsafe {
            (st.lib.cuMemExportToShareableHandle)(
                (&mut fd as *mut libc::c_int).cast::<c_void>(),
                o.handle,
                vmm::POSIX_FD,
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

    fn mc_import_fd(&self, fd: i32, bytes: usize) -> Result<McHandle> {
        gate()?;
        let st = self.ready()?;
        if fd < 0 {
            return Err(Error::invalid_argument(format!(
                "{fd} is not a file descriptor"
            )));
        }
        if bytes == 0 {
            return Err(Error::invalid_argument(
                "cannot import a multicast object of 0 bytes",
            ));
        }
        let api = supported(&st, st.thread_ordinal()?)?;
        let g = granularity(&st, &api, &object_prop(bytes, 1))?;
        let size = vmm::round_up(bytes, g)?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: a valid out-pointer; for POSIX file descriptors the "OS handle" is the
        // descriptor's value, which the driver only reads (the caller keeps `fd`).
        st.check("cuMemImportFromShareableHandle", unsafe {
            (st.lib.cuMemImportFromShareableHandle)(
                &mut handle,
                fd as isize as *mut c_void,
                vmm::POSIX_FD,
            )
        })?;
        Ok(st.mc.insert(Object {
            handle,
            size,
            granularity: g,
        }))
    }

    fn mc_add_device(&self, mc: McHandle, device: i32) -> Result<()> {
        gate()?;
        let st = self.ready()?;
        let ordinal = st.ordinal(device)?;
        let api = supported(&st, ordinal)?;
        let o = st.mc.get(mc)?;
        // SAFETY: a live object handle and a device of this process; an entry point from
        // cuGetProcAddress with this signature.
        st.check("cuMulticastAddDevice", unsafe {
            (api.add_device)(o.handle, st.devices[ordinal])
        })
    }

    fn mc_bind(
        &self,
        mc: McHandle,
        mc_offset: usize,
        mem: VmmHandle,
        mem_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        gate()?;
        let st = self.ready()?;
        let api = supported(&st, st.thread_ordinal()?)?;
        let o = st.mc.get(mc)?;
        let m = st.vmm.get(mem)?;
        if bytes == 0 || mc_offset.checked_add(bytes).is_none_or(|e| e > o.size) {
            return Err(Error::invalid_argument(format!(
                "binding {bytes} bytes at offset {mc_offset} does not fit the {}-byte multicast \
                 object",
                o.size
            )));
        }
        if mem_offset.checked_add(bytes).is_none_or(|e| e > m.size) {
            return Err(Error::invalid_argument(format!(
                "binding {bytes} bytes from offset {mem_offset} overruns VMM handle {:#x} ({} \
                 bytes)",
                mem.0, m.size
            )));
        }
        // SAFETY: live handles, ranges checked against both sizes; flags must be 0; an entry
        // point from cuGetProcAddress with this signature.
        st.check("cuMulticastBindMem", unsafe {
            (api.bind_mem)(o.handle, mc_offset, m.handle, mem_offset, bytes, 0)
        })
    }

    fn mc_map(&self, mc: McHandle, bytes: usize) -> Result<DevicePtr> {
        gate()?;
        let st = self.ready()?;
        let ordinal = st.thread_ordinal()?;
        supported(&st, ordinal)?;
        let o = st.mc.get(mc)?;
        if bytes == 0 || bytes > o.size {
            return Err(Error::invalid_argument(format!(
                "cannot map {bytes} bytes of a {}-byte multicast object",
                o.size
            )));
        }
        let size = vmm::round_up(bytes, o.granularity)?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: a valid out-pointer; no fixed address (0); flags must be 0.
        st.check("cuMemAddressReserve", unsafe {
            (st.lib.cuMemAddressReserve)(&mut ptr, size, o.granularity, 0, 0)
        })?;
        if let Err(e) = flatmap::map_with_access(&st, ordinal, ptr, size, o.handle) {
            // SAFETY: the reservation made above, with nothing mapped in it.
            let undo = unsafe { (st.lib.cuMemAddressFree)(ptr, size) };
            if let Err(u) = st.check("cuMemAddressFree", undo) {
                tracing::warn!("freeing the range of a failed multicast mapping: {u}");
            }
            return Err(e);
        }
        lock(&st.mc.mappings).insert(ptr, Mapping { size, bytes });
        Ok(DevicePtr(ptr))
    }

    fn mc_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let st = self.ready()?;
        let mut maps = lock(&st.mc.mappings);
        let m = *maps.get(&ptr.0).ok_or_else(|| {
            Error::invalid_handle(format!(
                "{:#x} is not a multicast mapping of this adaptor",
                ptr.0
            ))
        })?;
        if bytes != m.bytes {
            return Err(Error::invalid_argument(format!(
                "the multicast mapping at {:#x} has {} bytes, not {bytes}",
                ptr.0, m.bytes
            )));
        }
        // SAFETY: a mapping of this adaptor; the caller is done with it (the ABI's contract).
        st.check("cuMemUnmap", unsafe { (st.lib.cuMemUnmap)(ptr.0, m.size) })?;
        maps.remove(&ptr.0);
        // SAFETY: its reservation, now unmapped.
        st.check("cuMemAddressFree", unsafe {
            (st.lib.cuMemAddressFree)(ptr.0, m.size)
        })
    }

    fn mc_unbind(&self, mc: McHandle, device: i32, mc_offset: usize, bytes: usize) -> Result<()> {
        let st = self.ready()?;
        let ordinal = st.ordinal(device)?;
        let o = st.mc.get(mc)?;
        // An object exists, so the entry points were found.
        let api = st
            .mc
            .api
            .as_ref()
            .map_err(|why| Error::internal(why.clone()))?;
        // SAFETY: a live object handle and a device of this process; the driver checks that
        // the range is bound; an entry point from cuGetProcAddress with this signature.
        st.check("cuMulticastUnbind", unsafe {
            (api.unbind)(o.handle, st.devices[ordinal], mc_offset, bytes)
        })
    }

    fn mc_release(&self, mc: McHandle) -> Result<()> {
        let st = self.ready()?;
        let o = st.mc.objects.remove(mc.0)?;
        // SAFETY: an object handle of this adaptor, removed from the registry so released once.
        st.check("cuMemRelease", unsafe { (st.lib.cuMemRelease)(o.handle) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |var| map.get(var).cloned()
    }

    #[test]
    fn each_kill_switch_refuses_and_is_named() {
        assert_eq!(refusal(env(&[])), None);
        assert_eq!(
            refusal(env(&[
                ("NCCL_NVLS_ENABLE", "1"),
                ("FERROCX_MULTICAST", "1")
            ])),
            None
        );
        let nccl = refusal(env(&[("NCCL_NVLS_ENABLE", "0")])).unwrap();
        assert!(nccl.contains("disabled by NCCL_NVLS_ENABLE=0"), "{nccl}");
        let ours = refusal(env(&[("FERROCX_MULTICAST", "0")])).unwrap();
        assert!(ours.contains("disabled by FERROCX_MULTICAST=0"), "{ours}");
        // Both set: NCCL's is named first.
        let both = refusal(env(&[
            ("FERROCX_MULTICAST", "off"),
            ("NCCL_NVLS_ENABLE", "0"),
        ]))
        .unwrap();
        assert!(both.contains("NCCL_NVLS_ENABLE=0"), "{both}");
        // A value that is not understood fails closed.
        let bad = refusal(env(&[("FERROCX_MULTICAST", "maybe")])).unwrap();
        assert!(
            bad.contains("FERROCX_MULTICAST") && bad.contains("counts as off"),
            "{bad}"
        );
    }

    #[test]
    fn object_properties_ask_for_posix_descriptors() {
        let p = object_prop(3 << 20, 2);
        assert_eq!((p.numDevices, p.size, p.flags), (2, 3 << 20, 0));
        assert_eq!(p.handleTypes, 1, "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR");
    }
}
