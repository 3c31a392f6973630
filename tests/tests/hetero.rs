//! Jobs across clusters, as real processes (see `window_ranks`): clusters of 2+3 ranks with
//! non-contiguous rank lists and of 1+1+2 ranks, every collective on random data against
//! references computed here from every rank's input (counter-based, so every rank can compute
//! every rank's input), odd counts, f32/bf16/i32, sum and max; a count that differs across
//! clusters fails alike on every rank; a rank killed mid-collective is named with its cluster
//! on every other rank within the timeout; nothing is left in /dev/shm.
//!
//! Clusters run the host device and CCL, or the `offhost` test plugin (a `.so`): a device whose
//! memory the host cannot address (its addresses are not the process's), with streams of its
//! own and a CCL of one rank per communicator, so its clusters have one rank each and the
//! bridge moves their buffers through staging on the copy stream. Its buffers are device
//! allocations, uploaded and downloaded through the device table.

mod window_ranks;

use std::time::{Duration, Instant};

use ferrocx::abi::{Capabilities, DataType, DevicePtr, MemKind, ReduceOp};
use ferrocx::adaptor::DeviceBuffer;
use ferrocx::comm::{CommError, Communicator};
use ferrocx::half::f32_to_bf16;
use ferrocx::hetero::Stage;
use ferrocx::route::Route;
use window_ranks::{communicator, rank_of, Job};

