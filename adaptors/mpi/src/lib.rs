//! The MPI CCL: collectives across hosts over an MPI library opened at run time, on the host
//! device's memory and streams.
//!
//! - The library: the `library` option, else `FERROCX_MPI_LIBRARY`, else the MPI standard ABI
//!   (`libmpi_abi.so.1`), Open MPI (`libmpi.so.40`) and MPICH (`libmpi.so.12`), each through
//!   the system loader and then in the virtual environment's `lib` and the `lib` beside the
//!   `mpiexec` on `PATH` (where the `mpich` wheel puts them). Each ABI has its own handle
//!   constants ([`library`]); the `abi` option forces one. Nothing of MPI is needed to build.
//! - `init` calls `MPI_Init_thread` asking for `MPI_THREAD_SERIALIZED` (option
//!   `thread_level = "multiple"` asks for more) and fails if the library provides less; every
//!   MPI call is made under one lock. `MPI_COMM_WORLD` and every communicator return errors
//!   (`MPI_ERRORS_RETURN`) rather than abort.
//! - A communicator spans some ranks of the MPI world (a cluster): it is made with
//!   `MPI_Comm_create_group`, the ranks outside it never call in (the members exchange their
//!   world ranks with the root named in the unique id over `MPI_COMM_WORLD` first).
//! - Every operation is a non-blocking MPI call (`MPI_Iallreduce`, …) started in stream order by
//!   the host device's stream worker, which then tests it until it completes, the
//!   communicator's deadline passes (`TIMEOUT`, naming the operation) or it is aborted; the
//!   calling thread only enqueues. All-reduces up to 64 KiB (not f16/bf16) are persistent
//!   (MPI 4's `MPI_Allreduce_init` once per count, type and op, then `MPI_Start` per call, the
//!   data copied through the request's own buffers) where the library has them: MPICH builds
//!   a schedule for every `MPI_Iallreduce`, several µs at 8 B, which a started persistent
//!   request does not pay. f16 and bf16 are reduced in f32; `avg` is a sum divided by the
//!   number of ranks. Grouped sends and receives are started together in one stream task
//!   (as with NCCL, a send and a receive that depend on each other must be grouped). Counts are
//!   MPI's `int`: a larger one is refused when enqueued.
//! - A wait that fails (deadline, abort, an error MPI reports) leaves its request pending: the
//!   communicator keeps the error (later calls fail with it) and is never freed, and
//!   `MPI_Finalize` is skipped. Otherwise, if this adaptor initialised MPI, `MPI_Finalize` runs
//!   at exit (or at the `finalize` entry once no communicator is left), on a helper thread given
//!   up after the longest timeout: Hydra and Open MPI's launcher end a job one of whose ranks
//!   exits without it, and a dead peer must not keep a rank from exiting.
//!
//! Linked into a program it is a built-in adaptor named `mpi` (CCL only; it pairs with the
//! `host` device); `adaptors/mpi/plugin` builds it as `libferrocx_adaptor_mpi.so`, which also
//! carries the host device its operations run on.

pub mod library;

mod comm;
mod ops;
mod state;

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferrocx::abi::CclAdaptorV1;
use ferrocx::registry::BuiltinAdaptor;
use ferrocx_plugin_sdk::prelude::*;

use comm::{get, take, MpiComm, COMMS};
use ops::{Move, Op, Start};

pub use library::{Abi, ENV_LIBRARY, SONAMES};

/// The MPI CCL.
#[derive(Default)]
pub struct MpiCcl {}

const NAME: &std::ffi::CStr = c"mpi";

// MPI allocates no memory of its own for collectives: those entries are absent.
static CCL: CclAdaptorV1 = ferrocx_plugin_sdk::ccl_table::<MpiCcl>(NAME, ABSENT);

/// The CCL entries the MPI CCL does not provide.
pub const ABSENT: &[&str] = &["mem_alloc", "mem_free"];

ferrocx::register_builtin!(BuiltinAdaptor {
    name: "mpi",
    priority: 110,
    ccl: Some(&CCL),
    ..BuiltinAdaptor::EMPTY
});

