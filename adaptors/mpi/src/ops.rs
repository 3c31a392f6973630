//! The operations: each starts non-blocking MPI calls on the stream's worker thread, then the
//! worker waits for them (deadline, abort) and finishes (f16/bf16 back from f32, the average).

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Instant;

use ferrocx::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use ferrocx_plugin_sdk::prelude::*;

use crate::comm::MpiComm;
use crate::library::H;
use crate::state::{self, lock};

/// Started requests and what to do once they complete. Temporary buffers the requests use are
/// owned by `finish` (or `keep`), so they live until then.
pub(crate) struct Pending {
    pub reqs: Vec<H>,
    pub finish: Option<Box<dyn FnOnce() -> Result<()> + Send>>,
    pub keep: Vec<Vec<u8>>,
}

/// An operation not yet started: run on the stream's worker thread.
pub(crate) type Start = Box<dyn FnOnce(&MpiComm) -> Result<Pending> + Send>;

/// One operation as queued: its communicator, its name (for errors), how to start it.
pub(crate) struct Op {
    pub comm: Arc<MpiComm>,
    pub what: &'static str,
    pub start: Start,
}

/// Starts every operation in order, then waits for each and finishes it: the body of one
/// stream task (one operation, or a group's).
pub(crate) fn run(ops: Vec<Op>) -> Result<()> {
    let mut started: Vec<(Op0, Pending)> = Vec::with_capacity(ops.len());
    let mut first_err: Option<Error> = None;
    for op in ops {
        let Op { comm, what, start } = op;
        if first_err.is_some() {
            comm.end();
            continue;
        }
        if let Some(e) = comm.failed() {
            first_err = Some(e);
            comm.end();
            continue;
        }
        let r = {
            let _g = lock();
            start(&comm)
        };
        match r {
            Ok(p) => started.push((Op0 { comm, what }, p)),
            Err(e) => {
                comm.fail(&e);
                first_err = Some(e);
                comm.end();
            }
        }
    }
    for (op, mut p) in started {
        let deadline = Instant::now() + op.comm.timeout;
        let m = op.comm.mpi;
        let r = match state::wait(m, &mut p.reqs, deadline, Some(&op.comm.aborted)) {
            Ok(()) => p.finish.take().map_or(Ok(()), |f| f()),
            Err(end) => {
                // The buffers may still be written by MPI: never freed.
                std::mem::forget(p);
                Err(op.comm.wait_error(op.what, end))
            }
        };
        if let Err(e) = r {
            op.comm.fail(&e);
            first_err.get_or_insert(e);
        }
        op.comm.end();
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

struct Op0 {
    comm: Arc<MpiComm>,
    what: &'static str,
}

/// A count as MPI's `int`, or an error naming the limit.
pub(crate) fn icount(n: usize, what: &str) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| {
        Error::invalid_argument(format!(
            "{what}: {n} exceeds MPI's int count (at most {})",
            c_int::MAX
        ))
    })
}

/// Checks at enqueue that an operation's largest MPI count fits MPI's `int`: `count` units of
/// `unit` bytes (1 for a count in elements) times `times` (the ranks, for a buffer of every
/// rank's blocks). A refused call leaves the communicator usable.
pub(crate) fn check_fits(count: usize, unit: usize, times: usize, what: &str) -> Result<()> {
    count
        .checked_mul(unit)
        .and_then(|n| n.checked_mul(times))
        .ok_or_else(|| Error::invalid_argument(format!("{what}: count {count} overflows")))
        .and_then(|n| icount(n, what))
        .map(|_| ())
}

/// Element size of a known type.
pub(crate) fn esize(dtype: DataType) -> Result<usize> {
    dtype
        .size()
        .ok_or_else(|| Error::invalid_argument(format!("unknown data type {}", dtype.0)))
}

/// How a reduction runs on MPI.
#[derive(Clone, Copy)]
pub(crate) struct Red {
    /// MPI datatype and op.
    pub dt: H,
    pub op: H,
    /// f16/bf16 reduced in f32: which (false f16, true bf16).
    pub half: Option<bool>,
    /// AVG: the sum divided by the number of ranks afterwards.
    pub avg: bool,
    pub dtype: DataType,
}

