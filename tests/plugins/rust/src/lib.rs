//! A Rust adaptor plugin built through the SDK, loaded by the integration tests as a real `.so`.
//!
//! Its device keeps "device memory" in host allocations so calls through the table return real
//! values; `set_device(666)` panics on purpose, to prove the boundary catches it. Its streams run
//! work at once, and its graph group records the async copies and memsets of a capturing stream
//! and replays them at each launch. Its kernel group (ABI 1.2) loads images of a vendor format
//! ([`FAKE_IMAGE`]: function names, one a line) and runs `fill_u32` on the host. Its CCL is a
//! single-rank communicator and exports `all_to_allv` as absent.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::prelude::*;

/// The device: one device, memory from the host heap.
pub struct TestDevice {
    allocs: Mutex<HashMap<u64, Vec<u8>>>,
    graphs: Mutex<Graphs>,
    /// The graphs made, by handle value.
    made: HandleTable<Vec<Recorded>>,
}

impl Default for TestDevice {
    fn default() -> Self {
        TestDevice {
            allocs: Mutex::default(),
            graphs: Mutex::default(),
            made: HandleTable::new("graph"),
        }
    }
}

/// Work a graph replays.
#[derive(Clone, Copy, Debug)]
enum Recorded {
    Copy {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    },
    Set {
        dst: DevicePtr,
        value: u8,
        bytes: usize,
    },
}

/// The graph group's capture: the stream being captured and what it recorded.
#[derive(Default)]
struct Graphs {
    capturing: Option<(Stream, Vec<Recorded>)>,
}

/// The device number whose selection panics.
pub const PANIC_DEVICE: i32 = 666;

fn unsupported<T>(what: &str) -> Result<T> {
    Err(Error::unsupported(format!(
        "{what} is not implemented by the test plugin"
    )))
}

impl TestDevice {
    fn graphs(&self) -> Result<std::sync::MutexGuard<'_, Graphs>> {
        self.graphs
            .lock()
            .map_err(|_| Error::internal("lock poisoned"))
    }

    /// Records `work` when `stream` is capturing; otherwise runs it.
    fn run_or_record(&self, stream: Stream, work: Recorded) -> Result<()> {
        if let Some((s, recorded)) = self.graphs()?.capturing.as_mut() {
            if *s == stream {
                recorded.push(work);
                return Ok(());
            }
        }
        self.run(work)
    }

    fn run(&self, work: Recorded) -> Result<()> {
        match work {
            Recorded::Copy { dst, src, bytes } => self.mem_copy(dst, src, bytes),
            Recorded::Set { dst, value, bytes } => self.mem_set(dst, value, bytes),
        }
    }

    fn with_buf<R>(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let mut allocs = self
            .allocs
            .lock()
            .map_err(|_| Error::internal("lock poisoned"))?;
        for (base, buf) in allocs.iter_mut() {
            let off = ptr.0.wrapping_sub(*base) as usize;
            if ptr.0 >= *base && off + bytes <= buf.len() {
                return Ok(f(&mut buf[off..off + bytes]));
            }
        }
        Err(Error::invalid_argument(format!(
            "{:#x}+{bytes} is not an allocation of this device",
            ptr.0
        )))
    }
}

