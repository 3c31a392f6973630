//! Scalar types shared by every table: status codes, data types, reduction ops, opaque handles.
//!
//! Every value that crosses the boundary is a `#[repr(transparent)]` integer or pointer newtype
//! with associated constants, never a Rust `enum`: a C plugin can return any integer, and an
//! out-of-range value must be an error to report, not undefined behaviour.

use std::ffi::{c_char, c_void};
use std::fmt;

use abi_stable::StableAbi;

/// The result of every ABI entry. `SUCCESS` is zero; anything else is a failure whose message
/// the plugin's `get_last_error` returns.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, StableAbi)]
pub struct Status(pub i32);

impl Status {
    /// The call completed.
    pub const SUCCESS: Status = Status(0);
    /// The adaptor does not implement this operation (or this variant of it).
    pub const UNSUPPORTED: Status = Status(1);
    /// An argument was out of range, null where a value is required, or inconsistent.
    pub const INVALID_ARGUMENT: Status = Status(2);
    /// A handle (stream, event, communicator, pointer) is unknown or already released.
    pub const INVALID_HANDLE: Status = Status(3);
    /// Memory could not be allocated.
    pub const OUT_OF_MEMORY: Status = Status(4);
    /// Asynchronous work is still pending (`stream_query`, `event_query`).
    pub const NOT_READY: Status = Status(5);
    /// A wait passed its deadline.
    pub const TIMEOUT: Status = Status(6);
    /// A peer failed or disappeared.
    pub const PEER_FAILURE: Status = Status(7);
    /// The communicator was aborted.
    pub const ABORTED: Status = Status(8);
    /// The vendor runtime (driver, library) reported an error.
    pub const VENDOR_ERROR: Status = Status(9);
    /// An operating-system call failed.
    pub const SYSTEM_ERROR: Status = Status(10);
    /// A bug in the adaptor, including a Rust panic caught at the boundary.
    pub const INTERNAL_ERROR: Status = Status(11);
    /// The output buffer is too small; the required size was written back.
    pub const BUFFER_TOO_SMALL: Status = Status(12);
    /// The adaptor was not initialised (`init` not called, or it failed).
    pub const NOT_INITIALIZED: Status = Status(13);

    /// `true` for [`Status::SUCCESS`].
    pub fn is_success(self) -> bool {
        self == Status::SUCCESS
    }

    /// The constant's name, or `None` for a value this build does not know.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "SUCCESS",
            1 => "UNSUPPORTED",
            2 => "INVALID_ARGUMENT",
            3 => "INVALID_HANDLE",
            4 => "OUT_OF_MEMORY",
            5 => "NOT_READY",
            6 => "TIMEOUT",
            7 => "PEER_FAILURE",
            8 => "ABORTED",
            9 => "VENDOR_ERROR",
            10 => "SYSTEM_ERROR",
            11 => "INTERNAL_ERROR",
            12 => "BUFFER_TOO_SMALL",
            13 => "NOT_INITIALIZED",
            _ => return None,
        })
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Status({})", self.0),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Element type of a collective's buffers.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, StableAbi)]
pub struct DataType(pub u32);

impl DataType {
    /// IEEE-754 binary32.
    pub const F32: DataType = DataType(0);
    /// IEEE-754 binary64.
    pub const F64: DataType = DataType(1);
    /// IEEE-754 binary16.
    pub const F16: DataType = DataType(2);
    /// bfloat16.
    pub const BF16: DataType = DataType(3);
    /// Signed 8-bit integer.
    pub const I8: DataType = DataType(4);
    /// Unsigned 8-bit integer.
    pub const U8: DataType = DataType(5);
    /// Signed 32-bit integer.
    pub const I32: DataType = DataType(6);
    /// Unsigned 32-bit integer.
    pub const U32: DataType = DataType(7);
    /// Signed 64-bit integer.
    pub const I64: DataType = DataType(8);
    /// Unsigned 64-bit integer.
    pub const U64: DataType = DataType(9);

    /// Every data type of ABI v1, in constant order.
    pub const ALL: [DataType; 10] = [
        Self::F32,
        Self::F64,
        Self::F16,
        Self::BF16,
        Self::I8,
        Self::U8,
        Self::I32,
        Self::U32,
        Self::I64,
        Self::U64,
    ];

    /// Size of one element in bytes, or `None` for an unknown value.
    pub fn size(self) -> Option<usize> {
        Some(match self {
            Self::F64 | Self::I64 | Self::U64 => 8,
            Self::F32 | Self::I32 | Self::U32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::I8 | Self::U8 => 1,
            _ => return None,
        })
    }

