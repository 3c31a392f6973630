//! Window collectives on the host backend, across real processes (the test executable re-run
//! once per rank, see `window_ranks`): one-shot, two-shot and ring all-reduce for every type
//! and op on 2, 3 and 4 ranks against references computed here from the inputs of every rank
//! (counter-based random data, so every rank can compute every rank's input without storing
//! it), sizes from 1 element to 64 MiB; 1000 calls back to back in one window with rank-skewed
//! delays, each result checked; a dead peer named within the timeout; routing by the cluster's
//! `small_message` keys.

mod window_ranks;

use std::time::{Duration, Instant};

use ferrocx::abi::{DataType, ReduceOp};
use ferrocx::comm::{CommError, Communicator};
use ferrocx::route::Route;
use ferrocx::window::collectives::{CollectiveError, WindowAlgo};
use window_ranks::all_gather::all_gather_cases;
use window_ranks::all_reduce::{
    back_to_back, check, every_type_op_and_algorithm, input, large, run_case, same_digests, Buffers,
};
use window_ranks::{communicator, host_ptr, host_ptr_mut, rank_of, Job, RouteLog};

fn window_comm() -> Communicator {
    ferrocx_kernels::link();
    communicator()
}

/// How far the router takes short point-to-point all-gathers onto the window on the host
/// backend (its measurement: not at all).
fn host_reach(world: usize) -> usize {
    ferrocx_kernels::select::host(world).all_gather_below
}

/// The host backend's chunk slot.
const CHUNK: usize = ferrocx_kernels::select::HOST_CHUNK;

#[test]
fn all_types_ops_algos_2_ranks() {
    const T: &str = "all_types_ops_algos_2_ranks";
    match rank_of(T) {
        Some(_) => every_type_op_and_algorithm(&window_comm(), T, CHUNK),
        None => same_digests(&Job::new(T, 2).run()),
    }
}

#[test]
fn all_types_ops_algos_3_ranks() {
    const T: &str = "all_types_ops_algos_3_ranks";
    match rank_of(T) {
        Some(_) => every_type_op_and_algorithm(&window_comm(), T, CHUNK),
        None => same_digests(&Job::new(T, 3).run()),
    }
}

#[test]
fn all_types_ops_algos_4_ranks() {
    const T: &str = "all_types_ops_algos_4_ranks";
    match rank_of(T) {
        Some(_) => every_type_op_and_algorithm(&window_comm(), T, CHUNK),
        None => same_digests(&Job::new(T, 4).run()),
    }
}

#[test]
fn sixty_four_mib_on_2_ranks() {
    const T: &str = "sixty_four_mib_on_2_ranks";
    match rank_of(T) {
        Some(_) => large(&window_comm(), T, CHUNK),
        None => same_digests(&Job::new(T, 2).run()),
    }
}

#[test]
fn sixty_four_mib_on_4_ranks() {
    const T: &str = "sixty_four_mib_on_4_ranks";
    match rank_of(T) {
        Some(_) => large(&window_comm(), T, CHUNK),
        None => same_digests(&Job::new(T, 4).run()),
    }
}

#[test]
fn calls_1000_back_to_back_2_ranks() {
    const T: &str = "calls_1000_back_to_back_2_ranks";
    match rank_of(T) {
        Some(_) => back_to_back(&window_comm(), T),
        None => drop(Job::new(T, 2).run()),
    }
}

#[test]
fn calls_1000_back_to_back_4_ranks() {
    const T: &str = "calls_1000_back_to_back_4_ranks";
    match rank_of(T) {
        Some(_) => back_to_back(&window_comm(), T),
        None => drop(Job::new(T, 4).run()),
    }
}