/// A small counter-based generator: the input of (seed, rank, i), the same on every rank.
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The value rank `rank` contributes at `i`: small integers for floating types (so any order
/// of summation is exact), any i32 for i32.
fn value(dtype: DataType, seed: u64, rank: usize, i: usize) -> i64 {
    let r = mix(seed ^ ((rank as u64) << 40) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    match dtype {
        DataType::I32 => r as u32 as i32 as i64,
        DataType::BF16 => (r % 9) as i64 - 4,
        _ => (r % 33) as i64 - 16,
    }
}

fn encode(dtype: DataType, v: i64, out: &mut Vec<u8>) {
    match dtype {
        DataType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DataType::BF16 => out.extend_from_slice(&f32_to_bf16(v as f32).to_le_bytes()),
        DataType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        _ => unreachable!(),
    }
}

fn input(dtype: DataType, seed: u64, rank: usize, n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for i in 0..n {
        encode(dtype, value(dtype, seed, rank, i), &mut v);
    }
    v
}

fn fold(dtype: DataType, op: ReduceOp, vals: impl Iterator<Item = i64>) -> i64 {
    vals.reduce(|a, b| match op {
        ReduceOp::MAX => a.max(b),
        _ if dtype == DataType::I32 => (a as i32).wrapping_add(b as i32) as i64,
        _ => a + b,
    })
    .expect("ranks")
}

/// The reduction of every rank's input (`n` elements).
fn reduced(dtype: DataType, op: ReduceOp, seed: u64, world: usize, n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for i in 0..n {
        let x = fold(dtype, op, (0..world).map(|r| value(dtype, seed, r, i)));
        encode(dtype, x, &mut v);
    }
    v
}

fn ptr(v: &[u8]) -> DevicePtr {
    DevicePtr(v.as_ptr() as u64)
}

/// A buffer of the communicator's device: host memory where the device addresses it, device
/// memory (moved through staging by the bridge) otherwise.
enum Buf {
    Host(Vec<u8>),
    Device(DeviceBuffer),
}

impl Buf {
    /// `data` on `comm`'s device. `TEST_BUFFERS=device` (or `device-even`: on even ranks)
    /// takes device memory on a host device too (shared-memory segments, which the flat ranks
    /// read in place), where otherwise host-addressable devices get C-heap memory.
    fn new(comm: &Communicator, data: Vec<u8>) -> Buf {
        let host = comm
            .device()
            .properties(0)
            .expect("properties")
            .capabilities
            .contains(Capabilities::HOST_ADDRESSABLE);
        let device_memory = match std::env::var("TEST_BUFFERS").as_deref() {
            Ok("device") => true,
            Ok("device-even") => comm.rank() % 2 == 0,
            _ => false,
        };
        if host && !device_memory {
            return Buf::Host(data);
        }
        Buf::Device(DeviceBuffer::from_host(comm.device(), &data, MemKind::DEVICE).expect("upload"))
    }

    /// `n` zero bytes.
    fn zeros(comm: &Communicator, n: usize) -> Buf {
        Buf::new(comm, vec![0u8; n])
    }

    fn ptr(&self) -> DevicePtr {
        match self {
            Buf::Host(v) => ptr(v),
            Buf::Device(d) => d.ptr(),
        }
    }

    /// The contents (after a synchronize).
    fn get(&self) -> Vec<u8> {
        match self {
            Buf::Host(v) => v.clone(),
            Buf::Device(d) => d.to_vec().expect("download"),
        }
    }
}

fn sync(comm: &Communicator, what: &str) {
    comm.synchronize()
        .unwrap_or_else(|e| panic!("rank {}: {what}: {e}", comm.rank()));
}

const DTYPES: [DataType; 3] = [DataType::F32, DataType::BF16, DataType::I32];
const OPS: [ReduceOp; 2] = [ReduceOp::SUM, ReduceOp::MAX];

/// Every collective across the clusters of `comm`'s job, checked.
fn every_collective(comm: &Communicator, counts: &[usize]) {
    let me = comm.rank();
    let w = comm.world();
    assert!(comm.router().clusters > 1);
    assert_eq!(
        comm.all_reduce_route(8, DataType::F32, ReduceOp::SUM),
        Route::Clusters
    );
    let mut seed = 1u64;
    for &n in counts {
        for dtype in DTYPES {
            let es = dtype.size().expect("size");
            for op in OPS {
                seed += 1;
                let what = format!("all_reduce of {n} x {dtype:?} {op:?}");
                let send = Buf::new(comm, input(dtype, seed, me, n));
                let recv = Buf::zeros(comm, n * es);
                // SAFETY: host memory of n elements each, kept until the synchronize.
                unsafe { comm.all_reduce(send.ptr(), recv.ptr(), n, dtype, op) }
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                sync(comm, &what);
                assert!(
                    recv.get() == reduced(dtype, op, seed, w, n),
                    "rank {me}: {what}"
                );
                // In place.
                let buf = Buf::new(comm, input(dtype, seed, me, n));
                // SAFETY: as above.
                unsafe { comm.all_reduce(buf.ptr(), buf.ptr(), n, dtype, op) }
                    .unwrap_or_else(|e| panic!("{what} in place: {e}"));
                sync(comm, &what);
                assert!(
                    buf.get() == reduced(dtype, op, seed, w, n),
                    "rank {me}: {what} in place"
                );
            }
            seed += 1;
            // reduce to a root of each cluster, with sum.
            for root in [1, w - 1] {
                let send = Buf::new(comm, input(dtype, seed, me, n));
                let recv = Buf::zeros(comm, n * es);
                // SAFETY: as above.
                unsafe { comm.reduce(send.ptr(), recv.ptr(), n, dtype, ReduceOp::SUM, root) }
                    .expect("reduce");
                sync(comm, "reduce");
                if me == root {
                    assert!(
                        recv.get() == reduced(dtype, ReduceOp::SUM, seed, w, n),
                        "rank {me}: reduce of {n} {dtype:?}"
                    );
                }
            }
            // broadcast from a root of each cluster.
            for root in [0, w - 1] {
                let send = Buf::new(comm, input(dtype, seed, me, n));
                let recv = Buf::zeros(comm, n * es);
                // SAFETY: as above.
                unsafe { comm.broadcast(send.ptr(), recv.ptr(), n, dtype, root) }
                    .expect("broadcast");
                sync(comm, "broadcast");
                assert!(
                    recv.get() == input(dtype, seed, root, n),
                    "rank {me}: broadcast from {root}"
                );
            }
            // all_gather and gather.
            let send = Buf::new(comm, input(dtype, seed, me, n));
            let all: Vec<u8> = (0..w).flat_map(|r| input(dtype, seed, r, n)).collect();
            let recv = Buf::zeros(comm, w * n * es);
            // SAFETY: n and w * n elements.
            unsafe { comm.all_gather(send.ptr(), recv.ptr(), n, dtype) }.expect("all_gather");
            sync(comm, "all_gather");
            assert!(recv.get() == all, "rank {me}: all_gather of {n} {dtype:?}");
            let recv = Buf::zeros(comm, w * n * es);
            // SAFETY: as above.
            unsafe { comm.gather(send.ptr(), recv.ptr(), n, dtype, 2) }.expect("gather");
            sync(comm, "gather");
            if me == 2 {
                assert!(recv.get() == all, "rank {me}: gather of {n} {dtype:?}");
            }
            // reduce_scatter: block b of rank r's input is input(seed + b, r).
            let blocks = |r: usize| -> Vec<u8> {
                (0..w)
                    .flat_map(|b| input(dtype, seed * 31 + b as u64, r, n))
                    .collect()
            };
            let send = Buf::new(comm, blocks(me));
            let recv = Buf::zeros(comm, n * es);
            // SAFETY: w * n and n elements.
            unsafe { comm.reduce_scatter(send.ptr(), recv.ptr(), n, dtype, ReduceOp::SUM) }
                .expect("reduce_scatter");
            sync(comm, "reduce_scatter");
            assert!(
                recv.get() == reduced(dtype, ReduceOp::SUM, seed * 31 + me as u64, w, n),
                "rank {me}: reduce_scatter of {n} {dtype:?}"
            );
            // all_to_all: my block b goes to rank b.
            let recv = Buf::zeros(comm, w * n * es);
            // SAFETY: w * n elements each.
            unsafe { comm.all_to_all(send.ptr(), recv.ptr(), n, dtype) }.expect("all_to_all");
            sync(comm, "all_to_all");
            let expect: Vec<u8> = (0..w)
                .flat_map(|r| input(dtype, seed * 31 + me as u64, r, n))
                .collect();
            assert!(
                recv.get() == expect,
                "rank {me}: all_to_all of {n} {dtype:?}"
            );
            // scatter from the last rank.
            let root = w - 1;
            let recv = Buf::zeros(comm, n * es);
            // SAFETY: w * n (root) and n elements.
            unsafe { comm.scatter(send.ptr(), recv.ptr(), n, dtype, root) }.expect("scatter");
            sync(comm, "scatter");
            assert!(
                recv.get() == input(dtype, seed * 31 + me as u64, root, n),
                "rank {me}: scatter of {n} {dtype:?}"
            );
        }
    }
    all_to_allv(comm);
    point_to_point(comm);
    for _ in 0..3 {
        comm.barrier().expect("barrier");
    }
    let h = comm.hetero().expect("a job across clusters");
    assert!(
        h.plans_cached() <= counts.len() * DTYPES.len(),
        "plans are cached per (count, dtype)"
    );
}

/// all_to_allv with counts that differ per pair (rank s sends s + 2d + 1 elements to d).
fn all_to_allv(comm: &Communicator) {
    let me = comm.rank();
    let w = comm.world();
    let dtype = DataType::I32;
    let count = |s: usize, d: usize| s + 2 * d + 1 + 700 * ((s + d) % 2);
    let send_counts: Vec<usize> = (0..w).map(|d| count(me, d)).collect();
    let recv_counts: Vec<usize> = (0..w).map(|s| count(s, me)).collect();
    let displs = |c: &[usize]| -> Vec<usize> {
        c.iter()
            .scan(0, |a, &x| {
                let d = *a;
                *a += x;
                Some(d)
            })
            .collect()
    };
    let (sd, rd) = (displs(&send_counts), displs(&recv_counts));
    let send = Buf::new(
        comm,
        (0..w)
            .flat_map(|d| input(dtype, 900 + d as u64, me, count(me, d)))
            .collect(),
    );
    let recv = Buf::zeros(comm, recv_counts.iter().sum::<usize>() * 4);
    // SAFETY: the arrays describe both buffers.
    unsafe {
        comm.all_to_allv(
            send.ptr(),
            &send_counts,
            &sd,
            recv.ptr(),
            &recv_counts,
            &rd,
            dtype,
        )
    }
    .expect("all_to_allv");
    sync(comm, "all_to_allv");
    let expect: Vec<u8> = (0..w)
        .flat_map(|s| input(dtype, 900 + me as u64, s, count(s, me)))
        .collect();
    assert!(recv.get() == expect, "rank {me}: all_to_allv");
}

/// Each rank sends to the next and receives from the previous (across clusters and inside
/// them), in a group; sizes above one channel chunk.
fn point_to_point(comm: &Communicator) {
    let me = comm.rank();
    let w = comm.world();
    let n = 3001;
    let dtype = DataType::F32;
    let send = Buf::new(comm, input(dtype, 77, me, n));
    let recv = Buf::zeros(comm, n * 4);
    let (next, prev) = ((me + 1) % w, (me + w - 1) % w);
    comm.group(|| {
        // SAFETY: n elements each, kept until the synchronize.
        unsafe {
            comm.send(send.ptr(), n, dtype, next)?;
            comm.recv(recv.ptr(), n, dtype, prev)
        }
    })
    .expect("send/recv");
    sync(comm, "send/recv");
    assert!(
        recv.get() == input(dtype, 77, prev, n),
        "rank {me}: recv from {prev}"
    );
}

#[test]
fn two_plus_three_ranks_every_collective() {
    if rank_of("two_plus_three_ranks_every_collective").is_some() {
        let comm = communicator();
        assert_eq!(
            comm.cluster(),
            if [0, 2].contains(&comm.rank()) {
                "a"
            } else {
                "b"
            }
        );
        // 1 and odd counts; 2501 crosses several 4 KiB chunks of every type.
        every_collective(&comm, &[1, 7, 1001, 2501]);
        println!("RANK OK");
        return;
    }
    // Plans of two chunks or more handed to the enqueuer thread; the plan through the
    // clusters' CCLs (both clusters are on the host device: the flat plan by default).
    Job::new("two_plus_three_ranks_every_collective", 5)
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "2")
        .env("FERROCX_BRIDGE_PLAN", "clusters")
        .clusters(&[("a", "0,2"), ("b", "1,3,4")])
        .bridge_key("ccl", "\"host\"")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "2")
        .run();
}

