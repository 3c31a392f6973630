//! Every collective of `Communicator` on the host backend, across real processes (the test
//! executable re-run once per rank, see `window_ranks`): all_reduce, reduce, broadcast,
//! all_gather, reduce_scatter, gather, scatter, all_to_all, all_to_allv, grouped send/recv and
//! barrier, on the communicator's stream and on a stream of the caller's, on 2 and 3 ranks,
//! sizes from 1 element to odd thousands, each output against a reference computed here from
//! every rank's input (counter-based random data, so every rank can compute every rank's
//! input). The `collective` span of each call names the op, bytes, dtype and route.

mod window_ranks;

use ferrocx::abi::{DataType, DevicePtr, MemKind, ReduceOp, Stream};
use ferrocx::adaptor::DeviceBuffer;
use ferrocx::comm::{Call, Communicator};
use ferrocx::route::Route;
use window_ranks::{communicator, rank_of, Job, RouteLog};

/// Element counts per rank: one element, odd sizes, and one past a page of f32.
const COUNTS: [usize; 4] = [1, 7, 1000, 4099];

/// Rank `rank`'s value `i` of case `case`: a small integer, so every sum is exact in f32.
fn value(case: u64, rank: usize, i: usize) -> f32 {
    let mut x = case
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((rank as u64) << 32 | i as u64);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x % 201) as f32 - 100.0
}

fn input(case: u64, rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| value(case, rank, i)).collect()
}

/// Device memory of `n` f32, freed on drop.
struct Buf {
    inner: DeviceBuffer,
    ptr: DevicePtr,
    n: usize,
}

impl Buf {
    fn new(comm: &Communicator, n: usize) -> Buf {
        let inner =
            DeviceBuffer::new(comm.device(), n.max(1) * 4, MemKind::DEVICE).expect("mem_alloc");
        Buf {
            ptr: inner.ptr(),
            inner,
            n,
        }
    }

