//! Windows: memory of every rank that every rank can address, behind one handle whatever backs
//! it.
//!
//! [`Communicator::register_window`](crate::comm::Communicator::register_window) is collective:
//! every rank registers a buffer of the same size, and gets a [`Window`] of one of three kinds:
//!
//! - [`WindowKind::Vendor`]: the CCL's own window group registered it (NCCL's
//!   `ncclCommWindowRegister`); the handle is for the CCL's window collectives.
//! - [`WindowKind::Symmetric`]: the symmetric heap mapped every rank's memory into one flat
//!   range of this process: peer `i`'s window at `flat_base + i * stride`, and where the device
//!   and policy allow it, a multicast address whose store reaches every rank.
//! - [`WindowKind::Ipc`]: one pointer per peer (IPC handles, or each peer's heap memory mapped
//!   on its own).
//!
//! # Which buffers can be symmetric
//!
//! The heap can only map memory it can export. A buffer from
//! [`Communicator::alloc_symmetric`](crate::comm::Communicator::alloc_symmetric) is such memory
//! (a VMM allocation, exported as a file descriptor): a window over it — the whole buffer or a
//! range inside it, at the same offset and with allocations of the same size on every rank —
//! is symmetric. Any other buffer (`mem_alloc`, a framework's allocator) is reached through the
//! device's IPC handles, exchanged through the job's store: the window is [`WindowKind::Ipc`].
//! When one rank's buffer cannot be symmetric, no rank's window is.
//!
//! # Selection
//!
//! A cluster's `window` key decides ([`WindowPlan`], shown by `ferrocx info`): `auto` (the
//! default) takes the CCL's window group where it has one, else the heap; `vendor`, `symheap`
//! and `ipc` force one. Multicast is mapped only where the device reports support, the
//! cluster's `multicast` is `auto` or `on`, no kill-switch (`FERROCX_MULTICAST=0`,
//! `NCCL_NVLS_ENABLE=0`) is set on any rank, and every rank agrees.
//!
//! # The sym-heap protocol
//!
//! Per registration, every step agreed through the store (one rank's "no" is everyone's):
//! export this rank's allocation as a descriptor and listen on an abstract UNIX socket named
//! after the job, the communicator and the window → agree that every rank did, with the same
//! size (a mismatch is an error on every rank naming each rank's size) → pass the descriptors
//! over the sockets (`SCM_RIGHTS`, peers checked with `SO_PEERCRED`) and import them → reserve
//! one range and map every rank's memory into it → multicast, when decided. A failure before
//! the range is mapped makes every rank fall back to IPC handles; a failure of the range makes
//! every rank map each peer on its own (an IPC window of the same memory); a failure of
//! multicast leaves the window symmetric without it. Everything a failed step took is released.
//! Deregistration waits until every rank has finished with the window (this rank's stream is
//! synchronized first), then unmaps.
//!
//! ```no_run
//! use ferrocx::comm::Communicator;
//! use ferrocx::window::{WindowFlags, WindowKind};
//!
//! let comm = Communicator::from_env()?;
//! let buf = comm.alloc_symmetric(1 << 20)?;
//! // SAFETY: `buf` is live until after the deregistration below.
//! let win = unsafe { comm.register_window(buf.ptr(), buf.size(), WindowFlags::NONE)? };
//! if win.kind() == WindowKind::Symmetric {
//!     let right = (comm.rank() + 1) % comm.world();
//!     println!("right neighbour's window at {:?}", win.peer(right));
//! }
//! comm.deregister_window(win)?;
//! # Ok::<(), ferrocx::comm::CommError>(())
//! ```

mod agree;
pub mod collectives;
pub mod fdpass;
mod heap;
mod policy;
mod register;
pub(crate) mod resources;

use std::fmt;
use std::time::Duration;

use crate::abi::{DevicePtr, WindowHandle};
use crate::adaptor::AdaptorError;
use crate::bootstrap::BootstrapError;

