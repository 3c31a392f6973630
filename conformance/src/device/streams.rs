//! Streams, host functions and events, with the semantics of DESIGN.md: work on a stream runs
//! in order; a `stream_wait_event` waits for the most recent record of the event made before
//! the wait was enqueued (a later re-record does not redirect it); an event never recorded
//! counts as complete; `event_query` and `event_synchronize` follow the most recent record.
//!
//! Work is held pending with gated host functions (see [`super::probe`]), never by blocking a
//! stream the kit then calls synchronously, and every stream is non-blocking.

use std::time::{Duration, Instant};

use ferrocx::abi::{DevicePtr, Event, Status, Stream};

use super::memory::{differ, pattern, BIG};
use super::probe::{wait_until, OpenOnDrop, Probe, GATE_LIMIT};
use super::{check_if, needs};
use crate::boundary::{ensure, fail, optional, raw_call, raw_status, DeviceApi, Res, Verdict};
use crate::buffer::{host_ptr, host_ptr_mut, DevBuf, OwnedEvent, OwnedStream};
use crate::report::Outcome;
use crate::runner::Runner;

/// How long a check watches a stream that must stay blocked.
const SETTLE: Duration = Duration::from_millis(60);

pub(super) fn run(r: &mut Runner<'_>, api: &DeviceApi, memory: &Option<Outcome>) {
    let streams = check_if(
        r,
        &None,
        "streams: create, query, synchronize, destroy",
        || streams(api),
    );
    let s_need = needs("streams", &streams);
    let data = memory.clone().or_else(|| s_need.clone());
    check_if(r, &data, "mem_copy_async in stream order", || {
        copy_async_order(api)
    });
    check_if(r, &data, "mem_set_async in stream order", || set_async(api));
    let hf = check_if(
        r,
        &s_need,
        "host functions run once, in stream order",
        || host_functions(api),
    );
    let hf_need = s_need.clone().or_else(|| needs("host functions", &hf));
    check_if(r, &hf_need, "stream_query sees pending work", || {
        query_pending(api)
    });
    let ev = check_if(
        r,
        &s_need,
        "events: record, synchronize, query, destroy",
        || events(api),
    );
    let ev_need = s_need.clone().or_else(|| needs("events", &ev));
    let ev_data = ev_need.clone().or_else(|| memory.clone());
    let ev_hf = ev_need.clone().or_else(|| hf_need.clone());
    check_if(
        r,
        &ev_data,
        "stream_wait_event orders copies across streams",
        || wait_orders_copies(api),
    );
    check_if(
        r,
        &ev_hf,
        "stream_wait_event holds a stream until the record completes",
        || wait_holds(api),
    );
    check_if(
        r,
        &ev_need,
        "stream_wait_event on an event never recorded does not wait",
        || never_recorded(api, hf_need.is_none()),
    );
    check_if(
        r,
        &ev_hf,
        "a wait follows the most recent record made before it",
        || most_recent(api),
    );
    check_if(
        r,
        &ev_hf,
        "re-recording an event does not redirect an earlier wait",
        || rerecord(api),
    );
    check_if(
        r,
        &ev_hf,
        "event_query and event_synchronize follow the most recent record",
        || follows_recent(api),
    );
    check_if(r, &ev_need, "event_elapsed_ms", || {
        elapsed(api, hf_need.is_none())
    });
}

/// `Some(idle)` from `stream_query`, `None` when it is absent.
fn stream_query(api: &DeviceApi, s: Stream) -> Res<Option<bool>> {
    match raw_status!(api, api.root(), stream_query(s)) {
        Ok(Status::SUCCESS) => Ok(Some(true)),
        Ok(Status::NOT_READY) => Ok(Some(false)),
        Ok(other) => Err(api.failure("stream_query", other)),
        Err(_) => Ok(None),
    }
}

/// `Some(complete)` from `event_query`, `None` when it is absent.
fn event_query(api: &DeviceApi, e: Event) -> Res<Option<bool>> {
    match raw_status!(api, api.root(), event_query(e)) {
        Ok(Status::SUCCESS) => Ok(Some(true)),
        Ok(Status::NOT_READY) => Ok(Some(false)),
        Ok(other) => Err(api.failure("event_query", other)),
        Err(_) => Ok(None),
    }
}

/// `mem_copy_async`, observed.
///
/// # Safety
///
/// As [`ferrocx::adaptor::Device::mem_copy_async`].
unsafe fn copy_on(api: &DeviceApi, dst: DevicePtr, src: DevicePtr, n: usize, s: Stream) -> Res<()> {
    // SAFETY: the caller's contract.
    api.seen(unsafe { api.dev.mem_copy_async(dst, src, n, s) })
}

fn sync(api: &DeviceApi, s: Stream) -> Res<()> {
    api.seen(api.dev.stream_synchronize(s))
}

