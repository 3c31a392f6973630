//! Waiting on peers: spin briefly, then yield, then sleep on a futex in the shared segment;
//! every wait has a deadline, notices an abort, and names a peer that died.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferrocx::futex;
use ferrocx_plugin_sdk::abi::Status;
use ferrocx_plugin_sdk::{Error, Result};

use super::segment::Segment;

/// Whether this process publishes with the light side of an asymmetric fence (see
/// [`notify`]): set once the process is registered for `membarrier`'s global expedited command.
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

/// Environment variable: `0` keeps a full fence in every publication (no `membarrier`).
pub const MEMBARRIER_ENV: &str = "FERROCX_HOST_MEMBARRIER";

/// Registers this process for `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` (once), so that
/// [`notify`] needs no fence of its own: a rank about to sleep issues the heavy side
/// ([`sleeper_fence`]) instead. Where the kernel lacks it (or [`MEMBARRIER_ENV`] is `0`),
/// publishers keep their full fence.
pub fn init_fences() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let off = std::env::var(MEMBARRIER_ENV).is_ok_and(|v| v.trim() == "0");
        ASYMMETRIC.store(!off && register_membarrier(), Ordering::SeqCst);
    });
}

#[cfg(target_os = "linux")]
fn register_membarrier() -> bool {
    const QUERY: libc::c_long = 0;
    const GLOBAL_EXPEDITED: libc::c_long = 1 << 1;
    const REGISTER_GLOBAL_EXPEDITED: libc::c_long = 1 << 2;
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    let cmds = unsafe { libc::syscall(libc::SYS_membarrier, QUERY, 0) };
    if cmds < 0 || cmds & (GLOBAL_EXPEDITED | REGISTER_GLOBAL_EXPEDITED) == 0 {
        return false;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_GLOBAL_EXPEDITED, 0) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn register_membarrier() -> bool {
    false
}

/// The heavy side of the fence between a rank that registers as a sleeper and a publisher
/// that then reads the sleeper count without a fence ([`notify`]): a memory barrier on every
/// running thread of every registered process. A rank calls it only on its way to sleep (after
/// milliseconds of waiting), never on a busy path.
fn sleeper_fence() {
    #[cfg(target_os = "linux")]
    if ASYMMETRIC.load(Ordering::Relaxed) {
        const GLOBAL_EXPEDITED: libc::c_long = 1 << 1;
        // SAFETY: membarrier takes two integers and touches no memory of ours.
        unsafe { libc::syscall(libc::SYS_membarrier, GLOBAL_EXPEDITED, 0) };
    }
}

/// Tells sleeping ranks of `seg` that something they may wait for changed. Call it after the
/// publishing store; it costs one load when nobody sleeps, which is the common case while peers
/// spin.
///
/// The publisher's store and its load of the sleeper count must not be reordered against a
/// sleeper's registration and its re-check (each side must see the other's store, else the
/// sleeper sleeps through the publication). With `membarrier` registered (see [`init_fences`])
/// the publisher orders them with a compiler fence only, and the sleeper pays with
/// [`sleeper_fence`]: a full fence here drains the store buffer, which waits for the
/// publishing store's cache line to come back from the peers that read it, the largest part of
/// a small broadcast's root. Without it, a full fence.
pub fn notify(seg: &Segment) {
    if ASYMMETRIC.load(Ordering::Relaxed) {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        std::sync::atomic::fence(Ordering::SeqCst);
    }
    let h = seg.header();
    if h.sleepers.load(Ordering::Relaxed) > 0 {
        h.wake.fetch_add(1, Ordering::SeqCst);
        futex::wake(&h.wake);
    }
}

/// Whether process `pid` is still running (a zombie counts as dead).
pub fn alive(pid: u32) -> bool {
    if pid == 0 {
        return true;
    }
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => r == 0,
    }
}

