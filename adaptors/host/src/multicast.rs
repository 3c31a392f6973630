//! Multicast of the host device, emulated.
//!
//! On a GPU a multicast object spans one physical allocation per device: a store through the
//! multicast mapping reaches every bound allocation, and a reduce-load returns the reduction
//! over all of them. The CPU cannot fan a plain store out, so the host device reaches its
//! multicast objects through two functions instead, [`store`] and [`load_reduce`], which is
//! what the host's window kernels call. The address range `mc_map` returns stands for the
//! object (addresses in it name offsets of the object) but has no memory behind it
//! (`PROT_NONE`): a plain load or store through it faults.
//!
//! An object is a small named shared-memory segment, its *directory*: a header (magic, size,
//! number of devices, lanes claimed) and one lane record per device (bound flag, the name of
//! the shared-memory segment of the VMM allocation bound to it, offsets and length). Every
//! field is an atomic; a lane's owner fills it and publishes it by setting `bound` last
//! (`Release`); readers load `bound` with `Acquire`. `mc_add_device` claims the next lane,
//! `mc_bind` fills this handle's lane, and [`store`] / [`load_reduce`] open the bound
//! allocations by name (mapped once per object, cached until the object and its mappings go).
//! The creating handle unlinks the directory's name when released (or at `finalize`).

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use ferrocx_plugin_sdk::abi::{DataType, DevicePtr, McHandle, ReduceOp, VmmHandle};
use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::{Error, Result};

use crate::shm::{self, Mapping};
use crate::vmm::{self, Unlink};

/// `"FXMCAST1"`: the first word of a directory.
const MAGIC: u64 = u64::from_le_bytes(*b"FXMCAST1");
/// Bytes of a lane's segment name (NUL-padded; a name may fill it all).
const NAME_LEN: usize = 96;
/// Most devices one object can span.
const MAX_DEVICES: usize = 4096;

/// The directory's header.
#[repr(C)]
struct Header {
    /// [`MAGIC`], stored last at creation (`Release`).
    magic: AtomicU64,
    /// The object's size as created.
    bytes: AtomicU64,
    /// Lanes in the directory.
    num_devices: AtomicU32,
    /// Lanes handed out by `mc_add_device`.
    claimed: AtomicU32,
    _reserved: [AtomicU64; 5],
}

/// One device's binding.
#[repr(C)]
struct Lane {
    /// 1 when the fields below describe a binding; set last (`Release`).
    bound: AtomicU32,
    _pad: AtomicU32,
    /// Segment name of the bound allocation, with its leading `/`, NUL-padded (little-endian
    /// bytes in words).
    name: [AtomicU64; NAME_LEN / 8],
    /// Offset of the binding in the allocation.
    mem_offset: AtomicU64,
    /// Offset of the binding in the object.
    mc_offset: AtomicU64,
    /// Bytes bound.
    length: AtomicU64,
}

const HEADER: usize = std::mem::size_of::<Header>();
const LANE: usize = std::mem::size_of::<Lane>();
const _: () = assert!(HEADER == 64 && LANE == 128);

/// A binding read out of a lane.
struct Binding {
    name: String,
    mem_offset: u64,
    mc_offset: u64,
    length: u64,
}

/// A directory mapped in this process, and the peers' allocations opened through it.
struct Directory {
    map: Mapping,
    bytes: usize,
    num_devices: usize,
    /// Bound allocations, by segment name, mapped whole.
    segments: Mutex<HashMap<String, Arc<Mapping>>>,
}

