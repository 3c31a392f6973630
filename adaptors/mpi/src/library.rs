//! The MPI library, opened at run time: which file, which ABI (handle constants), the entry
//! points this adaptor calls.
//!
//! Three ABIs are known. The MPI standard ABI (`libmpi_abi.so.1`, MPI 5.0) has pointer-sized
//! handles with fixed small values; MPICH (`libmpi.so.12`) has `int` handles with its own
//! constants; Open MPI (`libmpi.so.40`) has pointer handles that are the addresses of its
//! predefined objects (`&ompi_mpi_comm_world`), looked up by symbol. Handles are carried as
//! `usize` here and converted to the library's own type at each call.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

/// An MPI handle (communicator, group, request, datatype, op, error handler) as this adaptor
/// carries it: the library's own value widened to `usize`.
pub(crate) type H = usize;

/// The ABI of a loaded library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abi {
    /// The MPI standard ABI (MPI 5.0, `mpi_abi.h`).
    Standard,
    /// Open MPI's ABI (`libmpi.so.40`).
    OpenMpi,
    /// MPICH's ABI (`libmpi.so.12`, shared by Intel MPI, MVAPICH, Cray MPICH).
    Mpich,
}

impl Abi {
    /// The name used in the `abi` option and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Abi::Standard => "standard",
            Abi::OpenMpi => "openmpi",
            Abi::Mpich => "mpich",
        }
    }

    /// The `abi` option's value, or an error naming the expected ones.
    pub fn parse(v: &str) -> Result<Abi, String> {
        match v {
            "standard" => Ok(Abi::Standard),
            "openmpi" => Ok(Abi::OpenMpi),
            "mpich" => Ok(Abi::Mpich),
            _ => Err(format!(
                "abi = {v:?} is not an MPI ABI this adaptor knows: expected \"standard\" (MPI 5 \
                 standard ABI, libmpi_abi.so.1), \"openmpi\" (libmpi.so.40) or \"mpich\" \
                 (libmpi.so.12)"
            )),
        }
    }
}

/// The library files tried, in order, when neither the `library` option nor
/// `FERROCX_MPI_LIBRARY` names one: the standard ABI first, then Open MPI, then MPICH.
pub const SONAMES: [(&str, Abi); 3] = [
    ("libmpi_abi.so.1", Abi::Standard),
    ("libmpi.so.40", Abi::OpenMpi),
    ("libmpi.so.12", Abi::Mpich),
];

/// The environment variable that names the MPI library (a path or a file name).
pub const ENV_LIBRARY: &str = "FERROCX_MPI_LIBRARY";

/// The handle constants of one ABI.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Consts {
    pub comm_world: H,
    pub request_null: H,
    pub errors_return: H,
    pub in_place: usize,
    pub byte: H,
    /// f32, f64, i8, u8, i32, u32, i64, u64.
    pub types: [H; 8],
    /// sum, prod, min, max.
    pub ops: [H; 4],
    /// single, funneled, serialized, multiple.
    pub thread: [c_int; 4],
    pub any_source: c_int,
    /// `MPI_INFO_NULL` (0 where the library has none to find: no persistent collectives).
    pub info_null: H,
}

const STANDARD: Consts = Consts {
    comm_world: 0x101,
    request_null: 0x180,
    errors_return: 0x143,
    in_place: 1,
    byte: 0x247,
    types: [0x210, 0x214, 0x240, 0x241, 0x250, 0x251, 0x258, 0x259],
    ops: [0x21, 0x24, 0x22, 0x23],
    thread: [0, 1024, 2048, 4096],
    any_source: -1,
    info_null: 0x130,
};

const MPICH: Consts = Consts {
    comm_world: 0x4400_0000,
    request_null: 0x2c00_0000,
    errors_return: 0x5400_0001,
    in_place: usize::MAX,
    byte: 0x4c00_010d,
    types: [
        0x4c00_040a,
        0x4c00_080b,
        0x4c00_0137,
        0x4c00_013b,
        0x4c00_0439,
        0x4c00_043d,
        0x4c00_083a,
        0x4c00_083e,
    ],
    ops: [0x5800_0003, 0x5800_0004, 0x5800_0002, 0x5800_0001],
    thread: [0, 1, 2, 3],
    any_source: -2,
    info_null: 0x1c00_0000,
};