impl DeviceAdaptor for TestDevice {
    fn instance() -> &'static Self {
        singleton!(TestDevice)
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
        if device == PANIC_DEVICE {
            panic!("deliberate panic in set_device({device})");
        }
        if device != 0 {
            return Err(Error::invalid_argument(format!(
                "device {device} out of range 0..1"
            )));
        }
        Ok(())
    }
    fn get_device(&self) -> Result<i32> {
        Ok(0)
    }
    fn properties(&self, device: i32) -> Result<Properties> {
        if device != 0 {
            return Err(Error::invalid_argument(format!(
                "device {device} out of range 0..1"
            )));
        }
        Ok(Properties {
            vendor: "ferrocx-test".into(),
            name: "rust test device".into(),
            capabilities: Capabilities::HOST_ADDRESSABLE | Capabilities::VMM,
            total_memory: 1 << 30,
            arch: 0,
            device_count: 1,
        })
    }
    fn mem_alloc(&self, bytes: usize, _kind: MemKind) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::invalid_argument("zero-size allocation"));
        }
        let buf = vec![0u8; bytes];
        let ptr = buf.as_ptr() as u64;
        self.allocs
            .lock()
            .map_err(|_| Error::internal("lock poisoned"))?
            .insert(ptr, buf);
        Ok(DevicePtr(ptr))
    }
    fn mem_free(&self, ptr: DevicePtr, _kind: MemKind) -> Result<()> {
        match self
            .allocs
            .lock()
            .map_err(|_| Error::internal("lock poisoned"))?
            .remove(&ptr.0)
        {
            Some(_) => Ok(()),
            None => Err(Error::invalid_handle(format!(
                "{:#x} was not allocated here",
                ptr.0
            ))),
        }
    }
    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        let data = self.with_buf(src, bytes, |s| s.to_vec())?;
        self.with_buf(dst, bytes, |d| d.copy_from_slice(&data))
    }
    fn mem_copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: Stream,
    ) -> Result<()> {
        self.run_or_record(s, Recorded::Copy { dst, src, bytes })
    }
    fn mem_set(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.with_buf(dst, bytes, |d| d.fill(value))
    }
    fn mem_set_async(&self, dst: DevicePtr, value: u8, bytes: usize, s: Stream) -> Result<()> {
        self.run_or_record(s, Recorded::Set { dst, value, bytes })
    }
    fn stream_create(&self, _flags: u32) -> Result<Stream> {
        unsupported("stream_create")
    }
    fn stream_wrap(&self, _native: *mut c_void) -> Result<Stream> {
        unsupported("stream_wrap")
    }
    fn stream_destroy(&self, _s: Stream) -> Result<()> {
        unsupported("stream_destroy")
    }
    fn stream_synchronize(&self, _s: Stream) -> Result<()> {
        Ok(())
    }
    fn stream_query(&self, _s: Stream) -> Result<bool> {
        Ok(true)
    }
    fn stream_wait_event(&self, _s: Stream, _e: Event) -> Result<()> {
        unsupported("stream_wait_event")
    }
    fn event_create(&self, _flags: u32) -> Result<Event> {
        unsupported("event_create")
    }
    fn event_destroy(&self, _e: Event) -> Result<()> {
        unsupported("event_destroy")
    }
    fn event_record(&self, _e: Event, _s: Stream) -> Result<()> {
        unsupported("event_record")
    }
    fn event_synchronize(&self, _e: Event) -> Result<()> {
        unsupported("event_synchronize")
    }
    fn event_query(&self, _e: Event) -> Result<bool> {
        unsupported("event_query")
    }
    fn event_elapsed_ms(&self, _a: Event, _b: Event) -> Result<f32> {
        unsupported("event_elapsed_ms")
    }
    fn launch_host_func(&self, _s: Stream, call: HostCall) -> Result<()> {
        // Streams complete synchronously here, so stream order is call order.
        call.run();
        Ok(())
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
    fn mem_get_info(&self) -> Result<MemInfo> {
        // The 1 GiB `properties` reports, less what is allocated now.
        const TOTAL: usize = 1 << 30;
        let used: usize = self
            .allocs
            .lock()
            .map_err(|_| Error::internal("lock poisoned"))?
            .values()
            .map(Vec::len)
            .sum();
        Ok(MemInfo {
            free: TOTAL.saturating_sub(used),
            total: TOTAL,
        })
    }
}

impl DeviceVmm for TestDevice {
    fn vmm_granularity(&self, _device: i32) -> Result<usize> {
        Ok(4096)
    }
    fn vmm_alloc(&self, _bytes: usize) -> Result<VmmHandle> {
        unsupported("vmm_alloc")
    }
    fn vmm_export_fd(&self, _h: VmmHandle) -> Result<i32> {
        unsupported("vmm_export_fd")
    }
    fn vmm_import_fd(&self, _fd: i32, _bytes: usize) -> Result<VmmHandle> {
        unsupported("vmm_import_fd")
    }
    fn vmm_release(&self, _h: VmmHandle) -> Result<()> {
        unsupported("vmm_release")
    }
}