/// The MPI datatype and op of a reduction.
pub(crate) fn red(comm: &MpiComm, dtype: DataType, op: ReduceOp) -> Result<Red> {
    let c = &comm.mpi.lib.c;
    let (dt, half) = match dtype {
        DataType::F32 => (c.types[0], None),
        DataType::F64 => (c.types[1], None),
        DataType::F16 => (c.types[0], Some(false)),
        DataType::BF16 => (c.types[0], Some(true)),
        DataType::I8 => (c.types[2], None),
        DataType::U8 => (c.types[3], None),
        DataType::I32 => (c.types[4], None),
        DataType::U32 => (c.types[5], None),
        DataType::I64 => (c.types[6], None),
        DataType::U64 => (c.types[7], None),
        _ => {
            return Err(Error::invalid_argument(format!(
                "unknown data type {}",
                dtype.0
            )))
        }
    };
    let (mop, avg) = match op {
        ReduceOp::SUM => (c.ops[0], false),
        ReduceOp::PROD => (c.ops[1], false),
        ReduceOp::MIN => (c.ops[2], false),
        ReduceOp::MAX => (c.ops[3], false),
        ReduceOp::AVG => (c.ops[0], true),
        _ => {
            return Err(Error::invalid_argument(format!(
                "unknown reduction op {}",
                op.0
            )))
        }
    };
    Ok(Red {
        dt,
        op: mop,
        half,
        avg,
        dtype,
    })
}

/// `n` f16/bf16 elements at `p` as f32 bytes.
///
/// # Safety
/// `p` must be valid for `n` 2-byte reads.
unsafe fn widen(p: usize, n: usize, bf: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 4);
    for i in 0..n {
        // SAFETY: within the `n` elements the caller vouches for.
        let h = unsafe { std::ptr::read_unaligned((p as *const u16).add(i)) };
        let f = if bf { bf16_to_f32(h) } else { f16_to_f32(h) };
        out.extend_from_slice(&f.to_ne_bytes());
    }
    out
}

/// Writes f32 bytes back as f16/bf16 at `p`, divided by `div` first.
///
/// # Safety
/// `p` must be valid for `src.len() / 4` 2-byte writes.
unsafe fn narrow(src: &[u8], p: usize, bf: bool, div: Option<f32>) {
    for (i, c) in src.chunks_exact(4).enumerate() {
        let mut f = f32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
        if let Some(d) = div {
            f /= d;
        }
        let h = if bf { f32_to_bf16(f) } else { f32_to_f16(f) };
        // SAFETY: within the elements the caller vouches for.
        unsafe { std::ptr::write_unaligned((p as *mut u16).add(i), h) };
    }
}

/// Divides `n` elements at `p` by `d` in place (AVG of a type MPI reduces natively).
///
/// # Safety
/// `p` must be valid for `n` elements of `dtype`.
unsafe fn divide(p: usize, n: usize, dtype: DataType, d: usize) {
    macro_rules! div {
        ($t:ty, $d:expr) => {
            for i in 0..n {
                // SAFETY: within the `n` elements the caller vouches for.
                unsafe {
                    let q = (p as *mut $t).add(i);
                    std::ptr::write_unaligned(q, std::ptr::read_unaligned(q) / $d);
                }
            }
        };
    }
    match dtype {
        DataType::F32 => div!(f32, d as f32),
        DataType::F64 => div!(f64, d as f64),
        DataType::I8 => div!(i8, d as i8),
        DataType::U8 => div!(u8, d as u8),
        DataType::I32 => div!(i32, d as i32),
        DataType::U32 => div!(u32, d as u32),
        DataType::I64 => div!(i64, d as i64),
        DataType::U64 => div!(u64, d as u64),
        _ => {}
    }
}

