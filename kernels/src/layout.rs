//! The scratch window's layout, computed here and only here: the host algorithms use it
//! directly and the CUDA kernels receive its offsets as launch arguments.
//!
//! Each rank's scratch window is
//!
//! ```text
//! [ parity 0: world chunk slots ][ parity 1: world chunk slots ][ signal slots ][ LL region ][ LL128 region ]
//!   slot j at j * chunk            world * chunk + j * chunk        signals_offset() ll_offset()  ll128_offset()
//! ```
//!
//! (The LL128 region exists on CUDA devices only: [`Layout::with_ll128`].)
//!
//! A round of the window algorithms has an epoch (1, 2, 3, … from one counter per window
//! that every rank keeps alike: on the host in the engine, on CUDA in device memory, advanced
//! by the launches themselves) and uses the parity `epoch % 2` only: a rank may publish
//! round `e + 1` while a slow peer still reads round `e`, and by round `e + 2` every peer has
//! provably finished round `e` (each round waits, directly or along the ring, for every peer
//! to have started it, and a peer starts a round only after finishing the one before). So no
//! round needs a barrier at its end. One-shot and two-shot use a parity as one flat buffer of
//! `world * chunk` bytes; the ring uses its `world` slots.
//!
//! The signal slots: for each [`Signal`] kind and each of [`MAX_BLOCKS`] pads (one per CUDA
//! thread block; the host uses pad 0), one slot per source rank, [`SIGNAL_STRIDE`] bytes
//! apart. Slot `(kind, block, src)` of rank `dst` is written only by `src` (a push: the waiter
//! polls its own memory) with a store-release of the round's value, and read by `dst` with
//! load-acquire. Values only grow — an epoch, or `epoch * world + step` for the ring — so a
//! slot is never reset and a waiter for "at least v" cannot be fooled by a later round.
//!
//! A slot's value is its first 8 bytes; the rest of its cache line is free for the backend.
//! The host backend keeps a 32-bit count of sleeping waiters at byte 8 (written by `dst`
//! only), and its waiters sleep on a futex on the value's low 32 bits, so that a signal wakes
//! them with no other word to update (see `host::algo`).

/// Bytes from one signal slot to the next: a cache line, so writers of different slots never
/// share one.
pub const SIGNAL_STRIDE: usize = 64;
/// Signal pads per kind: one per CUDA thread block of a launch (the host uses pad 0). A launch
/// never has more blocks.
pub const MAX_BLOCKS: usize = 128;
/// Chunk slots start at multiples of this many bytes (vector loads, cache lines).
pub const CHUNK_ALIGN: usize = 256;
/// Shares and ring pieces start at multiples of this many bytes from their buffer's start, so
/// that aligned buffers can be moved in 16-byte vectors.
pub const GRANULE_BYTES: usize = 16;
/// The scratch size is a multiple of this.
pub const PAGE: usize = 4096;
/// The largest message (bytes) the CUDA one-shot sends as LL lines: 16-byte lines of 8 data
/// bytes and the round's flag twice, stored whole, so that a reader needs no separate signal
/// (and the writer no fence). The lines live in their own region (see [`Layout::ll_offset`]),
/// which holds nothing else, so a flag word can never be stale data of another algorithm.
pub const LL_MAX_BYTES: usize = 256 << 10;
/// Bytes of one LL slot: [`LL_MAX_BYTES`] of data as lines.
pub const LL_SLOT: usize = 2 * LL_MAX_BYTES;

/// Bytes of one LL128 line: 120 data bytes and the round (the whole epoch) in the last 8,
/// written by 8 consecutive threads of a warp with one 16-byte store each. Over NVLink such a
/// store arrives whole, so a reader that sees the line's round sees its 120 bytes (CUDA only;
/// the line format is in `cuda/all_reduce.cu`).
pub const LL128_LINE: usize = 128;
/// Data bytes of one LL128 line.
pub const LL128_DATA: usize = 120;
/// The largest message (bytes) an LL128 slot holds on CUDA devices.
pub const LL128_MAX_BYTES: usize = 2 << 20;