/// A wait on peers: the progress policy and the checks every wait makes.
struct Waiter<'a> {
    seg: &'a Segment,
    me: usize,
    deadline: Instant,
    timeout: Duration,
    next_check: Instant,
    what: &'a str,
}

/// Iterations of pure spinning before yielding, when every rank can have a core.
const SPIN: u32 = 2_000;
/// Iterations of pure spinning when ranks outnumber cores: a spinning rank would hold the core
/// a peer needs to arrive, so yield almost at once.
const SPIN_OVERSUBSCRIBED: u32 = 16;
/// How long a waiter yields (after spinning) before it sleeps on the futex. A sleeper gives
/// its core away and, on a loaded machine, waits for one to be woken on: every later hand-off
/// then costs a wake-up (tens to hundreds of microseconds). A yielding waiter stays runnable
/// (as MPI's polling does), so lockstep collectives keep going at memory speed; a peer late by
/// more than this is a real imbalance, and then sleeping frees the core.
const YIELD_FOR: Duration = Duration::from_millis(2);

/// The cores this process may run on (read once).
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The spin budget for a communicator of `nranks` processes on this host.
fn spin_budget(nranks: usize) -> u32 {
    if nranks > cores() {
        SPIN_OVERSUBSCRIBED
    } else {
        SPIN
    }
}

