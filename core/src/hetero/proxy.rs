//! The bridge's proxy thread: runs the bridge steps of a device the host cannot address (a GPU)
//! without host functions on its streams, where the device has the memops group
//! (`ferrocx_device_memops_v1`).
//!
//! ```text
//!   device stream   … D→H(k) ─ write req = k ─ wait ack ≥ k ─ H→D(k) …
//!   proxy thread                 (req ≥ k) → step k → ack = k
//! ```
//!
//! Two 32-bit words in pinned host memory, one cache line apart: `req`, written by the device
//! stream when the step's inputs are in staging, and `ack`, written by the proxy once the step
//! ran (or failed: a failed step is acknowledged too, so the stream never waits forever; the
//! failure is the communicator's, reported at the next call or synchronize). The host thread
//! that enqueues a step hands the proxy its work with its number and returns: nothing blocks it.
//! The proxy sleeps while it has no work; with work, it polls `req` (the device cannot wake a
//! thread), spinning first, then yielding, then sleeping in steps up to 20 µs.
//!
//! Step numbers follow the order of the stream operations: every step a communicator gives the
//! proxy is enqueued after the previous one on its stream, or on a stream ordered after it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::abi::{Stream, WAIT_VALUE_GEQ};
use crate::adaptor::Device;

use super::words::Words;
use super::{HeteroError, Job};

/// Byte offset of `ack` in the pinned words (`req` at 0).
const ACK: usize = 64;

struct Queue {
    jobs: VecDeque<(u32, Job)>,
    next: u32,
    stop: bool,
}

struct Inner {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// The pinned words.
    words: Words,
}

impl Inner {
    fn word(&self, off: usize) -> &AtomicU32 {
        self.words.word(off)
    }
}

/// A communicator's proxy: the pinned words and the thread.
pub(crate) struct Proxy {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy for `device` when it has the memops group and pinned memory; `None`
    /// otherwise (the steps then run as host functions).
    pub(crate) fn start(device: &Device) -> Option<Proxy> {
        if !device.has_memops() {
            return None;
        }
        let words = match Words::new(device, true) {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!("bridge proxy not started (no pinned memory: {e})");
                return None;
            }
        };
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                next: 0,
                stop: false,
            }),
            ready: Condvar::new(),
            words,
        });
        let run = inner.clone();
        let thread = std::thread::Builder::new()
            .name("ferrocx-bridge-proxy".into())
            .spawn(move || serve(&run));
        let mut inner = inner;
        match thread {
            Ok(t) => Some(Proxy {
                inner,
                thread: Some(t),
            }),
            Err(e) => {
                tracing::debug!("bridge proxy not started: {e}");
                if let Some(inner) = Arc::get_mut(&mut inner) {
                    inner.words.free(device);
                }
                None
            }
        }
    }

    /// Enqueues `job` on `stream`: the stream signals the proxy and waits for it.
    pub(crate) fn enqueue(
        &self,
        device: &Device,
        stream: Stream,
        job: Job,
    ) -> Result<(), HeteroError> {
        let req = self.inner.word(0).as_ptr();
        let ack = self.inner.word(ACK).as_ptr().cast_const();
        let mut q = self.inner.queue.lock().unwrap_or_else(|p| p.into_inner());
        let seq = q.next.wrapping_add(1);
        // SAFETY: the words live until the proxy is dropped, which drains the streams first.
        unsafe { device.stream_write_value32(stream, req, seq) }?;
        // SAFETY: as above.
        unsafe { device.stream_wait_value32(stream, ack, seq, WAIT_VALUE_GEQ) }?;
        q.next = seq;
        q.jobs.push_back((seq, job));
        drop(q);
        self.inner.ready.notify_one();
        Ok(())
    }

    /// Stops the thread (after the streams are drained) and frees the words.
    pub(crate) fn stop(&mut self, device: &Device) {
        self.inner
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop = true;
        self.inner.ready.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The thread is gone (its reference with it) and the streams that wrote the words are
        // drained.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.words.free(device);
        }
    }
}

/// The proxy thread: takes jobs in order, waits for each one's `req`, runs it, acknowledges.
fn serve(inner: &Inner) {
    let req = inner.word(0);
    let ack = inner.word(ACK);
    loop {
        let (seq, job) = {
            let mut q = inner.queue.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.stop {
                    return;
                }
                q = inner.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        let mut polls = 0u32;
        let mut nap = Duration::from_micros(1);
        super::ring::note(u64::from(seq), "proxy waits for its stream");
        let since = std::time::Instant::now();
        while (req.load(Ordering::Acquire).wrapping_sub(seq) as i32) < 0 {
            if since.elapsed() > Duration::from_secs(3) {
                super::ring::dump("the proxy's stream has not reached a step for 3 s");
            }
            polls = polls.wrapping_add(1);
            if polls < 4_000 {
                std::hint::spin_loop();
            } else if polls < 8_000 {
                std::thread::yield_now();
            } else {
                if inner.queue.lock().unwrap_or_else(|p| p.into_inner()).stop {
                    return;
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_micros(20));
            }
        }
        super::ring::note(u64::from(seq), "proxy runs");
        job.execute();
        ack.store(seq, Ordering::Release);
        super::ring::note(u64::from(seq), "proxy acknowledged");
    }
}
