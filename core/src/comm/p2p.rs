//! All-gather as coalesced point-to-point transfers on a few streams of the communicator, each
//! slice's arrival an event, so that a consumer (a matmul of a tensor-parallel layer) starts on
//! slice `j` while the other slices are still on the wire: [`Call::all_gather_p2p`]. On the
//! CCL (the window routes below move the bytes otherwise, on the same streams and events):
//!
//! ```text
//! caller's stream ──record──► start
//!                               │ every stream below waits for it
//! stream (rank mod S):  copy own slice ──record──► event[rank]
//! stream (j mod S):     group { recv slice j from j; send own slice to j } ──record──► event[j]
//!                       (peers in the order of a round-robin tournament: in round k every
//!                        rank's peer has this rank as its round-k peer)
//! ```
//!
//! By default every exchange of the call forms **one group** on one stream (the CCL drives
//! every link at once; the peers' slices' events fire together, this rank's own slice first);
//! `FERROCX_P2P_ROUNDS_PER_GROUP=g` ([`ROUNDS_PER_GROUP_ENV`]) makes a group of every `g`
//! consecutive rounds instead (`1`: one exchange a group, in the tournament's order, as
//! drawn above), so that a consumer starts on a peer's slice while later rounds are still on
//! the wire.
//!
//! # Why the tournament order
//!
//! A CCL runs the operations of one communicator in the order each rank issued them, whatever
//! streams they are on (NCCL does; the host CCL does by its tickets). Were rank `r` to take
//! its peers in the order `r+1, r+2, ...`, on three ranks rank 0 would exchange with 1 while 1
//! exchanged with 2 and 2 with 0: a cycle, which deadlocks as soon as a message outgrows the
//! CCL's buffers. In the circle method's rounds every rank's partner has the rank as its own
//! partner, so each exchange finds its counterpart at the same step on the peer, whatever the
//! world size (an odd world has one rank idle per round). Each exchange is one group of a
//! receive and a send on the same link, so both directions of every link carry data at once.
//!
//! # Routes
//!
//! The call asks the communicator's [`Router`](crate::route::Router)
//! ([`Router::all_gather_p2p`](crate::route::Router::all_gather_p2p)) and logs its choice in
//! the `collective` span (`op="all_gather_p2p"`):
//!
//! - [`Route::Ccl`]: the CCL's `send` and `recv` in groups (`group_start`/`group_end`); when
//!   the router chose it (nothing forced) for an output below [`WHOLE_BELOW_ENV`] (4 MiB),
//!   the CCL's `all_gather` in one call instead, every slice's event after it (so for the
//!   window-copies route the router would choose); without a hook ([`Call::all_gather_p2p`])
//!   that event is recorded only when the handle is first asked for a slice or a wait (on the
//!   call's stream, then after whatever the caller enqueued there since): a caller that only
//!   orders its stream after the gather ([`AllGatherP2p::join`]) costs the stream one
//!   operation less per call;
//! - [`Route::Window`] (shown as `window(one-shot)`): the window collectives' all-gather
//!   ([`WindowCollectives::all_gather`](crate::window::collectives::WindowCollectives::all_gather))
//!   in one call on the call's stream, every slice's event after it as on the whole path: each
//!   rank's input pushed into a slot of every peer's scratch window, then copied out (on CUDA
//!   one kernel). The router takes it, for a gather it would otherwise take whole or on the
//!   CCL's send/recv, where a window provider runs on the device, each rank's input fits a
//!   chunk slot of the scratch window, and the whole output is below the provider's measured
//!   reach (see [`Call::all_gather`]: the cluster's `small_message`, the provider's measured
//!   `Measured::all_gather_below`, [`ALL_GATHER_WINDOW_BELOW_ENV`](super::ALL_GATHER_WINDOW_BELOW_ENV)):
//!   on 2 GPUs every size it takes (1.4–2.1× NCCL's all_gather from 1 to 16 MiB on 2 H200),
//!   on 4 below 12 MiB of output, elsewhere none yet. A gather with a hook (its consumers overlap the
//!   slices) takes it only below [`WHOLE_BELOW_ENV`]. Forced with `via(Route::Window(_))`
//!   anywhere a provider runs; a rank's input past the chunk slot is then refused, naming the
//!   limit. The first window call of a communicator registers its scratch window: every rank
//!   decides alike (size, device, provider), so that step is collective as it must be;
//! - [`Route::WindowReads`], where the CCL has no point-to-point and the device's memory is
//!   host-addressable with host functions (the host device): each rank copies its slice into
//!   a staging window of the communicator and publishes it with a round number; the copy of
//!   slice `j` is a host function on stream `j mod S` that waits for rank `j`'s round, reads
//!   its staging memory directly and acknowledges it, so rank `j` overwrites its staging only
//!   once every peer has read it. The staging window is registered at the first such call and
//!   again (larger) when a call needs more: collective, the same on every rank;
//! - [`Route::WindowCopies`], where the device has the memops group (stream-ordered 32-bit
//!   stores and waits) and memory it exports to peers, and is not host-addressable (a GPU),
//!   when [`COPIES_ENV`] is `1` (opt-in, see there) or, on 2 ranks, the output lies in a
//!   window ([`Call::output_window`]: pushes, no opt-in); forced anywhere it runs (the host
//!   device too): the bytes
//!   move by the device's copy engines (`mem_copy_async`), no kernel of the transfer takes
//!   SMs from a consumer pipelined with it (NCCL's send/recv kernels do). Protocol below;
//! - [`Route::Clusters`] (a job across clusters): the cross-cluster plan's all-gather on the
//!   caller's stream; every slice's event fires when the whole gather is done.
//!
//! # The window-copies protocol
//!
//! Each rank has a staging window of the communicator (registered at the first such call,
//! again larger when a call needs more: collective, the same on every rank), mapped into every
//! peer: signal words, then two data areas, the *parities* of the calls' rounds (call `e`, the
//! same number on every rank, uses parity `e % 2`, so a rank fills one while its peers still
//! copy out of the other). Every signal word is written by one rank, in stream order, with the
//! memops store (release), and waited on only by the rank that holds it (a local wait; the
//! stores cross to the peers), with the memops wait (GEQ, wrapping 32-bit rounds):
//!
//! ```text
//! stream (rank mod S):  wait ack[q][e%2] >= e-2 for every peer q   (all have copied round e-2
//!                       copy send -> my staging[e%2]                out of this parity)
//!                       store ready[me][e%2] = e in every peer q
//!                       copy send -> my slice of recv ──record──► event[rank]
//! stream (j mod S):     wait ready[j][e%2] >= e                    (rank j staged round e)
//!                       copy peer j's staging[e%2] -> slice j of recv
//!                       store ack[me][e%2] = e in peer j ──record──► event[j]
//! ```
//!
//! Peers in tournament order, as on the CCL. Nothing blocks the calling thread; the data
//! crosses once (a copy engine reading the peer's memory), plus one local copy into the
//! staging. A word per parity keeps every word monotonic whatever streams the calls use.
//! A zero-byte call moves nothing and signals nothing (every rank alike).
//!
//! **Into an output window** ([`Call::output_window`]: the output `recv` lies in a window
//! registered on every rank, at the same offset): no staging. Each rank pushes its input
//! straight into every peer's output by the copy engines, on one of the communicator's
//! 4 push streams (peer `q` on stream `q mod 4`, whatever `streams` says, so a
//! rank's signal words to a peer land in order), cut into pieces when [`Call::pieces`] asks:
//!
//! ```text
//! push stream (q mod 4): store clear[me] = e in peer q          (my output is free, round e)
//!                        wait clear[q] >= e                     (q's output is free)
//!                        copy send piece k -> q's output, slice me, piece k
//!                        store put[me] = e << 12 | k + 1 in q    (after every piece)
//! stream (rank mod S):   copy send -> my slice of recv (unless in place) ──record──► event[me]
//! stream (j mod S):      wait put[j] >= e << 12 | k + 1 ──record──► piece k's event
//! ```
//!
//! The data crosses once and nothing else copies it: a pipelined consumer (a matmul) never
//! waits behind a staging copy, which on a GPU is a kernel of its own. The words are the
//! staging window's (its signal lines); a `clear` per peer keeps a rank from writing an output
//! its owner may still read (the owner frees it in stream order, when the call is reached).
//!
//! **Waits and failures.** The memops waits have no deadline of their own (neither CUDA's
//! `cuStreamWaitValue32` nor the host device's): a rank that never makes a call its peers made
//! holds their streams, and whatever is ordered after them. [`AllGatherP2p::synchronize`] and
//! [`AllGatherP2p::synchronize_slice`] bound the wait by the communicator's timeout: past it
//! they fail the communicator's point-to-point all-gathers with an error naming the slice and
//! *release* this rank's streams (the host sets every signal word they wait on), so nothing
//! ordered after them hangs; the teardown and a staging that grows do the same. A caller
//! that only synchronizes the communicator's stream after [`AllGatherP2p::wait_all`] waits
//! without that bound.
//!
//! **Graphs.** The window routes number each call's round when it is enqueued: a graph
//! captured from one call would replay that call's rounds (and its host functions) at every
//! launch, which the protocol cannot tell from a new call. Do not capture them; force
//! [`Route::Ccl`] ([`Call::via`]) for an all-gather inside a capture (NCCL's send/recv are
//! capturable). Nothing here can see a capture the caller started outside ferrocx.
//!
//! **On a GPU** the staging and its words are the window's device memory (the symmetric heap:
//! VMM memory exported to the peers and mapped into each), the copies `cuMemcpyAsync` between
//! peers (copy engines over NVLink), the stores and waits `cuStreamWriteValue32` /
//! `cuStreamWaitValue32` on those device addresses (the local word for waits, the peer's mapped
//! word for stores). A driver that refuses a memop address fails the call that enqueues it
//! with the driver's error.
//!
//! The streams are the communicator's, made at the first call that needs them and kept; the
//! events come from a pool of the communicator and go back when the handle
//! ([`AllGatherP2p`]) drops.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::abi::{Capabilities, DataType, DevicePtr, Event, Status, Stream, WAIT_VALUE_GEQ};
use crate::adaptor::{AdaptorError, Device};
use crate::route::Route;
use crate::window::collectives::Scratch;
use crate::window::Window;

