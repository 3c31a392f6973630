//! Host functions the kit launches on streams: they record that (and in which order) they
//! ran, and a gated one holds its stream until the check opens it, so a check can see what
//! the device does while work is pending.
//!
//! A probe is leaked on purpose: an adaptor may call a host function late, twice or never, and
//! nothing the function can reach may be freed while that is possible. A gate opens by itself
//! after [`GATE_LIMIT`], so a misbehaving adaptor cannot hang the suite on one.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use ferrocx::abi::Stream;

use crate::boundary::{raw_call, DeviceApi, Res};

/// The longest a gate holds its stream.
pub(crate) const GATE_LIMIT: Duration = Duration::from_secs(5);

/// Order in which probes ran, process-wide.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// One host function's record.
pub(crate) struct Probe {
    runs: AtomicU32,
    /// The value of [`SEQUENCE`] when it (last) ran; 0 before.
    order: AtomicU64,
    gate: Option<Gate>,
    sleep: Duration,
}

struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    timed_out: AtomicBool,
}

impl Probe {
    fn leak(gate: Option<Gate>, sleep: Duration) -> &'static Probe {
        Box::leak(Box::new(Probe {
            runs: AtomicU32::new(0),
            order: AtomicU64::new(0),
            gate,
            sleep,
        }))
    }

    /// A probe that only records.
    pub(crate) fn mark() -> &'static Probe {
        Probe::leak(None, Duration::ZERO)
    }

    /// A probe that sleeps for `d` when it runs.
    pub(crate) fn sleeper(d: Duration) -> &'static Probe {
        Probe::leak(None, d)
    }

    /// A probe that holds its stream until [`Probe::open`] (or [`GATE_LIMIT`]).
    pub(crate) fn gate() -> &'static Probe {
        Probe::leak(
            Some(Gate {
                open: Mutex::new(false),
                cv: Condvar::new(),
                timed_out: AtomicBool::new(false),
            }),
            Duration::ZERO,
        )
    }

    /// Enqueues the probe on `stream`.
    pub(crate) fn launch(&'static self, api: &DeviceApi, stream: Stream) -> Res<()> {
        let user = self as *const Probe as *mut c_void;
        raw_call!(api, api.root(), launch_host_func(stream, Some(run), user))
    }

    /// Times it has run.
    pub(crate) fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }

    /// When it (last) finished, in the order of all probes; 0 before it ran.
    pub(crate) fn order(&self) -> u64 {
        self.order.load(Ordering::SeqCst)
    }

    /// Opens the gate.
    pub(crate) fn open(&self) {
        if let Some(g) = &self.gate {
            *g.open.lock().unwrap_or_else(|p| p.into_inner()) = true;
            g.cv.notify_all();
        }
    }

    /// Whether the gate gave up waiting (it was never opened in time).
    pub(crate) fn timed_out(&self) -> bool {
        self.gate
            .as_ref()
            .is_some_and(|g| g.timed_out.load(Ordering::SeqCst))
    }

    fn hold(&self) {
        let Some(g) = &self.gate else { return };
        let deadline = Instant::now() + GATE_LIMIT;
        let mut open = g.open.lock().unwrap_or_else(|p| p.into_inner());
        while !*open {
            let now = Instant::now();
            if now >= deadline {
                g.timed_out.store(true, Ordering::SeqCst);
                return;
            }
            open =
                g.cv.wait_timeout(open, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
        }
    }
}

/// Opens a gate when dropped, so every path out of a check releases the stream it holds.
pub(crate) struct OpenOnDrop(pub &'static Probe);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// The host function: never unwinds into the adaptor.
unsafe extern "C" fn run(user: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if user.is_null() {
            return;
        }
        // SAFETY: `user` is the address of a leaked, never-freed `Probe` the kit launched.
        let p = unsafe { &*(user as *const Probe) };
        p.hold();
        if !p.sleep.is_zero() {
            std::thread::sleep(p.sleep);
        }
        p.order.store(
            SEQUENCE.fetch_add(1, Ordering::SeqCst) + 1,
            Ordering::SeqCst,
        );
        p.runs.fetch_add(1, Ordering::SeqCst);
    }));
}

/// Polls `done` until it holds or `limit` passes; returns whether it held.
pub(crate) fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
