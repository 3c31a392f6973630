//! The memops group (`ferrocx_device_memops_v1`, ABI 1.3): 32-bit stores and waits on host
//! memory in stream order.
//!
//! The words live in the device's page-locked host memory (`mem_alloc` of `PINNED`), which the
//! ABI defines as host memory the device reaches directly: what the group's `addr` must be on a
//! GPU, and plain host memory on a device over host memory. The kit reads and writes them from
//! its own thread. A wait is held only as long as a check watches it, and every check leaves
//! its waits satisfied (even when it fails) before it destroys streams or frees the words.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ferrocx::abi::{DeviceMemOpsV1, MemKind, Status, Stream, WAIT_VALUE_EQ, WAIT_VALUE_GEQ};

use super::check_if;
use super::probe::{wait_until, GATE_LIMIT};
use crate::boundary::{ensure, fail, raw_call, refused, skip, DeviceApi, Res, Stop, Verdict};
use crate::buffer::{DevBuf, OwnedStream};
use crate::report::Outcome;
use crate::runner::Runner;

/// How long a check watches a stream whose wait must hold.
const SETTLE: Duration = Duration::from_millis(60);

pub(super) fn run(r: &mut Runner<'_>, api: &DeviceApi, memory: &Option<Outcome>) {
    let absent = api
        .dev
        .tables()
        .memops
        .is_none()
        .then(|| Outcome::absent(<DeviceMemOpsV1 as ferrocx::abi::AbiTable>::SYMBOL));
    let need = absent.or_else(|| memory.clone());
    check_if(
        r,
        &need,
        "memops: a write on one stream releases a wait on another",
        || across_streams(api),
    );
    check_if(
        r,
        &need,
        "memops: wait GEQ compares with wrap-around",
        || geq_wraps(api),
    );
    check_if(r, &need, "memops: wait EQ needs the exact value", || {
        eq_exact(api)
    });
    check_if(
        r,
        &need,
        "memops: unknown flags and a null address are refused",
        || bad_arguments(api),
    );
}

fn table(api: &DeviceApi) -> &DeviceMemOpsV1 {
    api.dev
        .tables()
        .memops
        .as_ref()
        .map(|t| t.get())
        .expect("checked by run: the group is exported")
}

/// Page-locked host words the kit and the device share, set to zero.
struct Words<'a> {
    buf: DevBuf<'a>,
    n: usize,
}

impl<'a> Words<'a> {
    fn new(api: &'a DeviceApi, n: usize) -> Result<Words<'a>, Stop> {
        let buf = DevBuf::new(api, 4 * n, MemKind::PINNED).map_err(|e| {
            skip(format!(
                "the words need page-locked host memory (mem_alloc of PINNED), which failed: {e}"
            ))
        })?;
        let w = Words { buf, n };
        for i in 0..n {
            w.word(i).store(0, Ordering::SeqCst);
        }
        Ok(w)
    }

    fn ptr(&self, i: usize) -> *mut u32 {
        assert!(i < self.n);
        (self.buf.ptr().0 as usize + 4 * i) as *mut u32
    }

    fn word(&self, i: usize) -> &AtomicU32 {
        // SAFETY: a live, 4-byte aligned allocation of page-locked host memory (the ABI's
        // PINNED: readable and writable by the host) of `n` words; every access is atomic.
        unsafe { AtomicU32::from_ptr(self.ptr(i)) }
    }
}

/// Sets a word to a value that satisfies the wait on it when dropped, so that no stream is left
/// waiting on memory about to be freed, whatever the check found.
struct Release<'a> {
    word: &'a AtomicU32,
    value: u32,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.word.store(self.value, Ordering::SeqCst);
    }
}

fn write(api: &DeviceApi, s: Stream, addr: *mut u32, value: u32) -> Res<()> {
    raw_call!(api, table(api), stream_write_value32(s, addr, value))
}

fn wait(api: &DeviceApi, s: Stream, addr: *const u32, value: u32, flags: u32) -> Res<()> {
    raw_call!(api, table(api), stream_wait_value32(s, addr, value, flags))
}

/// Enqueues on `s` a wait on word 0 and, behind it, a write of `marker` to word 1; checks the
/// write stays held for a while, then sets word 0 to `release` (through `releaser` or from the
/// host) and checks the write happens.
fn held_then_released(
    api: &DeviceApi,
    words: &Words<'_>,
    s: Stream,
    (value, flags, what): (u32, u32, &str),
    release: u32,
    releaser: Option<Stream>,
) -> Verdict {
    let marker = 0x5EED_0000 | flags;
    words.word(1).store(0, Ordering::SeqCst);
    let _guard = Release {
        word: words.word(0),
        value: release,
    };
    wait(api, s, words.ptr(0), value, flags)?;
    write(api, s, words.ptr(1), marker)?;
    std::thread::sleep(SETTLE);
    let early = words.word(1).load(Ordering::SeqCst);
    ensure(early == 0, || {
        format!(
            "work enqueued after a wait {what} {value} ran while the word was {}",
            words.word(0).load(Ordering::SeqCst)
        )
    })?;
    match releaser {
        Some(other) => write(api, other, words.ptr(0), release)?,
        None => words.word(0).store(release, Ordering::SeqCst),
    }
    let done = wait_until(GATE_LIMIT, || {
        words.word(1).load(Ordering::SeqCst) == marker
    });
    ensure(done, || {
        format!(
            "the wait {what} {value} did not let later work run within {GATE_LIMIT:?} of the \
             word becoming {release}"
        )
    })
}

