//! `offhost`: a test device whose memory the host cannot address, loaded as a `.so` by the
//! tests of jobs across clusters, so that the bridge's staging path runs without a GPU.
//!
//! - **Memory.** Device allocations live in a private map and get addresses in a range no
//!   process can dereference (`0x7e57…`, non-canonical on x86-64 and above the user range
//!   elsewhere): a host access by ferrocx to device memory crashes instead of passing. Pinned
//!   and host allocations (`MemKind::PINNED`, `MemKind::HOST`) are real host memory. Copies
//!   take any mix of device and host addresses (the ABI's unified addressing).
//! - **Streams** are worker threads running their work in order; events complete when the
//!   work before their record has run; `stream_wait_event` holds a stream until then; host
//!   functions run on the stream's thread. Properties report `HOST_FUNC`, never
//!   `HOST_ADDRESSABLE`.
//! - **Stream memory operations** (the memops group): a store or a wait on a word of pinned or
//!   host memory (other addresses are refused, as CUDA refuses them), made by the stream's
//!   worker in order; a wait polls and gives up after two minutes.
//! - **The CCL** runs one rank per communicator (a cluster of one rank): each collective is a
//!   copy on the stream; a communicator of several ranks is refused.
//!
//! [`ferrocx_offhost_live`] (a C symbol) reports live streams, events and allocations, for
//! leak checks.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use ferrocx_plugin_sdk::prelude::*;

/// First device address (non-canonical on x86-64: never a host address).
pub const DEVICE_BASE: u64 = 0x7e57_0000_0000_0000;
/// End of the device range.
const DEVICE_END: u64 = 0x7e58_0000_0000_0000;

static LIVE_STREAMS: AtomicU64 = AtomicU64::new(0);
static LIVE_EVENTS: AtomicU64 = AtomicU64::new(0);
static LIVE_ALLOCS: AtomicU64 = AtomicU64::new(0);

/// Writes the live streams, events and allocations (device and pinned) of this process's
/// `offhost` device.
///
/// # Safety
/// Each pointer is null or points to a writable `u64`.
#[no_mangle]
pub unsafe extern "C" fn ferrocx_offhost_live(
    streams: *mut u64,
    events: *mut u64,
    allocs: *mut u64,
) {
    for (p, v) in [
        (streams, &LIVE_STREAMS),
        (events, &LIVE_EVENTS),
        (allocs, &LIVE_ALLOCS),
    ] {
        if !p.is_null() {
            // SAFETY: the caller's contract.
            unsafe { p.write(v.load(Ordering::Acquire)) };
        }
    }
}

type Work = Box<dyn FnOnce() -> Result<()> + Send>;

/// A stream: its worker's queue and its first failure.
struct StreamState {
    queue: Sender<Work>,
    worker: JoinHandle<()>,
    failed: Arc<Mutex<Option<String>>>,
}

/// An event: records made so far, and records whose work has run.
#[derive(Default)]
struct EventState {
    words: Mutex<(u64, u64)>,
    cond: Condvar,
}

impl EventState {
    fn complete(&self, n: u64) {
        let mut w = self.words.lock().unwrap_or_else(|p| p.into_inner());
        w.1 = w.1.max(n);
        self.cond.notify_all();
    }

