//! Every collective of a [`Communicator`], on its stream or a caller's: [`Call`].
//!
//! Each call asks the communicator's [`Router`](crate::route::Router) where it goes, opens one
//! `tracing` span (`collective`: op, bytes, dtype, route) and hands the call to the CCL's table
//! or to the window algorithms. Nothing else in ferrocx calls a CCL entry with a communicator
//! handle.
//!
//! The safety contract of every buffer argument is stated once, on [`Call`].

use crate::abi::{DataType, DevicePtr, ReduceOp, Stream};
use crate::config::SmallMessage;
use crate::route::{Collective, Route};
use crate::window::collectives::{AllGatherCall, AllReduceCall, WindowAlgo};
use crate::window::Window;

use super::{CommError, Communicator};

/// A collective call of one communicator on one stream, optionally on a forced route: made by
/// [`Communicator::on`] (a caller's stream) or [`Communicator::call`] (the communicator's).
/// Cheap to make: it borrows the communicator.
///
/// # Safety of the buffer arguments
///
/// Collectives are asynchronous: they return once enqueued, and the adaptor reads and writes
/// the buffers later, in stream order. So every method that takes a [`DevicePtr`] is an
/// `unsafe fn` with one contract, stated once here (every method's `# Safety` refers to it):
///
/// - each buffer is memory of this communicator's device adaptor (from its `mem_alloc`, the
///   symmetric heap, or memory the adaptor documents as addressable, such as host memory on the
///   host device), valid for the bytes the operation touches (`count` elements of `dtype`, or
///   as the method says);
/// - it stays valid, and no other work writes a buffer the operation reads or reads a buffer it
///   writes, until the operation has completed on the stream (after a synchronize of the
///   stream, or an event recorded after it);
/// - `send` and `recv` are equal (in place) or do not overlap.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub(super) comm: &'a Communicator,
    pub(super) stream: Stream,
    pub(super) route: Option<Route>,
    pub(super) piece: Option<usize>,
    pub(super) out: Option<&'a Window>,
}

fn bytes_of(count: usize, dtype: DataType) -> usize {
    count.saturating_mul(dtype.size().unwrap_or(0))
}

fn root_of(root: usize) -> i32 {
    i32::try_from(root).unwrap_or(i32::MAX)
}

impl<'a> Call<'a> {
    pub(super) fn new(comm: &'a Communicator, stream: Stream) -> Call<'a> {
        Call {
            piece: None,
            out: None,
            comm,
            stream,
            route: None,
        }
    }

    /// The same call on `route` whatever the router says (benchmarks comparing routes, tests).
    /// Every rank must force the same route. A communicator that spans clusters keeps the
    /// cross-cluster plan whatever is forced: a cluster's CCL or window alone would reach only
    /// its own ranks.
    pub fn via(mut self, route: Route) -> Call<'a> {
        self.route = Some(route);
        self
    }

