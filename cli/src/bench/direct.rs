//! `ferrocx bench --direct`: the same collectives through libnccl called directly, with no
//! ferrocx table in between: the reference the NCCL adaptor's cost is measured against.
//!
//! Each rank opens libnccl as the NCCL adaptor does (the cluster's `library` option, then
//! `FERROCX_NCCL_LIBRARY`, then the loader's search path: the file the adaptor already loaded,
//! so the same library instance) through the adaptor's own loader, checks that its version is
//! the adaptor's, and makes a second communicator with `ncclCommInitRank` on the rank's current
//! device. Rank 0's unique id reaches the others through the job's store, as the
//! `Communicator`'s does. Operations use the bench's buffers and the `Communicator`'s stream and
//! are issued as nccl-tests issues them (all-to-all: `ncclSend`/`ncclRecv` to every peer in one
//! group).

use super::ops::Op;

/// What `--direct` says in a build without the NCCL adaptor.
pub const UNAVAILABLE: &str = "--direct calls libnccl through the NCCL adaptor's loader, which \
     this build of ferrocx lacks (build it with `--features cuda`)";

/// Whether this build can call libnccl directly.
pub const AVAILABLE: bool = cfg!(feature = "cuda");

#[cfg(feature = "cuda")]
mod imp {
    use std::error::Error;
    use std::ffi::{c_void, CStr};

    use ferrocx::abi::{DataType, DevicePtr, ReduceOp, Stream};
    use ferrocx::comm::Communicator;
    use ferrocx_adaptor_nccl::library::{Api, Candidates};
    use ferrocx_adaptor_nccl::{conv, sys};
    use ferrocx_plugin_sdk::Options;

    use super::Op;

    /// Store key of the direct communicator's unique id.
    const UNIQUE_ID_KEY: &str = "ferrocx-bench/direct-unique-id";

    /// A communicator made and driven through libnccl itself.
    pub struct Direct {
        api: &'static Api,
        comm: sys::ncclComm_t,
        nranks: i32,
        /// `--direct-symmetric`: the buffers `ncclMemAlloc` gave and their windows on `comm`.
        symmetric: Vec<(*mut c_void, *mut c_void)>,
    }

    /// `NCCL_WIN_COLL_SYMMETRIC`: the window may be used by NCCL's symmetric kernels.
    const NCCL_WIN_COLL_SYMMETRIC: i32 = 1;

    /// `Ok` for `ncclSuccess`, else NCCL's words for `rc`.
    fn check(api: &Api, op: &str, rc: sys::ncclResult_t) -> Result<(), Box<dyn Error>> {
        if rc == sys::NCCL_SUCCESS {
            return Ok(());
        }
        // SAFETY: takes any code and returns a static NUL-terminated string (or null).
        let p = unsafe { (api.ncclGetErrorString)(rc) };
        let what = if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null and NUL-terminated, from NCCL.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(format!("{op} (called directly): {what} (ncclResult {rc})").into())
    }

    fn ptr(p: DevicePtr) -> *mut c_void {
        p.0 as usize as *mut c_void
    }

    impl Direct {
        /// Opens libnccl and makes this rank's communicator; collective over the job.
        pub fn connect(
            comm: &Communicator,
            options: &[(String, String)],
        ) -> Result<Direct, Box<dyn Error>> {
            let candidates = Candidates::from(&Options::new(options.to_vec()));
            // Never unloaded (as the adaptor's): the function pointers stay valid.
            let api: &'static Api = Box::leak(Box::new(Api::load(&candidates)?));
            let adaptor = comm.ccl().version()?;
            if api.version != adaptor {
                return Err(format!(
                    "--direct loaded {} (NCCL {}), not the library of the nccl adaptor (version \
                     code {adaptor}): give the cluster's `library` option to pin one",
                    api.path,
                    api.version_string()
                )
                .into());
            }
            let (rank, nranks) = (comm.rank(), comm.world());
            let mut id = sys::ncclUniqueId {
                internal: [0; sys::NCCL_UNIQUE_ID_BYTES],
            };
            let bytes = if rank == 0 {
                // SAFETY: a valid out-pointer to a whole `ncclUniqueId`.
                check(api, "ncclGetUniqueId", unsafe {
                    (api.ncclGetUniqueId)(&mut id)
                })?;
                let mine: Vec<u8> = id.internal.iter().map(|&b| b as u8).collect();
                comm.store().broadcast(UNIQUE_ID_KEY, true, Some(&mine))?
            } else {
                comm.store().broadcast(UNIQUE_ID_KEY, false, None)?
            };
            if bytes.len() != sys::NCCL_UNIQUE_ID_BYTES {
                return Err(format!(
                    "the direct communicator's unique id has {} bytes, NCCL's {}",
                    bytes.len(),
                    sys::NCCL_UNIQUE_ID_BYTES
                )
                .into());
            }
            for (d, s) in id.internal.iter_mut().zip(&bytes) {
                *d = *s as _;
            }
            let nranks = i32::try_from(nranks)?;
            let mut raw: sys::ncclComm_t = std::ptr::null_mut();
            let me = i32::try_from(rank)?;
            // SAFETY: a valid out-pointer; the id by value as `nccl.h` declares it. NCCL uses
            // this thread's current device, which the Communicator selected.
            let rc = unsafe { (api.ncclCommInitRank)(&mut raw, nranks, id, me) };
            check(api, "ncclCommInitRank", rc)?;
            let direct = Direct {
                api,
                comm: raw,
                nranks,
                symmetric: Vec::new(),
            };
            let mut device = -1;
            // SAFETY: the communicator just made; a valid out-pointer.
            check(api, "ncclCommCuDevice", unsafe {
                (api.ncclCommCuDevice)(raw, &mut device)
            })?;
            let want = comm.device().get_device()?;
            if device != want {
                return Err(format!(
                    "the direct communicator of rank {rank} is on CUDA device {device}, the \
                     ferrocx one on {want}"
                )
                .into());
            }
            Ok(direct)
        }

