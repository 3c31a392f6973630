//! The host CCL: a communicator over shared memory for the processes of one host.
//!
//! `comm_init_rank`: rank 0 creates a POSIX shared-memory segment named from the job id and
//! the unique id, the others attach to it (retrying until the timeout), every rank publishes its
//! pid, and once all are attached rank 0 removes the name, so a crash leaves nothing behind.
//! Every collective is enqueued on the device stream and returns at once, except that a small
//! one on an idle stream runs on the calling thread when its peers are there within a few
//! microseconds (see `task::enqueue`); waits on peers spin briefly, then yield (for up to
//! 2 ms), then sleep on a futex, and fail by the deadline naming the rank. A broadcast of at
//! most one line of payload (192 bytes) does not synchronize the ranks: its root writes the
//! data into its line (up to 8 bytes: into a 16-byte tiny record, four to a cache line) and
//! completes, as an eager send does; it waits only for a receiver 63 such broadcasts behind
//! (255 for tiny ones: its lines or records are used up), and the next other operation waits
//! until every receiver has caught up (see `Ctx::post_broadcast`). The thread
//! that runs a small collective is bound to the rank's share of the cores when each rank gets
//! one (`bind`), and large copies and reductions are split over `threads` threads per rank (see
//! `cores`).
//!
//! The files: `handles` (communicators by handle), `comm` (a communicator and the order its
//! operations run in), `task` (an operation as queued on a stream), `group` (point-to-point
//! calls and their grouping), `ctx` (what an algorithm runs with, and the agreement on each
//! operation), `algo/` (one collective algorithm a file), `p2p` (the transfers over rings),
//! `direct` (large reduce-scatters and all-gathers reading the peers' buffers in place),
//! `segment` (the shared-memory layout), `sync` (waits on peers), `reduce` (element
//! reductions), `cores` (the cores a rank's collective threads are bound to and how many it
//! uses) and `helpers` (the threads that share a large collective's copies and reductions).

mod algo;
mod comm;
mod cores;
mod ctx;
mod direct;
mod group;
mod handles;
mod helpers;
mod p2p;
pub(crate) mod reduce;
mod segment;
mod sync;
mod task;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrocx_plugin_sdk::prelude::*;

use algo::elem_size;
use comm::HostComm;
use ctx::Kind;
use group::p2p;
use handles::{get, take, with, COMMS};
use p2p::Transfer;
use segment::{Layout, Segment};
use task::{enqueue, enqueue_rooted, Coll};

pub(crate) use task::CollTask;

pub use direct::reads_in_place;
pub use reduce::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// The shared-memory CCL.
#[derive(Default)]
pub struct HostCcl {}

/// `"fxh1"`: the first bytes of a host unique id.
const UID_MAGIC: &[u8; 4] = b"fxh1";
/// Default bytes per rank slot (per parity).
const DEFAULT_SLOT: usize = 1 << 20;
/// Default bytes per point-to-point ring.
const DEFAULT_RING: usize = 256 << 10;

fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    use std::io::Read;
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::system("read /dev/urandom", e))?;
    Ok(b)
}

fn opt_usize(o: &Options, key: &str, default: usize) -> Result<usize> {
    match o.get(key) {
        None => Ok(default),
        Some(v) => v.parse::<usize>().map_err(|_| {
            Error::invalid_argument(format!("option {key} = {v:?}: expected a byte count"))
        }),
    }
}

fn ptr(p: DevicePtr) -> usize {
    p.0 as usize
}

fn root_of(comm: &HostComm, root: i32) -> Result<usize> {
    usize::try_from(root)
        .ok()
        .filter(|r| *r < comm.nranks)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "root {root} is not a rank of {} ranks",
                comm.nranks
            ))
        })
}

fn peer_of(comm: &HostComm, peer: i32) -> Result<usize> {
    usize::try_from(peer)
        .ok()
        .filter(|r| *r < comm.nranks)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "peer {peer} is not a rank of {} ranks",
                comm.nranks
            ))
        })
}