/// The post-processing of a reduction whose result (`n` elements) is at `recv` (or, for f16
/// and bf16, in `wide`, f32).
fn finish_red(r: Red, recv: usize, n: usize, nranks: usize, wide: Option<Vec<u8>>) -> Pending {
    let finish: Box<dyn FnOnce() -> Result<()> + Send> = Box::new(move || {
        match (r.half, wide) {
            (Some(bf), Some(w)) => {
                // SAFETY: `recv` holds `n` elements (the ABI's contract for the operation).
                unsafe { narrow(&w, recv, bf, r.avg.then_some(nranks as f32)) };
            }
            _ if r.avg => {
                // SAFETY: as above.
                unsafe { divide(recv, n, r.dtype, nranks) };
            }
            _ => {}
        }
        Ok(())
    });
    Pending {
        reqs: Vec::new(),
        finish: Some(finish),
        keep: Vec::new(),
    }
}

fn overlap(a: usize, alen: usize, b: usize, blen: usize) -> bool {
    alen > 0 && blen > 0 && a < b + blen && b < a + alen
}

/// A copy of `len` bytes at `p`.
///
/// # Safety
/// `p` must be valid for `len` reads.
unsafe fn copy_of(p: usize, len: usize) -> Vec<u8> {
    if len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller vouches for `len` bytes.
    unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec()
}

fn vp(p: usize) -> *mut c_void {
    p as *mut c_void
}

/// All-reduce, reduce (`root`), reduce-scatter (`scatter`: `n` is the block).
pub(crate) fn reduction(
    send: usize,
    recv: usize,
    n: usize,
    dtype: DataType,
    op: ReduceOp,
    root: Option<usize>,
    scatter: bool,
) -> Start {
    Box::new(move |comm: &MpiComm| {
        let m = comm.mpi;
        let r = red(comm, dtype, op)?;
        let size = esize(dtype)?;
        let p = comm.nranks;
        let total = if scatter { n * p } else { n };
        let what = if scatter {
            "reduce_scatter"
        } else if root.is_some() {
            "reduce"
        } else {
            "all_reduce"
        };
        let cnt = icount(n, what)?;
        icount(total, what)?;
        if !scatter && root.is_none() && r.half.is_none() && n * size <= PERSIST_MAX_BYTES {
            if let Some(p) = persistent(comm, r, send, recv, n, size, cnt)? {
                return Ok(p);
            }
        }
        let is_root = root.is_none_or(|x| x == comm.rank);
        let mut req: H = 0;
        let mut keep = Vec::new();
        let wide = match r.half {
            Some(bf) => {
                // SAFETY: `send` holds `total` elements of `dtype`.
                let win = unsafe { widen(send, total, bf) };
                let mut wout = vec![0u8; n * 4];
                let (s, o) = (win.as_ptr() as usize, wout.as_mut_ptr() as usize);
                keep.push(win);
                let rc = start_red(comm, r, s, o, cnt, root, scatter, &mut req);
                m.check(rc, what)?;
                Some(wout)
            }
            None => {
                let mut s = send;
                if scatter && overlap(send, total * size, recv, n * size) {
                    // SAFETY: `send` holds `total` elements.
                    let c = unsafe { copy_of(send, total * size) };
                    s = c.as_ptr() as usize;
                    keep.push(c);
                } else if !scatter && send == recv && is_root {
                    s = m.lib.c.in_place;
                }
                let rc = start_red(comm, r, s, recv, cnt, root, scatter, &mut req);
                m.check(rc, what)?;
                None
            }
        };
        let mut pending = if is_root {
            finish_red(r, recv, n, p, wide)
        } else {
            if let Some(w) = wide {
                keep.push(w);
            }
            Pending {
                reqs: Vec::new(),
                finish: None,
                keep: Vec::new(),
            }
        };
        pending.reqs.push(req);
        pending.keep.extend(keep);
        Ok(pending)
    })
}

/// All-reduces up to this size (bytes) run as persistent all-reduces (MPI 4's
/// `MPI_Allreduce_init` once, `MPI_Start` per call) where the library has them: started
/// without building a schedule, they cost what a blocking `MPI_Allreduce` does (MPICH builds
/// one per `MPI_Iallreduce`: several µs at 8 B), and remain non-blocking.
pub(crate) const PERSIST_MAX_BYTES: usize = 64 << 10;

