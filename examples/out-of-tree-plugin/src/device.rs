//! The device adaptor: one device, its memory on the host heap, streams as worker threads.

use std::ffi::c_void;

use ferrocx_plugin_sdk::prelude::*;

use crate::memory::{self, Allocations};
use crate::stream::Handles;

/// The device. One per process (see `instance`); every method may be called from any thread.
#[derive(Default)]
pub struct HostMemDevice {
    memory: Allocations,
    handles: Handles,
}

fn check_device(device: i32) -> Result<()> {
    if device != 0 {
        return Err(Error::invalid_argument(format!(
            "device {device} does not exist (this adaptor has device 0)"
        )));
    }
    Ok(())
}

/// The argument checks of a copy or memset, made when it is enqueued.
fn check_copy(dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
    if bytes > 0 && (dst == DevicePtr::NULL || src == DevicePtr::NULL) {
        return Err(Error::invalid_argument("null address"));
    }
    Ok(())
}

/// Entries exported as absent (`device_absent` in lib.rs) are never called through the table;
/// the trait still requires them.
fn absent<T>(what: &str) -> Result<T> {
    Err(Error::unsupported(format!(
        "{what} is not supported by this device"
    )))
}

impl DeviceAdaptor for HostMemDevice {
    fn instance() -> &'static Self {
        singleton!(HostMemDevice)
    }
    fn init(&self, _options: &Options) -> Result<()> {
        // No options; a real adaptor loads its runtime here and reads e.g. a library path.
        Ok(())
    }
    fn finalize(&self) -> Result<()> {
        // Streams first: their pending copies may still touch the memory.
        self.handles.clear()?;
        self.memory.free_all()?;
        Ok(())
    }
    fn device_count(&self) -> Result<i32> {
        Ok(1)
    }
    fn set_device(&self, device: i32) -> Result<()> {
        check_device(device)
    }
    fn get_device(&self) -> Result<i32> {
        Ok(0)
    }
    fn properties(&self, device: i32) -> Result<Properties> {
        check_device(device)?;
        Ok(Properties {
            vendor: "ferrocx-example".into(),
            name: "host memory (out-of-tree Rust example)".into(),
            capabilities: Capabilities::HOST_ADDRESSABLE
                | Capabilities::HOST_FUNC
                | Capabilities::TIMED_EVENTS,
            total_memory: memory::system_memory().map_or(0, |m| m.total as u64),
            arch: 0,
            device_count: 1,
        })
    }
    fn mem_get_info(&self) -> Result<MemInfo> {
        memory::system_memory()
    }
    fn mem_alloc(&self, bytes: usize, kind: MemKind) -> Result<DevicePtr> {
        self.memory.alloc(bytes, kind)
    }
    fn mem_free(&self, ptr: DevicePtr, kind: MemKind) -> Result<()> {
        self.memory.free(ptr, kind)
    }
    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        memory::copy(dst, src, bytes)
    }
    fn mem_copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> Result<()> {
        check_copy(dst, src, bytes)?;
        let q = self.handles.stream(stream)?;
        // An error found when the copy runs has nobody to report to; checked above instead.
        q.enqueue(Box::new(move || {
            let _ = memory::copy(dst, src, bytes);
        }))
    }
    fn mem_set(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        memory::set(dst, value, bytes)
    }
    fn mem_set_async(&self, dst: DevicePtr, value: u8, bytes: usize, stream: Stream) -> Result<()> {
        check_copy(dst, dst, bytes)?;
        let q = self.handles.stream(stream)?;
        q.enqueue(Box::new(move || {
            let _ = memory::set(dst, value, bytes);
        }))
    }
    fn stream_create(&self, flags: u32) -> Result<Stream> {
        if flags > 1 {
            return Err(Error::invalid_argument(format!(
                "unknown stream flags {flags:#x}"
            )));
        }
        self.handles.stream_create()
    }
    fn stream_wrap(&self, _native: *mut c_void) -> Result<Stream> {
        absent("stream_wrap")
    }
    fn stream_destroy(&self, stream: Stream) -> Result<()> {
        self.handles.stream_destroy(stream)
    }
    fn stream_synchronize(&self, stream: Stream) -> Result<()> {
        self.handles.stream(stream)?.synchronize()
    }
    fn stream_query(&self, stream: Stream) -> Result<bool> {
        self.handles.stream(stream)?.is_idle()
    }
    fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        self.handles.stream_wait_event(stream, event)
    }
    fn event_create(&self, flags: u32) -> Result<Event> {
        self.handles.event_create(flags)
    }
    fn event_destroy(&self, event: Event) -> Result<()> {
        self.handles.event_destroy(event)
    }
    fn event_record(&self, event: Event, stream: Stream) -> Result<()> {
        self.handles.event_record(event, stream)
    }
    fn event_synchronize(&self, event: Event) -> Result<()> {
        self.handles.event_synchronize(event)
    }
    fn event_query(&self, event: Event) -> Result<bool> {
        self.handles.event_query(event)
    }
    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32> {
        self.handles.elapsed_ms(start, end)
    }
    fn launch_host_func(&self, stream: Stream, call: HostCall) -> Result<()> {
        self.handles
            .stream(stream)?
            .enqueue(Box::new(move || call.run()))
    }
    fn ipc_export(&self, _ptr: DevicePtr) -> Result<Vec<u8>> {
        absent("ipc_export")
    }
    fn ipc_import(&self, _handle: &[u8]) -> Result<DevicePtr> {
        absent("ipc_import")
    }
    fn ipc_close(&self, _ptr: DevicePtr) -> Result<()> {
        absent("ipc_close")
    }
}
