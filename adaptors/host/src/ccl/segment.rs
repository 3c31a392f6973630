//! The communicator's shared-memory segment: creation by rank 0, attachment by the others,
//! and its layout.
//!
//! Layout (every region cache-line aligned):
//! `Header | RankState[N] | slots[2][N][slot_bytes] | result[2][slot_bytes] | rings[N*N]`.
//! Buffers come in two parities: data published before barrier `b` lives in parity `b % 2` and
//! is read until barrier `b + 1`, so nothing is overwritten while a peer may still read it.

use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferrocx_plugin_sdk::{Error, Result};

/// Cache line size the layout pads to.
pub const LINE: usize = 128;
/// `"FXCOMM03"`: the header's magic once rank 0 has initialised it (the layout's version).
const READY: u64 = u64::from_le_bytes(*b"FXCOMM03");

/// The segment header.
#[repr(C, align(128))]
pub struct Header {
    pub magic: AtomicU64,
    pub nranks: AtomicU32,
    pub attached: AtomicU32,
    pub slot_bytes: AtomicU64,
    pub ring_bytes: AtomicU64,
    /// Set by any rank's abort; every wait checks it.
    pub abort: AtomicU32,
    _pad0: [u8; LINE - 36],
    /// Bumped by the last arriver of a barrier; waiters sleep on it (futex word).
    pub wake: AtomicU32,
    /// Ranks asleep in a futex wait on this segment: a waker makes the wake system call only
    /// when this is non-zero.
    pub sleepers: AtomicU32,
    _pad1: [u8; LINE - 8],
}

/// Bytes of payload a [`Line`] carries: small collectives travel inside the line that also
/// signals their arrival, so each peer moves one pair of cache lines per call.
pub const LINE_BYTES: usize = 192;

/// What a rank publishes to start an operation: the generation it reached, the operation's
/// descriptor (for the mismatch check) and, for a small message, its data.
#[repr(C, align(128))]
pub struct Line {
    /// Generation of the publication (stored last, `Release`; monotonic, never reset).
    pub gen: AtomicU64,
    /// The operation, packed (see `Desc::words`): kind, data type, reduction and root in the
    /// first word, the count in the second.
    pub desc: [AtomicU64; 2],
    /// Small-message payload, right after the descriptor: its first [`FIRST_LINE_BYTES`]
    /// share the first cache line with the generation, so a peer reading a small all-reduce's
    /// data (up to ten f32) or a barrier's word moves one cache line.
    pub data: std::cell::UnsafeCell<[u64; LINE_BYTES / 8]>,
}

/// Payload bytes that share a [`Line`]'s first 64-byte cache line with its generation.
pub const FIRST_LINE_BYTES: usize = 64 - std::mem::offset_of!(Line, data);

const _: () = assert!(FIRST_LINE_BYTES == 40);

/// Lines per rank: generation `g` publishes in line `g % LINES`. A small broadcast's root
/// runs up to `LINES - 1` operations ahead of its receivers (`TINY - 1` for a tiny one, see
/// `Ctx::post_broadcast`). 64
/// (16 KiB a rank): on the 2-core development VM, 8-byte broadcasts on 4 ranks took 0.35 µs a
/// call against 0.58 with 16 lines (a receiver that gets the core catches up on more calls
/// before it yields it), 0.110 against 0.117 µs on 2 ranks; 256 lines were erratic.
pub const LINES: usize = 64;

/// Records per rank of the tiny-broadcast ring: a tiny broadcast of generation `g` (at most
/// [`TINY_BYTES`]) travels in record `g % TINY` of its root (see `Ctx::post_broadcast`).
pub const TINY: usize = 4 * LINES;
/// Payload bytes of a [`Tiny`] record.
pub const TINY_BYTES: usize = 8;

/// A tiny broadcast's record: 16 bytes, four to a 64-byte cache line, so a root that runs
/// ahead of its receivers writes, and a receiver reads, one cache line per four calls (a
/// [`Line`] is one per call).
#[repr(C)]
pub struct Tiny {
    /// The generation's low 32 bits, then the call (count, data type, root), stored last
    /// (`Release`).
    pub tag: AtomicU64,
    /// The payload, in its first bytes.
    pub data: AtomicU64,
}