impl Directory {
    /// Checks and wraps a mapped directory segment.
    fn new(map: Mapping) -> Result<Directory> {
        if map.len() < HEADER {
            return Err(Error::invalid_argument(format!(
                "a {}-byte segment is not a multicast object",
                map.len()
            )));
        }
        let mut d = Directory {
            map,
            bytes: 0,
            num_devices: 0,
            segments: Mutex::default(),
        };
        let h = d.header();
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(Error::invalid_argument(
                "the descriptor is not a multicast object of the host device (bad magic)",
            ));
        }
        let bytes = h.bytes.load(Ordering::Relaxed) as usize;
        let n = h.num_devices.load(Ordering::Relaxed) as usize;
        if n == 0 || n > MAX_DEVICES || HEADER + n * LANE > d.map.len() {
            return Err(Error::invalid_argument(format!(
                "multicast object header names {n} devices, which its {} bytes cannot hold",
                d.map.len()
            )));
        }
        d.bytes = bytes;
        d.num_devices = n;
        Ok(d)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least HEADER bytes (checked at creation/import), page-aligned,
        // and lives as long as `self`; every field is an atomic, so sharing it with other
        // processes that write it is sound.
        unsafe { &*(self.map.addr() as usize as *const Header) }
    }

    fn lane(&self, i: usize) -> &Lane {
        assert!(i < self.num_devices, "lane {i} of {}", self.num_devices);
        // SAFETY: lane `i` lies inside the mapping (HEADER + n * LANE <= len was checked), is
        // 8-byte aligned, lives as long as `self`, and is made of atomics only.
        unsafe { &*((self.map.addr() as usize + HEADER + i * LANE) as *const Lane) }
    }

    /// The binding of lane `i`, or `None` when it is not bound.
    fn binding(&self, i: usize) -> Option<Binding> {
        let l = self.lane(i);
        if l.bound.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut raw = Vec::with_capacity(NAME_LEN);
        for w in &l.name {
            raw.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        Some(Binding {
            name: String::from_utf8_lossy(&raw[..end]).into_owned(),
            mem_offset: l.mem_offset.load(Ordering::Relaxed),
            mc_offset: l.mc_offset.load(Ordering::Relaxed),
            length: l.length.load(Ordering::Relaxed),
        })
    }

    /// The segment `name` mapped in this process (opened on first use).
    fn segment(&self, name: &str) -> Result<Arc<Mapping>> {
        let mut segs = self.segments.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = segs.get(name) {
            return Ok(m.clone());
        }
        let fd = shm::open_existing(name)?;
        let (_, size, _) = shm::stat(fd.as_fd())
            .map_err(|e| shm::os_error(format!("fstat of segment {name}"), e))?;
        if size == 0 {
            return Err(Error::invalid_argument(format!("segment {name} is empty")));
        }
        // The mapping keeps the memory; the descriptor closes here.
        let m = Arc::new(Mapping::shared(fd.as_fd(), size)?);
        segs.insert(name.to_string(), m.clone());
        Ok(m)
    }
}

/// A multicast handle of this process.
struct Object {
    dir: Arc<Directory>,
    /// The directory's descriptor, duplicated by `mc_export_fd`.
    fd: OwnedFd,
    /// The lane `mc_add_device` claimed through this handle.
    lane: Option<usize>,
    /// Set for the creating handle: unlinks the directory's name when the handle goes.
    _creator: Option<Unlink>,
}

/// A range returned by `mc_map`.
struct McMapping {
    /// The reserved range (`PROT_NONE`), unmapped on drop.
    map: Mapping,
    /// Bytes asked for.
    bytes: usize,
    dir: Arc<Directory>,
}

/// The multicast handles of this process.
static OBJECTS: HandleTable<Object> = HandleTable::new("multicast");

fn mappings() -> MutexGuard<'static, BTreeMap<u64, McMapping>> {
    static MAPPINGS: OnceLock<Mutex<BTreeMap<u64, McMapping>>> = OnceLock::new();
    MAPPINGS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn insert(o: Object) -> McHandle {
    McHandle(OBJECTS.insert(o))
}

fn check_device(device: i32) -> Result<()> {
    if device != 0 {
        return Err(Error::invalid_argument(format!(
            "device {device} does not exist (the host device is device 0)"
        )));
    }
    Ok(())
}

/// Creates an object of `bytes` for `num_devices` devices.
pub(crate) fn create(bytes: usize, num_devices: i32) -> Result<McHandle> {
    if bytes == 0 {
        return Err(Error::invalid_argument(
            "cannot create a multicast object of 0 bytes",
        ));
    }
    let n = usize::try_from(num_devices)
        .ok()
        .filter(|n| (1..=MAX_DEVICES).contains(n))
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{num_devices} devices: a multicast object spans 1 to {MAX_DEVICES}"
            ))
        })?;
    let size = shm::round_to_pages(HEADER + n * LANE)?;
    let (fd, unlink) = vmm::create_segment(size, "a multicast object")?;
    let map = Mapping::shared(fd.as_fd(), size)?;
    // SAFETY: the fresh mapping holds `size >= HEADER` zeroed bytes, page-aligned; the header
    // is atomics only.
    let h = unsafe { &*(map.addr() as usize as *const Header) };
    h.bytes.store(bytes as u64, Ordering::Relaxed);
    h.num_devices.store(n as u32, Ordering::Relaxed);
    h.magic.store(MAGIC, Ordering::Release);
    let dir = Directory::new(map)?;
    tracing::trace!(
        segment = unlink.name(),
        bytes,
        n,
        "multicast object created"
    );
    Ok(insert(Object {
        dir: Arc::new(dir),
        fd,
        lane: None,
        _creator: Some(unlink),
    }))
}

