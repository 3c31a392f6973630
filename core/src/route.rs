//! The router: the one place that decides where each collective of a
//! [`Communicator`](crate::comm::Communicator) goes.
//!
//! ```text
//! Communicator::all_reduce(..)                (every collective, on its stream or a caller's)
//!   └─ Router::route ── one cluster, the CCL has it, above the window crossover ──► CCL table
//!                    ├─ one cluster, small message, or the CCL lacks it ────────► window algorithms
//!                    └─ several clusters ──────────────────────────────────────► cross-cluster plan
//! ```
//!
//! The point-to-point all-gather ([`crate::comm::p2p`]) has its own decision,
//! [`Router::all_gather_p2p`]: across clusters the cross-cluster plan; copies out of the
//! peers' windows by the copy engines ([`Route::WindowCopies`]) where the device has stream
//! memory operations and exportable memory and is not host-addressable (a GPU) and
//! `FERROCX_P2P_COPIES=1` asks for it; else the CCL's
//! `send`/`recv`; else reads of the peers' windows by host functions
//! ([`Route::WindowReads`]) on a host-addressable device.
//!
//! The router decides from what was probed once when the communicator was made (which entries
//! the CCL's table has, what the window provider measured for the device, the cluster's keys);
//! the same inputs give the same route on every rank, which is what keeps the ranks of one call
//! on one algorithm. A route is data ([`Route`]); the communicator executes it.

use std::fmt;

use crate::abi::{DataType, ReduceOp};
use crate::caps::CclCaps;
use crate::config::{Fallback, SmallMessage};
use crate::window::collectives::{Measured, WindowAlgo, WindowCollectivesConfig};

/// A collective operation of [`Communicator`](crate::comm::Communicator).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// `recv = op over ranks of send`.
    AllReduce,
    /// The root's `recv = op over ranks of send`.
    Reduce,
    /// Every rank's `recv` = the root's `send`.
    Broadcast,
    /// `recv[r]` = rank r's `send`.
    AllGather,
    /// `recv` = this rank's block of the reduction.
    ReduceScatter,
    /// The root's `recv[r]` = rank r's `send`.
    Gather,
    /// Rank r's `recv` = block r of the root's `send`.
    Scatter,
    /// Block r of `send` to rank r, block r of `recv` from rank r.
    AllToAll,
    /// As `AllToAll` with per-peer counts and displacements.
    AllToAllv,
    /// Point-to-point send.
    Send,
    /// Point-to-point receive.
    Recv,
    /// Every rank waits for every other.
    Barrier,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 12] = [
        Collective::AllReduce,
        Collective::Reduce,
        Collective::Broadcast,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Gather,
        Collective::Scatter,
        Collective::AllToAll,
        Collective::AllToAllv,
        Collective::Send,
        Collective::Recv,
        Collective::Barrier,
    ];

    /// The name used in spans, logs and errors (the CCL table's entry name).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Reduce => "reduce",
            Collective::Broadcast => "broadcast",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllv => "all_to_allv",
            Collective::Send => "send",
            Collective::Recv => "recv",
            Collective::Barrier => "barrier",
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where one call goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The cluster's CCL table.
    Ccl,
    /// A window algorithm (`ferrocx-kernels`) over the communicator's scratch window.
    Window(WindowAlgo),
    /// The job's store, after this rank's stream: a barrier where neither the CCL nor the
    /// window algorithms can run one.
    Store,
    /// The cross-cluster plan of a job that spans clusters (each cluster's CCL plus the bridge
    /// between clusters, see [`crate::hetero`]): every call of a job that spans clusters.
    Clusters,
    /// Reads of the peers' memory through a window of the communicator, in stream order (the
    /// point-to-point all-gather where the CCL has no `send`/`recv`, see
    /// [`crate::comm::p2p`]).
    WindowReads,
    /// Copies of the peers' slices out of a window of the communicator by the device's copy
    /// engines (`mem_copy_async`), each after a stream-ordered wait for the peer's signal (the
    /// memops group): the point-to-point all-gather where the device has stream memory
    /// operations and memory it maps into peers, with no kernel of the transfer on the SMs
    /// (see [`crate::comm::p2p`]).
    WindowCopies,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::Ccl => f.write_str("ccl"),
            Route::Window(a) => write!(f, "window {a}"),
            Route::Store => f.write_str("store"),
            Route::Clusters => f.write_str("clusters"),
            Route::WindowReads => f.write_str("window-reads"),
            Route::WindowCopies => f.write_str("window-copies"),
        }
    }
}