/// Persistent all-reduces kept per communicator (the oldest idle one makes room).
const PERSIST_ENTRIES: usize = 16;

/// One persistent all-reduce of a communicator: its key, its request, and the buffers it was
/// made on (the caller's data is copied in and out: the request's buffers are fixed, and the
/// ranks' choice of request must not depend on addresses, which differ between ranks).
pub(crate) struct Persistent {
    key: (usize, H, H),
    req: H,
    send: Box<[u8]>,
    recv: Box<[u8]>,
    /// Started and not yet finished (never again if its wait failed: MPI may still write).
    busy: Arc<std::sync::atomic::AtomicBool>,
}

impl Persistent {
    /// Frees the request (inactive: not busy), under the MPI lock.
    pub(crate) fn free(mut self, pa: &dyn crate::library::PersistApi) {
        if !self.busy.load(std::sync::atomic::Ordering::Acquire) {
            // SAFETY: an inactive persistent request of this library.
            unsafe { pa.request_free(&mut self.req) };
        } else {
            // MPI may still write the buffers.
            std::mem::forget(self);
        }
    }
}

/// Starts the all-reduce as a persistent one: the communicator's request for (`n`, type, op)
/// not in use (made when there is none; the oldest idle one is freed past
/// [`PERSIST_ENTRIES`]). The choice depends only on the sequence of calls, the same on every
/// rank. `None`: no persistent all-reduce here (the library lacks them, or every one is busy).
fn persistent(
    comm: &MpiComm,
    r: Red,
    send: usize,
    recv: usize,
    n: usize,
    size: usize,
    cnt: c_int,
) -> Result<Option<Pending>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let m = comm.mpi;
    let Some(pa) = m.lib.persist.as_deref() else {
        return Ok(None);
    };
    let bytes = n * size;
    let key = (n, r.dt, r.op);
    let mut cache = comm.persist.lock().unwrap_or_else(|p| p.into_inner());
    let idle = |e: &Persistent| !e.busy.load(Ordering::Acquire);
    let at = match cache.iter().position(|e| e.key == key && idle(e)) {
        Some(i) => i,
        None => {
            if cache.len() >= PERSIST_ENTRIES {
                let Some(old) = cache.iter().position(idle) else {
                    return Ok(None);
                };
                cache.remove(old).free(pa);
            }
            let mut e = Persistent {
                key,
                req: m.lib.c.request_null,
                send: vec![0u8; bytes].into_boxed_slice(),
                recv: vec![0u8; bytes].into_boxed_slice(),
                busy: Arc::new(AtomicBool::new(false)),
            };
            // SAFETY: the entry's buffers hold `n` elements and live as long as the request
            // (freed with it, or never while it may be active); the handles are the
            // library's.
            let rc = unsafe {
                pa.allreduce_init(
                    e.send.as_ptr().cast(),
                    e.recv.as_mut_ptr().cast(),
                    cnt,
                    r.dt,
                    r.op,
                    comm.comm,
                    m.lib.c.info_null,
                    &mut e.req,
                )
            };
            m.check(rc, "all_reduce")?;
            cache.push(e);
            cache.len() - 1
        }
    };
    let e = &mut cache[at];
    // SAFETY: `send` holds `n` elements (the ABI's contract); the entry's buffer as many, and
    // its request is inactive (not busy).
    unsafe { std::ptr::copy_nonoverlapping(send as *const u8, e.send.as_mut_ptr(), bytes) };
    // SAFETY: an inactive persistent request of this library.
    let rc = unsafe { pa.start(&mut e.req) };
    m.check(rc, "all_reduce")?;
    e.busy.store(true, Ordering::Release);
    let (busy, from, p) = (e.busy.clone(), e.recv.as_ptr() as usize, comm.nranks);
    let finish: Box<dyn FnOnce() -> Result<()> + Send> = Box::new(move || {
        // SAFETY: the request completed: the entry's buffer holds the result (the entry lives
        // while busy); `recv` holds `n` elements (the ABI's contract).
        unsafe { std::ptr::copy_nonoverlapping(from as *const u8, recv as *mut u8, bytes) };
        if r.avg {
            // SAFETY: as above.
            unsafe { divide(recv, n, r.dtype, p) };
        }
        busy.store(false, Ordering::Release);
        Ok(())
    });
    Ok(Some(Pending {
        reqs: vec![e.req],
        finish: Some(finish),
        keep: Vec::new(),
    }))
}