/// Per-rank state.
#[repr(C, align(128))]
pub struct RankState {
    /// The rank's pid, written at attach.
    pub pid: AtomicU32,
    _pad: u32,
    /// The last barrier generation this rank arrived at, or small broadcast it received
    /// (monotonic, never reset).
    pub arrived: AtomicU64,
    /// Operation starts, by their generation modulo [`LINES`].
    pub line: [Line; LINES],
    /// Tiny broadcasts this rank was the root of, by their generation modulo [`TINY`].
    pub tiny: [Tiny; TINY],
}

/// A ring for point-to-point traffic from one rank to another.
#[repr(C, align(128))]
pub struct RingHeader {
    /// Bytes written so far (monotonic); the receiver sleeps on its low 32 bits.
    pub head: AtomicU64,
    _pad0: [u8; LINE - 8],
    /// Bytes consumed so far (monotonic); the sender sleeps on its low 32 bits.
    pub tail: AtomicU64,
    _pad1: [u8; LINE - 8],
}

/// Sizes of one communicator's segment.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub nranks: usize,
    pub slot_bytes: usize,
    pub ring_bytes: usize,
}

impl Layout {
    fn ranks_off(&self) -> usize {
        std::mem::size_of::<Header>()
    }
    fn slots_off(&self) -> usize {
        self.ranks_off() + self.nranks * std::mem::size_of::<RankState>()
    }
    fn result_off(&self) -> usize {
        self.slots_off() + 2 * self.nranks * self.slot_bytes
    }
    fn rings_off(&self) -> usize {
        self.result_off() + 2 * self.slot_bytes
    }
    fn ring_stride(&self) -> usize {
        std::mem::size_of::<RingHeader>() + self.ring_bytes
    }
    /// Total bytes of the segment.
    pub fn total(&self) -> usize {
        self.rings_off() + self.nranks * self.nranks * self.ring_stride()
    }
}

/// A mapped communicator segment.
pub struct Segment {
    base: *mut u8,
    /// Owns the mapping (unmapped on drop); `base` is its first address.
    _map: crate::shm::Mapping,
    pub layout: Layout,
    name: CString,
    unlinked: bool,
}

// SAFETY: the mapping is shared memory accessed through atomics and phase-ordered buffers;
// the raw pointer is valid for the life of the Segment.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn os(what: &str) -> Error {
    Error::system(what.to_string(), std::io::Error::last_os_error())
}

