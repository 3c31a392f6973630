//! The host device adaptor: the SDK trait over this crate's streams, events and memory.

use std::ffi::c_void;

use ferrocx_plugin_sdk::prelude::*;

use crate::{event, stream};

/// The CPU device. One device per process.
#[derive(Default)]
pub struct HostDevice {}

fn unsupported<T>(what: &str) -> Result<T> {
    Err(Error::unsupported(format!("{what} is not implemented by the host device yet")))
}

impl DeviceAdaptor for HostDevice {
    fn instance() -> &'static Self {
        singleton!(HostDevice)
    }
    fn init(&self, _options: &Options) -> Result<()> {
        Ok(())
    }
    fn finalize(&self) -> Result<()> {
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
                | Capabilities::HOST_ADDRESSABLE,
            total_memory: 0,
            arch: 0,
            device_count: 1,
        })
    }
    fn mem_alloc(&self, _bytes: usize, _kind: MemKind) -> Result<DevicePtr> {
        unsupported("mem_alloc")
    }
    fn mem_free(&self, _ptr: DevicePtr, _kind: MemKind) -> Result<()> {
        unsupported("mem_free")
    }
    fn mem_copy(&self, _dst: DevicePtr, _src: DevicePtr, _bytes: usize) -> Result<()> {
        unsupported("mem_copy")
    }
    fn mem_copy_async(&self, _dst: DevicePtr, _src: DevicePtr, _bytes: usize, _s: Stream) -> Result<()> {
        unsupported("mem_copy_async")
    }
    fn mem_set(&self, _dst: DevicePtr, _value: u8, _bytes: usize) -> Result<()> {
        unsupported("mem_set")
    }
    fn mem_set_async(&self, _dst: DevicePtr, _value: u8, _bytes: usize, _s: Stream) -> Result<()> {
        unsupported("mem_set_async")
    }
    fn stream_create(&self, flags: u32) -> Result<Stream> {
        if flags > 1 {
            return Err(Error::invalid_argument(format!("unknown stream flags {flags:#x}")));
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
    fn ipc_export(&self, _ptr: DevicePtr) -> Result<Vec<u8>> {
        unsupported("ipc_export")
    }
    fn ipc_import(&self, _handle: &[u8]) -> Result<DevicePtr> {
        unsupported("ipc_import")
    }
    fn ipc_close(&self, _ptr: DevicePtr) -> Result<()> {
        unsupported("ipc_close")
    }
}
