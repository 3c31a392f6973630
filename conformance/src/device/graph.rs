//! The graph group (`ferrocx_device_graph_v1`): work captured from a stream runs at each launch
//! of the graph, never at capture.

use ferrocx::abi::{AbiTable, DeviceGraphV1};

use super::check_if;
use super::memory::differ;
use crate::boundary::{fail, DeviceApi, Stop, Verdict};
use crate::buffer::{DevBuf, OwnedStream};
use crate::report::Outcome;
use crate::runner::Runner;

/// Bytes captured: a megabyte and an odd tail.
const BYTES: usize = (1 << 20) + 3;

pub(super) fn run(r: &mut Runner<'_>, api: &DeviceApi, memory: &Option<Outcome>) {
    let absent = api
        .dev
        .graph()
        .is_none()
        .then(|| Outcome::absent(DeviceGraphV1::SYMBOL));
    check_if(
        r,
        &absent.or_else(|| memory.clone()),
        "graph: a captured memset and copy run at each launch, not at capture",
        || graph(api),
    );
}

fn graph(api: &DeviceApi) -> Verdict {
    let dev = &api.dev;
    let graphs = dev
        .graph()
        .ok_or_else(|| Stop(Outcome::absent(DeviceGraphV1::SYMBOL)))?;
    let a = DevBuf::device(api, BYTES)?;
    let b = DevBuf::device(api, BYTES)?;
    a.fill(0)?;
    b.fill(0)?;
    let stream = OwnedStream::new(api)?;
    let s = stream.s;
    let g = api.seen(graphs.capture(s, || {
        // SAFETY: `a` and `b` hold `BYTES` and outlive the graph's launches, each synchronized
        // below.
        unsafe { dev.mem_set_async(a.ptr(), 0x5A, BYTES, s) }?;
        // SAFETY: as above.
        unsafe { dev.mem_copy_async(b.ptr(), a.ptr(), BYTES, s) }
    }))?;
    api.seen(dev.stream_synchronize(s))?;
    if b.download(BYTES)?.iter().any(|&x| x != 0) {
        return Err(fail("captured work ran at capture, not at launch"));
    }
    let want = vec![0x5Au8; BYTES];
    api.seen(g.launch(s))?;
    api.seen(dev.stream_synchronize(s))?;
    differ(
        "after the first launch, the copy",
        &b.download(BYTES)?,
        &want,
    )?;
    // A second launch runs both operations again. The new contents are read back first, so
    // that this check tests the graph, not whether `mem_copy` is complete when it returns.
    a.fill(1)?;
    b.fill(2)?;
    differ("a's refill", &a.download(BYTES)?, &vec![1u8; BYTES])?;
    differ("b's refill", &b.download(BYTES)?, &vec![2u8; BYTES])?;
    api.seen(g.launch(s))?;
    api.seen(dev.stream_synchronize(s))?;
    differ(
        "after the second launch, the memset",
        &a.download(BYTES)?,
        &want,
    )?;
    differ(
        "after the second launch, the copy",
        &b.download(BYTES)?,
        &want,
    )?;
    drop(g);
    stream.destroy().map_err(Stop::from)
}
