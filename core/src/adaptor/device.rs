//! Safe calls through a device adaptor's table.

use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

use crate::abi::{
    Capabilities, DeviceGraphV1, DeviceKernelV1, DeviceMemOpsV1, DeviceProperties, DevicePtr,
    Event, FunctionHandle, GraphHandle, ImageFormat, KernelLaunch, MemKind, ModuleHandle, Status,
    Stream,
};
use crate::caps::{DeviceCaps, OrdinalCaps, TableCaps};
use crate::loader::DeviceTables;

use super::error::AdaptorError;

/// A device adaptor, ready to call. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    tables: Arc<DeviceTables>,
}

/// Device properties with owned strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Properties {
    /// Vendor name.
    pub vendor: String,
    /// Device name.
    pub name: String,
    /// Capability bits.
    pub capabilities: Capabilities,
    /// Device memory in bytes (0 when unknown).
    pub total_memory: u64,
    /// Vendor architecture number.
    pub arch: u32,
    /// Devices visible to this process.
    pub device_count: i32,
}

/// Calls entry `$op` of table `$t` with `$args`, turning `None` and failure statuses into errors.
macro_rules! call {
    ($self:ident, $t:expr, $op:ident ( $($arg:expr),* )) => {{
        let f = $t.$op.ok_or_else(|| $self.unsupported(stringify!($op)))?;
        // SAFETY: the table was checked by the loader; the arguments follow the ABI's contract
        // for this entry (valid out-pointers, handles from this adaptor).
        let status = unsafe { f($($arg),*) };
        $self.check(stringify!($op), status)
    }};
}

impl Device {
    /// Wraps checked tables.
    pub fn new(tables: Arc<DeviceTables>) -> Self {
        Device { tables }
    }

    /// The adaptor's name.
    pub fn name(&self) -> &str {
        self.tables.root.name()
    }

    /// The tables, for callers that dispatch themselves.
    pub fn tables(&self) -> &DeviceTables {
        &self.tables
    }

    pub(crate) fn unsupported(&self, op: &'static str) -> AdaptorError {
        AdaptorError::Unsupported {
            adaptor: self.name().to_string(),
            op,
        }
    }

    #[inline]
    pub(crate) fn check(&self, op: &'static str, status: Status) -> Result<(), AdaptorError> {
        if status.is_success() {
            Ok(())
        } else {
            Err(self.failed(op, status))
        }
    }

    /// The error of a failed `op`, with the adaptor's message (out of line: the failure path).
    #[cold]
    #[inline(never)]
    fn failed(&self, op: &'static str, status: Status) -> AdaptorError {
        AdaptorError::Failed {
            adaptor: self.name().to_string(),
            op,
            status,
            message: last_error(self.tables.root.get().get_last_error),
        }
    }

    /// `init` with the configuration's options for this adaptor.
    pub fn init(&self, options: &[(String, String)]) -> Result<(), AdaptorError> {
        let opts = super::options::CallOptions::new(options);
        call!(
            self,
            self.tables.root.get(),
            init(opts.as_ptr(), opts.len())
        )
    }

