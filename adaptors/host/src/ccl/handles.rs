//! The live communicators of this process by handle, with a per-thread cache of the one used
//! last.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::prelude::*;

use super::comm::HostComm;

/// The live communicators of this process.
pub(super) static COMMS: HandleTable<Arc<HostComm>> = HandleTable::new("communicator");

thread_local! {
    /// The communicator this thread used last: a stream of calls on one skips the map.
    static LAST: RefCell<Option<(u64, Arc<HostComm>)>> = const { RefCell::new(None) };
}

pub(super) fn get(c: Comm) -> Result<Arc<HostComm>> {
    let id = c.0 as usize as u64;
    let cached = LAST.with(|l| match &*l.borrow() {
        Some((h, comm)) if *h == id && !comm.destroyed.load(Ordering::Acquire) => {
            Some(comm.clone())
        }
        _ => None,
    });
    if let Some(comm) = cached {
        return Ok(comm);
    }
    let comm = lookup(c)?;
    LAST.with(|l| *l.borrow_mut() = Some((id, comm.clone())));
    Ok(comm)
}

/// Runs `f` with communicator `c`, without taking a reference to it when it is this thread's
/// last one (a check of an argument before the call is enqueued, the calling thread's fast
/// path). `f` must not look up another communicator (the cache is borrowed meanwhile).
pub(super) fn with<R>(c: Comm, f: impl FnOnce(&Arc<HostComm>) -> R) -> Result<R> {
    let id = c.0 as usize as u64;
    let mut f = Some(f);
    let hit = LAST.with(|l| match &*l.borrow() {
        Some((h, comm)) if *h == id && !comm.destroyed.load(Ordering::Acquire) => {
            f.take().map(|f| f(comm))
        }
        _ => None,
    });
    match (hit, f) {
        (Some(r), _) => Ok(r),
        (None, Some(f)) => Ok(f(&get(c)?)),
        (None, None) => unreachable!("f runs at most once"),
    }
}

fn lookup(c: Comm) -> Result<Arc<HostComm>> {
    COMMS.get(c.0 as usize as u64)
}

pub(super) fn take(c: Comm) -> Result<Arc<HostComm>> {
    let comm = COMMS.remove(c.0 as usize as u64)?;
    comm.destroyed.store(true, Ordering::Release);
    Ok(comm)
}