/// Rank 2 leaves after one call; ranks 0 and 1 call again, and fail within the timeout (1.5 s)
/// naming rank 2; every later call fails with that error.
#[test]
fn a_dead_peer_is_named_within_the_timeout() {
    const T: &str = "a_dead_peer_is_named_within_the_timeout";
    let Some(me) = rank_of(T) else {
        let out = Job::new(T, 3).env("FERROCX_TIMEOUT_MS", "1500").run();
        for f in &out[..2] {
            assert_eq!(f.lines("FAILED ").len(), 1, "{}", f.stdout);
        }
        return;
    };
    let comm = window_comm();
    let bufs = Buffers::new(&comm, 4096);
    run_case(
        &comm,
        &bufs,
        7,
        100,
        DataType::F32,
        ReduceOp::SUM,
        Some(WindowAlgo::OneShot),
        false,
        CHUNK,
    );
    comm.barrier().expect("barrier");
    if me == 2 {
        println!("RANK OK");
        return;
    }
    let start = Instant::now();
    // SAFETY: the buffers hold more than 100 f32 and outlive the synchronize below.
    unsafe {
        comm.all_reduce_window(
            bufs.send,
            bufs.recv,
            100,
            DataType::F32,
            ReduceOp::SUM,
            Some(WindowAlgo::TwoShot),
        )
    }
    .expect("enqueued");
    let e = comm.synchronize().expect_err("rank 2 is gone");
    let waited = start.elapsed();
    match &e {
        CommError::Collective(CollectiveError::PeerTimeout {
            algo, peer, what, ..
        }) => {
            assert_eq!(
                (*algo, *peer, what.as_str()),
                (WindowAlgo::TwoShot, 2, "its input")
            );
        }
        other => panic!("expected a peer timeout, got {other}"),
    }
    let text = e.to_string();
    assert!(text.contains("rank 2 did not signal its input"), "{text}");
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_millis(6000),
        "failed after {waited:?}"
    );
    // The window's rounds are out of step now: every later call fails at once, naming why.
    // SAFETY: as above.
    let again = unsafe {
        comm.all_reduce_window(
            bufs.send,
            bufs.recv,
            100,
            DataType::F32,
            ReduceOp::SUM,
            None,
        )
    }
    .expect_err("poisoned");
    assert!(
        matches!(&again, CommError::Collective(CollectiveError::Poisoned(inner)) if inner.to_string() == e.to_string()),
        "{again}"
    );
    println!("FAILED rank {me} after {waited:?}: {text}");
    println!("RANK OK");
}

/// `small_message = "window"` with thresholds: small all-reduces go to one-shot and two-shot,
/// larger ones and unsupported ops to the CCL, and all of them are right.
#[test]
fn small_messages_follow_the_cluster_keys() {
    const T: &str = "small_messages_follow_the_cluster_keys";
    let Some(_) = rank_of(T) else {
        drop(
            Job::new(T, 3)
                .cluster_key("small_message", "\"window\"")
                .cluster_key("window_one_shot_max", "256")
                .cluster_key("window_two_shot_max", "8192")
                .run(),
        );
        // The default on the host device (measured there) keeps the CCL.
        drop(Job::new(T, 2).run());
        return;
    };
    let comm = window_comm();
    let configured = std::fs::read_to_string(std::env::var("FERROCX_CONFIG").expect("config"))
        .expect("config")
        .contains("small_message");
    let route = |count, dtype| comm.all_reduce_route(count, dtype, ReduceOp::SUM);
    if configured {
        assert_eq!(route(64, DataType::F32), Route::Window(WindowAlgo::OneShot));
        assert_eq!(route(65, DataType::F32), Route::Window(WindowAlgo::TwoShot));
        assert_eq!(
            route(4096, DataType::BF16),
            Route::Window(WindowAlgo::TwoShot)
        );
        assert_eq!(route(2049, DataType::F32), Route::Ccl);
        assert_eq!(
            route(8, DataType::F64),
            Route::Ccl,
            "a type the window does not run"
        );
        assert_eq!(
            comm.all_reduce_route(8, DataType::F32, ReduceOp::PROD),
            Route::Ccl
        );
    } else {
        assert_eq!(route(8, DataType::F32), Route::Ccl);
    }
    let bufs = Buffers::new(&comm, 64 << 10);
    let dev = comm.device();
    for (case, count) in [(201u64, 1usize), (202, 64), (203, 1000), (204, 9000)] {
        let mine = input(case, comm.rank(), count, DataType::F32);
        // SAFETY: `bufs` holds 64 KiB per buffer, more than `count * 4`; `mine` holds `count` f32s.
        unsafe { dev.mem_copy(bufs.send, host_ptr(&mine), count * 4) }.expect("upload");
        // SAFETY: 64 KiB buffers hold `count` f32 and outlive the synchronize below.
        unsafe { comm.all_reduce(bufs.send, bufs.recv, count, DataType::F32, ReduceOp::MAX) }
            .expect("all_reduce");
        comm.synchronize().expect("synchronize");
        let mut got = vec![0u8; count * 4];
        // SAFETY: as above, after the synchronize; `got` holds `count * 4` bytes.
        unsafe { dev.mem_copy(host_ptr_mut(&mut got), bufs.recv, count * 4) }.expect("download");
        check(
            &got,
            0..count,
            case,
            comm.world(),
            count,
            DataType::F32,
            ReduceOp::MAX,
            WindowAlgo::OneShot,
        );
    }
    println!("RANK OK");
}

