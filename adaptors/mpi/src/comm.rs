//! A communicator over some ranks of the MPI world, made without the other ranks calling in.
//!
//! The unique id names the root's MPI world rank and carries 16 random bytes. Each member sends
//! `(cluster rank, world rank, random bytes)` to the root over `MPI_COMM_WORLD` with a tag
//! drawn from the id; the root answers every member with the world ranks of all members in
//! cluster-rank order; then the members alone call `MPI_Comm_create_group` over that group.
//! Every step waits with the communicator's deadline.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::prelude::*;

use crate::library::H;
use crate::state::{self, lock, Mpi, WaitEnd};

/// `"fxm1"`: the first bytes of an MPI unique id.
pub(crate) const UID_MAGIC: &[u8; 4] = b"fxm1";
/// Length of a unique id: magic, root world rank (u32 LE), 16 random bytes.
pub(crate) const UID_LEN: usize = 24;
/// The default deadline of a wait on a peer.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A live communicator.
pub(crate) struct MpiComm {
    pub mpi: &'static Mpi,
    /// The MPI communicator.
    pub comm: H,
    pub rank: usize,
    pub nranks: usize,
    pub device: i32,
    pub timeout: Duration,
    /// Raised by `comm_abort`: pending waits end with `ABORTED`.
    pub aborted: AtomicBool,
    /// The first failure of an operation (sticky: later operations fail with it).
    pub error: Mutex<Option<Error>>,
    /// Operations enqueued and not yet completed.
    pending: AtomicUsize,
    idle: Condvar,
    idle_lock: Mutex<()>,
    /// Persistent all-reduces of small messages, made once per (count, type, op) and started
    /// again for each call (see `ops::persistent`).
    pub persist: Mutex<Vec<crate::ops::Persistent>>,
}

/// The live communicators of this process.
pub(crate) static COMMS: HandleTable<Arc<MpiComm>> = HandleTable::new("MPI communicator");

pub(crate) fn get(c: Comm) -> Result<Arc<MpiComm>> {
    COMMS.get(c.0 as usize as u64)
}

pub(crate) fn take(c: Comm) -> Result<Arc<MpiComm>> {
    COMMS.remove(c.0 as usize as u64)
}

fn random16() -> Result<[u8; 16]> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::system("read /dev/urandom", e))?;
    Ok(b)
}

/// A new unique id naming this process's world rank as the root.
pub(crate) fn unique_id(m: &Mpi) -> Result<Vec<u8>> {
    let mut id = UID_MAGIC.to_vec();
    id.extend_from_slice(&(m.world_rank as u32).to_le_bytes());
    id.extend_from_slice(&random16()?);
    Ok(id)
}

fn wait_err(m: &Mpi, what: &str, end: WaitEnd, timeout: Duration, peer: &str) -> Error {
    match end {
        WaitEnd::Timeout => Error::new(
            Status::TIMEOUT,
            format!(
                "{what}: no answer from {peer} within {} ms over {} (has it died or not started?)",
                timeout.as_millis(),
                m.lib.path
            ),
        ),
        WaitEnd::Aborted => Error::new(Status::ABORTED, format!("{what}: aborted")),
        WaitEnd::Failed(e) => Error::new(
            Status::PEER_FAILURE,
            format!("{what}: {} reported {e}", m.lib.path),
        ),
    }
}

