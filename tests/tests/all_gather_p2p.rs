//! The point-to-point all-gather (`Call::all_gather_p2p`) on the host backend, across real
//! processes (the test executable re-run once per rank, see `window_ranks`): 2, 3 and 4 ranks,
//! every route it takes there (the host CCL's grouped send/recv, reads of the peers' staging
//! windows, and copies out of them after stream-ordered waits on signal words, forced: the
//! router leaves a host-addressable device to the CCL), 1 to 3 streams, several element types
//! and odd counts (and none), in place and not, on random data
//! checked byte for byte against every rank's input computed here. Each slice is read in
//! stream order right after its event (a host function enqueued on the slice's stream by the
//! per-slice hook), and on the host right after its event completes: the data is in place
//! when the event fires, and the events of one stream fire in issue order (of every stream,
//! where the CCL runs the exchanges one after another). On 4 ranks with one exchange a group,
//! a slice arrives before a late rank has even called the gather. Several tournament rounds in one group of send/recv
//! (3, 4, 5 ranks). A job across clusters takes the cross-cluster plan's all-gather. Bad
//! arguments get errors naming them. Calls enqueued back to back before any is waited for,
//! with one rank late to each, and the routes interleaved call by call. On the window-copies
//! route, a rank that stops calling is a timeout error on its peer, not a hang. Into an output
//! window (`Call::output_window`: symmetric memory registered on every rank, the output at an
//! offset in it), the window-copies route pushes: every case again, pieces of several sizes
//! (hooks counted, the 4095-piece cap), back to back with streams and pieces changing call by
//! call, an output outside its window refused, and a missing peer a timeout. A short gather
//! the router takes whole, with no hook, waits for a late rank through every way of asking for
//! its (lazily recorded) event.

mod window_ranks;

use std::sync::{Arc, Mutex};

use ferrocx::abi::{DataType, DevicePtr, Event, MemKind, Status};
use ferrocx::adaptor::{Device, DeviceBuffer};
use ferrocx::comm::p2p::{launch_host, schedule};
use ferrocx::comm::{CommError, Communicator, Slice};
use ferrocx::route::Route;
use ferrocx::window::{SymmetricBuffer, Window, WindowFlags};
use window_ranks::{communicator, rank_of, Job, RouteLog};

/// Byte `i` of rank `rank`'s input of case `case`.
fn byte(case: u64, rank: usize, i: usize) -> u8 {
    let mut x = case
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((rank as u64) << 40 | i as u64);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x as u8
}

fn input(case: u64, rank: usize, bytes: usize) -> Vec<u8> {
    (0..bytes).map(|i| byte(case, rank, i)).collect()
}

/// `true` when the event's most recent record has completed.
fn fired(device: &Device, event: Event) -> bool {
    let query = device
        .tables()
        .root
        .get()
        .event_query
        .expect("the host device has event_query");
    // SAFETY: an event of this device, live until the handle that holds it drops.
    let status = unsafe { query(event) };
    status == Status::SUCCESS
}

/// Where a case's output lies: a device buffer, or `offset` bytes into a symmetric allocation
/// registered as a window (the output window the window-copies route pushes into), each
/// peer's slice cut into pieces of `pieces` elements (0: whole slices).
#[derive(Clone, Copy, Default)]
struct Into {
    window: bool,
    offset: usize,
    pieces: usize,
}

/// A case's output buffer (see [`Into`]).
enum Recv {
    Plain(DeviceBuffer),
    Window(SymmetricBuffer, Box<Window>, usize),
}

impl Recv {
    fn new(comm: &Communicator, bytes: usize, into: Into) -> Recv {
        if !into.window {
            let b = DeviceBuffer::new(comm.device(), bytes.max(1), MemKind::DEVICE).expect("alloc");
            return Recv::Plain(b);
        }
        let size = into.offset + bytes.max(1) + 64;
        let buf = comm.alloc_symmetric(size).expect("symmetric allocation");
        // SAFETY: a live symmetric allocation of `size` bytes, deregistered before it is freed.
        let w = unsafe {
            comm.register_window(
                buf.ptr(),
                size,
                WindowFlags::NO_MULTICAST | WindowFlags::PEERS,
            )
        }
        .expect("output window");
        Recv::Window(buf, Box::new(w), into.offset)
    }

    fn ptr(&self) -> DevicePtr {
        match self {
            Recv::Plain(b) => b.ptr(),
            Recv::Window(b, _, off) => DevicePtr(b.ptr().0 + *off as u64),
        }
    }

