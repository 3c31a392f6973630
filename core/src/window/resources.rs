//! The device's optional groups (VMM, flat mapping, multicast), its IPC entries and the CCL's
//! window group, as the window code uses them: one checked call per entry, and one guard per
//! resource that gives it back when dropped. Every step of the sym-heap protocol holds what it
//! took in these guards, so an early return releases it, in the reverse order of taking.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::abi::{Comm, DevicePtr, McHandle, MemKind, VmmHandle, WindowHandle};
use crate::adaptor::{AdaptorError, Ccl, Device};

/// Calls entry `$op` of the device's optional group `$group` (`vmm`, `flatmap`, `multicast`),
/// or of its root table with `root`, turning absence and failure statuses into errors.
macro_rules! dev_call {
    ($dev:expr, root, $op:ident ( $($arg:expr),* )) => {{
        let dev: &Device = $dev;
        let f = dev.tables().root.get().$op.ok_or_else(|| dev.unsupported(stringify!($op)))?;
        // SAFETY: the loader checked the table; the arguments follow the ABI's contract for this
        // entry (valid out-pointers, handles and pointers this adaptor returned).
        let status = unsafe { f($($arg),*) };
        dev.check(stringify!($op), status)
    }};
    ($dev:expr, $group:ident, $op:ident ( $($arg:expr),* )) => {{
        let dev: &Device = $dev;
        let f = dev
            .tables()
            .$group
            .as_ref()
            .and_then(|t| t.get().$op)
            .ok_or_else(|| dev.unsupported(stringify!($op)))?;
        // SAFETY: as above.
        let status = unsafe { f($($arg),*) };
        dev.check(stringify!($op), status)
    }};
}

/// Logs a release that failed: nothing can be done about it at that point.
fn released(what: &str, r: Result<(), AdaptorError>) {
    if let Err(e) = r {
        tracing::warn!("releasing {what}: {e}");
    }
}

/// Whether the device has every entry the symmetric heap calls (VMM and flat mapping).
pub(crate) fn can_map_peers(dev: &Device) -> bool {
    let t = dev.tables();
    let vmm = t.vmm.as_ref().map(|t| t.get()).is_some_and(|v| {
        v.vmm_granularity.is_some()
            && v.vmm_alloc.is_some()
            && v.vmm_export_fd.is_some()
            && v.vmm_import_fd.is_some()
            && v.vmm_release.is_some()
    });
    let flat = t.flatmap.as_ref().map(|t| t.get()).is_some_and(|f| {
        f.flat_reserve.is_some()
            && f.flat_map.is_some()
            && f.flat_unmap.is_some()
            && f.flat_release.is_some()
    });
    vmm && flat
}

/// Whether the device has every entry of the multicast group.
pub(crate) fn has_multicast(dev: &Device) -> bool {
    dev.tables()
        .multicast
        .as_ref()
        .map(|t| t.get())
        .is_some_and(|m| {
            m.mc_supported.is_some()
                && m.mc_create.is_some()
                && m.mc_export_fd.is_some()
                && m.mc_import_fd.is_some()
                && m.mc_add_device.is_some()
                && m.mc_bind.is_some()
                && m.mc_map.is_some()
                && m.mc_unmap.is_some()
                && m.mc_unbind.is_some()
                && m.mc_release.is_some()
        })
}

/// `Ok` when the CCL has both entries of its window group and the vendor library its `init`
/// loaded does not refuse them; else why not.
pub(crate) fn has_vendor_windows(ccl: &Ccl) -> Result<(), String> {
    has_window_group(ccl)?;
    // The group is static; whether the vendor library `init` loaded can register windows is
    // probed (e.g. libnccl < 2.27 lacks `ncclCommWindowRegister`).
    let refused = ccl
        .runtime_support()
        .into_iter()
        .find_map(|(e, s)| match s {
            crate::adaptor::RuntimeSupport::Unsupported(why) if e == "window_register" => Some(why),
            _ => None,
        });
    match refused {
        Some(why) => Err(format!(
            "the CCL `{}` has a window group, but {why}",
            ccl.name()
        )),
        None => Ok(()),
    }
}

/// `Ok` when the CCL's tables have the window group's register and deregister entries.
pub(crate) fn has_window_group(ccl: &Ccl) -> Result<(), String> {
    let present = ccl
        .tables()
        .window
        .as_ref()
        .map(|t| t.get())
        .is_some_and(|w| w.window_register.is_some() && w.window_deregister.is_some());
    if !present {
        return Err(format!("the CCL `{}` has no window group", ccl.name()));
    }
    Ok(())
}

