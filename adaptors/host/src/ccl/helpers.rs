//! A rank's helper threads: the copies and reductions of a large collective split over the
//! thread that runs it and `threads - 1` helpers (see `cores` for how many), fork-join per
//! phase. Helpers poll briefly for the next phase (phases of one operation follow each other
//! within microseconds), then sleep on a futex until woken.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrocx::futex;
use ferrocx_plugin_sdk::{Error, Result};

/// How long an idle helper polls for the next phase before it sleeps.
const POLL_FOR: Duration = Duration::from_micros(200);

/// A phase: called with each part index in `0..parts` exactly once, on some thread.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped for each phase (and to stop); helpers sleep on it.
    phase: AtomicU32,
    /// Helpers asleep on `phase`: the forker wakes them only when this is non-zero.
    sleepers: AtomicU32,
    /// Helpers still working on the current phase.
    remaining: AtomicUsize,
    /// A helper's part panicked in the current phase.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// The current phase's job, lifetime erased: valid while `remaining > 0` (the forker waits
    /// for every helper before it returns).
    job: UnsafeCell<Option<Job<'static>>>,
}

// SAFETY: `job` is written only by the forker while no helper reads it (between phases, every
// helper having finished), and read by helpers only after the `phase` bump that publishes it.
unsafe impl Sync for Shared {}

/// A pool of helper threads for one communicator.
pub struct Helpers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Helpers {
    /// Starts `count` helpers (unbound: the scheduler spreads them over the idle cores).
    pub fn start(count: usize) -> Result<Helpers> {
        let shared = Arc::new(Shared {
            phase: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            remaining: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            job: UnsafeCell::new(None),
        });
        let mut pool = Helpers {
            shared: shared.clone(),
            threads: Vec::with_capacity(count),
        };
        for i in 0..count {
            let s = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("ferrocx-helper-{}", i + 1))
                .spawn(move || helper(&s, i + 1))
                .map_err(|e| Error::system("spawn a collective helper thread", e))?;
            pool.threads.push(t);
        }
        Ok(pool)
    }

    /// Threads a phase runs on: the helpers and the caller.
    pub fn parts(&self) -> usize {
        self.threads.len() + 1
    }

    /// Runs `job(i)` for every `i` in `0..parts()`: part 0 on the calling thread, the others on
    /// the helpers; returns when every part is done.
    pub fn run(&self, job: &(dyn Fn(usize) + Sync)) -> Result<()> {
        if self.threads.is_empty() {
            job(0);
            return Ok(());
        }
        let s = &*self.shared;
        // SAFETY: the lifetime is erased only for the helpers of this phase, which finish with
        // it before this function returns (it waits for `remaining` to reach 0, even when the
        // caller's own part panics: see the guard below).
        let erased: Job<'static> = unsafe { std::mem::transmute::<Job<'_>, Job<'static>>(job) };
        // SAFETY: no helper reads `job` now: every one finished the previous phase.
        unsafe { *s.job.get() = Some(erased) };
        s.panicked.store(false, Ordering::Relaxed);
        s.remaining.store(self.threads.len(), Ordering::Relaxed);
        s.phase.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            futex::wake(&s.phase);
        }
        /// Waits for the helpers even if part 0 unwinds, so none outlives `job`.
        struct Join<'a>(&'a Shared);
        impl Drop for Join<'_> {
            fn drop(&mut self) {
                let mut n = 0u32;
                while self.0.remaining.load(Ordering::Acquire) > 0 {
                    n = n.wrapping_add(1);
                    if n % 64 == 0 {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        {
            let _join = Join(s);
            job(0);
        }
        if s.panicked.load(Ordering::Acquire) {
            return Err(Error::internal("a collective helper thread panicked"));
        }
        Ok(())
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.phase.fetch_add(1, Ordering::SeqCst);
        futex::wake(&self.shared.phase);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn helper(s: &Shared, part: usize) {
    // The phase the pool started at, not a fresh load: a phase forked before this thread got
    // to run must still be seen.
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut n = 0u32;
        let now = loop {
            let p = s.phase.load(Ordering::Acquire);
            if p != seen {
                break p;
            }
            n = n.wrapping_add(1);
            if n % 64 == 0 && start.elapsed() > POLL_FOR {
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                if s.phase.load(Ordering::SeqCst) == seen {
                    futex::wait(&s.phase, seen, Duration::from_millis(100));
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
            } else {
                std::hint::spin_loop();
            }
        };
        seen = now;
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: published by the phase bump; valid until this helper decrements `remaining`.
        if let Some(job) = unsafe { *s.job.get() } {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(part))).is_err() {
                s.panicked.store(true, Ordering::Release);
            }
        }
        s.remaining.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_part_runs_once_per_phase() {
        for count in [0, 1, 3] {
            let h = Helpers::start(count).unwrap();
            assert_eq!(h.parts(), count + 1);
            let hits: Vec<AtomicU64> = (0..h.parts()).map(|_| AtomicU64::new(0)).collect();
            for phase in 0..500u64 {
                h.run(&|i| {
                    hits[i].fetch_add(phase + 1, Ordering::Relaxed);
                })
                .unwrap();
                if phase == 100 {
                    // Idle long enough for the helpers to sleep: the next phase wakes them.
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            let want: u64 = (1..=500).sum();
            for (i, x) in hits.iter().enumerate() {
                assert_eq!(
                    x.load(Ordering::Relaxed),
                    want,
                    "part {i} of {count} helpers"
                );
            }
        }
    }

    #[test]
    fn a_panicking_part_is_an_error_not_a_hang() {
        let h = Helpers::start(2).unwrap();
        let e = h
            .run(&|i| {
                if i == 2 {
                    panic!("part 2 fails");
                }
            })
            .unwrap_err();
        assert!(e.message().contains("panicked"), "{}", e.message());
        h.run(&|_| {}).unwrap();
    }
}
