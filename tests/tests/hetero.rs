//! Jobs across clusters, as real processes (see `window_ranks`): clusters of 2+3 ranks with
//! non-contiguous rank lists and of 1+1+2 ranks, every collective on random data against
//! references computed here from every rank's input (counter-based, so every rank can compute
//! every rank's input), odd counts, f32/bf16/i32, sum and max; a count that differs across
//! clusters fails alike on every rank; a rank killed mid-collective is named with its cluster
//! on every other rank within the timeout; nothing is left in /dev/shm.
//!
//! Every cluster runs the host device and the host CCL here (one adaptor pair built in); a
//! second device adaptor with memory of its own is not part of these tests yet.

mod window_ranks;

use std::time::{Duration, Instant};

use ferrocx::abi::{DataType, DevicePtr, ReduceOp};
use ferrocx::comm::{CommError, Communicator};
use ferrocx::half::f32_to_bf16;
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
                let send = input(dtype, seed, me, n);
                let recv = vec![0u8; n * es];
                // SAFETY: host memory of n elements each, kept until the synchronize.
                unsafe { comm.all_reduce(ptr(&send), ptr(&recv), n, dtype, op) }
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                sync(comm, &what);
                assert!(recv == reduced(dtype, op, seed, w, n), "rank {me}: {what}");
                // In place.
                let buf = input(dtype, seed, me, n);
                // SAFETY: as above.
                unsafe { comm.all_reduce(ptr(&buf), ptr(&buf), n, dtype, op) }
                    .unwrap_or_else(|e| panic!("{what} in place: {e}"));
                sync(comm, &what);
                assert!(
                    buf == reduced(dtype, op, seed, w, n),
                    "rank {me}: {what} in place"
                );
            }
            seed += 1;
            // reduce to a root of each cluster, with sum.
            for root in [1, w - 1] {
                let send = input(dtype, seed, me, n);
                let recv = vec![0u8; n * es];
                // SAFETY: as above.
                unsafe { comm.reduce(ptr(&send), ptr(&recv), n, dtype, ReduceOp::SUM, root) }
                    .expect("reduce");
                sync(comm, "reduce");
                if me == root {
                    assert!(
                        recv == reduced(dtype, ReduceOp::SUM, seed, w, n),
                        "rank {me}: reduce of {n} {dtype:?}"
                    );
                }
            }
            // broadcast from a root of each cluster.
            for root in [0, w - 1] {
                let send = input(dtype, seed, me, n);
                let recv = vec![0u8; n * es];
                // SAFETY: as above.
                unsafe { comm.broadcast(ptr(&send), ptr(&recv), n, dtype, root) }
                    .expect("broadcast");
                sync(comm, "broadcast");
                assert!(
                    recv == input(dtype, seed, root, n),
                    "rank {me}: broadcast from {root}"
                );
            }
            // all_gather and gather.
            let send = input(dtype, seed, me, n);
            let all: Vec<u8> = (0..w).flat_map(|r| input(dtype, seed, r, n)).collect();
            let recv = vec![0u8; w * n * es];
            // SAFETY: n and w * n elements.
            unsafe { comm.all_gather(ptr(&send), ptr(&recv), n, dtype) }.expect("all_gather");
            sync(comm, "all_gather");
            assert!(recv == all, "rank {me}: all_gather of {n} {dtype:?}");
            let recv = vec![0u8; w * n * es];
            // SAFETY: as above.
            unsafe { comm.gather(ptr(&send), ptr(&recv), n, dtype, 2) }.expect("gather");
            sync(comm, "gather");
            if me == 2 {
                assert!(recv == all, "rank {me}: gather of {n} {dtype:?}");
            }
            // reduce_scatter: block b of rank r's input is input(seed + b, r).
            let blocks = |r: usize| -> Vec<u8> {
                (0..w)
                    .flat_map(|b| input(dtype, seed * 31 + b as u64, r, n))
                    .collect()
            };
            let send = blocks(me);
            let recv = vec![0u8; n * es];
            // SAFETY: w * n and n elements.
            unsafe { comm.reduce_scatter(ptr(&send), ptr(&recv), n, dtype, ReduceOp::SUM) }
                .expect("reduce_scatter");
            sync(comm, "reduce_scatter");
            assert!(
                recv == reduced(dtype, ReduceOp::SUM, seed * 31 + me as u64, w, n),
                "rank {me}: reduce_scatter of {n} {dtype:?}"
            );
            // all_to_all: my block b goes to rank b.
            let recv = vec![0u8; w * n * es];
            // SAFETY: w * n elements each.
            unsafe { comm.all_to_all(ptr(&send), ptr(&recv), n, dtype) }.expect("all_to_all");
            sync(comm, "all_to_all");
            let expect: Vec<u8> = (0..w)
                .flat_map(|r| input(dtype, seed * 31 + me as u64, r, n))
                .collect();
            assert!(recv == expect, "rank {me}: all_to_all of {n} {dtype:?}");
            // scatter from the last rank.
            let root = w - 1;
            let recv = vec![0u8; n * es];
            // SAFETY: w * n (root) and n elements.
            unsafe { comm.scatter(ptr(&send), ptr(&recv), n, dtype, root) }.expect("scatter");
            sync(comm, "scatter");
            assert!(
                recv == input(dtype, seed * 31 + me as u64, root, n),
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
    let send: Vec<u8> = (0..w)
        .flat_map(|d| input(dtype, 900 + d as u64, me, count(me, d)))
        .collect();
    let recv = vec![0u8; recv_counts.iter().sum::<usize>() * 4];
    // SAFETY: the arrays describe both buffers.
    unsafe {
        comm.all_to_allv(
            ptr(&send),
            &send_counts,
            &sd,
            ptr(&recv),
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
    assert!(recv == expect, "rank {me}: all_to_allv");
}

/// Each rank sends to the next and receives from the previous (across clusters and inside
/// them), in a group; sizes above one channel chunk.
fn point_to_point(comm: &Communicator) {
    let me = comm.rank();
    let w = comm.world();
    let n = 3001;
    let dtype = DataType::F32;
    let send = input(dtype, 77, me, n);
    let recv = vec![0u8; n * 4];
    let (next, prev) = ((me + 1) % w, (me + w - 1) % w);
    comm.group(|| {
        // SAFETY: n elements each, kept until the synchronize.
        unsafe {
            comm.send(ptr(&send), n, dtype, next)?;
            comm.recv(ptr(&recv), n, dtype, prev)
        }
    })
    .expect("send/recv");
    sync(comm, "send/recv");
    assert!(
        recv == input(dtype, 77, prev, n),
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
    Job::new("two_plus_three_ranks_every_collective", 5)
        .clusters(&[("a", "0,2"), ("b", "1,3,4")])
        .bridge_key("ccl", "\"host\"")
        .bridge_key("chunk_bytes", "4096")
        .bridge_key("depth", "2")
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
    let done = Job::new(TEST, 4)
        .clusters(&[("a", "0"), ("b", "1"), ("c", "2,3")])
        .timeout_ms(3000)
        .may_die(3)
        .run();
    for f in done.iter().filter(|f| f.rank != 3) {
        let e = f.lines("ERROR ").join("");
        assert!(e.contains("rank 3 (cluster \"c\")"), "rank {}: {e}", f.rank);
        let took: u64 = f.lines("TOOK ").join("").parse().expect("a time");
        println!("rank {} after {took} ms: {e}", f.rank);
        assert!(took < 3000 + 2000, "rank {} took {took} ms", f.rank);
    }
}

#[test]
fn mpi_bridge_is_refused_at_init_with_the_key() {
    const TEST: &str = "mpi_bridge_is_refused_at_init_with_the_key";
    if rank_of(TEST).is_some() {
        ferrocx_adaptor_host::link();
        let e = Communicator::from_env().err().expect("refused");
        let s = e.to_string();
        assert!(
            s.contains("bridge.ccl") && s.contains("not available yet"),
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