fn across_streams(api: &DeviceApi) -> Verdict {
    let words = Words::new(api, 2)?;
    let a = OwnedStream::new(api).map_err(Stop::from)?;
    let b = OwnedStream::new(api).map_err(Stop::from)?;
    // b waits for a counter to reach 1; a writes it.
    held_then_released(api, &words, b.s, (1, WAIT_VALUE_GEQ, ">="), 1, Some(a.s))?;
    api.seen(api.dev.stream_synchronize(a.s))?;
    api.seen(api.dev.stream_synchronize(b.s))?;
    ensure(words.word(0).load(Ordering::SeqCst) == 1, || {
        "stream_write_value32 did not store its value".into()
    })?;
    // A write on the default stream (null) is a write in its order too.
    write(api, Stream::NULL, words.ptr(0), 0xC0FF_EE01)?;
    api.seen(api.dev.stream_synchronize(Stream::NULL))?;
    let got = words.word(0).load(Ordering::SeqCst);
    ensure(got == 0xC0FF_EE01, || {
        format!("stream_write_value32 on the default stream stored {got:#x}, not 0xc0ffee01")
    })?;
    b.destroy()?;
    a.destroy().map_err(Stop::from)
}

fn geq_wraps(api: &DeviceApi) -> Verdict {
    let words = Words::new(api, 2)?;
    let s = OwnedStream::new(api).map_err(Stop::from)?;
    // A counter that wrapped (1) is at or past u32::MAX - 1: the wait does not hold.
    words.word(0).store(1, Ordering::SeqCst);
    wait(api, s.s, words.ptr(0), u32::MAX - 1, WAIT_VALUE_GEQ)?;
    write(api, s.s, words.ptr(1), 7)?;
    let passed = wait_until(GATE_LIMIT, || words.word(1).load(Ordering::SeqCst) == 7);
    if !passed {
        words.word(0).store(u32::MAX - 1, Ordering::SeqCst);
        return Err(fail(
            "a wait GEQ u32::MAX-1 held with the word at 1: GEQ must compare as \
             (int32_t)(*addr - value) >= 0 (wrap-around), not as unsigned",
        ));
    }
    // u32::MAX - 1 is before 2 (with wrap-around): the wait holds until the word reaches 2.
    words.word(0).store(u32::MAX - 1, Ordering::SeqCst);
    held_then_released(api, &words, s.s, (2, WAIT_VALUE_GEQ, ">="), 2, None)?;
    // Past the value counts too.
    words.word(0).store(100, Ordering::SeqCst);
    held_then_released(api, &words, s.s, (200, WAIT_VALUE_GEQ, ">="), 201, None)?;
    api.seen(api.dev.stream_synchronize(s.s))?;
    s.destroy().map_err(Stop::from)
}

fn eq_exact(api: &DeviceApi) -> Verdict {
    let words = Words::new(api, 2)?;
    let s = OwnedStream::new(api).map_err(Stop::from)?;
    // A value past the one waited for does not satisfy EQ.
    words.word(0).store(5, Ordering::SeqCst);
    held_then_released(api, &words, s.s, (4, WAIT_VALUE_EQ, "=="), 4, None)?;
    api.seen(api.dev.stream_synchronize(s.s))?;
    s.destroy().map_err(Stop::from)
}

fn bad_arguments(api: &DeviceApi) -> Verdict {
    let words = Words::new(api, 1)?;
    let s = OwnedStream::new(api).map_err(Stop::from)?;
    let invalid = [Status::INVALID_ARGUMENT];
    refused(
        "stream_wait_value32 with flags 2",
        wait(api, s.s, words.ptr(0), 0, 2),
        &invalid,
    )?;
    refused(
        "stream_wait_value32 of a null address",
        wait(api, s.s, std::ptr::null(), 0, WAIT_VALUE_GEQ),
        &invalid,
    )?;
    refused(
        "stream_write_value32 to a null address",
        write(api, s.s, std::ptr::null_mut(), 1),
        &invalid,
    )?;
    api.seen(api.dev.stream_synchronize(s.s))?;
    s.destroy().map_err(Stop::from)
}
