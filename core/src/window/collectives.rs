//! Window collectives: all-reduce run by ferrocx's own algorithms over a scratch window (the
//! crate `ferrocx-kernels`: one-shot, two-shot and ring), for a CCL that has no all-reduce
//! (the sym-heap fallback) and for small messages where they beat the CCL.
//!
//! The core only routes ([`crate::route`]) and hands window calls to a [`WindowCollectives`]
//! backend made by a registered [`WindowCollectivesProvider`]. A provider sees a narrow
//! [`WindowContext`] (the device, the stream, the rank and world, the store, the timeout and a
//! way to register its scratch window), never the communicator. `ferrocx-kernels` registers
//! one (call `ferrocx_kernels::link()` once so that the linker keeps it); without one, every
//! all-reduce goes to the CCL.

use std::fmt;
use std::time::Duration;

use crate::abi::{DataType, DevicePtr, ReduceOp, Stream};
use crate::adaptor::Device;
use crate::bootstrap::Store;
use crate::config::{Fallback, SmallMessage};
use crate::window::{SymmetricBuffer, Window, WindowKind};

/// A window all-reduce algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WindowAlgo {
    /// Every rank publishes its input, then reads every peer's and reduces: one synchronisation,
    /// `world` reads per element. For the smallest messages.
    OneShot,
    /// Reduce-scatter then all-gather through the window: two synchronisations, each rank
    /// reduces `1/world` of the message. For medium messages.
    TwoShot,
    /// Ring reduce-scatter over the scratch window's chunk slots, then every rank reads the
    /// reduced pieces: for large messages, in rounds of `world` chunks.
    Ring,
}

impl WindowAlgo {
    /// Every algorithm, in size order.
    pub const ALL: [WindowAlgo; 3] = [WindowAlgo::OneShot, WindowAlgo::TwoShot, WindowAlgo::Ring];

    /// The name used in logs, errors and `ferrocx bench` (`one-shot`, `two-shot`, `ring`).
    pub fn name(self) -> &'static str {
        match self {
            WindowAlgo::OneShot => "one-shot",
            WindowAlgo::TwoShot => "two-shot",
            WindowAlgo::Ring => "ring",
        }
    }
}

impl fmt::Display for WindowAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WindowAlgo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        WindowAlgo::ALL
            .into_iter()
            .find(|a| a.name() == s || a.name().replace('-', "_") == s)
            .ok_or_else(|| {
                format!("unknown window algorithm {s:?}: expected one-shot, two-shot or ring")
            })
    }
}

/// Size thresholds of the window all-reduce, in bytes of one rank's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// One-shot up to and including this size.
    pub one_shot_max: usize,
    /// Two-shot up to and including this size; above it the CCL (or the ring, when the CCL
    /// has no all-reduce). The crossover of `small_message`.
    pub two_shot_max: usize,
}

/// What a provider measured for a device and a world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measured {
    /// The thresholds.
    pub thresholds: Thresholds,
    /// `true` when the window algorithms below `two_shot_max` were measured faster than the
    /// device's usual CCL: what `small_message = "auto"` follows.
    pub window_faster: bool,
    /// Bytes of an all-gather's whole output below which the window all-gather
    /// ([`WindowCollectives::all_gather`]) was measured faster than the device's usual CCL;
    /// 0 where it was not (the router's short point-to-point all-gathers then stay on the CCL).
    pub all_gather_below: usize,
}

/// The cluster's choices about window collectives, from its configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowCollectivesConfig {
    /// `small_message`.
    pub small_message: SmallMessage,
    /// `window_one_shot_max`, when set.
    pub one_shot_max: Option<u64>,
    /// `window_two_shot_max`, when set.
    pub two_shot_max: Option<u64>,
    /// `fallback`: `none` keeps an all-reduce the CCL lacks off the window algorithms too.
    pub fallback: Fallback,
}