/// What a signal slot says.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    /// One-shot and two-shot: the source's input of round `e` is in its parity buffer
    /// (value: `e`).
    Arrive = 0,
    /// Two-shot: the source's reduced share of round `e` is in its parity buffer (value: `e`).
    Reduced = 1,
    /// Ring: the source published step `s` of round `e` (value: [`ring_value`]`(e, s)`).
    Ring = 2,
}

/// Number of [`Signal`] kinds.
pub const SIGNAL_KINDS: usize = 3;

/// The value a ring step publishes: `epoch * world + step`, which grows with the round and the
/// step (`step < world`).
pub fn ring_value(epoch: u64, world: usize, step: usize) -> u64 {
    epoch * world as u64 + step as u64
}

/// The layout of a scratch window of `world` ranks with chunk slots of `chunk` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    world: usize,
    chunk: usize,
    /// Bytes of one LL128 slot (0: no LL128 region).
    ll128_slot: usize,
}

impl Layout {
    /// `world` ranks (at least 1), chunk slots of `chunk` bytes rounded up to [`CHUNK_ALIGN`].
    pub fn new(world: usize, chunk: usize) -> Layout {
        Layout {
            world: world.max(1),
            chunk: chunk.max(1).div_ceil(CHUNK_ALIGN) * CHUNK_ALIGN,
            ll128_slot: 0,
        }
    }

    /// This layout with an LL128 region whose slots hold messages of up to `max_bytes`.
    pub fn with_ll128(self, max_bytes: usize) -> Layout {
        let lines = max_bytes.div_ceil(LL128_DATA);
        Layout {
            ll128_slot: (lines * LL128_LINE).div_ceil(CHUNK_ALIGN) * CHUNK_ALIGN,
            ..self
        }
    }

    /// Ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Bytes of one chunk slot.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Bytes of one parity: `world` chunk slots. The most a one-shot or two-shot call can
    /// carry, and what one ring round carries.
    pub fn parity_bytes(&self) -> usize {
        self.world * self.chunk
    }

    /// Offset of the parity used by round `epoch`.
    pub fn parity_offset(&self, epoch: u64) -> usize {
        (epoch % 2) as usize * self.parity_bytes()
    }

    /// Offset of chunk slot `slot` of round `epoch`'s parity.
    pub fn slot_offset(&self, epoch: u64, slot: usize) -> usize {
        self.parity_offset(epoch) + slot * self.chunk
    }

    /// Rounds a ring all-reduce of `bytes` takes: one per parity's worth, at least one. Every
    /// round is one epoch.
    pub fn ring_rounds(&self, bytes: usize) -> u64 {
        bytes.div_ceil(self.parity_bytes()).max(1) as u64
    }

    /// Offset of the signal slots (after both parities).
    pub fn signals_offset(&self) -> usize {
        2 * self.parity_bytes()
    }

    /// Offset of the slot where `src` signals `kind` to the owner of the window, for thread
    /// block `block`.
    pub fn signal_offset(&self, kind: Signal, block: usize, src: usize) -> usize {
        debug_assert!(block < MAX_BLOCKS && src < self.world);
        self.signals_offset()
            + ((kind as usize * MAX_BLOCKS + block) * self.world + src) * SIGNAL_STRIDE
    }

    /// Offset of the LL region (after the signal slots): two parities of `world` slots of
    /// [`LL_SLOT`] bytes, slot `src` holding what rank `src` pushed (CUDA one-shot only).
    pub fn ll_offset(&self) -> usize {
        let signals = SIGNAL_KINDS * MAX_BLOCKS * self.world * SIGNAL_STRIDE;
        (self.signals_offset() + signals).div_ceil(CHUNK_ALIGN) * CHUNK_ALIGN
    }

    /// Offset of the LL128 region (after the LL region): two parities of `world` slots of
    /// [`Layout::ll128_slot`] bytes, slot `src` holding the lines rank `src` pushed (CUDA
    /// one-shot only). Like the LL region it holds nothing else, so the word where a line
    /// carries its round is never another algorithm's data.
    pub fn ll128_offset(&self) -> usize {
        self.ll_offset() + 2 * self.world * LL_SLOT
    }

    /// Bytes of one LL128 slot (0 without the region).
    pub fn ll128_slot(&self) -> usize {
        self.ll128_slot
    }