pub use heap::SymmetricBuffer;
pub use policy::{plan, plan_with_support, Backing, MulticastPlan, WindowPlan};

pub(crate) use agree::Agreement;
pub(crate) use heap::SymHeap;
pub(crate) use register::{deregister, register, Context};

/// The digest of a communicator's unique id that names its windows' sockets and store keys.
pub(crate) fn tag_of(unique_id: &[u8]) -> u64 {
    fdpass::fnv1a(unique_id)
}

/// What backs a [`Window`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WindowKind {
    /// The CCL's own window group.
    Vendor = 1,
    /// One flat range: peer `i` at `flat_base + i * stride`, optional multicast.
    Symmetric = 2,
    /// One pointer per peer.
    Ipc = 3,
}

impl fmt::Display for WindowKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WindowKind::Vendor => "vendor",
            WindowKind::Symmetric => "symmetric",
            WindowKind::Ipc => "ipc",
        })
    }
}

/// Flags of `register_window`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WindowFlags(pub u32);

impl WindowFlags {
    /// Nothing special.
    pub const NONE: WindowFlags = WindowFlags(0);
    /// For the CCL's window group: every rank registers the same size at the same offset of
    /// its allocation (NCCL's `NCCL_WIN_COLL_SYMMETRIC`). Passed through unchanged.
    pub const COLL_SYMMETRIC: WindowFlags = WindowFlags(1);
    /// No multicast mapping for this window even where policy allows it. Not passed to the
    /// CCL.
    pub const NO_MULTICAST: WindowFlags = WindowFlags(1 << 31);
    /// A window ferrocx addresses peer by peer (a point-to-point all-gather pushes into it,
    /// [`crate::comm::Call::output_window`]): never the CCL's window group, whose windows have
    /// no peer addresses, but the symmetric heap, else IPC handles. Not passed to the CCL.
    pub const PEERS: WindowFlags = WindowFlags(1 << 30);
    /// The bits ferrocx interprets itself; the others go to the CCL.
    const CORE: u32 = Self::NO_MULTICAST.0 | Self::PEERS.0;

    /// `true` when every bit of `other` is set.
    pub fn contains(self, other: WindowFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The bits passed to the CCL's window group.
    pub(crate) fn vendor_bits(self) -> u32 {
        self.0 & !Self::CORE
    }
}

impl std::ops::BitOr for WindowFlags {
    type Output = WindowFlags;
    fn bitor(self, rhs: WindowFlags) -> WindowFlags {
        WindowFlags(self.0 | rhs.0)
    }
}

/// [`WindowView::flags`] bit: `multicast_base` is mapped.
pub const VIEW_MULTICAST: u32 = 1;

/// The device-side view of a [`Window`], passed by value to kernels. Addresses are the
/// device's; unused fields are 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowView {
    /// [`WindowKind`] as its `u32` value.
    pub kind: u32,
    /// [`VIEW_MULTICAST`] when `multicast_base` is mapped.
    pub flags: u32,
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// Bytes of each rank's window.
    pub size: u64,
    /// Symmetric: bytes from one peer's window to the next in the flat range.
    pub stride: u64,
    /// Symmetric: rank 0's window in the flat range (rank `i` at `flat_base + i * stride`).
    pub flat_base: DevicePtr,
    /// Symmetric with multicast: this window's multicast address (a store reaches every rank).
    pub multicast_base: DevicePtr,
    /// Ipc: device memory holding `world` little-endian `u64` addresses, rank `i`'s window at
    /// entry `i`.
    pub peers: DevicePtr,
    /// Vendor: the CCL's window handle.
    pub vendor: u64,
}

/// The sym-heap's steps, as failure injection names them.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SymHeapStep {
    /// Exporting the allocation and listening on the socket.
    Export,
    /// Receiving the peers' descriptors.
    Exchange,
    /// Importing them.
    Import,
    /// Reserving the flat range (or a peer's range).
    Reserve,
    /// Mapping peers into it.
    Map,
    /// Attaching multicast.
    Multicast,
    /// Exporting the IPC handle.
    IpcExport,
    /// Opening the peers' IPC handles.
    IpcOpen,
}

