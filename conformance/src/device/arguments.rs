//! Error codes for bad arguments: each call must fail with the status the ABI names, leave a
//! message in `get_last_error`, and not crash. The freed-pointer check runs last: an adaptor
//! that cannot detect a double free may crash on it, and the driver then reports the crash.

use ferrocx::abi::{DevicePtr, Event, MemKind, Status};

use super::check_if;
use crate::boundary::{ensure, raw_call, refused, DeviceApi, Stop, Verdict};
use crate::buffer::{host_ptr_mut, DevBuf, OwnedStream};
use crate::report::Outcome;
use crate::runner::Runner;

const BAD_HANDLE: &[Status] = &[Status::INVALID_HANDLE, Status::INVALID_ARGUMENT];
const BAD_ARGUMENT: &[Status] = &[Status::INVALID_ARGUMENT];

pub(super) fn run(r: &mut Runner<'_>, api: &DeviceApi, memory: &Option<Outcome>) {
    check_if(r, memory, "bad argument: zero-size allocation", || {
        zero_size(api)
    });
    check_if(r, memory, "bad argument: unknown memory kind", || {
        unknown_kind(api)
    });
    check_if(
        r,
        memory,
        "bad argument: null address in mem_copy and mem_set",
        || null_address(api),
    );
    check_if(r, &None, "bad argument: device out of range", || {
        device_out_of_range(api)
    });
    check_if(r, &None, "bad argument: null event handle", || {
        null_event(api)
    });
    check_if(
        r,
        memory,
        "bad argument: freed pointer (mem_free twice)",
        || freed(api),
    );
}

/// Frees what a call that should have failed allocated anyway.
///
/// # Safety
///
/// `p` is null or an allocation of `kind` the device returned, unused and not freed.
unsafe fn free_if(api: &DeviceApi, p: DevicePtr, kind: MemKind) {
    if p != DevicePtr::NULL {
        // Observed; the check already failed on the success.
        // SAFETY: the caller's contract.
        let _ = api.seen(unsafe { api.dev.mem_free(p, kind) });
    }
}

fn zero_size(api: &DeviceApi) -> Verdict {
    let mut p = DevicePtr::NULL;
    let r = raw_call!(api, api.root(), mem_alloc(0, MemKind::DEVICE, &mut p));
    // SAFETY: null, or what the refused call allocated anyway, unused.
    unsafe { free_if(api, p, MemKind::DEVICE) };
    refused("mem_alloc of 0 bytes", r, BAD_ARGUMENT)
}

fn unknown_kind(api: &DeviceApi) -> Verdict {
    let mut p = DevicePtr::NULL;
    let kind = MemKind(99);
    let r = raw_call!(api, api.root(), mem_alloc(64, kind, &mut p));
    // SAFETY: null, or what the refused call allocated anyway, unused.
    unsafe { free_if(api, p, kind) };
    refused("mem_alloc of MemKind(99)", r, BAD_ARGUMENT)
}

fn null_address(api: &DeviceApi) -> Verdict {
    let b = DevBuf::device(api, 64)?;
    let mut host = vec![0u8; 64];
    refused(
        "mem_copy to address 0",
        // SAFETY: address 0 is the bad argument the ABI requires the adaptor to refuse; `b` holds
        // 64 bytes.
        api.seen(unsafe { api.dev.mem_copy(DevicePtr::NULL, b.ptr(), 64) }),
        BAD_ARGUMENT,
    )?;
    refused(
        "mem_copy from address 0",
        api.seen(
            // SAFETY: as above; `host` holds 64 bytes.
            unsafe {
                api.dev
                    .mem_copy(host_ptr_mut(&mut host), DevicePtr::NULL, 64)
            },
        ),
        BAD_ARGUMENT,
    )?;
    if api.root().mem_set.is_some() {
        refused(
            "mem_set at address 0",
            // SAFETY: address 0 is the bad argument the ABI requires the adaptor to refuse.
            api.seen(unsafe { api.dev.mem_set(DevicePtr::NULL, 0, 64) }),
            BAD_ARGUMENT,
        )?;
    }
    // The buffer is still usable: the failures touched nothing.
    b.upload(&host)?;
    Ok(())
}

fn device_out_of_range(api: &DeviceApi) -> Verdict {
    let count = api.seen(api.dev.device_count())?;
    // `count` and -1 are never devices; the kit picks no other number (an adaptor may treat
    // arbitrary numbers specially, and a test plugin panics on one on purpose).
    for d in [count, -1] {
        refused(
            &format!("set_device({d}) with {count} device(s)"),
            api.seen(api.dev.set_device(d)),
            BAD_HANDLE,
        )?;
        refused(
            &format!("get_properties({d}) with {count} device(s)"),
            api.seen(api.dev.properties(d).map(|_| ())),
            BAD_HANDLE,
        )?;
    }
    // The thread's device is unchanged by the failures.
    let d = api.seen(api.dev.get_device())?;
    ensure(d == 0, || {
        format!("after failed set_device calls the current device is {d}, not 0")
    })
}

fn null_event(api: &DeviceApi) -> Verdict {
    let root = api.root();
    let calls = [
        root.event_record.is_some(),
        root.stream_wait_event.is_some(),
        root.event_synchronize.is_some(),
        root.event_query.is_some(),
        root.event_destroy.is_some(),
    ];
    if !calls.iter().any(|&c| c) {
        return Err(Stop(Outcome::absent(
            "`event_record`, `stream_wait_event`, `event_synchronize`, `event_query`, \
             `event_destroy`",
        )));
    }
    // A stream of its own if one can be made, else the default stream.
    let s = OwnedStream::new(api).ok();
    let stream = s.as_ref().map_or(ferrocx::abi::Stream::NULL, |s| s.s);
    let null = Event::NULL;
    if calls[0] {
        refused(
            "event_record of the null event",
            raw_call!(api, root, event_record(null, stream)),
            BAD_HANDLE,
        )?;
    }
    if calls[1] {
        refused(
            "stream_wait_event on the null event",
            raw_call!(api, root, stream_wait_event(stream, null)),
            BAD_HANDLE,
        )?;
    }
    if calls[2] {
        refused(
            "event_synchronize of the null event",
            raw_call!(api, root, event_synchronize(null)),
            BAD_HANDLE,
        )?;
    }
    if calls[3] {
        refused(
            "event_query of the null event",
            raw_call!(api, root, event_query(null)),
            BAD_HANDLE,
        )?;
    }
    if calls[4] {
        refused(
            "event_destroy of the null event",
            raw_call!(api, root, event_destroy(null)),
            BAD_HANDLE,
        )?;
    }
    Ok(())
}

fn freed(api: &DeviceApi) -> Verdict {
    let p = api.seen(api.dev.mem_alloc(64, MemKind::DEVICE))?;
    // SAFETY: `p` is the allocation just made, unused.
    api.seen(unsafe { api.dev.mem_free(p, MemKind::DEVICE) })?;
    refused(
        "mem_free of a pointer already freed",
        // SAFETY: freeing `p` again is the bad argument the ABI requires the adaptor to refuse (a
        // handle-checked free).
        api.seen(unsafe { api.dev.mem_free(p, MemKind::DEVICE) }),
        BAD_HANDLE,
    )
}
