//! Device memory and handles the kit owns, released on drop; data moves between host `Vec`s
//! and device memory with the device's own `mem_copy`, so any device works, host-addressable
//! or not.

use ferrocx::abi::{DevicePtr, Event, MemKind, Stream};

use crate::boundary::{raw_call, DeviceApi, Res};

/// The address of host memory, for `mem_copy` (the ABI's unified addressing).
pub(crate) fn host_ptr(bytes: &[u8]) -> DevicePtr {
    DevicePtr(bytes.as_ptr() as u64)
}

/// The address of writable host memory.
pub(crate) fn host_ptr_mut(bytes: &mut [u8]) -> DevicePtr {
    DevicePtr(bytes.as_mut_ptr() as u64)
}

/// An allocation of the device, freed on drop.
pub(crate) struct DevBuf<'a> {
    api: &'a DeviceApi,
    ptr: DevicePtr,
    bytes: usize,
    kind: MemKind,
}

impl<'a> DevBuf<'a> {
    /// Allocates `bytes` of `kind` (at least one byte: a zero-size allocation is an error).
    pub(crate) fn new(api: &'a DeviceApi, bytes: usize, kind: MemKind) -> Res<DevBuf<'a>> {
        let ptr = api.seen(api.dev.mem_alloc(bytes.max(1), kind))?;
        Ok(DevBuf {
            api,
            ptr,
            bytes,
            kind,
        })
    }

    /// Device memory of `bytes`.
    pub(crate) fn device(api: &'a DeviceApi, bytes: usize) -> Res<DevBuf<'a>> {
        DevBuf::new(api, bytes, MemKind::DEVICE)
    }

    /// The base address.
    pub(crate) fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The address `offset` bytes in.
    pub(crate) fn at(&self, offset: usize) -> DevicePtr {
        DevicePtr(self.ptr.0 + offset as u64)
    }

    /// Copies `data` to the start of the buffer.
    pub(crate) fn upload(&self, data: &[u8]) -> Res<()> {
        self.upload_at(0, data)
    }

    /// Copies `data` to `offset`.
    pub(crate) fn upload_at(&self, offset: usize, data: &[u8]) -> Res<()> {
        assert!(
            offset + data.len() <= self.bytes,
            "an upload past the buffer's end"
        );
        if data.is_empty() {
            return Ok(());
        }
        self.api.seen(
            // SAFETY: `data.len()` bytes at `offset` of this live allocation (asserted above), from
            // live host memory.
            unsafe {
                self.api
                    .dev
                    .mem_copy(self.at(offset), host_ptr(data), data.len())
            },
        )
    }

    /// Copies `len` bytes from the start of the buffer.
    pub(crate) fn download(&self, len: usize) -> Res<Vec<u8>> {
        self.download_at(0, len)
    }

    /// Copies `len` bytes from `offset`.
    pub(crate) fn download_at(&self, offset: usize, len: usize) -> Res<Vec<u8>> {
        assert!(
            offset + len <= self.bytes,
            "a download past the buffer's end"
        );
        let mut out = vec![0u8; len];
        if len > 0 {
            self.api.seen(
                // SAFETY: `len` bytes at `offset` of this live allocation (asserted above), into
                // `out`, which holds `len`.
                unsafe {
                    self.api
                        .dev
                        .mem_copy(host_ptr_mut(&mut out), self.at(offset), len)
                },
            )?;
        }
        Ok(out)
    }

    /// Fills the whole buffer with `byte` (through `mem_copy`, so `mem_set` is not needed).
    pub(crate) fn fill(&self, byte: u8) -> Res<()> {
        self.upload(&vec![byte; self.bytes])
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        // A failed free is observed (for the boundary checks) and otherwise not actionable here.
        // SAFETY: the allocation `new` made with this kind, freed once, here; the kit waits for the
        // work on it first.
        let _ = self
            .api
            .seen(unsafe { self.api.dev.mem_free(self.ptr, self.kind) });
    }
}

/// A stream created by the kit, destroyed on drop.
pub(crate) struct OwnedStream<'a> {
    api: &'a DeviceApi,
    /// The handle.
    pub s: Stream,
}

impl<'a> OwnedStream<'a> {
    /// Creates a stream with `flags` (1: non-blocking, so it never waits on the default
    /// stream: the kit holds streams with host functions while it makes synchronous calls).
    pub(crate) fn with_flags(api: &'a DeviceApi, flags: u32) -> Res<OwnedStream<'a>> {
        let mut s = Stream::NULL;
        raw_call!(api, api.root(), stream_create(flags, &mut s))?;
        Ok(OwnedStream { api, s })
    }

    /// A non-blocking stream.
    pub(crate) fn new(api: &'a DeviceApi) -> Res<OwnedStream<'a>> {
        OwnedStream::with_flags(api, 1)
    }

    /// Destroys the stream now, reporting the outcome.
    pub(crate) fn destroy(self) -> Res<()> {
        let s = self.s;
        let api = self.api;
        std::mem::forget(self);
        api.seen(api.dev.stream_destroy(s))
    }
}

impl Drop for OwnedStream<'_> {
    fn drop(&mut self) {
        // Observed; a check that cares calls `destroy` itself.
        let _ = self.api.seen(self.api.dev.stream_destroy(self.s));
    }
}

/// An event created by the kit, destroyed on drop.
pub(crate) struct OwnedEvent<'a> {
    api: &'a DeviceApi,
    /// The handle.
    pub e: Event,
}

impl<'a> OwnedEvent<'a> {
    /// Creates an event (`flags`: 1 = no timing).
    pub(crate) fn new(api: &'a DeviceApi, flags: u32) -> Res<OwnedEvent<'a>> {
        let e = api.seen(api.dev.event_create(flags))?;
        Ok(OwnedEvent { api, e })
    }

    /// Destroys the event now, reporting the outcome.
    pub(crate) fn destroy(self) -> Res<()> {
        let e = self.e;
        let api = self.api;
        std::mem::forget(self);
        api.seen(api.dev.event_destroy(e))
    }
}

impl Drop for OwnedEvent<'_> {
    fn drop(&mut self) {
        // Observed; a check that cares calls `destroy` itself.
        let _ = self.api.seen(self.api.dev.event_destroy(self.e));
    }
}