/// VMM allocation granularity of `device`.
pub(crate) fn granularity(dev: &Device, device: i32) -> Result<usize, AdaptorError> {
    let mut g = 0usize;
    dev_call!(dev, vmm, vmm_granularity(device, &mut g))?;
    Ok(g.max(1))
}

/// A VMM allocation or import; released on drop.
pub(crate) struct Vmm {
    dev: Device,
    handle: VmmHandle,
}

impl Vmm {
    /// Allocates `bytes` (a multiple of the granularity) of exportable memory.
    pub(crate) fn alloc(dev: &Device, bytes: usize) -> Result<Vmm, AdaptorError> {
        let mut handle = VmmHandle(0);
        dev_call!(dev, vmm, vmm_alloc(bytes, &mut handle))?;
        Ok(Vmm {
            dev: dev.clone(),
            handle,
        })
    }

    /// Imports the allocation of `bytes` behind `fd` (the descriptor stays the caller's).
    pub(crate) fn import(
        dev: &Device,
        fd: BorrowedFd<'_>,
        bytes: usize,
    ) -> Result<Vmm, AdaptorError> {
        let mut handle = VmmHandle(0);
        dev_call!(dev, vmm, vmm_import_fd(fd.as_raw_fd(), bytes, &mut handle))?;
        Ok(Vmm {
            dev: dev.clone(),
            handle,
        })
    }

    /// A new descriptor of the allocation, owned by the caller.
    pub(crate) fn export_fd(&self) -> Result<OwnedFd, AdaptorError> {
        let mut fd = -1;
        dev_call!(&self.dev, vmm, vmm_export_fd(self.handle, &mut fd))?;
        owned_fd(&self.dev, "vmm_export_fd", fd)
    }
}

impl Drop for Vmm {
    fn drop(&mut self) {
        let h = self.handle;
        released(
            "a VMM handle",
            (|| dev_call!(&self.dev, vmm, vmm_release(h)))(),
        );
    }
}

/// A reservation of virtual address space; released on drop (its slots must be gone first:
/// owners keep their [`Slot`]s in fields or vectors dropped before it).
pub(crate) struct Reservation {
    dev: Device,
    base: DevicePtr,
    bytes: usize,
}

impl Reservation {
    /// Reserves `bytes` (a multiple of the granularity).
    pub(crate) fn new(dev: &Device, bytes: usize) -> Result<Reservation, AdaptorError> {
        let mut base = DevicePtr::NULL;
        dev_call!(dev, flatmap, flat_reserve(bytes, &mut base))?;
        Ok(Reservation {
            dev: dev.clone(),
            base,
            bytes,
        })
    }

    /// First address of the range.
    pub(crate) fn base(&self) -> DevicePtr {
        self.base
    }