impl SymHeapStep {
    /// Every step, in protocol order.
    pub const ALL: [SymHeapStep; 8] = [
        SymHeapStep::Export,
        SymHeapStep::Exchange,
        SymHeapStep::Import,
        SymHeapStep::Reserve,
        SymHeapStep::Map,
        SymHeapStep::Multicast,
        SymHeapStep::IpcExport,
        SymHeapStep::IpcOpen,
    ];
}

impl fmt::Display for SymHeapStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SymHeapStep::Export => "export",
            SymHeapStep::Exchange => "exchange",
            SymHeapStep::Import => "import",
            SymHeapStep::Reserve => "reserve",
            SymHeapStep::Map => "map",
            SymHeapStep::Multicast => "multicast",
            SymHeapStep::IpcExport => "ipc-export",
            SymHeapStep::IpcOpen => "ipc-open",
        })
    }
}

/// Why a window could not be registered or deregistered. Every variant but `Adaptor` and
/// `Bootstrap` is returned alike on every rank.
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    /// The ranks asked for windows of different sizes.
    #[error("the ranks registered windows of different sizes: {}", list_sizes(.sizes))]
    SizeMismatch {
        /// `(rank, bytes)` of every rank.
        sizes: Vec<(usize, usize)>,
    },
    /// A rank's arguments cannot make a window.
    #[error("{0}")]
    InvalidArgument(String),
    /// Nothing can back windows here (the configuration's reason).
    #[error("windows are not available: {0}")]
    Unsupported(String),
    /// The ranks are not all on one node (and the CCL has no window group to span nodes).
    #[error("windows of the symmetric heap and IPC need every rank on one node: {0}")]
    Nodes(String),
    /// The IPC handles could not be exchanged or opened, by the first rank named.
    #[error("IPC window ({why}): rank {rank}: {reason}")]
    Ipc {
        /// Why the window was an IPC one (a forced mode, a buffer outside the heap, the
        /// sym-heap failure it fell back from).
        why: String,
        /// The first rank that failed.
        rank: usize,
        /// Its reason.
        reason: String,
    },
    /// A rank did not arrive at a step within the communicator's timeout.
    #[error("step `{step}`: rank {rank} did not arrive within {waited:?}")]
    PeerTimeout {
        /// The step.
        step: &'static str,
        /// The rank waited for.
        rank: usize,
        /// The deadline that passed.
        waited: Duration,
    },
    /// A rank's record of a step could not be read.
    #[error("window step `{step}`: rank {rank} sent a malformed record")]
    Protocol {
        /// The step.
        step: &'static str,
        /// The rank.
        rank: usize,
    },
    /// The ranks deregistered different windows.
    #[error("deregister_window: {0}")]
    Mismatch(String),
    /// An adaptor call that is not part of the agreed protocol failed on this rank.
    #[error(transparent)]
    Adaptor(#[from] AdaptorError),
    /// The store failed.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
}

