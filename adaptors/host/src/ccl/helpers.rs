//! A rank's helper threads: the copies and reductions of a large collective split over the
//! thread that runs it and `threads - 1` helpers (see `cores` for how many), fork-join per
//! phase. Helpers poll briefly for the next phase (phases of one operation follow each other
//! within microseconds), then sleep on a futex until woken.
//!
//! A phase is a number of units, more than threads, that the threads claim one at a time
//! (one atomic word holds the phase's tag, its unit count and the next unclaimed unit): a
//! thread that is preempted, or slow to wake, holds back at most the unit it holds, and the
//! phase ends when every unit is done, not when every helper has checked in. Where ranks and
//! their helpers fill the cores, one descheduled helper with a fixed share held the whole
//! phase (and every peer waiting at the next barrier) for a scheduler quantum.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrocx::futex;
use ferrocx_plugin_sdk::{Error, Result};

/// How long an idle helper polls for the next phase before it sleeps.
const POLL_FOR: Duration = Duration::from_micros(200);

/// Bits of the claim word: the phase's tag (24), its unit count (20), the next unit (20).
const UNIT_BITS: u32 = 20;
const UNIT_MASK: u64 = (1 << UNIT_BITS) - 1;
const TAG_MASK: u64 = (1 << 24) - 1;

/// The most units a phase may have.
pub const MAX_UNITS: usize = UNIT_MASK as usize;

/// A phase's work: called with each unit index in `0..units` exactly once, on some thread.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped for each phase (and to stop); helpers sleep on it.
    phase: AtomicU32,
    /// Helpers asleep on `phase`: the forker wakes them only when this is non-zero.
    sleepers: AtomicU32,
    /// The current phase's tag, unit count and next unclaimed unit (see `UNIT_BITS`).
    claim: AtomicU64,
    /// Units of the current phase done.
    done: AtomicUsize,
    /// A unit panicked in the current phase.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// The current phase's job, lifetime erased: valid until every unit is done (the forker
    /// waits for that before it returns); read only by a thread that has claimed a unit.
    job: UnsafeCell<Option<Job<'static>>>,
}

// SAFETY: `job` is written only by the forker between phases, when every unit of the last one
// is done and none is left to claim (so no thread reads it), and read only after a successful
// claim of the phase that published it.
unsafe impl Sync for Shared {}

fn claim_word(tag: u32, units: usize) -> u64 {
    ((u64::from(tag) & TAG_MASK) << (2 * UNIT_BITS)) | ((units as u64 & UNIT_MASK) << UNIT_BITS)
}

impl Shared {
    /// Claims and runs units of the phase tagged `tag` until none is left (or another phase
    /// has begun: its units are not this call's).
    fn work(&self, tag: u32) {
        let want = u64::from(tag) & TAG_MASK;
        loop {
            let c = self.claim.load(Ordering::Acquire);
            if c >> (2 * UNIT_BITS) != want {
                return;
            }
            let units = (c >> UNIT_BITS) & UNIT_MASK;
            let next = c & UNIT_MASK;
            if next >= units {
                return;
            }
            if self
                .claim
                .compare_exchange_weak(c, c + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // SAFETY: a unit of this phase is claimed and not done, so the forker has published
            // `job` for it and waits for it before the job goes away.
            if let Some(job) = unsafe { *self.job.get() } {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(next as usize)))
                    .is_err()
                {
                    self.panicked.store(true, Ordering::Release);
                }
            }
            self.done.fetch_add(1, Ordering::AcqRel);
        }
    }
}

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
            claim: AtomicU64::new(0),
            done: AtomicUsize::new(0),
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
                .spawn(move || helper(&s))
                .map_err(|e| Error::system("spawn a collective helper thread", e))?;
            pool.threads.push(t);
        }
        Ok(pool)
    }

    /// Threads a phase runs on: the helpers and the caller.
    pub fn parts(&self) -> usize {
        self.threads.len() + 1
    }

    /// Runs `job(u)` for every `u` in `0..units` (at most [`MAX_UNITS`]), each once, on the
    /// calling thread and the helpers, whichever claims it; returns when every unit is done.
    /// Callers split a phase into a few units per thread (see the module docs).
    pub fn run(&self, units: usize, job: &(dyn Fn(usize) + Sync)) -> Result<()> {
        if units > MAX_UNITS {
            return Err(Error::internal(format!(
                "a phase of {units} units (at most {MAX_UNITS})"
            )));
        }
        if self.threads.is_empty() || units <= 1 {
            for u in 0..units {
                job(u);
            }
            return Ok(());
        }
        let s = &*self.shared;
        // SAFETY: the lifetime is erased only for this phase's units, which are all done before
        // this function returns (it waits for `done` to reach `units`; a unit that panics is
        // caught and counted done).
        let erased: Job<'static> = unsafe { std::mem::transmute::<Job<'_>, Job<'static>>(job) };
        // SAFETY: no thread reads `job` now: every unit of the last phase is done and none is
        // left to claim.
        unsafe { *s.job.get() = Some(erased) };
        s.panicked.store(false, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        let tag = s.phase.load(Ordering::Relaxed).wrapping_add(1);
        s.claim.store(claim_word(tag, units), Ordering::Release);
        s.phase.store(tag, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            futex::wake(&s.phase);
        }
        s.work(tag);
        let mut n = 0u32;
        while s.done.load(Ordering::Acquire) < units {
            n = n.wrapping_add(1);
            if n % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
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

fn helper(s: &Shared) {
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
        s.work(now);
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
                h.run(h.parts(), &|i| {
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
    fn every_unit_runs_once_when_units_outnumber_threads_and_some_are_slow() {
        let h = Helpers::start(2).unwrap();
        let units = 5 * h.parts() + 1;
        let hits: Vec<AtomicU64> = (0..units).map(|_| AtomicU64::new(0)).collect();
        for phase in 0..300u64 {
            h.run(units, &|u| {
                if (u as u64 + phase) % 37 == 0 {
                    // A slow unit: the others are claimed by the other threads meanwhile.
                    std::thread::sleep(Duration::from_micros(300));
                }
                hits[u].fetch_add(phase + 1, Ordering::Relaxed);
            })
            .unwrap();
            if phase == 150 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let want: u64 = (1..=300).sum();
        for (u, x) in hits.iter().enumerate() {
            assert_eq!(x.load(Ordering::Relaxed), want, "unit {u}");
        }
        // A phase of no units, of one, and too many.
        h.run(0, &|_| panic!("no unit to run")).unwrap();
        let one = AtomicU64::new(0);
        h.run(1, &|_| {
            one.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(one.load(Ordering::Relaxed), 1);
        assert!(h.run(MAX_UNITS + 1, &|_| {}).is_err());
    }

    #[test]
    fn a_panicking_part_is_an_error_not_a_hang() {
        let h = Helpers::start(2).unwrap();
        let e = h
            .run(7, &|i| {
                if i == 2 {
                    panic!("unit 2 fails");
                }
            })
            .unwrap_err();
        assert!(e.message().contains("panicked"), "{}", e.message());
        h.run(7, &|_| {}).unwrap();
    }
}