/// Polls `ready()` for at most `budget` without sleeping (an inline attempt's bounded wait):
/// spins where every rank of the `nranks` can have a core, yields otherwise (a spinning rank
/// would hold the core a peer needs); a zero budget looks once. Returns whether it held.
pub fn poll(budget: Duration, nranks: usize, mut ready: impl FnMut() -> bool) -> bool {
    // The common case first: what is waited for is there already.
    if ready() {
        return true;
    }
    if budget.is_zero() {
        // One look: the caller goes on without waiting at all.
        return false;
    }
    let oversubscribed = spin_budget(nranks) == SPIN_OVERSUBSCRIBED;
    let mut start = None;
    let mut n = 0u32;
    loop {
        if ready() {
            return true;
        }
        n = n.wrapping_add(1);
        if oversubscribed {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        // Read the clock every few polls only when spinning (a poll is tens of nanoseconds),
        // after every yield otherwise (a yield may give the core away for a time slice).
        if oversubscribed || n % 16 == 0 {
            let t0 = *start.get_or_insert_with(Instant::now);
            if t0.elapsed() >= budget {
                return ready();
            }
        }
    }
}

/// Waits until `ready()` holds: spins briefly, then yields, then sleeps on the segment's futex
/// (woken by [`notify`]). Fails on abort, on a dead peer among `pending()`, or at the deadline,
/// naming the ranks still awaited.
pub fn wait_until(
    seg: &Segment,
    me: usize,
    timeout: Duration,
    what: &str,
    mut ready: impl FnMut() -> Result<bool>,
    pending: impl Fn() -> Vec<usize>,
) -> Result<()> {
    let spin = spin_budget(seg.layout.nranks);
    // The clock is first read once the spinning is over: a wait that ends while spinning (the
    // common case on a busy path) reads no clock at all. The deadline counts from there.
    let mut w: Option<Waiter<'_>> = None;
    let h = seg.header();
    let mut n = 0u32;
    let mut yield_until = None;
    let mut sleeping = false;
    loop {
        if ready()? {
            return Ok(());
        }
        n = n.saturating_add(1);
        if n < spin {
            std::hint::spin_loop();
            continue;
        }
        let yielding = match yield_until {
            None => {
                yield_until = Some(Instant::now() + YIELD_FOR);
                true
            }
            Some(t) => {
                if !sleeping && n % 16 == 0 && Instant::now() >= t {
                    sleeping = true;
                }
                !sleeping
            }
        };
        if yielding {
            std::thread::yield_now();
        } else {
            // Register as a sleeper, then re-check: a publisher either sees the sleeper (and
            // bumps the word, failing the futex compare or waking us) or published before the
            // registration (and the re-check sees it). The fence pairs with `notify`'s.
            h.sleepers.fetch_add(1, Ordering::SeqCst);
            sleeper_fence();
            let word = h.wake.load(Ordering::SeqCst);
            let r = ready();
            if !matches!(r, Ok(false)) {
                h.sleepers.fetch_sub(1, Ordering::SeqCst);
                return r.map(|_| ());
            }
            futex::wait(&h.wake, word, Duration::from_millis(5));
            h.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        let w = w.get_or_insert_with(|| {
            let now = Instant::now();
            Waiter {
                seg,
                me,
                deadline: now + timeout,
                timeout,
                next_check: now + Duration::from_millis(20),
                what,
            }
        });
        if let Err(e) = w.check(&pending) {
            return settle(e, &mut ready);
        }
    }
}

/// The end of a wait whose check failed with `e`: one more look at `ready` decides. A peer
/// may publish what this rank waits for and then exit (its last operation done) between the
/// waiter's previous look and the check that finds it dead, and a publish may land just at the
/// deadline: in both cases the data is there and the wait succeeded.
fn settle(e: Error, ready: &mut impl FnMut() -> Result<bool>) -> Result<()> {
    match ready() {
        Ok(true) => Ok(()),
        _ => Err(e),
    }
}

impl Waiter<'_> {
    fn check(&mut self, pending: &impl Fn() -> Vec<usize>) -> Result<()> {
        if self.seg.header().abort.load(Ordering::Acquire) != 0 {
            return Err(Error::new(
                Status::ABORTED,
                format!("{}: the communicator was aborted", self.what),
            ));
        }
        let now = Instant::now();
        if now < self.next_check && now < self.deadline {
            return Ok(());
        }
        self.next_check = now + Duration::from_millis(20);
        let waiting = pending();
        for &r in &waiting {
            let pid = self.seg.rank(r).pid.load(Ordering::Acquire);
            if r != self.me && !alive(pid) {
                return Err(Error::new(
                    Status::PEER_FAILURE,
                    format!("{}: rank {r} (pid {pid}) died", self.what),
                ));
            }
        }
        if now >= self.deadline {
            let list: Vec<String> = waiting.iter().map(|r| r.to_string()).collect();
            return Err(Error::new(
                Status::TIMEOUT,
                format!(
                    "{}: timed out after {} ms waiting for rank(s) {}",
                    self.what,
                    self.timeout.as_millis(),
                    list.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

/// A generation-counted barrier: each rank publishes the generation it reached in its own
/// counter (never reset), so an early leaver's next arrival can never be confused with this one.
pub fn barrier(seg: &Segment, me: usize, gen: u64, timeout: Duration, what: &str) -> Result<()> {
    let n = seg.layout.nranks;
    seg.rank(me).arrived.store(gen, Ordering::SeqCst);
    notify(seg);
    wait_until(
        seg,
        me,
        timeout,
        what,
        || Ok((0..n).all(|r| seg.rank(r).arrived.load(Ordering::Acquire) >= gen)),
        || {
            (0..n)
                .filter(|&r| seg.rank(r).arrived.load(Ordering::Acquire) < gen)
                .collect()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_check_gives_way_to_data_that_arrived_meanwhile() {
        let dead = || Error::new(Status::PEER_FAILURE, "recv: rank 0 (pid 1) died");
        assert!(
            settle(dead(), &mut || Ok(true)).is_ok(),
            "published, then exited"
        );
        let e = settle(dead(), &mut || Ok(false)).unwrap_err();
        assert_eq!(e.status(), Status::PEER_FAILURE);
        assert!(
            e.message().contains("rank 0 (pid 1) died"),
            "{}",
            e.message()
        );
        let e = settle(dead(), &mut || Err(Error::new(Status::ABORTED, "aborted"))).unwrap_err();
        assert_eq!(e.status(), Status::PEER_FAILURE, "the check's error stands");
    }
}