fn streams(api: &DeviceApi) -> Verdict {
    let blocking = OwnedStream::with_flags(api, 0)?;
    let non_blocking = OwnedStream::with_flags(api, 1)?;
    for (what, s) in [
        ("a new stream", blocking.s),
        ("a new non-blocking stream", non_blocking.s),
        ("the default stream", Stream::NULL),
    ] {
        if let Some(idle) = stream_query(api, s)? {
            ensure(idle, || {
                format!("stream_query of {what} with no work returned NOT_READY")
            })?;
        }
        sync(api, s)?;
    }
    blocking.destroy()?;
    non_blocking.destroy()?;
    Ok(())
}

fn copy_async_order(api: &DeviceApi) -> Verdict {
    let s = OwnedStream::new(api)?;
    let data = pattern(BIG, 0xC0B1);
    let zeros = vec![0u8; BIG];
    let a = DevBuf::device(api, BIG)?;
    let b = DevBuf::device(api, BIG)?;
    b.fill(0xEE)?;
    let mut out = vec![0xEEu8; BIG];
    // Each copy reads what the one before it wrote: any reordering shows in `out` or `a`.
    // SAFETY: `a`, `b`, `data`, `zeros` and `out` hold `BIG` bytes each and live past the
    // synchronize below (an early return fails the check; its stream is destroyed last).
    unsafe {
        copy_on(api, a.ptr(), host_ptr(&data), BIG, s.s)?;
        copy_on(api, b.ptr(), a.ptr(), BIG, s.s)?;
        copy_on(api, a.ptr(), host_ptr(&zeros), BIG, s.s)?;
        copy_on(api, host_ptr_mut(&mut out), b.ptr(), BIG, s.s)?;
    }
    sync(api, s.s)?;
    differ("host → a → b → host", &out, &data)?;
    differ("a, overwritten last", &a.download(BIG)?, &zeros)
}

fn set_async(api: &DeviceApi) -> Verdict {
    let s = OwnedStream::new(api)?;
    let n = 4099;
    let data = pattern(n, 0x5E7A);
    let a = DevBuf::device(api, n)?;
    a.upload(&data)?;
    // Overlapping memsets: the later one must win where they overlap.
    raw_call!(api, api.root(), mem_set_async(a.at(1), 0x11, n - 2, s.s))?;
    raw_call!(api, api.root(), mem_set_async(a.at(5), 0x22, 100, s.s))?;
    raw_call!(api, api.root(), mem_set_async(a.at(0), 0x33, 0, s.s))?;
    sync(api, s.s)?;
    let mut want = data.clone();
    want[1..n - 1].fill(0x11);
    want[5..105].fill(0x22);
    differ("two overlapping mem_set_async", &a.download(n)?, &want)
}

/// Launches a gate on `s`, failing if `launch_host_func` ran it in the caller's thread.
fn gate_on(api: &DeviceApi, s: Stream) -> Result<&'static Probe, crate::boundary::Stop> {
    let gate = Probe::gate();
    let t = Instant::now();
    let launched = gate.launch(api, s);
    gate.open_if_failed(&launched);
    launched?;
    if gate.timed_out() || t.elapsed() >= GATE_LIMIT / 2 {
        return Err(fail(
            "launch_host_func ran the function in the caller's thread before returning; it must \
             return once the function is enqueued",
        ));
    }
    Ok(gate)
}

impl Probe {
    fn open_if_failed<T>(&self, r: &Res<T>) {
        if r.is_err() {
            self.open();
        }
    }
}

fn host_functions(api: &DeviceApi) -> Verdict {
    let s = OwnedStream::new(api)?;
    let gate = gate_on(api, s.s)?;
    let _open = OpenOnDrop(gate);
    let marks: Vec<&'static Probe> = (0..3).map(|_| Probe::mark()).collect();
    for m in &marks {
        m.launch(api, s.s)?;
    }
    std::thread::sleep(SETTLE);
    ensure(marks.iter().all(|m| m.runs() == 0), || {
        "host functions ran while a host function ahead of them on the stream was still running"
            .to_string()
    })?;
    gate.open();
    sync(api, s.s)?;
    let runs: Vec<u32> = marks.iter().map(|m| m.runs()).collect();
    ensure(runs.iter().all(|&n| n == 1) && gate.runs() == 1, || {
        format!(
            "each host function must run exactly once: ran {} and {runs:?} times",
            gate.runs()
        )
    })?;
    let order: Vec<u64> = std::iter::once(gate)
        .chain(marks.iter().copied())
        .map(|m| m.order())
        .collect();
    ensure(order.windows(2).all(|w| w[0] < w[1]), || {
        format!("host functions ran out of stream order (completion order {order:?})")
    })
}