    /// Cuts each peer's slice of a point-to-point all-gather into pieces of `elems` elements
    /// (the last one shorter), each with its own event and its own call of
    /// [`Call::all_gather_p2p_each`]'s hook, so a consumer starts on the first rows of a slice
    /// while the rest are still on the way. Only the window-copies route cuts (its copies are
    /// stream operations, cheap to split); the other routes move whole slices. `elems` of 0
    /// means whole slices.
    pub fn pieces(mut self, elems: usize) -> Call<'a> {
        self.piece = (elems > 0).then_some(elems);
        self
    }

    /// Says that a point-to-point all-gather's output (`recv`) lies in `window`, at the same
    /// offset from the window's start on every rank (as with any symmetric allocation; register
    /// it with [`WindowFlags::PEERS`](crate::window::WindowFlags::PEERS), so that it has peer
    /// addresses even where the CCL has windows of its own): the
    /// window-copies route then **pushes** each rank's input straight into every peer's output
    /// by the copy engines, with no staging copy on either side (see
    /// [`crate::comm::p2p`]), and the router takes that route on 2 ranks where it runs on a
    /// device that is not host-addressable (a GPU; on more ranks it stays opt-in, as the
    /// copies out of the staging are). Other routes ignore it. Every rank passes a window of
    /// the same registration.
    pub fn output_window(mut self, window: &'a Window) -> Call<'a> {
        self.out = Some(window);
        self
    }

    /// The stream the call is enqueued on.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Where `op` over `bytes` per rank goes: the forced route, else the router's.
    pub fn route(
        &self,
        op: Collective,
        bytes: usize,
        dtype: DataType,
        redop: Option<ReduceOp>,
    ) -> Route {
        match self.route {
            Some(_) if self.comm.router.clusters > 1 => Route::Clusters,
            Some(forced) => forced,
            None => self.comm.router.route(op, bytes, dtype, redop),
        }
    }

    /// Whether the router (nothing forced) gives an all-gather of `bytes` a rank to the window
    /// collectives' all-gather: one cluster; its `small_message` is not `ccl`; a window
    /// provider runs on the device; the whole output is below the reach
    /// ([`ALL_GATHER_WINDOW_BELOW_ENV`](super::ALL_GATHER_WINDOW_BELOW_ENV) if set, else with
    /// `small_message = "window"` everything
    /// that fits, with `"auto"` the provider's measured `all_gather_below`); and each rank's
    /// input fits the backend ([`WindowCollectives::all_gather_max`]). Every rank decides
    /// alike (the size, the cluster's configuration, device and provider), so the first window
    /// call, which registers the scratch window, is collective as it must be.
    ///
    /// [`WindowCollectives::all_gather_max`]: crate::window::collectives::WindowCollectives::all_gather_max
    pub fn window_gather_chosen(&self, bytes: usize) -> bool {
        let c = self.comm;
        if self.route.is_some() || c.router.clusters > 1 || bytes == 0 {
            return false;
        }
        let Some(w) = c.router.window else {
            return false;
        };
        let reach = match (c.router.config.small_message, window_gather_below()) {
            (SmallMessage::Ccl, _) => return false,
            (_, Some(below)) => below,
            (SmallMessage::Window, None) => usize::MAX,
            (SmallMessage::Auto, None) => w.measured.all_gather_below,
        };
        bytes.saturating_mul(c.world) < reach
            && c.window_backend()
                .is_ok_and(|b| bytes <= b.all_gather_max())
    }

    /// The cross-cluster side, for a call on [`Route::Clusters`].
    fn hetero(&self, op: Collective) -> Result<&'a crate::hetero::Hetero, CommError> {
        self.comm
            .hetero
            .as_ref()
            .ok_or_else(|| self.comm.across_clusters(op))
    }

    /// The path of a collective that only the CCL or the cross-cluster plan runs: its route,
    /// its span, then `across` for a job across clusters or `ccl` on the CCL.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        op: Collective,
        bytes: usize,
        dtype: DataType,
        redop: Option<ReduceOp>,
        across: impl FnOnce(&crate::hetero::Hetero) -> Result<(), crate::hetero::HeteroError>,
        ccl: impl FnOnce() -> Result<(), crate::adaptor::AdaptorError>,
    ) -> Result<(), CommError> {
        let route = self.route(op, bytes, dtype, redop);
        let _span = span(op, bytes, dtype, route);
        if route == Route::Clusters {
            return Ok(across(self.hetero(op)?)?);
        }
        self.on_ccl(op, route, ccl)
    }

    /// The CCL call of `op` (on a route the router gave or the caller forced).
    fn on_ccl(
        &self,
        op: Collective,
        route: Route,
        enqueue: impl FnOnce() -> Result<(), crate::adaptor::AdaptorError>,
    ) -> Result<(), CommError> {
        match route {
            Route::Ccl => Ok(enqueue()?),
            Route::Clusters => Err(self.comm.across_clusters(op)),
            Route::Window(_) | Route::Store => Err(CommError::Topology(format!(
                "{op} cannot take the route `{route}`: only all_reduce and barrier run there"
            ))),
            Route::WindowReads | Route::WindowCopies => Err(CommError::Topology(format!(
                "{op} cannot take the route `{route}`: only all_gather_p2p runs there"
            ))),
        }
    }

    /// Enqueues `recv[i] = op over ranks of send[i]` for `count` elements of `dtype`.
    ///
    /// # Safety
    /// `send` and `recv` hold `count` elements of `dtype`, as the [`Call`] docs say.
    pub unsafe fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(count, dtype);
        let route = self.route(Collective::AllReduce, bytes, dtype, Some(op));
        let _span = span(Collective::AllReduce, bytes, dtype, route);
        let c = self.comm;
        if route == Route::Clusters {
            let h = self.hetero(Collective::AllReduce)?;
            // SAFETY: the caller's contract is the plan's.
            return Ok(unsafe { h.all_reduce(send, recv, count, dtype, op, self.stream) }?);
        }
        if let Route::Window(algo) = route {
            match c.window_backend() {
                Ok(_) => return self.window_all_reduce(send, recv, count, dtype, op, algo),
                // The backend could not be made (the same on every rank: its window
                // registration failed alike everywhere): the CCL takes the call if it can.
                Err(e) if !c.router.ccl.has(Collective::AllReduce) => return Err(e.into()),
                Err(_) => {}
            }
        }
        let route = if let Route::Window(_) = route {
            Route::Ccl
        } else {
            route
        };
        self.on_ccl(Collective::AllReduce, route, || {
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            unsafe {
                c.ccl
                    .all_reduce(send, recv, count, dtype, op, c.comm, self.stream)
            }
        })
    }

    /// Enqueues an all-reduce on the window algorithm `algo` (the communicator's first window
    /// call registers its scratch window on every rank: collective).
    fn window_all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        algo: WindowAlgo,
    ) -> Result<(), CommError> {
        let backend = self.comm.window_backend()?;
        let call = AllReduceCall {
            send,
            recv,
            count,
            dtype,
            op,
            stream: self.stream,
        };
        Ok(backend.all_reduce(&call, algo)?)
    }

    /// Enqueues the root's `recv = op over ranks of send` (`count` elements).
    ///
    /// # Safety
    /// `send` holds `count` elements on every rank, `recv` on the root (ignored elsewhere), as
    /// the [`Call`] docs say.
    pub unsafe fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(count, dtype);
        let c = self.comm;
        self.dispatch(
            Collective::Reduce,
            bytes,
            dtype,
            Some(op),
            // SAFETY: the caller's contract is the plan's.
            |h| unsafe { h.reduce(send, recv, count, dtype, op, root, self.stream) },
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            || unsafe {
                c.ccl.reduce(
                    send,
                    recv,
                    count,
                    dtype,
                    op,
                    root_of(root),
                    c.comm,
                    self.stream,
                )
            },
        )
    }

    /// Enqueues `recv` = the root's `send` (`count` elements) on every rank.
    ///
    /// # Safety
    /// `send` (read on the root) and `recv` hold `count` elements, as the
    /// [`Call`] docs say.
    pub unsafe fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(count, dtype);
        let c = self.comm;
        self.dispatch(
            Collective::Broadcast,
            bytes,
            dtype,
            None,
            // SAFETY: the caller's contract is the plan's.
            |h| unsafe { h.broadcast(send, recv, count, dtype, root, self.stream) },
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            || unsafe {
                c.ccl
                    .broadcast(send, recv, count, dtype, root_of(root), c.comm, self.stream)
            },
        )
    }

    /// Enqueues `recv[r * send_count..]` = rank r's `send` (`send_count` elements each).
    ///
    /// Route: the window collectives' all-gather (one round through the scratch window; on
    /// CUDA one kernel) where [`Call::window_gather_chosen`] says so (on 2 GPUs every size a
    /// chunk slot holds, 8 MiB a rank; on 4 below 12 MiB of output) or where
    /// `via(Route::Window(_))` forces it; else the
    /// CCL's all_gather (or the cross-cluster plan).
    ///
    /// # Safety
    /// `send` holds `send_count` elements and `recv` `world * send_count`, as the
    /// [`Call`] docs say.
    pub unsafe fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(send_count, dtype);
        let c = self.comm;
        let forced = matches!(self.route, Some(Route::Window(_))) && c.router.clusters == 1;
        if forced || self.window_gather_chosen(bytes) {
            let _span = span(
                Collective::AllGather,
                bytes,
                dtype,
                Route::Window(WindowAlgo::OneShot),
            );
            let call = AllGatherCall {
                send,
                recv,
                count: send_count,
                dtype,
                stream: self.stream,
            };
            return Ok(c.window_backend()?.all_gather(&call)?);
        }
        self.dispatch(
            Collective::AllGather,
            bytes,
            dtype,
            None,
            // SAFETY: the caller's contract is the plan's.
            |h| unsafe { h.gather(send, recv, send_count, dtype, None, self.stream) },
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            || unsafe {
                c.ccl
                    .all_gather(send, recv, send_count, dtype, c.comm, self.stream)
            },
        )
    }

    /// Enqueues `recv` = this rank's block (`recv_count` elements) of the reduction of every
    /// rank's `send`.
    ///
    /// # Safety
    /// `send` holds `world * recv_count` elements and `recv` `recv_count`, as the
    /// [`Call`] docs say.
    pub unsafe fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(recv_count, dtype).saturating_mul(self.comm.world);
        let c = self.comm;
        self.dispatch(
            Collective::ReduceScatter,
            bytes,
            dtype,
            Some(op),
            // SAFETY: the caller's contract is the plan's.
            |h| unsafe {
                h.exchange(
                    Collective::ReduceScatter,
                    send,
                    recv,
                    recv_count,
                    dtype,
                    Some(op),
                    None,
                    self.stream,
                )
            },
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            || unsafe {
                c.ccl
                    .reduce_scatter(send, recv, recv_count, dtype, op, c.comm, self.stream)
            },
        )
    }

    /// Enqueues the root's `recv[r * send_count..]` = rank r's `send`.
    ///
    /// # Safety
    /// `send` holds `send_count` elements, the root's `recv` `world * send_count`, as the
    /// [`Call`] docs say.
    pub unsafe fn gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(send_count, dtype);
        let c = self.comm;
        self.dispatch(
            Collective::Gather,
            bytes,
            dtype,
            None,
            // SAFETY: the caller's contract is the plan's.
            |h| unsafe { h.gather(send, recv, send_count, dtype, Some(root), self.stream) },
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            || unsafe {
                c.ccl.gather(
                    send,
                    recv,
                    send_count,
                    dtype,
                    root_of(root),
                    c.comm,
                    self.stream,
                )
            },
        )
    }

    /// Enqueues rank r's `recv` = block r (`recv_count` elements) of the root's `send`.
    ///
    /// # Safety
    /// The root's `send` holds `world * recv_count` elements, every `recv` `recv_count`, as
    /// the [`Call`] docs say.
    pub unsafe fn scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        root: usize,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(recv_count, dtype);
        let c = self.comm;
        self.dispatch(
            Collective::Scatter,
            bytes,
            dtype,
            None,
            // SAFETY: the caller's contract is the plan's.
            |h| unsafe {
                h.exchange(
                    Collective::Scatter,
                    send,
                    recv,
                    recv_count,
                    dtype,
                    None,
                    Some(root),
                    self.stream,
                )
            },
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            || unsafe {
                c.ccl.scatter(
                    send,
                    recv,
                    recv_count,
                    dtype,
                    root_of(root),
                    c.comm,
                    self.stream,
                )
            },
        )
    }

    /// Enqueues an all-to-all: block r of `send` (`count` elements) to rank r, block r of
    /// `recv` from rank r.
    ///
    /// # Safety
    /// `send` and `recv` hold `world * count` elements, as the [`Call`] docs say.
    pub unsafe fn all_to_all(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(count, dtype).saturating_mul(self.comm.world);
        let c = self.comm;
        self.dispatch(
            Collective::AllToAll,
            bytes,
            dtype,
            None,
            // SAFETY: the caller's contract is the plan's.
            |h| unsafe {
                h.exchange(
                    Collective::AllToAll,
                    send,
                    recv,
                    count,
                    dtype,
                    None,
                    None,
                    self.stream,
                )
            },
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            || unsafe {
                c.ccl
                    .all_to_all(send, recv, count, dtype, c.comm, self.stream)
            },
        )
    }

    /// Enqueues an all-to-all with per-peer counts and displacements (in elements; one entry
    /// per rank each).
    ///
    /// # Safety
    /// `send` holds the elements `send_displs[r]..send_displs[r] + send_counts[r]` for every
    /// rank r, `recv` likewise for the receive arrays, as the [`Call`] docs say.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_to_allv(
        &self,
        send: DevicePtr,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: DevicePtr,
        recv_counts: &[usize],
        recv_displs: &[usize],
        dtype: DataType,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(send_counts.iter().sum(), dtype);
        let c = self.comm;
        self.dispatch(
            Collective::AllToAllv,
            bytes,
            dtype,
            None,
            // SAFETY: the caller's contract is the plan's.
            |h| unsafe {
                h.all_to_allv(
                    send,
                    send_counts,
                    send_displs,
                    recv,
                    recv_counts,
                    recv_displs,
                    dtype,
                    self.stream,
                )
            },
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            || unsafe {
                c.ccl.all_to_allv(
                    send,
                    send_counts,
                    send_displs,
                    recv,
                    recv_counts,
                    recv_displs,
                    dtype,
                    c.comm,
                    self.stream,
                )
            },
        )
    }

    /// Enqueues a send of `count` elements to `peer`. Between [`Communicator::group_start`]
    /// and [`Communicator::group_end`] (or inside [`Communicator::group`]) sends and receives
    /// are issued together, so any order of them cannot deadlock.
    ///
    /// # Safety
    /// `buf` holds `count` elements, as the [`Call`] docs say.
    pub unsafe fn send(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.p2p(Collective::Send, buf, count, dtype, peer) }
    }

    /// Enqueues a receive of `count` elements from `peer` (see [`Call::send`] for groups).
    ///
    /// # Safety
    /// `buf` holds `count` elements, as the [`Call`] docs say.
    pub unsafe fn recv(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<(), CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.p2p(Collective::Recv, buf, count, dtype, peer) }
    }

    /// A send or a receive (`op`): to a peer of another cluster through the bridge, to one of
    /// this cluster through the CCL by its cluster-local rank.
    ///
    /// # Safety
    /// As [`Call::send`].
    unsafe fn p2p(
        &self,
        op: Collective,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: usize,
    ) -> Result<(), CommError> {
        let bytes = bytes_of(count, dtype);
        let route = self.route(op, bytes, dtype, None);
        let _span = span(op, bytes, dtype, route);
        let c = self.comm;
        let global = peer;
        let mut peer = c.peer(peer)?;
        let mut route = route;
        if route == Route::Clusters {
            let h = self.hetero(op)?;
            let t = h.topology();
            let (cluster, local) = t.place[global];
            if cluster != t.my_cluster() {
                // SAFETY: the caller's contract is the bridge channel's.
                return Ok(unsafe {
                    if op == Collective::Send {
                        h.send(buf, bytes, global, self.stream)
                    } else {
                        h.recv(buf, bytes, global, self.stream)
                    }
                }?);
            }
            // A peer of this cluster: its CCL, by its cluster-local rank.
            peer = local as i32;
            route = Route::Ccl;
        }
        self.on_ccl(op, route, || {
            // SAFETY: this call's buffer contract (the module docs) is the CCL entry's.
            unsafe {
                if op == Collective::Send {
                    c.ccl.send(buf, count, dtype, peer, c.comm, self.stream)
                } else {
                    c.ccl.recv(buf, count, dtype, peer, c.comm, self.stream)
                }
            }
        })
    }

    /// Enqueues a barrier on the stream: work enqueued after it runs once every rank's stream
    /// has reached it. A one-word all-reduce on the CCL (or the window algorithms where the
    /// CCL has none); where neither can run, the route is [`Route::Store`]: the stream is
    /// synchronized and the ranks meet through the job's store, so the call returns only once
    /// every rank has arrived. Safe: the word is the communicator's own.
    pub fn barrier(&self) -> Result<(), CommError> {
        let dtype = DataType::F32;
        let route = self.route(Collective::Barrier, 4, dtype, Some(ReduceOp::SUM));
        let _span = span(Collective::Barrier, 4, dtype, route);
        let c = self.comm;
        if route == Route::Clusters {
            return Ok(self.hetero(Collective::Barrier)?.barrier(self.stream)?);
        }
        match route {
            Route::Store => {
                c.device.stream_synchronize(self.stream)?;
                c.host_barrier()
            }
            Route::Window(algo) => {
                let word = c.barrier_word()?;
                self.window_all_reduce(word, word, 1, dtype, ReduceOp::SUM, algo)
            }
            route => {
                let word = c.barrier_word()?;
                self.on_ccl(Collective::Barrier, route, || {
                    // SAFETY: the barrier word is the communicator's own, live until it drops.
                    unsafe {
                        c.ccl
                            .all_reduce(word, word, 1, dtype, ReduceOp::SUM, c.comm, self.stream)
                    }
                })
            }
        }
    }
}

/// [`ALL_GATHER_WINDOW_BELOW_ENV`](super::ALL_GATHER_WINDOW_BELOW_ENV), read once (`None`
/// when unset or not a number).
fn window_gather_below() -> Option<usize> {
    static BELOW: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *BELOW.get_or_init(|| {
        std::env::var(super::ALL_GATHER_WINDOW_BELOW_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
    })
}

/// The span of one collective, entered: op, bytes per rank, dtype and route (recorded only
/// where `debug` is enabled for `ferrocx::route`). `None` where it is not: a small call's path
/// then builds and moves no span at all.
#[inline]
fn span(
    op: Collective,
    bytes: usize,
    dtype: DataType,
    route: Route,
) -> Option<tracing::span::EnteredSpan> {
    if !tracing::enabled!(target: "ferrocx::route", tracing::Level::DEBUG) {
        return None;
    }
    Some(
        tracing::debug_span!(
            target: "ferrocx::route",
            "collective",
            op = op.name(),
            bytes,
            dtype = dtype.name().unwrap_or("unknown"),
            route = %route
        )
        .entered(),
    )
}