/// A chunk's in-cluster all-gather waits for its own bridge step only: with the second
/// chunk's step held on one rank until that rank's cluster stream has gathered the first chunk,
/// the call completes (a gather that waited for later steps too would never open the hold,
/// and the call would fail at the timeout). Rank by rank in `holders`, one call each.
fn a_held_step_is_released(test: &str, holders: &[usize]) {
    let Some(rank) = rank_of(test) else {
        return;
    };
    let comm = communicator();
    let h = comm.hetero().expect("a job across clusters");
    // 4096-byte chunks per rank and slot: 5000 f32 are several chunks.
    let n = 5000;
    let dtype = DataType::F32;
    for (i, &holder) in holders.iter().enumerate() {
        let seed = 21 + i as u64;
        let send = Buf::new(&comm, input(dtype, seed, rank, n));
        let recv = Buf::zeros(&comm, n * 4);
        if rank == holder {
            h.inject_hold();
        }
        // SAFETY: n f32 each, kept until the synchronize.
        unsafe { comm.all_reduce(send.ptr(), recv.ptr(), n, dtype, ReduceOp::SUM) }
            .and_then(|()| comm.synchronize())
            .unwrap_or_else(|e| panic!("rank {rank}, hold on rank {holder}: {e}"));
        assert!(
            recv.get() == reduced(dtype, ReduceOp::SUM, seed, comm.world(), n),
            "rank {rank}, hold on rank {holder}"
        );
    }
    println!("RANK OK");
}

#[test]
fn a_chunks_gather_does_not_wait_for_the_next_chunks_bridge_step() {
    const TEST: &str = "a_chunks_gather_does_not_wait_for_the_next_chunks_bridge_step";
    if rank_of(TEST).is_some() {
        return a_held_step_is_released(TEST, &[0, 3]);
    }
    // Two host clusters of two ranks, the plan through the clusters (in-cluster reduce-scatter
    // and all-gather around each bridge step), pipelined two deep.
    Job::new(TEST, 4)
        .clusters(&[("a", "0,1"), ("b", "2,3")])
        .env("FERROCX_BRIDGE_PLAN", "clusters")
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "0")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "2")
        .timeout_ms(3000)
        .run();
}

#[test]
fn a_staged_chunks_copies_back_do_not_wait_for_the_next_chunks_bridge_step() {
    const TEST: &str = "a_staged_chunks_copies_back_do_not_wait_for_the_next_chunks_bridge_step";
    if rank_of(TEST).is_some() {
        return a_held_step_is_released(TEST, &[0, 2]);
    }
    // One rank on a device the host cannot address (its results come back on the copy stream
    // after each step) beside three host ranks.
    with_offhost(Job::new(TEST, 4))
        .clusters(&[("gpu", "0"), ("cpu", "1-3")])
        .cluster_adaptors("gpu", "offhost", "offhost")
        .env("FERROCX_BRIDGE_PLAN", "clusters")
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "0")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "2")
        .timeout_ms(3000)
        .run();
}

#[test]
fn three_clusters_of_one_one_and_two_ranks() {
    if rank_of("three_clusters_of_one_one_and_two_ranks").is_some() {
        let comm = communicator();
        every_collective(&comm, &[1, 13, 3333]);
        println!("RANK OK");
        return;
    }
    Job::new("three_clusters_of_one_one_and_two_ranks", 4)
        .clusters(&[("a", "0"), ("b", "1"), ("c", "2,3")])
        .bridge_key("chunk_bytes", "8192")
        .bridge_key("depth", "3")
        .run();
}

#[test]
fn a_count_that_differs_across_clusters_fails_alike_everywhere() {
    if rank_of("a_count_that_differs_across_clusters_fails_alike_everywhere").is_some() {
        let comm = communicator();
        let n = if comm.rank() == 3 { 11 } else { 10 };
        let buf = vec![0u8; 11 * 4];
        // SAFETY: 11 f32, kept until the synchronize.
        let r = unsafe { comm.all_reduce(ptr(&buf), ptr(&buf), n, DataType::F32, ReduceOp::SUM) }
            .and_then(|()| comm.synchronize());
        match r {
            Err(e) => println!("ERROR {e}"),
            Ok(()) => panic!("a mismatched count ran"),
        }
        println!("RANK OK");
        return;
    }
    let done = Job::new(
        "a_count_that_differs_across_clusters_fails_alike_everywhere",
        4,
    )
    .clusters(&[("a", "0,1"), ("b", "2,3")])
    .timeout_ms(5000)
    .run();
    let errors: Vec<String> = done.iter().map(|f| f.lines("ERROR ").join("")).collect();
    println!("every rank: {}", errors[0]);
    for e in &errors {
        assert_eq!(e, &errors[0], "the same error on every rank: {errors:?}");
    }
    assert!(
        errors[0].contains("rank 0 (cluster \"a\") called all_reduce of 10 x f32")
            && errors[0].contains("rank 3 (cluster \"b\") called all_reduce of 11 x f32"),
        "{}",
        errors[0]
    );
}