    /// `finalize`.
    pub fn finalize(&self) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), finalize())
    }

    /// Number of devices.
    /// A count below 0 is the adaptor's bug, refused as `INTERNAL_ERROR`.
    pub fn device_count(&self) -> Result<i32, AdaptorError> {
        let mut n = 0;
        call!(self, self.tables.root.get(), device_count(&mut n))?;
        self.not_negative("device_count", n)
    }

    /// `value`, the result of a successful `op`, unless negative: then the adaptor's bug.
    #[inline]
    fn not_negative(&self, op: &'static str, value: i32) -> Result<i32, AdaptorError> {
        if value >= 0 {
            Ok(value)
        } else {
            Err(self.negative(op, value))
        }
    }

    /// The error of a negative `value` from `op` (kept out of line: never on the hot path).
    #[cold]
    #[inline(never)]
    fn negative(&self, op: &'static str, value: i32) -> AdaptorError {
        AdaptorError::Failed {
            adaptor: self.name().to_string(),
            op,
            status: Status::INTERNAL_ERROR,
            message: format!("returned success with {value}, a negative number"),
        }
    }

    /// Selects the calling thread's device.
    pub fn set_device(&self, device: i32) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), set_device(device))
    }

    /// The calling thread's device.
    pub fn get_device(&self) -> Result<i32, AdaptorError> {
        let mut d = 0;
        call!(self, self.tables.root.get(), get_device(&mut d))?;
        self.not_negative("get_device", d)
    }

    /// Vendor, name and capabilities of a device.
    pub fn properties(&self, device: i32) -> Result<Properties, AdaptorError> {
        let mut p = DeviceProperties::default();
        call!(self, self.tables.root.get(), get_properties(device, &mut p))?;
        Ok(Properties {
            vendor: fixed_str(&p.vendor),
            name: fixed_str(&p.name),
            capabilities: p.capabilities,
            total_memory: p.total_memory,
            arch: p.arch,
            device_count: p.device_count,
        })
    }

    /// Allocates memory. The caller owns the address and frees it with [`Device::mem_free`];
    /// [`DeviceBuffer`](super::DeviceBuffer) does both and moves data with bounds checks.
    pub fn mem_alloc(&self, bytes: usize, kind: MemKind) -> Result<DevicePtr, AdaptorError> {
        let mut p = DevicePtr::NULL;
        call!(self, self.tables.root.get(), mem_alloc(bytes, kind, &mut p))?;
        Ok(p)
    }

    /// Frees memory.
    ///
    /// # Safety
    ///
    /// `ptr` is an address this adaptor's [`Device::mem_alloc`] returned with the same `kind`,
    /// not freed since; no pending work on any stream uses it, and nothing uses it afterwards.
    pub unsafe fn mem_free(&self, ptr: DevicePtr, kind: MemKind) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), mem_free(ptr, kind))
    }

    /// Copies synchronously.
    ///
    /// # Safety
    ///
    /// `src` is readable and `dst` writable for `bytes` bytes (see
    /// [valid ranges](crate::adaptor#valid-ranges)); the two ranges do not overlap, and no pending
    /// work on a stream writes either of them (or reads `dst`).
    pub unsafe fn mem_copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), mem_copy(dst, src, bytes))
    }

    /// Sets bytes synchronously.
    ///
    /// # Safety
    ///
    /// `dst` is writable for `bytes` bytes (see [valid ranges](crate::adaptor#valid-ranges)), and
    /// no pending work on a stream uses that range.
    pub unsafe fn mem_set(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
    ) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), mem_set(dst, value, bytes))
    }

    /// Bytes `(free, total)` of the current device (ABI 1.1; absent in a 1.0 plugin).
    pub fn mem_get_info(&self) -> Result<(usize, usize), AdaptorError> {
        let (mut free, mut total) = (0usize, 0usize);
        call!(
            self,
            self.tables.root.get(),
            mem_get_info(&mut free, &mut total)
        )?;
        Ok((free, total))
    }

    /// Enqueues a copy on `stream`.
    ///
    /// # Safety
    ///
    /// `src` is readable and `dst` writable for `bytes` bytes (see
    /// [valid ranges](crate::adaptor#valid-ranges)) from the call until the copy completes on
    /// `stream`; the ranges do not overlap, and in that time nothing else writes either of them
    /// (or reads `dst`) and neither is freed.
    pub unsafe fn mem_copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        call!(
            self,
            self.tables.root.get(),
            mem_copy_async(dst, src, bytes, stream)
        )
    }

    /// Enqueues a memset on `stream`.
    ///
    /// # Safety
    ///
    /// `dst` is writable for `bytes` bytes (see [valid ranges](crate::adaptor#valid-ranges)) from
    /// the call until the memset completes on `stream`; in that time nothing else uses the range
    /// and it is not freed.
    pub unsafe fn mem_set_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        call!(
            self,
            self.tables.root.get(),
            mem_set_async(dst, value, bytes, stream)
        )
    }

    /// Creates a stream.
    pub fn stream_create(&self) -> Result<Stream, AdaptorError> {
        let mut s = Stream::NULL;
        call!(self, self.tables.root.get(), stream_create(0, &mut s))?;
        Ok(s)
    }

    /// Wraps a stream another library made (for CUDA a `CUstream`, such as PyTorch's current
    /// stream) as a stream of this adaptor; destroying the wrapper leaves the native stream.
    ///
    /// # Safety
    /// `native` is a live stream of the runtime this adaptor drives (for CUDA, of the current
    /// device's context), and outlives every use of the returned stream.
    pub unsafe fn stream_wrap(
        &self,
        native: *mut std::ffi::c_void,
    ) -> Result<Stream, AdaptorError> {
        let mut s = Stream::NULL;
        call!(self, self.tables.root.get(), stream_wrap(native, &mut s))?;
        Ok(s)
    }

    /// Destroys a stream.
    pub fn stream_destroy(&self, stream: Stream) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), stream_destroy(stream))
    }

    /// Waits for a stream's work; reports its failure, if one.
    pub fn stream_synchronize(&self, stream: Stream) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), stream_synchronize(stream))
    }

    /// `true` when the stream's work has completed.
    pub fn stream_query(&self, stream: Stream) -> Result<bool, AdaptorError> {
        let f = self
            .tables
            .root
            .get()
            .stream_query
            .ok_or_else(|| self.unsupported("stream_query"))?;
        // SAFETY: a handle from this adaptor.
        match unsafe { f(stream) } {
            Status::NOT_READY => Ok(false),
            s => self.check("stream_query", s).map(|()| true),
        }
    }

    /// Orders later work of `stream` after the event's most recent record.
    pub fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<(), AdaptorError> {
        call!(
            self,
            self.tables.root.get(),
            stream_wait_event(stream, event)
        )
    }

    /// Creates an event (`flags`: 1 = no timing).
    pub fn event_create(&self, flags: u32) -> Result<Event, AdaptorError> {
        let mut e = Event::NULL;
        call!(self, self.tables.root.get(), event_create(flags, &mut e))?;
        Ok(e)
    }

    /// Destroys an event.
    pub fn event_destroy(&self, event: Event) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), event_destroy(event))
    }

    /// Records an event on a stream.
    pub fn event_record(&self, event: Event, stream: Stream) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), event_record(event, stream))
    }

    /// `true` when the event's most recent record has completed (or it was never recorded).
    pub fn event_query(&self, event: Event) -> Result<bool, AdaptorError> {
        let f = self
            .tables
            .root
            .get()
            .event_query
            .ok_or_else(|| self.unsupported("event_query"))?;
        // SAFETY: a handle from this adaptor.
        match unsafe { f(event) } {
            Status::NOT_READY => Ok(false),
            s => self.check("event_query", s).map(|()| true),
        }
    }

    /// Waits for the event's most recent record.
    pub fn event_synchronize(&self, event: Event) -> Result<(), AdaptorError> {
        call!(self, self.tables.root.get(), event_synchronize(event))
    }

    /// Milliseconds between two completed records.
    pub fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32, AdaptorError> {
        let mut ms = 0f32;
        call!(
            self,
            self.tables.root.get(),
            event_elapsed_ms(start, end, &mut ms)
        )?;
        Ok(ms)
    }
}

