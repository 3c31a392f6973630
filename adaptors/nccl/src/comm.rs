//! One communicator: NCCL's handle, the gate every call on it passes, and (with the watchdog on)
//! the events that track its outstanding operations.

use ferrocx_plugin_sdk::prelude::*;

use crate::library::Api;
use crate::monitor::Watch;
use crate::sys;
use crate::watchdog::{Gate, Phase};

/// A communicator of the adaptor.
pub(crate) struct NcclComm {
    /// NCCL's handle; only touched through [`NcclComm::gate`].
    pub raw: sys::ncclComm_t,
    /// This rank.
    pub rank: i32,
    /// Number of ranks.
    pub nranks: i32,
    /// The deadline it was created with, in milliseconds (0: the core's default).
    pub timeout_ms: u64,
    /// The library it was created with.
    pub api: &'static Api,
    /// Calls in flight, the broken state and who tears the handle down.
    pub gate: Gate,
    /// The watchdog's events, `None` when the watchdog is off.
    pub watch: Option<Watch>,
}

// SAFETY: an `ncclComm_t` may be used from any thread (NCCL allows the watchdog's queries and
// abort from another thread); serialising the user's calls on one communicator is the caller's
// duty, as with NCCL itself. Everything else is atomics, locks and plain values.
unsafe impl Send for NcclComm {}
// SAFETY: as above.
unsafe impl Sync for NcclComm {}

/// How long the user's release waits for an abort the watchdog started.
const ABORT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How the user ends a communicator.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Teardown {
    /// `ncclCommDestroy`.
    Destroy,
    /// `ncclCommAbort`.
    Abort,
}

impl NcclComm {
    /// The user's `comm_destroy` or `comm_abort`, the handle already removed from the table. A
    /// communicator the watchdog aborted is only released here (never aborted twice).
    pub(crate) fn release(&self, how: Teardown) -> Result<()> {
        match self.gate.release() {
            Phase::Live => {}
            found => {
                // The watchdog's abort may still be running: the caller's next step (finalizing
                // the device, exiting) must not pull CUDA away from under `ncclCommAbort`.
                if !self.gate.wait_aborted(ABORT_WAIT) {
                    tracing::warn!(
                        rank = self.rank,
                        "nccl: the watchdog's abort is still running after {} s",
                        ABORT_WAIT.as_secs()
                    );
                }
                tracing::debug!(
                    rank = self.rank,
                    phase = ?found,
                    "nccl: handle released; the watchdog already aborted the communicator"
                );
                return Ok(());
            }
        }
        if let Some(w) = &self.watch {
            w.close();
        }
        let (name, f) = match how {
            Teardown::Destroy => ("ncclCommDestroy", self.api.ncclCommDestroy),
            Teardown::Abort => ("ncclCommAbort", self.api.ncclCommAbort),
        };
        // SAFETY: a live communicator whose teardown the gate gave to this call; removed from
        // the table, so no later call reaches it.
        let rc = unsafe { f(self.raw) };
        self.api.check(name, rc, std::ptr::null_mut())
    }

    /// `e`, a call's failure, or the watchdog's error when the watchdog broke the communicator
    /// meanwhile (its abort is what made the call fail).
    #[cold]
    pub(crate) fn watchdog_error(&self, e: Error) -> Error {
        self.gate.failure().cloned().unwrap_or(e)
    }

    /// The communicator's asynchronous error: the watchdog's verdict once it broke the
    /// communicator, else NCCL's.
    pub(crate) fn async_error(&self) -> Result<Status> {
        if let Some(e) = self.gate.failure() {
            return Ok(e.status());
        }
        if let Err(e) = self.gate.enter() {
            return Ok(e.status());
        }
        let mut rc = sys::NCCL_SUCCESS;
        // SAFETY: a live communicator (inside the gate) and a valid out-pointer.
        let call = unsafe { (self.api.ncclCommGetAsyncError)(self.raw, &mut rc) };
        let r = self.api.check("ncclCommGetAsyncError", call, self.raw);
        if r.is_ok() {
            if let Err(e) = self.api.check("asynchronous error", rc, self.raw) {
                tracing::debug!(rank = self.rank, error = %e, "nccl: communicator reports an error");
            }
        }
        self.gate.exit();
        r.map(|()| crate::conv::status(rc))
    }
}