#[test]
fn a_rank_killed_mid_collective_is_named_with_its_cluster() {
    const TEST: &str = "a_rank_killed_mid_collective_is_named_with_its_cluster";
    if let Some(rank) = rank_of(TEST) {
        let comm = communicator();
        let n = 50_000;
        let buf = vec![0u8; n * 4];
        for _ in 0..3 {
            // SAFETY: n f32, kept until the synchronize.
            unsafe { comm.all_reduce(ptr(&buf), ptr(&buf), n, DataType::F32, ReduceOp::SUM) }
                .expect("all_reduce");
            sync(&comm, "all_reduce");
        }
        if rank == 3 {
            // Dies while the others run the next call.
            std::thread::sleep(Duration::from_millis(50));
            std::process::exit(9);
        }
        let start = Instant::now();
        // SAFETY: as above.
        let r: Result<(), CommError> =
            unsafe { comm.all_reduce(ptr(&buf), ptr(&buf), n, DataType::F32, ReduceOp::SUM) }
                .and_then(|()| comm.synchronize());
        let e = r.expect_err("rank 3 is gone");
        println!("ERROR {e}");
        println!("TOOK {}", start.elapsed().as_millis());
        println!("RANK OK");
        return;
    }
    // With the trace ring on, a rank whose wait gives up prints where its steps stood.
    let done = Job::new(TEST, 4)
        .clusters(&[("a", "0"), ("b", "1"), ("c", "2,3")])
        .env("FERROCX_BRIDGE_TRACE", "ring")
        .timeout_ms(3000)
        .may_die(3)
        .run();
    let rings = done
        .iter()
        .filter(|f| f.stderr.contains("bridge trace ring (") && f.stderr.contains(" published"))
        .count();
    assert!(rings > 0, "no rank printed its trace ring");
    for f in done.iter().filter(|f| f.rank != 3) {
        let e = f.lines("ERROR ").join("");
        assert!(e.contains("rank 3 (cluster \"c\")"), "rank {}: {e}", f.rank);
        let took: u64 = f.lines("TOOK ").join("").parse().expect("a time");
        println!("rank {} after {took} ms: {e}", f.rank);
        assert!(took < 3000 + 2000, "rank {} took {took} ms", f.rank);
    }
}

#[test]
fn mpi_bridge_without_the_mpi_adaptor_is_refused_naming_it() {
    const TEST: &str = "mpi_bridge_without_the_mpi_adaptor_is_refused_naming_it";
    if rank_of(TEST).is_some() {
        ferrocx_adaptor_host::link();
        // This program has no built-in `mpi` adaptor and the job names no plugin directory.
        let e = Communicator::from_env().err().expect("refused");
        let s = e.to_string();
        assert!(
            s.contains("needs the `mpi` CCL adaptor") && s.contains("libferrocx_adaptor_mpi.so"),
            "{s}"
        );
        println!("RANK OK");
        return;
    }
    Job::new(TEST, 2)
        .clusters(&[("a", "0"), ("b", "1")])
        .bridge_key("ccl", "\"mpi\"")
        .run();
}

/// The `offhost` plugin for every rank (a device the host cannot address: the bridge stages
/// its buffers).
fn with_offhost(job: Job) -> Job {
    let path = ferrocx_tests::offhost_plugin();
    job.env("FERROCX_PLUGIN_PATH", path.to_str().expect("a UTF-8 path"))
}

/// Asserts that `comm`'s device is `offhost` and stages through the bridge exactly there.
fn assert_staged_on_offhost(comm: &Communicator) {
    let offhost = comm.device().name() == "offhost";
    let h = comm.hetero().expect("a job across clusters");
    assert_eq!(h.staged(), offhost, "rank {}", comm.rank());
    assert_eq!(h.streams_made(), if offhost { 6 } else { 4 });
    // The offhost device has the memops group: its steps run on the proxy thread, unless the
    // job turned the proxy off.
    let proxy_off = std::env::var("FERROCX_BRIDGE_PROXY").is_ok_and(|v| v == "0");
    assert_eq!(h.proxied(), offhost && !proxy_off, "rank {}", comm.rank());
}

#[test]
fn offhost_clusters_beside_host_ones_every_collective() {
    const TEST: &str = "offhost_clusters_beside_host_ones_every_collective";
    if let Some(rank) = rank_of(TEST) {
        let comm = communicator();
        assert_eq!(
            comm.device().name(),
            if rank < 2 { "offhost" } else { "host" }
        );
        assert_staged_on_offhost(&comm);
        every_collective(&comm, &[1, 13, 3333]);
        println!("RANK OK");
        return;
    }
    // Clusters of 1 + 1 + 2 ranks: two of one rank on the offhost device (its CCL runs one rank
    // per communicator), one of two ranks on the host; 4 KiB chunks, so that the larger counts
    // run several chunks through the pipeline and the staging slots are reused.
    with_offhost(Job::new(TEST, 4))
        .clusters(&[("a", "0"), ("b", "1"), ("c", "2,3")])
        .cluster_adaptors("a", "offhost", "offhost")
        .cluster_adaptors("b", "offhost", "offhost")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "2")
        .env("FERROCX_BRIDGE_PLAN", "clusters")
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "2")
        .run();
}

#[test]
fn one_offhost_rank_beside_three_host_ranks() {
    const TEST: &str = "one_offhost_rank_beside_three_host_ranks";
    if rank_of(TEST).is_some() {
        let comm = communicator();
        assert_staged_on_offhost(&comm);
        every_collective(&comm, &[5, 2049]);
        println!("RANK OK");
        return;
    }
    // The shape of configs/hetero-1gpu.toml: one rank on a device of its own, three CPU ranks.
    with_offhost(Job::new(TEST, 4))
        .clusters(&[("gpu", "0"), ("cpu", "1-3")])
        .cluster_adaptors("gpu", "offhost", "offhost")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "3")
        .run();
}