impl Device {
    /// `true` when the adaptor exports the memops group (`ferrocx_device_memops_v1`, ABI 1.3)
    /// with both entries, so [`Device::stream_write_value32`] and
    /// [`Device::stream_wait_value32`] can be called (known without `init`; the same answer as
    /// [`DeviceCaps::has_memops`]).
    pub fn has_memops(&self) -> bool {
        self.tables.memops.as_ref().is_some_and(|m| {
            let present = m.present();
            present.contains(&"stream_write_value32") && present.contains(&"stream_wait_value32")
        })
    }

    fn memops_table(&self, op: &'static str) -> Result<&DeviceMemOpsV1, AdaptorError> {
        self.tables
            .memops
            .as_ref()
            .map(|t| t.get())
            .ok_or_else(|| self.unsupported(op))
    }

    /// Enqueues on `stream` (null: the default stream) a store of `value` to the 32-bit word at
    /// `addr`, with release ordering: whoever reads `value` there also sees every write of the
    /// work enqueued on `stream` before it. Returns once enqueued. Needs the memops group
    /// ([`Device::has_memops`]); without it the error is [`AdaptorError::Unsupported`].
    ///
    /// # Safety
    ///
    /// `addr` is 4-byte aligned host memory the device can write (for the host device any host
    /// memory; for a GPU, pinned or registered host memory), valid from this call until the
    /// store has completed on `stream`; nothing else accesses that word non-atomically in that
    /// time.
    pub unsafe fn stream_write_value32(
        &self,
        stream: Stream,
        addr: *mut u32,
        value: u32,
    ) -> Result<(), AdaptorError> {
        let t = self.memops_table("stream_write_value32")?;
        call!(self, t, stream_write_value32(stream, addr, value))
    }

