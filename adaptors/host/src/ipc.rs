//! IPC of the host device: a `DEVICE` or `PINNED` allocation is a named shared-memory segment,
//! so its handle is the segment's name plus where the pointer lies in it.
//!
//! Handle layout (little-endian), 20 bytes + the name:
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0  | 4 | magic `FXI1` |
//! | 4  | 8 | offset of the exported pointer inside its allocation (`u64`) |
//! | 12 | 8 | size of the allocation in bytes (`u64`) |
//! | 20 | n | segment name, UTF-8, with its leading `/`, no NUL (`/ferrocx-<job>-<pid>-<seq>`) |
//!
//! An import maps the whole segment once per process and file (the same segment imported twice
//! shares one mapping and returns the same pointer); `ipc_close` is counted, and the mapping goes
//! away with the last close.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::{Mutex, MutexGuard, OnceLock};

use ferrocx_plugin_sdk::abi::DevicePtr;
use ferrocx_plugin_sdk::{Error, Result};

use crate::memory;
use crate::shm::{self, FileId, Mapping};

/// First bytes of every handle.
const MAGIC: [u8; 4] = *b"FXI1";
/// Bytes before the name.
const FIXED: usize = 20;
/// Longest segment name (`NAME_MAX`, with the `/`).
const MAX_NAME: usize = 256;

/// What a handle says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handle {
    /// Segment name, with its leading `/`.
    pub name: String,
    /// Offset of the exported pointer inside the allocation.
    pub offset: u64,
    /// Size of the allocation.
    pub size: u64,
}

