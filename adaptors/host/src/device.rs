//! The host device adaptor: the SDK traits over this crate's streams, events and memory.

use std::ffi::c_void;

use ferrocx_plugin_sdk::prelude::*;

use crate::{event, flatmap, ipc, memory, multicast, shm, stream, vmm};

/// The CPU device. One device per process.
///
/// Memory: `DEVICE` and `PINNED` allocations are POSIX shared-memory segments named
/// `/ferrocx-<FERROCX_JOB_ID>-<pid>-<seq>` (exportable with `ipc_export`), `HOST` allocations
/// come from the C heap. VMM allocations are named shared-memory segments too, flat ranges are
/// reserved address space they are mapped into, and multicast is emulated (see
/// [`crate::multicast`]). `init` removes the segments that dead processes of the same job
/// left behind; `finalize` frees everything this process still holds.
#[derive(Default)]
pub struct HostDevice {}

impl DeviceAdaptor for HostDevice {
    fn instance() -> &'static Self {
        singleton!(HostDevice)
    }
    fn init(&self, _options: &Options) -> Result<()> {
        let removed = shm::remove_stale();
        if removed > 0 {
            tracing::warn!(
                job = shm::job_id(),
                "removed {removed} shared-memory segment(s) left by crashed processes of this job"
            );
        }
        Ok(())
    }
    fn finalize(&self) -> Result<()> {
        // Reverse order of dependence: multicast objects name VMM memory, flat ranges map it,
        // imports map peers' segments.
        let multicast = multicast::release_all();
        let ranges = flatmap::release_all();
        let handles = vmm::release_all();
        let imports = ipc::close_all();
        let allocations = memory::free_all();
        if multicast + ranges + handles + imports + allocations > 0 {
            tracing::debug!(
                multicast,
                ranges,
                handles,
                imports,
                allocations,
                "finalize released what was still held"
            );
        }
        Ok(())
    }
    fn device_count(&self) -> Result<i32> {
        Ok(1)
    }
    fn set_device(&self, device: i32) -> Result<()> {
        if device != 0 {
            return Err(Error::invalid_argument(format!(
                "device {device} does not exist (the host device is device 0)"
            )));
        }
        Ok(())
    }
    fn get_device(&self) -> Result<i32> {
        Ok(0)
    }
    fn properties(&self, device: i32) -> Result<Properties> {
        self.set_device(device)?;
        Ok(Properties {
            vendor: "host".into(),
            name: "CPU".into(),
            capabilities: Capabilities::HOST_FUNC
                | Capabilities::TIMED_EVENTS
                | Capabilities::STREAM_WRAP
                | Capabilities::HOST_ADDRESSABLE
                | Capabilities::IPC
                | Capabilities::VMM
                | Capabilities::FLAT_MAP
                | Capabilities::MULTICAST,
            total_memory: 0,
            arch: 0,
            device_count: 1,
        })
    }
    fn mem_alloc(&self, bytes: usize, kind: MemKind) -> Result<DevicePtr> {
        memory::alloc(bytes, kind)
    }
    fn mem_free(&self, ptr: DevicePtr, kind: MemKind) -> Result<()> {
        memory::free(ptr, kind)
    }
    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        memory::copy(dst, src, bytes)
    }
    fn mem_copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: Stream,
    ) -> Result<()> {
        memory::copy_async(dst, src, bytes, s)
    }
    fn mem_set(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        memory::set(dst, value, bytes)
    }
    fn mem_set_async(&self, dst: DevicePtr, value: u8, bytes: usize, s: Stream) -> Result<()> {
        memory::set_async(dst, value, bytes, s)
    }
    fn stream_create(&self, flags: u32) -> Result<Stream> {
        if flags > 1 {
            return Err(Error::invalid_argument(format!(
                "unknown stream flags {flags:#x}"
            )));
        }
        stream::create()
    }
    fn stream_wrap(&self, native: *mut c_void) -> Result<Stream> {
        // The host device's native streams are its own: wrapping one is the identity.
        let s = Stream(native);
        stream::get(s)?;
        Ok(s)
    }
    fn stream_destroy(&self, s: Stream) -> Result<()> {
        stream::destroy(s)
    }
    fn stream_synchronize(&self, s: Stream) -> Result<()> {
        stream::get(s)?.synchronize()
    }
    fn stream_query(&self, s: Stream) -> Result<bool> {
        Ok(stream::get(s)?.is_idle())
    }
    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<()> {
        event::stream_wait(s, e)
    }
    fn event_create(&self, flags: u32) -> Result<Event> {
        event::create(flags)
    }
    fn event_destroy(&self, e: Event) -> Result<()> {
        event::destroy(e)
    }
    fn event_record(&self, e: Event, s: Stream) -> Result<()> {
        event::record(e, s)
    }
    fn event_synchronize(&self, e: Event) -> Result<()> {
        event::synchronize(e)
    }
    fn event_query(&self, e: Event) -> Result<bool> {
        event::query(e)
    }
    fn event_elapsed_ms(&self, a: Event, b: Event) -> Result<f32> {
        event::elapsed_ms(a, b)
    }
    fn launch_host_func(&self, s: Stream, call: HostCall) -> Result<()> {
        stream::get(s)?.enqueue(Box::new(move || {
            call.run();
            Ok(())
        }))
    }
    fn ipc_export(&self, ptr: DevicePtr) -> Result<Vec<u8>> {
        ipc::export(ptr)
    }
    fn ipc_import(&self, handle: &[u8]) -> Result<DevicePtr> {
        ipc::import(handle)
    }
    fn ipc_close(&self, ptr: DevicePtr) -> Result<()> {
        ipc::close(ptr)
    }
    /// The host device's memory is POSIX shared memory, so its total bytes are those of the
    /// filesystem behind `/dev/shm` (`statvfs`), and its free bytes what that filesystem has
    /// free or the system has available (`MemAvailable`), whichever is less: what `mem_alloc`
    /// can still take.
    fn mem_get_info(&self) -> Result<MemInfo> {
        let (free, total) = shm::shm_space().map_err(|e| Error::system("statvfs(/dev/shm)", e))?;
        let free = shm::mem_available().map_or(free, |a| free.min(a));
        let bytes = |b: u64| usize::try_from(b).unwrap_or(usize::MAX);
        Ok(MemInfo {
            free: bytes(free),
            total: bytes(total),
        })
    }
}