impl DeviceGraph for TestDevice {
    fn graph_begin_capture(&self, s: Stream) -> Result<()> {
        let mut g = self.graphs()?;
        if g.capturing.is_some() {
            return Err(Error::invalid_argument("a stream is already capturing"));
        }
        g.capturing = Some((s, Vec::new()));
        Ok(())
    }
    fn graph_end_capture(&self, s: Stream) -> Result<GraphHandle> {
        let mut g = self.graphs()?;
        match g.capturing.take() {
            Some((c, recorded)) if c == s => {
                let id = self.made.insert(recorded);
                Ok(GraphHandle(id as usize as *mut c_void))
            }
            other => {
                g.capturing = other;
                Err(Error::invalid_argument("the stream is not capturing"))
            }
        }
    }
    fn graph_launch(&self, graph: GraphHandle, _s: Stream) -> Result<()> {
        let work = self.made.get(graph.0 as usize as u64)?;
        // Streams complete synchronously here: the replay runs now, in order.
        work.into_iter().try_for_each(|w| self.run(w))
    }
    fn graph_destroy(&self, graph: GraphHandle) -> Result<()> {
        self.made.remove(graph.0 as usize as u64).map(drop)
    }
}

/// The CCL: reports a version and a unique id; collectives are not implemented.
#[derive(Default)]
pub struct TestCcl;

/// The version `get_version` reports.
pub const CCL_VERSION: i32 = 12_345;

impl CclAdaptor for TestCcl {
    fn instance() -> &'static Self {
        singleton!(TestCcl)
    }
    fn init(&self, _o: &Options) -> Result<()> {
        Ok(())
    }
    fn finalize(&self) -> Result<()> {
        Ok(())
    }
    fn version(&self) -> Result<i32> {
        Ok(CCL_VERSION)
    }
    fn unique_id(&self) -> Result<Vec<u8>> {
        Ok(b"ferrocx-test-unique-id".to_vec())
    }
    fn comm_init_rank(&self, _i: &CommInit<'_>) -> Result<Comm> {
        unsupported("comm_init_rank")
    }
    fn comm_finalize(&self, _c: Comm) -> Result<()> {
        unsupported("comm_finalize")
    }
    fn comm_destroy(&self, _c: Comm) -> Result<()> {
        unsupported("comm_destroy")
    }
    fn comm_abort(&self, _c: Comm) -> Result<()> {
        unsupported("comm_abort")
    }
    fn comm_async_error(&self, _c: Comm) -> Result<Status> {
        Ok(Status::SUCCESS)
    }
    fn comm_count(&self, _c: Comm) -> Result<i32> {
        Ok(1)
    }
    fn comm_user_rank(&self, _c: Comm) -> Result<i32> {
        Ok(0)
    }
    fn comm_device(&self, _c: Comm) -> Result<i32> {
        Ok(0)
    }
    fn all_reduce(
        &self,
        _s: DevicePtr,
        _r: DevicePtr,
        _n: usize,
        _t: DataType,
        _o: ReduceOp,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("all_reduce")
    }
    fn all_gather(
        &self,
        _s: DevicePtr,
        _r: DevicePtr,
        _n: usize,
        _t: DataType,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("all_gather")
    }
    fn reduce_scatter(
        &self,
        _s: DevicePtr,
        _r: DevicePtr,
        _n: usize,
        _t: DataType,
        _o: ReduceOp,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("reduce_scatter")
    }
    fn broadcast(
        &self,
        _s: DevicePtr,
        _r: DevicePtr,
        _n: usize,
        _t: DataType,
        _root: i32,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("broadcast")
    }
    fn reduce(
        &self,
        _s: DevicePtr,
        _r: DevicePtr,
        _n: usize,
        _t: DataType,
        _o: ReduceOp,
        _root: i32,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("reduce")
    }
    fn gather(
        &self,
        _s: DevicePtr,
        _r: DevicePtr,
        _n: usize,
        _t: DataType,
        _root: i32,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("gather")
    }
    fn scatter(
        &self,
        _s: DevicePtr,
        _r: DevicePtr,
        _n: usize,
        _t: DataType,
        _root: i32,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("scatter")
    }
    fn all_to_all(
        &self,
        _s: DevicePtr,
        _r: DevicePtr,
        _n: usize,
        _t: DataType,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("all_to_all")
    }
    fn all_to_allv(
        &self,
        _s: DevicePtr,
        _sv: VCounts<'_>,
        _r: DevicePtr,
        _rv: VCounts<'_>,
        _t: DataType,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("all_to_allv")
    }
    fn send(
        &self,
        _b: DevicePtr,
        _n: usize,
        _t: DataType,
        _p: i32,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("send")
    }
    fn recv(
        &self,
        _b: DevicePtr,
        _n: usize,
        _t: DataType,
        _p: i32,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        unsupported("recv")
    }
    fn group_start(&self) -> Result<()> {
        Ok(())
    }
    fn group_end(&self) -> Result<()> {
        Ok(())
    }
    fn mem_alloc(&self, _bytes: usize) -> Result<DevicePtr> {
        unsupported("mem_alloc")
    }
    fn mem_free(&self, _p: DevicePtr) -> Result<()> {
        unsupported("mem_free")
    }
    fn mem_register(&self, _c: Comm, _b: DevicePtr, _n: usize) -> Result<RegHandle> {
        unsupported("register")
    }
    fn mem_deregister(&self, _c: Comm, _h: RegHandle) -> Result<()> {
        unsupported("deregister")
    }
}