#[allow(clippy::too_many_arguments)]
fn start_red(
    comm: &MpiComm,
    r: Red,
    s: usize,
    o: usize,
    cnt: c_int,
    root: Option<usize>,
    scatter: bool,
    req: &mut H,
) -> c_int {
    let api = &comm.mpi.lib.api;
    // SAFETY: (all three calls) the buffers hold what the operation needs (the ABI's
    // contract, or temporaries kept until completion); the handles are the library's.
    unsafe {
        if scatter {
            api.ireduce_scatter_block(vp(s), vp(o), cnt, r.dt, r.op, comm.comm, req)
        } else if let Some(root) = root {
            api.ireduce(vp(s), vp(o), cnt, r.dt, r.op, root as c_int, comm.comm, req)
        } else {
            api.iallreduce(vp(s), vp(o), cnt, r.dt, r.op, comm.comm, req)
        }
    }
}

/// Which data-movement collective.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Move {
    AllGather,
    Gather(usize),
    Scatter(usize),
    Broadcast(usize),
    AllToAll,
}

/// All-gather, gather, scatter, broadcast, all-to-all of `n` elements a block, as bytes.
pub(crate) fn movement(send: usize, recv: usize, n: usize, dtype: DataType, kind: Move) -> Start {
    Box::new(move |comm: &MpiComm| {
        let m = comm.mpi;
        let api = &m.lib.api;
        let c = &m.lib.c;
        let b = n * esize(dtype)?;
        let p = comm.nranks;
        let what = match kind {
            Move::AllGather => "all_gather",
            Move::Gather(_) => "gather",
            Move::Scatter(_) => "scatter",
            Move::Broadcast(_) => "broadcast",
            Move::AllToAll => "all_to_all",
        };
        let bi = icount(b, what)?;
        icount(b * p, what)?;
        let me = comm.rank;
        let mut keep = Vec::new();
        let mut req: H = 0;
        let mut s = send;
        let mut o = recv;
        // SAFETY: (every arm) the buffers hold what the operation needs (the ABI's contract),
        // copies are kept until completion, the handles are the library's.
        let rc = unsafe {
            match kind {
                Move::AllGather => {
                    if send == recv + me * b {
                        s = c.in_place;
                    } else if overlap(send, b, recv, b * p) {
                        let v = copy_of(send, b);
                        s = v.as_ptr() as usize;
                        keep.push(v);
                    }
                    api.iallgather(vp(s), bi, c.byte, vp(recv), bi, c.byte, comm.comm, &mut req)
                }
                Move::Gather(root) => {
                    if me == root && send == recv + root * b {
                        s = c.in_place;
                    } else if me == root && overlap(send, b, recv, b * p) {
                        let v = copy_of(send, b);
                        s = v.as_ptr() as usize;
                        keep.push(v);
                    }
                    api.igather(
                        vp(s),
                        bi,
                        c.byte,
                        vp(recv),
                        bi,
                        c.byte,
                        root as c_int,
                        comm.comm,
                        &mut req,
                    )
                }
                Move::Scatter(root) => {
                    if me == root && recv == send + root * b {
                        o = c.in_place;
                    } else if me == root && overlap(send, b * p, recv, b) {
                        let v = copy_of(send, b * p);
                        s = v.as_ptr() as usize;
                        keep.push(v);
                    }
                    api.iscatter(
                        vp(s),
                        bi,
                        c.byte,
                        vp(o),
                        bi,
                        c.byte,
                        root as c_int,
                        comm.comm,
                        &mut req,
                    )
                }
                Move::Broadcast(root) => {
                    if me == root && send != recv && b > 0 {
                        std::ptr::copy(send as *const u8, recv as *mut u8, b);
                    }
                    api.ibcast(vp(recv), bi, c.byte, root as c_int, comm.comm, &mut req)
                }
                Move::AllToAll => {
                    if overlap(send, b * p, recv, b * p) {
                        let v = copy_of(send, b * p);
                        s = v.as_ptr() as usize;
                        keep.push(v);
                    }
                    api.ialltoall(vp(s), bi, c.byte, vp(o), bi, c.byte, comm.comm, &mut req)
                }
            }
        };
        m.check(rc, what)?;
        Ok(Pending {
            reqs: vec![req],
            finish: None,
            keep,
        })
    })
}