/// Open MPI's predefined objects, by symbol: their addresses are the handles.
const OMPI_SYMBOLS: [&str; 16] = [
    "ompi_mpi_comm_world",
    "ompi_request_null",
    "ompi_mpi_errors_return",
    "ompi_mpi_byte",
    "ompi_mpi_float",
    "ompi_mpi_double",
    "ompi_mpi_int8_t",
    "ompi_mpi_uint8_t",
    "ompi_mpi_int32_t",
    "ompi_mpi_uint32_t",
    "ompi_mpi_int64_t",
    "ompi_mpi_uint64_t",
    "ompi_mpi_op_sum",
    "ompi_mpi_op_prod",
    "ompi_mpi_op_min",
    "ompi_mpi_op_max",
];

/// A handle type of a library: `int` (MPICH) or a pointer (standard ABI, Open MPI).
trait Handle: Copy + Send + Sync + 'static {
    fn from_h(h: H) -> Self;
    fn to_h(self) -> H;
}

impl Handle for c_int {
    fn from_h(h: H) -> Self {
        h as u32 as c_int
    }
    fn to_h(self) -> H {
        self as u32 as usize
    }
}

impl Handle for usize {
    fn from_h(h: H) -> Self {
        h
    }
    fn to_h(self) -> H {
        self
    }
}

/// Bytes reserved for an `MPI_Status` (the standard ABI's is 32, Open MPI's 24, MPICH's 20).
const STATUS_BYTES: usize = 64;

macro_rules! mpi_fns {
    ($($field:ident = $sym:literal : ($($arg:ty),*);)*) => {
        /// The entry points, typed with the library's handle type `T`.
        struct Fns<T> {
            $($field: unsafe extern "C" fn($($arg),*) -> c_int,)*
        }

        impl<T: Handle> Fns<T> {
            /// # Safety
            /// `lib` must be an MPI library whose handle type is `T`.
            unsafe fn load(lib: &Library) -> Result<Self, String> {
                Ok(Fns {
                    $($field: {
                        // SAFETY: the symbol is the MPI function of this name; its C signature
                        // is the one declared here, with `T` the library's handle type.
                        let s = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> c_int>(
                                concat!($sym, "\0").as_bytes(),
                            )
                        };
                        *s.map_err(|e| format!("it lacks {} ({e})", $sym))?
                    },)*
                })
            }
        }
    };
}

mpi_fns! {
    init_thread = "MPI_Init_thread": (*mut c_int, *mut *mut *mut c_char, c_int, *mut c_int);
    initialized = "MPI_Initialized": (*mut c_int);
    finalized = "MPI_Finalized": (*mut c_int);
    finalize = "MPI_Finalize": ();
    query_thread = "MPI_Query_thread": (*mut c_int);
    library_version = "MPI_Get_library_version": (*mut c_char, *mut c_int);
    get_version = "MPI_Get_version": (*mut c_int, *mut c_int);
    comm_rank = "MPI_Comm_rank": (T, *mut c_int);
    comm_size = "MPI_Comm_size": (T, *mut c_int);
    comm_group = "MPI_Comm_group": (T, *mut T);
    group_incl = "MPI_Group_incl": (T, c_int, *const c_int, *mut T);
    group_free = "MPI_Group_free": (*mut T);
    comm_create_group = "MPI_Comm_create_group": (T, T, c_int, *mut T);
    comm_free = "MPI_Comm_free": (*mut T);
    comm_set_errhandler = "MPI_Comm_set_errhandler": (T, T);
    error_string = "MPI_Error_string": (c_int, *mut c_char, *mut c_int);
    isend = "MPI_Isend": (*const c_void, c_int, T, c_int, c_int, T, *mut T);
    irecv = "MPI_Irecv": (*mut c_void, c_int, T, c_int, c_int, T, *mut T);
    test = "MPI_Test": (*mut T, *mut c_int, *mut c_void);
    iallreduce = "MPI_Iallreduce": (*const c_void, *mut c_void, c_int, T, T, T, *mut T);
    iallgather = "MPI_Iallgather": (*const c_void, c_int, T, *mut c_void, c_int, T, T, *mut T);
    ireduce_scatter_block = "MPI_Ireduce_scatter_block":
        (*const c_void, *mut c_void, c_int, T, T, T, *mut T);
    ibcast = "MPI_Ibcast": (*mut c_void, c_int, T, c_int, T, *mut T);
    ireduce = "MPI_Ireduce": (*const c_void, *mut c_void, c_int, T, T, c_int, T, *mut T);
    igather = "MPI_Igather":
        (*const c_void, c_int, T, *mut c_void, c_int, T, c_int, T, *mut T);
    iscatter = "MPI_Iscatter":
        (*const c_void, c_int, T, *mut c_void, c_int, T, c_int, T, *mut T);
    ialltoall = "MPI_Ialltoall": (*const c_void, c_int, T, *mut c_void, c_int, T, T, *mut T);
    ialltoallv = "MPI_Ialltoallv": (*const c_void, *const c_int, *const c_int, T, *mut c_void,
        *const c_int, *const c_int, T, T, *mut T);
}