    /// Enqueues on `stream` (null: the default stream) a wait: work enqueued on `stream` after
    /// it does not start until the 32-bit word at `addr` satisfies `flags`
    /// ([`WAIT_VALUE_GEQ`](crate::abi::WAIT_VALUE_GEQ), 0: `(*addr).wrapping_sub(value) as i32
    /// >= 0`, CUDA's `CU_STREAM_WAIT_VALUE_GEQ`; [`WAIT_VALUE_EQ`](crate::abi::WAIT_VALUE_EQ),
    /// 1: `*addr == value`). Returns once enqueued: never blocks the calling thread. Other
    /// `flags` are `INVALID_ARGUMENT`. A wait never satisfied holds the stream (and whoever
    /// synchronizes it) as an event never recorded would; the stream can still be destroyed.
    /// Needs the memops group ([`Device::has_memops`]).
    ///
    /// # Safety
    ///
    /// `addr` is 4-byte aligned host memory the device can read (as for
    /// [`Device::stream_write_value32`]), valid from this call until the wait has completed on
    /// `stream` (or the stream is destroyed); whoever else writes that word writes it
    /// atomically.
    pub unsafe fn stream_wait_value32(
        &self,
        stream: Stream,
        addr: *const u32,
        value: u32,
        flags: u32,
    ) -> Result<(), AdaptorError> {
        let t = self.memops_table("stream_wait_value32")?;
        call!(self, t, stream_wait_value32(stream, addr, value, flags))
    }
}

impl Device {
    /// The graph group (`ferrocx_device_graph_v1`: stream capture into graphs launched as one
    /// unit), or `None` when the adaptor does not export it.
    pub fn graph(&self) -> Option<DeviceGraph> {
        self.tables.graph.as_ref().map(|_| DeviceGraph {
            device: self.clone(),
        })
    }
}

/// The graph group of a device adaptor, from [`Device::graph`].
///
/// ```ignore
/// let graphs = device.graph().ok_or("no graph group")?;
/// let graph = graphs.capture(stream, || ccl.all_reduce(/* … */, stream))?;
/// graph.launch(stream)?; // as often as wanted; destroyed on drop
/// ```
#[derive(Clone)]
pub struct DeviceGraph {
    device: Device,
}

/// The graph table of `dev`, or the error of `op` without it.
fn graph_table<'a>(dev: &'a Device, op: &'static str) -> Result<&'a DeviceGraphV1, AdaptorError> {
    dev.tables
        .graph
        .as_ref()
        .map(|t| t.get())
        .ok_or_else(|| dev.unsupported(op))
}

impl DeviceGraph {
    /// Starts recording the work enqueued on `stream` by this thread. Every capture must be
    /// ended with [`DeviceGraph::end_capture`], also after a failure; [`DeviceGraph::capture`]
    /// does both.
    pub fn begin_capture(&self, stream: Stream) -> Result<(), AdaptorError> {
        let dev = &self.device;
        let t = graph_table(dev, "graph_begin_capture")?;
        call!(dev, t, graph_begin_capture(stream))
    }

    /// Ends the capture of `stream`: the executable graph of what was recorded.
    pub fn end_capture(&self, stream: Stream) -> Result<Graph, AdaptorError> {
        let dev = &self.device;
        let t = graph_table(dev, "graph_end_capture")?;
        let mut handle = GraphHandle::NULL;
        call!(dev, t, graph_end_capture(stream, &mut handle))?;
        Ok(Graph {
            device: self.device.clone(),
            handle,
        })
    }