/// A new descriptor of the object's directory, owned by the caller.
pub(crate) fn export_fd(mc: McHandle) -> Result<i32> {
    let fd = OBJECTS
        .with(mc.0, |o| o.fd.try_clone())?
        .map_err(|e| shm::os_error(format!("dup of multicast handle {:#x}", mc.0), e))?;
    Ok(fd.into_raw_fd())
}

/// Imports the object behind `fd` (the caller keeps `fd`); `bytes` must be its size.
pub(crate) fn import_fd(fd: i32, bytes: usize) -> Result<McHandle> {
    if fd < 0 {
        return Err(Error::invalid_argument(format!(
            "{fd} is not a file descriptor"
        )));
    }
    // SAFETY: the caller passed an open descriptor and keeps it open for this call; it is only
    // borrowed (duplicated below, never closed here).
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let (_, size, regular) = shm::stat(borrowed).map_err(|e| {
        Error::invalid_argument(format!("fd {fd} cannot be imported: fstat failed: {e}"))
    })?;
    if !regular || size < HEADER {
        return Err(Error::invalid_argument(format!(
            "fd {fd} is not a multicast object of the host device"
        )));
    }
    let own = borrowed
        .try_clone_to_owned()
        .map_err(|e| shm::os_error(format!("dup of fd {fd}"), e))?;
    let dir = Directory::new(Mapping::shared(own.as_fd(), size)?)?;
    if dir.bytes != bytes {
        return Err(Error::invalid_argument(format!(
            "fd {fd} is a multicast object of {} bytes, not {bytes}",
            dir.bytes
        )));
    }
    Ok(insert(Object {
        dir: Arc::new(dir),
        fd: own,
        lane: None,
        _creator: None,
    }))
}

/// Claims the next free lane of the object for this handle.
pub(crate) fn add_device(mc: McHandle, device: i32) -> Result<()> {
    check_device(device)?;
    OBJECTS.with(mc.0, |o| -> Result<()> {
        if let Some(lane) = o.lane {
            return Err(Error::invalid_argument(format!(
                "multicast handle {:#x} already added its device (lane {lane})",
                mc.0
            )));
        }
        let n = o.dir.num_devices as u32;
        let claimed = &o.dir.header().claimed;
        let lane = claimed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < n).then_some(c + 1)
            })
            .map_err(|c| {
                Error::invalid_argument(format!(
                    "all {n} devices of the multicast object are added ({c} lanes claimed)"
                ))
            })?;
        o.lane = Some(lane as usize);
        Ok(())
    })?
}

/// Binds `bytes` of allocation `mem` from `mem_offset` at `mc_offset` of the object, in this
/// handle's lane.
pub(crate) fn bind(
    mc: McHandle,
    mc_offset: usize,
    mem: VmmHandle,
    mem_offset: usize,
    bytes: usize,
) -> Result<()> {
    let (dir, lane) = OBJECTS.with(mc.0, |o| -> Result<_> {
        let lane = o.lane.ok_or_else(|| {
            Error::invalid_argument(format!(
                "multicast handle {:#x} has no device: call mc_add_device first",
                mc.0
            ))
        })?;
        Ok((o.dir.clone(), lane))
    })??;
    if bytes == 0 || mc_offset.checked_add(bytes).is_none_or(|e| e > dir.bytes) {
        return Err(Error::invalid_argument(format!(
            "binding {bytes} bytes at offset {mc_offset} does not fit the {}-byte multicast \
             object",
            dir.bytes
        )));
    }
    // Lock order: never the object registry and the VMM registry together.
    let name = vmm::segment_name(mem)?;
    let held = vmm::with_fd(mem, |_, size| Ok(size))?;
    if mem_offset.checked_add(bytes).is_none_or(|e| e > held) {
        return Err(Error::invalid_argument(format!(
            "binding {bytes} bytes from offset {mem_offset} overruns VMM handle {:#x} ({held} \
             bytes)",
            mem.0
        )));
    }
    if name.len() > NAME_LEN {
        return Err(Error::internal(format!(
            "segment name {name} is longer than {NAME_LEN} bytes"
        )));
    }
    let l = dir.lane(lane);
    if l.bound.load(Ordering::Acquire) != 0 {
        return Err(Error::invalid_argument(format!(
            "lane {lane} of multicast handle {:#x} is already bound: unbind it first",
            mc.0
        )));
    }
    let mut raw = [0u8; NAME_LEN];
    raw[..name.len()].copy_from_slice(name.as_bytes());
    for (w, chunk) in l.name.iter().zip(raw.chunks_exact(8)) {
        w.store(
            u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
            Ordering::Relaxed,
        );
    }
    l.mem_offset.store(mem_offset as u64, Ordering::Relaxed);
    l.mc_offset.store(mc_offset as u64, Ordering::Relaxed);
    l.length.store(bytes as u64, Ordering::Relaxed);
    l.bound.store(1, Ordering::Release);
    Ok(())
}

