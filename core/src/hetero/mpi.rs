//! The bridge across hosts: MPI (`[bridge] ccl = "mpi"`, or `auto` when the ranks are not all on
//! one host).
//!
//! Clusters on different hosts share no memory, so the shared-memory plan of [`super`] cannot
//! run. Here every rank of the job joins one more communicator of the `mpi` CCL adaptor, over
//! the whole job (global rank = its rank there), made when the job's communicator is made; each
//! collective across clusters is that communicator's collective of the same kind, enqueued on
//! the caller's stream, so it runs in stream order as a non-blocking MPI call driven by the
//! host device's stream worker (the calling thread only enqueues). The clusters' own CCLs take
//! no part in it. Every collective of the shared-memory bridge maps to one MPI collective:
//! all_reduce, reduce, broadcast, gather, all_gather, scatter, reduce_scatter, all_to_all(v),
//! barrier (a one-word all-reduce), and send/recv between ranks of different clusters (in a
//! group of the communicator's, started together with the cluster's own sends and receives: a
//! send and a receive that depend on each other must be grouped, as on any CCL). Every type
//! and reduce op of the ABI is taken (the adaptor reduces f16 and bf16 in f32).
//!
//! The MPI operations run on the host device's streams. Where the cluster's device is the
//! host device the `mpi` adaptor enqueues on (`device = "host"` with the built-in adaptor;
//! `device = "mpi"` with its plugin, which carries its own host device), the operation is
//! enqueued on the caller's stream itself, on the caller's buffers. On any other device (a GPU,
//! or memory the host cannot address) the call is **staged**: on the caller's stream, its
//! input is copied to a host staging buffer (pinned where the device allocates
//! `MemKind::PINNED`, grown to the largest call), a host function runs the MPI operation on a
//! stream of the host device and waits for it, and the output is copied back. Every rank runs
//! one MPI operation per call, staged or not (staging never cuts a call, so ranks of both
//! kinds agree; a staged buffer holds at most 2 GiB − 1 bytes). A staged send or receive runs
//! alone on the caller's stream (the group is not kept across the host function): it
//! completes once its peer has posted the matching operation. A call on another stream than
//! the previous call's is ordered after that one (every rank starts its MPI operations in the
//! same order).
//!
//! **Failures:** each MPI operation fails when its peers do not answer within `timeout_ms` (or
//! as soon as MPI reports a peer gone). To say *which* rank is gone, every rank keeps a
//! heartbeat in the job's store (a counter it bumps every `timeout_ms / 16`, 5 to 250 ms); the
//! first failure that reaches [`MpiBridge::explain`] watches the counters for three beats, and
//! a rank whose counter did not move is named, with its cluster. The MPI operations' own
//! deadline is `timeout_ms` less those beats, so the error comes within `timeout_ms`. When the store itself is unreachable, its
//! host (rank 0, unless the launcher hosts it) is named.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::abi::{Comm, DataType, DevicePtr, MemKind, ReduceOp, Stream};
use crate::adaptor::{AdaptorError, Ccl, Device};
use crate::bootstrap::{JobInfo, Store};
use crate::registry::Registry;
use crate::route::Collective;

use super::pool::EventPool;
use super::topo::Topology;
use super::{HeteroError, Staging};

/// The name of the CCL adaptor the bridge takes.
pub const ADAPTOR: &str = "mpi";

/// Intervals of the heartbeat a look at the counters waits for them to move.
const LOOK_INTERVALS: u32 = 3;

/// One rank's MPI bridge (see the module docs).
pub struct MpiBridge {
    topo: Topology,
    device: Device,
    mpi: Ccl,
    comm: Comm,
    /// `true` when the bridge's CCL is not the cluster's: groups are started on it too.
    own_group: bool,
    events: Mutex<EventPool>,
    /// The caller's stream of the latest call.
    last: Mutex<Option<Stream>>,
    /// One word of host memory the barrier all-reduces.
    word: DevicePtr,
    heart: Heartbeat,
    /// What [`MpiBridge::explain`] found, once it looked.
    explained: Mutex<Option<Option<HeteroError>>>,
    /// Where the cluster's device is not the host device the adaptor runs on.
    staged: Option<Staged>,
}

/// A device whose buffers the MPI operations cannot take (not the host device the `mpi`
/// adaptor enqueues on): each call is staged through host memory on the caller's stream, its
/// MPI operation run on a stream of the host device by a host function of the caller's
/// stream, which waits for it.
struct Staged {
    /// The host device the adaptor enqueues on, and its stream for the bridge.
    host: Device,
    stream: Stream,
    /// The input and output staging buffers, grown to the largest call so far; the smaller
    /// ones they replaced stay until the bridge goes (work in flight may still use them).
    buffers: Mutex<(Option<Staging>, Option<Staging>, Vec<Staging>)>,
    /// The first failure of a staged operation (later ones are skipped).
    failed: Arc<Mutex<Option<HeteroError>>>,
}

