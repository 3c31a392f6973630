//! Reading the other flat ranks' inputs where they lie (the flat and hybrid plans when every
//! flat rank is on the host device, `plan::Roles::direct`).
//!
//! A flat rank's step A reduces its flat share of a chunk from every flat rank's input. The
//! inputs could be published (each rank copies its whole chunk into its slot, every reader
//! reads the copy): a full copy of every input per call, the most memory traffic of the plan.
//! Instead, where the host device can export the input (`DEVICE` and `PINNED` memory are
//! shared-memory segments), each flat rank puts its input's IPC handle in its call record
//! ([`Bridge::set_handle`](super::bridge::Bridge::set_handle)) and the others map it and
//! read the chunk in place. A rank whose input cannot be exported (C-heap memory) puts no
//! handle and publishes its chunk as before; readers take each peer one way or the other.
//!
//! Mappings are kept per peer ([`Imports`]), the latest [`KEEP`] handles of each, so a job that
//! calls with the same buffers maps them once; an older one is closed when a newer pushes it
//! out (a peer's freed buffer stays mapped here until then).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, OnceLock};

use crate::adaptor::Device;
use crate::window::resources::IpcImport;

use super::HeteroError;

/// Handles kept mapped per peer.
pub const KEEP: usize = 4;

/// One peer's mappings: (handle, its import), latest first.
type Kept = VecDeque<(Vec<u8>, IpcImport)>;

/// The peers' inputs this rank has mapped, by peer.
pub struct Imports {
    device: Device,
    open: Mutex<HashMap<usize, Kept>>,
}

impl Imports {
    /// No mappings yet, on `device` (the host device: the peers' too).
    pub fn new(device: Device) -> Imports {
        Imports {
            device,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Peer `r`'s exported pointer of `handle`, in this process (mapped once, then kept).
    pub fn open(&self, r: usize, handle: &[u8], who: &str) -> Result<u64, HeteroError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let kept = open.entry(r).or_default();
        if let Some(i) = kept.iter().position(|(h, _)| h == handle) {
            let e = kept.remove(i).expect("an index just found");
            let ptr = e.1.ptr().0;
            kept.push_front(e);
            return Ok(ptr);
        }
        let im = IpcImport::open(&self.device, handle).map_err(|e| {
            HeteroError::Bridge(format!(
                "cannot map the input of {who} (its IPC handle): {e}"
            ))
        })?;
        let ptr = im.ptr().0;
        kept.push_front((handle.to_vec(), im));
        kept.truncate(KEEP);
        Ok(ptr)
    }

    /// Mappings kept now (every peer).
    pub fn kept(&self) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.values().map(VecDeque::len).sum()
    }
}

/// The inputs of one call's flat ranks, shared by the call's steps: filled by its first step
/// (after the descriptor check, when every rank's handle is there).
pub struct CallInputs {
    /// The call (its handle records are this call's parity).
    pub call: u64,
    /// This rank's handle (empty: it publishes its chunks).
    pub mine: Vec<u8>,
    /// This rank's input.
    pub mine_at: u64,
    /// The flat ranks.
    pub flat: Vec<usize>,
    /// Per rank: its input in this process, or 0 (read its slot).
    pub at: OnceLock<Vec<u64>>,
}

impl CallInputs {
    /// Every flat rank's input as this process sees it (0: read from its slot), from the
    /// handles of the call's records; run once, by the call's first step.
    pub fn resolve(
        &self,
        b: &super::bridge::Bridge,
        imports: &Imports,
        me: usize,
    ) -> Result<(), HeteroError> {
        if self.at.get().is_some() {
            return Ok(());
        }
        let mut at = vec![0u64; b.topo().world()];
        for &r in &self.flat {
            at[r] = if r == me {
                if self.mine.is_empty() {
                    0
                } else {
                    self.mine_at
                }
            } else {
                let h = b.handle(r, self.call);
                if h.is_empty() {
                    0
                } else {
                    imports.open(r, &h, &b.topo().who(r))?
                }
            };
        }
        let _ = self.at.set(at);
        Ok(())
    }
}