impl WindowCollectivesConfig {
    /// The thresholds: the configured ones over the measured ones.
    pub fn thresholds(&self, measured: Thresholds) -> Thresholds {
        let clamp = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let two = self.two_shot_max.map_or(measured.two_shot_max, clamp);
        let one = self
            .one_shot_max
            .map_or(measured.one_shot_max.min(two), clamp);
        Thresholds {
            one_shot_max: one,
            two_shot_max: two,
        }
    }
}

/// One all-reduce handed to a backend: `count` elements of `dtype` at `send` reduced with `op`
/// into `recv` on every rank, enqueued on `stream`.
#[derive(Clone, Copy, Debug)]
pub struct AllReduceCall {
    /// Input of this rank.
    pub send: DevicePtr,
    /// Output (may be `send`).
    pub recv: DevicePtr,
    /// Elements.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction.
    pub op: ReduceOp,
    /// The stream the call is ordered on.
    pub stream: Stream,
}

/// One all-gather handed to a backend: `count` elements of `dtype` at `send` on every rank,
/// every rank's in rank order at `recv` (`world * count` elements; this rank's place in it may
/// be `send`), enqueued on `stream`.
#[derive(Clone, Copy, Debug)]
pub struct AllGatherCall {
    /// Input of this rank.
    pub send: DevicePtr,
    /// Output of `world * count` elements.
    pub recv: DevicePtr,
    /// Elements of each rank.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// The stream the call is ordered on.
    pub stream: Stream,
}

/// Why a window collective failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    /// A peer did not signal within the communicator's timeout.
    #[error("window collective ({algo}): rank {peer} did not signal {what} of round {epoch} within {waited:?}")]
    PeerTimeout {
        /// The algorithm.
        algo: WindowAlgo,
        /// The rank waited for.
        peer: usize,
        /// What was awaited (`its input`, `its reduced share`, `ring step 2`).
        what: String,
        /// The window's round (epoch) of the call.
        epoch: u64,
        /// The timeout that passed.
        waited: Duration,
    },
    /// The data type or reduction is not one the window algorithms run.
    #[error("window collective: {0}")]
    Unsupported(String),
    /// Nothing can run window collectives here.
    #[error("window collectives are not available: {0}")]
    Unavailable(String),
    /// A launch or an adaptor call failed.
    #[error("window collective ({algo}): {message}")]
    Failed {
        /// The algorithm.
        algo: WindowAlgo,
        /// What failed.
        message: String,
    },
    /// An earlier window collective of this communicator failed, which leaves its scratch
    /// window's rounds out of step with the peers: every later one fails with it.
    #[error("an earlier window collective failed, the communicator's window rounds are out of step: {0}")]
    Poisoned(Box<CollectiveError>),
}

/// A backend of window collectives for one communicator, made by a provider: it owns the
/// communicator's scratch window and runs the algorithms in stream order.
pub trait WindowCollectives: Send + Sync {
    /// The backend's name (`host`, `cuda`), for logs.
    fn backend(&self) -> &str;

    /// Enqueues an all-reduce with `algo` on `call.stream`. A backend may take the next larger
    /// algorithm when the message does not fit `algo`'s buffer (one-shot → two-shot → ring),
    /// the same on every rank.
    fn all_reduce(&self, call: &AllReduceCall, algo: WindowAlgo) -> Result<(), CollectiveError>;

    /// The most bytes of each rank's input [`WindowCollectives::all_gather`] takes in one call;
    /// 0 (the default) where the backend has no all-gather.
    fn all_gather_max(&self) -> usize {
        0
    }

    /// Enqueues an all-gather on `call.stream` (each rank's input at most
    /// [`WindowCollectives::all_gather_max`] bytes). The default refuses it.
    fn all_gather(&self, call: &AllGatherCall) -> Result<(), CollectiveError> {
        let _ = call;
        Err(CollectiveError::Unsupported(format!(
            "the {} backend has no all-gather",
            self.backend()
        )))
    }