    fn read(&self, dev: &Device, at: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: the output holds `at + len` bytes (the caller's case), and `v` `len`; the
        // transfers writing it have ended.
        unsafe {
            dev.mem_copy(
                DevicePtr(v.as_mut_ptr() as u64),
                DevicePtr(self.ptr().0 + at as u64),
                len,
            )
        }
        .expect("download");
        v
    }

    fn write(&self, dev: &Device, at: usize, data: &[u8]) {
        // SAFETY: as `read`, the other way; nothing else uses the output yet.
        unsafe {
            dev.mem_copy(
                DevicePtr(self.ptr().0 + at as u64),
                DevicePtr(data.as_ptr() as u64),
                data.len(),
            )
        }
        .expect("upload");
    }

    /// Deregisters the window (collective: after every rank's case has ended).
    fn release(self, comm: &Communicator) {
        if let Recv::Window(buf, w, _) = self {
            comm.deregister_window(*w).expect("deregister");
            drop(buf);
        }
    }
}

/// One all-gather of `count` elements of `dtype` on `route` over `streams` streams, every
/// slice checked twice (in stream order after its event, and on the host once it fired).
fn gather_case(
    comm: &Communicator,
    case: u64,
    count: usize,
    dtype: DataType,
    streams: usize,
    route: Route,
    in_place: bool,
) {
    let into = Into::default();
    gather_into(comm, case, count, dtype, (streams, route, in_place), into);
}

/// [`gather_case`], its output as `into` says.
fn gather_into(
    comm: &Communicator,
    case: u64,
    count: usize,
    dtype: DataType,
    (streams, route, in_place): (usize, Route, bool),
    into: Into,
) {
    let (me, world) = (comm.rank(), comm.world());
    let dev = comm.device();
    let es = dtype.size().expect("a known type");
    let bytes = count * es;
    let all: Vec<Vec<u8>> = (0..world).map(|r| input(case, r, bytes)).collect();
    let want: Arc<Vec<u8>> = Arc::new(all.concat());
    let recv = Recv::new(comm, world * bytes, into);
    // Garbage where the slices go, so a slice not written is seen.
    recv.write(dev, 0, &vec![0xA5; world * bytes]);
    let send = match bytes {
        0 => DeviceBuffer::new(dev, 1, MemKind::DEVICE),
        _ => DeviceBuffer::from_host(dev, &all[me], MemKind::DEVICE),
    }
    .expect("upload");
    let send_ptr = if in_place {
        recv.write(dev, me * bytes, &all[me]);
        DevicePtr(recv.ptr().0 + (me * bytes) as u64)
    } else {
        send.ptr()
    };
    let wrong: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut call = comm.call().via(route).pieces(into.pieces);
    if let Recv::Window(_, w, _) = &recv {
        call = call.output_window(w);
    }
    let what = format!(
        "{count} x {dtype:?} on {route} over {streams} stream(s), in place {in_place}, \
         window {} at {}, pieces {}",
        into.window, into.offset, into.pieces
    );
    let base = recv.ptr().0;
    let hook = |slice: &Slice| {
        let (want, wrong, seen) = (want.clone(), wrong.clone(), seen.clone());
        let (rank, ptr, len) = (slice.rank, slice.ptr.0, slice.count * es);
        let at = (ptr - base) as usize;
        let what = what.clone();
        launch_host(dev, slice.stream, move || {
            // SAFETY: on the host device a device address is this process's; the slice (or
            // piece) holds `len` bytes and the case keeps it alive past the synchronize.
            let got = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            let inside = at >= rank * bytes && at + len <= (rank + 1) * bytes;
            if !inside || got != &want[at..at + len] {
                wrong.lock().unwrap().push(format!(
                    "{what}: slice {rank} ({len} bytes at {at}) not in place after its event"
                ));
            }
            seen.lock().unwrap().push(rank);
        })
    };
    // SAFETY: `send` and `recv` hold what the call reads and writes, and live until the
    // handle's synchronize below.
    let handle =
        unsafe { call.all_gather_p2p_each(send_ptr, recv.ptr(), count, dtype, streams, hook) }
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(handle.route(), route, "{what}");
    // This rank's slice first, then its peers in the tournament's order.
    let mut order = vec![me];
    order.extend(schedule(world, me));
    assert_eq!(handle.order(), &order[..], "{what}");
    for (i, &r) in handle.order().iter().enumerate() {
        handle
            .synchronize_slice(r)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            recv.read(dev, r * bytes, bytes) == all[r],
            "{what}: slice {r} wrong once its event fired"
        );
        let slice = handle.slice(r);
        for &earlier in &handle.order()[..i] {
            let e = handle.slice(earlier);
            // One stream runs its slices in order; the host CCL runs the exchanges one after
            // another, so there every earlier slice has arrived.
            // (This rank's own slice is a device copy, outside the CCL's order.)
            if e.stream == slice.stream || (route == Route::Ccl && earlier != me) {
                assert!(
                    fired(dev, e.event),
                    "{what}: slice {earlier} after slice {r}"
                );
            }
        }
    }
    handle
        .synchronize()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    // The hooks' host functions ran after the events, so wait for the streams too.
    for r in 0..world {
        dev.stream_synchronize(handle.slice(r).stream)
            .expect("stream");
    }
    drop(handle);
    let wrong = wrong.lock().unwrap();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_unstable();
    let pieces = seen.len();
    seen.dedup();
    assert_eq!(seen, (0..world).collect::<Vec<_>>(), "{what}");
    if into.window && into.pieces > 0 && count > 0 {
        // Every peer's slice in pieces of `into.pieces` elements (a multiple of it where that
        // would make more than 4095), this rank's own whole.
        let per = into.pieces * count.div_ceil(into.pieces).div_ceil(4095);
        let each = count.div_ceil(per);
        assert_eq!(pieces, 1 + (world - 1) * each, "{what}: hooks called");
    }
    assert_eq!(recv.read(dev, 0, world * bytes)[..], want[..], "{what}");
    recv.release(comm);
}