/// MPI 4's persistent all-reduce: `MPI_Allreduce_init`, `MPI_Start`, `MPI_Request_free`.
struct Persist<T> {
    allreduce_init:
        unsafe extern "C" fn(*const c_void, *mut c_void, c_int, T, T, T, T, *mut T) -> c_int,
    start: unsafe extern "C" fn(*mut T) -> c_int,
    request_free: unsafe extern "C" fn(*mut T) -> c_int,
}

impl<T: Handle> Persist<T> {
    /// The three entry points, or `None` where the library lacks one (MPI before 4).
    ///
    /// # Safety
    /// `lib` must be an MPI library whose handle type is `T`.
    unsafe fn load(lib: &Library) -> Option<Self> {
        // SAFETY: (all three) the symbol is the MPI function of this name, of the signature
        // declared in the struct, with `T` the library's handle type.
        unsafe {
            Some(Persist {
                allreduce_init: *lib.get(b"MPI_Allreduce_init\0").ok()?,
                start: *lib.get(b"MPI_Start\0").ok()?,
                request_free: *lib.get(b"MPI_Request_free\0").ok()?,
            })
        }
    }
}

/// The persistent all-reduce, with handles as [`H`]; the caller holds the adaptor's MPI lock.
#[allow(clippy::too_many_arguments, missing_docs)]
pub(crate) trait PersistApi: Send + Sync {
    unsafe fn allreduce_init(
        &self,
        s: *const c_void,
        r: *mut c_void,
        n: c_int,
        dt: H,
        op: H,
        comm: H,
        info: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn start(&self, req: &mut H) -> Rc;
    unsafe fn request_free(&self, req: &mut H) -> Rc;
}

impl<T: Handle> PersistApi for Persist<T> {
    unsafe fn allreduce_init(
        &self,
        s: *const c_void,
        r: *mut c_void,
        n: c_int,
        dt: H,
        op: H,
        comm: H,
        info: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.allreduce_init)(
                s,
                r,
                n,
                T::from_h(dt),
                T::from_h(op),
                T::from_h(comm),
                T::from_h(info),
                q,
            )
        })
    }
    unsafe fn start(&self, req: &mut H) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe { (self.start)(q) })
    }
    unsafe fn request_free(&self, req: &mut H) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe { (self.request_free)(q) })
    }
}

/// Outcome of a call: the MPI return code (0 is `MPI_SUCCESS`).
pub(crate) type Rc = c_int;