/// An MPI operation on staging buffers: (adaptor, communicator, host stream, input, output).
type StagedOp =
    Box<dyn FnOnce(&Ccl, Comm, Stream, DevicePtr, DevicePtr) -> Result<(), AdaptorError> + Send>;

impl MpiBridge {
    /// The `mpi` CCL adaptor, or an error naming why it is missing.
    fn adaptor(registry: &Registry) -> Result<Ccl, HeteroError> {
        let entry = registry.ccl(ADAPTOR).ok_or_else(|| {
            HeteroError::Bridge(format!(
                "the bridge between hosts needs the `{ADAPTOR}` CCL adaptor, which is not \
                 available: {}",
                registry.why_missing(ADAPTOR)
            ))
        })?;
        Ok(entry.ccl().expect("ccl() checked the table"))
    }

    /// Opens MPI (`MPI_Init_thread`, through the `mpi` adaptor's `init`; nothing if it is open
    /// already): every rank of the job calls it at the same point of the communicator's
    /// making, before its cluster's CCL is initialised. Where the cluster's CCL is the `mpi`
    /// adaptor itself, its options (`library`, `abi`, `thread_level`) apply; elsewhere
    /// `FERROCX_MPI_LIBRARY` or the adaptor's search. An error names the libraries tried.
    pub fn open(
        registry: &Registry,
        cluster_ccl: &Ccl,
        cluster_options: &[(String, String)],
    ) -> Result<(), HeteroError> {
        let mpi = Self::adaptor(registry)?;
        let own = std::ptr::eq(cluster_ccl.tables().root.get(), mpi.tables().root.get());
        mpi.init_with(if own { cluster_options } else { &[] })
            .map_err(|e| HeteroError::Bridge(format!("the MPI bridge could not open MPI: {e}")))
    }

    /// Makes this rank's MPI bridge: the `mpi` CCL's communicator over every rank of the job
    /// (collective: every rank of the job calls it, in the same communicator order). `device`
    /// is the cluster's device; `seq` the communicator's number (names its store keys).
    #[allow(clippy::too_many_arguments)]
    pub fn make(
        topo: Topology,
        device: Device,
        cluster_ccl: &Ccl,
        local_device: i32,
        registry: &Registry,
        store: &Store,
        job: &JobInfo,
        seq: u64,
        timeout_ms: u64,
    ) -> Result<MpiBridge, HeteroError> {
        let mpi = Self::adaptor(registry)?;
        // The host device the adaptor enqueues on: its plugin's own, else the built-in one.
        let host = registry
            .ccl(ADAPTOR)
            .and_then(|e| e.device())
            .or_else(|| registry.device("host").and_then(|e| e.device()));
        let same = host
            .as_ref()
            .is_some_and(|h| std::ptr::eq(h.tables().root.get(), device.tables().root.get()));
        let staged = if same {
            None
        } else {
            let host = host.ok_or_else(|| {
                HeteroError::Bridge(format!(
                    "the MPI bridge stages the buffers of device `{}` through the host device, \
                     which is not available",
                    device.name()
                ))
            })?;
            host.init(&[])?;
            let stream = host.stream_create()?;
            Some(Staged {
                host,
                stream,
                buffers: Mutex::new((None, None, Vec::new())),
                failed: Arc::new(Mutex::new(None)),
            })
        };
        // Opened already by [`MpiBridge::open`] (idempotent).
        Self::open(registry, cluster_ccl, &[])?;
        let me = topo.me;
        let world = topo.world();
        let key = format!("ferrocx/unique_id/{seq}/bridge");
        let uid = if me == 0 {
            let id = mpi.unique_id()?;
            store.broadcast(&key, true, Some(&id))
        } else {
            store.broadcast(&key, false, None)
        }
        .map_err(|e| HeteroError::Bridge(format!("the MPI bridge's id: {e}")))?;
        // A failed operation is followed by a look at the heartbeats (at most
        // `LOOK_INTERVALS` intervals): the operations' own deadline leaves room for it, so
        // that the error naming the dead rank comes within `timeout_ms`.
        let timeout = Duration::from_millis(timeout_ms);
        let interval = Heartbeat::interval(timeout);
        let op_ms = timeout_ms.saturating_sub((interval * (LOOK_INTERVALS + 1)).as_millis() as u64);
        let comm = mpi.comm_init_rank(
            me as i32,
            world as i32,
            local_device,
            &uid,
            op_ms.max(timeout_ms / 2).max(1),
            &[],
        )?;
        let word_device = staged.as_ref().map_or(&device, |st| &st.host);
        let word = match word_device.mem_alloc(4, MemKind::DEVICE) {
            Ok(w) => w,
            Err(e) => {
                let _ = mpi.comm_destroy(comm);
                return Err(e.into());
            }
        };
        let heart = Heartbeat::start(store.addr(), &job.token, seq, me, world, timeout);
        let own_group = !std::ptr::eq(cluster_ccl.tables().root.get(), mpi.tables().root.get());
        tracing::debug!(world, "bridge over MPI ready");
        Ok(MpiBridge {
            topo,
            device,
            mpi,
            comm,
            own_group,
            events: Mutex::new(EventPool::default()),
            last: Mutex::new(None),
            word,
            heart,
            explained: Mutex::new(None),
            staged,
        })
    }