use super::{Call, CommError, Communicator};

/// Streams an all-gather uses unless the caller says otherwise: two, so that one slice's
/// transfer overlaps the consumer of the one before.
pub const DEFAULT_P2P_STREAMS: usize = 2;

/// Environment variable: an all-gather whose whole output is below this many bytes
/// ([`DEFAULT_WHOLE_BELOW`] unless set; `0` never) takes the CCL's `all_gather` in one call
/// where the router chose the route (nothing forced), every slice's event after it. Read once
/// per process.
pub const WHOLE_BELOW_ENV: &str = "FERROCX_P2P_WHOLE_BELOW";

/// Below 4 MiB of output the CCL's one all-gather wins: on 2 H200 NCCL's all_gather of 1 MiB
/// took 12–13 µs against 26 for the grouped send/recv with their streams and events and 21–23
/// for the pushes into an output window, and a gather that short hides nothing from a
/// consumer pipelined with it; from 4 MiB both were level or ahead (1.0–1.2).
pub const DEFAULT_WHOLE_BELOW: usize = 4 << 20;

/// [`WHOLE_BELOW_ENV`], read once.
fn whole_below() -> usize {
    static BELOW: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BELOW.get_or_init(|| {
        std::env::var(WHOLE_BELOW_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_WHOLE_BELOW)
    })
}

/// Bytes between the staging window's signal words (one cache line each).
const LINE: usize = 64;

/// Environment variable: `1` lets the router choose [`Route::WindowCopies`] where the device
/// runs it; unset or anything else keeps the CCL's send/recv (the route can still be forced
/// with [`Call::via`]). Opt-in: on 4 H100 its bus bandwidth was 0.66–0.73× NCCL's all_gather
/// (the copy engines' pulls over NVLink), against 0.95–1.0 for NCCL's send/recv; on 2 H100 it
/// was level (0.98–1.13) and the overlap with a matmul alike. Read once per process.
pub const COPIES_ENV: &str = "FERROCX_P2P_COPIES";

/// Peers of `rank` in the order of the exchanges, one per round of a round-robin tournament
/// over `world` ranks (the circle method): in round `k`, rank `r`'s peer `p` has `r` as its own
/// round-`k` peer. Every other rank appears once; on an odd world one round of each rank has
/// no peer and is left out.
pub fn schedule(world: usize, rank: usize) -> Vec<usize> {
    rounds(world, rank).into_iter().flatten().collect()
}

/// Environment variable: rounds of the tournament whose exchanges go into one group of the
/// CCL's point-to-point calls; `0` or unset: every round in one group. A CCL runs one
/// communicator's groups one after another, so one exchange per group moves data over one
/// link at a time, while one group of every exchange lets the CCL drive every link at once;
/// the slices of a group arrive together (one event for all of them), so fewer rounds per group
/// let a consumer start on a peer's slice before the others arrive.
///
/// Measured on 4 H100 (NVLink, NCCL 2.28, 64 MiB gathered): one round a group moved 0.60x
/// NCCL's all_gather bus bandwidth, two 0.77x, every round 0.94-1.01x, and pipelining a
/// matmul of the slices gained nothing with any of them (the transfers and the matmul share
/// the SMs); hence the default.
pub const ROUNDS_PER_GROUP_ENV: &str = "FERROCX_P2P_ROUNDS_PER_GROUP";

/// Rounds per group of this process: [`ROUNDS_PER_GROUP_ENV`], else every round.
fn rounds_per_group() -> usize {
    std::env::var(ROUNDS_PER_GROUP_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&g| g > 0)
        .unwrap_or(usize::MAX)
}

/// The tournament of [`schedule`] round by round: `rounds(world, rank)[k]` is `rank`'s peer in
/// round `k`, `None` in its bye round (odd worlds). Every rank has the same number of rounds, so
/// rounds cut into groups alike on every rank keep each exchange's two ends in the same group.
pub fn rounds(world: usize, rank: usize) -> Vec<Option<usize>> {
    if world < 2 || rank >= world {
        return Vec::new();
    }
    // An even number of players; with an odd world, player `world` is the bye.
    let players = world + world % 2;
    let fixed = players - 1;
    let mut peers = Vec::with_capacity(world - 1);
    for round in 0..fixed {
        let peer = if rank == fixed {
            round
        } else {
            let p = (2 * round + fixed - rank % fixed) % fixed;
            if p == rank {
                fixed
            } else {
                p
            }
        };
        peers.push((peer < world).then_some(peer));
    }
    peers
}

/// A per-slice hook of [`Call::all_gather_p2p_each`].
type SliceHook<'h> = dyn FnMut(&Slice) -> Result<(), CommError> + 'h;

/// One slice of an all-gather's output: where it lies, the stream that fills it and the event
/// that fires once it is in place.
#[derive(Clone, Copy, Debug)]
pub struct Slice {
    /// The rank the slice comes from (its index in the output).
    pub rank: usize,
    /// Its address: `recv + rank * count` elements.
    pub ptr: DevicePtr,
    /// Its elements.
    pub count: usize,
    /// The communicator's stream that fills it (stream `rank mod S`).
    pub stream: Stream,
    /// Recorded on `stream` right after the slice is in place (a short gather without a hook:
    /// when the handle first hands out a slice or waits, see the module docs). It belongs to the
    /// [`AllGatherP2p`] handle: once the handle drops, a later call may record it again (waits
    /// enqueued before then still see this call's record).
    pub event: Event,
}

/// An all-gather in flight ([`Call::all_gather_p2p`]): a [`Slice`] per rank, each with the
/// event of its arrival. Dropping it hands the events back to the communicator's pool (waits
/// already enqueued on them still see this call's records); it does not wait for anything.
pub struct AllGatherP2p<'a> {
    comm: &'a Communicator,
    slices: Vec<Slice>,
    order: Vec<usize>,
    route: Route,
    /// The events of the pieces before each slice's last ([`Call::pieces`]).
    pieces: Vec<Event>,
    /// A gather in one collective whose (shared) event is not recorded yet: the stream to
    /// record it on when somebody first asks for a slice or waits (see [`AllGatherP2p::new`]'s
    /// callers: the short gather nobody hooked).
    unrecorded: Cell<Option<Stream>>,
}

