//! The header every table starts with, and the rules for reading a table of another minor.

use abi_stable::StableAbi;

use super::types::StaticCStr;

/// `"FRCX"` read as a little-endian `u32`: the first field of every table.
pub const ABI_MAGIC: u32 = 0x5843_5246;
/// The ABI major this build speaks. A table of another major is refused.
pub const ABI_MAJOR: u16 = 1;
/// The ABI minor this build knows. A table of a newer minor is read up to the fields this build
/// knows; a table of an older minor has the fields past its `struct_size` treated as absent.
///
/// History: 1.0, the first release; 1.1 appends `mem_get_info` to the device adaptor table;
/// 1.2 adds the kernel group (`ferrocx_device_kernel_v1`) and appends `query_support` to the
/// CCL adaptor table; 1.3 adds the memops group (`ferrocx_device_memops_v1`: 32-bit stores and
/// waits on host memory in stream order) and appends `get_limits` (the CCL's declared maximum
/// ranks, data types and reductions) to the CCL adaptor table.
pub const ABI_MINOR: u16 = 3;

/// The first field of every table (`#[repr(C)]`, 24 bytes on 64-bit targets).
#[repr(C)]
#[derive(Clone, Copy, Debug, StableAbi)]
pub struct AbiHeader {
    /// Always [`ABI_MAGIC`].
    pub magic: u32,
    /// ABI major the table was built against.
    pub abi_major: u16,
    /// ABI minor the table was built against.
    pub abi_minor: u16,
    /// `sizeof` the whole table, header included, as the plugin was compiled.
    pub struct_size: u32,
    /// Zero; keeps `name` aligned in C and leaves room for flags.
    pub reserved: u32,
    /// The adaptor's name (`"host"`, `"cuda"`, …): lowercase, NUL-terminated, static.
    pub name: StaticCStr,
}

impl AbiHeader {
    /// A header for a table of type `T` built against this crate's ABI version.
    pub const fn new<T>(name: &'static std::ffi::CStr) -> Self {
        AbiHeader {
            magic: ABI_MAGIC,
            abi_major: ABI_MAJOR,
            abi_minor: ABI_MINOR,
            struct_size: std::mem::size_of::<T>() as u32,
            reserved: 0,
            name: StaticCStr::new(name),
        }
    }
}

/// Implemented by every `#[repr(C)]` table that starts with an [`AbiHeader`].
///
/// # Safety
/// The type must be `#[repr(C)]`, its first field an [`AbiHeader`], and every other field an
/// `Option` of a function pointer (all-zero bytes are then a valid value meaning "absent").
pub unsafe trait AbiTable: Sized + 'static {
    /// The exported symbol of this table (`ferrocx_device_adaptor_v1`).
    const SYMBOL: &'static str;
    /// What the table is, for messages (`device adaptor`, `VMM group`).
    const KIND: &'static str;
    /// The ABI major this table type belongs to.
    const MAJOR: u16;
    /// The names of the entries after the header, in field order, with their byte offsets.
    fn entries() -> &'static [(&'static str, usize)];
    /// The table's header.
    fn header(&self) -> &AbiHeader;
}
