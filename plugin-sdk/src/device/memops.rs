//! The memops group (`ferrocx_device_memops_v1`, ABI 1.3): 32-bit stores and waits on host
//! memory, in stream order.

use ferrocx::abi::{AbiHeader, DeviceMemOpsV1, Status, Stream, WAIT_VALUE_EQ, WAIT_VALUE_GEQ};

use crate::boundary::call;
use crate::error::{Error, Result};

use super::DeviceAdaptor;

/// The condition of a [`DeviceMemOps::stream_wait_value32`], from the ABI's `flags` (the
/// trampoline refuses any other value with `INVALID_ARGUMENT` before the adaptor is called).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitCondition {
    /// `flags` 0 ([`WAIT_VALUE_GEQ`]): `(*addr).wrapping_sub(value) as i32 >= 0`, CUDA's
    /// `CU_STREAM_WAIT_VALUE_GEQ` (a counter that wrapped past `u32::MAX` is still at or past
    /// a value a little below it).
    Geq,
    /// `flags` 1 ([`WAIT_VALUE_EQ`]): `*addr == value`.
    Eq,
}

impl WaitCondition {
    /// The condition of `flags`, or `None` for a value the ABI does not define.
    pub fn from_flags(flags: u32) -> Option<WaitCondition> {
        match flags {
            WAIT_VALUE_GEQ => Some(WaitCondition::Geq),
            WAIT_VALUE_EQ => Some(WaitCondition::Eq),
            _ => None,
        }
    }

    /// The ABI's `flags` value of this condition.
    pub fn flags(self) -> u32 {
        match self {
            WaitCondition::Geq => WAIT_VALUE_GEQ,
            WaitCondition::Eq => WAIT_VALUE_EQ,
        }
    }

    /// `true` when `current`, the word's value, satisfies the condition for `value`.
    pub fn holds(self, current: u32, value: u32) -> bool {
        match self {
            WaitCondition::Geq => current.wrapping_sub(value) as i32 >= 0,
            WaitCondition::Eq => current == value,
        }
    }
}

/// The memops group (`ferrocx_device_memops_v1`, ABI 1.3): a 32-bit store and a 32-bit wait on
/// host memory, in stream order (CUDA's `cuStreamWriteValue32` and `cuStreamWaitValue32`), so
/// that one stream, device or process signals another without a host thread in between.
///
/// `addr` is host memory the host can read: for a device over host memory any host memory,
/// for a GPU pinned or registered host memory. The trampolines refuse a null or misaligned
/// `addr` and an unknown `flags` with `INVALID_ARGUMENT` before calling these methods, which
/// must return once the operation is enqueued (never block the calling thread). A null
/// `stream` is the default stream, as everywhere in the ABI.
pub trait DeviceMemOps: DeviceAdaptor {
    /// Enqueues on `stream` a store of `value` to `*addr`, with release ordering: a reader that
    /// sees `value` also sees every write of the work enqueued on `stream` before it.
    ///
    /// # Safety
    /// `addr` is non-null and 4-byte aligned (both checked by the trampoline) and stays valid
    /// for a 32-bit atomic store until the store has run on `stream`: the caller's contract.
    unsafe fn stream_write_value32(&self, stream: Stream, addr: *mut u32, value: u32)
        -> Result<()>;

    /// Enqueues on `stream` a wait: work enqueued on `stream` after it does not start until
    /// `*addr` (read with acquire ordering) satisfies `condition` for `value`. Must not block
    /// the calling thread. A wait never satisfied holds the stream, as an event never recorded
    /// would; destroying the stream must still succeed (abandon the wait, or bound it, and say
    /// which in the adaptor's documentation).
    ///
    /// # Safety
    /// `addr` is non-null and 4-byte aligned (both checked by the trampoline) and stays valid
    /// for 32-bit atomic loads until the wait is over (satisfied, or abandoned when the stream
    /// is destroyed): the caller's contract.
    unsafe fn stream_wait_value32(
        &self,
        stream: Stream,
        addr: *const u32,
        value: u32,
        condition: WaitCondition,
    ) -> Result<()>;
}

fn check_addr(addr: usize) -> Result<()> {
    if addr == 0 {
        return Err(Error::invalid_argument("`addr` is null"));
    }
    if addr % 4 != 0 {
        return Err(Error::invalid_argument(format!(
            "`addr` {addr:#x} is not 4-byte aligned"
        )));
    }
    Ok(())
}

/// The trampolines of the group, generic over the adaptor.
mod tramp {
    use super::*;

    pub unsafe extern "C" fn stream_write_value32<A: DeviceMemOps>(
        s: Stream,
        addr: *mut u32,
        value: u32,
    ) -> Status {
        call("stream_write_value32", || {
            check_addr(addr as usize)?;
            // SAFETY: non-null and aligned (checked); valid until the store runs by the ABI's
            // contract.
            unsafe { A::instance().stream_write_value32(s, addr, value) }
        })
    }
    pub unsafe extern "C" fn stream_wait_value32<A: DeviceMemOps>(
        s: Stream,
        addr: *const u32,
        value: u32,
        flags: u32,
    ) -> Status {
        call("stream_wait_value32", || {
            check_addr(addr as usize)?;
            let condition = WaitCondition::from_flags(flags).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "`flags` {flags} is neither WAIT_VALUE_GEQ (0) nor WAIT_VALUE_EQ (1)"
                ))
            })?;
            // SAFETY: non-null and aligned (checked); valid until the wait is over by the
            // ABI's contract.
            unsafe { A::instance().stream_wait_value32(s, addr, value, condition) }
        })
    }
}

/// Builds the memops group table of `A`.
pub const fn memops_table<A: DeviceMemOps>(name: &'static std::ffi::CStr) -> DeviceMemOpsV1 {
    use tramp::*;
    DeviceMemOpsV1 {
        header: AbiHeader::new::<DeviceMemOpsV1>(name),
        stream_write_value32: Some(stream_write_value32::<A>),
        stream_wait_value32: Some(stream_wait_value32::<A>),
    }
}

#[cfg(test)]
mod tests {
    use super::WaitCondition;

    #[test]
    fn geq_wraps_around_as_cuda_does() {
        let geq = WaitCondition::Geq;
        assert!(geq.holds(5, 5) && geq.holds(6, 5) && !geq.holds(4, 5));
        // A counter that wrapped is past a value just below u32::MAX.
        assert!(geq.holds(2, u32::MAX - 1));
        assert!(!geq.holds(u32::MAX - 1, 2));
        // Half the range away flips the answer.
        assert!(geq.holds(0x8000_0000 - 1, 0));
        assert!(!geq.holds(0x8000_0000, 0));
        let eq = WaitCondition::Eq;
        assert!(eq.holds(7, 7) && !eq.holds(8, 7));
        for f in [0, 1] {
            assert_eq!(WaitCondition::from_flags(f).unwrap().flags(), f);
        }
        assert_eq!(WaitCondition::from_flags(2), None);
    }
}
