//! The enqueuer thread: enqueues the stages of a large all-reduce for the caller, so that the
//! host time of a call does not grow with the message (a 64 MiB all-reduce is tens of chunks,
//! each a handful of device and CCL calls).
//!
//! ```text
//!   caller's stream  … ─ write start = seq ─ wait end ≥ seq ─ …      (caller's thread: 2 calls)
//!   cluster stream        wait start ≥ seq ─ RS(0) … AG(n-1) ─ write end = seq
//!                         (every stage enqueued by the enqueuer thread, in call order)
//! ```
//!
//! It needs the device's stream memory operations (`ferrocx_device_memops_v1`) and pinned
//! memory for the two words; without them, or for a plan of fewer chunks than
//! `FERROCX_BRIDGE_ASYNC_CHUNKS` (4 by default; 0 turns the enqueuer off), the caller's thread
//! enqueues the stages itself, ordered by events; so it does for the first long plan of each
//! type and reduction (see `HeteroCore::enqueued_here_once`). A stage that fails to enqueue fails the
//! communicator (the next call or synchronize reports it) and the enqueuer stores `end` from
//! the host, so the caller's stream never waits for a signal that will not come.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::abi::{Stream, WAIT_VALUE_GEQ};
use crate::adaptor::Device;

use super::words::Words;
use super::{HeteroCore, HeteroError};

/// Work for the enqueuer thread.
pub(crate) type Task = Box<dyn FnOnce(&HeteroCore) + Send>;

/// Byte offset of `end` in the words (`start` at 0).
const END: usize = 64;

/// A communicator's enqueuer: the thread, its queue and the pinned words.
pub(crate) struct Enqueuer {
    /// The queue and the last sequence number given, under one lock (tasks are queued in
    /// sequence order).
    queue: Mutex<(Option<Sender<Task>>, u32)>,
    thread: Option<JoinHandle<()>>,
    words: Words,
    /// Plans of at least this many chunks are enqueued here.
    pub(crate) chunks: usize,
}

/// Plans of at least this many chunks go to the enqueuer (`FERROCX_BRIDGE_ASYNC_CHUNKS`).
fn threshold() -> usize {
    std::env::var("FERROCX_BRIDGE_ASYNC_CHUNKS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(4)
}

impl Enqueuer {
    /// Starts the enqueuer of `core`, where its device has what it needs; its thread selects
    /// device `ordinal` (the rank's) before anything else.
    pub(crate) fn start(core: &Arc<HeteroCore>, ordinal: i32) -> Option<Enqueuer> {
        let chunks = threshold();
        let device = &core.device;
        if chunks == 0 || !device.has_memops() {
            return None;
        }
        // A device whose memory the host addresses reaches any host memory: the words are
        // the process's own.
        let mut words = match Words::new(device, core.staging.is_some()) {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!("no enqueuer thread (no pinned memory: {e})");
                return None;
            }
        };
        let (tx, rx) = channel::<Task>();
        let run = core.clone();
        // The device selection is per thread (CUDA's current context): the enqueuer's copies
        // and events must go to the device of the thread that made the communicator, not to
        // device 0 (a rank on another GPU would fail with an invalid handle).
        let thread = std::thread::Builder::new()
            .name("ferrocx-bridge-enqueue".into())
            .spawn(move || {
                if let Err(e) = run.device.set_device(ordinal) {
                    tracing::warn!("the bridge's enqueuer could not select device {ordinal}: {e}");
                }
                for task in rx {
                    task(&run);
                    run.backlog.ran_one();
                }
            });
        match thread {
            Ok(t) => Some(Enqueuer {
                queue: Mutex::new((Some(tx), 0)),
                thread: Some(t),
                words,
                chunks,
            }),
            Err(e) => {
                tracing::debug!("no enqueuer thread: {e}");
                words.free(device);
                None
            }
        }
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        self.words.word(off)
    }

    /// Hangs the next task on `stream` (it writes `start`, then waits for `end`) and queues
    /// `task(seq, start, end)`'s result.
    pub(crate) fn submit(
        &self,
        core: &HeteroCore,
        stream: Stream,
        task: impl FnOnce(u32, usize, usize) -> Task,
    ) -> Result<(), HeteroError> {
        let device = &core.device;
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let seq = q.1.wrapping_add(1);
        let (start, end) = (self.word(0), self.word(END));
        // SAFETY: the words live until `stop`, which drains every stream first.
        unsafe { device.stream_write_value32(stream, start.as_ptr(), seq) }?;
        // SAFETY: as above.
        unsafe { device.stream_wait_value32(stream, end.as_ptr(), seq, WAIT_VALUE_GEQ) }?;
        q.1 = seq;
        let t = task(seq, start.as_ptr() as usize, end.as_ptr() as usize);
        core.backlog.handed();
        match &q.0 {
            Some(tx) if tx.send(t).is_ok() => Ok(()),
            _ => {
                // Nothing will enqueue the stages: release the stream.
                core.backlog.ran_one();
                end.store(seq, Ordering::Release);
                Err(HeteroError::Bridge("the enqueuer thread is gone".into()))
            }
        }
    }

    /// Releases the caller's stream of call `seq` from the host (its stages failed).
    pub(crate) fn release(end: usize, seq: u32) {
        // SAFETY: `end` is the enqueuer's word (alive while any task runs).
        let w = unsafe { &*(end as *const AtomicU32) };
        w.store(seq, Ordering::Release);
        crate::futex::wake(w);
    }

    /// Stops the thread once every queued task ran; frees the words after `drain` emptied
    /// the streams.
    pub(crate) fn stop(&mut self, device: &Device, drain: impl FnOnce()) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).0 = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        drain();
        // The thread is gone and the streams that use the words are drained.
        self.words.free(device);
    }
}