    /// The clusters and this rank's place.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// Streams the bridge made: none (it enqueues on its callers' streams).
    pub fn streams_made(&self) -> usize {
        0
    }

    /// Events made so far.
    pub fn events_made(&self) -> usize {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).made()
    }

    /// Orders work enqueued on `to` from now on after the work enqueued on `from` so far.
    fn order(&self, from: Stream, to: Stream) -> Result<(), HeteroError> {
        let mut pool = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let e = pool.take(&self.device)?;
        if let Err(err) = self.device.event_record(e, from) {
            pool.unused(e);
            return Err(err.into());
        }
        pool.recorded(e);
        Ok(self.device.stream_wait_event(to, e)?)
    }

    /// Starts a collective on `stream`, after the previous one whatever its stream (every rank
    /// starts its MPI collectives in the same order).
    fn begin(&self, stream: Stream) -> Result<(), HeteroError> {
        let last = self
            .last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(stream);
        match last {
            Some(l) if l != stream => self.order(l, stream),
            _ => Ok(()),
        }
    }

    fn root(&self, root: usize) -> Result<i32, HeteroError> {
        let w = self.topo.world();
        if root >= w {
            return Err(HeteroError::Unsupported(format!(
                "root {root} is not a rank of this {w}-rank job"
            )));
        }
        Ok(root as i32)
    }

    /// Enqueues `op` on the host device's stream for a staged call, on `stream`: `copy_in`
    /// (device buffer, bytes) is copied to the input staging buffer before it, the output
    /// staging buffer to `copy_out` after it; the buffers hold `in_bytes` and `out_bytes`.
    ///
    /// # Safety
    /// `copy_in` and `copy_out` are valid ranges of the call's buffers (the buffer contract of
    /// [`crate::comm::Call`]); `op` touches the staging buffers within those sizes only.
    #[allow(clippy::too_many_arguments)]
    unsafe fn stage(
        &self,
        st: &Staged,
        stream: Stream,
        copy_in: Option<(DevicePtr, usize)>,
        in_bytes: usize,
        copy_out: Option<(DevicePtr, usize)>,
        out_bytes: usize,
        op: StagedOp,
    ) -> Result<(), HeteroError> {
        let most = in_bytes.max(out_bytes);
        if most > i32::MAX as usize {
            return Err(HeteroError::Unsupported(format!(
                "a staged call of {most} bytes exceeds MPI's int count ({}): the MPI bridge \
                 stages at most that many bytes per buffer",
                i32::MAX
            )));
        }
        self.begin(stream)?;
        st.check()?;
        let (input, output) = st.ensure(&self.device, in_bytes, out_bytes);
        if let Some((src, n)) = copy_in.filter(|c| c.1 > 0) {
            // SAFETY: the call's range (this function's contract) into the input buffer of at
            // least `in_bytes >= n`, which earlier calls' work on this stream (or on the
            // previous call's stream, ordered by `begin`) has finished with.
            unsafe { self.device.mem_copy_async(input, src, n, stream) }?;
        }
        let (mpi, comm, hs, host, failed) = (
            self.mpi.clone(),
            self.comm,
            st.stream,
            st.host.clone(),
            st.failed.clone(),
        );
        self.host_func(
            stream,
            Box::new(move || {
                if failed.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                    return;
                }
                let r =
                    op(&mpi, comm, hs, input, output).and_then(|()| host.stream_synchronize(hs));
                if let Err(e) = r {
                    tracing::error!("the MPI bridge's staged operation failed: {e}");
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(HeteroError::Adaptor(e));
                }
            }),
        )?;
        if let Some((dst, n)) = copy_out.filter(|c| c.1 > 0) {
            // SAFETY: as above, from the output buffer of at least `out_bytes >= n`, written
            // by the operation the host function above waited for.
            unsafe { self.device.mem_copy_async(dst, output, n, stream) }?;
        }
        Ok(())
    }

    /// Enqueues `f` as a host function on `stream` (of the cluster's device).
    fn host_func(&self, stream: Stream, f: Box<dyn FnOnce() + Send>) -> Result<(), HeteroError> {
        let launch = self
            .device
            .tables()
            .root
            .get()
            .launch_host_func
            .ok_or_else(|| {
                HeteroError::Unsupported(format!(
                    "the device adaptor `{}` has no launch_host_func: the MPI bridge's staged \
                     operations need it",
                    self.device.name()
                ))
            })?;
        let user = Box::into_raw(Box::new(f)).cast::<c_void>();
        // SAFETY: a stream of this device, a function of the `HostFn` type, and a pointer the
        // function takes back exactly once.
        let status = unsafe { launch(stream, Some(run_boxed), user) };
        if status.is_success() {
            return Ok(());
        }
        // SAFETY: refused, so the function never runs: the box is still ours.
        drop(unsafe { Box::from_raw(user.cast::<Box<dyn FnOnce() + Send>>()) });
        Err(HeteroError::Bridge(format!(
            "{}: launch_host_func failed with {status}",
            self.device.name()
        )))
    }

    /// `true` when the cluster's buffers are staged through host memory.
    pub fn staged(&self) -> bool {
        self.staged.is_some()
    }

    /// The failure of a staged operation already run, if one (naming a dead rank where the
    /// heartbeats show one: see [`MpiBridge::explain`]).
    pub fn check(&self) -> Result<(), HeteroError> {
        match &self.staged {
            Some(st) => st.check().map_err(|e| self.explain().unwrap_or(e)),
            None => Ok(()),
        }
    }

    /// Enqueues the all-reduce on `stream`.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        if let Some(st) = &self.staged {
            let b = count * elem(dtype)?;
            // SAFETY: `send` and `recv` hold `count` elements (the contract); the operation
            // reads and writes as many in the staging buffers.
            return unsafe {
                self.stage(
                    st,
                    stream,
                    Some((send, b)),
                    b,
                    Some((recv, b)),
                    b,
                    Box::new(move |m, c, hs, i, o| m.all_reduce(i, o, count, dtype, op, c, hs)),
                )
            };
        }
        self.begin(stream)?;
        // SAFETY: this function's contract is the entry's.
        Ok(unsafe {
            self.mpi
                .all_reduce(send, recv, count, dtype, op, self.comm, stream)
        }?)
    }

    /// Enqueues a reduce to `root` on `stream`.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        let r = self.root(root)?;
        if let Some(st) = &self.staged {
            let b = count * elem(dtype)?;
            let out = (self.topo.me == root).then_some((recv, b));
            // SAFETY: as in `all_reduce` (`recv` only at the root).
            return unsafe {
                self.stage(
                    st,
                    stream,
                    Some((send, b)),
                    b,
                    out,
                    b,
                    Box::new(move |m, c, hs, i, o| m.reduce(i, o, count, dtype, op, r, c, hs)),
                )
            };
        }
        self.begin(stream)?;
        // SAFETY: this function's contract is the entry's.
        Ok(unsafe {
            self.mpi
                .reduce(send, recv, count, dtype, op, r, self.comm, stream)
        }?)
    }

    /// Enqueues a broadcast from `root` on `stream`.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        let r = self.root(root)?;
        if let Some(st) = &self.staged {
            let b = count * elem(dtype)?;
            let input = (self.topo.me == root).then_some((send, b));
            // SAFETY: `send` (at the root) and `recv` hold `count` elements; the broadcast
            // runs in place in the input buffer, copied out of it.
            return unsafe {
                self.stage(
                    st,
                    stream,
                    input,
                    b,
                    None,
                    0,
                    Box::new(move |m, c, hs, i, _| m.broadcast(i, i, count, dtype, r, c, hs)),
                )
                .and_then(|()| self.copy_back(st, stream, recv, b, true))
            };
        }
        self.begin(stream)?;
        // SAFETY: this function's contract is the entry's.
        Ok(unsafe {
            self.mpi
                .broadcast(send, recv, count, dtype, r, self.comm, stream)
        }?)
    }

    /// Copies `bytes` of the input (`input`) or output staging buffer to `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` holds `bytes` (the call's buffer contract); the staging buffer was sized for
    /// them by the call's [`MpiBridge::stage`] just before.
    unsafe fn copy_back(
        &self,
        st: &Staged,
        stream: Stream,
        dst: DevicePtr,
        bytes: usize,
        input: bool,
    ) -> Result<(), HeteroError> {
        if bytes == 0 {
            return Ok(());
        }
        let (i, o) = st.ensure(&self.device, 0, 0);
        // SAFETY: this function's contract.
        Ok(unsafe {
            self.device
                .mem_copy_async(dst, if input { i } else { o }, bytes, stream)
        }?)
    }

    /// Enqueues an all-gather (`root` None) or a gather to `root` on `stream`.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: Option<usize>,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        let r = root.map(|r| self.root(r)).transpose()?;
        if let Some(st) = &self.staged {
            let b = count * elem(dtype)?;
            let all = b * self.topo.world();
            let out = (root.is_none() || root == Some(self.topo.me)).then_some((recv, all));
            // SAFETY: `send` holds one block, `recv` one per rank where it is written.
            return unsafe {
                self.stage(
                    st,
                    stream,
                    Some((send, b)),
                    b,
                    out,
                    all,
                    Box::new(move |m, c, hs, i, o| match r {
                        None => m.all_gather(i, o, count, dtype, c, hs),
                        Some(r) => m.gather(i, o, count, dtype, r, c, hs),
                    }),
                )
            };
        }
        self.begin(stream)?;
        // SAFETY: this function's contract is the entries'.
        Ok(unsafe {
            match r {
                None => self
                    .mpi
                    .all_gather(send, recv, count, dtype, self.comm, stream),
                Some(r) => self
                    .mpi
                    .gather(send, recv, count, dtype, r, self.comm, stream),
            }
        }?)
    }

    /// Enqueues a reduce-scatter (`op` Some), an all-to-all or a scatter from `root`; `count`
    /// elements per block.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn exchange(
        &self,
        kind: Collective,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
        root: Option<usize>,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        let r = root.map(|r| self.root(r)).transpose()?;
        let (c, s) = (self.comm, stream);
        let b = count * elem(dtype)?;
        let all = b * self.topo.world();
        let me = self.topo.me;
        // (bytes copied in, bytes the output holds, the operation)
        let (input, out, run): (Option<usize>, usize, StagedOp) = match (kind, op, r) {
            (Collective::ReduceScatter, Some(op), _) => (
                Some(all),
                b,
                // SAFETY: the staging buffers hold the sizes `stage` is given with the op.
                Box::new(move |m, c, hs, i, o| unsafe {
                    m.reduce_scatter(i, o, count, dtype, op, c, hs)
                }),
            ),
            (Collective::AllToAll, _, _) => (
                Some(all),
                all,
                // SAFETY: as above.
                Box::new(move |m, c, hs, i, o| unsafe { m.all_to_all(i, o, count, dtype, c, hs) }),
            ),
            (Collective::Scatter, _, Some(r)) => (
                (me == r as usize).then_some(all),
                b,
                // SAFETY: as above.
                Box::new(move |m, c, hs, i, o| unsafe { m.scatter(i, o, count, dtype, r, c, hs) }),
            ),
            (k, _, _) => {
                return Err(HeteroError::Unsupported(format!(
                    "{k} is not a block exchange of the MPI bridge"
                )))
            }
        };
        if let Some(st) = &self.staged {
            // SAFETY: `send` holds a block per rank (at the root, for a scatter) and `recv`
            // one (per rank for an all-to-all), by the contract.
            return unsafe {
                self.stage(
                    st,
                    stream,
                    input.map(|n| (send, n)),
                    all,
                    Some((recv, out)),
                    out,
                    run,
                )
            };
        }
        self.begin(stream)?;
        // SAFETY: this function's contract is the entries'.
        Ok(unsafe {
            match (kind, op, r) {
                (Collective::ReduceScatter, Some(op), _) => {
                    self.mpi.reduce_scatter(send, recv, count, dtype, op, c, s)
                }
                (Collective::AllToAll, _, _) => self.mpi.all_to_all(send, recv, count, dtype, c, s),
                (_, _, r) => {
                    self.mpi
                        .scatter(send, recv, count, dtype, r.unwrap_or_default(), c, s)
                }
            }
        }?)
    }

    /// Enqueues an all-to-all with per-peer counts and displacements on `stream`.
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
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
        stream: Stream,
    ) -> Result<(), HeteroError> {
        if let Some(st) = &self.staged {
            let es = elem(dtype)?;
            let extent = |c: &[usize], d: &[usize]| {
                c.iter()
                    .zip(d)
                    .filter(|(n, _)| **n > 0)
                    .map(|(n, d)| (n + d) * es)
                    .max()
                    .unwrap_or(0)
            };
            let (ib, ob) = (
                extent(send_counts, send_displs),
                extent(recv_counts, recv_displs),
            );
            let v = [
                send_counts.to_vec(),
                send_displs.to_vec(),
                recv_counts.to_vec(),
                recv_displs.to_vec(),
            ];
            // SAFETY: the buffers hold their counts at their displacements (the contract):
            // the staging buffers hold the same extents, at the same displacements.
            return unsafe {
                self.stage(
                    st,
                    stream,
                    Some((send, ib)),
                    ib,
                    Some((recv, ob)),
                    ob,
                    Box::new(move |m, c, hs, i, o| {
                        m.all_to_allv(i, &v[0], &v[1], o, &v[2], &v[3], dtype, c, hs)
                    }),
                )
            };
        }
        self.begin(stream)?;
        // SAFETY: this function's contract is the entry's.
        Ok(unsafe {
            self.mpi.all_to_allv(
                send,
                send_counts,
                send_displs,
                recv,
                recv_counts,
                recv_displs,
                dtype,
                self.comm,
                stream,
            )
        }?)
    }

    /// Enqueues a barrier of every rank of the job on `stream`.
    pub fn barrier(&self, stream: Stream) -> Result<(), HeteroError> {
        let word = self.word;
        if let Some(st) = &self.staged {
            // SAFETY: nothing copied; the word is the bridge's own host memory.
            return unsafe {
                self.stage(
                    st,
                    stream,
                    None,
                    0,
                    None,
                    0,
                    Box::new(move |m, c, hs, _, _| {
                        m.all_reduce(word, word, 1, DataType::F32, ReduceOp::SUM, c, hs)
                    }),
                )
            };
        }
        self.begin(stream)?;
        // SAFETY: the bridge's own word, live until it drops (after its streams drained);
        // barriers are ordered one after the other by `begin`.
        Ok(unsafe {
            self.mpi.all_reduce(
                word,
                word,
                1,
                DataType::F32,
                ReduceOp::SUM,
                self.comm,
                stream,
            )
        }?)
    }

    /// Enqueues a send of `bytes` at `buf` to rank `peer` (of another cluster) on `stream` (a
    /// send and a receive that depend on each other must be in one group, as on the CCL;
    /// from a staged device, each runs alone: see the module docs).
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn send(
        &self,
        buf: DevicePtr,
        bytes: usize,
        peer: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        // SAFETY: this function's contract.
        unsafe { self.p2p(buf, bytes, peer, stream, true) }
    }

    /// Enqueues a receive of `bytes` at `buf` from rank `peer` (of another cluster) on
    /// `stream` (see [`MpiBridge::send`] for groups).
    ///
    /// # Safety
    /// The buffer contract of [`crate::comm::Call`].
    pub unsafe fn recv(
        &self,
        buf: DevicePtr,
        bytes: usize,
        peer: usize,
        stream: Stream,
    ) -> Result<(), HeteroError> {
        // SAFETY: this function's contract.
        unsafe { self.p2p(buf, bytes, peer, stream, false) }
    }

    /// # Safety
    /// `buf` holds `bytes` (the call's buffer contract).
    unsafe fn p2p(
        &self,
        buf: DevicePtr,
        bytes: usize,
        peer: usize,
        stream: Stream,
        send: bool,
    ) -> Result<(), HeteroError> {
        let peer = self.root(peer)?;
        if let Some(st) = &self.staged {
            let op: StagedOp = if send {
                // SAFETY: the input buffer holds `bytes` (the size `stage` is given).
                Box::new(move |m, c, hs, i, _| unsafe {
                    m.send(i, bytes, DataType::U8, peer, c, hs)
                })
            } else {
                // SAFETY: the output buffer holds `bytes` (the size `stage` is given).
                Box::new(move |m, c, hs, _, o| unsafe {
                    m.recv(o, bytes, DataType::U8, peer, c, hs)
                })
            };
            let (input, output) = if send {
                (Some((buf, bytes)), None)
            } else {
                (None, Some((buf, bytes)))
            };
            // SAFETY: `buf` holds `bytes` (this function's contract).
            return unsafe { self.stage(st, stream, input, bytes, output, bytes, op) };
        }
        // SAFETY: this function's contract, `bytes` bytes at `buf`.
        Ok(unsafe {
            if send {
                self.mpi
                    .send(buf, bytes, DataType::U8, peer, self.comm, stream)
            } else {
                self.mpi
                    .recv(buf, bytes, DataType::U8, peer, self.comm, stream)
            }
        }?)
    }

    /// Starts a group on the bridge's CCL where it is not the cluster's (whose group the
    /// communicator starts): sends and receives across clusters in a group are started
    /// together with the others.
    pub fn group_start(&self) -> Result<(), HeteroError> {
        if self.own_group {
            self.mpi.group_start()?;
        }
        Ok(())
    }

    /// Ends the group [`MpiBridge::group_start`] started.
    pub fn group_end(&self) -> Result<(), HeteroError> {
        if self.own_group {
            self.mpi.group_end()?;
        }
        Ok(())
    }

    /// Nothing to wait for: the bridge enqueues on its callers' streams.
    pub fn drain(&self) -> Result<(), crate::adaptor::AdaptorError> {
        Ok(())
    }

    /// Why an operation failed, as precisely as the bridge can tell: a rank of the job whose
    /// heartbeat stopped (or the store's host, when the store is gone). `None` when every
    /// rank is alive (the operation's own error says more). Looks once (a fraction of
    /// `timeout_ms`); later calls return the same answer.
    pub fn explain(&self) -> Option<HeteroError> {
        let mut seen = self.explained.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &*seen {
            return e.clone();
        }
        let found = self.heart.dead().map(|(rank, why)| HeteroError::Died {
            rank,
            cluster: self.topo.cluster_name_of(rank).to_string(),
            what: format!("a collective over MPI ({why})"),
        });
        *seen = Some(found.clone());
        found
    }
}