/// Which collectives a CCL's table has, from its capabilities probed once at init
/// ([`CclCaps`]; an absent entry is the only "unsupported"), as bits the router tests per call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CclEntries {
    bits: u32,
}

impl CclEntries {
    /// The collectives `caps` says the table has (the barrier: where it has `all_reduce`, which
    /// runs it).
    pub fn of(caps: &CclCaps) -> CclEntries {
        let mut e = CclEntries::default();
        for c in Collective::ALL {
            let entry = match c {
                Collective::Barrier => Collective::AllReduce.name(),
                c => c.name(),
            };
            e.set(c, caps.has(entry));
        }
        e
    }

    /// Sets whether `c` is present.
    pub fn set(&mut self, c: Collective, present: bool) {
        let bit = 1 << c as u32;
        if present {
            self.bits |= bit;
        } else {
            self.bits &= !bit;
        }
    }

    /// `true` when the table has `c`.
    pub fn has(self, c: Collective) -> bool {
        self.bits & (1 << c as u32) != 0
    }
}

/// The window algorithms a communicator can use: what the provider for its device measured
/// and which types and ops they run. `None` in [`Router::window`] when no provider runs on
/// the device.
#[derive(Clone, Copy, Debug)]
pub struct WindowRoute {
    /// The thresholds and speed the provider measured for the device at this world size.
    pub measured: Measured,
    /// `true` when the window algorithms run `dtype` with `op`.
    pub supports: fn(DataType, ReduceOp) -> bool,
}

/// Decides every call of one communicator.
#[derive(Clone, Debug)]
pub struct Router {
    /// The CCL's collective entries.
    pub ccl: CclEntries,
    /// The cluster's `small_message`, thresholds and `fallback` keys.
    pub config: WindowCollectivesConfig,
    /// The window algorithms for the device, if a provider runs on it.
    pub window: Option<WindowRoute>,
    /// Clusters the communicator spans (above 1, every call takes [`Route::Clusters`]).
    pub clusters: usize,
}

impl Router {
    /// The route of `op` over `bytes` per rank of `dtype` (`redop` for reductions).
    pub fn route(
        &self,
        op: Collective,
        bytes: usize,
        dtype: DataType,
        redop: Option<ReduceOp>,
    ) -> Route {
        if self.clusters > 1 {
            return Route::Clusters;
        }
        match op {
            Collective::AllReduce => self.all_reduce(bytes, dtype, redop.unwrap_or(ReduceOp::SUM)),
            // A one-word all-reduce on the CCL; never the first call that makes the window
            // backend (a scratch window registered by a barrier would surprise whoever counts
            // windows), unless the CCL has no all-reduce.
            Collective::Barrier if self.ccl.has(Collective::AllReduce) => Route::Ccl,
            Collective::Barrier => match self.all_reduce(bytes, dtype, ReduceOp::SUM) {
                Route::Ccl => Route::Store,
                r => r,
            },
            // The window algorithms run all-reduce only; an absent entry fails in the CCL call
            // with the adaptor's name and the operation.
            _ => Route::Ccl,
        }
    }