        /// The library and its version, for the report.
        pub fn describe(&self) -> String {
            let symmetric = match self.symmetric.is_empty() {
                true => "",
                false => ", buffers registered as symmetric windows",
            };
            format!(
                "libnccl {} ({}){symmetric}",
                self.api.version_string(),
                self.api.path
            )
        }

        /// `n` buffers of `bytes` each from `ncclMemAlloc` on the current device, each
        /// registered on the direct communicator as a symmetric window
        /// (`ncclCommWindowRegister` with `NCCL_WIN_COLL_SYMMETRIC`, NCCL >= 2.27), so that
        /// NCCL may run its symmetric kernels on them. Collective: every rank asks for the same
        /// sizes. The buffers live as long as this communicator.
        pub fn symmetric_buffers(
            &mut self,
            bytes: usize,
            n: usize,
        ) -> Result<Vec<DevicePtr>, Box<dyn Error>> {
            let api = self.api;
            let lacks = |f: &str| {
                format!(
                    "--direct-symmetric needs {f} (NCCL 2.27 or later); {} is NCCL {}",
                    api.path,
                    api.version_string()
                )
            };
            let alloc = api.ncclMemAlloc.ok_or_else(|| lacks("ncclMemAlloc"))?;
            let register = api
                .ncclCommWindowRegister
                .ok_or_else(|| lacks("ncclCommWindowRegister"))?;
            api.ncclCommWindowDeregister
                .ok_or_else(|| lacks("ncclCommWindowDeregister"))?;
            api.ncclMemFree.ok_or_else(|| lacks("ncclMemFree"))?;
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                let mut p: *mut c_void = std::ptr::null_mut();
                // SAFETY: a valid out-pointer; NCCL allocates on this thread's current device.
                check(api, "ncclMemAlloc", unsafe { alloc(&mut p, bytes) })?;
                let mut win: *mut c_void = std::ptr::null_mut();
                // SAFETY: `p` holds `bytes` (just allocated), the communicator is live, and
                // every rank registers the same sizes in the same order (collective).
                let rc =
                    unsafe { register(self.comm, p, bytes, &mut win, NCCL_WIN_COLL_SYMMETRIC) };
                if let Err(e) = check(api, "ncclCommWindowRegister", rc) {
                    if let Some(free) = api.ncclMemFree {
                        // SAFETY: the allocation just made, not registered, freed once.
                        let _ = unsafe { free(p) };
                    }
                    return Err(e);
                }
                self.symmetric.push((p, win));
                out.push(DevicePtr(p as usize as u64));
            }
            Ok(out)
        }

