//! Faults and stress on the host CCL: a rank killed in the middle of an all-reduce, a rank
//! that calls with a different count, an abort, and 100 000 back-to-back synchronising
//! all-reduces.

mod common;

use std::time::{Duration, Instant};

use common::{assert_all_ok, comm, host, spawn, wait, worker};
use ferrocx::abi::{DataType, DevicePtr, ReduceOp, Status};

fn p<T>(v: &[T]) -> DevicePtr {
    DevicePtr(v.as_ptr() as u64)
}

/// The address of a buffer the adaptor writes (the host device addresses process memory).
fn pm<T>(v: &mut [T]) -> DevicePtr {
    DevicePtr(v.as_mut_ptr() as u64)
}

fn leftover_segments(job: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("ferrocx-{job}-")))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn killed_rank_worker() {
    let Some((rank, world)) = worker("killed_rank_worker") else {
        return;
    };
    let (dev, ccl) = host();
    let c = comm(&ccl, rank, world, 10_000);
    let s = dev.stream_create().unwrap();
    let n = 1 << 20;
    let send = vec![1.0f32; n];
    let mut recv = vec![0.0f32; n];
    // Two good rounds, then rank 2 dies while the others are inside the third.
    for _ in 0..2 {
        // SAFETY: `send` and `recv` hold `n` f32s (the host device addresses this process's
        // memory); `recv` is read after the stream is synchronized.
        unsafe {
            ccl.all_reduce(
                p(&send),
                pm(&mut recv),
                n,
                DataType::F32,
                ReduceOp::SUM,
                c,
                s,
            )
        }
        .unwrap();
        dev.stream_synchronize(s).unwrap();
        assert_eq!(recv[n - 1], world as f32);
    }
    if rank == 2 {
        std::thread::sleep(Duration::from_millis(50));
        // SAFETY: raise only sends this process a signal; it never returns.
        unsafe { libc::raise(libc::SIGKILL) };
    }
    let start = Instant::now();
    // SAFETY: as above: the synchronize below waits for it, failed or not.
    unsafe {
        ccl.all_reduce(
            p(&send),
            pm(&mut recv),
            n,
            DataType::F32,
            ReduceOp::SUM,
            c,
            s,
        )
    }
    .unwrap();
    let err = dev.stream_synchronize(s).expect_err("the peer died");
    let took = start.elapsed();
    let msg = err.to_string();
    assert_eq!(err.status(), Status::PEER_FAILURE, "{msg}");
    assert!(msg.contains("rank 2"), "{msg}");
    assert!(
        took < Duration::from_secs(10),
        "noticed after {took:?}, beyond the 10 s timeout"
    );
    // The communicator stays broken: a later call fails at once with the same cause.
    // SAFETY: as above.
    unsafe {
        ccl.all_reduce(
            p(&send),
            pm(&mut recv),
            n,
            DataType::F32,
            ReduceOp::SUM,
            c,
            s,
        )
    }
    .unwrap();
    let again = dev.stream_synchronize(s).expect_err("broken");
    assert!(again.to_string().contains("rank 2"), "{again}");
    assert_eq!(ccl.comm_async_error(c).unwrap(), Status::PEER_FAILURE);
    println!(
        "rank {rank}: noticed the dead peer after {} ms",
        took.as_millis()
    );
}

#[test]
fn a_rank_killed_mid_all_reduce_is_named_by_every_other_rank() {
    let children = spawn("killed_rank_worker", 4, &[]);
    let job = format!("test-{}-killed_rank_worker", std::process::id());
    let outcomes = wait(children, Duration::from_secs(120));
    for o in &outcomes {
        if o.rank == 2 {
            assert_eq!(o.code, None, "rank 2 was killed by a signal:\n{}", o.output);
        } else {
            assert_eq!(o.code, Some(0), "rank {}:\n{}", o.rank, o.output);
            assert!(o.output.contains("noticed the dead peer"), "{}", o.output);
        }
    }
    assert!(
        leftover_segments(&job).is_empty(),
        "left behind: {:?}",
        leftover_segments(&job)
    );
}

#[test]
fn mismatch_worker() {
    let Some((rank, world)) = worker("mismatch_worker") else {
        return;
    };
    let (dev, ccl) = host();
    let c = comm(&ccl, rank, world, 10_000);
    let s = dev.stream_create().unwrap();
    let count = if rank == 1 { 100 } else { 80 };
    let send = vec![1i32; 100];
    let mut recv = vec![0i32; 100];
    // SAFETY: `send` and `recv` hold 100 i32s, at least `count` (the host device addresses this
    // process's memory); `recv` is read after the stream is synchronized.
    unsafe {
        ccl.all_reduce(
            p(&send),
            pm(&mut recv),
            count,
            DataType::I32,
            ReduceOp::SUM,
            c,
            s,
        )
    }
    .unwrap();
    let err = dev.stream_synchronize(s).expect_err("counts differ");
    let msg = err.to_string();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{msg}");
    assert!(msg.contains("ranks disagree"), "{msg}");
    assert!(msg.contains("rank 1: all_reduce count 100"), "{msg}");
    assert!(msg.contains("count 80"), "{msg}");
    assert!(recv.iter().all(|&x| x == 0), "no partial result is written");
    println!("rank {rank}: {msg}");
}

#[test]
fn a_rank_with_a_different_count_gets_a_clear_error_on_every_rank() {
    let outcomes = wait(spawn("mismatch_worker", 3, &[]), Duration::from_secs(60));
    assert_all_ok(&outcomes);
}