    /// Where a point-to-point all-gather ([`crate::comm::p2p`]) goes: the cross-cluster plan
    /// for a job across clusters; copies out of the peers' windows by the copy engines where
    /// `copies_run` (the device has the memops group and memory it exports to peers, is not
    /// host-addressable — a GPU, where the CCL's send/recv kernels would take SMs from the
    /// consumer the gather is pipelined with — and the route is asked for, or the output lies
    /// in a window the copies push into); else
    /// the CCL's grouped `send`/`recv` where it
    /// has both; else reads of the peers' windows where `reads_run` (the device's memory is
    /// host-addressable and it runs host functions); else the CCL, whose missing entry fails
    /// naming it.
    pub fn all_gather_p2p(&self, reads_run: bool, copies_run: bool) -> Route {
        if self.clusters > 1 {
            Route::Clusters
        } else if copies_run {
            Route::WindowCopies
        } else if self.ccl.has(Collective::Send) && self.ccl.has(Collective::Recv) {
            Route::Ccl
        } else if reads_run {
            Route::WindowReads
        } else {
            Route::Ccl
        }
    }

    /// Where an all-reduce of `bytes` per rank goes: the CCL, or a window algorithm (when the
    /// CCL has no all-reduce and `fallback = "symheap"`, or below the crossover when
    /// `small_message` chooses the window and the window algorithms run the type and op).
    pub fn all_reduce(&self, bytes: usize, dtype: DataType, op: ReduceOp) -> Route {
        let has_ccl = self.ccl.has(Collective::AllReduce);
        let measured = self
            .window
            .filter(|w| !has_ccl || (w.supports)(dtype, op))
            .map(|w| w.measured);
        route_all_reduce(bytes, has_ccl, &self.config, measured)
    }
}

