//! [`DeviceBuffer`]: memory of a device adaptor owned by a value, freed on drop, with
//! bounds-checked copies to and from the host.

use crate::abi::{DevicePtr, MemKind, Status};

use super::device::Device;
use super::error::AdaptorError;

/// An allocation of a device adaptor, freed when dropped.
///
/// The safe way to set up and read back data around the `unsafe` calls that take addresses:
/// [`DeviceBuffer::ptr`] is a [valid range](crate::adaptor#valid-ranges) of
/// [`DeviceBuffer::len`] bytes for as long as the buffer lives, and the copies check their
/// bounds. Writing takes `&mut self`, so safe code never writes a buffer another thread reads.
///
/// ```no_run
/// # fn demo(dev: &ferrocx::adaptor::Device) -> Result<(), ferrocx::adaptor::AdaptorError> {
/// use ferrocx::abi::MemKind;
/// use ferrocx::adaptor::DeviceBuffer;
///
/// let mut buf = DeviceBuffer::new(dev, 4, MemKind::DEVICE)?;
/// buf.copy_from_host(&[1, 2, 3, 4])?;
/// let mut back = [0u8; 4];
/// buf.copy_to_host(&mut back)?;
/// assert_eq!(back, [1, 2, 3, 4]);
/// # Ok(()) }
/// ```
pub struct DeviceBuffer {
    device: Device,
    ptr: DevicePtr,
    len: usize,
    kind: MemKind,
}

impl DeviceBuffer {
    /// Allocates `len` bytes of `kind` on the calling thread's current device (one byte when
    /// `len` is 0: adaptors may refuse empty allocations; [`DeviceBuffer::len`] stays 0).
    pub fn new(device: &Device, len: usize, kind: MemKind) -> Result<DeviceBuffer, AdaptorError> {
        let ptr = device.mem_alloc(len.max(1), kind)?;
        Ok(DeviceBuffer {
            device: device.clone(),
            ptr,
            len,
            kind,
        })
    }

    /// Allocates `data.len()` bytes of `kind` and copies `data` there.
    pub fn from_host(
        device: &Device,
        data: &[u8],
        kind: MemKind,
    ) -> Result<DeviceBuffer, AdaptorError> {
        let mut buf = DeviceBuffer::new(device, data.len(), kind)?;
        buf.copy_from_host(data)?;
        Ok(buf)
    }

    /// The allocation's address: valid for [`DeviceBuffer::len`] bytes while `self` lives.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The address `offset` bytes in, or `None` past the end (`offset == len` is the end itself).
    pub fn ptr_at(&self, offset: usize) -> Option<DevicePtr> {
        (offset <= self.len).then(|| DevicePtr(self.ptr.0 + offset as u64))
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a buffer of 0 bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The kind of memory it was allocated as.
    pub fn kind(&self) -> MemKind {
        self.kind
    }

    /// The adaptor that owns the memory.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Copies `data` to the start of the buffer; fails if it does not fit.
    pub fn copy_from_host(&mut self, data: &[u8]) -> Result<(), AdaptorError> {
        self.copy_from_host_at(0, data)
    }

    /// Copies `data` to `offset` bytes in; fails if it does not fit.
    pub fn copy_from_host_at(&mut self, offset: usize, data: &[u8]) -> Result<(), AdaptorError> {
        let dst = self.range("copy_from_host", offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` is `data.len()` bytes inside this live allocation (checked above), which
        // `&mut self` keeps from any other safe use; `data` is live host memory, readable by the
        // ABI's unified addressing, and cannot overlap device memory the adaptor allocated.
        unsafe {
            self.device
                .mem_copy(dst, DevicePtr(data.as_ptr() as u64), data.len())
        }
    }

    /// Fills `out` from the start of the buffer; fails if the buffer is shorter.
    pub fn copy_to_host(&self, out: &mut [u8]) -> Result<(), AdaptorError> {
        self.copy_to_host_at(0, out)
    }

    /// Fills `out` from `offset` bytes in; fails past the end.
    pub fn copy_to_host_at(&self, offset: usize, out: &mut [u8]) -> Result<(), AdaptorError> {
        let src = self.range("copy_to_host", offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: `src` is `out.len()` bytes inside this live allocation (checked above), which
        // safe code cannot write while `&self` is held; `out` is writable host memory of this
        // process that nothing else references.
        unsafe {
            self.device
                .mem_copy(DevicePtr(out.as_mut_ptr() as u64), src, out.len())
        }
    }

    /// The whole buffer, copied to the host.
    pub fn to_vec(&self) -> Result<Vec<u8>, AdaptorError> {
        let mut out = vec![0u8; self.len];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Sets every byte to `value` (with the adaptor's `mem_set`, or a copy where it has none).
    pub fn fill(&mut self, value: u8) -> Result<(), AdaptorError> {
        if self.len == 0 {
            return Ok(());
        }
        // SAFETY: the whole of this live allocation, which `&mut self` keeps from any other
        // safe use.
        match unsafe { self.device.mem_set(self.ptr, value, self.len) } {
            Err(AdaptorError::Unsupported { .. }) => self.copy_from_host(&vec![value; self.len]),
            r => r,
        }
    }

    /// The address of `[offset, offset + bytes)`, or the error of `op` when it is not inside.
    fn range(
        &self,
        op: &'static str,
        offset: usize,
        bytes: usize,
    ) -> Result<DevicePtr, AdaptorError> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.len => Ok(DevicePtr(self.ptr.0 + offset as u64)),
            _ => Err(AdaptorError::Failed {
                adaptor: self.device.name().to_string(),
                op,
                status: Status::INVALID_ARGUMENT,
                message: format!(
                    "{bytes} bytes at offset {offset} do not fit in a buffer of {} bytes",
                    self.len
                ),
            }),
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device.name())
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("kind", &self.kind)
            .finish()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: the address `mem_alloc` returned with this kind, freed once, here. Work that
        // used it was enqueued by `unsafe` calls whose callers promised to wait for it while the
        // buffer lives.
        let freed = unsafe { self.device.mem_free(self.ptr, self.kind) };
        // A failed free at drop is not actionable; the adaptor's log has it.
        drop(freed);
    }
}