fn query_pending(api: &DeviceApi) -> Verdict {
    let s = OwnedStream::new(api)?;
    let gate = gate_on(api, s.s)?;
    let _open = OpenOnDrop(gate);
    let Some(idle) = stream_query(api, s.s)? else {
        return Err(crate::boundary::Stop(Outcome::absent("`stream_query`")));
    };
    ensure(!idle, || {
        "stream_query returned SUCCESS while a host function held the stream".to_string()
    })?;
    gate.open();
    sync(api, s.s)?;
    ensure(stream_query(api, s.s)? != Some(false), || {
        "stream_query returned NOT_READY after stream_synchronize".to_string()
    })
}

fn events(api: &DeviceApi) -> Verdict {
    let s = OwnedStream::new(api)?;
    let e = OwnedEvent::new(api, 1)?;
    if let Some(done) = event_query(api, e.e)? {
        ensure(done, || {
            "event_query of an event never recorded returned NOT_READY (it counts as complete)"
                .to_string()
        })?;
    }
    api.seen(api.dev.event_synchronize(e.e))?;
    api.seen(api.dev.event_record(e.e, s.s))?;
    api.seen(api.dev.event_synchronize(e.e))?;
    if let Some(done) = event_query(api, e.e)? {
        ensure(done, || {
            "event_query returned NOT_READY after event_synchronize".to_string()
        })?;
    }
    api.seen(api.dev.event_record(e.e, Stream::NULL))?;
    api.seen(api.dev.event_synchronize(e.e))?;
    let timed = OwnedEvent::new(api, 0)?;
    timed.destroy()?;
    e.destroy()?;
    Ok(())
}

fn wait_orders_copies(api: &DeviceApi) -> Verdict {
    let a = OwnedStream::new(api)?;
    let b = OwnedStream::new(api)?;
    let e = OwnedEvent::new(api, 1)?;
    let data = pattern(BIG, 0xE7E7);
    let x = DevBuf::device(api, BIG)?;
    let y = DevBuf::device(api, BIG)?;
    let z = DevBuf::device(api, BIG)?;
    x.upload(&data)?;
    y.fill(0)?;
    z.fill(0)?;
    // SAFETY: `x`, `y` and `z` hold `BIG` bytes each and live past both streams' synchronize.
    unsafe { copy_on(api, y.ptr(), x.ptr(), BIG, a.s) }?;
    api.seen(api.dev.event_record(e.e, a.s))?;
    api.seen(api.dev.stream_wait_event(b.s, e.e))?;
    // SAFETY: as above.
    unsafe { copy_on(api, z.ptr(), y.ptr(), BIG, b.s) }?;
    sync(api, b.s)?;
    differ(
        "copied on stream B after a wait on stream A's copy",
        &z.download(BIG)?,
        &data,
    )?;
    sync(api, a.s)?;
    Ok(())
}

fn wait_holds(api: &DeviceApi) -> Verdict {
    let a = OwnedStream::new(api)?;
    let b = OwnedStream::new(api)?;
    let e = OwnedEvent::new(api, 1)?;
    let gate = gate_on(api, a.s)?;
    let _open = OpenOnDrop(gate);
    api.seen(api.dev.event_record(e.e, a.s))?;
    api.seen(api.dev.stream_wait_event(b.s, e.e))?;
    let mark = Probe::mark();
    mark.launch(api, b.s)?;
    std::thread::sleep(SETTLE);
    ensure(mark.runs() == 0, || {
        "work enqueued after stream_wait_event ran before the record it waits for completed"
            .to_string()
    })?;
    if let Some(idle) = stream_query(api, b.s)? {
        ensure(!idle, || {
            "stream_query of the waiting stream returned SUCCESS while its wait was pending"
                .to_string()
        })?;
    }
    gate.open();
    sync(api, b.s)?;
    ensure(mark.runs() == 1, || {
        format!(
            "the waiting stream's host function ran {} times after the record completed",
            mark.runs()
        )
    })?;
    sync(api, a.s)?;
    Ok(())
}

fn never_recorded(api: &DeviceApi, host_funcs: bool) -> Verdict {
    let b = OwnedStream::new(api)?;
    let e = OwnedEvent::new(api, 1)?;
    api.seen(api.dev.stream_wait_event(b.s, e.e))?;
    if !host_funcs {
        // Without host functions the stream is synchronised; a wait that blocks hangs here and
        // the driver's watchdog reports it.
        return sync(api, b.s).map_err(Into::into);
    }
    let mark = Probe::mark();
    mark.launch(api, b.s)?;
    ensure(wait_until(GATE_LIMIT, || mark.runs() == 1), || {
        "a wait on an event never recorded blocked its stream (it must not wait)".to_string()
    })?;
    sync(api, b.s)?;
    Ok(())
}