impl Drop for MpiBridge {
    fn drop(&mut self) {
        let _ = self.drain();
        self.heart.stop();
        let _ = self.mpi.comm_destroy(self.comm);
        // Staged work runs on the host stream, waited for by the callers' streams (which the
        // communicator synchronized before its bridge is dropped).
        let word_device = self.staged.as_ref().map_or(&self.device, |st| &st.host);
        // SAFETY: the bridge's word, unused once the callers' streams drained.
        let _ = unsafe { word_device.mem_free(self.word, MemKind::DEVICE) };
        if let Some(mut st) = self.staged.take() {
            st.release(&self.device);
        }
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .destroy(&self.device);
    }
}

impl Staged {
    /// The failure of a staged operation, if one ran and failed.
    fn check(&self) -> Result<(), HeteroError> {
        match self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The input and output buffers, grown (doubling, pinned where `device` allocates it) to
    /// hold `input` and `output` bytes.
    fn ensure(&self, device: &Device, input: usize, output: usize) -> (DevicePtr, DevicePtr) {
        let mut b = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let (i, o, retired) = &mut *b;
        for (slot, need) in [(i, input), (o, output)] {
            let have = slot.as_ref().map_or(0, |s| s.slot_bytes);
            if need > have || slot.is_none() {
                let bytes = need.max(2 * have).max(4096).div_ceil(64) * 64;
                if let Some(old) = slot.replace(Staging::new(device, 1, bytes)) {
                    retired.push(old);
                }
            }
        }
        let at = |s: &Option<Staging>| DevicePtr(s.as_ref().map_or(0, |s| s.slot(0)));
        (at(&b.0), at(&b.1))
    }

    /// Frees the buffers (the streams that used them are drained).
    fn release(&mut self, device: &Device) {
        let b = self.buffers.get_mut().unwrap_or_else(|p| p.into_inner());
        for s in b.0.iter_mut().chain(b.1.iter_mut()).chain(b.2.iter_mut()) {
            s.free(device);
        }
        let _ = self.host.stream_destroy(self.stream);
    }
}

/// Runs a boxed closure [`MpiBridge::host_func`] queued, on the stream's thread.
unsafe extern "C" fn run_boxed(user: *mut c_void) {
    // SAFETY: `user` is the box `host_func` leaked; the adaptor calls this once.
    let f = unsafe { Box::from_raw(user.cast::<Box<dyn FnOnce() + Send>>()) };
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        tracing::error!("a staged operation of the MPI bridge panicked");
    }
}