    /// Records what `work` enqueues on `stream` into a graph. The capture is ended whatever
    /// `work` returns; on its error the recording is discarded and the error returned.
    pub fn capture<E: From<AdaptorError>>(
        &self,
        stream: Stream,
        work: impl FnOnce() -> Result<(), E>,
    ) -> Result<Graph, E> {
        self.begin_capture(stream)?;
        let worked = work();
        let ended = self.end_capture(stream);
        match (worked, ended) {
            (Ok(()), Ok(graph)) => Ok(graph),
            (Err(e), _) => Err(e),
            (Ok(()), Err(e)) => Err(e.into()),
        }
    }
}

/// An executable graph of a device adaptor's graph group; destroyed on drop.
pub struct Graph {
    device: Device,
    handle: GraphHandle,
}

impl Graph {
    /// Enqueues one run of the graph on `stream`.
    pub fn launch(&self, stream: Stream) -> Result<(), AdaptorError> {
        let dev = &self.device;
        let t = graph_table(dev, "graph_launch")?;
        call!(dev, t, graph_launch(self.handle, stream))
    }

    /// The adaptor's handle.
    pub fn handle(&self) -> GraphHandle {
        self.handle
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Some(t) = self.device.tables.graph.as_ref() {
            if let Some(destroy) = t.get().graph_destroy {
                // SAFETY: a graph this adaptor's `graph_end_capture` returned, destroyed once.
                // A failure at drop is not actionable; the adaptor reports it in its log.
                let _ = unsafe { destroy(self.handle) };
            }
        }
    }
}

impl Device {
    /// The adaptor's capabilities: its tables' entries, and for every device its properties
    /// ([`Capabilities`] bits, architecture) and the kernel image formats it loads. Probed once,
    /// after `init` (a probe that cannot list the devices, as before `init`, is not kept).
    pub fn caps(&self) -> Arc<DeviceCaps> {
        self.tables.caps.get_or_probe(|| self.probe_caps())
    }

    fn probe_caps(&self) -> (DeviceCaps, bool) {
        let t = &self.tables;
        let mut notes = Vec::new();
        let kernel = self.kernel();
        let ordinals = self
            .device_count()
            .and_then(|n| {
                (0..n)
                    .map(|ordinal| {
                        let properties = match t.root.get().get_properties {
                            Some(_) => Some(self.properties(ordinal)?),
                            None => None,
                        };
                        let image_formats = match &kernel {
                            Some(k) if t.kernel_entry("kernel_image_formats") => {
                                k.image_formats(ordinal).unwrap_or_else(|e| {
                                    notes.push(format!("device {ordinal}: {e}"));
                                    Vec::new()
                                })
                            }
                            _ => Vec::new(),
                        };
                        Ok(OrdinalCaps {
                            ordinal,
                            properties,
                            image_formats,
                        })
                    })
                    .collect::<Result<Vec<_>, AdaptorError>>()
            })
            .map_err(|e| e.to_string());
        let complete = ordinals.is_ok();
        let caps = DeviceCaps {
            adaptor: self.name().to_string(),
            root: TableCaps::of(&t.root),
            vmm: t.vmm.as_ref().map(TableCaps::of),
            flatmap: t.flatmap.as_ref().map(TableCaps::of),
            multicast: t.multicast.as_ref().map(TableCaps::of),
            graph: t.graph.as_ref().map(TableCaps::of),
            kernel: t.kernel.as_ref().map(TableCaps::of),
            memops: t.memops.as_ref().map(TableCaps::of),
            ordinals,
            notes,
        };
        (caps, complete)
    }

    /// The kernel group (`ferrocx_device_kernel_v1`, ABI 1.2: modules loaded from images,
    /// functions launched on streams), or `None` when the adaptor does not export it.
    pub fn kernel(&self) -> Option<DeviceKernel> {
        self.tables.kernel.as_ref().map(|_| DeviceKernel {
            device: self.clone(),
        })
    }
}

impl DeviceTables {
    fn kernel_entry(&self, entry: &str) -> bool {
        self.kernel
            .as_ref()
            .is_some_and(|k| k.present().contains(&entry))
    }
}

/// The kernel table of `dev`, or the error of `op` without it.
fn kernel_table<'a>(dev: &'a Device, op: &'static str) -> Result<&'a DeviceKernelV1, AdaptorError> {
    dev.tables
        .kernel
        .as_ref()
        .map(|t| t.get())
        .ok_or_else(|| dev.unsupported(op))
}

