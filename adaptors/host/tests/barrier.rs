//! A one-word all-reduce (the core's barrier on the host CCL) completes on no rank before every
//! rank has called it, whichever way it runs: on the calling thread (the fast path, on by
//! default where each rank has a core), handed over to the stream's worker when a peer is late,
//! or on the worker throughout. Each round one rank (a different one each time) is late; it
//! creates a marker file just before its call, and every other rank checks, once its stream
//! is synchronized, that the marker exists and that the word is the sum of every rank's random
//! value. Many back-to-back words without synchronization follow, checked at the end.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{assert_all_ok, comm, host, spawn, wait, worker, Rng};
use ferrocx::abi::{DataType, DevicePtr, ReduceOp};

/// Rounds with a late rank.
const ROUNDS: usize = 9;

/// Rank `r`'s value of round `k` (a small integer, so that float sums are exact).
fn value(seed: u64, k: usize, r: usize) -> f32 {
    Rng::new(seed ^ ((k as u64) << 20), r as u64).range(-1000, 1000) as f32
}

fn marker(dir: &Path, k: usize) -> PathBuf {
    dir.join(format!("arrived-{k}"))
}

fn run_worker(rank: usize, world: usize) {
    let (dev, ccl) = host();
    let c = comm(&ccl, rank, world, 60_000);
    let s = dev.stream_create().unwrap();
    let dir = PathBuf::from(std::env::var("FERROCX_TEST_MARKER").expect("marker dir"));
    let seed: u64 = std::env::var("FERROCX_TEST_SEED").unwrap().parse().unwrap();
    let mut word = [0f32; 1];
    for k in 0..ROUNDS {
        let late = k % world;
        if rank == late {
            // Late by far more than any inline budget, then by less than one.
            std::thread::sleep(Duration::from_millis(if k < world { 150 } else { 2 }));
            std::fs::write(marker(&dir, k), b"").unwrap();
        }
        word[0] = value(seed, k, rank);
        let p = DevicePtr(word.as_mut_ptr() as u64);
        // SAFETY: `word` holds one f32 and is read only after the stream is synchronized.
        unsafe { ccl.all_reduce(p, p, 1, DataType::F32, ReduceOp::SUM, c, s) }.unwrap();
        dev.stream_synchronize(s).unwrap();
        assert!(
            marker(&dir, k).exists(),
            "rank {rank}, round {k}: the barrier completed before rank {late} called it"
        );
        let want: f32 = (0..world).map(|r| value(seed, k, r)).sum();
        assert_eq!(word[0], want, "rank {rank}, round {k}");
    }
    // Back to back: each call's input is the previous call's output.
    let calls = 500;
    word[0] = value(seed, ROUNDS, rank);
    let p = DevicePtr(word.as_mut_ptr() as u64);
    for _ in 0..calls {
        // SAFETY: as above; every call is in place on the same word, in stream order.
        unsafe { ccl.all_reduce(p, p, 1, DataType::F32, ReduceOp::MAX, c, s) }.unwrap();
    }
    dev.stream_synchronize(s).unwrap();
    let want = (0..world)
        .map(|r| value(seed, ROUNDS, r))
        .fold(f32::MIN, f32::max);
    assert_eq!(word[0], want, "rank {rank}: back to back");
    ccl.comm_finalize(c).unwrap();
    ccl.comm_destroy(c).unwrap();
    dev.stream_destroy(s).unwrap();
}

#[test]
fn barrier_worker() {
    if let Some((rank, world)) = worker("barrier_worker") {
        run_worker(rank, world);
    }
}

fn on(n: usize, env: &[(&str, &str)]) {
    let dir = std::env::temp_dir().join(format!(
        "ferrocx-barrier-{}-{n}-{}",
        std::process::id(),
        env.iter().map(|(_, v)| *v).collect::<Vec<_>>().join("-")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let seed = ferrocx_test_support::fresh_seed();
    let mut extra: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
    extra.push(("FERROCX_TEST_MARKER", dir.display().to_string()));
    extra.push(("FERROCX_TEST_SEED", seed.to_string()));
    let outcomes = wait(spawn("barrier_worker", n, &extra), Duration::from_secs(300));
    let _ = std::fs::remove_dir_all(&dir);
    assert_all_ok(&outcomes);
}

#[test]
fn a_barrier_waits_for_every_rank_on_2_ranks() {
    on(2, &[]);
}

#[test]
fn a_barrier_waits_for_every_rank_inline_with_a_long_budget() {
    on(3, &[("FERROCX_HOST_INLINE_US", "200000")]);
}

#[test]
fn a_barrier_waits_for_every_rank_on_the_worker() {
    on(4, &[("FERROCX_HOST_INLINE_US", "0")]);
}