    /// The failure of work already run, if one (checked after the stream is synchronized).
    fn check(&self) -> Result<(), CollectiveError>;
}

/// What a provider's backend may use of one communicator: its device and stream, this rank
/// and the world, the job's store, the deadline of any wait on a peer, and
/// [`WindowContext::scratch`] to register its scratch window.
pub struct WindowContext<'a> {
    /// The device adaptor, set to this rank's device on the calling thread.
    pub device: &'a Device,
    /// The communicator's stream.
    pub stream: Stream,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// The deadline of any wait on a peer (`timeout_ms`).
    pub timeout: Duration,
    /// The job's store, for small out-of-band exchanges.
    pub store: &'a Store,
    /// Registers a zeroed scratch window of the given bytes (collective).
    pub(crate) scratch: &'a dyn Fn(usize) -> Result<Scratch, CollectiveError>,
}

impl WindowContext<'_> {
    /// Allocates `bytes` in the symmetric heap on every rank, zeroes them and registers them
    /// as a window addressed peer by peer (symmetric, else IPC handles; never multicast).
    /// Collective: every rank calls it at the same point, with the same size.
    pub fn scratch(&self, bytes: usize) -> Result<Scratch, CollectiveError> {
        (self.scratch)(bytes)
    }
}

/// A backend's scratch window: its memory and its registration. Dropping it releases this
/// rank's mappings, then the memory (the communicator's stream was synchronized first; peers
/// keep their own mappings of this rank's memory until they drop theirs).
pub struct Scratch {
    window: Option<Window>,
    buffer: SymmetricBuffer,
}

impl Scratch {
    pub(crate) fn new(window: Window, buffer: SymmetricBuffer) -> Scratch {
        Scratch {
            window: Some(window),
            buffer,
        }
    }

    /// This rank's scratch memory.
    pub fn ptr(&self) -> DevicePtr {
        self.buffer.ptr()
    }

    /// Bytes of each rank's scratch memory.
    pub fn size(&self) -> usize {
        self.buffer.size()
    }

    /// The registered window (present until drop).
    pub fn window(&self) -> &Window {
        self.window
            .as_ref()
            .expect("the scratch window lives until drop")
    }

    /// What backs the window.
    pub fn kind(&self) -> WindowKind {
        self.window().kind()
    }

    /// This process's address of every rank's scratch memory, rank by rank; `None` when the
    /// window has no peer addresses.
    pub fn peers(&self) -> Option<Vec<u64>> {
        let w = self.window();
        (0..w.world).map(|q| w.peer(q).map(|p| p.0)).collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(w) = self.window.take() {
            w.release_local();
        }
    }
}

/// Makes window-collective backends; registered with `inventory` by `ferrocx-kernels`.
pub struct WindowCollectivesProvider {
    /// Its name.
    pub name: &'static str,
    /// The thresholds measured for `device` at `world` ranks, or `None` when the provider
    /// cannot run on that device.
    pub measured: fn(device: &Device, world: usize) -> Option<Measured>,
    /// `true` when the provider's algorithms run `dtype` with `op` (others go to the CCL).
    pub supports: fn(dtype: DataType, op: ReduceOp) -> bool,
    /// Makes the backend of a communicator. Collective: it registers the scratch window, so
    /// every rank calls it at the same point.
    pub create: fn(ctx: &WindowContext<'_>) -> Result<Box<dyn WindowCollectives>, CollectiveError>,
}

inventory::collect!(WindowCollectivesProvider);

/// Registers a [`WindowCollectivesProvider`].
#[macro_export]
macro_rules! register_window_collectives {
    ($provider:expr) => {
        $crate::inventory::submit! { $provider }
    };
}

/// The first registered provider that can run on `device`, with what it measured.
pub fn provider_for(
    device: &Device,
    world: usize,
) -> Option<(&'static WindowCollectivesProvider, Measured)> {
    inventory::iter::<WindowCollectivesProvider>()
        .find_map(|p| (p.measured)(device, world).map(|m| (p, m)))
}