    /// Short lowercase name (`f32`, `bf16`, …) as used in configs and tables.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::F32 => "f32",
            Self::F64 => "f64",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::I8 => "i8",
            Self::U8 => "u8",
            Self::I32 => "i32",
            Self::U32 => "u32",
            Self::I64 => "i64",
            Self::U64 => "u64",
            _ => return None,
        })
    }
}

impl fmt::Debug for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "DataType({})", self.0),
        }
    }
}

/// Reduction operator of a reducing collective.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, StableAbi)]
pub struct ReduceOp(pub u32);

impl ReduceOp {
    /// Sum of all contributions.
    pub const SUM: ReduceOp = ReduceOp(0);
    /// Product of all contributions.
    pub const PROD: ReduceOp = ReduceOp(1);
    /// Minimum.
    pub const MIN: ReduceOp = ReduceOp(2);
    /// Maximum.
    pub const MAX: ReduceOp = ReduceOp(3);
    /// Sum divided by the number of ranks.
    pub const AVG: ReduceOp = ReduceOp(4);

    /// Every reduction op of ABI v1, in constant order.
    pub const ALL: [ReduceOp; 5] = [Self::SUM, Self::PROD, Self::MIN, Self::MAX, Self::AVG];

    /// Short lowercase name (`sum`, `avg`, …).
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::SUM => "sum",
            Self::PROD => "prod",
            Self::MIN => "min",
            Self::MAX => "max",
            Self::AVG => "avg",
            _ => return None,
        })
    }
}

impl fmt::Debug for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "ReduceOp({})", self.0),
        }
    }
}

/// Where an allocation lives.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct MemKind(pub u32);

impl MemKind {
    /// Device memory.
    pub const DEVICE: MemKind = MemKind(0);
    /// Ordinary (pageable) host memory.
    pub const HOST: MemKind = MemKind(1);
    /// Page-locked host memory the device can reach directly.
    pub const PINNED: MemKind = MemKind(2);
}

/// Capability bits reported in [`crate::abi::DeviceProperties::capabilities`].
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, StableAbi)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// Memory handles can be exported to and imported by other processes (`ipc_*`).
    pub const IPC: Capabilities = Capabilities(1 << 0);
    /// Exportable physical allocations with POSIX file descriptors (VMM group).
    pub const VMM: Capabilities = Capabilities(1 << 1);
    /// Peers' allocations can be mapped into one reserved range (flat-map group).
    pub const FLAT_MAP: Capabilities = Capabilities(1 << 2);
    /// Multicast objects are supported by the hardware (multicast group).
    pub const MULTICAST: Capabilities = Capabilities(1 << 3);
    /// Host functions can be launched on a stream.
    pub const HOST_FUNC: Capabilities = Capabilities(1 << 4);
    /// A stream created by another library can be wrapped.
    pub const STREAM_WRAP: Capabilities = Capabilities(1 << 5);
    /// Events can measure elapsed time.
    pub const TIMED_EVENTS: Capabilities = Capabilities(1 << 6);
    /// Device memory is directly addressable from the host (CPU devices).
    pub const HOST_ADDRESSABLE: Capabilities = Capabilities(1 << 7);

    /// Names of the known bits, in bit order.
    pub const NAMES: [(Capabilities, &'static str); 8] = [
        (Self::IPC, "ipc"),
        (Self::VMM, "vmm"),
        (Self::FLAT_MAP, "flat_map"),
        (Self::MULTICAST, "multicast"),
        (Self::HOST_FUNC, "host_func"),
        (Self::STREAM_WRAP, "stream_wrap"),
        (Self::TIMED_EVENTS, "timed_events"),
        (Self::HOST_ADDRESSABLE, "host_addressable"),
    ];

    /// `true` when every bit of `other` is set.
    pub fn contains(self, other: Capabilities) -> bool {
        self.0 & other.0 == other.0
    }

    /// The names of the set bits this build knows.
    pub fn names(self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .filter(|(c, _)| self.contains(*c))
            .map(|(_, n)| *n)
            .collect()
    }
}

impl std::ops::BitOr for Capabilities {
    type Output = Capabilities;
    fn bitor(self, rhs: Capabilities) -> Capabilities {
        Capabilities(self.0 | rhs.0)
    }
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Capabilities({})", self.names().join("|"))
    }
}

/// An address in the adaptor's unified address space: device memory, pinned or ordinary host
/// memory. `memcpy` takes any two of them, as CUDA's unified addressing does.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, StableAbi)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null address.
    pub const NULL: DevicePtr = DevicePtr(0);
}