/// Reserves an address range standing for the object (no access: see the module's docs).
pub(crate) fn map(mc: McHandle, bytes: usize) -> Result<DevicePtr> {
    let dir = OBJECTS.with(mc.0, |o| o.dir.clone())?;
    if bytes == 0 || bytes > dir.bytes {
        return Err(Error::invalid_argument(format!(
            "cannot map {bytes} bytes of a {}-byte multicast object",
            dir.bytes
        )));
    }
    let map = Mapping::reserve(shm::round_to_pages(bytes)?)?;
    let base = map.addr();
    mappings().insert(base, McMapping { map, bytes, dir });
    Ok(DevicePtr(base))
}

/// Unmaps a range from [`map`].
pub(crate) fn unmap(ptr: DevicePtr, bytes: usize) -> Result<()> {
    let mut maps = mappings();
    let m = maps.get(&ptr.0).ok_or_else(|| {
        Error::invalid_handle(format!(
            "{:#x} is not a multicast mapping of this process",
            ptr.0
        ))
    })?;
    if bytes != m.bytes {
        return Err(Error::invalid_argument(format!(
            "the multicast mapping at {:#x} has {} bytes, not {bytes}",
            ptr.0, m.bytes
        )));
    }
    let m = maps.remove(&ptr.0);
    drop(maps);
    drop(m);
    Ok(())
}

/// Clears this handle's lane, bound at `mc_offset` for `bytes`.
pub(crate) fn unbind(mc: McHandle, device: i32, mc_offset: usize, bytes: usize) -> Result<()> {
    check_device(device)?;
    OBJECTS.with(mc.0, |o| -> Result<()> {
        let not_bound = || {
            Error::invalid_argument(format!(
                "multicast handle {:#x} has nothing bound at offset {mc_offset} for {bytes} bytes",
                mc.0
            ))
        };
        let lane = o.lane.ok_or_else(not_bound)?;
        let b = o.dir.binding(lane).ok_or_else(not_bound)?;
        if (b.mc_offset, b.length) != (mc_offset as u64, bytes as u64) {
            return Err(not_bound());
        }
        o.dir.lane(lane).bound.store(0, Ordering::Release);
        Ok(())
    })?
}

/// Releases a handle; the creating one unlinks the directory's name.
pub(crate) fn release(mc: McHandle) -> Result<()> {
    let o = OBJECTS.remove(mc.0)?;
    drop(o);
    Ok(())
}

/// Releases every mapping and handle still held; returns how many there were.
pub(crate) fn release_all() -> usize {
    let maps = std::mem::take(&mut *mappings());
    let objs = OBJECTS.take_all();
    maps.len() + objs.len()
}

/// One lane's memory for an access: the allocation's mapping and the offset in it.
type Target = (Arc<Mapping>, usize);