        /// Enqueues `op` on `stream` through libnccl.
        ///
        /// # Safety
        /// `send` and `recv` are device memory of this rank's device holding the op's geometry
        /// for `count` elements until the op completes on `stream`, a stream of that device.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn issue(
            &self,
            op: Op,
            send: DevicePtr,
            recv: DevicePtr,
            count: usize,
            dtype: DataType,
            redop: ReduceOp,
            root: i32,
            stream: Stream,
        ) -> Result<(), Box<dyn Error>> {
            let api = self.api;
            let t = conv::dtype(dtype, api.version)?;
            if op == Op::AllToAll {
                return self.all_to_all(send, recv, count, dtype, t, stream);
            }
            let o = match op.reduces() {
                true => conv::op(redop, api.version)?,
                false => sys::NCCL_SUM,
            };
            let (c, s) = (self.comm, stream.0);
            // SAFETY: the buffers are the caller's (this function's contract), the communicator
            // is live, and `s` is a CUDA stream of the same device (the ABI's `Stream` is the
            // CUstream).
            let rc = unsafe {
                match op {
                    Op::AllReduce => (api.ncclAllReduce)(ptr(send), ptr(recv), count, t, o, c, s),
                    Op::AllGather => (api.ncclAllGather)(ptr(send), ptr(recv), count, t, c, s),
                    Op::ReduceScatter => {
                        (api.ncclReduceScatter)(ptr(send), ptr(recv), count, t, o, c, s)
                    }
                    Op::Broadcast => {
                        (api.ncclBroadcast)(ptr(send), ptr(recv), count, t, root, c, s)
                    }
                    Op::Reduce => (api.ncclReduce)(ptr(send), ptr(recv), count, t, o, root, c, s),
                    Op::AllToAll => sys::NCCL_SUCCESS,
                }
            };
            check(api, op.name(), rc)
        }

        fn all_to_all(
            &self,
            send: DevicePtr,
            recv: DevicePtr,
            count: usize,
            dtype: DataType,
            t: sys::ncclDataType_t,
            stream: Stream,
        ) -> Result<(), Box<dyn Error>> {
            if send == recv {
                return Err("all_to_all in place: NCCL has no in-place form".into());
            }
            let api = self.api;
            let bytes = (count * dtype.size().unwrap_or(1)) as u64;
            // SAFETY: no arguments; closed below on every path.
            check(api, "ncclGroupStart", unsafe { (api.ncclGroupStart)() })?;
            let mut issued = Ok(());
            for peer in 0..self.nranks {
                let off = peer as u64 * bytes;
                let (sb, rb) = (DevicePtr(send.0 + off), DevicePtr(recv.0 + off));
                // SAFETY: as in `issue`, for block `peer` of each buffer.
                let (a, b) = unsafe {
                    (
                        (api.ncclSend)(ptr(sb), count, t, peer, self.comm, stream.0),
                        (api.ncclRecv)(ptr(rb), count, t, peer, self.comm, stream.0),
                    )
                };
                issued = issued
                    .and_then(|()| check(api, "ncclSend", a))
                    .and_then(|()| check(api, "ncclRecv", b));
            }
            // SAFETY: closes the group opened above.
            let ended = check(api, "ncclGroupEnd", unsafe { (api.ncclGroupEnd)() });
            issued.and(ended)
        }
    }

    impl Drop for Direct {
        fn drop(&mut self) {
            for (p, win) in self.symmetric.drain(..) {
                // SAFETY: a window and allocation of `symmetric_buffers` (whose functions it
                // checked present), released once, before the communicator; the bench has
                // synchronised its stream. A failure at exit is not actionable.
                unsafe {
                    if let Some(dereg) = self.api.ncclCommWindowDeregister {
                        let _ = dereg(self.comm, win);
                    }
                    if let Some(free) = self.api.ncclMemFree {
                        let _ = free(p);
                    }
                }
            }
            // SAFETY: the communicator made in `connect`, destroyed once; the bench has
            // synchronised its stream. A failure at exit is not actionable.
            let _ = unsafe { (self.api.ncclCommDestroy)(self.comm) };
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use std::error::Error;

    use ferrocx::abi::{DataType, DevicePtr, ReduceOp, Stream};
    use ferrocx::comm::Communicator;

    use super::Op;

    /// Never made in a build without the NCCL adaptor.
    pub enum Direct {}

    impl Direct {
        /// Always the error of a build without the NCCL adaptor.
        pub fn connect(
            _comm: &Communicator,
            _options: &[(String, String)],
        ) -> Result<Direct, Box<dyn Error>> {
            Err(super::UNAVAILABLE.into())
        }

        /// Unreachable: no value exists.
        pub fn describe(&self) -> String {
            match *self {}
        }

        /// Unreachable: no value exists.
        pub fn symmetric_buffers(
            &mut self,
            _bytes: usize,
            _n: usize,
        ) -> Result<Vec<DevicePtr>, Box<dyn Error>> {
            match *self {}
        }

        /// Unreachable: no value exists.
        ///
        /// # Safety
        /// None needed: it cannot be called.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn issue(
            &self,
            _op: Op,
            _send: DevicePtr,
            _recv: DevicePtr,
            _count: usize,
            _dtype: DataType,
            _redop: ReduceOp,
            _root: i32,
            _stream: Stream,
        ) -> Result<(), Box<dyn Error>> {
            match *self {}
        }
    }
}

pub use imp::Direct;