fn list_sizes(sizes: &[(usize, usize)]) -> String {
    sizes
        .iter()
        .map(|(r, s)| format!("rank {r}: {s} bytes"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A registered window. Deregister it with
/// [`Communicator::deregister_window`](crate::comm::Communicator::deregister_window), on every
/// rank; dropping it instead releases this rank's mappings without waiting for the peers (with
/// a warning), and leaves a vendor window registered.
pub struct Window {
    pub(crate) tag: u64,
    pub(crate) seq: u64,
    pub(crate) kind: WindowKind,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) size: usize,
    pub(crate) local: DevicePtr,
    pub(crate) peers: Vec<DevicePtr>,
    pub(crate) flat: Option<(DevicePtr, usize)>,
    pub(crate) multicast: Option<DevicePtr>,
    pub(crate) vendor: Option<WindowHandle>,
    pub(crate) peer_table: DevicePtr,
    pub(crate) reason: String,
    pub(crate) held: Option<register::Held>,
}

impl Window {
    /// What backs it.
    pub fn kind(&self) -> WindowKind {
        self.kind
    }

    /// Bytes of each rank's window.
    pub fn size(&self) -> usize {
        self.size
    }

    /// This rank's buffer, as registered.
    pub fn local(&self) -> DevicePtr {
        self.local
    }

    /// Rank `rank`'s window as this process addresses it (in the flat range when symmetric);
    /// `None` for a vendor window or a rank out of range.
    pub fn peer(&self, rank: usize) -> Option<DevicePtr> {
        self.peers.get(rank).copied()
    }

    /// Symmetric: rank 0's window in the flat range.
    pub fn flat_base(&self) -> Option<DevicePtr> {
        self.flat.map(|(b, _)| b)
    }

    /// Symmetric: bytes between consecutive ranks' windows in the flat range (the allocation
    /// size).
    pub fn stride(&self) -> Option<usize> {
        self.flat.map(|(_, s)| s)
    }

    /// Symmetric with multicast: this window's multicast address.
    pub fn multicast_base(&self) -> Option<DevicePtr> {
        self.multicast
    }

    /// `true` when a multicast address is mapped.
    pub fn has_multicast(&self) -> bool {
        self.multicast.is_some()
    }

    /// Vendor: the CCL's handle.
    pub fn vendor_handle(&self) -> Option<WindowHandle> {
        self.vendor
    }

    /// Why this kind was chosen (a fallback names the step and rank that failed).
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Releases this rank's mappings now, without waiting for the peers and without the
    /// warning a dropped window logs: for a window that lives as long as its communicator
    /// (the scratch window of the window collectives), released at its teardown once the
    /// stream is synchronized. Peers keep their own mappings of this rank's memory, which
    /// stays valid until they release them.
    pub fn release_local(mut self) {
        if let Some(held) = self.held.take() {
            held.release_locally();
        }
    }

    /// The device-side view, for kernels.
    pub fn view(&self) -> WindowView {
        let (flat_base, stride) = self.flat.unwrap_or((DevicePtr::NULL, 0));
        WindowView {
            kind: self.kind as u32,
            flags: if self.multicast.is_some() {
                VIEW_MULTICAST
            } else {
                0
            },
            rank: self.rank as u32,
            world: self.world as u32,
            size: self.size as u64,
            stride: stride as u64,
            flat_base,
            multicast_base: self.multicast.unwrap_or(DevicePtr::NULL),
            peers: self.peer_table,
            vendor: self.vendor.map_or(0, |h| h.0 as u64),
        }
    }
}

impl fmt::Debug for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Window")
            .field("kind", &self.kind)
            .field("size", &self.size)
            .field("local", &self.local)
            .field("flat", &self.flat)
            .field("multicast", &self.multicast)
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            tracing::warn!(
                window = self.seq,
                kind = %self.kind,
                "a window was dropped without deregister_window: this rank's mappings are \
                 released without waiting for its peers"
            );
            held.release_locally();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_has_a_fixed_layout() {
        assert_eq!(std::mem::size_of::<WindowView>(), 64);
        assert_eq!(std::mem::offset_of!(WindowView, size), 16);
        assert_eq!(std::mem::offset_of!(WindowView, flat_base), 32);
        assert_eq!(std::mem::offset_of!(WindowView, peers), 48);
        assert_eq!(std::mem::offset_of!(WindowView, vendor), 56);
    }

    #[test]
    fn core_flags_stay_out_of_the_ccl() {
        let f = WindowFlags::COLL_SYMMETRIC | WindowFlags::NO_MULTICAST;
        assert!(f.contains(WindowFlags::NO_MULTICAST));
        assert_eq!(f.vendor_bits(), 1);
        let e = WindowError::SizeMismatch {
            sizes: vec![(0, 4096), (1, 8192)],
        };
        assert_eq!(
            e.to_string(),
            "the ranks registered windows of different sizes: rank 0: 4096 bytes, rank 1: 8192 bytes"
        );
    }
}