#[test]
fn one_offhost_rank_beside_three_host_ranks_with_host_functions() {
    const TEST: &str = "one_offhost_rank_beside_three_host_ranks_with_host_functions";
    if rank_of(TEST).is_some() {
        let comm = communicator();
        assert_staged_on_offhost(&comm);
        every_collective(&comm, &[5, 2049]);
        println!("RANK OK");
        return;
    }
    // As above, with the bridge steps as host functions on the streams (the fallback of a
    // device without stream memory operations).
    with_offhost(Job::new(TEST, 4))
        .clusters(&[("gpu", "0"), ("cpu", "1-3")])
        .cluster_adaptors("gpu", "offhost", "offhost")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "3")
        .env("FERROCX_BRIDGE_PROXY", "0")
        .run();
}

#[test]
fn large_messages_shared_among_bridge_threads() {
    const TEST: &str = "large_messages_shared_among_bridge_threads";
    if rank_of(TEST).is_some() {
        let comm = communicator();
        assert_eq!(ferrocx::hetero::workers::threads(), 3);
        // Past the one-step size and past a part of the bridge threads' cut (256 KiB) in a
        // 1 MiB slot: the copies and reductions of a step are shared out, odd counts included.
        every_collective(&comm, &[300_001]);
        println!("RANK OK");
        return;
    }
    with_offhost(Job::new(TEST, 3))
        .clusters(&[("gpu", "0"), ("cpu", "1-2")])
        .cluster_adaptors("gpu", "offhost", "offhost")
        .bridge_key("chunk_bytes", "1048576")
        .env("FERROCX_BRIDGE_THREADS", "3")
        .run();
}

#[test]
fn calls_on_two_streams_without_a_synchronize_between() {
    const TEST: &str = "calls_on_two_streams_without_a_synchronize_between";
    if let Some(rank) = rank_of(TEST) {
        let comm = communicator();
        let other = comm.device().stream_create().expect("a second stream");
        let w = comm.world();
        // Small (one step on the caller's stream) and large (the pipelined plan on the
        // communicator's streams) all-reduces and a broadcast, alternating between the
        // communicator's stream and another one, nothing synchronized until the end: each call
        // must run after the previous one, whatever stream that one was on.
        let counts = [3usize, 2501, 1, 4099, 7];
        let sends: Vec<Buf> = counts
            .iter()
            .enumerate()
            .map(|(k, &n)| Buf::new(&comm, input(DataType::F32, 40 + k as u64, rank, n)))
            .collect();
        let recvs: Vec<Buf> = counts.iter().map(|&n| Buf::zeros(&comm, n * 4)).collect();
        let root = w - 1;
        let bsend = Buf::new(&comm, input(DataType::I32, 77, root, 1001));
        let brecv = Buf::zeros(&comm, 1001 * 4);
        for (k, &n) in counts.iter().enumerate() {
            let stream = if k % 2 == 0 { comm.stream() } else { other };
            // SAFETY: n f32 each, kept until the synchronize below.
            unsafe {
                comm.on(stream).all_reduce(
                    sends[k].ptr(),
                    recvs[k].ptr(),
                    n,
                    DataType::F32,
                    ReduceOp::SUM,
                )
            }
            .expect("all_reduce");
            if k == 2 {
                // SAFETY: 1001 i32, kept until the synchronize below.
                unsafe {
                    comm.on(other)
                        .broadcast(bsend.ptr(), brecv.ptr(), 1001, DataType::I32, root)
                }
                .expect("broadcast");
            }
        }
        comm.device()
            .stream_synchronize(other)
            .expect("the other stream");
        sync(&comm, "the communicator's stream");
        for (k, &n) in counts.iter().enumerate() {
            assert!(
                recvs[k].get() == reduced(DataType::F32, ReduceOp::SUM, 40 + k as u64, w, n),
                "rank {rank}: all_reduce {k} of {n}"
            );
        }
        assert!(
            brecv.get() == input(DataType::I32, 77, root, 1001),
            "rank {rank}: broadcast"
        );
        comm.device().stream_destroy(other).expect("destroy");
        println!("RANK OK");
        return;
    }
    with_offhost(Job::new(TEST, 4))
        .clusters(&[("gpu", "0"), ("cpu", "1-3")])
        .cluster_adaptors("gpu", "offhost", "offhost")
        .bridge_key("chunk_bytes", "4096")
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "2")
        .run();
}

/// Asserts the plan `comm`'s all-reduces take past one step (`FERROCX_BRIDGE_PLAN`, as the
/// job gives it, and the rank's cluster).
fn assert_plan(comm: &Communicator, through: &[&str]) {
    let h = comm.hetero().expect("a job across clusters");
    let want = if through.contains(&comm.cluster()) {
        "hybrid through"
    } else {
        "hybrid flat"
    };
    assert_eq!(
        h.all_reduce_plan_name(),
        Some(want),
        "rank {} of cluster {}",
        comm.rank(),
        comm.cluster()
    );
}

#[test]
fn hybrid_plan_a_host_cluster_through_its_ccl_beside_flat_host_ranks() {
    const TEST: &str = "hybrid_plan_a_host_cluster_through_its_ccl_beside_flat_host_ranks";
    if rank_of(TEST).is_some() {
        let comm = communicator();
        assert_plan(&comm, &["a"]);
        // 1 and odd counts; 2501 and 3333 cross several 4 KiB chunks of every type, with
        // shares that do not line up between the 2-rank cluster and the 3 flat ranks.
        every_collective(&comm, &[1, 7, 1001, 2501, 3333]);
        println!("RANK OK");
        return;
    }
    // Cluster a (2 ranks, not contiguous) reduce-scatters and all-gathers through its CCL;
    // cluster b's 3 ranks take part flat. Plans of two chunks or more go to the enqueuer.
    Job::new(TEST, 5)
        .clusters(&[("a", "0,2"), ("b", "1,3,4")])
        .env("FERROCX_BRIDGE_PLAN", "hybrid=a")
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "2")
        .bridge_key("ccl", "\"host\"")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "2")
        .run();
}