/// Resolves `[addr, addr + len)` of a multicast mapping to every lane's memory.
fn resolve(addr: u64, len: usize) -> Result<Vec<Target>> {
    let (dir, off) = {
        let maps = mappings();
        let (&base, m) = maps
            .range(..=addr)
            .next_back()
            .filter(|(_, m)| m.map.contains(addr, 1))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{addr:#x} is not inside a multicast mapping of this process"
                ))
            })?;
        let off = (addr - base) as usize;
        if off as u128 + len as u128 > m.bytes as u128 {
            return Err(Error::invalid_argument(format!(
                "{addr:#x} + {len} bytes runs past the end of the {}-byte multicast mapping at \
                 {base:#x}",
                m.bytes
            )));
        }
        (m.dir.clone(), off)
    };
    let n = dir.num_devices;
    let bindings: Vec<Option<Binding>> = (0..n).map(|i| dir.binding(i)).collect();
    let unbound: Vec<String> = bindings
        .iter()
        .enumerate()
        .filter(|(_, b)| b.is_none())
        .map(|(i, _)| i.to_string())
        .collect();
    if !unbound.is_empty() {
        return Err(Error::invalid_argument(format!(
            "lane(s) {} of the {n} of the multicast object are not bound",
            unbound.join(", ")
        )));
    }
    let (lo, hi) = (off as u64, (off + len) as u64);
    let mut targets = Vec::with_capacity(n);
    for (i, b) in bindings.into_iter().flatten().enumerate() {
        if lo < b.mc_offset || hi > b.mc_offset + b.length {
            return Err(Error::invalid_argument(format!(
                "lane {i} binds bytes [{}, {}) of the multicast object, which do not cover \
                 [{lo}, {hi})",
                b.mc_offset,
                b.mc_offset + b.length
            )));
        }
        let seg = dir.segment(&b.name)?;
        let at = b.mem_offset + (lo - b.mc_offset);
        if !seg.contains(seg.addr() + at, len) {
            return Err(Error::invalid_argument(format!(
                "lane {i}: bytes [{at}, {}) run past the {}-byte segment {}",
                at + len as u64,
                seg.len(),
                b.name
            )));
        }
        targets.push((seg, at as usize));
    }
    Ok(targets)
}

/// Stores `data` at `addr` of a multicast mapping: it is written into every bound device's
/// allocation, at the corresponding offset.
///
/// Errors: `addr` outside every multicast mapping of this process, a range past the mapping's
/// end, a lane not bound (named), or a binding that does not cover the range.
pub fn store(addr: u64, data: &[u8]) -> Result<()> {
    for (seg, at) in resolve(addr, data.len())? {
        // SAFETY: `at..at + len` lies inside the mapped segment (checked by `resolve`), which
        // `seg` keeps mapped; other processes may access the same bytes at once, which is the
        // multicast's semantics (the callers order their accesses with barriers).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (seg.addr() as usize + at) as *mut u8,
                data.len(),
            )
        };
    }
    Ok(())
}

/// A zeroed buffer of `len` bytes aligned for every data type.
fn aligned(len: usize) -> Vec<u64> {
    vec![0u64; len.div_ceil(8)]
}

fn bytes_of(v: &mut [u64], len: usize) -> &mut [u8] {
    assert!(len <= v.len() * 8);
    // SAFETY: `v` holds at least `len` initialised bytes; u8 has no alignment or validity
    // requirement; the borrow is unique.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, len) }
}

/// Loads `out.len()` bytes at `addr` of a multicast mapping from every bound device's
/// allocation and writes their element-wise reduction (`op` over `dtype`) into `out`.
///
/// Errors: as [`store`], and `out.len()` not a multiple of the type's size, an unknown type or
/// an unknown op.
pub fn load_reduce(addr: u64, out: &mut [u8], dtype: DataType, op: ReduceOp) -> Result<()> {
    let size = dtype
        .size()
        .ok_or_else(|| Error::invalid_argument(format!("unknown data type {}", dtype.0)))?;
    if out.len() % size != 0 {
        return Err(Error::invalid_argument(format!(
            "{} bytes is not a whole number of {size}-byte elements",
            out.len()
        )));
    }
    let len = out.len();
    let targets = resolve(addr, len)?;
    let mut loaded: Vec<Vec<u64>> = Vec::with_capacity(targets.len());
    for (seg, at) in &targets {
        let mut buf = aligned(len);
        // SAFETY: as in `store`, reading.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (seg.addr() as usize + at) as *const u8,
                buf.as_mut_ptr() as *mut u8,
                len,
            )
        };
        loaded.push(buf);
    }
    let srcs: Vec<&[u8]> = loaded.iter_mut().map(|b| &*bytes_of(b, len)).collect();
    let mut dst = aligned(len);
    crate::ccl::reduce::reduce(bytes_of(&mut dst, len), &srcs, dtype, op)?;
    out.copy_from_slice(bytes_of(&mut dst, len));
    Ok(())
}