/// The calls this adaptor makes, with handles as [`H`]. Every method is a direct call of the
/// MPI function of the same name; the caller holds the adaptor's MPI lock (the thread level
/// asked for is `MPI_THREAD_SERIALIZED`).
#[allow(clippy::too_many_arguments, missing_docs)]
pub(crate) trait Api: Send + Sync {
    unsafe fn init_thread(&self, required: c_int, provided: *mut c_int) -> Rc;
    unsafe fn initialized(&self, flag: *mut c_int) -> Rc;
    unsafe fn finalized(&self, flag: *mut c_int) -> Rc;
    unsafe fn finalize(&self) -> Rc;
    unsafe fn query_thread(&self, provided: *mut c_int) -> Rc;
    unsafe fn library_version(&self, buf: *mut c_char, len: *mut c_int) -> Rc;
    unsafe fn get_version(&self, major: *mut c_int, minor: *mut c_int) -> Rc;
    unsafe fn comm_rank(&self, comm: H, rank: *mut c_int) -> Rc;
    unsafe fn comm_size(&self, comm: H, size: *mut c_int) -> Rc;
    unsafe fn comm_group(&self, comm: H, group: &mut H) -> Rc;
    unsafe fn group_incl(&self, group: H, n: c_int, ranks: *const c_int, out: &mut H) -> Rc;
    unsafe fn group_free(&self, group: &mut H) -> Rc;
    unsafe fn comm_create_group(&self, comm: H, group: H, tag: c_int, out: &mut H) -> Rc;
    unsafe fn comm_free(&self, comm: &mut H) -> Rc;
    unsafe fn comm_set_errhandler(&self, comm: H, handler: H) -> Rc;
    unsafe fn error_string(&self, code: c_int, buf: *mut c_char, len: *mut c_int) -> Rc;
    unsafe fn isend(
        &self,
        buf: *const c_void,
        n: c_int,
        dt: H,
        dest: c_int,
        tag: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn irecv(
        &self,
        buf: *mut c_void,
        n: c_int,
        dt: H,
        src: c_int,
        tag: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn test(&self, req: &mut H, flag: &mut c_int) -> Rc;
    unsafe fn iallreduce(
        &self,
        s: *const c_void,
        r: *mut c_void,
        n: c_int,
        dt: H,
        op: H,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn iallgather(
        &self,
        s: *const c_void,
        sn: c_int,
        sdt: H,
        r: *mut c_void,
        rn: c_int,
        rdt: H,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn ireduce_scatter_block(
        &self,
        s: *const c_void,
        r: *mut c_void,
        n: c_int,
        dt: H,
        op: H,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn ibcast(
        &self,
        buf: *mut c_void,
        n: c_int,
        dt: H,
        root: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn ireduce(
        &self,
        s: *const c_void,
        r: *mut c_void,
        n: c_int,
        dt: H,
        op: H,
        root: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn igather(
        &self,
        s: *const c_void,
        sn: c_int,
        sdt: H,
        r: *mut c_void,
        rn: c_int,
        rdt: H,
        root: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn iscatter(
        &self,
        s: *const c_void,
        sn: c_int,
        sdt: H,
        r: *mut c_void,
        rn: c_int,
        rdt: H,
        root: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn ialltoall(
        &self,
        s: *const c_void,
        sn: c_int,
        sdt: H,
        r: *mut c_void,
        rn: c_int,
        rdt: H,
        comm: H,
        req: &mut H,
    ) -> Rc;
    unsafe fn ialltoallv(
        &self,
        s: *const c_void,
        sc: *const c_int,
        sd: *const c_int,
        sdt: H,
        r: *mut c_void,
        rc: *const c_int,
        rd: *const c_int,
        rdt: H,
        comm: H,
        req: &mut H,
    ) -> Rc;
}

/// Calls `f` with an out-handle of the library's type and widens what it wrote.
fn out<T: Handle>(h: &mut H, f: impl FnOnce(*mut T) -> Rc) -> Rc {
    let mut t = T::from_h(*h);
    let rc = f(&mut t);
    *h = t.to_h();
    rc
}

// Each method forwards to the MPI function of its name with the same arguments, the handles
// converted to the library's own type.
impl<T: Handle> Api for Fns<T> {
    unsafe fn init_thread(&self, required: c_int, provided: *mut c_int) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe {
            (self.init_thread)(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                required,
                provided,
            )
        }
    }
    unsafe fn initialized(&self, flag: *mut c_int) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.initialized)(flag) }
    }
    unsafe fn finalized(&self, flag: *mut c_int) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.finalized)(flag) }
    }
    unsafe fn finalize(&self) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.finalize)() }
    }
    unsafe fn query_thread(&self, provided: *mut c_int) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.query_thread)(provided) }
    }
    unsafe fn library_version(&self, buf: *mut c_char, len: *mut c_int) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.library_version)(buf, len) }
    }
    unsafe fn get_version(&self, major: *mut c_int, minor: *mut c_int) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.get_version)(major, minor) }
    }
    unsafe fn comm_rank(&self, comm: H, rank: *mut c_int) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.comm_rank)(T::from_h(comm), rank) }
    }
    unsafe fn comm_size(&self, comm: H, size: *mut c_int) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.comm_size)(T::from_h(comm), size) }
    }
    unsafe fn comm_group(&self, comm: H, group: &mut H) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(group, |g| unsafe { (self.comm_group)(T::from_h(comm), g) })
    }
    unsafe fn group_incl(&self, group: H, n: c_int, ranks: *const c_int, o: &mut H) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(o, |g| unsafe {
            (self.group_incl)(T::from_h(group), n, ranks, g)
        })
    }
    unsafe fn group_free(&self, group: &mut H) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(group, |g| unsafe { (self.group_free)(g) })
    }
    unsafe fn comm_create_group(&self, comm: H, group: H, tag: c_int, o: &mut H) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(o, |c| unsafe {
            (self.comm_create_group)(T::from_h(comm), T::from_h(group), tag, c)
        })
    }
    unsafe fn comm_free(&self, comm: &mut H) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(comm, |c| unsafe { (self.comm_free)(c) })
    }
    unsafe fn comm_set_errhandler(&self, comm: H, handler: H) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.comm_set_errhandler)(T::from_h(comm), T::from_h(handler)) }
    }
    unsafe fn error_string(&self, code: c_int, buf: *mut c_char, len: *mut c_int) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        unsafe { (self.error_string)(code, buf, len) }
    }
    unsafe fn isend(
        &self,
        buf: *const c_void,
        n: c_int,
        dt: H,
        dest: c_int,
        tag: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |r| unsafe {
            (self.isend)(buf, n, T::from_h(dt), dest, tag, T::from_h(comm), r)
        })
    }
    unsafe fn irecv(
        &self,
        buf: *mut c_void,
        n: c_int,
        dt: H,
        src: c_int,
        tag: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |r| unsafe {
            (self.irecv)(buf, n, T::from_h(dt), src, tag, T::from_h(comm), r)
        })
    }
    unsafe fn test(&self, req: &mut H, flag: &mut c_int) -> Rc {
        let mut status = [0u8; STATUS_BYTES];
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |r| unsafe {
            (self.test)(r, flag, status.as_mut_ptr().cast())
        })
    }
    unsafe fn iallreduce(
        &self,
        s: *const c_void,
        r: *mut c_void,
        n: c_int,
        dt: H,
        op: H,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.iallreduce)(s, r, n, T::from_h(dt), T::from_h(op), T::from_h(comm), q)
        })
    }
    unsafe fn iallgather(
        &self,
        s: *const c_void,
        sn: c_int,
        sdt: H,
        r: *mut c_void,
        rn: c_int,
        rdt: H,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.iallgather)(
                s,
                sn,
                T::from_h(sdt),
                r,
                rn,
                T::from_h(rdt),
                T::from_h(comm),
                q,
            )
        })
    }
    unsafe fn ireduce_scatter_block(
        &self,
        s: *const c_void,
        r: *mut c_void,
        n: c_int,
        dt: H,
        op: H,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.ireduce_scatter_block)(s, r, n, T::from_h(dt), T::from_h(op), T::from_h(comm), q)
        })
    }
    unsafe fn ibcast(
        &self,
        buf: *mut c_void,
        n: c_int,
        dt: H,
        root: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.ibcast)(buf, n, T::from_h(dt), root, T::from_h(comm), q)
        })
    }
    unsafe fn ireduce(
        &self,
        s: *const c_void,
        r: *mut c_void,
        n: c_int,
        dt: H,
        op: H,
        root: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.ireduce)(
                s,
                r,
                n,
                T::from_h(dt),
                T::from_h(op),
                root,
                T::from_h(comm),
                q,
            )
        })
    }
    unsafe fn igather(
        &self,
        s: *const c_void,
        sn: c_int,
        sdt: H,
        r: *mut c_void,
        rn: c_int,
        rdt: H,
        root: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.igather)(
                s,
                sn,
                T::from_h(sdt),
                r,
                rn,
                T::from_h(rdt),
                root,
                T::from_h(comm),
                q,
            )
        })
    }
    unsafe fn iscatter(
        &self,
        s: *const c_void,
        sn: c_int,
        sdt: H,
        r: *mut c_void,
        rn: c_int,
        rdt: H,
        root: c_int,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.iscatter)(
                s,
                sn,
                T::from_h(sdt),
                r,
                rn,
                T::from_h(rdt),
                root,
                T::from_h(comm),
                q,
            )
        })
    }
    unsafe fn ialltoall(
        &self,
        s: *const c_void,
        sn: c_int,
        sdt: H,
        r: *mut c_void,
        rn: c_int,
        rdt: H,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.ialltoall)(
                s,
                sn,
                T::from_h(sdt),
                r,
                rn,
                T::from_h(rdt),
                T::from_h(comm),
                q,
            )
        })
    }
    unsafe fn ialltoallv(
        &self,
        s: *const c_void,
        sc: *const c_int,
        sd: *const c_int,
        sdt: H,
        r: *mut c_void,
        rc: *const c_int,
        rd: *const c_int,
        rdt: H,
        comm: H,
        req: &mut H,
    ) -> Rc {
        // SAFETY: the caller upholds the contract of the MPI function called.
        out::<T>(req, |q| unsafe {
            (self.ialltoallv)(
                s,
                sc,
                sd,
                T::from_h(sdt),
                r,
                rc,
                rd,
                T::from_h(rdt),
                T::from_h(comm),
                q,
            )
        })
    }
}