/// Several all-gathers on `route` enqueued back to back before any is waited for (the
/// staging's two parities each reused), each from its own buffers, one rank (the last)
/// enqueueing each a little later than the others; then every call's output checked. Odd
/// counts, and one call of another size in the middle (a larger staging for the copies).
fn back_to_back(comm: &Communicator, case: u64, route: Route) {
    let (me, world) = (comm.rank(), comm.world());
    let dev = comm.device();
    // Then a run of small calls: many rounds of both parities in flight at once.
    let counts: Vec<usize> = [333usize, 333, 333, 1025, 1025, 7, 333]
        .into_iter()
        .chain((0..24).map(|i| 1 + (i * 37) % 101))
        .collect();
    let all: Vec<Vec<Vec<u8>>> = counts
        .iter()
        .enumerate()
        .map(|(k, &c)| {
            (0..world)
                .map(|r| input(case + k as u64, r, c * 4))
                .collect()
        })
        .collect();
    let sends: Vec<DeviceBuffer> = all
        .iter()
        .map(|a| DeviceBuffer::from_host(dev, &a[me], MemKind::DEVICE).expect("upload"))
        .collect();
    let recvs: Vec<DeviceBuffer> = counts
        .iter()
        .map(|&c| DeviceBuffer::new(dev, world * c * 4, MemKind::DEVICE).expect("alloc"))
        .collect();
    let mut handles = Vec::new();
    for (k, &count) in counts.iter().enumerate() {
        if me == world - 1 && k < 7 {
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        // SAFETY: the buffers live until after every handle's synchronize below.
        let h = unsafe {
            comm.call().via(route).all_gather_p2p(
                sends[k].ptr(),
                recvs[k].ptr(),
                count,
                DataType::F32,
                1 + k % 3,
            )
        }
        .unwrap_or_else(|e| panic!("{route}, call {k}: {e}"));
        handles.push(h);
    }
    for (k, h) in handles.iter().enumerate() {
        h.synchronize()
            .unwrap_or_else(|e| panic!("{route}, call {k}: {e}"));
    }
    drop(handles);
    for (k, r) in recvs.iter().enumerate() {
        assert!(
            r.to_vec().expect("download") == all[k].concat(),
            "{route}: call {k} of {} back to back is wrong",
            counts.len()
        );
    }
}

/// Into output windows: every case pushed (the window-copies route forced), then calls
/// enqueued back to back before any is waited for into one window (each output at its own
/// offset), with streams and pieces changing call by call and the last rank late to the first
/// calls; the router's route for an output window; an output outside its window refused.
fn into_windows(comm: &Communicator, case: u64) {
    const F32: DataType = DataType::F32;
    const BF16: DataType = DataType::BF16;
    const F64: DataType = DataType::F64;
    const I8: DataType = DataType::I8;
    const U8: DataType = DataType::U8;
    let w = |offset, pieces| Into {
        window: true,
        offset,
        pieces,
    };
    let cases = [
        (1, F32, 1, false, w(0, 0)),
        (7, F32, 2, false, w(256, 0)),
        (1000, F32, 3, true, w(64, 0)),
        (4099, F32, 2, false, w(0, 1000)),
        (1025, BF16, 1, false, w(128, 100)),
        (4097, I8, 2, true, w(0, 4097)),
        (333, F64, 3, false, w(8, 1)),
        (0, F32, 2, false, w(0, 0)),
        (10_000, U8, 2, false, w(0, 1)),
        (300_001, U8, 2, false, w(4096, 65_536)),
    ];
    for (k, (count, dtype, streams, in_place, into)) in cases.into_iter().enumerate() {
        let how = (streams, Route::WindowCopies, in_place);
        gather_into(comm, case + k as u64, count, dtype, how, into);
    }
    let (me, world) = (comm.rank(), comm.world());
    let dev = comm.device();
    let counts: Vec<usize> = (0..20).map(|i| 1 + (i * 389) % 1201).collect();
    let offsets: Vec<usize> = counts
        .iter()
        .scan(0, |at, &c| {
            let here = *at;
            *at += world * c * 4;
            Some(here)
        })
        .collect();
    let total = offsets.last().copied().unwrap_or(0) + world * counts[counts.len() - 1] * 4;
    let recv = Recv::new(comm, total, w(0, 0));
    let Recv::Window(_, window, _) = &recv else {
        unreachable!("a window")
    };
    let all: Vec<Vec<Vec<u8>>> = counts
        .iter()
        .enumerate()
        .map(|(k, &c)| {
            (0..world)
                .map(|r| input(case + 100 + k as u64, r, c * 4))
                .collect()
        })
        .collect();
    let sends: Vec<DeviceBuffer> = all
        .iter()
        .map(|a| DeviceBuffer::from_host(dev, &a[me], MemKind::DEVICE).expect("upload"))
        .collect();
    let mut handles = Vec::new();
    for (k, &count) in counts.iter().enumerate() {
        if me == world - 1 && k < 5 {
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        let call = comm
            .call()
            .via(Route::WindowCopies)
            .output_window(window)
            .pieces([0, 1, 50, 333][k % 4]);
        // SAFETY: the buffers live until after every handle's synchronize below; call k's
        // output is its own part of the window.
        let h = unsafe {
            call.all_gather_p2p(
                sends[k].ptr(),
                DevicePtr(recv.ptr().0 + offsets[k] as u64),
                count,
                DataType::F32,
                1 + k % 3,
            )
        }
        .unwrap_or_else(|e| panic!("into a window, call {k}: {e}"));
        handles.push(h);
    }
    for (k, h) in handles.iter().enumerate() {
        h.synchronize()
            .unwrap_or_else(|e| panic!("into a window, call {k}: {e}"));
    }
    drop(handles);
    for (k, &count) in counts.iter().enumerate() {
        assert!(
            recv.read(dev, offsets[k], world * count * 4) == all[k].concat(),
            "into a window: call {k} of {} back to back is wrong",
            counts.len()
        );
    }
    // The router leaves a host-addressable device to the CCL, window or not.
    // SAFETY: as above (call 0's buffers).
    let h = unsafe {
        comm.call().output_window(window).all_gather_p2p(
            sends[0].ptr(),
            recv.ptr(),
            counts[0],
            DataType::F32,
            2,
        )
    }
    .expect("the router's route");
    assert_eq!(h.route(), Route::Ccl);
    h.synchronize().expect("synchronize");
    drop(h);
    assert!(recv.read(dev, 0, world * counts[0] * 4) == all[0].concat());
    // An output past the window's end: refused on every rank, nothing enqueued.
    // SAFETY: refused before anything is enqueued.
    let e = unsafe {
        comm.call()
            .via(Route::WindowCopies)
            .output_window(window)
            .all_gather_p2p(
                sends[0].ptr(),
                DevicePtr(window.local().0 + window.size() as u64 - 4),
                counts[0],
                DataType::F32,
                2,
            )
    }
    .err()
    .expect("an output outside its window refused");
    assert!(
        e.to_string().contains("does not lie in the output window"),
        "{e}"
    );
    recv.release(comm);
}

fn rank_main() {
    let log = RouteLog::default();
    let comm = communicator();
    // The host CCL has send and recv: the router takes them (the copies run here, forced,
    // but the router leaves a host-addressable device to the CCL).
    assert_eq!(comm.router().all_gather_p2p(true, false), Route::Ccl);
    log.capture(|| {
        let mut case = 1;
        for route in [Route::Ccl, Route::WindowReads, Route::WindowCopies] {
            for (dtype, counts) in [
                (DataType::F32, &[1usize, 7, 1000, 4099][..]),
                (DataType::BF16, &[3, 1025][..]),
                (DataType::I8, &[1, 4097][..]),
                (DataType::F64, &[5, 333][..]),
                (DataType::U64, &[2, 77][..]),
            ] {
                for &count in counts {
                    for streams in [1, 2, 3] {
                        case += 1;
                        gather_case(&comm, case, count, dtype, streams, route, false);
                    }
                }
            }
            // In place, and a larger message that regrows the staging window.
            gather_case(&comm, 900 + case, 4099, DataType::F32, 2, route, true);
            gather_case(&comm, 901 + case, 300_001, DataType::U8, 2, route, false);
            gather_case(&comm, 902 + case, 17, DataType::F32, 2, route, false);
            gather_case(&comm, 903 + case, 0, DataType::F32, 2, route, false);
            back_to_back(&comm, 950 + case, route);
        }
        into_windows(&comm, 2000);
        // The routes one after another, call by call (each keeps its own staging and rounds).
        for (i, route) in [Route::WindowCopies, Route::Ccl, Route::WindowReads]
            .into_iter()
            .cycle()
            .take(7)
            .enumerate()
        {
            gather_case(
                &comm,
                990 + i as u64,
                1001,
                DataType::F32,
                2,
                route,
                i % 2 == 0,
            );
        }
        // The communicator's own stream, the router's route.
        let dev = comm.device();
        let count = 123;
        let all: Vec<Vec<u8>> = (0..comm.world()).map(|r| input(7, r, count * 4)).collect();
        let send =
            DeviceBuffer::from_host(dev, &all[comm.rank()], MemKind::DEVICE).expect("upload");
        let recv =
            DeviceBuffer::new(dev, comm.world() * count * 4, MemKind::DEVICE).expect("alloc");
        // Below 4 MiB of output: the CCL's all_gather in one call, every slice on the
        // communicator's stream with one event, the hook called for each in order.
        let mut hooked = Vec::new();
        // SAFETY: both buffers live past the synchronize.
        let h = unsafe {
            comm.call()
                .all_gather_p2p_each(send.ptr(), recv.ptr(), count, DataType::F32, 2, |s| {
                    hooked.push((s.rank, s.stream, s.event));
                    Ok(())
                })
        }
        .expect("all_gather_p2p");
        assert_eq!(h.route(), Route::Ccl);
        let mut order = vec![comm.rank()];
        order.extend(schedule(comm.world(), comm.rank()));
        assert_eq!(hooked.iter().map(|h| h.0).collect::<Vec<_>>(), order);
        assert!(hooked
            .iter()
            .all(|&(_, s, e)| s == comm.stream() && e == hooked[0].2));
        h.wait_all(comm.stream()).expect("wait_all");
        drop(h);
        comm.synchronize().expect("synchronize");
        assert_eq!(recv.to_vec().expect("download"), all.concat());
        // Past 4 MiB of output: the CCL's send/recv, slice by slice.
        let big = (4 << 20) / 4 / comm.world() + 3;
        let all: Vec<Vec<u8>> = (0..comm.world()).map(|r| input(8, r, big * 4)).collect();
        let send =
            DeviceBuffer::from_host(dev, &all[comm.rank()], MemKind::DEVICE).expect("upload");
        let recv = DeviceBuffer::new(dev, comm.world() * big * 4, MemKind::DEVICE).expect("alloc");
        // SAFETY: both buffers live past the synchronize.
        let h = unsafe { comm.all_gather_p2p(send.ptr(), recv.ptr(), big, DataType::F32, 2) }
            .expect("all_gather_p2p");
        assert_eq!(h.route(), Route::Ccl);
        h.synchronize().expect("synchronize");
        drop(h);
        assert!(recv.to_vec().expect("download") == all.concat());
    });
    // Bad input: a clear error, nothing enqueued.
    let buf = DeviceBuffer::new(comm.device(), 64, MemKind::DEVICE).expect("alloc");
    // SAFETY: refused before anything is enqueued.
    let e = unsafe { comm.all_gather_p2p(buf.ptr(), buf.ptr(), 1, DataType::F32, 0) }
        .err()
        .expect("0 streams refused");
    assert!(
        matches!(&e, CommError::PointToPoint(m) if m.contains("streams must be at least 1")),
        "{e}"
    );
    // SAFETY: as above.
    let e = unsafe {
        comm.call()
            .via(Route::Store)
            .all_gather_p2p(buf.ptr(), buf.ptr(), 1, DataType::F32, 1)
    }
    .err()
    .expect("the store route refused");
    assert!(
        e.to_string().contains("cannot take the route `store`"),
        "{e}"
    );
    // SAFETY: as above.
    let e = unsafe {
        comm.call()
            .via(Route::WindowReads)
            .all_gather(buf.ptr(), buf.ptr(), 1, DataType::F32)
    }
    .expect_err("all_gather on the window reads refused");
    assert!(
        e.to_string()
            .contains("all_gather cannot take the route `window-reads`: only all_gather_p2p"),
        "{e}"
    );
    comm.barrier().expect("barrier");
    let text = log.text();
    let whole = format!(
        "collective{{op=\"all_gather_p2p (whole)\" bytes={} dtype=\"f32\" route=ccl streams=2}}",
        123 * 4
    );
    assert!(text.contains(&whole), "no span {whole} in:\n{text}");
    let big = ((4 << 20) / 4 / comm.world() + 3) * 4;
    let sliced = format!(
        "collective{{op=\"all_gather_p2p\" bytes={big} dtype=\"f32\" route=ccl streams=2}}"
    );
    assert!(text.contains(&sliced), "no span {sliced} in:\n{text}");
    for route in ["ccl", "window-reads", "window-copies"] {
        assert!(
            text.contains(&format!("collective{{op=\"all_gather_p2p\" bytes=16396 dtype=\"f32\" route={route} streams=2}}")),
            "no span of all_gather_p2p on {route} in:\n{text}"
        );
    }
    println!("RANK OK");
}

#[test]
fn all_gather_p2p_2_ranks() {
    const T: &str = "all_gather_p2p_2_ranks";
    match rank_of(T) {
        Some(_) => rank_main(),
        None => {
            Job::new(T, 2).run();
        }
    }
}

#[test]
fn all_gather_p2p_3_ranks() {
    const T: &str = "all_gather_p2p_3_ranks";
    match rank_of(T) {
        Some(_) => rank_main(),
        None => {
            Job::new(T, 3).run();
        }
    }
}

#[test]
fn all_gather_p2p_4_ranks() {
    const T: &str = "all_gather_p2p_4_ranks";
    match rank_of(T) {
        Some(_) => rank_main(),
        None => {
            Job::new(T, 4).run();
        }
    }
}

/// Rounds of the tournament in groups of the CCL's send/recv other than the default (every
/// round in one group): one round a group (`FERROCX_P2P_ROUNDS_PER_GROUP=1`) on 3 and 4 ranks,
/// 2 rounds a group on 4 and 5 ranks (an odd world's bye rounds fall inside groups); the same
/// checks as above.
#[test]
fn all_gather_p2p_rounds_grouped() {
    const T: &str = "all_gather_p2p_rounds_grouped";
    match rank_of(T) {
        Some(_) => rank_main(),
        None => {
            for (world, per) in [(3, "1"), (4, "1"), (4, "2"), (5, "2")] {
                Job::new(T, world)
                    .env(ferrocx::comm::p2p::ROUNDS_PER_GROUP_ENV, per)
                    .run();
            }
        }
    }
}

/// A consumer starts on a slice before the others arrive (one exchange a group): on 4 ranks,
/// one rank (neither 0 nor 0's first peer) calls the all-gather only once rank 0 has seen its
/// first peer's slice arrive, which it would never see (each rank waiting on the other until
/// the store's deadline) if a slice waited for the whole gather.
fn early_main() {
    let comm = communicator();
    let (me, world) = (comm.rank(), comm.world());
    assert_eq!(world, 4);
    let first = schedule(world, 0)[0];
    let late = (1..world).find(|&r| r != first).expect("a third rank");
    let dev = comm.device();
    let count = 1001;
    for (k, route) in [Route::Ccl, Route::WindowReads, Route::WindowCopies]
        .into_iter()
        .enumerate()
    {
        let all: Vec<Vec<u8>> = (0..world)
            .map(|r| input(50 + k as u64, r, count * 4))
            .collect();
        let send = DeviceBuffer::from_host(dev, &all[me], MemKind::DEVICE).expect("upload");
        let recv = DeviceBuffer::new(dev, world * count * 4, MemKind::DEVICE).expect("alloc");
        let call = comm.call().via(route);
        // One call with every rank in step first (the window-reads route registers its staging
        // window at its first call: a collective step).
        // SAFETY: both buffers live past the synchronize.
        unsafe { call.all_gather_p2p(send.ptr(), recv.ptr(), count, DataType::F32, 2) }
            .expect("all_gather_p2p")
            .synchronize()
            .expect("synchronize");
        let key = format!("early/{route}");
        if me == late {
            comm.store().get(&key).unwrap_or_else(|e| {
                panic!("{route}: rank 0 did not see slice {first} before rank {late} joined: {e}")
            });
        }
        // SAFETY: as above.
        let h = unsafe { call.all_gather_p2p(send.ptr(), recv.ptr(), count, DataType::F32, 2) }
            .expect("all_gather_p2p");
        if me == 0 {
            h.synchronize_slice(first).expect("first slice");
            let mut got = vec![0u8; count * 4];
            recv.copy_to_host_at(first * count * 4, &mut got)
                .expect("download");
            assert!(got == all[first], "{route}: slice {first}");
            comm.store().set(&key, b"seen").expect("store set");
        }
        h.synchronize().expect("synchronize");
        drop(h);
        assert_eq!(recv.to_vec().expect("download"), all.concat(), "{route}");
    }
    comm.barrier().expect("barrier");
    println!("RANK OK");
}

#[test]
fn a_slice_arrives_before_a_late_rank_joins_4_ranks() {
    const T: &str = "a_slice_arrives_before_a_late_rank_joins_4_ranks";
    match rank_of(T) {
        Some(_) => early_main(),
        None => {
            // One exchange a group: by default every peer's slice arrives with the others.
            Job::new(T, 4)
                .env(ferrocx::comm::p2p::ROUNDS_PER_GROUP_ENV, "1")
                .run();
        }
    }
}

/// A short gather the router takes whole (the CCL's all_gather in one call) with no hook
/// leaves its event unrecorded until somebody asks: every way of asking must still wait for
/// the gather. One rank (the last) joins each call late, so a wait that did not wait would let
/// the reader below see the slice before it arrived: through `wait_slice` on another stream,
/// through the public `Slice::event` waited on directly, through `synchronize_slice`, and,
/// asking nothing, through `join` of the caller's own stream.
fn short_main() {
    let comm = communicator();
    let (me, world) = (comm.rank(), comm.world());
    let late = world - 1;
    let dev = comm.device();
    let other = dev.stream_create().expect("stream");
    let count = 1001;
    for (k, way) in ["wait_slice", "event", "synchronize_slice", "join"]
        .into_iter()
        .enumerate()
    {
        let all: Vec<Vec<u8>> = (0..world)
            .map(|r| input(80 + k as u64, r, count * 4))
            .collect();
        let send = DeviceBuffer::from_host(dev, &all[me], MemKind::DEVICE).expect("upload");
        let recv = DeviceBuffer::from_host(dev, &vec![0xA5; world * count * 4], MemKind::DEVICE)
            .expect("upload");
        comm.barrier().expect("barrier");
        if me == late {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        // SAFETY: both buffers live past the waits below.
        let h = unsafe { comm.all_gather_p2p(send.ptr(), recv.ptr(), count, DataType::F32, 2) }
            .expect("all_gather_p2p");
        assert_eq!(h.route(), Route::Ccl, "{way}");
        let at = recv.ptr().0 + (late * count * 4) as u64;
        let got: Arc<Mutex<Vec<u8>>> = Arc::default();
        let read = |stream| {
            let got = got.clone();
            launch_host(dev, stream, move || {
                // SAFETY: on the host device a device address is this process's; `recv` lives
                // past the stream's synchronize below.
                let s = unsafe { std::slice::from_raw_parts(at as *const u8, count * 4) };
                *got.lock().unwrap() = s.to_vec();
            })
            .expect("launch_host");
        };
        match way {
            "wait_slice" => {
                h.wait_slice(late, other).expect("wait_slice");
                read(other);
                dev.stream_synchronize(other).expect("stream");
            }
            "event" => {
                dev.stream_wait_event(other, h.slice(late).event)
                    .expect("wait");
                read(other);
                dev.stream_synchronize(other).expect("stream");
            }
            "synchronize_slice" => {
                h.synchronize_slice(late).expect("synchronize_slice");
                *got.lock().unwrap() = recv.to_vec().expect("download")
                    [late * count * 4..(late + 1) * count * 4]
                    .to_vec();
            }
            _ => {
                h.join(comm.stream()).expect("join");
                read(comm.stream());
                dev.stream_synchronize(comm.stream()).expect("stream");
            }
        }
        assert!(
            *got.lock().unwrap() == all[late],
            "{way}: rank {me} read slice {late} before it arrived"
        );
        h.synchronize().expect("synchronize");
        drop(h);
        assert_eq!(recv.to_vec().expect("download"), all.concat(), "{way}");
    }
    comm.barrier().expect("barrier");
    println!("RANK OK");
}

#[test]
fn a_short_gather_records_its_event_when_asked_3_ranks() {
    const T: &str = "a_short_gather_records_its_event_when_asked_3_ranks";
    match rank_of(T) {
        Some(_) => short_main(),
        None => {
            Job::new(T, 3).run();
        }
    }
}

/// Across clusters the gather is the cross-cluster plan's (every slice's event after it).
fn clusters_main() {
    let comm = communicator();
    let (me, world) = (comm.rank(), comm.world());
    let dev = comm.device();
    for (case, count) in [(70u64, 1usize), (71, 999)] {
        let all: Vec<Vec<u8>> = (0..world).map(|r| input(case, r, count * 8)).collect();
        let send = DeviceBuffer::from_host(dev, &all[me], MemKind::DEVICE).expect("upload");
        let recv = DeviceBuffer::new(dev, world * count * 8, MemKind::DEVICE).expect("alloc");
        // SAFETY: both buffers live past the synchronize.
        let h = unsafe { comm.all_gather_p2p(send.ptr(), recv.ptr(), count, DataType::F64, 2) }
            .expect("all_gather_p2p");
        assert_eq!(h.route(), Route::Clusters);
        h.synchronize().expect("synchronize");
        drop(h);
        assert_eq!(recv.to_vec().expect("download"), all.concat(), "{count}");
    }
    comm.barrier().expect("barrier");
    println!("RANK OK");
}

#[test]
fn across_two_clusters_the_plan_gathers_3_ranks() {
    const T: &str = "across_two_clusters_the_plan_gathers_3_ranks";
    match rank_of(T) {
        Some(_) => clusters_main(),
        None => {
            Job::new(T, 3)
                .clusters(&[("a", "0,2"), ("b", "1")])
                .bridge_key("chunk_bytes", "4096")
                .run();
        }
    }
}

/// On the window-copies route a rank that stops calling leaves its peers' streams waiting for
/// its signal: the peer's synchronize ends at the communicator's timeout with an error naming
/// the slice, its streams are released (the communicator's stream, ordered after the slices,
/// drains), and later calls fail with the same error instead of waiting.
/// `into`: the output in a window (the pushes), else a plain buffer (the copies out of the
/// staging).
fn missing_main(into: bool) {
    let comm = communicator();
    let me = comm.rank();
    let dev = comm.device();
    let count = 77;
    let send =
        DeviceBuffer::from_host(dev, &input(80, me, count * 4), MemKind::DEVICE).expect("upload");
    let recv = Recv::new(
        &comm,
        2 * count * 4,
        Into {
            window: into,
            ..Into::default()
        },
    );
    let mut call = comm.call().via(Route::WindowCopies);
    if let Recv::Window(_, w, _) = &recv {
        call = call.output_window(w);
    }
    // SAFETY: both buffers live past the synchronizes.
    unsafe { call.all_gather_p2p(send.ptr(), recv.ptr(), count, DataType::F32, 2) }
        .expect("all_gather_p2p")
        .synchronize()
        .expect("synchronize");
    if me == 0 {
        let started = std::time::Instant::now();
        // SAFETY: as above.
        let h = unsafe { call.all_gather_p2p(send.ptr(), recv.ptr(), count, DataType::F32, 2) }
            .expect("all_gather_p2p");
        h.wait_all(comm.stream()).expect("wait_all");
        let e = h.synchronize().expect_err("rank 1 never publishes");
        let waited = started.elapsed();
        assert!(e.to_string().contains("did not get slice 1 within"), "{e}");
        assert!(waited.as_millis() >= 900, "gave up after {waited:?}");
        drop(h);
        // The communicator's stream waited for the slices: released, it drains.
        dev.stream_synchronize(comm.stream()).expect("stream");
        // SAFETY: refused before anything is enqueued.
        let again = unsafe { call.all_gather_p2p(send.ptr(), recv.ptr(), count, DataType::F32, 2) }
            .err()
            .expect("a failed communicator refuses the next call");
        assert!(again.to_string().contains("did not get slice 1"), "{again}");
        comm.store().set("missing/done", b"1").expect("store set");
    } else {
        // Rank 0 takes the timeout (a second) to give up, and the store's waits take as long.
        let mut tries = 0;
        while let Err(e) = comm.store().get("missing/done") {
            tries += 1;
            assert!(tries < 20, "no verdict from rank 0: {e}");
        }
    }
    if let Recv::Window(buf, w, _) = recv {
        // No collective deregistration with a failed peer: this rank's mappings only.
        w.release_local();
        drop(buf);
    }
    println!("RANK OK");
}

#[test]
fn window_copies_missing_peer_is_an_error_not_a_hang() {
    const T: &str = "window_copies_missing_peer_is_an_error_not_a_hang";
    match rank_of(T) {
        Some(_) => missing_main(false),
        None => {
            Job::new(T, 2).timeout_ms(1000).run();
        }
    }
}

#[test]
fn window_copies_into_a_window_missing_peer_is_an_error_not_a_hang() {
    const T: &str = "window_copies_into_a_window_missing_peer_is_an_error_not_a_hang";
    match rank_of(T) {
        Some(_) => missing_main(true),
        None => {
            Job::new(T, 2).timeout_ms(1000).run();
        }
    }
}

/// A device without memory it exports to peers (the `offhost` test plugin: memops, but no IPC
/// or VMM, and memory the host cannot address) refuses the window-copies route with an error
/// naming the adaptor, before anything is enqueued; the router does not choose it there.
fn offhost_main() {
    let comm = Communicator::from_env().unwrap_or_else(|e| panic!("communicator: {e}"));
    assert_eq!(comm.device().name(), "offhost");
    let buf = DeviceBuffer::new(comm.device(), 64, MemKind::DEVICE).expect("alloc");
    // SAFETY: refused before anything is enqueued.
    let e = unsafe {
        comm.call().via(Route::WindowCopies).all_gather_p2p(
            buf.ptr(),
            buf.ptr(),
            4,
            DataType::F32,
            2,
        )
    }
    .err()
    .expect("the window-copies route refused on offhost");
    assert!(
        e.to_string().contains(
            "the window-copies route needs the memops group (ferrocx_device_memops_v1) and \
             memory exported to peers (IPC or VMM), which the device adaptor `offhost` lacks"
        ),
        "{e}"
    );
    println!("RANK OK");
}

#[test]
fn window_copies_are_refused_where_the_device_cannot_run_them() {
    const T: &str = "window_copies_are_refused_where_the_device_cannot_run_them";
    match rank_of(T) {
        Some(_) => offhost_main(),
        None => {
            let path = ferrocx_tests::offhost_plugin();
            Job::new(T, 1)
                .adaptors("offhost", "offhost")
                .env("FERROCX_PLUGIN_PATH", path.to_str().expect("a UTF-8 path"))
                .run();
        }
    }
}