    /// The largest message an LL128 slot holds (0 without the region).
    pub fn ll128_max_bytes(&self) -> usize {
        self.ll128_slot / LL128_LINE * LL128_DATA
    }

    /// Bytes of each rank's scratch window: both parities, the signal slots, the LL region and
    /// the LL128 region, rounded up to [`PAGE`].
    pub fn scratch_bytes(&self) -> usize {
        (self.ll128_offset() + 2 * self.world * self.ll128_slot).div_ceil(PAGE) * PAGE
    }
}

/// Elements `[lo, hi)` of part `i` when `n` elements are split into `parts` parts of whole
/// granules of `granule` elements (the last granule may be short): every part starts at a
/// multiple of `granule`, and the parts cover `0..n` once, in order.
pub fn part(n: usize, parts: usize, i: usize, granule: usize) -> (usize, usize) {
    let granule = granule.max(1);
    let parts = parts.max(1);
    let granules = n.div_ceil(granule);
    let base = granules / parts;
    let extra = granules % parts;
    let g_lo = i * base + i.min(extra);
    let g_hi = g_lo + base + usize::from(i < extra);
    ((g_lo * granule).min(n), (g_hi * granule).min(n))
}

/// Elements of `es` bytes in one granule.
pub fn granule_elems(es: usize) -> usize {
    (GRANULE_BYTES / es.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_regions_follow_each_other_without_overlap() {
        for world in 1..=9 {
            for chunk in [1, 255, 256, 4096, 1 << 20] {
                let l = Layout::new(world, chunk);
                assert_eq!(l.chunk() % CHUNK_ALIGN, 0);
                assert!(l.chunk() >= chunk);
                assert_eq!(l.parity_offset(1), l.parity_bytes());
                assert_eq!(l.parity_offset(2), 0);
                assert_eq!(l.slot_offset(3, world - 1) + l.chunk(), l.signals_offset());
                let last = l.signal_offset(Signal::Ring, MAX_BLOCKS - 1, world - 1);
                assert!(last + SIGNAL_STRIDE <= l.ll_offset());
                assert!(l.ll_offset() + 2 * world * LL_SLOT <= l.scratch_bytes());
                assert_eq!(l.scratch_bytes() % PAGE, 0);
                assert_eq!(l.ll128_slot(), 0);
                let m = l.with_ll128(LL128_MAX_BYTES);
                assert_eq!(m.ll_offset(), l.ll_offset());
                assert_eq!(m.ll128_offset(), l.ll_offset() + 2 * world * LL_SLOT);
                assert_eq!(m.ll128_offset() % LL128_LINE, 0);
                assert_eq!(m.ll128_slot() % LL128_LINE, 0);
                assert!(m.ll128_max_bytes() >= LL128_MAX_BYTES);
                assert!(m.ll128_offset() + 2 * world * m.ll128_slot() <= m.scratch_bytes());
                assert_eq!(m.scratch_bytes() % PAGE, 0);
                let mut seen = std::collections::BTreeSet::new();
                for kind in [Signal::Arrive, Signal::Reduced, Signal::Ring] {
                    for block in 0..MAX_BLOCKS {
                        for src in 0..world {
                            let at = l.signal_offset(kind, block, src);
                            assert_eq!(at % SIGNAL_STRIDE, 0);
                            assert!(at >= l.signals_offset());
                            assert!(seen.insert(at), "slot {kind:?}/{block}/{src} reused");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn parts_cover_everything_once_and_start_on_granules() {
        for n in [0, 1, 3, 7, 8, 9, 100, 1001, 4096 + 5] {
            for parts in 1..=9 {
                for granule in [1, 2, 4, 8] {
                    let mut next = 0;
                    for i in 0..parts {
                        let (lo, hi) = part(n, parts, i, granule);
                        assert_eq!(lo, next, "n {n} parts {parts} granule {granule} part {i}");
                        assert!(hi >= lo);
                        assert!(lo % granule == 0 || lo == n);
                        next = hi;
                    }
                    assert_eq!(next, n);
                }
            }
        }
    }

    #[test]
    fn ring_values_grow_with_round_and_step() {
        let mut last = 0;
        for epoch in 1..5 {
            for step in 0..4 {
                let v = ring_value(epoch, 4, step);
                assert!(v > last);
                last = v;
            }
        }
    }
}