impl CclAdaptor for HostCcl {
    fn instance() -> &'static Self {
        singleton!(HostCcl)
    }
    fn init(&self, _o: &Options) -> Result<()> {
        Ok(())
    }
    fn finalize(&self) -> Result<()> {
        Ok(())
    }
    fn version(&self) -> Result<i32> {
        Ok(10_000)
    }
    fn unique_id(&self) -> Result<Vec<u8>> {
        let mut id = UID_MAGIC.to_vec();
        id.extend_from_slice(&std::process::id().to_le_bytes());
        id.extend_from_slice(&random_bytes::<16>()?);
        Ok(id)
    }
    fn comm_init_rank(&self, init: &CommInit<'_>) -> Result<Comm> {
        let uid = init.unique_id;
        if uid.len() != 24 || &uid[..4] != UID_MAGIC {
            return Err(Error::invalid_argument("not a unique id of the host CCL"));
        }
        let nranks = usize::try_from(init.nranks)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                Error::invalid_argument(format!("nranks {} must be at least 1", init.nranks))
            })?;
        let rank = usize::try_from(init.rank)
            .ok()
            .filter(|r| *r < nranks)
            .ok_or_else(|| {
                Error::invalid_argument(format!("rank {} is not in 0..{nranks}", init.rank))
            })?;
        let timeout = Duration::from_millis(if init.timeout_ms == 0 {
            30_000
        } else {
            init.timeout_ms
        });
        let slot = opt_usize(&init.options, "slot_bytes", DEFAULT_SLOT)?.max(4096) / 4096 * 4096;
        let ring = opt_usize(&init.options, "ring_bytes", DEFAULT_RING)?.max(4096) / 4096 * 4096;
        let layout = Layout {
            nranks,
            slot_bytes: slot,
            ring_bytes: ring,
        };
        let placement = cores::plan(&init.options, rank, nranks)?;
        let pid0 = u32::from_le_bytes([uid[4], uid[5], uid[6], uid[7]]);
        let hex: String = uid[8..].iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("/ferrocx-{}-{pid0}-c{hex}", crate::shm::job_id());
        let deadline = Instant::now() + timeout;
        // Before this rank publishes anything: how it fences its publications.
        sync::init_fences();
        let mut seg = if rank == 0 {
            Segment::create(&name, layout)?
        } else {
            Segment::open(&name, layout, deadline)?
        };
        seg.rank(rank)
            .pid
            .store(std::process::id(), Ordering::Release);
        seg.header().attached.fetch_add(1, Ordering::AcqRel);
        // Everyone attached: nobody needs the name any more.
        let attached = sync::barrier(&seg, rank, 1, timeout, "comm_init_rank");
        if rank == 0 || attached.is_err() {
            seg.unlink();
        }
        attached?;
        let helpers = helpers::Helpers::start(placement.threads - 1)?;
        let comm = Arc::new(HostComm::new(
            rank, nranks, seg, timeout, placement, helpers,
        ));
        comm.set_generation(1);
        let id = COMMS.insert(comm);
        Ok(Comm(id as usize as *mut std::ffi::c_void))
    }
    fn comm_finalize(&self, c: Comm) -> Result<()> {
        get(c)?.wait_idle()
    }
    fn comm_destroy(&self, c: Comm) -> Result<()> {
        // Operations already enqueued hold the communicator and finish first.
        take(c).map(|_| ())
    }
    fn comm_abort(&self, c: Comm) -> Result<()> {
        take(c)?.abort();
        Ok(())
    }
    fn comm_async_error(&self, c: Comm) -> Result<Status> {
        Ok(get(c)?
            .async_error()
            .map_or(Status::SUCCESS, |e| e.status()))
    }
    fn comm_count(&self, c: Comm) -> Result<i32> {
        Ok(get(c)?.nranks as i32)
    }
    fn comm_user_rank(&self, c: Comm) -> Result<i32> {
        Ok(get(c)?.rank as i32)
    }
    fn comm_device(&self, c: Comm) -> Result<i32> {
        get(c).map(|_| 0)
    }
    fn all_reduce(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        o: ReduceOp,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        elem_size(t)?;
        let (send, recv) = (ptr(s), ptr(r));
        enqueue(
            c,
            st,
            Coll::Reduce {
                send,
                recv,
                count: n,
                dtype: t,
                op: o,
                root: None,
            },
        )
    }
    fn all_gather(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        elem_size(t)?;
        let (send, recv) = (ptr(s), ptr(r));
        enqueue(
            c,
            st,
            Coll::Gather {
                send,
                recv,
                count: n,
                dtype: t,
                root: None,
            },
        )
    }
    fn reduce_scatter(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        o: ReduceOp,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        elem_size(t)?;
        let (send, recv) = (ptr(s), ptr(r));
        enqueue(
            c,
            st,
            Coll::Exchange {
                kind: Kind::ReduceScatter,
                send,
                recv,
                count: n,
                dtype: t,
                op: o,
                root: None,
            },
        )
    }
    fn broadcast(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        root: i32,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        elem_size(t)?;
        let (send, recv) = (ptr(s), ptr(r));
        enqueue_rooted(c, st, root, |root| Coll::Broadcast {
            send,
            recv,
            count: n,
            dtype: t,
            root,
        })
    }
    fn reduce(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        o: ReduceOp,
        root: i32,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        elem_size(t)?;
        let (send, recv) = (ptr(s), ptr(r));
        enqueue_rooted(c, st, root, |root| Coll::Reduce {
            send,
            recv,
            count: n,
            dtype: t,
            op: o,
            root: Some(root),
        })
    }
    fn gather(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        root: i32,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        elem_size(t)?;
        let (send, recv) = (ptr(s), ptr(r));
        enqueue_rooted(c, st, root, |root| Coll::Gather {
            send,
            recv,
            count: n,
            dtype: t,
            root: Some(root),
        })
    }
    fn scatter(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        root: i32,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        elem_size(t)?;
        let (send, recv) = (ptr(s), ptr(r));
        enqueue_rooted(c, st, root, |root| Coll::Exchange {
            kind: Kind::Scatter,
            send,
            recv,
            count: n,
            dtype: t,
            op: ReduceOp::SUM,
            root: Some(root),
        })
    }
    fn all_to_all(
        &self,
        s: DevicePtr,
        r: DevicePtr,
        n: usize,
        t: DataType,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        elem_size(t)?;
        let (send, recv) = (ptr(s), ptr(r));
        enqueue(
            c,
            st,
            Coll::Exchange {
                kind: Kind::AllToAll,
                send,
                recv,
                count: n,
                dtype: t,
                op: ReduceOp::SUM,
                root: None,
            },
        )
    }
    fn all_to_allv(
        &self,
        s: DevicePtr,
        sv: VCounts<'_>,
        r: DevicePtr,
        rv: VCounts<'_>,
        t: DataType,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        elem_size(t)?;
        let (send, recv) = (ptr(s), ptr(r));
        let counts = Box::new([
            sv.counts.to_vec(),
            sv.displs.to_vec(),
            rv.counts.to_vec(),
            rv.displs.to_vec(),
        ]);
        enqueue(
            c,
            st,
            Coll::AllToAllV {
                send,
                recv,
                dtype: t,
                counts,
            },
        )
    }
    fn send(
        &self,
        b: DevicePtr,
        n: usize,
        t: DataType,
        peer: i32,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        let len = n * elem_size(t)?;
        let peer = with(c, |comm| peer_of(comm, peer))??;
        p2p(
            c,
            st,
            Transfer::Send {
                peer,
                ptr: b.0 as usize as *const u8,
                len,
            },
        )
    }
    fn recv(
        &self,
        b: DevicePtr,
        n: usize,
        t: DataType,
        peer: i32,
        c: Comm,
        st: Stream,
    ) -> Result<()> {
        let len = n * elem_size(t)?;
        let peer = with(c, |comm| peer_of(comm, peer))??;
        p2p(
            c,
            st,
            Transfer::Recv {
                peer,
                ptr: b.0 as usize as *mut u8,
                len,
            },
        )
    }
    fn group_start(&self) -> Result<()> {
        group::start();
        Ok(())
    }
    fn group_end(&self) -> Result<()> {
        group::end()
    }
    fn mem_alloc(&self, _bytes: usize) -> Result<DevicePtr> {
        Err(Error::unsupported(
            "the host CCL has no memory of its own; use the device's mem_alloc",
        ))
    }
    fn mem_free(&self, _p: DevicePtr) -> Result<()> {
        Err(Error::unsupported(
            "the host CCL has no memory of its own; use the device's mem_free",
        ))
    }
    fn mem_register(&self, c: Comm, _b: DevicePtr, _n: usize) -> Result<RegHandle> {
        // Registration is an optimisation hint; shared memory needs none.
        get(c)?;
        Ok(RegHandle(std::ptr::dangling_mut()))
    }
    fn mem_deregister(&self, c: Comm, _h: RegHandle) -> Result<()> {
        get(c).map(|_| ())
    }
}