/// All-to-all with per-peer counts and displacements (elements; copied at enqueue).
pub(crate) fn all_to_allv(
    send: usize,
    recv: usize,
    dtype: DataType,
    v: [Vec<usize>; 4],
) -> Result<Start> {
    let size = esize(dtype)?;
    let ints = |xs: &[usize]| -> Result<Vec<c_int>> {
        xs.iter().map(|x| icount(x * size, "all_to_allv")).collect()
    };
    let (sc, sd, rc, rd) = (ints(&v[0])?, ints(&v[1])?, ints(&v[2])?, ints(&v[3])?);
    let extent = |c: &[usize], d: &[usize]| {
        c.iter()
            .zip(d)
            .map(|(c, d)| (c + d) * size)
            .max()
            .unwrap_or(0)
    };
    let (sext, rext) = (extent(&v[0], &v[1]), extent(&v[2], &v[3]));
    Ok(Box::new(move |comm: &MpiComm| {
        let m = comm.mpi;
        let c = &m.lib.c;
        let mut s = send;
        let mut keep = Vec::new();
        if overlap(send, sext, recv, rext) {
            // SAFETY: `send` holds `sext` bytes (its counts and displacements).
            let v = unsafe { copy_of(send, sext) };
            s = v.as_ptr() as usize;
            keep.push(v);
        }
        let mut req: H = 0;
        // SAFETY: buffers as the counts say (the ABI's contract); the arrays live in `keep`'s
        // closure until completion.
        let r = unsafe {
            m.lib.api.ialltoallv(
                vp(s),
                sc.as_ptr(),
                sd.as_ptr(),
                c.byte,
                vp(recv),
                rc.as_ptr(),
                rd.as_ptr(),
                c.byte,
                comm.comm,
                &mut req,
            )
        };
        m.check(r, "all_to_allv")?;
        let arrays: Vec<Vec<u8>> = [sc, sd, rc, rd]
            .into_iter()
            .map(|a| a.iter().flat_map(|x| x.to_ne_bytes()).collect())
            .collect();
        keep.extend(arrays);
        Ok(Pending {
            reqs: vec![req],
            finish: None,
            keep,
        })
    }))
}

/// The tag of point-to-point messages (MPI keeps them in order per peer and tag).
const P2P_TAG: c_int = 7;

/// Send (`is_send`) or receive `n` elements with `peer`.
pub(crate) fn p2p(buf: usize, n: usize, dtype: DataType, peer: usize, is_send: bool) -> Start {
    Box::new(move |comm: &MpiComm| {
        let m = comm.mpi;
        let c = &m.lib.c;
        let what = if is_send { "send" } else { "recv" };
        let b = icount(n * esize(dtype)?, what)?;
        let mut req: H = 0;
        // SAFETY: `buf` holds `n` elements (the ABI's contract) until completion.
        let rc = unsafe {
            if is_send {
                m.lib.api.isend(
                    vp(buf),
                    b,
                    c.byte,
                    peer as c_int,
                    P2P_TAG,
                    comm.comm,
                    &mut req,
                )
            } else {
                m.lib.api.irecv(
                    vp(buf),
                    b,
                    c.byte,
                    peer as c_int,
                    P2P_TAG,
                    comm.comm,
                    &mut req,
                )
            }
        };
        m.check(rc, what)?;
        Ok(Pending {
            reqs: vec![req],
            finish: None,
            keep: Vec::new(),
        })
    })
}
