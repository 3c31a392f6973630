//! futex(2) on words that processes share: the sleep and wake-up under the host CCL's waits
//! and the host window algorithms' signals.
//!
//! The calls are not process-private (no `FUTEX_PRIVATE_FLAG`), so a word in a `MAP_SHARED`
//! mapping wakes sleepers of every process that maps it. A wait returns early on a wake-up, a
//! signal, a spurious wake-up or when the word no longer holds the expected value: callers
//! re-check what they wait for in a loop.

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// `FUTEX_WAIT` on the 4 aligned bytes at `word`, at most `timeout`.
///
/// # Safety
/// `word` points to 4 aligned bytes that stay mapped for the call.
unsafe fn sys_wait(word: *const u32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: by the caller's contract `word` is valid and aligned for the call; the kernel
    // only reads it. `ts` outlives the call. FUTEX_WAIT has no other effect than blocking this
    // thread at most `timeout`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word,
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// `FUTEX_WAKE` of every sleeper on the 4 aligned bytes at `word`.
///
/// # Safety
/// `word` points to 4 aligned bytes that stay mapped for the call.
unsafe fn sys_wake(word: *const u32) {
    // SAFETY: by the caller's contract `word` is valid and aligned for the call; FUTEX_WAKE
    // neither reads nor writes it, it only wakes its sleepers.
    unsafe {
        libc::syscall(libc::SYS_futex, word, libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Sleeps while `word` holds `expected`, at most `timeout` (less on a wake-up, a signal or a
/// spurious wake-up: the caller re-checks).
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    // SAFETY: a reference: 4 aligned bytes, alive for the call.
    unsafe { sys_wait(word.as_ptr(), expected, timeout) }
}

/// Wakes every thread asleep on `word`, in any process.
pub fn wake(word: &AtomicU32) {
    // SAFETY: a reference: 4 aligned bytes, alive for the call.
    unsafe { sys_wake(word.as_ptr()) }
}

/// The address of the low 32 bits of `value`: its futex word.
fn low_word(value: &AtomicU64) -> *const u32 {
    let at = value.as_ptr().cast::<u32>().cast_const();
    if cfg!(target_endian = "big") {
        at.wrapping_add(1)
    } else {
        at
    }
}

/// Sleeps while the low 32 bits of `value` are those of `seen`, at most `timeout` (less on a
/// wake-up, a signal or a spurious wake-up: the caller re-checks). For 64-bit counters whose
/// writers call [`wake_low`] after each store.
pub fn wait_low(value: &AtomicU64, seen: u64, timeout: Duration) {
    // SAFETY: the low word is 4 aligned bytes inside `value`, alive for the call.
    unsafe { sys_wait(low_word(value), seen as u32, timeout) }
}

/// Wakes every thread asleep (in [`wait_low`]) on `value`'s low 32 bits, in any process.
pub fn wake_low(value: &AtomicU64) {
    // SAFETY: the low word is 4 aligned bytes inside `value`, alive for the call.
    unsafe { sys_wake(low_word(value)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_wait_on_a_changed_word_returns_at_once_and_a_stale_one_times_out() {
        let w = AtomicU32::new(5);
        let t = Instant::now();
        wait(&w, 4, Duration::from_secs(10));
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the word differs: no sleep"
        );
        let t = Instant::now();
        wait(&w, 5, Duration::from_millis(30));
        assert!(
            t.elapsed() >= Duration::from_millis(20),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn wake_low_wakes_a_sleeper_on_the_low_word() {
        let v = Arc::new(AtomicU64::new(1 << 32 | 7));
        let v2 = v.clone();
        let sleeper = std::thread::spawn(move || {
            let t = Instant::now();
            while v2.load(Ordering::SeqCst) == (1 << 32 | 7) {
                wait_low(&v2, 1 << 32 | 7, Duration::from_secs(10));
            }
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(20));
        v.store(2 << 32 | 8, Ordering::SeqCst);
        wake_low(&v);
        let waited = sleeper.join().unwrap();
        assert!(
            waited < Duration::from_secs(5),
            "woken, not timed out: {waited:?}"
        );
    }
}
