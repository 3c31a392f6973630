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
//! enqueues the stages itself, ordered by events. A stage that fails to enqueue fails the
//! communicator (the next call or synchronize reports it) and the enqueuer stores `end` from
//! the host, so the caller's stream never waits for a signal that will not come.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::abi::{DevicePtr, MemKind, Stream, WAIT_VALUE_GEQ};
use crate::adaptor::Device;

use super::{HeteroCore, HeteroError};

/// Work for the enqueuer thread.
pub(crate) type Task = Box<dyn FnOnce(&HeteroCore) + Send>;

const BLOCK: usize = 4096;
const END: usize = 64;

/// A communicator's enqueuer: the thread, its queue and the pinned words.
pub(crate) struct Enqueuer {
    /// The queue and the last sequence number given, under one lock (tasks are queued in
    /// sequence order).
    queue: Mutex<(Option<Sender<Task>>, u32)>,
    thread: Option<JoinHandle<()>>,
    block: usize,
    /// The words, when they are the process's own memory (else a pinned allocation).
    heap: Option<Box<[AtomicU32]>>,
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
    /// Starts the enqueuer of `core`, where its device has what it needs.
    pub(crate) fn start(core: &Arc<HeteroCore>) -> Option<Enqueuer> {
        let chunks = threshold();
        let device = &core.device;
        if chunks == 0 || !device.has_memops() {
            return None;
        }
        // A device whose memory the host addresses reaches any host memory: the words are
        // the process's own (no device allocation a crashed rank could leave behind).
        let own = core.staging.is_none();
        let (block, heap) = if own {
            let words: Box<[AtomicU32]> = (0..BLOCK / 4).map(|_| AtomicU32::new(0)).collect();
            (words.as_ptr() as usize, Some(words))
        } else {
            match device.mem_alloc(BLOCK, MemKind::PINNED) {
                Ok(p) => (p.0 as usize, None),
                Err(e) => {
                    tracing::debug!("no enqueuer thread (no pinned memory: {e})");
                    return None;
                }
            }
        };
        if heap.is_none() {
            // SAFETY: a fresh allocation of `BLOCK` bytes, host memory.
            unsafe { std::ptr::write_bytes(block as *mut u8, 0, BLOCK) };
        }
        let (tx, rx) = channel::<Task>();
        let run = core.clone();
        let thread = std::thread::Builder::new()
            .name("ferrocx-bridge-enqueue".into())
            .spawn(move || {
                for task in rx {
                    task(&run);
                    run.backlog.ran_one();
                }
            });
        match thread {
            Ok(t) => Some(Enqueuer {
                queue: Mutex::new((Some(tx), 0)),
                thread: Some(t),
                block,
                heap,
                chunks,
            }),
            Err(e) => {
                tracing::debug!("no enqueuer thread: {e}");
                if heap.is_none() {
                    // SAFETY: our allocation, never handed out.
                    let _ = unsafe { device.mem_free(DevicePtr(block as u64), MemKind::PINNED) };
                }
                None
            }
        }
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: a live block of `BLOCK` bytes (pinned, or `heap`; freed in `stop`, after the
        // streams that use it are drained), 4-aligned at `off`, touched only atomically.
        unsafe { &*((self.block + off) as *const AtomicU32) }
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
        if self.heap.take().is_none() {
            // SAFETY: the thread is gone and the streams that use the words are drained.
            let _ = unsafe { device.mem_free(DevicePtr(self.block as u64), MemKind::PINNED) };
        }
    }
}