/// The MPI library this process opened (its file and ABI), once `init` succeeded.
pub fn loaded_library() -> Option<(String, Abi)> {
    state::mpi().ok().map(|m| (m.lib.path.clone(), m.lib.abi))
}

/// Makes sure this crate is linked (and its built-in registration kept) by a program that
/// otherwise names nothing from it.
pub fn link() {}

/// A group in progress on this thread: its depth and the operations it collected.
#[derive(Default)]
struct Group {
    depth: usize,
    ops: Vec<(Stream, Op)>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Enqueues `start` on `stream` (or adds it to this thread's group).
fn submit(comm: Arc<MpiComm>, stream: Stream, what: &'static str, start: Start) -> Result<()> {
    if let Some(e) = comm.failed() {
        return Err(Error::new(
            e.status(),
            format!("{what}: the communicator failed earlier: {}", e.message()),
        ));
    }
    if comm.aborted.load(Ordering::Acquire) {
        return Err(Error::new(Status::ABORTED, "the communicator was aborted"));
    }
    if comm.mpi.finalized.load(Ordering::Acquire) {
        return Err(Error::new(
            Status::NOT_INITIALIZED,
            format!("{what}: MPI was finalised"),
        ));
    }
    comm.begin();
    let op = Op { comm, what, start };
    let op = match GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push((stream, op));
            None
        } else {
            Some(op)
        }
    }) {
        None => return Ok(()),
        Some(op) => op,
    };
    let comm = op.comm.clone();
    host::enqueue_on_stream(stream, Box::new(move || ops::run(vec![op]))).inspect_err(|_| {
        comm.end();
    })
}

fn rank_of(comm: &MpiComm, r: i32, what: &str) -> Result<usize> {
    usize::try_from(r)
        .ok()
        .filter(|x| *x < comm.nranks)
        .ok_or_else(|| {
            Error::invalid_argument(format!("{what} {r} is not a rank of {}", comm.nranks))
        })
}