impl Segment {
    /// Rank 0: creates and initialises the segment.
    pub fn create(name: &str, layout: Layout) -> Result<Segment> {
        let cname =
            CString::new(name).map_err(|_| Error::invalid_argument("segment name has a NUL"))?;
        // SAFETY: valid C string; O_EXCL so a stale or foreign segment is never reused.
        let fd = unsafe {
            libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            )
        };
        if fd < 0 {
            return Err(os(&format!(
                "shm_open({name}) to create the communicator segment"
            )));
        }
        let total = layout.total();
        // SAFETY: fd is ours.
        let r = unsafe { libc::ftruncate(fd, total as libc::off_t) };
        let seg = if r != 0 {
            Err(os("ftruncate of the communicator segment"))
        } else {
            Self::map(fd, total, cname.clone(), layout)
        };
        // SAFETY: fd is ours; the mapping keeps the memory.
        unsafe { libc::close(fd) };
        let seg = match seg {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: valid C string; the segment was created by this call.
                unsafe { libc::shm_unlink(cname.as_ptr()) };
                return Err(e);
            }
        };
        let h = seg.header();
        h.nranks.store(layout.nranks as u32, Ordering::Relaxed);
        h.slot_bytes
            .store(layout.slot_bytes as u64, Ordering::Relaxed);
        h.ring_bytes
            .store(layout.ring_bytes as u64, Ordering::Relaxed);
        h.magic.store(READY, Ordering::Release);
        Ok(seg)
    }

    /// Other ranks: opens the segment rank 0 creates, retrying until `deadline`.
    pub fn open(name: &str, layout: Layout, deadline: Instant) -> Result<Segment> {
        let cname =
            CString::new(name).map_err(|_| Error::invalid_argument("segment name has a NUL"))?;
        let total = layout.total();
        loop {
            // SAFETY: valid C string.
            let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
            if fd >= 0 {
                // SAFETY: `stat` is plain data; all zeroes is a valid value.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: fd is open; st is writable.
                let ok = unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_size as usize >= total;
                if ok {
                    let seg = Self::map(fd, total, cname.clone(), layout);
                    // SAFETY: fd is ours.
                    unsafe { libc::close(fd) };
                    let seg = seg?;
                    let mut n = 0u32;
                    while seg.header().magic.load(Ordering::Acquire) != READY {
                        if Instant::now() > deadline {
                            return Err(Error::new(
                                ferrocx_plugin_sdk::abi::Status::TIMEOUT,
                                format!(
                                    "communicator segment {name} was never initialised by rank 0"
                                ),
                            ));
                        }
                        n += 1;
                        std::thread::sleep(Duration::from_micros(50 * n.min(20) as u64));
                    }
                    let h = seg.header();
                    if h.nranks.load(Ordering::Relaxed) as usize != layout.nranks
                        || h.slot_bytes.load(Ordering::Relaxed) as usize != layout.slot_bytes
                        || h.ring_bytes.load(Ordering::Relaxed) as usize != layout.ring_bytes
                    {
                        return Err(Error::invalid_argument(format!(
                            "rank 0 created the communicator for {} ranks, this rank was told {}",
                            h.nranks.load(Ordering::Relaxed),
                            layout.nranks
                        )));
                    }
                    return Ok(seg);
                }
                // SAFETY: fd is ours.
                unsafe { libc::close(fd) };
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ferrocx_plugin_sdk::abi::Status::TIMEOUT,
                    format!("rank 0 did not create the communicator segment {name} in time"),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn map(fd: i32, len: usize, name: CString, layout: Layout) -> Result<Segment> {
        // SAFETY: `fd` is open for the duration of this call (the callers close it after).
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let map = crate::shm::Mapping::shared(fd, len)?;
        Ok(Segment {
            base: map.addr() as usize as *mut u8,
            _map: map,
            layout,
            name,
            unlinked: false,
        })
    }

    /// Removes the name; the memory lives while mapped. Idempotent.
    pub fn unlink(&mut self) {
        if !self.unlinked {
            // SAFETY: valid C string; ENOENT (another rank unlinked it) is fine.
            unsafe { libc::shm_unlink(self.name.as_ptr()) };
            self.unlinked = true;
        }
    }

    /// The header.
    pub fn header(&self) -> &Header {
        // SAFETY: the segment starts with a Header, page aligned.
        unsafe { &*(self.base as *const Header) }
    }

    /// Rank `r`'s state.
    pub fn rank(&self, r: usize) -> &RankState {
        assert!(r < self.layout.nranks);
        // SAFETY: within the RankState array.
        unsafe {
            &*(self
                .base
                .add(self.layout.ranks_off() + r * std::mem::size_of::<RankState>())
                as *const RankState)
        }
    }

    /// Slot of rank `r` in parity `p`.
    pub fn slot(&self, p: usize, r: usize) -> *mut u8 {
        assert!(p < 2 && r < self.layout.nranks);
        // SAFETY: within the slots region.
        unsafe {
            self.base.add(
                self.layout.slots_off() + (p * self.layout.nranks + r) * self.layout.slot_bytes,
            )
        }
    }

    /// The result buffer of parity `p`.
    pub fn result(&self, p: usize) -> *mut u8 {
        assert!(p < 2);
        // SAFETY: within the result region.
        unsafe {
            self.base
                .add(self.layout.result_off() + p * self.layout.slot_bytes)
        }
    }

    /// The ring from `src` to `dst`: its header and its data.
    pub fn ring(&self, src: usize, dst: usize) -> (&RingHeader, *mut u8) {
        let n = self.layout.nranks;
        assert!(src < n && dst < n);
        let off = self.layout.rings_off() + (src * n + dst) * self.layout.ring_stride();
        // SAFETY: within the rings region; each ring starts with an aligned RingHeader.
        unsafe {
            let h = &*(self.base.add(off) as *const RingHeader);
            (h, self.base.add(off + std::mem::size_of::<RingHeader>()))
        }
    }
}