/// The image format of the fake kernel group: function names, one a line (a vendor format).
pub const FAKE_IMAGE: ImageFormat = ImageFormat(0x1001);

/// The one function of the fake kernel group that runs: `fill_u32(u64 dst, u32 value, u64
/// count)`, run at launch on the calling thread (this device's streams run work at once).
const FILL_U32: usize = 1;

impl DeviceKernel for TestDevice {
    fn kernel_image_formats(&self, device: i32) -> Result<Vec<ImageFormat>> {
        if device != 0 {
            return Err(Error::invalid_argument("one device"));
        }
        Ok(vec![FAKE_IMAGE])
    }
    fn module_load(&self, image: &[u8], format: ImageFormat) -> Result<ModuleHandle> {
        if format != FAKE_IMAGE {
            return Err(Error::invalid_argument(format!(
                "loads only {FAKE_IMAGE:?} images, not {format:?}"
            )));
        }
        let text = std::str::from_utf8(image).map_err(|_| Error::invalid_argument("not UTF-8"))?;
        let names: Vec<String> = text.lines().map(str::to_string).collect();
        Ok(ModuleHandle(Box::into_raw(Box::new(names)).cast()))
    }
    fn module_unload(&self, m: ModuleHandle) -> Result<()> {
        // SAFETY: a handle `module_load` made from a leaked box, unloaded once (the test's
        // contract with itself).
        drop(unsafe { Box::from_raw(m.0.cast::<Vec<String>>()) });
        Ok(())
    }
    fn module_get_function(
        &self,
        m: ModuleHandle,
        name: &std::ffi::CStr,
    ) -> Result<FunctionHandle> {
        // SAFETY: a live module of `module_load`.
        let names = unsafe { &*m.0.cast::<Vec<String>>() };
        let name = name.to_string_lossy();
        if !names.iter().any(|n| *n == name) {
            return Err(Error::invalid_argument(format!("no function {name:?}")));
        }
        if name != "fill_u32" {
            return Err(Error::unsupported(format!("{name} does not run here")));
        }
        Ok(FunctionHandle(FILL_U32 as *mut c_void))
    }
    unsafe fn launch_kernel(&self, f: FunctionHandle, l: &Launch, _s: Stream) -> Result<()> {
        if f.0 as usize != FILL_U32 {
            return Err(Error::invalid_handle("not a function of this adaptor"));
        }
        if l.n_args != 3 {
            return Err(Error::invalid_argument(format!(
                "fill_u32 takes 3 arguments, not {}",
                l.n_args
            )));
        }
        // SAFETY: the caller's contract: three pointers, to a u64, a u32 and a u64, and `dst`
        // holds `count` u32 of this device's (host) memory.
        unsafe {
            let a = std::slice::from_raw_parts(l.args, 3);
            let dst = *a[0].cast::<u64>() as *mut u32;
            let value = *a[1].cast::<u32>();
            let count = *a[2].cast::<u64>() as usize;
            for i in 0..count {
                dst.add(i).write_unaligned(value);
            }
        }
        Ok(())
    }
}

export_plugin! {
    name: "testrust",
    device: TestDevice,
    device_vmm: TestDevice,
    device_graph: TestDevice,
    device_kernel: TestDevice,
    ccl: TestCcl,
    ccl_absent: ["all_to_allv"],
}