fn most_recent(api: &DeviceApi) -> Verdict {
    let a = OwnedStream::new(api)?;
    let b = OwnedStream::new(api)?;
    let c = OwnedStream::new(api)?;
    let e = OwnedEvent::new(api, 1)?;
    let first = gate_on(api, a.s)?;
    let _open1 = OpenOnDrop(first);
    api.seen(api.dev.event_record(e.e, a.s))?;
    let second = gate_on(api, c.s)?;
    let _open2 = OpenOnDrop(second);
    api.seen(api.dev.event_record(e.e, c.s))?;
    api.seen(api.dev.stream_wait_event(b.s, e.e))?;
    let mark = Probe::mark();
    mark.launch(api, b.s)?;
    first.open();
    sync(api, a.s)?;
    std::thread::sleep(SETTLE);
    ensure(mark.runs() == 0, || {
        "the wait was satisfied by an older record; it must wait for the most recent record \
         made before it (the second one, still pending)"
            .to_string()
    })?;
    second.open();
    ensure(wait_until(GATE_LIMIT, || mark.runs() == 1), || {
        "the waiting stream never ran after the most recent record completed".to_string()
    })?;
    sync(api, b.s)?;
    Ok(())
}

fn rerecord(api: &DeviceApi) -> Verdict {
    let a = OwnedStream::new(api)?;
    let b = OwnedStream::new(api)?;
    let c = OwnedStream::new(api)?;
    let e = OwnedEvent::new(api, 1)?;
    let gate = gate_on(api, a.s)?;
    let _open = OpenOnDrop(gate);
    api.seen(api.dev.event_record(e.e, a.s))?;
    api.seen(api.dev.stream_wait_event(b.s, e.e))?;
    let mark = Probe::mark();
    mark.launch(api, b.s)?;
    // Re-record on an idle stream: this record completes at once, but the wait enqueued
    // before it must still wait for the first.
    api.seen(api.dev.event_record(e.e, c.s))?;
    sync(api, c.s)?;
    std::thread::sleep(SETTLE);
    ensure(mark.runs() == 0, || {
        "re-recording the event redirected an earlier wait: the waiting stream ran before the \
         record it waited for completed"
            .to_string()
    })?;
    gate.open();
    ensure(wait_until(GATE_LIMIT, || mark.runs() == 1), || {
        "the waiting stream never ran after the record it waited for completed".to_string()
    })?;
    sync(api, b.s)?;
    Ok(())
}

fn follows_recent(api: &DeviceApi) -> Verdict {
    let a = OwnedStream::new(api)?;
    let c = OwnedStream::new(api)?;
    let e = OwnedEvent::new(api, 1)?;
    let gate = gate_on(api, a.s)?;
    let _open = OpenOnDrop(gate);
    api.seen(api.dev.event_record(e.e, a.s))?;
    if let Some(done) = event_query(api, e.e)? {
        ensure(!done, || {
            "event_query returned SUCCESS for a record still pending behind a host function"
                .to_string()
        })?;
    }
    api.seen(api.dev.event_record(e.e, c.s))?;
    if event_query(api, e.e)?.is_some() {
        ensure(
            wait_until(GATE_LIMIT / 2, || {
                event_query(api, e.e).ok().flatten() == Some(true)
            }),
            || {
                "event_query stayed NOT_READY: it follows an older pending record, not the most \
                 recent one (complete)"
                    .to_string()
            },
        )?;
    }
    api.seen(api.dev.event_synchronize(e.e))?;
    ensure(gate.runs() == 0, || {
        "event_synchronize waited for an older record instead of the most recent one".to_string()
    })?;
    gate.open();
    sync(api, a.s)?;
    Ok(())
}

fn elapsed(api: &DeviceApi, host_funcs: bool) -> Verdict {
    const SLEEP_MS: u64 = 30;
    let s = OwnedStream::new(api)?;
    let start = OwnedEvent::new(api, 0)?;
    let end = OwnedEvent::new(api, 0)?;
    api.seen(api.dev.event_record(start.e, s.s))?;
    if host_funcs {
        Probe::sleeper(Duration::from_millis(SLEEP_MS)).launch(api, s.s)?;
    }
    api.seen(api.dev.event_record(end.e, s.s))?;
    api.seen(api.dev.event_synchronize(end.e))?;
    let ms = optional(api.seen(api.dev.event_elapsed_ms(start.e, end.e)))?;
    ensure(ms.is_finite() && (0.0..60_000.0).contains(&ms), || {
        format!("event_elapsed_ms returned {ms} ms for two records in order")
    })?;
    if host_funcs {
        ensure(ms >= (SLEEP_MS as f32) * 0.66, || {
            format!(
                "event_elapsed_ms returned {ms} ms around a host function that slept {SLEEP_MS} ms"
            )
        })?;
    }
    Ok(())
}
