//! Window collectives: all-reduce run by ferrocx's own algorithms over a scratch window (the
//! crate `ferrocx-kernels`: one-shot, two-shot and ring), for a CCL that has no all-reduce
//! (the sym-heap fallback) and for small messages where they beat the CCL.
//!
//! The core only routes: [`route`] decides from the size, the world, the cluster's
//! `small_message` / `window_one_shot_max` / `window_two_shot_max` keys and the thresholds
//! measured for the device, and [`Communicator::all_reduce`](crate::comm::Communicator::all_reduce)
//! hands window calls to a [`WindowCollectives`] backend made by a registered
//! [`WindowCollectivesProvider`]. `ferrocx-kernels` registers one (call
//! `ferrocx_kernels::link()` once so that the linker keeps it); without one, every all-reduce
//! goes to the CCL.

use std::fmt;
use std::time::Duration;

use crate::abi::{DataType, DevicePtr, ReduceOp, Stream};
use crate::adaptor::Device;
use crate::comm::{CommError, Communicator};
use crate::config::{Fallback, SmallMessage};

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
}

/// Where one all-reduce goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The CCL's all-reduce.
    Ccl,
    /// A window algorithm.
    Window(WindowAlgo),
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::Ccl => f.write_str("ccl"),
            Route::Window(a) => write!(f, "window {a}"),
        }
    }
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

/// Where an all-reduce of `bytes` per rank goes. `ccl_has_all_reduce`: the CCL's table has
/// the entry; `measured`: what the provider for this device measured (`None`: no provider
/// can run on the device, so only the CCL can). The same inputs give the same route on every
/// rank, which is what keeps the ranks of one call on one algorithm.
pub fn route(
    bytes: usize,
    ccl_has_all_reduce: bool,
    config: &WindowCollectivesConfig,
    measured: Option<Measured>,
) -> Route {
    let Some(measured) = measured else {
        return Route::Ccl;
    };
    let t = config.thresholds(measured.thresholds);
    let by_size = if bytes <= t.one_shot_max {
        WindowAlgo::OneShot
    } else if bytes <= t.two_shot_max {
        WindowAlgo::TwoShot
    } else {
        WindowAlgo::Ring
    };
    if !ccl_has_all_reduce {
        return match config.fallback {
            Fallback::SymHeap => Route::Window(by_size),
            // The CCL's "not supported" is the answer.
            Fallback::Disabled => Route::Ccl,
        };
    }
    let window = match config.small_message {
        SmallMessage::Window => true,
        SmallMessage::Ccl => false,
        SmallMessage::Auto => measured.window_faster,
    };
    if window && by_size != WindowAlgo::Ring {
        Route::Window(by_size)
    } else {
        Route::Ccl
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

/// Why a window collective failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    /// A peer did not signal within the communicator's timeout.
    #[error("window all-reduce ({algo}): rank {peer} did not signal {what} of round {epoch} within {waited:?}")]
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
    #[error("window all-reduce: {0}")]
    Unsupported(String),
    /// Nothing can run window collectives here.
    #[error("window collectives are not available: {0}")]
    Unavailable(String),
    /// A launch or an adaptor call failed.
    #[error("window all-reduce ({algo}): {message}")]
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

    /// The failure of work already run, if one (checked after the stream is synchronized).
    fn check(&self) -> Result<(), CollectiveError>;
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
    pub create: fn(comm: &Communicator) -> Result<Box<dyn WindowCollectives>, CommError>,
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

#[cfg(test)]
mod tests {
    use super::*;

    const MEASURED: Measured = Measured {
        thresholds: Thresholds {
            one_shot_max: 4096,
            two_shot_max: 256 << 10,
        },
        window_faster: true,
    };

    fn config(small: SmallMessage, fallback: Fallback) -> WindowCollectivesConfig {
        WindowCollectivesConfig {
            small_message: small,
            one_shot_max: None,
            two_shot_max: None,
            fallback,
        }
    }

    #[test]
    fn sizes_pick_the_algorithm_below_the_crossover() {
        let c = config(SmallMessage::Auto, Fallback::SymHeap);
        let r = |bytes| route(bytes, true, &c, Some(MEASURED));
        assert_eq!(r(8), Route::Window(WindowAlgo::OneShot));
        assert_eq!(r(4096), Route::Window(WindowAlgo::OneShot));
        assert_eq!(r(4097), Route::Window(WindowAlgo::TwoShot));
        assert_eq!(r(256 << 10), Route::Window(WindowAlgo::TwoShot));
        assert_eq!(r((256 << 10) + 1), Route::Ccl);
    }

    #[test]
    fn auto_follows_the_measurement_and_the_keys_override_it() {
        let slower = Measured {
            window_faster: false,
            ..MEASURED
        };
        let auto = config(SmallMessage::Auto, Fallback::SymHeap);
        assert_eq!(route(8, true, &auto, Some(slower)), Route::Ccl);
        let window = config(SmallMessage::Window, Fallback::SymHeap);
        assert_eq!(
            route(8, true, &window, Some(slower)),
            Route::Window(WindowAlgo::OneShot)
        );
        let ccl = config(SmallMessage::Ccl, Fallback::SymHeap);
        assert_eq!(route(8, true, &ccl, Some(MEASURED)), Route::Ccl);
        let keys = WindowCollectivesConfig {
            one_shot_max: Some(16),
            two_shot_max: Some(1024),
            ..window
        };
        assert_eq!(
            route(17, true, &keys, Some(MEASURED)),
            Route::Window(WindowAlgo::TwoShot)
        );
        assert_eq!(route(1025, true, &keys, Some(MEASURED)), Route::Ccl);
        // A two-shot maximum below the measured one-shot maximum caps it.
        let low = WindowCollectivesConfig {
            two_shot_max: Some(100),
            ..window
        };
        assert_eq!(
            low.thresholds(MEASURED.thresholds),
            Thresholds {
                one_shot_max: 100,
                two_shot_max: 100
            }
        );
    }

    #[test]
    fn a_ccl_without_all_reduce_takes_every_size_to_the_window() {
        let c = config(SmallMessage::Ccl, Fallback::SymHeap);
        assert_eq!(
            route(8, false, &c, Some(MEASURED)),
            Route::Window(WindowAlgo::OneShot)
        );
        assert_eq!(
            route(64 << 20, false, &c, Some(MEASURED)),
            Route::Window(WindowAlgo::Ring)
        );
        let none = config(SmallMessage::Window, Fallback::Disabled);
        assert_eq!(route(8, false, &none, Some(MEASURED)), Route::Ccl);
        // Without a provider for the device, only the CCL can run it.
        assert_eq!(route(8, false, &c, None), Route::Ccl);
    }

    #[test]
    fn algorithm_names_round_trip() {
        for a in WindowAlgo::ALL {
            assert_eq!(a.name().parse::<WindowAlgo>(), Ok(a));
        }
        assert_eq!("two_shot".parse::<WindowAlgo>(), Ok(WindowAlgo::TwoShot));
        assert!("tree".parse::<WindowAlgo>().is_err());
    }
}