fn elem(dtype: DataType) -> Result<usize, HeteroError> {
    super::elem(dtype)
}

/// This rank's heartbeat in the job's store, and the look at everyone's that names a dead rank.
struct Heartbeat {
    addr: std::net::SocketAddr,
    token: String,
    seq: u64,
    me: usize,
    world: usize,
    interval: Duration,
    stop: Arc<(Mutex<bool>, Condvar)>,
    /// Set when the thread could not reach the store.
    lost: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    fn key(seq: u64, r: usize) -> String {
        format!("ferrocx/bridge/{seq}/alive/{r}")
    }

    /// How often a rank bumps its counter: `timeout / 16`, 5 ms to 250 ms.
    fn interval(timeout: Duration) -> Duration {
        (timeout / 16).clamp(Duration::from_millis(5), Duration::from_millis(250))
    }

    /// Starts the thread that bumps this rank's counter every [`Heartbeat::interval`].
    fn start(
        addr: std::net::SocketAddr,
        token: &str,
        seq: u64,
        me: usize,
        world: usize,
        timeout: Duration,
    ) -> Heartbeat {
        let interval = Heartbeat::interval(timeout);
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let lost = Arc::new(AtomicBool::new(false));
        let thread = {
            let (token, stop, lost) = (token.to_string(), stop.clone(), lost.clone());
            std::thread::Builder::new()
                .name("ferrocx-heartbeat".into())
                .spawn(move || {
                    let Ok(store) = Store::connect(addr, &token, timeout) else {
                        lost.store(true, Ordering::Release);
                        return;
                    };
                    let key = Heartbeat::key(seq, me);
                    let (flag, cv) = &*stop;
                    let mut stopped = flag.lock().unwrap_or_else(|p| p.into_inner());
                    let mut n = 0u64;
                    while !*stopped {
                        n += 1;
                        if store.set(&key, n.to_string().as_bytes()).is_err() {
                            lost.store(true, Ordering::Release);
                            return;
                        }
                        stopped = cv
                            .wait_timeout(stopped, interval)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                })
                .ok()
        };
        Heartbeat {
            addr,
            token: token.to_string(),
            seq,
            me,
            world,
            interval,
            stop,
            lost,
            thread,
        }
    }

    fn stop(&mut self) {
        *self.stop.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// The first rank whose counter does not move over [`LOOK_INTERVALS`] intervals, with
    /// why; `None` when all move (or the store could not tell: a read that fails is no move).
    fn dead(&self) -> Option<(usize, &'static str)> {
        let store_host = || {
            // The launcher's store outlives the ranks; otherwise rank 0 hosts it.
            let hosted = std::env::var("FERROCX_STORE_HOSTED").is_ok_and(|v| v.trim() == "1");
            (!hosted && self.me != 0).then_some((0, "the job's store, which it hosts, is gone"))
        };
        if self.lost.load(Ordering::Acquire) {
            return store_host();
        }
        let Ok(store) = Store::connect(self.addr, &self.token, self.interval * 4) else {
            return store_host();
        };
        // A counter's value (`None`: not set yet); `Err` when the store did not answer, which
        // says nothing about the rank (a first read that failed and a later one that answered
        // must not count as a move).
        let read = |r: usize| -> Result<Option<Vec<u8>>, ()> {
            let k = Heartbeat::key(self.seq, r);
            match store.check(&[&k]) {
                Ok(true) => store.get(&k).map(Some).map_err(|_| ()),
                Ok(false) => Ok(None),
                Err(_) => Err(()),
            }
        };
        let others: Vec<usize> = (0..self.world).filter(|&r| r != self.me).collect();
        // Per rank: its first value read and when, and whether it moved since.
        let mut first: Vec<Option<(Option<Vec<u8>>, Instant)>> = vec![None; others.len()];
        let mut moved = vec![false; others.len()];
        let watch = self.interval * LOOK_INTERVALS;
        // A rank is dead when its counter stood still for `watch` since it was first read; the
        // look lasts `watch`, one interval more for a rank whose first read came late (the
        // operations' deadline leaves `LOOK_INTERVALS + 1` intervals of the timeout for it).
        let start = Instant::now();
        let watched = |f: &Option<(Option<Vec<u8>>, Instant)>| {
            f.as_ref().is_some_and(|(_, at)| at.elapsed() >= watch)
        };
        loop {
            for (i, &r) in others.iter().enumerate() {
                if moved[i] {
                    continue;
                }
                if let Ok(v) = read(r) {
                    match &first[i] {
                        None => first[i] = Some((v, Instant::now())),
                        Some((was, _)) if *was != v => moved[i] = true,
                        Some(_) => {}
                    }
                }
            }
            let settled = (0..others.len()).all(|i| moved[i] || watched(&first[i]));
            if settled || start.elapsed() >= watch + self.interval {
                break;
            }
            std::thread::sleep(self.interval / 2);
        }
        others
            .iter()
            .enumerate()
            .find(|&(i, _)| !moved[i] && watched(&first[i]))
            .map(|(_, &r)| (r, "its heartbeat in the job's store stopped"))
    }
}