/// An opened MPI library: its file, ABI, constants and entry points. Never closed (MPI cannot
/// be unloaded once initialised).
pub(crate) struct MpiLib {
    /// The file opened (as given to the loader, or the path found).
    pub path: String,
    /// Its ABI.
    pub abi: Abi,
    /// Its handle constants.
    pub c: Consts,
    /// Its entry points.
    pub api: Box<dyn Api>,
    /// Its persistent all-reduce (MPI 4), where it has one.
    pub persist: Option<Box<dyn PersistApi>>,
    _lib: Library,
}

impl MpiLib {
    /// The library's version text (`MPI_Get_library_version`), first line.
    pub fn version_text(&self) -> String {
        let mut buf = vec![0u8; 8192 + 1];
        let mut len: c_int = 0;
        // SAFETY: the buffer holds MPI_MAX_LIBRARY_VERSION_STRING (8192 in MPICH and the
        // standard ABI, 256 in Open MPI) bytes; callable before MPI_Init.
        let rc = unsafe { self.api.library_version(buf.as_mut_ptr().cast(), &mut len) };
        if rc != 0 {
            return String::from("(version unknown)");
        }
        let s = CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        s.lines().next().unwrap_or("").trim().to_string()
    }

    /// The message of an MPI return code.
    pub fn error_text(&self, code: c_int) -> String {
        let mut buf = vec![0u8; 1024];
        let mut len: c_int = 0;
        // SAFETY: the buffer holds MPI_MAX_ERROR_STRING (512 at most) bytes.
        let rc = unsafe {
            self.api
                .error_string(code, buf.as_mut_ptr().cast(), &mut len)
        };
        if rc != 0 {
            return format!("MPI error {code}");
        }
        let s = CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("MPI error {code}: {}", s.trim())
    }
}