    /// Maps `size` bytes of `mem` at `base + index * size`.
    pub(crate) fn map(&self, index: usize, size: usize, mem: &Vmm) -> Result<Slot, AdaptorError> {
        dev_call!(
            &self.dev,
            flatmap,
            flat_map(self.base, index, size, mem.handle)
        )?;
        Ok(Slot {
            dev: self.dev.clone(),
            base: self.base,
            index,
            size,
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let (base, bytes) = (self.base, self.bytes);
        released(
            "a flat reservation",
            (|| dev_call!(&self.dev, flatmap, flat_release(base, bytes)))(),
        );
    }
}

/// One mapped slot of a [`Reservation`]; unmapped on drop.
pub(crate) struct Slot {
    dev: Device,
    base: DevicePtr,
    index: usize,
    size: usize,
}

impl Slot {
    /// The slot's address.
    pub(crate) fn addr(&self) -> DevicePtr {
        DevicePtr(self.base.0 + (self.index * self.size) as u64)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let (base, index, size) = (self.base, self.index, self.size);
        released(
            "a flat mapping",
            (|| dev_call!(&self.dev, flatmap, flat_unmap(base, index, size)))(),
        );
    }
}

/// `true` when `device` can take part in multicast objects.
pub(crate) fn mc_supported(dev: &Device, device: i32) -> Result<bool, AdaptorError> {
    let mut s = 0;
    dev_call!(dev, multicast, mc_supported(device, &mut s))?;
    Ok(s == 1)
}

/// A multicast object handle; released on drop (after its bindings and mappings).
pub(crate) struct McObject {
    dev: Device,
    handle: McHandle,
}

impl McObject {
    /// Creates an object of `bytes` for `devices` devices.
    pub(crate) fn create(
        dev: &Device,
        bytes: usize,
        devices: i32,
    ) -> Result<McObject, AdaptorError> {
        let mut handle = McHandle(0);
        dev_call!(dev, multicast, mc_create(bytes, devices, &mut handle))?;
        Ok(McObject {
            dev: dev.clone(),
            handle,
        })
    }

    /// Imports the object of `bytes` behind `fd` (the descriptor stays the caller's).
    pub(crate) fn import(
        dev: &Device,
        fd: BorrowedFd<'_>,
        bytes: usize,
    ) -> Result<McObject, AdaptorError> {
        let mut handle = McHandle(0);
        dev_call!(
            dev,
            multicast,
            mc_import_fd(fd.as_raw_fd(), bytes, &mut handle)
        )?;
        Ok(McObject {
            dev: dev.clone(),
            handle,
        })
    }

    /// A new descriptor of the object, owned by the caller.
    pub(crate) fn export_fd(&self) -> Result<OwnedFd, AdaptorError> {
        let mut fd = -1;
        dev_call!(&self.dev, multicast, mc_export_fd(self.handle, &mut fd))?;
        owned_fd(&self.dev, "mc_export_fd", fd)
    }

    /// Adds this process's `device` to the object.
    pub(crate) fn add_device(&self, device: i32) -> Result<(), AdaptorError> {
        dev_call!(&self.dev, multicast, mc_add_device(self.handle, device))
    }

    /// Binds `bytes` of `mem` from its start at offset 0 of the object, for `device`.
    pub(crate) fn bind(
        &self,
        device: i32,
        mem: &Vmm,
        bytes: usize,
    ) -> Result<McBinding, AdaptorError> {
        dev_call!(
            &self.dev,
            multicast,
            mc_bind(self.handle, 0, mem.handle, 0, bytes)
        )?;
        Ok(McBinding {
            dev: self.dev.clone(),
            mc: self.handle,
            device,
            bytes,
        })
    }

    /// Maps `bytes` of the object into this process.
    pub(crate) fn map(&self, bytes: usize) -> Result<McMapping, AdaptorError> {
        let mut ptr = DevicePtr::NULL;
        dev_call!(&self.dev, multicast, mc_map(self.handle, bytes, &mut ptr))?;
        Ok(McMapping {
            dev: self.dev.clone(),
            ptr,
            bytes,
        })
    }
}

impl Drop for McObject {
    fn drop(&mut self) {
        let h = self.handle;
        released(
            "a multicast object",
            (|| dev_call!(&self.dev, multicast, mc_release(h)))(),
        );
    }
}

/// Memory bound to a multicast object; unbound on drop.
pub(crate) struct McBinding {
    dev: Device,
    mc: McHandle,
    device: i32,
    bytes: usize,
}

impl Drop for McBinding {
    fn drop(&mut self) {
        let (mc, device, bytes) = (self.mc, self.device, self.bytes);
        released(
            "a multicast binding",
            (|| dev_call!(&self.dev, multicast, mc_unbind(mc, device, 0, bytes)))(),
        );
    }
}

/// A multicast mapping; unmapped on drop.
pub(crate) struct McMapping {
    dev: Device,
    ptr: DevicePtr,
    bytes: usize,
}

impl McMapping {
    /// The mapping's address.
    pub(crate) fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for McMapping {
    fn drop(&mut self) {
        let (ptr, bytes) = (self.ptr, self.bytes);
        released(
            "a multicast mapping",
            (|| dev_call!(&self.dev, multicast, mc_unmap(ptr, bytes)))(),
        );
    }
}

/// The IPC handle of the allocation `ptr` lies in.
///
/// # Safety
///
/// `ptr` lies in a live allocation of `dev` (a [valid range](crate::adaptor#valid-ranges)).
pub(crate) unsafe fn ipc_export(dev: &Device, ptr: DevicePtr) -> Result<Vec<u8>, AdaptorError> {
    let mut len = 0usize;
    dev_call!(dev, root, ipc_export(ptr, std::ptr::null_mut(), &mut len))?;
    let mut handle = vec![0u8; len];
    dev_call!(dev, root, ipc_export(ptr, handle.as_mut_ptr(), &mut len))?;
    handle.truncate(len);
    Ok(handle)
}

/// A peer's allocation opened from its IPC handle; closed on drop.
pub(crate) struct IpcImport {
    dev: Device,
    ptr: DevicePtr,
}

impl IpcImport {
    /// Opens `handle` (from a peer's [`ipc_export`]).
    pub(crate) fn open(dev: &Device, handle: &[u8]) -> Result<IpcImport, AdaptorError> {
        let mut ptr = DevicePtr::NULL;
        dev_call!(
            dev,
            root,
            ipc_import(handle.as_ptr(), handle.len(), &mut ptr)
        )?;
        Ok(IpcImport {
            dev: dev.clone(),
            ptr,
        })
    }

    /// The peer's exported pointer, in this process.
    pub(crate) fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for IpcImport {
    fn drop(&mut self) {
        let ptr = self.ptr;
        released(
            "an IPC import",
            (|| dev_call!(&self.dev, root, ipc_close(ptr)))(),
        );
    }
}

/// Device memory from `mem_alloc`; freed on drop.
pub(crate) struct DeviceMem {
    dev: Device,
    ptr: DevicePtr,
    kind: MemKind,
}

impl DeviceMem {
    /// Allocates `bytes` of `kind`.
    pub(crate) fn alloc(
        dev: &Device,
        bytes: usize,
        kind: MemKind,
    ) -> Result<DeviceMem, AdaptorError> {
        Ok(DeviceMem {
            ptr: dev.mem_alloc(bytes, kind)?,
            dev: dev.clone(),
            kind,
        })
    }

    /// The allocation's address.
    pub(crate) fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // SAFETY: the address `mem_alloc` returned with this kind, freed once, here; work that
        // used it was enqueued by `unsafe` calls whose callers wait for it before this drops.
        released("device memory", unsafe {
            self.dev.mem_free(self.ptr, self.kind)
        });
    }
}

/// A window of the CCL's window group. Deregistering is collective, so it is never done on
/// drop: [`VendorWindow::deregister`] does it.
pub(crate) struct VendorWindow {
    ccl: Ccl,
    comm: Comm,
    handle: WindowHandle,
}

impl VendorWindow {
    /// Registers `bytes` at `buf`; collective over `comm`.
    ///
    /// # Safety
    ///
    /// `buf` is valid for `bytes` bytes ([valid ranges](crate::adaptor#valid-ranges)) until the
    /// window is deregistered.
    pub(crate) unsafe fn register(
        ccl: &Ccl,
        comm: Comm,
        buf: DevicePtr,
        bytes: usize,
        flags: u32,
    ) -> Result<VendorWindow, AdaptorError> {
        let t = ccl.tables().window.as_ref().map(|t| t.get());
        let f = ccl.entry("window_register", t.and_then(|t| t.window_register))?;
        let mut handle = WindowHandle::NULL;
        // SAFETY: a communicator of this CCL, a buffer of its device and a writable out-pointer.
        let status = unsafe { f(comm, buf, bytes, flags, &mut handle) };
        ccl.check("window_register", status)?;
        Ok(VendorWindow {
            ccl: ccl.clone(),
            comm,
            handle,
        })
    }

    /// The CCL's handle.
    pub(crate) fn handle(&self) -> WindowHandle {
        self.handle
    }

    /// Deregisters the window; collective.
    pub(crate) fn deregister(self) -> Result<(), AdaptorError> {
        let t = self.ccl.tables().window.as_ref().map(|t| t.get());
        let f = self
            .ccl
            .entry("window_deregister", t.and_then(|t| t.window_deregister))?;
        // SAFETY: a window this CCL registered on `comm`, deregistered once (consumes `self`).
        let status = unsafe { f(self.comm, self.handle) };
        self.ccl.check("window_deregister", status)
    }
}

/// The descriptor an export entry of `dev` returned with success, owned from here on; a
/// negative one is the adaptor's internal error.
fn owned_fd(dev: &Device, op: &'static str, fd: i32) -> Result<OwnedFd, AdaptorError> {
    if fd < 0 {
        return Err(AdaptorError::Failed {
            adaptor: dev.name().to_string(),
            op,
            status: crate::abi::Status::INTERNAL_ERROR,
            message: format!("returned success with descriptor {fd}"),
        });
    }
    // SAFETY: the entry hands the caller a new descriptor it owns (the ABI's contract).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