impl<'a> AllGatherP2p<'a> {
    /// A handle over `recv` (`bytes` a slice, `count` elements), slice `r` filled on the stream
    /// and recorded in the event `at(r)` gives; nothing issued yet.
    fn new(
        comm: &'a Communicator,
        route: Route,
        recv: DevicePtr,
        bytes: usize,
        count: usize,
        at: impl Fn(usize) -> (Stream, Event),
    ) -> AllGatherP2p<'a> {
        let world = comm.world;
        AllGatherP2p {
            comm,
            slices: (0..world)
                .map(|r| {
                    let (stream, event) = at(r);
                    Slice {
                        rank: r,
                        ptr: DevicePtr(recv.0 + (r * bytes) as u64),
                        count,
                        stream,
                        event,
                    }
                })
                .collect(),
            order: Vec::with_capacity(world),
            route,
            pieces: Vec::new(),
            unrecorded: Cell::new(None),
        }
    }

    /// Records the slices' shared event now if the call left it for later; a failure is the
    /// communicator's transfer failure (reported by every later call and synchronize).
    fn recorded(&self) -> Result<(), CommError> {
        if let Some(stream) = self.unrecorded.take() {
            if let Err(e) = self.comm.device.event_record(self.slices[0].event, stream) {
                let e = CommError::from(e);
                self.comm
                    .p2p
                    .failure
                    .set(format!("all_gather_p2p: recording its event: {e}"));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Slice `rank` (panics when `rank` is not below the world size).
    pub fn slice(&self, rank: usize) -> Slice {
        let _ = self.recorded();
        self.slices[rank]
    }

    /// Every slice, by rank.
    pub fn slices(&self) -> &[Slice] {
        let _ = self.recorded();
        &self.slices
    }

    /// The ranks in the order their slices were issued (this rank's own first, then its peers
    /// in tournament order): the order in which they arrive when the streams run alike.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The route the call took.
    pub fn route(&self) -> Route {
        self.route
    }

    /// Orders work enqueued on `stream` from now on after slice `rank`'s arrival.
    pub fn wait_slice(&self, rank: usize, stream: Stream) -> Result<(), CommError> {
        self.recorded()?;
        let s = self.get(rank)?;
        Ok(self.comm.device.stream_wait_event(stream, s.event)?)
    }

    /// Orders work enqueued on `stream` from now on after every slice's arrival.
    pub fn wait_all(&self, stream: Stream) -> Result<(), CommError> {
        self.recorded()?;
        for s in &self.slices {
            self.comm.device.stream_wait_event(stream, s.event)?;
        }
        Ok(())
    }

    /// Orders work enqueued on `stream` from now on after everything enqueued so far on the
    /// slices' streams: the transfers, and the work a consumer put after them there (what
    /// [`Call::all_gather_p2p_each`]'s hook enqueued).
    pub fn join(&self, stream: Stream) -> Result<(), CommError> {
        let mut used: Vec<Stream> = self.slices.iter().map(|s| s.stream).collect();
        used.sort_unstable_by_key(|s| s.0 as usize);
        used.dedup();
        used.retain(|&s| s != stream);
        let p2p = &self.comm.p2p;
        let events = p2p.take(used.len())?;
        let joined = used.iter().zip(&events).try_for_each(|(&s, &e)| {
            self.comm.device.event_record(e, s)?;
            self.comm.device.stream_wait_event(stream, e)
        });
        // Every wait on them is enqueued: they may be recorded again.
        p2p.give_back(&events);
        Ok(joined?)
    }

    /// Blocks until slice `rank` is in place; reports a failure of the transfers. On
    /// [`Route::WindowCopies`] the wait is bounded by the communicator's timeout (see
    /// [`AllGatherP2p::synchronize`]).
    pub fn synchronize_slice(&self, rank: usize) -> Result<(), CommError> {
        self.recorded()?;
        let s = *self.get(rank)?;
        let deadline = Instant::now() + self.comm.timeout();
        self.settle(&s, deadline)?;
        self.comm.p2p.failure.check()
    }

    /// Blocks until every slice is in place; reports a failure of the transfers.
    ///
    /// On [`Route::WindowCopies`], whose streams wait for the peers' signals with no deadline
    /// of their own, the wait is bounded by the communicator's timeout: a slice that has not
    /// arrived by then (its rank never published it, or a peer never acknowledged a previous
    /// round) fails the point-to-point all-gathers of the communicator with an error naming
    /// the slice, and this rank's streams are released (its signal words set from the host) so
    /// that nothing enqueued on them waits forever; data that arrives after that is not to be
    /// trusted, and every later call fails.
    pub fn synchronize(&self) -> Result<(), CommError> {
        self.recorded()?;
        let deadline = Instant::now() + self.comm.timeout();
        for s in &self.slices {
            self.settle(s, deadline)?;
        }
        self.comm.p2p.failure.check()
    }

    /// Waits for `s`'s event: unbounded, except on the window-copies route (until
    /// `deadline`, then the communicator's transfers are failed and released).
    fn settle(&self, s: &Slice, deadline: Instant) -> Result<(), CommError> {
        let c = self.comm;
        if self.route != Route::WindowCopies {
            c.device.event_synchronize(s.event)?;
            return Ok(());
        }
        if wait_event(&c.device, s.event, deadline)? {
            return Ok(());
        }
        let me = c.rank;
        c.p2p.release_copies(format!(
            "all_gather_p2p (window-copies): rank {me} did not get slice {} within {:?} (rank \
             {} did not publish it, or a peer did not acknowledge an earlier round: every rank \
             must make the same calls); the transfers of this communicator are released and \
             fail from now on",
            s.rank,
            c.timeout(),
            s.rank
        ));
        c.device.event_synchronize(s.event)?;
        c.p2p.failure.check()
    }

    fn get(&self, rank: usize) -> Result<&Slice, CommError> {
        self.slices.get(rank).ok_or_else(|| {
            CommError::PointToPoint(format!(
                "slice {rank} requested of an all-gather over {} ranks",
                self.slices.len()
            ))
        })
    }
}

impl Drop for AllGatherP2p<'_> {
    fn drop(&mut self) {
        // Each event once (the slices of one collective share theirs).
        let mut events: Vec<Event> = self.slices.iter().map(|s| s.event).collect();
        events.sort_unstable_by_key(|e| e.0 as usize);
        events.dedup();
        self.comm.p2p.give_back(&events);
        self.comm.p2p.give_back(&self.pieces);
    }
}

/// The first failure of a transfer run on a stream (a window read whose peer never published);
/// later calls and [`AllGatherP2p::synchronize`] report it.
#[derive(Default)]
pub(super) struct Failure {
    failed: AtomicBool,
    message: Mutex<Option<String>>,
}

impl Failure {
    fn set(&self, message: String) {
        let mut m = self.message.lock().unwrap_or_else(|p| p.into_inner());
        if m.is_none() {
            *m = Some(message);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn is_set(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    pub(super) fn check(&self) -> Result<(), CommError> {
        if !self.is_set() {
            return Ok(());
        }
        let m = self.message.lock().unwrap_or_else(|p| p.into_inner());
        Err(CommError::PointToPoint(
            m.clone()
                .unwrap_or_else(|| "an earlier transfer failed".into()),
        ))
    }
}

/// The staging window of the window-reads route.
struct Staging {
    scratch: Scratch,
    /// Bytes of data each rank's staging holds (after the signal lines).
    capacity: usize,
    /// The round of the last call (every rank's calls are numbered alike).
    round: u64,
    /// Every rank's staging memory, as this process addresses it.
    peers: Vec<u64>,
}

/// The staging window of the window-copies route: per rank, signal words, then two areas
/// of `capacity` bytes (the parities of the rounds). See [`CopyLayout`].
struct CopyStaging {
    scratch: Scratch,
    layout: CopyLayout,
    /// The round of the last call, wrapping (every rank's calls are numbered alike; the
    /// memops' GEQ compares wrapping 32-bit values, as CUDA does).
    round: u32,
    /// The round of the last call that pushed into an output window, counted apart (the
    /// staging's parities see only the calls that use them).
    push_round: u32,
    /// Every rank's staging memory, as this process (and its device) addresses it.
    peers: Vec<u64>,
    /// The device's memory is the host's: the host writes the words itself when it releases
    /// them (else through a device copy).
    host: bool,
}

/// Where things lie in a rank's window-copies staging (byte offsets from its start), a
/// signal word a cache line apart from the next, `p` the parity of a round (`round % 2`):
///
/// ```text
/// ready[j][p] at LINE * (2j + p)            round rank j put in its parity p (written by j)
/// ack[q][p]   at LINE * (2 world + 2q + p)  round of this rank's parity p that rank q has
///                                           copied out (written by q)
/// clear[q]    at LINE * (4 world + q)       pushes into an output window: the last round
///                                           whose output rank q has freed (written by q)
/// put[j]      at LINE * (5 world + j)       pushes: rank j's last piece pushed into this
///                                           rank's output, `round << 12 | piece + 1`
/// data        at LINE * 6 world             parity 0, then parity 1 at + capacity
/// ```
///
/// A word per parity keeps every word monotonic whatever streams write it: a rank's rounds
/// `e` and `e + 1` may be published (or copied) on different streams and land in either
/// order, but round `e + 2` of a parity is written only after every peer saw round `e` there.
#[derive(Clone, Copy, Debug)]
struct CopyLayout {
    world: usize,
    capacity: usize,
}

impl CopyLayout {
    fn ready(self, j: usize, round: u32) -> usize {
        LINE * (2 * j + (round % 2) as usize)
    }
    fn ack(self, q: usize, round: u32) -> usize {
        LINE * (2 * self.world + 2 * q + (round % 2) as usize)
    }
    fn clear(self, q: usize) -> usize {
        LINE * (4 * self.world + q)
    }
    fn put(self, j: usize) -> usize {
        LINE * (5 * self.world + j)
    }
    fn data(self, round: u32) -> usize {
        LINE * 6 * self.world + (round % 2) as usize * self.capacity
    }
    fn bytes(self) -> usize {
        LINE * 6 * self.world + 2 * self.capacity
    }
}

/// Bits of a `put` word below the round: a pushed slice is cut into at most `2^12 - 1`
/// pieces, each signalled with its number (from 1).
const PIECE_BITS: u32 = 12;

/// Most pieces a pushed slice is cut into.
const MOST_PIECES: usize = (1 << PIECE_BITS) - 1;

/// The `put` word's value once piece `k` (from 0) of round `round` is pushed. Wrapping, like
/// the rounds: consecutive rounds' values stay far closer than 2^31 apart.
fn put_value(round: u32, k: usize) -> u32 {
    round.wrapping_shl(PIECE_BITS) | (k as u32 + 1).min(MOST_PIECES as u32)
}

/// Streams the pushes into output windows take: the push to peer `q` always goes on stream
/// `q mod PUSH_STREAMS`, so the signal words one rank writes into another's staging land in
/// the order they were written, whatever `streams` each call passes.
const PUSH_STREAMS: usize = 4;

/// What the point-to-point all-gathers of a communicator keep between calls.
pub(super) struct P2pState {
    device: Device,
    /// The device this rank works on (made current before a stream or event is made).
    index: i32,
    /// The communicator's deadline of a wait on a peer.
    timeout: Duration,
    streams: Mutex<Vec<Stream>>,
    /// The streams of the pushes into output windows ([`PUSH_STREAMS`], made at the first).
    push: Mutex<Vec<Stream>>,
    events: Mutex<Vec<Event>>,
    staging: Mutex<Option<Staging>>,
    copies: Mutex<Option<CopyStaging>>,
    pub(super) failure: Arc<Failure>,
    /// What the device runs, asked once (every call's route depends on it).
    runs: std::sync::OnceLock<Runs>,
}

/// The routes the communicator's device runs ([`P2pState::runs`]).
#[derive(Clone, Copy, Debug)]
struct Runs {
    /// [`reads_run_on`].
    reads: bool,
    /// [`copies_run_on`].
    copies: bool,
    /// [`copies_chosen_on`].
    copies_chosen: bool,
    /// [`pushes_chosen_on`].
    pushes_chosen: bool,
}

impl P2pState {
    pub(super) fn new(device: Device, index: i32, timeout: Duration) -> P2pState {
        P2pState {
            device,
            index,
            timeout,
            streams: Mutex::new(Vec::new()),
            push: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            staging: Mutex::new(None),
            copies: Mutex::new(None),
            failure: Arc::new(Failure::default()),
            runs: std::sync::OnceLock::new(),
        }
    }

    /// What the device runs, asked at the first call (the communicator's device is current
    /// then, as at every call).
    fn runs(&self) -> Runs {
        *self.runs.get_or_init(|| Runs {
            reads: reads_run_on(&self.device),
            copies: copies_run_on(&self.device),
            copies_chosen: copies_chosen_on(&self.device),
            pushes_chosen: pushes_chosen_on(&self.device),
        })
    }

    /// Fails the transfers with `why` and sets every signal word of this rank's window-copies
    /// staging that its streams wait on (every peer's `ready` and `ack`) to the last round, so
    /// that nothing enqueued on them waits any longer.
    fn release_copies(&self, why: String) {
        self.failure.set(why);
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = copies.as_mut() {
            c.release(&self.device);
        }
    }

    /// Waits for every stream, up to the timeout where window-copies waits may hold them
    /// (then releases them as [`AllGatherP2p::synchronize`] does) before the plain drain.
    fn drain_bounded(&self, copies: Option<&mut CopyStaging>) -> Result<(), AdaptorError> {
        if let Some(c) = copies {
            let deadline = Instant::now() + self.timeout;
            let streams = self.all_streams();
            let mut done = true;
            for &s in &streams {
                if !wait_stream(&self.device, s, deadline)? {
                    done = false;
                    break;
                }
            }
            if !done {
                self.failure.set(format!(
                    "all_gather_p2p (window-copies): the transfers did not end within {:?} (a \
                     peer did not publish or acknowledge a round: every rank must make the same \
                     calls); they are released and fail from now on",
                    self.timeout
                ));
                c.release(&self.device);
            }
        }
        self.drain()
    }

    /// The first `n` streams, made where missing.
    fn streams(&self, n: usize) -> Result<Vec<Stream>, AdaptorError> {
        let mut s = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() < n {
            self.device.set_device(self.index)?;
        }
        while s.len() < n {
            s.push(self.device.stream_create()?);
        }
        Ok(s[..n].to_vec())
    }

    /// The [`PUSH_STREAMS`] streams of the pushes, made at the first call.
    fn push_streams(&self) -> Result<Vec<Stream>, AdaptorError> {
        let mut s = self.push.lock().unwrap_or_else(|p| p.into_inner());
        if s.is_empty() {
            self.device.set_device(self.index)?;
            while s.len() < PUSH_STREAMS {
                s.push(self.device.stream_create()?);
            }
        }
        Ok(s.clone())
    }

    /// Every stream made so far: the slices' and the pushes'.
    fn all_streams(&self) -> Vec<Stream> {
        let mut all = self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        all.extend(self.push.lock().unwrap_or_else(|p| p.into_inner()).iter());
        all
    }

    /// `n` events from the pool, made where missing.
    fn take(&self, n: usize) -> Result<Vec<Event>, AdaptorError> {
        let mut pool = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match pool.pop() {
                Some(e) => out.push(e),
                None => match self
                    .device
                    .set_device(self.index)
                    .and_then(|()| self.device.event_create(1))
                {
                    Ok(e) => out.push(e),
                    Err(err) => {
                        pool.extend(out);
                        return Err(err);
                    }
                },
            }
        }
        Ok(out)
    }

    fn give_back(&self, events: &[Event]) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(events);
    }

    /// Waits for every stream (teardown, and before the staging window is replaced).
    fn drain(&self) -> Result<(), AdaptorError> {
        let mut first = Ok(());
        for s in self.all_streams() {
            let r = self.device.stream_synchronize(s);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Drains the streams, then releases the staging window, the events and the streams
    /// (before the communicator's CCL communicator goes).
    pub(super) fn teardown(&self) {
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let drained = self.drain_bounded(copies.as_mut());
        if let Some(c) = copies.take() {
            if drained.is_err() {
                // A stream that failed to drain may still use it: leaked rather than
                // unmapped under it.
                std::mem::forget(c.scratch);
            }
        }
        drop(copies);
        drop(
            self.staging
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        for e in self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = self.device.event_destroy(e);
        }
        for s in self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .chain(
                self.push
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .drain(..),
            )
        {
            let _ = self.device.stream_destroy(s);
        }
    }
}

/// Enqueues `work` on `stream` of `device` as a host function: it runs once, in stream order,
/// on the stream's worker (the host device) or a thread of the runtime (CUDA). A CPU kernel
/// in stream order, ordered with the device's work by events like any other.
pub fn launch_host(
    device: &Device,
    stream: Stream,
    work: impl FnOnce() + Send + 'static,
) -> Result<(), CommError> {
    type Work = Box<dyn FnOnce() + Send>;
    unsafe extern "C" fn run(user: *mut c_void) {
        // SAFETY: `user` is the box `launch_host` leaked for this one call.
        let work = unsafe { Box::from_raw(user.cast::<Work>()) };
        // A panic must not unwind into the adaptor's worker.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
    }
    let f = device.tables().root.get().launch_host_func.ok_or_else(|| {
        CommError::PointToPoint(format!(
            "the device adaptor `{}` has no launch_host_func",
            device.name()
        ))
    })?;
    let boxed: Box<Work> = Box::new(Box::new(work));
    let user = Box::into_raw(boxed).cast::<c_void>();
    // SAFETY: a stream of this device, a function of the `HostFn` type, and a pointer the
    // function takes back exactly once.
    let status = unsafe { f(stream, Some(run), user) };
    if status.is_success() {
        return Ok(());
    }
    // SAFETY: refused, so the function never runs: the box is still ours.
    drop(unsafe { Box::from_raw(user.cast::<Work>()) });
    Err(CommError::PointToPoint(format!(
        "{}: launch_host_func failed with {status}",
        device.name()
    )))
}

impl CopyStaging {
    /// Sets every word this rank's streams wait on (every peer's `ready`, `ack`, `clear` and
    /// `put` in this rank's staging) to the last round, from the host.
    fn release(&mut self, device: &Device) {
        let base = self.scratch.ptr().0;
        let round = self.round;
        let world = self.layout.world;
        for q in 0..world {
            let words = [round, round.wrapping_sub(1)]
                .map(|r| [self.layout.ready(q, r), self.layout.ack(q, r)]);
            let pushed = [
                (self.layout.clear(q), self.push_round),
                (
                    self.layout.put(q),
                    put_value(self.push_round, MOST_PIECES - 1),
                ),
            ];
            for (off, value) in words
                .into_iter()
                .flatten()
                .map(|off| (off, round))
                .chain(pushed)
            {
                let addr = base + off as u64;
                if self.host {
                    // SAFETY: a 4-aligned signal word of this rank's live staging, which the
                    // host addresses; streams and peers touch it only with 32-bit atomics.
                    let w = unsafe { &*(addr as *const AtomicU32) };
                    w.store(value, Ordering::Release);
                    crate::futex::wake(w);
                } else {
                    // SAFETY: 4 bytes of this rank's live staging (device memory) from a local
                    // value; the streams only wait on the word (a device copy of the host's
                    // value is the way the host writes device memory).
                    let _ = unsafe {
                        device.mem_copy(DevicePtr(addr), DevicePtr(&value as *const u32 as u64), 4)
                    };
                }
            }
        }
    }
}

/// Waits for `event` until `deadline`: `Ok(false)` when it has not completed by then. Polls
/// the event (spinning, then yielding, then sleeping in short steps); without `event_query`,
/// an unbounded `event_synchronize`.
fn wait_event(device: &Device, event: Event, deadline: Instant) -> Result<bool, AdaptorError> {
    let Some(query) = device.tables().root.get().event_query else {
        device.event_synchronize(event)?;
        return Ok(true);
    };
    poll(deadline, || {
        // SAFETY: an event of this device, alive while the handle holds it.
        match unsafe { query(event) } {
            Status::SUCCESS => Some(Ok(())),
            Status::NOT_READY => None,
            // The failure, named by the adaptor.
            _ => Some(device.event_synchronize(event)),
        }
    })
}

/// Waits for everything on `stream` until `deadline`, as [`wait_event`].
fn wait_stream(device: &Device, stream: Stream, deadline: Instant) -> Result<bool, AdaptorError> {
    poll(deadline, || match device.stream_query(stream) {
        Ok(true) => Some(Ok(())),
        Ok(false) => None,
        Err(e) => Some(Err(e)),
    })
}

/// Calls `done` until it answers or `deadline` passes (`Ok(false)`).
fn poll(
    deadline: Instant,
    mut done: impl FnMut() -> Option<Result<(), AdaptorError>>,
) -> Result<bool, AdaptorError> {
    let mut tries = 0u32;
    loop {
        if let Some(r) = done() {
            return r.map(|()| true);
        }
        tries += 1;
        if tries < 64 {
            std::hint::spin_loop();
        } else if tries < 256 {
            std::thread::yield_now();
        } else {
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// `true` where the window-copies route can run: the memops group, and memory the device
/// exports to peers (IPC handles or VMM).
fn copies_run_on(device: &Device) -> bool {
    device.has_memops()
        && capabilities(device)
            .is_some_and(|c| c.contains(Capabilities::IPC) || c.contains(Capabilities::VMM))
}

/// `true` where the router may choose the window-copies route: it runs there, the device is
/// not host-addressable (a host device's streams copy with its own threads: no SMs to spare),
/// and [`COPIES_ENV`] is not `0`.
fn copies_chosen_on(device: &Device) -> bool {
    copies_run_on(device)
        && !capabilities(device).is_some_and(|c| c.contains(Capabilities::HOST_ADDRESSABLE))
        && copies_allowed()
}

/// `true` where the router takes the window-copies route into an output window
/// ([`Call::output_window`]) on 2 ranks: it runs there and the device is not
/// host-addressable. No opt-in there: the pushes need no staging copy, nothing of them takes
/// SMs, and on 2 H200 they were 1.37–1.47× NCCL's all_gather from 16 MiB. On more ranks the
/// router leaves them (opt-in as the copies): on 4 H200 they were 0.65–0.79× from 4 MiB, the
/// copy engines pushing to three peers at once.
fn pushes_chosen_on(device: &Device) -> bool {
    copies_run_on(device)
        && !capabilities(device).is_some_and(|c| c.contains(Capabilities::HOST_ADDRESSABLE))
}

/// Every rank's output of `bytes` at `recv` inside `window`, as this process addresses it:
/// the same offset from each rank's window (the contract of [`Call::output_window`]).
fn outputs_in(
    window: &Window,
    recv: DevicePtr,
    bytes: usize,
    world: usize,
) -> Result<Vec<u64>, CommError> {
    let base = window.local().0;
    let offset = recv.0.checked_sub(base).filter(|&off| {
        (off as usize)
            .checked_add(bytes)
            .is_some_and(|end| end <= window.size())
    });
    let Some(offset) = offset else {
        return Err(CommError::PointToPoint(format!(
            "all_gather_p2p: the output ({bytes} bytes at {:#x}) does not lie in the output \
             window ({} bytes at {base:#x})",
            recv.0,
            window.size()
        )));
    };
    (0..world)
        .map(|q| {
            window.peer(q).map(|p| p.0 + offset).ok_or_else(|| {
                CommError::PointToPoint(format!(
                    "all_gather_p2p: the output window ({} window) has no address of rank {q}: \
                     pushes need a window of peer addresses over {world} ranks (register it \
                     with WindowFlags::PEERS: a CCL's own windows have none)",
                    window.kind()
                ))
            })
        })
        .collect()
}

/// [`COPIES_ENV`] is not `0` (read once per process).
fn copies_allowed() -> bool {
    static ALLOWED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOWED.get_or_init(|| std::env::var(COPIES_ENV).is_ok_and(|v| v.trim() == "1"))
}

/// The capabilities of the current device.
fn capabilities(device: &Device) -> Option<Capabilities> {
    let caps = device.caps();
    device
        .get_device()
        .ok()
        .and_then(|d| caps.ordinal(d).map(|o| o.capabilities()))
}

/// `true` where the window-reads route can run: memory the process addresses, and host
/// functions on streams.
fn reads_run_on(device: &Device) -> bool {
    let caps = device.caps();
    device
        .get_device()
        .ok()
        .and_then(|d| caps.ordinal(d).map(|o| o.capabilities()))
        .is_some_and(|c| c.contains(Capabilities::HOST_ADDRESSABLE | Capabilities::HOST_FUNC))
}

/// Waits until the word at `addr` reaches `value`, up to `deadline`: spins, yields, then
/// sleeps in short steps.
fn wait_word(addr: u64, value: u64, deadline: Instant) -> bool {
    // SAFETY: `addr` is an 8-byte aligned signal word of a live staging window (the caller
    // holds the window until its streams drain), written only atomically.
    let word = unsafe { &*(addr as *const AtomicU64) };
    let mut spins = 0u32;
    loop {
        if word.load(Ordering::Acquire) >= value {
            return true;
        }
        spins += 1;
        if spins < 256 {
            std::hint::spin_loop();
        } else if spins < 512 {
            std::thread::yield_now();
        } else {
            if Instant::now() >= deadline {
                return word.load(Ordering::Acquire) >= value;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

impl Communicator {
    /// Enqueues an all-gather as point-to-point transfers on `streams` streams of the
    /// communicator, after the work enqueued so far on the communicator's stream (see
    /// [`Call::all_gather_p2p`]).
    ///
    /// # Safety
    /// As [`Call::all_gather_p2p`].
    pub unsafe fn all_gather_p2p(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        streams: usize,
    ) -> Result<AllGatherP2p<'_>, CommError> {
        // SAFETY: the caller's contract is the call's.
        unsafe {
            self.call()
                .all_gather_p2p(send, recv, send_count, dtype, streams)
        }
    }
}

impl<'a> Call<'a> {
    /// Enqueues `recv[r * send_count..]` = rank r's `send`, as one transfer per peer `j` on
    /// the communicator's stream `j mod streams` (a grouped receive and send on the CCL, a copy
    /// out of the peer's staging window on the window routes) and a device copy of this
    /// rank's own slice, all after the work enqueued so far on this call's stream (see the
    /// [module docs](self) for the order and the routes). Returns at once with
    /// the event of each slice's arrival: a consumer waits for slice `j` alone
    /// ([`AllGatherP2p::wait_slice`]) and starts before the other slices arrive. Nothing is
    /// ordered back onto this call's stream: use [`AllGatherP2p::wait_all`] for that.
    ///
    /// `streams` is at least 1 ([`DEFAULT_P2P_STREAMS`] is a good start); collective: every
    /// rank calls it with the same `send_count` and `dtype`.
    ///
    /// # Safety
    /// `send` holds `send_count` elements and `recv` `world * send_count` under the buffer
    /// contract of every collective ([`Call::all_gather`]), until every slice's event has
    /// fired; `send` may be this rank's slice of `recv` (in place).
    pub unsafe fn all_gather_p2p(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        streams: usize,
    ) -> Result<AllGatherP2p<'a>, CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.gather_p2p(send, recv, send_count, dtype, streams, None) }
    }

    /// As [`Call::all_gather_p2p`], and calls `each` with every slice right after its
    /// transfer is enqueued (and its event recorded), in the order of [`AllGatherP2p::order`]:
    /// work `each` enqueues on [`Slice::stream`] runs as soon as the slice is in place and
    /// before the stream's later transfers, the way a pipelined consumer (a matmul per slice)
    /// interleaves with the gather. An error from `each` stops the call (slices issued so far
    /// still complete).
    ///
    /// # Safety
    /// As [`Call::all_gather_p2p`].
    pub unsafe fn all_gather_p2p_each(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        streams: usize,
        mut each: impl FnMut(&Slice) -> Result<(), CommError>,
    ) -> Result<AllGatherP2p<'a>, CommError> {
        // SAFETY: the caller's contract.
        unsafe { self.gather_p2p(send, recv, send_count, dtype, streams, Some(&mut each)) }
    }

    /// [`Call::all_gather_p2p_each`], with the hook optional: without one, a gather in one
    /// collective leaves its event unrecorded until somebody asks for it (one stream
    /// operation less per call, where the caller only orders its stream after the gather).
    ///
    /// # Safety
    /// As [`Call::all_gather_p2p`].
    unsafe fn gather_p2p(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        streams: usize,
        mut hook: Option<&mut SliceHook<'_>>,
    ) -> Result<AllGatherP2p<'a>, CommError> {
        let hooked = hook.is_some();
        let mut each = |s: &Slice| match hook.as_mut() {
            Some(f) => f(s),
            None => Ok(()),
        };
        let c = self.comm;
        let es = dtype.size().ok_or_else(|| {
            CommError::PointToPoint(format!("all_gather_p2p: unknown data type {dtype:?}"))
        })?;
        if streams == 0 {
            return Err(CommError::PointToPoint(
                "all_gather_p2p: streams must be at least 1".into(),
            ));
        }
        let bytes = send_count.checked_mul(es).ok_or_else(|| {
            CommError::PointToPoint(format!(
                "all_gather_p2p: {send_count} elements of {} bytes overflow",
                es
            ))
        })?;
        c.p2p.failure.check()?;
        let runs = c.p2p.runs();
        let reads = runs.reads;
        let route = match self.route {
            Some(_) if c.router.clusters > 1 => Route::Clusters,
            Some(
                forced @ (Route::Ccl | Route::WindowReads | Route::WindowCopies | Route::Window(_)),
            ) => forced,
            Some(other) => {
                return Err(CommError::PointToPoint(format!(
                    "all_gather_p2p cannot take the route `{other}`: only `ccl`, `window`, \
                     `window-reads` and `window-copies`"
                )))
            }
            None => c.router.all_gather_p2p(
                reads,
                runs.copies_chosen || (self.out.is_some() && c.world == 2 && runs.pushes_chosen),
            ),
        };
        // The router's route for a short gather: the window collectives' all-gather in one
        // call where it runs and the output is short enough, else the CCL's. Every rank
        // decides alike (the size, the cluster's device and provider), so the first window
        // call, which registers the scratch window, is collective as it must be.
        let output = bytes.saturating_mul(c.world);
        let windowed = match route {
            Route::Window(_) => true,
            // A hooked gather's consumers overlap its slices: the window (one launch, every
            // slice at its end) takes it only where the CCL would run whole too.
            _ => (!hooked || output < whole_below()) && self.window_gather_chosen(bytes),
        };
        let whole = !windowed
            && self.route.is_none()
            && route != Route::Clusters
            && c.router.ccl.has(crate::route::Collective::AllGather)
            && output < whole_below();
        let route = if windowed {
            Route::Window(crate::window::collectives::WindowAlgo::OneShot)
        } else {
            route
        };
        let _span = tracing::debug_span!(
            target: "ferrocx::route",
            "collective",
            op = if whole { "all_gather_p2p (whole)" } else { "all_gather_p2p" },
            bytes,
            dtype = dtype.name().unwrap_or("unknown"),
            route = %route,
            streams
        )
        .entered();
        if route == Route::WindowReads && !reads {
            return Err(CommError::PointToPoint(format!(
                "all_gather_p2p: the window-reads route needs host-addressable memory and host \
                 functions, which the device adaptor `{}` lacks",
                c.device.name()
            )));
        }
        if route == Route::WindowCopies && !runs.copies {
            return Err(CommError::PointToPoint(format!(
                "all_gather_p2p: the window-copies route needs the memops group \
                 (ferrocx_device_memops_v1) and memory exported to peers (IPC or VMM), which \
                 the device adaptor `{}` lacks",
                c.device.name()
            )));
        }
        let (me, world) = (c.rank, c.world);
        // Pushes into an output window: every peer's output, as this process addresses it
        // (checked before anything is enqueued).
        let pushed = match self.out {
            Some(w) if route == Route::WindowCopies && bytes > 0 => {
                Some(outputs_in(w, recv, world * bytes, world)?)
            }
            _ => None,
        };
        if route == Route::Clusters || whole || windowed {
            // One collective on the call's stream: every slice shares one event, recorded
            // after it (no stream of the communicator, no start event).
            let event = c.p2p.take(1)?[0];
            let mut handle =
                AllGatherP2p::new(c, route, recv, bytes, send_count, |_| (self.stream, event));
            if windowed {
                let backend = c.window_backend()?;
                let call = crate::window::collectives::AllGatherCall {
                    send,
                    recv,
                    count: send_count,
                    dtype,
                    stream: self.stream,
                };
                backend.all_gather(&call)?;
            } else {
                // SAFETY: the caller's contract is the gather's.
                unsafe { self.all_gather(send, recv, send_count, dtype) }?;
            }
            handle.order.push(me);
            handle.order.extend(schedule(world, me));
            if !hooked {
                // Nobody looks at the event yet: recorded when first asked for (a caller that
                // only orders this stream after the gather never needs it).
                handle.unrecorded.set(Some(self.stream));
                return Ok(handle);
            }
            c.device.event_record(event, self.stream)?;
            for r in std::iter::once(me).chain(schedule(world, me)) {
                each(&handle.slices[r])?;
            }
            return Ok(handle);
        }
        let n = streams.min(world);
        let pool = c.p2p.streams(n)?;
        let push = match pushed {
            Some(_) => c.p2p.push_streams()?,
            None => Vec::new(),
        };
        let events = c.p2p.take(world + 1)?;
        let mut handle = AllGatherP2p::new(c, route, recv, bytes, send_count, |r| {
            (pool[r % n], events[r])
        });
        // The start event goes back at once: every wait on it is enqueued below.
        let start = events[world];
        let started = c.device.event_record(start, self.stream).and_then(|()| {
            pool.iter()
                .chain(&push)
                .try_for_each(|&s| c.device.stream_wait_event(s, start))
        });
        c.p2p.give_back(&[start]);
        started?;

        if let Some(outputs) = pushed {
            self.pushes(&mut handle, send, bytes, &pool, &push, &outputs, &mut each)?;
            return Ok(handle);
        }
        if route == Route::WindowCopies {
            self.copies(&mut handle, send, bytes, &pool, &mut each)?;
            return Ok(handle);
        }

        let staging = if route == Route::WindowReads {
            Some(self.stage(bytes)?)
        } else {
            None
        };
        let own = handle.slices[me];
        match &staging {
            Some((round, peers)) => {
                self.publish(send, own, bytes, *round, peers)?;
            }
            None => {
                if own.ptr != send && bytes > 0 {
                    // SAFETY: the caller's contract: `send` and this rank's slice of `recv`
                    // hold `bytes` and are distinct (equal is the in-place case, skipped).
                    unsafe { c.device.mem_copy_async(own.ptr, send, bytes, own.stream) }?;
                }
            }
        }
        c.device.event_record(own.event, own.stream)?;
        handle.order.push(me);
        each(&own)?;

        // Exchanges in groups of `per` rounds (one round each through staging reads), each
        // slice recorded once its group is issued. One round a group: slice `j` on stream
        // `j mod n`; several: group `k` on stream `(k + 1) mod n`.
        let per = match staging {
            Some(_) => 1,
            None => rounds_per_group(),
        };
        let table = rounds(world, me);
        for (k, group) in table.chunks(per).enumerate() {
            let peers: Vec<usize> = group.iter().flatten().copied().collect();
            let stream = match peers.as_slice() {
                [one] => pool[one % n],
                _ => pool[(k + 1) % n],
            };
            for &peer in &peers {
                handle.slices[peer].stream = stream;
            }
            match &staging {
                Some((round, ranks)) => {
                    for &peer in &peers {
                        self.read(handle.slices[peer], bytes, *round, ranks)?;
                    }
                }
                None if bytes > 0 && !peers.is_empty() => {
                    let to = peers
                        .iter()
                        .map(|&p| c.peer(p))
                        .collect::<Result<Vec<_>, _>>()?;
                    c.group(|| {
                        for (&peer, &to) in peers.iter().zip(&to) {
                            let slice = handle.slices[peer];
                            // SAFETY: the caller's contract: the slice of `recv` and `send`
                            // hold `send_count` elements until the slice's event fires.
                            unsafe {
                                c.ccl
                                    .recv(slice.ptr, send_count, dtype, to, c.comm, stream)?;
                                c.ccl.send(send, send_count, dtype, to, c.comm, stream)?;
                            }
                        }
                        Ok(())
                    })?;
                }
                None => {}
            }
            for &peer in &peers {
                let slice = handle.slices[peer];
                c.device.event_record(slice.event, slice.stream)?;
                handle.order.push(peer);
                each(&slice)?;
            }
        }
        Ok(handle)
    }

    /// The window-copies route (see the module docs): this rank's slice into its staging
    /// (parity `round % 2`, once every peer acknowledged round `round - 2`) and its `ready`
    /// word set in every peer, then each peer's slice copied out of the peer's staging on
    /// stream `peer mod S` once the peer's `ready` says this round, and acknowledged in the
    /// peer's `ack` word. Only stream operations: nothing blocks the calling thread.
    fn copies(
        &self,
        handle: &mut AllGatherP2p<'a>,
        send: DevicePtr,
        bytes: usize,
        pool: &[Stream],
        each: &mut impl FnMut(&Slice) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let c = self.comm;
        let dev = &c.device;
        let (me, world) = (c.rank, c.world);
        let n = pool.len();
        // A zero-byte gather moves nothing: the slices' events only (alike on every rank, so
        // the rounds stay in step).
        let staged = if bytes > 0 {
            Some(self.stage_copies(bytes, false)?)
        } else {
            None
        };
        let word = |base: u64, off: usize| (base + off as u64) as *mut u32;
        let own = handle.slices[me];
        if let Some((round, layout, peers)) = &staged {
            let (round, layout) = (*round, *layout);
            let base = peers[me];
            let others = || (0..world).filter(move |&q| q != me);
            for q in others() {
                // SAFETY: words of this rank's staging, alive until the streams drain
                // (teardown, or a larger staging); written by peers and waited on here only
                // with 32-bit stream operations.
                unsafe {
                    dev.stream_wait_value32(
                        own.stream,
                        word(base, layout.ack(q, round)),
                        round.wrapping_sub(2),
                        WAIT_VALUE_GEQ,
                    )
                }?;
            }
            let staging = DevicePtr(base + layout.data(round) as u64);
            // SAFETY: `send` holds `bytes` (the caller's contract); the staging parity holds
            // `capacity >= bytes` and no peer reads it until this round's `ready`, every peer
            // having copied round `round - 2` out of it (the waits above).
            unsafe { dev.mem_copy_async(staging, send, bytes, own.stream) }?;
            for q in others() {
                // SAFETY: `ready[me]` in rank q's staging, mapped here for the window's life;
                // only this rank writes it.
                unsafe {
                    dev.stream_write_value32(
                        own.stream,
                        word(peers[q], layout.ready(me, round)),
                        round,
                    )
                }?;
            }
            if own.ptr != send {
                // SAFETY: the caller's contract: `send` and this rank's slice of `recv` hold
                // `bytes` and are distinct (equal is the in-place case, skipped).
                unsafe { dev.mem_copy_async(own.ptr, send, bytes, own.stream) }?;
            }
        }
        dev.event_record(own.event, own.stream)?;
        handle.order.push(me);
        each(&own)?;

        for peer in schedule(world, me) {
            let stream = pool[peer % n];
            handle.slices[peer].stream = stream;
            let slice = handle.slices[peer];
            // Bytes of the slice that went as earlier pieces (`Call::pieces`).
            let mut at = 0usize;
            if let Some((round, layout, peers)) = &staged {
                let (round, layout) = (*round, *layout);
                // SAFETY: `ready[peer]` of this rank's staging (as above).
                unsafe {
                    dev.stream_wait_value32(
                        stream,
                        word(peers[me], layout.ready(peer, round)),
                        round,
                        WAIT_VALUE_GEQ,
                    )
                }?;
                let from = DevicePtr(peers[peer] + layout.data(round) as u64);
                // Every piece but the last: its copy, its event, the hook on it. The last
                // piece is the rest of the slice, below.
                if let Some(pe) = self.piece {
                    let es = bytes / slice.count.max(1);
                    let step = pe.saturating_mul(es);
                    while step > 0 && at + step < bytes {
                        let e = c.p2p.take(1)?[0];
                        handle.pieces.push(e);
                        let part = Slice {
                            ptr: DevicePtr(slice.ptr.0 + at as u64),
                            count: pe,
                            event: e,
                            ..slice
                        };
                        // SAFETY: as the whole slice's copy below, for a part of it.
                        unsafe {
                            dev.mem_copy_async(
                                part.ptr,
                                DevicePtr(from.0 + at as u64),
                                step,
                                stream,
                            )
                        }?;
                        dev.event_record(e, stream)?;
                        each(&part)?;
                        at += step;
                    }
                }
                // SAFETY: rank `peer` put `bytes` in this parity of its staging before it set
                // `ready[peer]` here (stream order, with the store's memory barrier) and leaves
                // them until this rank's acknowledgement below; the slice of `recv` holds
                // `bytes` (the caller's contract).
                unsafe {
                    dev.mem_copy_async(
                        DevicePtr(slice.ptr.0 + at as u64),
                        DevicePtr(from.0 + at as u64),
                        bytes - at,
                        stream,
                    )
                }?;
                // SAFETY: `ack[me]` in rank `peer`'s staging, mapped here; only this rank
                // writes it.
                unsafe {
                    dev.stream_write_value32(
                        stream,
                        word(peers[peer], layout.ack(me, round)),
                        round,
                    )
                }?;
            }
            dev.event_record(slice.event, slice.stream)?;
            handle.order.push(peer);
            // The hook sees the whole slice, or its last piece (with the slice's own event).
            let es = bytes / slice.count.max(1);
            each(&Slice {
                ptr: DevicePtr(slice.ptr.0 + at as u64),
                count: slice.count - at / es.max(1),
                ..slice
            })?;
        }
        Ok(())
    }

    /// The window-copies route into an output window (see the module docs): this rank's
    /// input pushed into every peer's output by the copy engines, piece by piece, each piece
    /// signalled in the peer's `put` word, once the peer said its output is free this round
    /// (`clear`); each peer's slice (or piece) recorded once its `put` word says it landed.
    /// `outputs[q]` is rank q's output as this process addresses it. Only stream operations:
    /// nothing blocks the calling thread.
    #[allow(clippy::too_many_arguments)]
    fn pushes(
        &self,
        handle: &mut AllGatherP2p<'a>,
        send: DevicePtr,
        bytes: usize,
        pool: &[Stream],
        push: &[Stream],
        outputs: &[u64],
        each: &mut impl FnMut(&Slice) -> Result<(), CommError>,
    ) -> Result<(), CommError> {
        let c = self.comm;
        let dev = &c.device;
        let (me, world) = (c.rank, c.world);
        let n = pool.len();
        let (round, layout, peers) = self.stage_copies(0, true)?;
        let word = |base: u64, off: usize| (base + off as u64) as *mut u32;
        // The pieces' bytes: whole elements, at most `MOST_PIECES` a slice (a multiple of the
        // asked size where it would cut more).
        let es = bytes / handle.slices[me].count.max(1);
        let step = match self.piece {
            Some(pe) => {
                let asked = pe.saturating_mul(es).max(1);
                asked.saturating_mul(bytes.div_ceil(asked).div_ceil(MOST_PIECES))
            }
            None => bytes,
        };
        let cuts: Vec<(usize, usize)> = (0..bytes)
            .step_by(step.max(1))
            .map(|at| (at, step.min(bytes - at)))
            .collect();
        let order = schedule(world, me);
        for &q in &order {
            let s = push[q % push.len()];
            // SAFETY: `clear[me]` in rank q's staging, mapped here for the window's life; only
            // this rank writes it, always from this stream.
            unsafe { dev.stream_write_value32(s, word(peers[q], layout.clear(me)), round) }?;
            // SAFETY: `clear[q]` of this rank's staging, alive until the streams drain; written
            // by rank q and waited on here only with 32-bit stream operations.
            unsafe {
                dev.stream_wait_value32(s, word(peers[me], layout.clear(q)), round, WAIT_VALUE_GEQ)
            }?;
            for (k, &(at, len)) in cuts.iter().enumerate() {
                // SAFETY: `send` holds `bytes` (the caller's contract); rank q's output holds
                // `world * bytes` at `outputs[q]` (checked against its window), and rank q
                // freed it for this round (the wait above); only this rank writes its slice.
                unsafe {
                    dev.mem_copy_async(
                        DevicePtr(outputs[q] + (me * bytes + at) as u64),
                        DevicePtr(send.0 + at as u64),
                        len,
                        s,
                    )
                }?;
                // SAFETY: `put[me]` in rank q's staging, mapped here; only this rank writes
                // it, always from this stream, after the piece's copy (stream order).
                unsafe {
                    dev.stream_write_value32(s, word(peers[q], layout.put(me)), put_value(round, k))
                }?;
            }
        }
        let own = handle.slices[me];
        if own.ptr != send {
            // SAFETY: the caller's contract: `send` and this rank's slice of `recv` hold
            // `bytes` and are distinct (equal is the in-place case, skipped).
            unsafe { dev.mem_copy_async(own.ptr, send, bytes, own.stream) }?;
        }
        dev.event_record(own.event, own.stream)?;
        handle.order.push(me);
        each(&own)?;
        for &j in &order {
            let stream = pool[j % n];
            handle.slices[j].stream = stream;
            let slice = handle.slices[j];
            for (k, &(at, len)) in cuts.iter().enumerate() {
                // SAFETY: `put[j]` of this rank's staging (as above).
                unsafe {
                    dev.stream_wait_value32(
                        stream,
                        word(peers[me], layout.put(j)),
                        put_value(round, k),
                        WAIT_VALUE_GEQ,
                    )
                }?;
                let part = Slice {
                    ptr: DevicePtr(slice.ptr.0 + at as u64),
                    count: len / es.max(1),
                    ..slice
                };
                if k + 1 < cuts.len() {
                    let e = c.p2p.take(1)?[0];
                    handle.pieces.push(e);
                    dev.event_record(e, stream)?;
                    each(&Slice { event: e, ..part })?;
                } else {
                    dev.event_record(slice.event, stream)?;
                    handle.order.push(j);
                    each(&part)?;
                }
            }
        }
        Ok(())
    }

    /// The window-copies staging for `bytes` per rank (registered, or replaced by a larger
    /// one, on every rank alike) and this call's round (its push round where `push`): `(round,
    /// layout, every rank's staging address)`.
    fn stage_copies(
        &self,
        bytes: usize,
        push: bool,
    ) -> Result<(u32, CopyLayout, Vec<u64>), CommError> {
        let c = self.comm;
        let mut copies = c.p2p.copies.lock().unwrap_or_else(|p| p.into_inner());
        if copies.as_ref().is_none_or(|s| s.layout.capacity < bytes) {
            if copies.is_some() {
                // Peers may still copy out of the old window, or signal into it: every rank's
                // transfers end, then all meet, before any rank lets it go.
                c.p2p.drain_bounded(copies.as_mut())?;
                c.p2p.failure.check()?;
                c.host_barrier()?;
                *copies = None;
            }
            let layout = CopyLayout {
                world: c.world,
                capacity: bytes.max(4096).next_power_of_two(),
            };
            let scratch = c.scratch_window(layout.bytes())?;
            let peers = scratch.peers().ok_or_else(|| {
                CommError::PointToPoint(
                    "all_gather_p2p: the window-copies staging window has no peer addresses".into(),
                )
            })?;
            let host = capabilities(&c.device)
                .is_some_and(|caps| caps.contains(Capabilities::HOST_ADDRESSABLE));
            *copies = Some(CopyStaging {
                scratch,
                layout,
                round: 0,
                push_round: 0,
                peers,
                host,
            });
        }
        let s = copies.as_mut().expect("made above");
        debug_assert!(s.scratch.size() >= s.layout.bytes());
        let round = if push {
            s.push_round = s.push_round.wrapping_add(1);
            s.push_round
        } else {
            s.round = s.round.wrapping_add(1);
            s.round
        };
        Ok((round, s.layout, s.peers.clone()))
    }

    /// The staging window for `bytes` per rank (registered, or replaced by a larger one, on
    /// every rank alike) and this call's round: `(round, every rank's staging address)`.
    fn stage(&self, bytes: usize) -> Result<(u64, Vec<u64>), CommError> {
        let c = self.comm;
        let mut staging = c.p2p.staging.lock().unwrap_or_else(|p| p.into_inner());
        if staging.as_ref().is_none_or(|s| s.capacity < bytes) {
            if staging.is_some() {
                // Peers may still read the old window: every rank's transfers end, then all
                // meet, before any rank lets it go.
                c.p2p.drain()?;
                c.host_barrier()?;
                *staging = None;
            }
            let capacity = bytes.max(4096).next_power_of_two();
            let scratch = c.scratch_window(LINE * (1 + c.world) + capacity)?;
            let peers = scratch.peers().ok_or_else(|| {
                CommError::PointToPoint(
                    "all_gather_p2p: the staging window has no peer addresses".into(),
                )
            })?;
            *staging = Some(Staging {
                scratch,
                capacity,
                round: 0,
                peers,
            });
        }
        let s = staging.as_mut().expect("made above");
        debug_assert!(s.scratch.size() >= LINE * (1 + c.world) + bytes);
        s.round += 1;
        Ok((s.round, s.peers.clone()))
    }

    /// Window reads: this rank's slice into its staging (once every peer acknowledged the
    /// previous round) and into its slice of `recv`, then the round published.
    fn publish(
        &self,
        send: DevicePtr,
        own: Slice,
        bytes: usize,
        round: u64,
        peers: &[u64],
    ) -> Result<(), CommError> {
        let c = self.comm;
        let (me, world) = (c.rank, c.world);
        let base = peers[me];
        let (send, out) = (send.0, own.ptr.0);
        let failure = c.p2p.failure.clone();
        let timeout = c.timeout();
        launch_host(&c.device, own.stream, move || {
            if failure.is_set() {
                return;
            }
            let deadline = Instant::now() + timeout;
            for q in (0..world).filter(|&q| q != me) {
                // Rank q's acknowledgement of this rank's previous round.
                if !wait_word(base + (LINE * (1 + q)) as u64, round - 1, deadline) {
                    failure.set(format!(
                        "all_gather_p2p: rank {q} did not read rank {me}'s slice of round {} \
                         within {timeout:?}",
                        round - 1
                    ));
                    return;
                }
            }
            let data = base + (LINE * (1 + world)) as u64;
            // SAFETY: `send` holds `bytes` (the caller's contract) and the staging data area
            // at least as many (sized by `stage`); no peer reads it until the round below is
            // published, and every peer has finished with the previous round.
            unsafe {
                std::ptr::copy_nonoverlapping(send as *const u8, data as *mut u8, bytes);
                if out != send {
                    std::ptr::copy_nonoverlapping(send as *const u8, out as *mut u8, bytes);
                }
            }
            // SAFETY: the first line of this rank's staging, an aligned signal word.
            let word = unsafe { &*(base as *const AtomicU64) };
            word.store(round, Ordering::Release);
        })
    }

    /// Window reads: slice `slice.rank` read from that rank's staging once it published this
    /// round, then acknowledged there.
    fn read(&self, slice: Slice, bytes: usize, round: u64, peers: &[u64]) -> Result<(), CommError> {
        let c = self.comm;
        let (me, world, peer) = (c.rank, c.world, slice.rank);
        let base = peers[peer];
        let out = slice.ptr.0;
        let failure = c.p2p.failure.clone();
        let timeout = c.timeout();
        launch_host(&c.device, slice.stream, move || {
            if failure.is_set() {
                return;
            }
            if !wait_word(base, round, Instant::now() + timeout) {
                failure.set(format!(
                    "all_gather_p2p: rank {peer} did not publish its slice of round {round} \
                     within {timeout:?}"
                ));
                return;
            }
            let data = base + (LINE * (1 + world)) as u64;
            // SAFETY: rank `peer` published `bytes` in its staging for this round and leaves
            // them until this rank acknowledges; the slice of `recv` holds `bytes` (the
            // caller's contract).
            unsafe { std::ptr::copy_nonoverlapping(data as *const u8, out as *mut u8, bytes) };
            // SAFETY: this rank's acknowledgement line in rank `peer`'s staging, an aligned
            // signal word only this rank writes.
            let ack = unsafe { &*((base + (LINE * (1 + me)) as u64) as *const AtomicU64) };
            ack.store(round, Ordering::Release);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::schedule;

    #[test]
    fn every_round_is_a_matching_and_every_peer_comes_once() {
        for world in 1..=9 {
            let all: Vec<Vec<usize>> = (0..world).map(|r| schedule(world, r)).collect();
            for (r, peers) in all.iter().enumerate() {
                let mut sorted = peers.clone();
                sorted.sort_unstable();
                let others: Vec<usize> = (0..world).filter(|&q| q != r).collect();
                assert_eq!(sorted, others, "world {world} rank {r}");
            }
            // Round by round (with the byes put back), partners are mutual.
            let players = world + world % 2;
            let round_peer = |r: usize, k: usize| {
                let full = super::schedule(players, r.min(players - 1));
                full[k]
            };
            for k in 0..players - 1 {
                for r in 0..world {
                    let p = round_peer(r, k);
                    if p < world {
                        assert_eq!(round_peer(p, k), r, "world {world} round {k}");
                    }
                }
            }
            // On an odd world, the exchanges each rank keeps are in the same relative order
            // as its partners', so a serial CCL never waits in a cycle.
            for r in 0..world {
                for (i, &p) in all[r].iter().enumerate() {
                    let j = all[p].iter().position(|&x| x == r).expect("mutual");
                    let rank_of_round = |q: usize, idx: usize| {
                        let full = super::schedule(players, q);
                        full.iter()
                            .position(|&x| x == all[q][idx])
                            .expect("in the full schedule")
                    };
                    assert_eq!(rank_of_round(r, i), rank_of_round(p, j));
                }
            }
        }
    }

    #[test]
    fn out_of_range_ranks_have_no_peers() {
        assert!(schedule(4, 4).is_empty());
        assert!(schedule(1, 0).is_empty());
        assert_eq!(schedule(2, 0), vec![1]);
        assert_eq!(schedule(2, 1), vec![0]);
    }
}