    fn wait(&self, n: u64) {
        let mut w = self.words.lock().unwrap_or_else(|p| p.into_inner());
        while w.1 < n {
            w = self.cond.wait(w).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The device.
#[derive(Default)]
pub struct OffhostDevice {
    /// Device allocations: address → bytes.
    device: Mutex<BTreeMap<u64, Vec<u8>>>,
    /// Pinned and host allocations: address → memory (8-aligned).
    host: Mutex<HashMap<u64, Vec<u64>>>,
    next: Mutex<u64>,
    streams: Mutex<HashMap<usize, StreamState>>,
    events: Mutex<HashMap<usize, Arc<EventState>>>,
    ids: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn unsupported<T>(what: &str) -> Result<T> {
    Err(Error::unsupported(format!(
        "{what} is not implemented by the offhost test device"
    )))
}

impl OffhostDevice {
    fn id(&self) -> usize {
        self.ids.fetch_add(1, Ordering::Relaxed) as usize + 1
    }

    fn is_device(ptr: u64) -> bool {
        (DEVICE_BASE..DEVICE_END).contains(&ptr)
    }

    /// Reads `bytes` at `src` (device or host memory).
    fn read(&self, src: u64, bytes: usize) -> Result<Vec<u8>> {
        if Self::is_device(src) {
            let mem = lock(&self.device);
            let (base, buf) = mem
                .range(..=src)
                .next_back()
                .ok_or_else(|| Self::bad(src, bytes))?;
            let off = (src - base) as usize;
            if off + bytes > buf.len() {
                return Err(Self::bad(src, bytes));
            }
            return Ok(buf[off..off + bytes].to_vec());
        }
        let mut v = vec![0u8; bytes];
        // SAFETY: a host address: the caller's contract (a valid range of this process).
        unsafe { std::ptr::copy(src as *const u8, v.as_mut_ptr(), bytes) };
        Ok(v)
    }

    /// Writes `data` at `dst` (device or host memory).
    fn write(&self, dst: u64, data: &[u8]) -> Result<()> {
        if Self::is_device(dst) {
            let mut mem = lock(&self.device);
            let (base, buf) = mem
                .range_mut(..=dst)
                .next_back()
                .ok_or_else(|| Self::bad(dst, data.len()))?;
            let off = (dst - base) as usize;
            if off + data.len() > buf.len() {
                return Err(Self::bad(dst, data.len()));
            }
            buf[off..off + data.len()].copy_from_slice(data);
            return Ok(());
        }
        // SAFETY: a host address: the caller's contract (a valid range of this process).
        unsafe { std::ptr::copy(data.as_ptr(), dst as *mut u8, data.len()) };
        Ok(())
    }

    fn bad(ptr: u64, bytes: usize) -> Error {
        Error::invalid_argument(format!(
            "{ptr:#x}+{bytes} is not within an allocation of the offhost device"
        ))
    }

    fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let data = self.read(src.0, bytes)?;
        self.write(dst.0, &data)
    }

    /// Queues `work` on stream `s`.
    fn enqueue(&self, s: Stream, work: Work) -> Result<()> {
        let streams = lock(&self.streams);
        let st = streams
            .get(&(s.0 as usize))
            .ok_or_else(|| Error::invalid_handle("not a stream of the offhost device"))?;
        st.queue
            .send(work)
            .map_err(|_| Error::internal("the stream's worker is gone"))
    }

    fn event(&self, e: Event) -> Result<Arc<EventState>> {
        lock(&self.events)
            .get(&(e.0 as usize))
            .cloned()
            .ok_or_else(|| Error::invalid_handle("not an event of the offhost device"))
    }
}

impl DeviceAdaptor for OffhostDevice {
    fn instance() -> &'static Self {
        singleton!(OffhostDevice)
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
                "device {device} out of range 0..1"
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
            vendor: "ferrocx-test".into(),
            name: "offhost test device".into(),
            capabilities: Capabilities::HOST_FUNC,
            total_memory: 1 << 30,
            arch: 0,
            device_count: 1,
        })
    }
    fn mem_alloc(&self, bytes: usize, kind: MemKind) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::invalid_argument("zero-size allocation"));
        }
        if kind == MemKind::PINNED || kind == MemKind::HOST {
            let v = vec![0u64; bytes.div_ceil(8)];
            let p = v.as_ptr() as u64;
            lock(&self.host).insert(p, v);
            LIVE_ALLOCS.fetch_add(1, Ordering::AcqRel);
            return Ok(DevicePtr(p));
        }
        let mut next = lock(&self.next);
        let p = DEVICE_BASE + *next;
        *next += (bytes as u64).div_ceil(256) * 256 + 256;
        lock(&self.device).insert(p, vec![0u8; bytes]);
        LIVE_ALLOCS.fetch_add(1, Ordering::AcqRel);
        Ok(DevicePtr(p))
    }
    fn mem_free(&self, ptr: DevicePtr, kind: MemKind) -> Result<()> {
        let found = if kind == MemKind::PINNED || kind == MemKind::HOST {
            lock(&self.host).remove(&ptr.0).is_some()
        } else {
            lock(&self.device).remove(&ptr.0).is_some()
        };
        if !found {
            return Err(Error::invalid_handle(format!(
                "{:#x} ({kind:?}) was not allocated here",
                ptr.0
            )));
        }
        LIVE_ALLOCS.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }
    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        self.copy(dst, src, bytes)
    }
    fn mem_copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: Stream,
    ) -> Result<()> {
        self.enqueue(
            s,
            Box::new(move || OffhostDevice::instance().copy(dst, src, bytes)),
        )
    }
    fn mem_set(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        self.write(dst.0, &vec![value; bytes])
    }
    fn mem_set_async(&self, dst: DevicePtr, value: u8, bytes: usize, s: Stream) -> Result<()> {
        self.enqueue(
            s,
            Box::new(move || OffhostDevice::instance().mem_set(dst, value, bytes)),
        )
    }
    fn stream_create(&self, _flags: u32) -> Result<Stream> {
        let (tx, rx) = channel::<Work>();
        let failed = Arc::new(Mutex::new(None));
        let f = failed.clone();
        let worker = std::thread::Builder::new()
            .name("offhost-stream".into())
            .spawn(move || {
                for work in rx {
                    if let Err(e) = work() {
                        let mut slot = lock(&f);
                        if slot.is_none() {
                            *slot = Some(e.to_string());
                        }
                    }
                }
            })
            .map_err(|e| Error::internal(format!("spawning a stream's worker: {e}")))?;
        let id = self.id();
        lock(&self.streams).insert(
            id,
            StreamState {
                queue: tx,
                worker,
                failed,
            },
        );
        LIVE_STREAMS.fetch_add(1, Ordering::AcqRel);
        Ok(Stream(id as *mut c_void))
    }
    fn stream_wrap(&self, _native: *mut c_void) -> Result<Stream> {
        unsupported("stream_wrap")
    }
    fn stream_destroy(&self, s: Stream) -> Result<()> {
        let st = lock(&self.streams)
            .remove(&(s.0 as usize))
            .ok_or_else(|| Error::invalid_handle("not a stream of the offhost device"))?;
        drop(st.queue);
        let _ = st.worker.join();
        LIVE_STREAMS.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }
    fn stream_synchronize(&self, s: Stream) -> Result<()> {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let d = done.clone();
        self.enqueue(
            s,
            Box::new(move || {
                *lock(&d.0) = true;
                d.1.notify_all();
                Ok(())
            }),
        )?;
        let mut g = lock(&done.0);
        while !*g {
            g = done.1.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        drop(g);
        let failed = lock(&self.streams)
            .get(&(s.0 as usize))
            .and_then(|st| lock(&st.failed).take());
        match failed {
            Some(e) => Err(Error::internal(format!("a stream's work failed: {e}"))),
            None => Ok(()),
        }
    }
    fn stream_query(&self, s: Stream) -> Result<bool> {
        // Work runs on the worker: a synchronize is the only certain answer here.
        self.stream_synchronize(s).map(|()| true)
    }
    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<()> {
        let ev = self.event(e)?;
        let n = lock(&ev.words).0;
        self.enqueue(
            s,
            Box::new(move || {
                ev.wait(n);
                Ok(())
            }),
        )
    }
    fn event_create(&self, _flags: u32) -> Result<Event> {
        let id = self.id();
        lock(&self.events).insert(id, Arc::new(EventState::default()));
        LIVE_EVENTS.fetch_add(1, Ordering::AcqRel);
        Ok(Event(id as *mut c_void))
    }
    fn event_destroy(&self, e: Event) -> Result<()> {
        lock(&self.events)
            .remove(&(e.0 as usize))
            .ok_or_else(|| Error::invalid_handle("not an event of the offhost device"))?;
        LIVE_EVENTS.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }
    fn event_record(&self, e: Event, s: Stream) -> Result<()> {
        let ev = self.event(e)?;
        let n = {
            let mut w = lock(&ev.words);
            w.0 += 1;
            w.0
        };
        self.enqueue(
            s,
            Box::new(move || {
                ev.complete(n);
                Ok(())
            }),
        )
    }
    fn event_synchronize(&self, e: Event) -> Result<()> {
        let ev = self.event(e)?;
        let n = lock(&ev.words).0;
        ev.wait(n);
        Ok(())
    }
    fn event_query(&self, e: Event) -> Result<bool> {
        let ev = self.event(e)?;
        let w = lock(&ev.words);
        Ok(w.1 >= w.0)
    }
    fn event_elapsed_ms(&self, _a: Event, _b: Event) -> Result<f32> {
        unsupported("event_elapsed_ms")
    }
    fn launch_host_func(&self, s: Stream, call: HostCall) -> Result<()> {
        self.enqueue(
            s,
            Box::new(move || {
                call.run();
                Ok(())
            }),
        )
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
        const TOTAL: usize = 1 << 30;
        let used: usize = lock(&self.device).values().map(Vec::len).sum();
        Ok(MemInfo {
            free: TOTAL.saturating_sub(used),
            total: TOTAL,
        })
    }
}