/// Where to look for the library files when the system loader does not find them: the
/// virtual environment's `lib` (where the `mpich` wheel puts them) and the `lib` next to the
/// `bin` of the `mpiexec` on `PATH`.
fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["VIRTUAL_ENV", "FERROCX_VENV"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            dirs.push(PathBuf::from(v).join("lib"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            if d.join("mpiexec").is_file() {
                if let Some(parent) = d.parent() {
                    dirs.push(parent.join("lib"));
                }
            }
        }
    }
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let keep = !seen.contains(d);
        seen.push(d.clone());
        keep
    });
    dirs
}

fn open(file: &str) -> Result<Library, String> {
    // SAFETY: loading an MPI library runs its initialisers, which have no preconditions.
    // RTLD_GLOBAL: MPI implementations load their own components that resolve libmpi's
    // symbols.
    unsafe { Library::open(Some(file), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| e.to_string())
}

/// The ABI of a library named explicitly: by its file name, else by its symbols.
fn detect(file: &str, lib: &Library) -> Option<Abi> {
    let name = Path::new(file)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(file);
    let has = |s: &str| {
        let sym = format!("{s}\0");
        // SAFETY: only the symbol's presence is looked at; it is never called.
        unsafe { lib.get::<*const c_void>(sym.as_bytes()) }.is_ok()
    };
    if name.starts_with("libmpi_abi.") {
        return Some(Abi::Standard);
    }
    if has("ompi_mpi_comm_world") {
        return Some(Abi::OpenMpi);
    }
    if has("MPIR_Dup_fn") || has("MPICH_ATTR_FAILED_PROCESSES") {
        return Some(Abi::Mpich);
    }
    if has("MPI_Abi_get_version") {
        return Some(Abi::Standard);
    }
    None
}

/// Builds the library object for `lib` of ABI `abi`.
fn make(path: String, abi: Abi, lib: Library) -> Result<MpiLib, String> {
    if !{
        // SAFETY: presence only.
        unsafe { lib.get::<*const c_void>(b"MPI_Init_thread\0") }.is_ok()
    } {
        return Err("it is not an MPI library (no MPI_Init_thread)".into());
    }
    let (c, api): (Consts, Box<dyn Api>) = match abi {
        // SAFETY: the standard ABI's handles are pointers.
        Abi::Standard => (STANDARD, Box::new(unsafe { Fns::<usize>::load(&lib)? })),
        // SAFETY: MPICH's handles are ints.
        Abi::Mpich => (MPICH, Box::new(unsafe { Fns::<c_int>::load(&lib)? })),
        Abi::OpenMpi => {
            let mut v = [0usize; 16];
            for (slot, sym) in v.iter_mut().zip(OMPI_SYMBOLS) {
                let name = format!("{sym}\0");
                // SAFETY: the address of a predefined object is its handle; it is not read.
                let p = unsafe { lib.get::<*const c_void>(name.as_bytes()) }
                    .map_err(|e| format!("it lacks Open MPI's {sym} ({e})"))?;
                *slot = *p as usize;
            }
            let c = Consts {
                comm_world: v[0],
                request_null: v[1],
                errors_return: v[2],
                in_place: 1,
                byte: v[3],
                types: [v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]],
                ops: [v[12], v[13], v[14], v[15]],
                thread: [0, 1, 2, 3],
                any_source: -1,
                // SAFETY: the address of a predefined object is its handle; it is not read.
                info_null: unsafe { lib.get::<*const c_void>(b"ompi_mpi_info_null\0") }
                    .map_or(0, |p| *p as usize),
            };
            // SAFETY: Open MPI's handles are pointers.
            (c, Box::new(unsafe { Fns::<usize>::load(&lib)? }))
        }
    };
    let persist: Option<Box<dyn PersistApi>> =
        if c.info_null == 0 {
            None
        } else {
            match abi {
                // SAFETY: MPICH's handles are ints.
                Abi::Mpich => unsafe { Persist::<c_int>::load(&lib) }
                    .map(|p| Box::new(p) as Box<dyn PersistApi>),
                // SAFETY: the standard ABI's and Open MPI's handles are pointers.
                _ => unsafe { Persist::<usize>::load(&lib) }
                    .map(|p| Box::new(p) as Box<dyn PersistApi>),
            }
        };
    Ok(MpiLib {
        path,
        abi,
        c,
        api,
        persist,
        _lib: lib,
    })
}