#[test]
fn hybrid_plan_a_staged_rank_and_a_host_cluster_through_their_ccls_beside_flat_ranks() {
    const TEST: &str =
        "hybrid_plan_a_staged_rank_and_a_host_cluster_through_their_ccls_beside_flat_ranks";
    if rank_of(TEST).is_some() {
        let comm = communicator();
        assert_staged_on_offhost(&comm);
        assert_plan(&comm, &["gpu", "a"]);
        every_collective(&comm, &[13, 2049, 3333]);
        println!("RANK OK");
        return;
    }
    // A rank on a device the host cannot address (its share moves through staging, chunk k
    // in staging slot k % depth) and a host cluster of 2 through their CCLs, 2 flat host ranks;
    // three chunks in flight. Stream memory operations off: host functions on the streams.
    with_offhost(Job::new(TEST, 5))
        .clusters(&[("gpu", "0"), ("a", "1-2"), ("cpu", "3-4")])
        .cluster_adaptors("gpu", "offhost", "offhost")
        .env("FERROCX_BRIDGE_PLAN", "hybrid=gpu,a")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "3")
        .run();
}

#[test]
fn hybrid_plan_a_staged_rank_through_beside_flat_ranks_on_the_proxy() {
    const TEST: &str = "hybrid_plan_a_staged_rank_through_beside_flat_ranks_on_the_proxy";
    if rank_of(TEST).is_some() {
        let comm = communicator();
        assert_staged_on_offhost(&comm);
        assert_plan(&comm, &["gpu"]);
        every_collective(&comm, &[5, 2049]);
        println!("RANK OK");
        return;
    }
    // The staged rank's steps on the proxy thread, one chunk in flight (the staging slot
    // and bridge slots of every epoch are slot 0), enqueued by the enqueuer past one chunk.
    with_offhost(Job::new(TEST, 4))
        .clusters(&[("gpu", "0"), ("cpu", "1-3")])
        .cluster_adaptors("gpu", "offhost", "offhost")
        .env("FERROCX_BRIDGE_PLAN", "hybrid=gpu")
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "2")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "1")
        .run();
}

#[test]
fn hybrid_plan_a_chunks_gather_does_not_wait_for_the_next_chunks_bridge_step() {
    const TEST: &str = "hybrid_plan_a_chunks_gather_does_not_wait_for_the_next_chunks_bridge_step";
    if rank_of(TEST).is_some() {
        return a_held_step_is_released(TEST, &[0, 1]);
    }
    // The hold is on a rank through its cluster (the flat ranks' steps have no in-cluster
    // stage to wait for).
    Job::new(TEST, 4)
        .clusters(&[("a", "0,1"), ("b", "2,3")])
        .env("FERROCX_BRIDGE_PLAN", "hybrid=a")
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "0")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "2")
        .timeout_ms(3000)
        .run();
}

/// Live streams, events and allocations of the `offhost` device in this process (its
/// `ferrocx_offhost_live`, from the loaded `.so`); zeros where it is not loaded.
fn offhost_live() -> [u64; 3] {
    let path = std::ffi::CString::new(
        ferrocx_tests::offhost_plugin()
            .to_str()
            .expect("a UTF-8 path"),
    )
    .expect("no NUL");
    // SAFETY: a NUL-terminated path; RTLD_NOLOAD only looks the library up (a reference taken
    // is given back below).
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if lib.is_null() {
        return [0; 3];
    }
    // SAFETY: a handle of dlopen and a NUL-terminated name.
    let f = unsafe { libc::dlsym(lib, c"ferrocx_offhost_live".as_ptr()) };
    assert!(
        !f.is_null(),
        "the offhost plugin exports ferrocx_offhost_live"
    );
    // SAFETY: the symbol is `unsafe extern "C" fn(*mut u64, *mut u64, *mut u64)`.
    let f: unsafe extern "C" fn(*mut u64, *mut u64, *mut u64) = unsafe { std::mem::transmute(f) };
    let mut v = [0u64; 3];
    // SAFETY: three writable words.
    unsafe { f(&mut v[0], &mut v[1], &mut v[2]) };
    // SAFETY: the reference dlopen took above.
    unsafe { libc::dlclose(lib) };
    v
}

/// What a rank holds: descriptors, threads (the streams' workers), the offhost device's live
/// streams, events and allocations, and the job's shared-memory segments.
fn held() -> (usize, usize, [u64; 3], Vec<String>) {
    let count = |d: &str| std::fs::read_dir(d).expect(d).count();
    let job = std::env::var("FERROCX_JOB_ID").expect("a rank has a job id");
    (
        count("/proc/self/fd"),
        count("/proc/self/task"),
        offhost_live(),
        // This process's own (the bridge's is unlinked once every rank attached; a rank
        // ahead may be making the next communicator's).
        window_ranks::segments_of_job(&job)
            .into_iter()
            .filter(|n| n.starts_with(&format!("ferrocx-{job}-{}-", std::process::id())))
            .collect(),
    )
}

#[test]
fn a_failure_at_each_stage_fails_every_rank_alike_and_leaks_nothing() {
    // The flat plan (one cluster of one rank, one on the host device): the failure strikes a
    // bridge step, named as the stage asked for.
    failure_at_each_stage(
        "a_failure_at_each_stage_fails_every_rank_alike_and_leaks_nothing",
        "4",
        "auto",
    );
}

#[test]
fn a_failure_at_each_stage_of_the_plan_through_the_clusters() {
    failure_at_each_stage(
        "a_failure_at_each_stage_of_the_plan_through_the_clusters",
        "4",
        "clusters",
    );
}

#[test]
fn a_failure_at_each_stage_enqueued_by_the_enqueuer_thread() {
    // Every plan handed to the enqueuer thread: its failures too must reach every rank alike
    // and leave nothing behind.
    failure_at_each_stage(
        "a_failure_at_each_stage_enqueued_by_the_enqueuer_thread",
        "1",
        "clusters",
    );
}

#[test]
fn hybrid_plan_a_failure_at_each_stage() {
    // The offhost rank through its cluster (every stage: in-cluster, staging, bridge, gather),
    // the host cluster's ranks flat (the failure strikes a bridge step), from the enqueuer.
    failure_at_each_stage("hybrid_plan_a_failure_at_each_stage", "1", "hybrid=a");
}