/// The CCL: one rank per communicator.
#[derive(Default)]
pub struct OffhostCcl {
    comms: AtomicU64,
}

fn elems(n: usize, t: DataType) -> Result<usize> {
    t.size()
        .map(|s| s * n)
        .ok_or_else(|| Error::invalid_argument(format!("unknown data type {}", t.0)))
}

/// A one-rank collective: `bytes` from `s` to `r` on the stream.
fn copy_on(s: DevicePtr, r: DevicePtr, bytes: usize, st: Stream) -> Result<()> {
    if s == r || bytes == 0 {
        return Ok(());
    }
    OffhostDevice::instance().mem_copy_async(r, s, bytes, st)
}

fn only_root(root: i32) -> Result<()> {
    if root != 0 {
        return Err(Error::invalid_argument(format!(
            "root {root} of a one-rank communicator"
        )));
    }
    Ok(())
}

impl CclAdaptor for OffhostCcl {
    fn instance() -> &'static Self {
        singleton!(OffhostCcl)
    }
    fn init(&self, _o: &Options) -> Result<()> {
        Ok(())
    }
    fn finalize(&self) -> Result<()> {
        Ok(())
    }
    fn version(&self) -> Result<i32> {
        Ok(1)
    }
    fn unique_id(&self) -> Result<Vec<u8>> {
        Ok(b"offhost".to_vec())
    }
    fn comm_init_rank(&self, i: &CommInit<'_>) -> Result<Comm> {
        if i.nranks != 1 {
            return Err(Error::unsupported(format!(
                "the offhost CCL runs one rank per communicator, not {}",
                i.nranks
            )));
        }
        let id = self.comms.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Comm(id as *mut c_void))
    }
    fn comm_finalize(&self, _c: Comm) -> Result<()> {
        Ok(())
    }
    fn comm_destroy(&self, _c: Comm) -> Result<()> {
        Ok(())
    }
    fn comm_abort(&self, _c: Comm) -> Result<()> {
        Ok(())
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
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        _o: ReduceOp,
        _c: Comm,
        st: Stream,
    ) -> Result<()> {
        copy_on(s, r, elems(n, t)?, st)
    }
    fn all_gather(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        _c: Comm,
        st: Stream,
    ) -> Result<()> {
        copy_on(s, r, elems(n, t)?, st)
    }
    fn reduce_scatter(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        _o: ReduceOp,
        _c: Comm,
        st: Stream,
    ) -> Result<()> {
        copy_on(s, r, elems(n, t)?, st)
    }
    fn broadcast(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        root: i32,
        _c: Comm,
        st: Stream,
    ) -> Result<()> {
        only_root(root)?;
        copy_on(s, r, elems(n, t)?, st)
    }
    fn reduce(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        _o: ReduceOp,
        root: i32,
        _c: Comm,
        st: Stream,
    ) -> Result<()> {
        only_root(root)?;
        copy_on(s, r, elems(n, t)?, st)
    }
    fn gather(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        root: i32,
        _c: Comm,
        st: Stream,
    ) -> Result<()> {
        only_root(root)?;
        copy_on(s, r, elems(n, t)?, st)
    }
    fn scatter(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        root: i32,
        _c: Comm,
        st: Stream,
    ) -> Result<()> {
        only_root(root)?;
        copy_on(s, r, elems(n, t)?, st)
    }
    fn all_to_all(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        _c: Comm,
        st: Stream,
    ) -> Result<()> {
        copy_on(s, r, elems(n, t)?, st)
    }
    fn all_to_allv(
        &self,
        s: DevicePtr,
        sv: VCounts<'_>,
        r: DevicePtr,
        rv: VCounts<'_>,
        t: DataType,
        _c: Comm,
        st: Stream,
    ) -> Result<()> {
        let es = elems(1, t)?;
        let (n, so, ro) = (
            sv.counts[0].min(rv.counts[0]),
            sv.displs[0] * es,
            rv.displs[0] * es,
        );
        copy_on(
            DevicePtr(s.0 + so as u64),
            DevicePtr(r.0 + ro as u64),
            n * es,
            st,
        )
    }
    fn send(
        &self,
        _b: DevicePtr,
        _n: usize,
        _t: DataType,
        p: i32,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        Err(Error::invalid_argument(format!(
            "send to rank {p} of a one-rank communicator"
        )))
    }
    fn recv(
        &self,
        _b: DevicePtr,
        _n: usize,
        _t: DataType,
        p: i32,
        _c: Comm,
        _st: Stream,
    ) -> Result<()> {
        Err(Error::invalid_argument(format!(
            "receive from rank {p} of a one-rank communicator"
        )))
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
        unsupported("mem_register")
    }
    fn mem_deregister(&self, _c: Comm, _h: RegHandle) -> Result<()> {
        unsupported("mem_deregister")
    }
}