    fn with(comm: &Communicator, data: &[f32]) -> Buf {
        let mut b = Buf::new(comm, data.len());
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_ne_bytes()).collect();
        b.inner.copy_from_host(&bytes).expect("upload");
        b
    }

    fn read(&self) -> Vec<f32> {
        let mut out = vec![0u8; self.n * 4];
        self.inner.copy_to_host(&mut out).expect("download");
        out.chunks_exact(4)
            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

/// Every collective on `call`'s stream, `stream` (to synchronize), case numbers from `base`.
fn every_collective(comm: &Communicator, call: Call<'_>, stream: Stream, base: u64) {
    let (me, world) = (comm.rank(), comm.world());
    let sync = || {
        comm.device()
            .stream_synchronize(stream)
            .expect("synchronize")
    };
    for (k, &n) in COUNTS.iter().enumerate() {
        let case = base + 100 * k as u64;
        let all: Vec<Vec<f32>> = (0..world).map(|r| input(case, r, n)).collect();
        let send = Buf::with(comm, &all[me]);

        // all_reduce: sum and max, out of place and in place.
        for op in [ReduceOp::SUM, ReduceOp::MAX] {
            let recv = Buf::new(comm, n);
            // SAFETY: both buffers hold `n` f32 and live past the synchronize.
            unsafe { call.all_reduce(send.ptr, recv.ptr, n, DataType::F32, op) }
                .expect("all_reduce");
            sync();
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    let col = all.iter().map(|v| v[i]);
                    if op == ReduceOp::SUM {
                        col.sum()
                    } else {
                        col.fold(f32::MIN, f32::max)
                    }
                })
                .collect();
            assert_eq!(recv.read(), want, "all_reduce {op:?} of {n}");
        }
        let inplace = Buf::with(comm, &all[me]);
        // SAFETY: `inplace` holds `n` f32 and lives past the synchronize.
        unsafe { call.all_reduce(inplace.ptr, inplace.ptr, n, DataType::F32, ReduceOp::SUM) }
            .expect("in-place all_reduce");
        sync();
        let sums: Vec<f32> = (0..n).map(|i| all.iter().map(|v| v[i]).sum()).collect();
        assert_eq!(inplace.read(), sums, "in-place all_reduce of {n}");

        // reduce to the last rank, broadcast from rank 1 % world.
        let root = world - 1;
        let recv = Buf::new(comm, n);
        // SAFETY: as above.
        unsafe { call.reduce(send.ptr, recv.ptr, n, DataType::F32, ReduceOp::SUM, root) }
            .expect("reduce");
        sync();
        if me == root {
            assert_eq!(recv.read(), sums, "reduce of {n} to {root}");
        }
        let from = 1 % world;
        let out = Buf::new(comm, n);
        // SAFETY: as above.
        unsafe { call.broadcast(send.ptr, out.ptr, n, DataType::F32, from) }.expect("broadcast");
        sync();
        assert_eq!(out.read(), all[from], "broadcast of {n} from {from}");

        // all_gather and gather: rank r's block at r * n.
        let gathered: Vec<f32> = all.concat();
        let recv = Buf::new(comm, n * world);
        // SAFETY: `recv` holds `world * n` f32.
        unsafe { call.all_gather(send.ptr, recv.ptr, n, DataType::F32) }.expect("all_gather");
        sync();
        assert_eq!(recv.read(), gathered, "all_gather of {n}");
        let recv = Buf::new(comm, n * world);
        // SAFETY: as above.
        unsafe { call.gather(send.ptr, recv.ptr, n, DataType::F32, 0) }.expect("gather");
        sync();
        if me == 0 {
            assert_eq!(recv.read(), gathered, "gather of {n}");
        }

        // reduce_scatter and scatter over inputs of `world * n`.
        let big: Vec<Vec<f32>> = (0..world).map(|r| input(case + 1, r, n * world)).collect();
        let send_big = Buf::with(comm, &big[me]);
        let recv = Buf::new(comm, n);
        // SAFETY: `send_big` holds `world * n` f32, `recv` `n`.
        unsafe { call.reduce_scatter(send_big.ptr, recv.ptr, n, DataType::F32, ReduceOp::SUM) }
            .expect("reduce_scatter");
        sync();
        let want: Vec<f32> = (me * n..(me + 1) * n)
            .map(|i| big.iter().map(|v| v[i]).sum())
            .collect();
        assert_eq!(recv.read(), want, "reduce_scatter of {n}");
        let recv = Buf::new(comm, n);
        // SAFETY: as above.
        unsafe { call.scatter(send_big.ptr, recv.ptr, n, DataType::F32, root) }.expect("scatter");
        sync();
        assert_eq!(
            recv.read(),
            big[root][me * n..(me + 1) * n],
            "scatter of {n} from {root}"
        );

        // all_to_all: block r of rank q's input lands at block q of rank r's output.
        let recv = Buf::new(comm, n * world);
        // SAFETY: both hold `world * n` f32.
        unsafe { call.all_to_all(send_big.ptr, recv.ptr, n, DataType::F32) }.expect("all_to_all");
        sync();
        let want: Vec<f32> = (0..world)
            .flat_map(|q| big[q][me * n..(me + 1) * n].to_vec())
            .collect();
        assert_eq!(recv.read(), want, "all_to_all of {n}");

        // all_to_allv, uneven: rank q sends (q + r) % 3 + n elements to rank r.
        let len = |q: usize, r: usize| (q + r) % 3 + n;
        let displs = |lens: Vec<usize>| -> Vec<usize> {
            lens.iter()
                .scan(0, |acc, l| {
                    let at = *acc;
                    *acc += l;
                    Some(at)
                })
                .collect()
        };
        let send_counts: Vec<usize> = (0..world).map(|r| len(me, r)).collect();
        let recv_counts: Vec<usize> = (0..world).map(|q| len(q, me)).collect();
        let send_displs = displs(send_counts.clone());
        let recv_displs = displs(recv_counts.clone());
        let total_in: usize = send_counts.iter().sum();
        let total_out: usize = recv_counts.iter().sum();
        let mine = input(case + 2, me, total_in);
        let sendv = Buf::with(comm, &mine);
        let recvv = Buf::new(comm, total_out);
        // SAFETY: the buffers hold the sums of the counts, which the displacements tile.
        unsafe {
            call.all_to_allv(
                sendv.ptr,
                &send_counts,
                &send_displs,
                recvv.ptr,
                &recv_counts,
                &recv_displs,
                DataType::F32,
            )
        }
        .expect("all_to_allv");
        sync();
        let want: Vec<f32> = (0..world)
            .flat_map(|q| {
                let theirs = input(case + 2, q, (0..world).map(|r| len(q, r)).sum());
                let at: usize = (0..me).map(|r| len(q, r)).sum();
                theirs[at..at + len(q, me)].to_vec()
            })
            .collect();
        assert_eq!(recvv.read(), want, "all_to_allv around {n}");

        // Grouped send/recv: each rank sends to both neighbours and receives from both, in an
        // order that would deadlock without the group (everyone receives first).
        let (left, right) = ((me + world - 1) % world, (me + 1) % world);
        let from_left = Buf::new(comm, n);
        let from_right = Buf::new(comm, n);
        comm.group(|| {
            // SAFETY: each buffer holds `n` f32 and lives past the synchronize.
            unsafe {
                call.recv(from_left.ptr, n, DataType::F32, left)?;
                call.recv(from_right.ptr, n, DataType::F32, right)?;
                call.send(send.ptr, n, DataType::F32, right)?;
                call.send(send.ptr, n, DataType::F32, left)
            }
        })
        .expect("grouped send/recv");
        sync();
        assert_eq!(from_left.read(), all[left], "recv of {n} from {left}");
        assert_eq!(from_right.read(), all[right], "recv of {n} from {right}");

        call.barrier().expect("barrier");
        sync();
    }
    // A peer outside the world is refused before any call.
    let b = Buf::new(comm, 1);
    // SAFETY: `b` holds one f32 (and the call is refused before it is used).
    let e = unsafe { call.send(b.ptr, 1, DataType::F32, world) }.expect_err("no such peer");
    assert!(e.to_string().contains(&format!("peer {world}")), "{e}");
    // Only all-reduce and all-gather run on a window route; forcing another op there is
    // refused.
    // SAFETY: as above.
    let e = unsafe {
        call.via(Route::Window(
            ferrocx::window::collectives::WindowAlgo::OneShot,
        ))
        .broadcast(b.ptr, b.ptr, 0, DataType::F32, 0)
    }
    .expect_err("broadcast on a window route");
    assert!(e.to_string().contains("broadcast"), "{e}");
}

