//! Edge cases of the device contract that the SDK's documentation and the C header state:
//!
//! - a call before `init` either works or returns `NOT_INITIALIZED` (never crashes, never
//!   another status), with a message;
//! - the null stream is the default stream: work enqueued on it runs in order, and
//!   `stream_synchronize(NULL)` waits for it;
//! - `event_elapsed_ms` of an event created with timing disabled is `INVALID_ARGUMENT` or
//!   `INVALID_HANDLE` (CUDA's answer); with a record not yet completed, `NOT_READY`;
//! - `mem_free` with a kind other than the allocation's is refused (`INVALID_ARGUMENT` or
//!   `INVALID_HANDLE`) and leaves the allocation live, to be freed with its own kind.

use ferrocx::abi::{MemKind, Status, Stream};

use super::memory::pattern;
use super::probe::{OpenOnDrop, Probe};
use crate::boundary::{ensure, fail, raw_call, raw_status, refused, DeviceApi, Verdict};
use crate::buffer::{host_ptr, host_ptr_mut, DevBuf, OwnedEvent, OwnedStream};

const BAD_HANDLE: &[Status] = &[Status::INVALID_HANDLE, Status::INVALID_ARGUMENT];

/// Before `init` (the worker process has called nothing else yet): `device_count` either
/// answers or returns `NOT_INITIALIZED` with a message.
pub(super) fn before_init(api: &DeviceApi) -> Verdict {
    let mut n = -1;
    match raw_status!(api, api.root(), device_count(&mut n)) {
        Err(e) => Err(e.into()),
        Ok(Status::SUCCESS) => ensure(n >= 0, || {
            format!("device_count before init succeeded with {n} devices")
        }),
        Ok(Status::NOT_INITIALIZED) => match api.failure("device_count", Status::NOT_INITIALIZED) {
            ferrocx::adaptor::AdaptorError::Failed { message, .. } => {
                ensure(!message.trim().is_empty(), || {
                    "device_count before init returned NOT_INITIALIZED without a message".into()
                })
            }
            e => Err(e.into()),
        },
        Ok(other) => Err(fail(format!(
            "device_count before init returned {other}: a call before init must work or \
             return NOT_INITIALIZED"
        ))),
    }
}

/// Copies on the null stream run in order, and synchronizing the null stream waits for them.
pub(super) fn null_stream(api: &DeviceApi) -> Verdict {
    const N: usize = 4099;
    let data = pattern(N, 0x0D5F);
    let a = DevBuf::device(api, N)?;
    let mut out = vec![0u8; N];
    // SAFETY: `data`, `a` and `out` hold `N` bytes and live until the null stream is
    // synchronized below; the copies are ordered by the stream.
    unsafe {
        api.seen(
            api.dev
                .mem_copy_async(a.ptr(), host_ptr(&data), N, Stream::NULL),
        )?;
        api.seen(
            api.dev
                .mem_copy_async(host_ptr_mut(&mut out), a.ptr(), N, Stream::NULL),
        )?;
    }
    api.seen(api.dev.stream_synchronize(Stream::NULL))?;
    ensure(out == data, || {
        "two copies on the null stream (the default stream) did not run in order, or \
         stream_synchronize(NULL) returned before they completed"
            .into()
    })
}

/// `event_elapsed_ms` with an event created with timing disabled, and with a record that has
/// not completed (held by a gated host function when `host_funcs`).
pub(super) fn elapsed_edges(api: &DeviceApi, host_funcs: bool) -> Verdict {
    let s = OwnedStream::new(api)?;
    let timed = OwnedEvent::new(api, 0)?;
    let untimed = OwnedEvent::new(api, 1)?;
    api.seen(api.dev.event_record(timed.e, s.s))?;
    api.seen(api.dev.event_record(untimed.e, s.s))?;
    api.seen(api.dev.stream_synchronize(s.s))?;
    // Timed events at all (a runtime may not offer them: UNSUPPORTED skips).
    crate::boundary::optional(api.seen(api.dev.event_elapsed_ms(timed.e, timed.e)))?;
    refused(
        "event_elapsed_ms with an event created with timing disabled",
        api.seen(api.dev.event_elapsed_ms(timed.e, untimed.e).map(|_| ())),
        BAD_HANDLE,
    )?;
    if !host_funcs {
        return Ok(());
    }
    let end = OwnedEvent::new(api, 0)?;
    let gate = Probe::gate();
    let _open = OpenOnDrop(gate);
    gate.launch(api, s.s)?;
    api.seen(api.dev.event_record(end.e, s.s))?;
    let mut ms = 0f32;
    let r = raw_call!(api, api.root(), event_elapsed_ms(timed.e, end.e, &mut ms));
    gate.open();
    api.seen(api.dev.stream_synchronize(s.s))?;
    refused(
        "event_elapsed_ms with a record not yet completed",
        r,
        &[Status::NOT_READY],
    )
}

/// `mem_free` with the wrong kind is refused and the allocation stays usable.
pub(super) fn wrong_kind(api: &DeviceApi) -> Verdict {
    let p = api.seen(api.dev.mem_alloc(64, MemKind::DEVICE))?;
    // SAFETY: `p` is a live DEVICE allocation; freeing it as PINNED is the bad argument the
    // ABI requires the adaptor to refuse (it checks the kind) without freeing it.
    let r = api.seen(unsafe { api.dev.mem_free(p, MemKind::PINNED) });
    let refusal = refused("mem_free of DEVICE memory as PINNED", r, BAD_HANDLE);
    // Still live: it is freed with its own kind (a failure here means the wrong free freed it).
    // SAFETY: `p` is live (the wrong free was refused, or the check fails either way) and
    // unused.
    let freed = api.seen(unsafe { api.dev.mem_free(p, MemKind::DEVICE) });
    refusal?;
    freed.map_err(|e| {
        fail(format!(
            "after a refused mem_free with the wrong kind, mem_free with the right kind \
             failed ({e}): the allocation must stay live"
        ))
    })
}
