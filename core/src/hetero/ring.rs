//! `FERROCX_BRIDGE_TRACE=ring`: the bridge steps' phases (and the proxy's waits) kept in memory,
//! the latest [`KEEP`] of this process, and printed on stderr when a wait on a peer gives up: a
//! trace of where a stopped pipeline stood that does not slow the steps down the way a line per
//! phase on stderr does.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};

/// Records kept.
pub const KEEP: usize = 512;

struct Ring {
    recs: Mutex<VecDeque<(u64, u64, &'static str)>>,
}

fn ring() -> Option<&'static Ring> {
    static RING: OnceLock<Option<Ring>> = OnceLock::new();
    RING.get_or_init(|| {
        std::env::var("FERROCX_BRIDGE_TRACE")
            .is_ok_and(|v| v == "ring")
            .then(|| Ring {
                recs: Mutex::new(VecDeque::with_capacity(KEEP)),
            })
    })
    .as_ref()
}

/// Records `what` of `n` (an epoch, a proxy job) now, when the ring is on.
pub fn note(n: u64, what: &'static str) {
    if let Some(r) = ring() {
        let t = super::now_us();
        let mut q = r.recs.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == KEEP {
            q.pop_front();
        }
        q.push_back((t, n, what));
    }
}

/// Prints the ring on stderr (once per process), headed by `why`.
pub fn dump(why: &str) {
    static DONE: OnceLock<()> = OnceLock::new();
    let Some(r) = ring() else {
        return;
    };
    if DONE.set(()).is_err() {
        return;
    }
    let q = r.recs.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = format!("bridge trace ring ({why}), {} records:\n", q.len());
    for (t, n, what) in q.iter() {
        out.push_str(&format!("ring t_us={t} n={n} {what}\n"));
    }
    eprint!("{out}");
}
