//! Waiting on peers: spin briefly, then yield, then sleep on a futex in the shared segment;
//! every wait has a deadline, notices an abort, and names a peer that died.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ferrocx_plugin_sdk::abi::Status;
use ferrocx_plugin_sdk::{Error, Result};

use super::segment::Segment;

/// Sleeps while `*word == expected`, at most `timeout`. Works across processes (the word is in
/// a `MAP_SHARED` mapping, so the futex is not process-private).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; the kernel only reads
    // it. A spurious or early return is handled by the callers' loops.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every sleeper on `word`, if any rank of `seg` sleeps (the common case is a spinning
/// peer, and the system call is then skipped).
pub fn wake(seg: &Segment, word: &AtomicU32) {
    if seg.header().sleepers.load(Ordering::SeqCst) > 0 {
        futex_wake(word);
    }
}

/// Wakes every sleeper on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
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
pub struct Waiter<'a> {
    seg: &'a Segment,
    me: usize,
    deadline: Instant,
    timeout: Duration,
    spins: u32,
    spin: u32,
    next_check: Instant,
    what: &'a str,
}

/// Iterations of pure spinning before yielding, when every rank can have a core.
const SPIN: u32 = 2_000;
/// Iterations of pure spinning when ranks outnumber cores: a spinning rank would hold the core
/// a peer needs to arrive, so yield almost at once.
const SPIN_OVERSUBSCRIBED: u32 = 16;
/// Iterations of yielding before sleeping on the futex.
const YIELD: u32 = 200;

/// The spin budget for a communicator of `nranks` processes on this host.
fn spin_budget(nranks: usize) -> u32 {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if nranks > cores {
        SPIN_OVERSUBSCRIBED
    } else {
        SPIN
    }
}

impl<'a> Waiter<'a> {
    /// A wait for `what` (used in errors) with the communicator's timeout.
    pub fn new(seg: &'a Segment, me: usize, timeout: Duration, what: &'a str) -> Self {
        let now = Instant::now();
        Waiter {
            seg,
            me,
            deadline: now + timeout,
            timeout,
            spins: 0,
            spin: spin_budget(seg.layout.nranks),
            next_check: now + Duration::from_millis(20),
            what,
        }
    }

    /// One round of waiting: call in a loop that re-checks its condition. `sleep_on` is the word
    /// the peer bumps when it makes progress, and its value when the condition was last checked.
    /// `pending` lists the peers still awaited (for the error message).
    pub fn pause(
        &mut self,
        sleep_on: (&AtomicU32, u32),
        pending: impl Fn() -> Vec<usize>,
    ) -> Result<()> {
        self.spins += 1;
        if self.spins < self.spin {
            std::hint::spin_loop();
            return Ok(());
        }
        if self.spins < self.spin + YIELD {
            std::thread::yield_now();
        } else {
            // Announce the sleep before re-checking the word (futex_wait compares it), so a
            // waker that changed it either sees a sleeper or the compare fails.
            let sleepers = &self.seg.header().sleepers;
            sleepers.fetch_add(1, Ordering::SeqCst);
            futex_wait(sleep_on.0, sleep_on.1, Duration::from_millis(5));
            sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        self.check(pending)
    }

    fn check(&mut self, pending: impl Fn() -> Vec<usize>) -> Result<()> {
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
    let h = seg.header();
    seg.rank(me).arrived.store(gen, Ordering::SeqCst);
    let all_here = || (0..n).all(|r| seg.rank(r).arrived.load(Ordering::Acquire) >= gen);
    if all_here() {
        // Last to arrive (or tied for last): wake the sleepers.
        h.wake.fetch_add(1, Ordering::SeqCst);
        wake(seg, &h.wake);
        return Ok(());
    }
    let mut w = Waiter::new(seg, me, timeout, what);
    loop {
        let word = h.wake.load(Ordering::SeqCst);
        if all_here() {
            return Ok(());
        }
        w.pause((&h.wake, word), || {
            (0..n)
                .filter(|&r| seg.rank(r).arrived.load(Ordering::Acquire) < gen)
                .collect()
        })?;
    }
}