/// The kernel group of a device adaptor, from [`Device::kernel`].
///
/// ```ignore
/// let kernels = device.kernel().ok_or("no kernel group")?;
/// let module = kernels.load(&cubin, ImageFormat::CUBIN)?; // onto the thread's device
/// let fill = module.function("fill")?;
/// let (mut ptr, mut n) = (buffer.0, count as u64);
/// let mut args = [(&mut ptr as *mut u64).cast(), (&mut n as *mut u64).cast()];
/// // SAFETY: `fill(u64 ptr, u64 n)` writes `n` words at `ptr`, a live allocation.
/// unsafe { fill.launch([blocks, 1, 1], [256, 1, 1], 0, &mut args, stream) }?;
/// ```
#[derive(Clone)]
pub struct DeviceKernel {
    device: Device,
}

impl DeviceKernel {
    /// The image formats `device` loads, best first.
    pub fn image_formats(&self, device: i32) -> Result<Vec<ImageFormat>, AdaptorError> {
        let dev = &self.device;
        let t = kernel_table(dev, "kernel_image_formats")?;
        let mut n = 0usize;
        call!(
            dev,
            t,
            kernel_image_formats(device, std::ptr::null_mut(), &mut n)
        )?;
        let mut formats = vec![ImageFormat(0); n];
        call!(
            dev,
            t,
            kernel_image_formats(device, formats.as_mut_ptr(), &mut n)
        )?;
        formats.truncate(n);
        Ok(formats)
    }

    /// Loads `image` of `format` onto the calling thread's current device; unloaded when the
    /// [`Module`] and every [`Function`] of it are dropped.
    pub fn load(&self, image: &[u8], format: ImageFormat) -> Result<Module, AdaptorError> {
        let dev = &self.device;
        let t = kernel_table(dev, "module_load")?;
        let mut handle = ModuleHandle::NULL;
        call!(
            dev,
            t,
            module_load(image.as_ptr(), image.len(), format, &mut handle)
        )?;
        Ok(Module {
            inner: Arc::new(LoadedModule {
                device: dev.clone(),
                handle,
            }),
        })
    }
}

struct LoadedModule {
    device: Device,
    handle: ModuleHandle,
}

impl Drop for LoadedModule {
    fn drop(&mut self) {
        if let Some(unload) = self
            .device
            .tables
            .kernel
            .as_ref()
            .and_then(|t| t.get().module_unload)
        {
            // SAFETY: a module this adaptor's `module_load` returned, unloaded once, after its
            // last `Function` is gone. A failure at drop is not actionable.
            let _ = unsafe { unload(self.handle) };
        }
    }
}

/// A module loaded through the kernel group; unloaded when it and its functions are dropped.
#[derive(Clone)]
pub struct Module {
    inner: Arc<LoadedModule>,
}

impl Module {
    /// The function `name` of the module.
    pub fn function(&self, name: &str) -> Result<Function, AdaptorError> {
        let dev = &self.inner.device;
        let t = kernel_table(dev, "module_get_function")?;
        let c = CString::new(name).map_err(|_| AdaptorError::Failed {
            adaptor: dev.name().to_string(),
            op: "module_get_function",
            status: Status::INVALID_ARGUMENT,
            message: format!("the name {name:?} contains a NUL byte"),
        })?;
        let mut handle = FunctionHandle::NULL;
        call!(
            dev,
            t,
            module_get_function(self.inner.handle, c.as_ptr(), &mut handle)
        )?;
        Ok(Function {
            module: self.inner.clone(),
            handle,
        })
    }

    /// The adaptor's handle.
    pub fn handle(&self) -> ModuleHandle {
        self.inner.handle
    }
}

/// A function of a loaded [`Module`] (which it keeps loaded). Cheap to clone.
#[derive(Clone)]
pub struct Function {
    module: Arc<LoadedModule>,
    handle: FunctionHandle,
}

