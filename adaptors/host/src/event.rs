//! Events of the host device, with CUDA's semantics.
//!
//! Each `record` creates a new one-shot latch and makes it the event's most recent record; the
//! stream completes that latch when it reaches it. A `stream_wait_event` captures the latch that
//! is most recent *when the wait is enqueued*, so re-recording the event later does not redirect
//! an earlier wait. An event never recorded counts as complete, as in CUDA.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use ferrocx_plugin_sdk::abi::{Event, Stream};
use ferrocx_plugin_sdk::handles::HandleTable;
use ferrocx_plugin_sdk::{Error, Result};

use crate::stream;

/// Flag of `event_create`: the event does not record time.
pub const DISABLE_TIMING: u32 = 1;

/// One record of an event: completed once, with the time the stream reached it.
#[derive(Default)]
pub struct Latch {
    at: Mutex<Option<Instant>>,
    cv: Condvar,
}

impl Latch {
    fn complete(&self) {
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.cv.notify_all();
    }

    /// Blocks until the record has completed; returns when it did.
    pub fn wait(&self) -> Instant {
        let mut at = self.at.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(t) = *at {
                return t;
            }
            at = self.cv.wait(at).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn completed_at(&self) -> Option<Instant> {
        *self.at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct HostEvent {
    timing: bool,
    latest: Mutex<Option<Arc<Latch>>>,
}

impl HostEvent {
    fn latest(&self) -> Option<Arc<Latch>> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The live events of this process.
static EVENTS: HandleTable<Arc<HostEvent>> = HandleTable::new("event");

fn get(handle: Event) -> Result<Arc<HostEvent>> {
    EVENTS.get(handle.0 as usize as u64)
}

/// Creates an event.
pub fn create(flags: u32) -> Result<Event> {
    if flags & !DISABLE_TIMING != 0 {
        return Err(Error::invalid_argument(format!(
            "unknown event flags {flags:#x}"
        )));
    }
    let id = EVENTS.insert(Arc::new(HostEvent {
        timing: flags & DISABLE_TIMING == 0,
        latest: Mutex::new(None),
    }));
    Ok(Event(id as usize as *mut std::ffi::c_void))
}

/// Destroys an event. Waits already enqueued keep their latch and still complete.
pub fn destroy(handle: Event) -> Result<()> {
    EVENTS.remove(handle.0 as usize as u64).map(|_| ())
}

/// Records the event at the current end of `stream`.
pub fn record(handle: Event, on: Stream) -> Result<()> {
    let ev = get(handle)?;
    let s = stream::get(on)?;
    let latch = Arc::new(Latch::default());
    let l = latch.clone();
    // Make it the most recent record before enqueueing, so a wait enqueued right after this call
    // (from any thread) sees it.
    *ev.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some(latch);
    s.enqueue(Box::new(move || {
        l.complete();
        Ok(())
    }))
}

/// Makes later work of `stream` wait for the event's most recent record made before this call.
pub fn stream_wait(on: Stream, handle: Event) -> Result<()> {
    let ev = get(handle)?;
    let s = stream::get(on)?;
    match ev.latest() {
        // Never recorded: nothing to wait for.
        None => Ok(()),
        Some(latch) => s.enqueue(Box::new(move || {
            latch.wait();
            Ok(())
        })),
    }
}

/// Blocks until the most recent record has completed.
pub fn synchronize(handle: Event) -> Result<()> {
    if let Some(l) = get(handle)?.latest() {
        l.wait();
    }
    Ok(())
}

/// `true` when the most recent record has completed (or there is none).
pub fn query(handle: Event) -> Result<bool> {
    Ok(get(handle)?
        .latest()
        .is_none_or(|l| l.completed_at().is_some()))
}

/// Milliseconds between the completed most recent records of two timing events.
pub fn elapsed_ms(start: Event, end: Event) -> Result<f32> {
    let (a, b) = (get(start)?, get(end)?);
    if !a.timing || !b.timing {
        return Err(Error::invalid_argument(
            "an event created with DISABLE_TIMING has no time",
        ));
    }
    let (Some(la), Some(lb)) = (a.latest(), b.latest()) else {
        return Err(Error::invalid_argument(
            "both events must have been recorded",
        ));
    };
    match (la.completed_at(), lb.completed_at()) {
        (Some(ta), Some(tb)) => {
            let ms = if tb >= ta {
                (tb - ta).as_secs_f64() * 1e3
            } else {
                -((ta - tb).as_secs_f64() * 1e3)
            };
            Ok(ms as f32)
        }
        _ => Err(Error::new(
            ferrocx_plugin_sdk::abi::Status::NOT_READY,
            "a record has not completed yet",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A task that blocks its stream until the returned gate is opened.
    fn gate(s: Stream) -> Arc<(Mutex<bool>, Condvar)> {
        let g = Arc::new((Mutex::new(false), Condvar::new()));
        let g2 = g.clone();
        stream::get(s)
            .unwrap()
            .enqueue(Box::new(move || {
                let (m, c) = &*g2;
                let mut open = m.lock().unwrap();
                while !*open {
                    open = c.wait(open).unwrap();
                }
                Ok(())
            }))
            .unwrap();
        g
    }

    fn open(g: &Arc<(Mutex<bool>, Condvar)>) {
        *g.0.lock().unwrap() = true;
        g.1.notify_all();
    }

    #[test]
    fn a_wait_orders_two_streams_without_the_host_blocking() {
        let (a, b) = (stream::create().unwrap(), stream::create().unwrap());
        let ev = create(0).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let g = gate(a);
        let o = order.clone();
        stream::get(a)
            .unwrap()
            .enqueue(Box::new(move || {
                o.lock().unwrap().push("a");
                Ok(())
            }))
            .unwrap();
        record(ev, a).unwrap();
        stream_wait(b, ev).unwrap();
        let o = order.clone();
        stream::get(b)
            .unwrap()
            .enqueue(Box::new(move || {
                o.lock().unwrap().push("b");
                Ok(())
            }))
            .unwrap();
        // b is held back by the event although a is blocked: nothing has run yet.
        assert!(!query(ev).unwrap());
        assert!(order.lock().unwrap().is_empty());
        open(&g);
        stream::get(b).unwrap().synchronize().unwrap();
        assert_eq!(*order.lock().unwrap(), ["a", "b"]);
        assert!(query(ev).unwrap());
    }

    #[test]
    fn re_recording_does_not_redirect_an_earlier_wait() {
        let (a, b, c) = (
            stream::create().unwrap(),
            stream::create().unwrap(),
            stream::create().unwrap(),
        );
        let ev = create(0).unwrap();
        let first_done = Arc::new(AtomicUsize::new(0));
        // Record 1 on `a`, which completes at once.
        record(ev, a).unwrap();
        stream::get(a).unwrap().synchronize().unwrap();
        // b waits for record 1.
        stream_wait(b, ev).unwrap();
        let f = first_done.clone();
        stream::get(b)
            .unwrap()
            .enqueue(Box::new(move || {
                f.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }))
            .unwrap();
        // Record 2 on `c`, which is blocked: an earlier wait must not be redirected to it.
        let g = gate(c);
        record(ev, c).unwrap();
        stream::get(b).unwrap().synchronize().unwrap();
        assert_eq!(first_done.load(Ordering::SeqCst), 1);
        // A wait enqueued now does see record 2.
        stream_wait(b, ev).unwrap();
        let f = first_done.clone();
        stream::get(b)
            .unwrap()
            .enqueue(Box::new(move || {
                f.fetch_add(10, Ordering::SeqCst);
                Ok(())
            }))
            .unwrap();
        assert!(!query(ev).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(
            first_done.load(Ordering::SeqCst),
            1,
            "the second wait must block on record 2"
        );
        open(&g);
        stream::get(b).unwrap().synchronize().unwrap();
        assert_eq!(first_done.load(Ordering::SeqCst), 11);
    }

    #[test]
    fn elapsed_time_between_two_records() {
        let s = stream::create().unwrap();
        let (e0, e1, nt) = (
            create(0).unwrap(),
            create(0).unwrap(),
            create(DISABLE_TIMING).unwrap(),
        );
        record(e0, s).unwrap();
        stream::get(s)
            .unwrap()
            .enqueue(Box::new(|| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                Ok(())
            }))
            .unwrap();
        record(e1, s).unwrap();
        record(nt, s).unwrap();
        synchronize(e1).unwrap();
        let ms = elapsed_ms(e0, e1).unwrap();
        assert!(ms >= 19.0, "{ms}");
        assert!(elapsed_ms(e0, nt).is_err());
        assert!(
            query(create(0).unwrap()).unwrap(),
            "never recorded counts as complete"
        );
        destroy(e0).unwrap();
        assert!(record(e0, s).is_err());
    }
}
