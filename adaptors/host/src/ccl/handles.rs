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
    let cached = LAST.with(|l| match l.try_borrow().as_deref() {
        Ok(Some((h, comm))) if *h == id && !comm.destroyed.load(Ordering::Acquire) => {
            Some(comm.clone())
        }
        _ => None,
    });
    if let Some(comm) = cached {
        return Ok(comm);
    }
    let comm = lookup(c)?;
    // Not cached when the cache is borrowed (a lookup inside `with`'s closure).
    LAST.with(|l| {
        if let Ok(mut cache) = l.try_borrow_mut() {
            *cache = Some((id, comm.clone()));
        }
    });
    Ok(comm)
}

/// Runs `f` with communicator `c`, without taking a reference to it when it is this thread's
/// last one (a check of an argument before the call is enqueued, the calling thread's fast
/// path). A lookup of another communicator inside `f` works but is not cached (the cache is
/// borrowed meanwhile).
///
/// Inlined, with `f` called inside the one access to the thread's cache: the fast path of a
/// small collective passes nothing larger than a pointer through a call here.
#[inline(always)]
pub(super) fn with<R>(c: Comm, f: impl FnOnce(&Arc<HostComm>) -> R) -> Result<R> {
    let id = c.0 as usize as u64;
    LAST.with(|l| {
        if let Ok(cache) = l.try_borrow() {
            if let Some((h, comm)) = &*cache {
                if *h == id && !comm.destroyed.load(Ordering::Acquire) {
                    return Ok(f(comm));
                }
            }
        }
        Ok(f(&get(c)?))
    })
}

fn lookup(c: Comm) -> Result<Arc<HostComm>> {
    COMMS.get(c.0 as usize as u64)
}

pub(super) fn take(c: Comm) -> Result<Arc<HostComm>> {
    let comm = COMMS.remove(c.0 as usize as u64)?;
    comm.destroyed.store(true, Ordering::Release);
    Ok(comm)
}