impl Function {
    /// Enqueues one run of the function on `stream`: `grid` blocks of `block` threads with
    /// `shared_mem_bytes` of dynamic shared memory per block, and `args[i]` pointing at the
    /// value of the kernel's parameter `i` (the adaptor copies the values before returning).
    ///
    /// # Safety
    /// The kernel runs with whatever it is given: `args` must have one pointer per parameter of
    /// the kernel, in order, each to a value of that parameter's type; every address the
    /// values carry must be valid for what the kernel does with it until the launch completes
    /// on `stream`; `stream` must be a stream of this adaptor on the module's device.
    pub unsafe fn launch(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        args: &mut [*mut c_void],
        stream: Stream,
    ) -> Result<(), AdaptorError> {
        let dev = &self.module.device;
        let t = kernel_table(dev, "launch_kernel")?;
        let launch = KernelLaunch {
            grid,
            block,
            shared_mem_bytes,
            args: args.as_mut_ptr(),
            n_args: args.len(),
            ..KernelLaunch::default()
        };
        call!(dev, t, launch_kernel(self.handle, &launch, stream))
    }

    /// The adaptor's handle.
    pub fn handle(&self) -> FunctionHandle {
        self.handle
    }
}

/// Longest message kept from a plugin's `get_last_error`; a longer one is cut (at a character
/// boundary) and marked, so a runaway message cannot flood a log or a terminal.
pub const MAX_LAST_ERROR: usize = 4096;

/// Reads a plugin's `get_last_error`, tolerating its absence or a null return; at most
/// [`MAX_LAST_ERROR`] bytes of it are read.
pub(crate) fn last_error(f: Option<unsafe extern "C" fn() -> *const c_char>) -> String {
    let Some(f) = f else {
        return "(the adaptor has no get_last_error)".to_string();
    };
    // SAFETY: the entry takes no argument and returns null or a NUL-terminated string valid until
    // the next call on this thread.
    let p = unsafe { f() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated by the ABI's contract; strnlen reads no further than
    // the terminator or the bound.
    let len = unsafe { libc::strnlen(p, MAX_LAST_ERROR + 1) };
    // SAFETY: `len` bytes from `p` were just found readable and free of NUL.
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
    bounded_message(bytes)
}

/// `bytes` as text, cut to [`MAX_LAST_ERROR`] bytes with a mark when longer.
fn bounded_message(bytes: &[u8]) -> String {
    if bytes.len() <= MAX_LAST_ERROR {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut text = String::from_utf8_lossy(&bytes[..MAX_LAST_ERROR]).into_owned();
    // A multi-byte character cut in two became U+FFFD: drop it.
    if text.ends_with('\u{FFFD}') {
        text.pop();
    }
    text.push_str(&format!(" [... cut at {MAX_LAST_ERROR} bytes]"));
    text
}

fn fixed_str(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runaway_error_message_is_cut_with_a_mark() {
        assert_eq!(bounded_message(b"short"), "short");
        let exact = vec![b'x'; MAX_LAST_ERROR];
        assert_eq!(bounded_message(&exact).len(), MAX_LAST_ERROR);
        let huge = vec![b'y'; 1 << 20];
        let cut = bounded_message(&huge);
        assert!(cut.starts_with(&"y".repeat(MAX_LAST_ERROR)));
        assert!(
            cut.ends_with(" [... cut at 4096 bytes]"),
            "{}",
            &cut[MAX_LAST_ERROR..]
        );
        assert_eq!(cut.len(), MAX_LAST_ERROR + " [... cut at 4096 bytes]".len());
        // A character cut in two is dropped, not shown as a replacement character.
        let mut multi = vec![b'a'; MAX_LAST_ERROR - 1];
        multi.extend_from_slice("é and more".as_bytes());
        let cut = bounded_message(&multi);
        assert!(cut.starts_with(&"a".repeat(MAX_LAST_ERROR - 1)));
        assert!(!cut.contains('\u{FFFD}'), "{cut}");
    }

    static HUGE: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

    unsafe extern "C" fn huge_error() -> *const c_char {
        HUGE.get_or_init(|| std::ffi::CString::new(vec![b'z'; 1 << 20]).unwrap())
            .as_ptr()
    }

    #[test]
    fn a_plugins_megabyte_error_message_is_read_only_to_the_bound() {
        let m = last_error(Some(huge_error));
        assert!(m.len() < MAX_LAST_ERROR + 64, "{} bytes", m.len());
        assert!(m.ends_with("[... cut at 4096 bytes]"));
    }
}