#[test]
fn tiny_broadcast_mismatch_worker() {
    let Some((rank, world)) = worker("tiny_broadcast_mismatch_worker") else {
        return;
    };
    let case = std::env::var("FERROCX_TEST_CASE").unwrap();
    let (dev, ccl) = host();
    let c = comm(&ccl, rank, world, 5_000);
    let s = dev.stream_create().unwrap();
    let send = [3.0f32, 4.0];
    let mut recv = [0.0f32; 2];
    // Rank 0 is the root of a tiny broadcast (2 f32, which rides in its tiny record); rank 1
    // calls an all-reduce ("all_reduce"), or a broadcast of one element ("count"). Or the
    // other way round ("reverse"): rank 0 calls the all-reduce, rank 1 the tiny broadcast.
    let reverse = case == "reverse";
    // SAFETY: `send` and `recv` hold 2 f32s (the host device addresses this process's memory)
    // and are read after the stream is synchronized.
    unsafe {
        match (rank, case.as_str()) {
            (0, "reverse") | (1, "all_reduce") => ccl.all_reduce(
                p(&send),
                pm(&mut recv),
                2,
                DataType::F32,
                ReduceOp::SUM,
                c,
                s,
            ),
            (0, _) | (1, "reverse") => {
                ccl.broadcast(p(&send), pm(&mut recv), 2, DataType::F32, 0, c, s)
            }
            _ => ccl.broadcast(p(&send), pm(&mut recv), 1, DataType::F32, 0, c, s),
        }
    }
    .unwrap();
    let done = dev.stream_synchronize(s);
    if rank == 0 && !reverse {
        // The root publishes and goes on, as an eager send does: its call is complete.
        done.unwrap();
        assert_eq!(recv, send);
        return;
    }
    let err = done.expect_err("the calls differ");
    let msg = err.to_string();
    assert_eq!(err.status(), Status::INVALID_ARGUMENT, "{msg}");
    assert!(msg.contains("ranks disagree"), "{msg}");
    let (bcast, other) = match case.as_str() {
        "all_reduce" => ("rank 0: broadcast count 2", "rank 1: all_reduce count 2"),
        "count" => ("rank 0: broadcast count 2", "rank 1: broadcast count 1"),
        _ => ("rank 1: broadcast count 2", "rank 0: all_reduce count 2"),
    };
    assert!(
        msg.contains(&format!("{bcast} dtype f32 op sum root 0")),
        "{msg}"
    );
    assert!(msg.contains(other), "{msg}");
    assert_eq!(recv, [0.0; 2], "no partial result is written");
    println!("rank {rank}: {msg}");
}

#[test]
fn a_call_beside_a_tiny_broadcast_gets_a_clear_error_naming_both() {
    for case in ["all_reduce", "count", "reverse"] {
        let outcomes = wait(
            spawn(
                "tiny_broadcast_mismatch_worker",
                2,
                &[("FERROCX_TEST_CASE", case.to_string())],
            ),
            Duration::from_secs(60),
        );
        assert_all_ok(&outcomes);
    }
}

#[test]
fn abort_worker() {
    let Some((rank, world)) = worker("abort_worker") else {
        return;
    };
    let (dev, ccl) = host();
    let c = comm(&ccl, rank, world, 20_000);
    let s = dev.stream_create().unwrap();
    let send = vec![1i32; 10];
    let mut recv = vec![0i32; 10];
    if rank == 0 {
        // Rank 0 never joins: it aborts while the others wait in the all-reduce.
        std::thread::sleep(Duration::from_millis(300));
        ccl.comm_abort(c).unwrap();
        return;
    }
    let start = Instant::now();
    // SAFETY: `send` and `recv` hold 10 i32s (the host device addresses this process's memory); the
    // stream is synchronized before they drop.
    unsafe {
        ccl.all_reduce(
            p(&send),
            pm(&mut recv),
            10,
            DataType::I32,
            ReduceOp::SUM,
            c,
            s,
        )
    }
    .unwrap();
    let err = dev.stream_synchronize(s).expect_err("aborted");
    assert_eq!(err.status(), Status::ABORTED, "{err}");
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn abort_unblocks_pending_operations_of_every_rank() {
    let outcomes = wait(spawn("abort_worker", 3, &[]), Duration::from_secs(60));
    assert_all_ok(&outcomes);
}

#[test]
fn barrier_worker() {
    let Some((rank, world)) = worker("barrier_worker") else {
        return;
    };
    let (dev, ccl) = host();
    let c = comm(&ccl, rank, world, 60_000);
    let s = dev.stream_create().unwrap();
    const TOTAL: usize = 100_000;
    const BATCH: usize = 1000;
    let send: Vec<i32> = (0..BATCH as i32).collect();
    let mut recv = vec![0i32; BATCH];
    for b in 0..TOTAL / BATCH {
        // Each all-reduce of one element is a full synchronisation of the ranks; its value
        // proves no rank skipped or repeated a generation.
        for i in 0..BATCH {
            // SAFETY: element `i` of `send` and `recv` (the host device addresses this process's
            // memory); `recv` is read after the stream is synchronized.
            unsafe {
                ccl.all_reduce(
                    p(&send[i..]),
                    pm(&mut recv[i..]),
                    1,
                    DataType::I32,
                    ReduceOp::SUM,
                    c,
                    s,
                )
            }
            .unwrap();
        }
        dev.stream_synchronize(s)
            .unwrap_or_else(|e| panic!("rank {rank} batch {b}: {e}"));
        for (i, r) in recv.iter_mut().enumerate() {
            assert_eq!(*r, i as i32 * world as i32, "batch {b} op {i}");
            *r = 0;
        }
    }
}

#[test]
fn one_hundred_thousand_back_to_back_barriers_on_4_ranks() {
    let outcomes = wait(spawn("barrier_worker", 4, &[]), Duration::from_secs(600));
    assert_all_ok(&outcomes);
}