/// Makes this rank's communicator (see the module docs).
pub(crate) fn create(m: &'static Mpi, init: &CommInit<'_>) -> Result<MpiComm> {
    let uid = init.unique_id;
    if uid.len() != UID_LEN || &uid[..4] != UID_MAGIC {
        return Err(Error::invalid_argument("not a unique id of the MPI CCL"));
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
    let world = m.world_size as usize;
    if nranks > world {
        return Err(Error::invalid_argument(format!(
            "a communicator of {nranks} ranks does not fit in the MPI world of {} ({world} rank{}): \
             start every rank of the cluster under one launcher (mpiexec -n {nranks} or more)",
            m.lib.path,
            if world == 1 { "" } else { "s" }
        )));
    }
    let root = u32::from_le_bytes([uid[4], uid[5], uid[6], uid[7]]) as usize;
    if root >= world {
        return Err(Error::invalid_argument(format!(
            "the unique id names MPI world rank {root} as the root, outside the MPI world of {} \
             ({world} ranks)",
            m.lib.path
        )));
    }
    if rank == 0 && root != m.world_rank as usize {
        return Err(Error::invalid_argument(format!(
            "rank 0 is MPI world rank {}, but the unique id names world rank {root} (the id must \
             come from rank 0's get_unique_id)",
            m.world_rank
        )));
    }
    let timeout = match init.timeout_ms {
        0 => DEFAULT_TIMEOUT,
        ms => Duration::from_millis(ms),
    };
    m.longest_timeout_ms
        .fetch_max(timeout.as_millis() as u64, Ordering::AcqRel);
    let deadline = Instant::now() + timeout;
    let tag = 1 + (u16::from_le_bytes([uid[8], uid[9]]) as c_int % 32000);
    let secret = &uid[8..24];
    let members = if nranks == 1 {
        vec![m.world_rank]
    } else if rank == 0 {
        gather_members(m, nranks, tag, secret, deadline, timeout)?
    } else {
        join(m, rank, nranks, root, tag, secret, deadline, timeout)?
    };
    let comm = {
        let _g = lock();
        let mut world_group: H = 0;
        let mut group: H = 0;
        let mut comm: H = 0;
        // SAFETY: MPI is initialised; `members` holds `nranks` world ranks; each call writes
        // its out-handle.
        unsafe {
            m.check(
                m.lib.api.comm_group(m.lib.c.comm_world, &mut world_group),
                "MPI_Comm_group",
            )?;
            let rc =
                m.lib
                    .api
                    .group_incl(world_group, nranks as c_int, members.as_ptr(), &mut group);
            m.lib.api.group_free(&mut world_group);
            m.check(rc, "MPI_Group_incl")?;
            let rc = m
                .lib
                .api
                .comm_create_group(m.lib.c.comm_world, group, tag, &mut comm);
            m.lib.api.group_free(&mut group);
            m.check(rc, "MPI_Comm_create_group")?;
            m.lib.api.comm_set_errhandler(comm, m.lib.c.errors_return);
        }
        comm
    };
    let mut me: c_int = -1;
    // SAFETY: `comm` is the communicator just made.
    unsafe {
        m.lib.api.comm_rank(comm, &mut me);
    }
    if me != rank as c_int {
        return Err(Error::internal(format!(
            "MPI_Comm_create_group gave rank {me}, expected {rank}"
        )));
    }
    Ok(MpiComm {
        mpi: m,
        comm,
        rank,
        nranks,
        device: init.device,
        timeout,
        aborted: AtomicBool::new(false),
        error: Mutex::new(None),
        pending: AtomicUsize::new(0),
        idle: Condvar::new(),
        idle_lock: Mutex::new(()),
        persist: Mutex::new(Vec::new()),
    })
}

/// The root: receives every member's world rank, answers each with the whole list.
fn gather_members(
    m: &Mpi,
    nranks: usize,
    tag: c_int,
    secret: &[u8],
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<c_int>> {
    // Each message: cluster rank, world rank (i32 LE), the id's 16 random bytes.
    let mut bufs = vec![[0u8; 24]; nranks - 1];
    let mut reqs: Vec<H> = Vec::with_capacity(nranks - 1);
    {
        let _g = lock();
        for b in bufs.iter_mut() {
            let mut r: H = 0;
            // SAFETY: `b` lives until the wait below completes (or the process is tainted).
            let rc = unsafe {
                m.lib.api.irecv(
                    b.as_mut_ptr().cast(),
                    24,
                    m.lib.c.byte,
                    m.lib.c.any_source,
                    tag,
                    m.lib.c.comm_world,
                    &mut r,
                )
            };
            m.check(rc, "MPI_Irecv")?;
            reqs.push(r);
        }
    }
    if let Err(e) = state::wait(m, &mut reqs, deadline, None) {
        // The buffers may still be written: keep them.
        std::mem::forget(bufs);
        return Err(wait_err(
            m,
            "comm_init_rank",
            e,
            timeout,
            "every rank of the communicator",
        ));
    }
    let mut members = vec![-1; nranks];
    members[0] = m.world_rank;
    for b in &bufs {
        let r = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let w = i32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        if &b[8..24] != secret {
            return Err(Error::invalid_argument(format!(
                "comm_init_rank: MPI world rank {w} joined with another unique id"
            )));
        }
        match usize::try_from(r).ok().filter(|r| *r >= 1 && *r < nranks) {
            Some(r) if members[r] == -1 => members[r] = w,
            _ => {
                return Err(Error::invalid_argument(format!(
                    "comm_init_rank: MPI world rank {w} claims rank {r}, which is out of \
                     1..{nranks} or taken"
                )))
            }
        }
    }
    let list: Vec<u8> = members.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut reqs: Vec<H> = Vec::with_capacity(nranks - 1);
    {
        let _g = lock();
        for w in &members[1..] {
            let mut r: H = 0;
            // SAFETY: `list` lives until the wait below completes.
            let rc = unsafe {
                m.lib.api.isend(
                    list.as_ptr().cast(),
                    list.len() as c_int,
                    m.lib.c.byte,
                    *w,
                    tag,
                    m.lib.c.comm_world,
                    &mut r,
                )
            };
            m.check(rc, "MPI_Isend")?;
            reqs.push(r);
        }
    }
    if let Err(e) = state::wait(m, &mut reqs, deadline, None) {
        std::mem::forget(list);
        return Err(wait_err(
            m,
            "comm_init_rank",
            e,
            timeout,
            "the communicator's ranks",
        ));
    }
    Ok(members)
}

/// A member: sends its world rank to the root, receives the list.
#[allow(clippy::too_many_arguments)]
fn join(
    m: &Mpi,
    rank: usize,
    nranks: usize,
    root: usize,
    tag: c_int,
    secret: &[u8],
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<c_int>> {
    let mut hello = Vec::with_capacity(24);
    hello.extend_from_slice(&(rank as i32).to_le_bytes());
    hello.extend_from_slice(&m.world_rank.to_le_bytes());
    hello.extend_from_slice(secret);
    let mut list = vec![0u8; 4 * nranks];
    let mut reqs: Vec<H> = vec![0; 2];
    {
        let _g = lock();
        // SAFETY: both buffers live until the wait below completes (or are leaked).
        unsafe {
            let rc = m.lib.api.isend(
                hello.as_ptr().cast(),
                24,
                m.lib.c.byte,
                root as c_int,
                tag,
                m.lib.c.comm_world,
                &mut reqs[0],
            );
            m.check(rc, "MPI_Isend")?;
            let rc = m.lib.api.irecv(
                list.as_mut_ptr().cast(),
                list.len() as c_int,
                m.lib.c.byte,
                root as c_int,
                tag,
                m.lib.c.comm_world,
                &mut reqs[1],
            );
            m.check(rc, "MPI_Irecv")?;
        }
    }
    if let Err(e) = state::wait(m, &mut reqs, deadline, None) {
        std::mem::forget(hello);
        std::mem::forget(list);
        return Err(wait_err(
            m,
            "comm_init_rank",
            e,
            timeout,
            &format!("rank 0 (MPI world rank {root})"),
        ));
    }
    Ok(list
        .chunks(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

impl MpiComm {
    /// The sticky error, if an operation failed.
    pub fn failed(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records the first failure.
    pub fn fail(&self, e: &Error) {
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(e.clone());
        }
    }

    /// One more operation enqueued.
    pub fn begin(&self) {
        self.mpi.active.fetch_add(1, Ordering::AcqRel);
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    /// One operation completed.
    pub fn end(&self) {
        self.mpi.active.fetch_sub(1, Ordering::AcqRel);
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _g = self.idle_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.idle.notify_all();
        }
    }

    /// Waits until every enqueued operation completed (at most the timeout past the last one).
    pub fn wait_idle(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout + Duration::from_secs(1);
        let mut g = self.idle_lock.lock().unwrap_or_else(|p| p.into_inner());
        while self.pending.load(Ordering::Acquire) != 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    Status::TIMEOUT,
                    "comm_finalize: operations still pending past the timeout",
                ));
            }
            g = self
                .idle
                .wait_timeout(g, (deadline - now).min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(g);
        match self.failed() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Ends a wait that did not complete: the error, recorded as the communicator's.
    pub fn wait_error(&self, what: &str, end: WaitEnd) -> Error {
        let e = wait_err(
            self.mpi,
            &format!("{what} (rank {} of {})", self.rank, self.nranks),
            end,
            self.timeout,
            "a peer",
        );
        self.fail(&e);
        e
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        // A communicator with a request left pending is never freed (MPI would wait for it).
        if self.failed().is_some() || self.aborted.load(Ordering::Acquire) {
            return;
        }
        if self.mpi.finalized.load(Ordering::Acquire) {
            return;
        }
        let _g = lock();
        if let Some(pa) = self.mpi.lib.persist.as_deref() {
            let cache = self.persist.get_mut().unwrap_or_else(|p| p.into_inner());
            for e in cache.drain(..) {
                e.free(pa);
            }
        }
        let mut c = self.comm;
        // SAFETY: the communicator is ours and has no pending operation.
        unsafe {
            self.mpi.lib.api.comm_free(&mut c);
        }
    }
}