/// The all-reduce decision: `ccl_has_all_reduce`, the cluster's keys and what the window
/// provider measured (`None`: no provider runs on the device, so only the CCL can).
pub fn route_all_reduce(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::collectives::Thresholds;

    const MEASURED: Measured = Measured {
        thresholds: Thresholds {
            one_shot_max: 4096,
            two_shot_max: 256 << 10,
        },
        window_faster: true,
        all_gather_below: 0,
    };

    fn config(small: SmallMessage, fallback: Fallback) -> WindowCollectivesConfig {
        WindowCollectivesConfig {
            small_message: small,
            one_shot_max: None,
            two_shot_max: None,
            fallback,
        }
    }

    fn f32_sum_only(dtype: DataType, op: ReduceOp) -> bool {
        dtype == DataType::F32 && op == ReduceOp::SUM
    }

    fn router(entries: &[Collective], window: bool) -> Router {
        let mut ccl = CclEntries::default();
        for c in entries {
            ccl.set(*c, true);
        }
        Router {
            ccl,
            config: config(SmallMessage::Auto, Fallback::SymHeap),
            window: window.then_some(WindowRoute {
                measured: MEASURED,
                supports: f32_sum_only,
            }),
            clusters: 1,
        }
    }

    #[test]
    fn sizes_pick_the_algorithm_below_the_crossover() {
        let c = config(SmallMessage::Auto, Fallback::SymHeap);
        let r = |bytes| route_all_reduce(bytes, true, &c, Some(MEASURED));
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
        assert_eq!(route_all_reduce(8, true, &auto, Some(slower)), Route::Ccl);
        let window = config(SmallMessage::Window, Fallback::SymHeap);
        assert_eq!(
            route_all_reduce(8, true, &window, Some(slower)),
            Route::Window(WindowAlgo::OneShot)
        );
        let ccl = config(SmallMessage::Ccl, Fallback::SymHeap);
        assert_eq!(route_all_reduce(8, true, &ccl, Some(MEASURED)), Route::Ccl);
        let keys = WindowCollectivesConfig {
            one_shot_max: Some(16),
            two_shot_max: Some(1024),
            ..window
        };
        assert_eq!(
            route_all_reduce(17, true, &keys, Some(MEASURED)),
            Route::Window(WindowAlgo::TwoShot)
        );
        assert_eq!(
            route_all_reduce(1025, true, &keys, Some(MEASURED)),
            Route::Ccl
        );
    }

    #[test]
    fn a_ccl_without_all_reduce_takes_every_size_to_the_window() {
        let c = config(SmallMessage::Ccl, Fallback::SymHeap);
        assert_eq!(
            route_all_reduce(8, false, &c, Some(MEASURED)),
            Route::Window(WindowAlgo::OneShot)
        );
        assert_eq!(
            route_all_reduce(64 << 20, false, &c, Some(MEASURED)),
            Route::Window(WindowAlgo::Ring)
        );
        let none = config(SmallMessage::Window, Fallback::Disabled);
        assert_eq!(
            route_all_reduce(8, false, &none, Some(MEASURED)),
            Route::Ccl
        );
        // Without a provider for the device, only the CCL can run it.
        assert_eq!(route_all_reduce(8, false, &c, None), Route::Ccl);
    }

    #[test]
    fn the_router_sends_types_the_window_lacks_and_other_collectives_to_the_ccl() {
        let r = router(&[Collective::AllReduce, Collective::AllGather], true);
        let f32_sum = r.route(
            Collective::AllReduce,
            64,
            DataType::F32,
            Some(ReduceOp::SUM),
        );
        assert_eq!(f32_sum, Route::Window(WindowAlgo::OneShot));
        let max = r.route(
            Collective::AllReduce,
            64,
            DataType::F32,
            Some(ReduceOp::MAX),
        );
        assert_eq!(max, Route::Ccl);
        let f64 = r.route(
            Collective::AllReduce,
            64,
            DataType::F64,
            Some(ReduceOp::SUM),
        );
        assert_eq!(f64, Route::Ccl);
        for c in Collective::ALL {
            if !matches!(c, Collective::AllReduce | Collective::Barrier) {
                assert_eq!(r.route(c, 64, DataType::F32, None), Route::Ccl, "{c}");
            }
        }
        // Without the CCL's all-reduce the window runs every size, the types it supports.
        let no_ccl = router(&[Collective::Send, Collective::Recv], true);
        assert_eq!(
            no_ccl.route(
                Collective::AllReduce,
                8 << 20,
                DataType::F32,
                Some(ReduceOp::SUM)
            ),
            Route::Window(WindowAlgo::Ring)
        );
    }

    #[test]
    fn a_barrier_takes_the_all_reduce_route_or_the_store() {
        let ccl = router(&[Collective::AllReduce], false);
        let barrier = |r: &Router| r.route(Collective::Barrier, 4, DataType::F32, None);
        assert_eq!(barrier(&ccl), Route::Ccl);
        let both = router(&[Collective::AllReduce], true);
        assert_eq!(barrier(&both), Route::Ccl);
        let window = router(&[], true);
        assert_eq!(barrier(&window), Route::Window(WindowAlgo::OneShot));
        let nothing = router(&[], false);
        assert_eq!(barrier(&nothing), Route::Store);
    }

    #[test]
    fn several_clusters_take_the_cross_cluster_plan() {
        let mut r = router(&[Collective::AllReduce], true);
        r.clusters = 2;
        for c in Collective::ALL {
            assert_eq!(r.route(c, 8, DataType::F32, None), Route::Clusters, "{c}");
        }
    }

    #[test]
    fn a_p2p_all_gather_takes_the_copies_then_the_ccl_then_the_window_reads() {
        let both = router(&[Collective::Send, Collective::Recv], false);
        assert_eq!(both.all_gather_p2p(true, false), Route::Ccl);
        assert_eq!(both.all_gather_p2p(false, true), Route::WindowCopies);
        let send_only = router(&[Collective::Send], false);
        assert_eq!(send_only.all_gather_p2p(true, false), Route::WindowReads);
        assert_eq!(send_only.all_gather_p2p(false, false), Route::Ccl);
        assert_eq!(send_only.all_gather_p2p(false, true), Route::WindowCopies);
        let mut across = both.clone();
        across.clusters = 2;
        assert_eq!(across.all_gather_p2p(true, true), Route::Clusters);
        assert_eq!(Route::WindowReads.to_string(), "window-reads");
        assert_eq!(Route::WindowCopies.to_string(), "window-copies");
    }

    #[test]
    fn entries_round_trip() {
        let mut e = CclEntries::default();
        for c in Collective::ALL {
            assert!(!e.has(c));
            e.set(c, true);
            assert!(e.has(c));
        }
        e.set(Collective::Send, false);
        assert!(!e.has(Collective::Send) && e.has(Collective::Recv));
    }
}