/// Injects a failure at each stage of an all-reduce of 3 chunks; `async_chunks` is
/// `FERROCX_BRIDGE_ASYNC_CHUNKS` (plans of that many chunks go to the enqueuer thread), `plan`
/// `FERROCX_BRIDGE_PLAN`.
fn failure_at_each_stage(test: &str, async_chunks: &str, plan: &str) {
    if let Some(rank) = rank_of(test) {
        let n = 3001;
        let dtype = DataType::F32;
        // (failing rank, its cluster, stage): every stage on the offhost rank (staged), the
        // bridge step on a rank of the two-rank host cluster.
        let cases: Vec<(usize, &str, Stage)> = Stage::ALL
            .iter()
            .map(|&s| (0, "a", s))
            .chain([(2, "c", Stage::Bridge)])
            .collect();
        let mut baseline = None;
        for (at, cluster, stage) in cases {
            let comm = communicator();
            let h = comm.hetero().expect("a job across clusters");
            let send = Buf::new(&comm, input(dtype, 5, rank, n));
            let recv = Buf::zeros(&comm, n * 4);
            let call = || {
                // SAFETY: n f32 each, kept until the synchronize.
                unsafe { comm.all_reduce(send.ptr(), recv.ptr(), n, dtype, ReduceOp::SUM) }
                    .and_then(|()| comm.synchronize())
            };
            call().expect("a call before the failure");
            assert!(recv.get() == reduced(dtype, ReduceOp::SUM, 5, comm.world(), n));
            comm.barrier().expect("barrier");
            baseline.get_or_insert_with(held);
            if rank == at {
                h.inject_failure(stage);
            }
            // A rank whose share was done before the failure may finish this call, with the
            // right values (one that gathered a failed peer's share must fail); its next one
            // fails.
            let e = call()
                .and_then(|()| {
                    assert!(
                        recv.get() == reduced(dtype, ReduceOp::SUM, 5, comm.world(), n),
                        "rank {rank}: a call that finished beside the failure at {}",
                        stage.name()
                    );
                    call()
                })
                .expect_err("the injected failure");
            let text = e.to_string();
            println!("ERROR {text}");
            assert!(
                text.contains(&format!(
                    "rank {at} (cluster \"{cluster}\") failed at {}",
                    stage.name()
                )),
                "rank {rank}: {text}"
            );
            // What the failed call took is the communicator's (its pool's events); the calls
            // after it take nothing.
            let events = h.events_made();
            let before = held();
            for _ in 0..1000 {
                let again = call().expect_err("a broken communicator");
                assert_eq!(again.to_string(), text);
            }
            assert_eq!(h.events_made(), events, "no event taken by failed calls");
            let after = held();
            assert!(
                after.0 <= before.0
                    && after.1 <= before.1
                    && after.2 == before.2
                    && after.3 == before.3,
                "rank {rank}: descriptors, threads, offhost objects or segments grew: \
                 {before:?} -> {after:?}"
            );
            drop(comm);
        }
        // Every communicator gone: back to what the first one held.
        let (fds, threads, live, _) = held();
        let first = baseline.clone().expect("a case");
        assert!(
            fds <= first.0,
            "rank {rank}: {fds} descriptors, {} before",
            first.0
        );
        assert!(
            threads <= first.1,
            "rank {rank}: {threads} threads, {} before",
            first.1
        );
        assert_eq!(live[1], 0, "rank {rank}: offhost events left");
        println!("RANK OK");
        return;
    }
    let done = with_offhost(Job::new(test, 3))
        .clusters(&[("a", "0"), ("c", "1,2")])
        .cluster_adaptors("a", "offhost", "offhost")
        .bridge_key("chunk_bytes", "4096")
        .timeout_ms(3000)
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", async_chunks)
        .env("FERROCX_BRIDGE_PLAN", plan)
        .run();
    // Per case, the same error on every rank.
    for f in &done {
        println!("rank {}: {:?}", f.rank, f.lines("ERROR "));
    }
    let errors: Vec<Vec<String>> = done.iter().map(|f| f.lines("ERROR ")).collect();
    assert_eq!(errors[0].len(), 5, "{errors:?}");
    for e in &errors {
        assert_eq!(e, &errors[0], "every rank fails alike: {errors:?}");
    }
}

/// The first all-reduce of each type and reduction long enough for the enqueuer thread is
/// enqueued by the caller's thread (a first use of a kind of call may wait for the whole
/// device, which must not find the caller's stream waiting on the enqueuer); the later ones
/// go to the enqueuer. Every result checked.
#[test]
fn the_first_long_all_reduce_of_a_kind_is_enqueued_by_the_caller() {
    const TEST: &str = "the_first_long_all_reduce_of_a_kind_is_enqueued_by_the_caller";
    if let Some(rank) = rank_of(TEST) {
        let comm = communicator();
        let h = comm.hetero().expect("a job across clusters");
        // 3001 f32: three 4 KiB chunks, past the one-step size.
        let n = 3001;
        let dtype = DataType::F32;
        let calls = [
            (ReduceOp::SUM, 0),
            (ReduceOp::SUM, 1),
            (ReduceOp::MAX, 1),
            (ReduceOp::MAX, 2),
            (ReduceOp::SUM, 3),
        ];
        for (k, (op, handed)) in calls.into_iter().enumerate() {
            let send = Buf::new(&comm, input(dtype, 40 + k as u64, rank, n));
            let recv = Buf::zeros(&comm, n * 4);
            // SAFETY: n f32 each, kept until the synchronize.
            unsafe { comm.all_reduce(send.ptr(), recv.ptr(), n, dtype, op) }.expect("all_reduce");
            comm.synchronize().expect("synchronize");
            assert!(
                recv.get() == reduced(dtype, op, 40 + k as u64, comm.world(), n),
                "rank {rank}, call {k}: wrong values"
            );
            assert_eq!(h.handed_to_enqueuer(), handed, "rank {rank}, call {k}");
        }
        println!("RANK OK");
        return;
    }
    with_offhost(Job::new(TEST, 3))
        .clusters(&[("gpu", "0"), ("cpu", "1-2")])
        .cluster_adaptors("gpu", "offhost", "offhost")
        .bridge_key("chunk_bytes", "4096")
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "2")
        .env("FERROCX_BRIDGE_PLAN", "clusters")
        .run();
}

/// Three clusters whose ranks interleave (a: 0, b: 1 and 3, c: 2 and 4), every collective: the
/// ring of sends and receives in one group crosses a cluster at every hop, each message several
/// chunks of a channel. Before groups deferred the hand-back to the caller's stream, each
/// rank's receive waited for its own send, which waited for the next rank's receive: the
/// ring stopped at the timeout.
#[test]
fn three_clusters_with_interleaved_ranks_every_collective() {
    if rank_of("three_clusters_with_interleaved_ranks_every_collective").is_some() {
        let comm = communicator();
        every_collective(&comm, &[1, 7, 2501]);
        println!("RANK OK");
        return;
    }
    Job::new("three_clusters_with_interleaved_ranks_every_collective", 5)
        .clusters(&[("a", "0"), ("b", "1,3"), ("c", "2,4")])
        .bridge_key("chunk_bytes", "4096")
        .timeout_ms(5000)
        .run();
}