impl CclAdaptor for MpiCcl {
    fn instance() -> &'static Self {
        singleton!(MpiCcl)
    }
    fn init(&self, options: &Options) -> Result<()> {
        state::init(options).map(|_| ())
    }
    fn finalize(&self) -> Result<()> {
        // Operations still queued keep their communicators; finalise only when none is left.
        if !COMMS.is_empty() {
            return Ok(());
        }
        match state::mpi() {
            Ok(m) => m.finalize_bounded(),
            Err(_) => Ok(()),
        }
    }
    fn version(&self) -> Result<i32> {
        let m = state::mpi()?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: callable at any time.
        unsafe {
            m.lib.api.get_version(&mut major, &mut minor);
        }
        Ok(major * 10_000 + minor * 100)
    }
    fn unique_id(&self) -> Result<Vec<u8>> {
        comm::unique_id(state::mpi()?)
    }
    fn comm_init_rank(&self, init: &CommInit<'_>) -> Result<Comm> {
        let m = state::mpi()?;
        let c = comm::create(m, init)?;
        let id = COMMS.insert(Arc::new(c));
        Ok(Comm(id as usize as *mut std::ffi::c_void))
    }
    fn comm_finalize(&self, c: Comm) -> Result<()> {
        get(c)?.wait_idle()
    }
    fn comm_destroy(&self, c: Comm) -> Result<()> {
        take(c).map(|_| ())
    }
    fn comm_abort(&self, c: Comm) -> Result<()> {
        let comm = take(c)?;
        comm.aborted.store(true, Ordering::Release);
        // The peers may be left waiting on this communicator: `MPI_Finalize`, which waits for
        // every process, is skipped from now on (as it is after a timeout).
        comm.mpi.tainted.store(true, Ordering::Release);
        comm.fail(&Error::new(Status::ABORTED, "the communicator was aborted"));
        Ok(())
    }
    fn comm_async_error(&self, c: Comm) -> Result<Status> {
        Ok(get(c)?.failed().map_or(Status::SUCCESS, |e| e.status()))
    }
    fn comm_count(&self, c: Comm) -> Result<i32> {
        Ok(get(c)?.nranks as i32)
    }
    fn comm_user_rank(&self, c: Comm) -> Result<i32> {
        Ok(get(c)?.rank as i32)
    }
    fn comm_device(&self, c: Comm) -> Result<i32> {
        Ok(get(c)?.device)
    }
    fn all_reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(count, 1, 1, "all_reduce")?;
        ops::red(&comm, dtype, op)?;
        let s = ops::reduction(
            send.0 as usize,
            recv.0 as usize,
            count,
            dtype,
            op,
            None,
            false,
        );
        submit(comm, stream, "all_reduce", s)
    }
    fn all_gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(send_count, ops::esize(dtype)?, comm.nranks, "all_gather")?;
        ops::esize(dtype)?;
        let s = ops::movement(
            send.0 as usize,
            recv.0 as usize,
            send_count,
            dtype,
            Move::AllGather,
        );
        submit(comm, stream, "all_gather", s)
    }
    fn reduce_scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(recv_count, 1, comm.nranks, "reduce_scatter")?;
        ops::red(&comm, dtype, op)?;
        let s = ops::reduction(
            send.0 as usize,
            recv.0 as usize,
            recv_count,
            dtype,
            op,
            None,
            true,
        );
        submit(comm, stream, "reduce_scatter", s)
    }
    fn broadcast(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(count, ops::esize(dtype)?, 1, "broadcast")?;
        let root = rank_of(&comm, root, "root")?;
        ops::esize(dtype)?;
        let s = ops::movement(
            send.0 as usize,
            recv.0 as usize,
            count,
            dtype,
            Move::Broadcast(root),
        );
        submit(comm, stream, "broadcast", s)
    }
    fn reduce(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(count, 1, 1, "reduce")?;
        let root = rank_of(&comm, root, "root")?;
        ops::red(&comm, dtype, op)?;
        let s = ops::reduction(
            send.0 as usize,
            recv.0 as usize,
            count,
            dtype,
            op,
            Some(root),
            false,
        );
        submit(comm, stream, "reduce", s)
    }
    fn gather(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        send_count: usize,
        dtype: DataType,
        root: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(send_count, ops::esize(dtype)?, comm.nranks, "gather")?;
        let root = rank_of(&comm, root, "root")?;
        ops::esize(dtype)?;
        let s = ops::movement(
            send.0 as usize,
            recv.0 as usize,
            send_count,
            dtype,
            Move::Gather(root),
        );
        submit(comm, stream, "gather", s)
    }
    fn scatter(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        recv_count: usize,
        dtype: DataType,
        root: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(recv_count, ops::esize(dtype)?, comm.nranks, "scatter")?;
        let root = rank_of(&comm, root, "root")?;
        ops::esize(dtype)?;
        let s = ops::movement(
            send.0 as usize,
            recv.0 as usize,
            recv_count,
            dtype,
            Move::Scatter(root),
        );
        submit(comm, stream, "scatter", s)
    }
    fn all_to_all(
        &self,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(count, ops::esize(dtype)?, comm.nranks, "all_to_all")?;
        ops::esize(dtype)?;
        let s = ops::movement(
            send.0 as usize,
            recv.0 as usize,
            count,
            dtype,
            Move::AllToAll,
        );
        submit(comm, stream, "all_to_all", s)
    }
    fn all_to_allv(
        &self,
        send: DevicePtr,
        send_v: VCounts<'_>,
        recv: DevicePtr,
        recv_v: VCounts<'_>,
        dtype: DataType,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        let v = [
            send_v.counts.to_vec(),
            send_v.displs.to_vec(),
            recv_v.counts.to_vec(),
            recv_v.displs.to_vec(),
        ];
        let s = ops::all_to_allv(send.0 as usize, recv.0 as usize, dtype, v)?;
        submit(comm, stream, "all_to_allv", s)
    }
    fn send(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(count, ops::esize(dtype)?, 1, "send")?;
        let peer = rank_of(&comm, peer, "peer")?;
        ops::esize(dtype)?;
        let s = ops::p2p(buf.0 as usize, count, dtype, peer, true);
        submit(comm, stream, "send", s)
    }
    fn recv(
        &self,
        buf: DevicePtr,
        count: usize,
        dtype: DataType,
        peer: i32,
        c: Comm,
        stream: Stream,
    ) -> Result<()> {
        let comm = get(c)?;
        ops::check_fits(count, ops::esize(dtype)?, 1, "recv")?;
        let peer = rank_of(&comm, peer, "peer")?;
        ops::esize(dtype)?;
        let s = ops::p2p(buf.0 as usize, count, dtype, peer, false);
        submit(comm, stream, "recv", s)
    }
    fn group_start(&self) -> Result<()> {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(())
    }
    fn group_end(&self) -> Result<()> {
        let ops = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth == 0 {
                return Err(Error::invalid_argument("group_end without group_start"));
            }
            g.depth -= 1;
            Ok(if g.depth == 0 {
                std::mem::take(&mut g.ops)
            } else {
                Vec::new()
            })
        })?;
        // One task per stream, in the order the streams were first named: it starts all of the
        // stream's operations, then completes them.
        let mut by_stream: Vec<(Stream, Vec<Op>)> = Vec::new();
        for (s, op) in ops {
            match by_stream.iter_mut().find(|(x, _)| *x == s) {
                Some((_, v)) => v.push(op),
                None => by_stream.push((s, vec![op])),
            }
        }
        let mut first: Option<Error> = None;
        for (s, batch) in by_stream {
            let comms: Vec<Arc<MpiComm>> = batch.iter().map(|o| o.comm.clone()).collect();
            if let Err(e) = host::enqueue_on_stream(s, Box::new(move || ops::run(batch))) {
                for c in comms {
                    c.end();
                }
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    fn mem_alloc(&self, _bytes: usize) -> Result<DevicePtr> {
        Err(Error::unsupported(
            "the MPI CCL has no memory of its own: use the host device's",
        ))
    }
    fn mem_free(&self, _ptr: DevicePtr) -> Result<()> {
        Err(Error::unsupported("the MPI CCL has no memory of its own"))
    }
    fn mem_register(&self, c: Comm, _buf: DevicePtr, _bytes: usize) -> Result<RegHandle> {
        get(c)?;
        // MPI needs no registration: a non-null token that deregisters as a no-op.
        Ok(RegHandle(std::ptr::dangling_mut::<std::ffi::c_void>()))
    }
    fn mem_deregister(&self, c: Comm, _handle: RegHandle) -> Result<()> {
        get(c).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_level_below_serialized_is_refused_naming_the_library() {
        let e = state::check_level("libmpi_abi.so.1", 2, Some(1), 1024).unwrap_err();
        assert_eq!(e.status(), Status::VENDOR_ERROR);
        assert!(
            e.message().contains("libmpi_abi.so.1")
                && e.message().contains("MPI_THREAD_FUNNELED")
                && e.message().contains("MPI_THREAD_SERIALIZED"),
            "{}",
            e.message()
        );
        let e = state::check_level("libmpi.so.12", 3, None, 77).unwrap_err();
        assert!(
            e.message().contains("77") && e.message().contains("MPI_THREAD_MULTIPLE"),
            "{}",
            e.message()
        );
        state::check_level("x", 2, Some(3), 3).unwrap();
        state::check_level("x", 2, Some(2), 2).unwrap();
    }

    #[test]
    fn an_unknown_abi_name_lists_the_known_ones() {
        let e = Abi::parse("lam").unwrap_err();
        assert!(
            e.contains("\"lam\"")
                && e.contains("standard")
                && e.contains("openmpi")
                && e.contains("mpich"),
            "{e}"
        );
        assert_eq!(Abi::parse("mpich").unwrap(), Abi::Mpich);
    }
}
