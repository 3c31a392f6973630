//! A table of an adaptor's objects by handle value: the ids an adaptor hands out for its
//! communicators, streams, events, allocations and the like, instead of raw pointers.
//!
//! Ids start at 1 (a null handle is never a live object) and are never reused, so a stale
//! handle is an error, not another object. The table is a `Mutex<HashMap>`: a lookup is one
//! uncontended lock and one hash probe; callers on a hot path keep a thread-local copy of the
//! handle they used last (as the host adaptor's streams do).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::Error;

/// The error for a handle that is not in a table of `kind` objects: `INVALID_HANDLE`,
/// "unknown `kind` handle 0x…".
pub fn unknown(kind: &str, id: u64) -> Error {
    Error::invalid_handle(format!("unknown {kind} handle {id:#x}"))
}

/// Objects of one kind by handle value. `const`-constructible, so it can be a `static`.
pub struct HandleTable<T> {
    /// What the handles are, for errors ("communicator", "stream", …).
    kind: &'static str,
    /// The id handed out last.
    last: AtomicU64,
    /// The live objects; `None` until the first insert.
    map: Mutex<Option<HashMap<u64, T>>>,
}

impl<T> HandleTable<T> {
    /// An empty table of `kind` objects (`kind` names them in errors).
    pub const fn new(kind: &'static str) -> Self {
        HandleTable {
            kind,
            last: AtomicU64::new(0),
            map: Mutex::new(None),
        }
    }

    /// The map, locked (a panic while it was held does not poison it for everyone else).
    fn lock(&self) -> MutexGuard<'_, Option<HashMap<u64, T>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The error for `id` not being in this table.
    pub fn unknown(&self, id: u64) -> Error {
        unknown(self.kind, id)
    }

    /// Stores `value` under a new id (never 0, never reused) and returns the id.
    pub fn insert(&self, value: T) -> u64 {
        let id = self.last.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock()
            .get_or_insert_with(HashMap::new)
            .insert(id, value);
        id
    }

    /// Stores the value `make` builds for a new id (called outside the lock, so it may be slow
    /// or fail: a failure stores nothing and the id is skipped) and returns the id.
    pub fn insert_with<E>(&self, make: impl FnOnce(u64) -> Result<T, E>) -> Result<u64, E> {
        let id = self.last.fetch_add(1, Ordering::Relaxed) + 1;
        let value = make(id)?;
        self.lock()
            .get_or_insert_with(HashMap::new)
            .insert(id, value);
        Ok(id)
    }

    /// A copy of the object behind `id` (for an `Arc`, another reference).
    pub fn get(&self, id: u64) -> Result<T, Error>
    where
        T: Clone,
    {
        self.lock()
            .as_ref()
            .and_then(|m| m.get(&id))
            .cloned()
            .ok_or_else(|| self.unknown(id))
    }

    /// Runs `f` on the object behind `id` with the table locked.
    pub fn with<R>(&self, id: u64, f: impl FnOnce(&mut T) -> R) -> Result<R, Error> {
        let mut map = self.lock();
        match map.as_mut().and_then(|m| m.get_mut(&id)) {
            Some(v) => Ok(f(v)),
            None => Err(self.unknown(id)),
        }
    }

    /// Removes the object behind `id` and returns it (dropped by the caller, outside the lock).
    pub fn remove(&self, id: u64) -> Result<T, Error> {
        self.lock()
            .as_mut()
            .and_then(|m| m.remove(&id))
            .ok_or_else(|| self.unknown(id))
    }

    /// Removes every object and returns them (dropped by the caller, outside the lock).
    pub fn take_all(&self) -> Vec<T> {
        self.lock()
            .take()
            .map(|m| m.into_values().collect())
            .unwrap_or_default()
    }

    /// How many objects are live.
    pub fn len(&self) -> usize {
        self.lock().as_ref().map_or(0, HashMap::len)
    }

    /// Whether no object is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Status;
    use std::sync::Arc;

    #[test]
    fn ids_start_at_one_and_are_never_reused() {
        let t = HandleTable::new("widget");
        let a = t.insert("a");
        let b = t.insert("b");
        assert_eq!((a, b), (1, 2));
        assert_eq!(t.remove(a).unwrap(), "a");
        let c = t.insert("c");
        assert_eq!(c, 3, "a removed id is not handed out again");
        assert_eq!(t.get(b).unwrap(), "b");
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn unknown_handles_are_invalid_handle_errors_naming_the_kind() {
        let t: HandleTable<Arc<u32>> = HandleTable::new("communicator");
        let e = t.get(0x2a).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_HANDLE);
        assert_eq!(e.message(), "unknown communicator handle 0x2a");
        let id = t.insert(Arc::new(7));
        assert_eq!(*t.get(id).unwrap(), 7);
        assert_eq!(t.with(id, |v| **v + 1).unwrap(), 8);
        t.remove(id).unwrap();
        let e = t.remove(id).unwrap_err();
        assert_eq!(e.status(), Status::INVALID_HANDLE);
        assert_eq!(e.message(), format!("unknown communicator handle {id:#x}"));
        assert_eq!(
            t.with(id, |_| ()).unwrap_err().message(),
            "unknown communicator handle 0x1"
        );
    }

    #[test]
    fn with_mutates_in_place_and_take_all_empties_the_table() {
        static T: HandleTable<Vec<u8>> = HandleTable::new("buffer");
        let a = T.insert(vec![1]);
        let b = T.insert(vec![2]);
        T.with(a, |v| v.push(9)).unwrap();
        assert_eq!(T.get(a).unwrap(), vec![1, 9]);
        let mut all = T.take_all();
        all.sort();
        assert_eq!(all, vec![vec![1, 9], vec![2]]);
        assert!(T.is_empty());
        assert!(T.get(b).is_err());
        assert_eq!(T.insert(vec![]), 3, "ids continue after take_all");
        let id = T.insert_with(|id| Ok::<_, ()>(vec![id as u8])).unwrap();
        assert_eq!(T.get(id).unwrap(), vec![4], "the value knows its id");
        assert_eq!(T.insert_with(|_| Err::<Vec<u8>, _>("no")), Err("no"));
        assert_eq!(T.len(), 2, "a failed insert stores nothing");
    }
}