/// Opens the MPI library: `explicit` (the `library` option, else `FERROCX_MPI_LIBRARY`) if
/// given, else the standard ABI, Open MPI and MPICH in that order, each through the system
/// loader and then in [`search_dirs`]. `abi` forces the ABI of the library. The error lists
/// every file tried and why each failed.
pub(crate) fn load(explicit: Option<&str>, abi: Option<Abi>) -> Result<MpiLib, String> {
    let dirs = search_dirs();
    let candidates: Vec<(String, Option<Abi>)> = match explicit {
        Some(f) => {
            let mut c = vec![(f.to_string(), abi)];
            if !f.contains('/') {
                c.extend(
                    dirs.iter()
                        .map(|d| (d.join(f).to_string_lossy().into_owned(), abi)),
                );
            }
            c
        }
        None => {
            let mut c = Vec::new();
            for (so, a) in SONAMES {
                if abi.is_some_and(|f| f != a) {
                    continue;
                }
                c.push((so.to_string(), Some(a)));
                c.extend(
                    dirs.iter()
                        .map(|d| (d.join(so).to_string_lossy().into_owned(), Some(a))),
                );
            }
            c
        }
    };
    try_candidates(candidates)
}

/// Opens the first of `candidates` that loads (see [`load`]).
fn try_candidates(candidates: Vec<(String, Option<Abi>)>) -> Result<MpiLib, String> {
    let mut tried: Vec<String> = Vec::new();
    for (file, a) in candidates {
        let lib = match open(&file) {
            Ok(l) => l,
            Err(e) => {
                tried.push(format!("{file}: {e}"));
                continue;
            }
        };
        let a = match a.or_else(|| detect(&file, &lib)) {
            Some(a) => a,
            None => {
                return Err(format!(
                    "{file}: unknown MPI ABI: expected the MPI standard ABI (MPI_Abi_get_version), \
                     Open MPI's (ompi_mpi_comm_world) or MPICH's (MPIR_Dup_fn); set the option \
                     abi = \"standard\" | \"openmpi\" | \"mpich\" to say which"
                ));
            }
        };
        return make(file.clone(), a, lib).map_err(|e| format!("{file} (ABI {}): {e}", a.name()));
    }
    Err(format!(
        "no MPI library could be opened; tried {} (install one with `pip install mpich`, or \
         name it with the option library = \"…\" or {ENV_LIBRARY})",
        tried.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_nothing_opens_every_file_tried_is_named_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let candidates: Vec<(String, Option<Abi>)> = SONAMES
            .iter()
            .map(|(so, a)| (dir.path().join(so).to_string_lossy().into_owned(), Some(*a)))
            .collect();
        let e = try_candidates(candidates)
            .err()
            .expect("nothing there to open");
        assert!(
            e.starts_with("no MPI library could be opened; tried "),
            "{e}"
        );
        for (so, _) in SONAMES {
            let path = dir.path().join(so);
            assert!(
                e.contains(&format!("{}: ", path.display())),
                "{so} not named: {e}"
            );
        }
        assert!(e.contains("No such file"), "no reason given: {e}");
        assert!(
            e.contains(ENV_LIBRARY) && e.contains("pip install mpich"),
            "{e}"
        );
    }

    #[test]
    fn a_library_without_mpi_init_thread_is_not_mpi() {
        let e = try_candidates(vec![("libc.so.6".into(), Some(Abi::Mpich))])
            .err()
            .expect("libc is not MPI");
        assert!(
            e.contains("libc.so.6") && e.contains("mpich") && e.contains("MPI_Init_thread"),
            "{e}"
        );
    }
}