/// Adds the null constant and thread-safety impls to an opaque pointer handle. (The structs are
/// written out, not generated, so the C header generator sees them.)
macro_rules! opaque_handle {
    ($name:ident) => {
        impl $name {
            /// The null handle (for streams: the adaptor's default stream).
            pub const NULL: $name = $name(std::ptr::null_mut());

            /// `true` for the null handle.
            pub fn is_null(self) -> bool {
                self.0.is_null()
            }
        }

        // SAFETY: a handle is an opaque token the adaptor hands out; the adaptor's own
        // functions are required to be callable from any thread with it.
        unsafe impl Send for $name {}
        // SAFETY: as above; the handle itself is never dereferenced by the core.
        unsafe impl Sync for $name {}
    };
}

/// A stream of the device adaptor. For CUDA, the `CUstream` itself, so a CCL adaptor of the
/// same vendor can pass it on unchanged. Null is the adaptor's default stream.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct Stream(pub *mut c_void);
opaque_handle!(Stream);

/// An event of the device adaptor.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct Event(pub *mut c_void);
opaque_handle!(Event);

/// A communicator of the CCL adaptor.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct Comm(pub *mut c_void);
opaque_handle!(Comm);

/// A buffer registration of the CCL adaptor (`mem_register`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct RegHandle(pub *mut c_void);
opaque_handle!(RegHandle);

/// A window registered by the CCL adaptor's window group.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct WindowHandle(pub *mut c_void);
opaque_handle!(WindowHandle);

/// An executable graph of the graph group: work captured from a stream, instantiated, ready to
/// launch on any stream of the same device any number of times (for CUDA, the `CUgraphExec`).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct GraphHandle(pub *mut c_void);
opaque_handle!(GraphHandle);

/// A module of the kernel group: code loaded from an image onto one device (for CUDA, the
/// `CUmodule`). *Since ABI 1.2.*
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct ModuleHandle(pub *mut c_void);
opaque_handle!(ModuleHandle);

/// A function of a loaded module, ready to launch (for CUDA, the `CUfunction`). Valid until its
/// module is unloaded. *Since ABI 1.2.*
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct FunctionHandle(pub *mut c_void);
opaque_handle!(FunctionHandle);

/// The format of a kernel image given to the kernel group's `module_load`. Values from
/// [`ImageFormat::VENDOR_BASE`] up are a vendor's own formats. *Since ABI 1.2.*
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, StableAbi)]
pub struct ImageFormat(pub u32);

impl ImageFormat {
    /// NVIDIA PTX assembly text (the image need not be NUL-terminated: its length is given).
    pub const PTX: ImageFormat = ImageFormat(1);
    /// An NVIDIA CUBIN for one architecture (what NVRTC's `nvrtcGetCUBIN` returns).
    pub const CUBIN: ImageFormat = ImageFormat(2);
    /// An NVIDIA fat binary: CUBINs and PTX for several architectures.
    pub const FATBIN: ImageFormat = ImageFormat(3);
    /// The first value of the range left to vendors' own formats.
    pub const VENDOR_BASE: ImageFormat = ImageFormat(0x1000);

    /// Short lowercase name (`ptx`, `cubin`, `fatbin`), or `None` for a vendor's or an unknown
    /// value.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::PTX => "ptx",
            Self::CUBIN => "cubin",
            Self::FATBIN => "fatbin",
            _ => return None,
        })
    }

    /// `true` for a value of the vendors' range.
    pub fn is_vendor(self) -> bool {
        self.0 >= Self::VENDOR_BASE.0
    }
}

impl fmt::Debug for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None if self.is_vendor() => write!(f, "vendor({:#x})", self.0),
            None => write!(f, "ImageFormat({})", self.0),
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A physical allocation of the VMM group (exportable, mappable).
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct VmmHandle(pub u64);

/// A multicast object of the multicast group.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, StableAbi)]
pub struct McHandle(pub u64);

/// A host function launched on a stream: called once, in stream order, with `user`.
/// (`Option` so that a null pointer from C is a value, not undefined behaviour.)
pub type HostFn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// A NUL-terminated string with static storage, readable from any thread.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, StableAbi)]
pub struct StaticCStr(pub *const c_char);

impl StaticCStr {
    /// Wraps a `'static` C string.
    pub const fn new(s: &'static std::ffi::CStr) -> Self {
        StaticCStr(s.as_ptr())
    }
}

// SAFETY: points to immutable, NUL-terminated data of static storage duration.
unsafe impl Send for StaticCStr {}
// SAFETY: as above.
unsafe impl Sync for StaticCStr {}

/// One `key = value` option from the configuration, passed to `init` and `comm_init_rank`.
/// Both strings are NUL-terminated and valid for the duration of the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KeyValue {
    /// Option name.
    pub key: *const c_char,
    /// Option value, as text.
    pub value: *const c_char,
}