#[test]
fn all_gather_on_the_window_2_ranks() {
    const T: &str = "all_gather_on_the_window_2_ranks";
    match rank_of(T) {
        Some(_) => all_gather_cases(&window_comm(), T, CHUNK, host_reach(2)),
        None => drop(Job::new(T, 2).run()),
    }
}

#[test]
fn all_gather_on_the_window_3_ranks() {
    const T: &str = "all_gather_on_the_window_3_ranks";
    match rank_of(T) {
        Some(_) => all_gather_cases(&window_comm(), T, CHUNK, host_reach(3)),
        None => drop(Job::new(T, 3).run()),
    }
}

/// Rank 2 leaves after one gather; ranks 0 and 1 gather again and fail within the timeout
/// (1.5 s) naming rank 2 and what it did not send.
#[test]
fn a_dead_peer_of_a_window_all_gather_is_named() {
    const T: &str = "a_dead_peer_of_a_window_all_gather_is_named";
    let Some(me) = rank_of(T) else {
        let out = Job::new(T, 3).env("FERROCX_TIMEOUT_MS", "1500").run();
        for f in &out[..2] {
            assert_eq!(f.lines("FAILED ").len(), 1, "{}", f.stdout);
        }
        return;
    };
    let comm = window_comm();
    let bufs = Buffers::new(&comm, 3 * 400);
    let gather = || {
        // SAFETY: the buffers hold 3 * 100 f32 and outlive the synchronize below.
        unsafe {
            comm.call()
                .via(Route::Window(WindowAlgo::OneShot))
                .all_gather_p2p(bufs.send, bufs.recv, 100, DataType::F32, 1)
        }
        .expect("enqueued")
    };
    let h = gather();
    h.synchronize().expect("first gather");
    drop(h);
    comm.barrier().expect("barrier");
    if me == 2 {
        println!("RANK OK");
        return;
    }
    let start = Instant::now();
    let h = gather();
    let e = h.synchronize().err();
    drop(h);
    let e = e.unwrap_or_else(|| comm.synchronize().expect_err("rank 2 is gone"));
    let waited = start.elapsed();
    let text = e.to_string();
    assert!(
        text.contains("rank 2 did not signal its all-gather input"),
        "{text}"
    );
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_millis(6000),
        "failed after {waited:?}"
    );
    println!("FAILED rank {me} after {waited:?}: {text}");
    println!("RANK OK");
}

/// `FERROCX_ALL_GATHER_WINDOW_BELOW` overrides the measurement: with 2 MiB, the router takes
/// every all-gather below 2 MiB of output onto the window on the host backend too, the plain
/// `all_gather` as `all_gather_p2p` (its span names the route).
#[test]
fn the_window_all_gather_reach_follows_the_environment() {
    const T: &str = "the_window_all_gather_reach_follows_the_environment";
    if rank_of(T).is_none() {
        drop(
            Job::new(T, 2)
                .env(ferrocx::comm::ALL_GATHER_WINDOW_BELOW_ENV, "2097152")
                .run(),
        );
        return;
    }
    let log = RouteLog::default();
    let comm = window_comm();
    log.capture(|| all_gather_cases(&comm, T, CHUNK, 2 << 20));
    let text = log.text();
    // 1000 f32 a rank (8000 bytes of output): every call on the window, the router's too; a
    // full slot (2 MiB of output): the router's on the CCL.
    let span = |bytes: usize, route: &str| {
        format!("op=\"all_gather\" bytes={bytes} dtype=\"f32\" route={route}")
    };
    assert!(text.contains(&span(4000, "window one-shot")), "{text}");
    assert!(!text.contains(&span(4000, "ccl")), "{text}");
    assert!(text.contains(&span(CHUNK, "ccl")), "{text}");
}