/// How long a stream waits for a value before it fails (a test device: a wait that is never
/// satisfied would keep the stream's worker, and `stream_destroy`, from returning).
const WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

impl OffhostDevice {
    /// `addr` as a word of a pinned or host allocation of this device (the only memory the
    /// memops group reaches, as on a GPU).
    fn host_word(&self, addr: usize) -> Result<usize> {
        let found = lock(&self.host)
            .iter()
            .any(|(&p, v)| (p as usize..p as usize + v.len() * 8).contains(&addr));
        if found {
            Ok(addr)
        } else {
            Err(Error::invalid_argument(format!(
                "{addr:#x} is not in pinned or host memory of the offhost device"
            )))
        }
    }
}

impl DeviceMemOps for OffhostDevice {
    unsafe fn stream_write_value32(&self, s: Stream, addr: *mut u32, value: u32) -> Result<()> {
        let a = self.host_word(addr as usize)?;
        self.enqueue(
            s,
            Box::new(move || {
                // SAFETY: a 4-aligned word of a live host allocation (the caller's contract
                // keeps it alive until the store ran), accessed atomically.
                let w = unsafe { &*(a as *const AtomicU32) };
                w.store(value, Ordering::Release);
                Ok(())
            }),
        )
    }

    unsafe fn stream_wait_value32(
        &self,
        s: Stream,
        addr: *const u32,
        value: u32,
        condition: WaitCondition,
    ) -> Result<()> {
        let a = self.host_word(addr as usize)?;
        self.enqueue(
            s,
            Box::new(move || {
                // SAFETY: as in `stream_write_value32`, until the wait is over.
                let w = unsafe { &*(a as *const AtomicU32) };
                let start = std::time::Instant::now();
                let mut polls = 0u32;
                loop {
                    let v = w.load(Ordering::Acquire);
                    let met = match condition {
                        WaitCondition::Geq => v.wrapping_sub(value) as i32 >= 0,
                        WaitCondition::Eq => v == value,
                    };
                    if met {
                        return Ok(());
                    }
                    polls = polls.wrapping_add(1);
                    if polls < 1_000 {
                        std::hint::spin_loop();
                    } else if start.elapsed() > WAIT_LIMIT {
                        return Err(Error::internal("a stream wait for a value timed out"));
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(20));
                    }
                }
            }),
        )
    }
}

export_plugin! {
    name: "offhost",
    device: OffhostDevice,
    device_memops: OffhostDevice,
    ccl: OffhostCcl,
}