fn rank_main() {
    let log = RouteLog::default();
    ferrocx_kernels::link();
    let comm = communicator();
    // Probed once at init: what the router decides from.
    let caps = comm.caps();
    assert!(caps.ccl.has("all_to_allv") && caps.ccl.has("group_start"));
    assert!(caps.device.root.has("launch_host_func"));
    assert_eq!(caps.window_collectives, Some("ferrocx-kernels"));
    log.capture(|| {
        every_collective(&comm, comm.call(), comm.stream(), 1);
        let stream = comm.device().stream_create().expect("stream_create");
        every_collective(&comm, comm.on(stream), stream, 10_000);
        comm.device()
            .stream_destroy(stream)
            .expect("stream_destroy");
        comm.barrier().expect("barrier");
    });
    let text = log.text();
    for op in [
        "all_reduce",
        "reduce",
        "broadcast",
        "all_gather",
        "reduce_scatter",
        "gather",
        "scatter",
        "all_to_all",
        "all_to_allv",
        "send",
        "recv",
        "barrier",
    ] {
        assert!(
            text.contains(&format!("collective{{op=\"{op}\"")),
            "no span of {op} in:\n{text}"
        );
    }
    // 4099 f32 all-reduced: its bytes, type and route are in the span.
    assert!(
        text.contains("op=\"all_reduce\" bytes=16396 dtype=\"f32\" route="),
        "{text}"
    );
    println!("RANK OK");
}

#[test]
fn every_collective_2_ranks() {
    const T: &str = "every_collective_2_ranks";
    match rank_of(T) {
        Some(_) => rank_main(),
        None => {
            Job::new(T, 2).run();
        }
    }
}

#[test]
fn every_collective_3_ranks() {
    const T: &str = "every_collective_3_ranks";
    match rank_of(T) {
        Some(_) => rank_main(),
        None => {
            Job::new(T, 3).run();
        }
    }
}
