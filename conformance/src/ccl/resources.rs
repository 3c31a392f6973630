//! Buffers the CCL knows: its own memory, buffer registration, and the window group.

use ferrocx::abi::{AbiTable, CclWindowV1, DevicePtr, RegHandle, WindowHandle};

use super::{Ctx, Planned};
use crate::boundary::{optional, raw_call, Stop, Verdict};
use crate::buffer::DevBuf;
use crate::report::Outcome;

pub(super) fn plan<'a>(ctx: &'a Ctx<'a>) -> Vec<Planned<'a>> {
    vec![
        Planned::new("ccl", "mem_alloc and mem_free of the CCL", move || {
            ccl_memory(ctx)
        })
        .without_comm(),
        Planned::new("ccl", "mem_register and mem_deregister", move || {
            register(ctx)
        }),
        Planned::new("ccl", "window_register and window_deregister", move || {
            window(ctx)
        }),
    ]
}

fn ccl_memory(ctx: &Ctx<'_>) -> Verdict {
    let api = ctx.ccl;
    let mut p = DevicePtr::NULL;
    optional(raw_call!(api, api.root(), mem_alloc(1 << 16, &mut p)))?;
    // The memory is the device's: a round trip through the device's mem_copy works.
    let data = crate::device::memory::pattern(1 << 16, 0xCC1);
    let mut back = vec![0u8; 1 << 16];
    let dev = ctx.dev;
    let moved = dev
        .seen(
            // SAFETY: `p` is a fresh CCL allocation of 64 KiB, the device's memory; `data` holds as
            // many bytes.
            unsafe {
                dev.dev
                    .mem_copy(p, crate::buffer::host_ptr(&data), data.len())
            },
        )
        .and_then(|()| {
            dev.seen(
                // SAFETY: as above, into `back`, which holds 64 KiB.
                unsafe {
                    dev.dev
                        .mem_copy(crate::buffer::host_ptr_mut(&mut back), p, data.len())
                },
            )
        });
    let freed = raw_call!(api, api.root(), mem_free(p));
    moved?;
    freed?;
    crate::device::memory::differ("CCL memory through the device's mem_copy", &back, &data)
}

fn register(ctx: &Ctx<'_>) -> Verdict {
    ctx.usable()?;
    let api = ctx.ccl;
    let b = DevBuf::device(ctx.dev, 1 << 16)?;
    let mut h = RegHandle::NULL;
    optional(raw_call!(
        api,
        api.root(),
        mem_register(ctx.comm, b.ptr(), 1 << 16, &mut h)
    ))?;
    raw_call!(api, api.root(), mem_deregister(ctx.comm, h))?;
    Ok(())
}

/// The window check's buffer: the CCL's own memory when it has an allocator (NCCL registers
/// windows only over `ncclMemAlloc` or VMM memory), else device memory.
enum WindowBuf<'a> {
    Ccl(&'a Ctx<'a>, DevicePtr),
    Device(DevBuf<'a>),
}

impl WindowBuf<'_> {
    fn ptr(&self) -> DevicePtr {
        match self {
            WindowBuf::Ccl(_, p) => *p,
            WindowBuf::Device(b) => b.ptr(),
        }
    }
}

impl Drop for WindowBuf<'_> {
    fn drop(&mut self) {
        if let WindowBuf::Ccl(ctx, p) = self {
            let api = ctx.ccl;
            let _ = raw_call!(api, api.root(), mem_free(*p));
        }
    }
}

fn window(ctx: &Ctx<'_>) -> Verdict {
    const BYTES: usize = 1 << 16;
    let api = ctx.ccl;
    let Some(t) = api.ccl.tables().window.as_ref() else {
        return Err(Stop(Outcome::absent(CclWindowV1::SYMBOL)));
    };
    ctx.usable()?;
    let mut p = DevicePtr::NULL;
    let b = match api.root().mem_alloc {
        Some(_) if raw_call!(api, api.root(), mem_alloc(BYTES, &mut p)).is_ok() => {
            WindowBuf::Ccl(ctx, p)
        }
        _ => WindowBuf::Device(DevBuf::device(ctx.dev, BYTES)?),
    };
    let mut w = WindowHandle::NULL;
    // Collective: every rank registers, then every rank deregisters.
    optional(raw_call!(
        api,
        t.get(),
        window_register(ctx.comm, b.ptr(), BYTES, 0, &mut w)
    ))?;
    raw_call!(api, t.get(), window_deregister(ctx.comm, w))?;
    Ok(())
}