/// The memops group: the stream's worker makes the store, and polls the word for a wait (see
/// the stream module: a wait is abandoned with `ABORTED` when its stream is destroyed, and not
/// otherwise bounded). Any host memory is valid, this process's or shared with others.
impl DeviceMemOps for HostDevice {
    unsafe fn stream_write_value32(&self, s: Stream, addr: *mut u32, value: u32) -> Result<()> {
        // SAFETY: the trait's contract (non-null, aligned, valid until the store has run).
        unsafe { stream::get(s)?.enqueue_write_value32(addr, value) }
    }
    unsafe fn stream_wait_value32(
        &self,
        s: Stream,
        addr: *const u32,
        value: u32,
        condition: WaitCondition,
    ) -> Result<()> {
        // SAFETY: the trait's contract (non-null, aligned, valid until the wait is over).
        unsafe { stream::get(s)?.enqueue_wait_value32(addr, value, condition) }
    }
}

impl DeviceVmm for HostDevice {
    fn vmm_granularity(&self, device: i32) -> Result<usize> {
        self.set_device(device)?;
        Ok(vmm::granularity())
    }
    fn vmm_alloc(&self, bytes: usize) -> Result<VmmHandle> {
        vmm::alloc(bytes)
    }
    fn vmm_export_fd(&self, handle: VmmHandle) -> Result<i32> {
        vmm::export_fd(handle)
    }
    fn vmm_import_fd(&self, fd: i32, bytes: usize) -> Result<VmmHandle> {
        vmm::import_fd(fd, bytes)
    }
    fn vmm_release(&self, handle: VmmHandle) -> Result<()> {
        vmm::release(handle)
    }
}

impl DeviceFlatMap for HostDevice {
    fn flat_reserve(&self, bytes: usize) -> Result<DevicePtr> {
        flatmap::reserve(bytes)
    }
    fn flat_map(
        &self,
        base: DevicePtr,
        index: usize,
        size: usize,
        handle: VmmHandle,
    ) -> Result<()> {
        flatmap::map(base, index, size, handle)
    }
    fn flat_unmap(&self, base: DevicePtr, index: usize, size: usize) -> Result<()> {
        flatmap::unmap(base, index, size)
    }
    fn flat_release(&self, base: DevicePtr, bytes: usize) -> Result<()> {
        flatmap::release(base, bytes)
    }
}

impl DeviceMulticast for HostDevice {
    fn mc_supported(&self, device: i32) -> Result<bool> {
        self.set_device(device)?;
        Ok(true)
    }
    fn mc_create(&self, bytes: usize, num_devices: i32) -> Result<McHandle> {
        multicast::create(bytes, num_devices)
    }
    fn mc_export_fd(&self, mc: McHandle) -> Result<i32> {
        multicast::export_fd(mc)
    }
    fn mc_import_fd(&self, fd: i32, bytes: usize) -> Result<McHandle> {
        multicast::import_fd(fd, bytes)
    }
    fn mc_add_device(&self, mc: McHandle, device: i32) -> Result<()> {
        multicast::add_device(mc, device)
    }
    fn mc_bind(
        &self,
        mc: McHandle,
        mc_offset: usize,
        mem: VmmHandle,
        mem_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        multicast::bind(mc, mc_offset, mem, mem_offset, bytes)
    }
    fn mc_map(&self, mc: McHandle, bytes: usize) -> Result<DevicePtr> {
        multicast::map(mc, bytes)
    }
    fn mc_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        multicast::unmap(ptr, bytes)
    }
    fn mc_unbind(&self, mc: McHandle, device: i32, mc_offset: usize, bytes: usize) -> Result<()> {
        multicast::unbind(mc, device, mc_offset, bytes)
    }
    fn mc_release(&self, mc: McHandle) -> Result<()> {
        multicast::release(mc)
    }
}