/// Whether this rank's all-reduces read the other flat ranks' inputs in place: mappings kept
/// where its peers' buffers are device memory, none where they are all C-heap memory.
fn assert_inputs_mapped(comm: &Communicator, expected: bool) {
    let mapped = comm
        .hetero()
        .expect("a job across clusters")
        .inputs_mapped();
    // At most 4 handles kept per peer (each call of `every_collective` has new buffers).
    assert!(mapped <= 4 * (comm.world() - 1), "{mapped} kept");
    assert_eq!(
        mapped > 0,
        expected,
        "rank {} of cluster {}: {mapped} peers' inputs mapped",
        comm.rank(),
        comm.cluster()
    );
}

#[test]
fn flat_plan_reads_the_inputs_in_place() {
    const TEST: &str = "flat_plan_reads_the_inputs_in_place";
    if rank_of(TEST).is_some() {
        let comm = communicator();
        // Odd counts over several 4 KiB chunks, shares that end inside an element's chunk;
        // in place and out of place (every_collective does both).
        every_collective(&comm, &[1001, 2501, 3333]);
        assert_inputs_mapped(&comm, true);
        println!("RANK OK");
        return;
    }
    // Every cluster on the host device: the flat plan, each rank's step A reading the other
    // ranks' device buffers (shared-memory segments) where they lie.
    Job::new(TEST, 5)
        .clusters(&[("a", "0,2"), ("b", "1,3,4")])
        .env("TEST_BUFFERS", "device")
        .bridge_key("ccl", "\"host\"")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "3")
        .run();
}

#[test]
fn hybrid_plan_reads_in_place_the_inputs_it_can_and_the_published_chunks_of_the_others() {
    const TEST: &str =
        "hybrid_plan_reads_in_place_the_inputs_it_can_and_the_published_chunks_of_the_others";
    if rank_of(TEST).is_some() {
        let comm = communicator();
        assert_plan(&comm, &["a"]);
        every_collective(&comm, &[7, 2501, 3333]);
        // The flat ranks are 1, 3 and 4; 4 gives a handle (device memory), 1 and 3 publish
        // their chunks (C-heap memory): 1 and 3 map 4's input, 4 maps nobody's.
        let flat_reader = [1, 3].contains(&comm.rank());
        assert_inputs_mapped(&comm, flat_reader);
        println!("RANK OK");
        return;
    }
    Job::new(TEST, 5)
        .clusters(&[("a", "0,2"), ("b", "1,3,4")])
        .env("FERROCX_BRIDGE_PLAN", "hybrid=a")
        .env("FERROCX_BRIDGE_ASYNC_CHUNKS", "2")
        .env("TEST_BUFFERS", "device-even")
        .bridge_key("ccl", "\"host\"")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "2")
        .run();
}

#[test]
fn hybrid_plan_many_chunks_back_to_back_on_the_proxy() {
    const TEST: &str = "hybrid_plan_many_chunks_back_to_back_on_the_proxy";
    if let Some(rank) = rank_of(TEST) {
        let comm = communicator();
        assert_staged_on_offhost(&comm);
        assert_plan(&comm, &["gpu"]);
        let n = 40_000;
        let dtype = DataType::F32;
        for call in 0..30u64 {
            let send = Buf::new(&comm, input(dtype, 90 + call, rank, n));
            let recv = Buf::zeros(&comm, n * 4);
            // SAFETY: n f32 each, kept until the synchronize.
            unsafe { comm.all_reduce(send.ptr(), recv.ptr(), n, dtype, ReduceOp::SUM) }
                .and_then(|()| comm.synchronize())
                .unwrap_or_else(|e| panic!("rank {rank}, call {call}: {e}"));
            assert!(
                recv.get() == reduced(dtype, ReduceOp::SUM, 90 + call, comm.world(), n),
                "rank {rank}, call {call}"
            );
        }
        println!("RANK OK");
        return;
    }
    with_offhost(Job::new(TEST, 5))
        .clusters(&[("gpu", "0"), ("cpu", "1-4")])
        .cluster_adaptors("gpu", "offhost", "offhost")
        .env("FERROCX_BRIDGE_PLAN", "hybrid=gpu")
        .env("TEST_BUFFERS", "device")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "2")
        .timeout_ms(5000)
        .run();
}

#[test]
fn a_rank_that_chose_another_plan_fails_alike_everywhere() {
    const TEST: &str = "a_rank_that_chose_another_plan_fails_alike_everywhere";
    if rank_of(TEST).is_some() {
        let comm = communicator();
        // Past one step (64 KiB) so that the plan runs.
        let n = 40_000;
        let send = Buf::new(&comm, input(DataType::F32, 5, comm.rank(), n));
        let recv = Buf::zeros(&comm, n * 4);
        // SAFETY: n f32 each, kept until the synchronize.
        let r = unsafe { comm.all_reduce(send.ptr(), recv.ptr(), n, DataType::F32, ReduceOp::SUM) }
            .and_then(|()| comm.synchronize());
        match r {
            Err(e) => println!("ERROR {e}"),
            Ok(()) => panic!("an all-reduce of two plans ran"),
        }
        println!("RANK OK");
        return;
    }
    // Rank 2 turned the reads in place off: it would publish its chunks and read the others'
    // slots, which they never write.
    let done = Job::new(TEST, 4)
        .clusters(&[("a", "0,1"), ("b", "2,3")])
        .env("TEST_BUFFERS", "device")
        .env_of(2, "FERROCX_BRIDGE_DIRECT", "0")
        .bridge_key("chunk_bytes", "65536")
        .timeout_ms(5000)
        .run();
    let errors: Vec<String> = done.iter().map(|f| f.lines("ERROR ").join("")).collect();
    println!("every rank: {}", errors[0]);
    for e in &errors {
        assert_eq!(e, &errors[0], "the same error on every rank: {errors:?}");
    }
    assert!(
        errors[0].contains("inputs read in place") && errors[0].contains("inputs published"),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].contains("rank 2 (cluster \"b\")") && errors[0].contains("FERROCX_BRIDGE_DIRECT"),
        "{}",
        errors[0]
    );
}
