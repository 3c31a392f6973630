//! Memory: round trips of every kind through `mem_copy`, device-to-device and offset copies,
//! and `mem_set`.

use ferrocx::abi::{MemKind, Status};
use ferrocx::adaptor::AdaptorError;

use super::check_if;
use crate::boundary::{ensure, fail, optional, skip, DeviceApi, Stop, Verdict};
use crate::buffer::DevBuf;
use crate::reference::Rng;
use crate::report::Outcome;
use crate::runner::Runner;

/// 1 MiB and 3 bytes: the large size of the memory checks.
pub(crate) const BIG: usize = (1 << 20) + 3;

/// `n` reproducible bytes.
pub(crate) fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed, n as u64);
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(n);
    out
}

/// Where two byte strings first differ, for a reason.
pub(crate) fn differ(what: &str, got: &[u8], want: &[u8]) -> Result<(), Stop> {
    if got == want {
        return Ok(());
    }
    if got.len() != want.len() {
        return Err(fail(format!(
            "{what}: {} bytes came back, {} expected",
            got.len(),
            want.len()
        )));
    }
    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    let wrong = got.iter().zip(want).filter(|(a, b)| a != b).count();
    Err(fail(format!(
        "{what}: byte {i} of {} is {:#04x}, expected {:#04x} ({wrong} wrong)",
        got.len(),
        got[i],
        want[i]
    )))
}

pub(super) fn run(r: &mut Runner<'_>, api: &DeviceApi, need: &Option<Outcome>) {
    check_if(r, need, "mem round trip (DEVICE)", || {
        round_trip(api, MemKind::DEVICE)
    });
    check_if(r, need, "mem round trip (HOST)", || {
        round_trip(api, MemKind::HOST)
    });
    check_if(r, need, "mem round trip (PINNED)", || {
        round_trip(api, MemKind::PINNED)
    });
    check_if(r, need, "mem_set", || mem_set(api));
}

fn round_trip(api: &DeviceApi, kind: MemKind) -> Verdict {
    for n in [1, 7, 4099, BIG] {
        let data = pattern(n, 0xA11C ^ kind.0 as u64);
        let a = alloc(api, n, kind)?;
        a.upload(&data)?;
        differ(&format!("{n} bytes in and out"), &a.download(n)?, &data)?;
        // Device to device, whole and at odd offsets.
        let b = alloc(api, n, kind)?;
        b.fill(0)?;
        // SAFETY: `a` and `b` are distinct allocations of `n` bytes.
        api.seen(unsafe { api.dev.mem_copy(b.ptr(), a.ptr(), n) })?;
        differ(
            &format!("{n} bytes copied within the device"),
            &b.download(n)?,
            &data,
        )?;
        if n > 8 {
            let len = n - 5;
            // SAFETY: `len + 3 <= n` bytes of distinct allocations of `n`.
            api.seen(unsafe { api.dev.mem_copy(b.at(2), a.at(3), len) })?;
            let mut want = data.clone();
            want.copy_within(3..3 + len, 2);
            differ(
                &format!("{len} bytes copied from offset 3 to 2"),
                &b.download(n)?,
                &want,
            )?;
        }
    }
    Ok(())
}

/// DEVICE memory is required; HOST and PINNED may be declined at run time.
fn alloc(api: &DeviceApi, n: usize, kind: MemKind) -> Result<DevBuf<'_>, Stop> {
    let r = DevBuf::new(api, n, kind);
    if kind == MemKind::DEVICE {
        return r.map_err(Stop::from);
    }
    match r {
        Err(AdaptorError::Failed {
            status: Status::OUT_OF_MEMORY,
            ..
        }) => Err(skip("the device has no memory of this kind to spare")),
        r => optional(r),
    }
}

fn mem_set(api: &DeviceApi) -> Verdict {
    for (n, off, len) in [(1, 0, 1), (4099, 3, 1000), (BIG, 1, BIG - 2)] {
        let data = pattern(n, 0x5E7);
        let b = DevBuf::device(api, n)?;
        b.upload(&data)?;
        // SAFETY: `off + len <= n`, the size of `b`.
        api.seen(unsafe { api.dev.mem_set(b.at(off), 0xA5, len) })?;
        let mut want = data.clone();
        want[off..off + len].fill(0xA5);
        differ(
            &format!("mem_set of {len} bytes at offset {off} of {n}"),
            &b.download(n)?,
            &want,
        )?;
        // Zero bytes: nothing changes, and it is not an error.
        // SAFETY: zero bytes of the live `b`.
        api.seen(unsafe { api.dev.mem_set(b.ptr(), 0, 0) })?;
        ensure(b.download(n)? == want, || {
            "a mem_set of 0 bytes changed memory".to_string()
        })?;
    }
    Ok(())
}