impl Handle {
    /// The handle's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(FIXED + self.name.len());
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&self.offset.to_le_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v
    }

    /// Reads a handle; `INVALID_ARGUMENT` for anything that is not one.
    pub fn decode(bytes: &[u8]) -> Result<Handle> {
        let bad = |why: &str| {
            Error::invalid_argument(format!(
                "not a host IPC handle ({} bytes): {why}",
                bytes.len()
            ))
        };
        if bytes.len() < FIXED + 2 || bytes.len() > FIXED + MAX_NAME {
            return Err(bad("wrong length"));
        }
        if bytes[..4] != MAGIC {
            return Err(bad("wrong magic"));
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let (offset, size) = (word(4), word(12));
        let name = std::str::from_utf8(&bytes[FIXED..]).map_err(|_| bad("name is not UTF-8"))?;
        let well_formed = name.starts_with('/')
            && name[1..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !well_formed {
            return Err(bad("malformed segment name"));
        }
        if size == 0 || offset >= size {
            return Err(bad(&format!("offset {offset} is not inside {size} bytes")));
        }
        Ok(Handle {
            name: name.to_string(),
            offset,
            size,
        })
    }
}

/// One imported segment.
struct Import {
    name: String,
    map: Mapping,
    /// Imports not yet closed.
    refs: usize,
}

#[derive(Default)]
struct Imports {
    /// Mapped segments, by file.
    files: HashMap<FileId, Import>,
    /// Pointers returned by `import` and not yet closed: file and count.
    open: HashMap<u64, (FileId, usize)>,
}

fn imports() -> MutexGuard<'static, Imports> {
    static IMPORTS: OnceLock<Mutex<Imports>> = OnceLock::new();
    IMPORTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The handle of the allocation `ptr` lies in (`DEVICE` or `PINNED` memory of this process).
pub fn export(ptr: DevicePtr) -> Result<Vec<u8>> {
    let (name, offset, size) = memory::segment_of(ptr)?;
    Ok(Handle {
        name,
        offset,
        size: size as u64,
    }
    .encode())
}

/// Maps the allocation of a handle into this process; returns the exported pointer's address here.
pub fn import(bytes: &[u8]) -> Result<DevicePtr> {
    let h = Handle::decode(bytes)?;
    let fd = shm::open_existing(&h.name)?;
    let (id, size, _) =
        shm::stat(fd.as_fd()).map_err(|e| Error::system(format!("fstat of {}", h.name), e))?;
    if size as u64 != h.size {
        return Err(Error::invalid_argument(format!(
            "segment {} has {size} bytes but the handle says {} (a different allocation of that name?)",
            h.name, h.size
        )));
    }
    let mut im = imports();
    let base = match im.files.get_mut(&id) {
        Some(i) => {
            i.refs += 1;
            i.map.addr()
        }
        None => {
            let map = Mapping::shared(fd.as_fd(), size)?;
            let base = map.addr();
            im.files.insert(
                id,
                Import {
                    name: h.name.clone(),
                    map,
                    refs: 1,
                },
            );
            base
        }
    };
    // The descriptor closes on return; the mapping keeps the memory.
    let ptr = base + h.offset;
    im.open.entry(ptr).or_insert((id, 0)).1 += 1;
    tracing::trace!(segment = %h.name, ptr, "imported");
    Ok(DevicePtr(ptr))
}

/// Closes one import of `ptr` (a pointer `import` returned).
pub fn close(ptr: DevicePtr) -> Result<()> {
    let mut im = imports();
    let Some((id, count)) = im.open.get_mut(&ptr.0) else {
        return Err(Error::invalid_handle(format!(
            "{:#x} is not an open IPC import of this process",
            ptr.0
        )));
    };
    let id = *id;
    *count -= 1;
    if *count == 0 {
        im.open.remove(&ptr.0);
    }
    let last = match im.files.get_mut(&id) {
        Some(i) => {
            i.refs -= 1;
            i.refs == 0
        }
        None => {
            return Err(Error::internal(format!(
                "import of {:#x} has no mapping",
                ptr.0
            )))
        }
    };
    let gone = if last { im.files.remove(&id) } else { None };
    drop(im);
    if let Some(i) = gone {
        tracing::trace!(segment = %i.name, "unmapped the last import");
    }
    Ok(())
}

/// Unmaps every import still open; returns how many segments were mapped.
pub fn close_all() -> usize {
    let mut im = imports();
    im.open.clear();
    let files = std::mem::take(&mut im.files);
    drop(im);
    files.len()
}

/// Checks `[addr, addr + bytes)` against the imported segments: a span that starts inside one
/// must end inside it.
pub fn check_span(addr: u64, bytes: usize, role: &str) -> Result<()> {
    let im = imports();
    for i in im.files.values() {
        if i.map.contains(addr, 1) && !i.map.contains(addr, bytes) {
            return Err(Error::invalid_argument(format!(
                "{role} {addr:#x} + {bytes} bytes overruns the {}-byte import of {} at {:#x}",
                i.map.len(),
                i.name,
                i.map.addr()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrocx_plugin_sdk::abi::{MemKind, Status};

    #[test]
    fn handles_round_trip_and_garbage_is_refused() {
        let h = Handle {
            name: "/ferrocx-local-12-3".into(),
            offset: 5,
            size: 4099,
        };
        let bytes = h.encode();
        assert_eq!(bytes.len(), FIXED + h.name.len());
        assert_eq!(Handle::decode(&bytes).unwrap(), h);
        for bad in [
            &b""[..],
            &bytes[..FIXED],
            &[0u8; 40][..],
            &[&b"FXI1"[..], &[0; 16], b"/../etc/passwd"].concat(),
        ] {
            let e = Handle::decode(bad).unwrap_err();
            assert_eq!(e.status(), Status::INVALID_ARGUMENT);
        }
        let past_end = Handle {
            offset: 4099,
            ..h.clone()
        };
        assert!(Handle::decode(&past_end.encode()).is_err());
    }

    #[test]
    fn importing_twice_shares_one_mapping_and_closes_balance() {
        let p = memory::alloc(100, MemKind::DEVICE).unwrap();
        memory::set(p, 7, 100).unwrap();
        let h = export(DevicePtr(p.0 + 10)).unwrap();
        let a = import(&h).unwrap();
        let b = import(&h).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.0, p.0 + 10, "an import is a mapping of its own");
        // SAFETY: `a` maps the 100-byte segment at offset 10.
        assert_eq!(unsafe { *(a.0 as *const u8) }, 7);
        close(a).unwrap();
        // SAFETY: one import of `b` is still open.
        assert_eq!(unsafe { *(b.0 as *const u8).add(89) }, 7);
        close(b).unwrap();
        assert_eq!(close(b).unwrap_err().status(), Status::INVALID_HANDLE);
        memory::free(p, MemKind::DEVICE).unwrap();
        let e = import(&h).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_HANDLE, "{e}");
    }
}
