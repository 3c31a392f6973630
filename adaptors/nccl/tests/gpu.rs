//! On a machine with NVIDIA GPUs and libnccl (found as the adaptor finds it: the loader's path
//! or `FERROCX_NCCL_LIBRARY`): the watchdog against the real driver and NCCL. Every test
//! returns early, printing "skipped: …", where no CUDA driver or libnccl loads or too few GPUs
//! are present. Multicast stays off (the adaptor keeps `NCCL_NVLS_ENABLE=0`).
//!
//! The two-rank test re-runs this executable twice on itself (`--exact child_rank`), with
//! `FERROCX_NCCL_TEST_ROLE` giving the rank; this process makes the unique id (and so hosts
//! NCCL's bootstrap root) and waits for both.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ferrocx_adaptor_cuda::CudaDevice;
use ferrocx_adaptor_nccl::NcclCcl;
use ferrocx_plugin_sdk::abi::{Comm, DataType, DevicePtr, MemKind, ReduceOp, Status, Stream};
use ferrocx_plugin_sdk::{CclAdaptor, CclWindow, CommInit, DeviceAdaptor, Options};
use ferrocx_test_support::{hex, unhex};

const ROLE: &str = "FERROCX_NCCL_TEST_ROLE";
const UID: &str = "FERROCX_NCCL_TEST_UID";
const DONE: &str = "FERROCX_NCCL_TEST_DONE";
/// The communicators' deadline in the abort test.
const TIMEOUT: Duration = Duration::from_millis(3_000);
/// The slack the watchdog's error may take past the deadline.
const GRACE: Duration = Duration::from_secs(3);

/// The CUDA adaptor and NCCL, initialised, when this machine has a driver, libnccl and at least
/// `gpus` GPUs; `None` (test skipped) otherwise.
fn gpus(gpus: i32) -> Option<(&'static CudaDevice, &'static NcclCcl)> {
    if !ferrocx_adaptor_cuda::is_present() {
        println!("skipped: no CUDA driver");
        return None;
    }
    let dev = CudaDevice::instance();
    dev.init(&Options::default()).expect("CUDA adaptor init");
    let n = dev.device_count().expect("device_count");
    if n < gpus {
        println!("skipped: {n} GPU(s), the test needs {gpus}");
        return None;
    }
    let ccl = NcclCcl::instance();
    if let Err(e) = ccl.init(&Options::default()) {
        println!("skipped: {}", e.message());
        return None;
    }
    Some((dev, ccl))
}

fn init_args(rank: i32, nranks: i32, uid: &[u8], timeout: Duration, opts: Options) -> CommInit<'_> {
    CommInit {
        rank,
        nranks,
        device: rank,
        unique_id: uid,
        timeout_ms: timeout.as_millis() as u64,
        options: opts,
    }
}

/// `n` i32 elements of device memory holding `value`.
fn filled(dev: &CudaDevice, n: usize, value: i32) -> DevicePtr {
    let p = dev.mem_alloc(4 * n, MemKind::DEVICE).expect("mem_alloc");
    let mut host: Vec<i32> = vec![value; n];
    dev.mem_copy(p, DevicePtr(host.as_mut_ptr() as u64), 4 * n)
        .expect("upload");
    p
}

fn download(dev: &CudaDevice, p: DevicePtr, n: usize) -> Vec<i32> {
    let mut host: Vec<i32> = vec![0; n];
    dev.mem_copy(DevicePtr(host.as_mut_ptr() as u64), p, 4 * n)
        .expect("download");
    host
}

/// Waits until the watchdog has seen every operation of `comm` complete.
fn drained(ccl: &NcclCcl, comm: Comm) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if ccl.watchdog_outstanding(comm) == Some(0) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

fn all_reduce(ccl: &NcclCcl, b: DevicePtr, n: usize, comm: Comm, s: Stream) -> Result<(), String> {
    ccl.all_reduce(b, b, n, DataType::I32, ReduceOp::SUM, comm, s)
        .map_err(|e| format!("{e:?}"))
}

#[test]
fn one_rank_watchdog_bookkeeping_groups_and_enqueue_cost() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let Some((dev, ccl)) = gpus(1) else { return };
    dev.set_device(0).expect("set_device");
    let uid = ccl.unique_id().expect("unique id");
    let comm = ccl
        .comm_init_rank(&init_args(0, 1, &uid, TIMEOUT, Options::default()))
        .expect("one-rank communicator");
    let off = ccl
        .comm_init_rank(&init_args(
            0,
            1,
            &ccl.unique_id().expect("unique id"),
            TIMEOUT,
            Options::new(vec![("watchdog".into(), "off".into())]),
        ))
        .expect("unwatched communicator");
    assert_eq!(ccl.watchdog_outstanding(comm), Some(0), "watched, idle");
    assert_eq!(ccl.watchdog_outstanding(off), None, "`watchdog = off`");
    let s = dev.stream_create(0).expect("stream");
    let n = 2;
    let b = filled(dev, n, 3);

    // Many operations: each tracked, all retired once they complete.
    const CALLS: usize = 2_000;
    let time = |c: Comm| {
        let start = Instant::now();
        for _ in 0..CALLS {
            all_reduce(ccl, b, n, c, s).expect("all_reduce");
        }
        let per_call = start.elapsed() / CALLS as u32;
        dev.stream_synchronize(s).expect("synchronize");
        per_call
    };
    let (watched, unwatched) = (time(comm), time(off));
    let (watched2, unwatched2) = (time(comm), time(off));
    println!(
        "host time per 8-byte all_reduce call (1 rank): watchdog on {:?} / {:?}, off {:?} / {:?}",
        watched, watched2, unwatched, unwatched2
    );
    assert!(drained(ccl, comm), "every operation retired");
    assert_eq!(
        download(dev, b, n),
        vec![3; n],
        "one rank: the sum is itself"
    );

    // A group records one event at its end, for every operation in it.
    ccl.group_start().expect("group_start");
    for _ in 0..3 {
        all_reduce(ccl, b, n, comm, s).expect("grouped all_reduce");
    }
    assert_eq!(
        ccl.watchdog_outstanding(comm),
        Some(0),
        "nothing recorded before the group ends"
    );
    ccl.group_end().expect("group_end");
    dev.stream_synchronize(s).expect("synchronize");
    assert!(drained(ccl, comm), "the group's event retired");
    assert_eq!(
        ccl.comm_async_error(comm).expect("async error"),
        Status::SUCCESS
    );

    // Captured into a CUDA graph: the watchdog's record is a capture-time record, so the
    // capture stays valid, the graph holds the collective alone, and the watchdog drops the
    // event (its query answers CUDA_ERROR_CAPTURED_EVENT) without an error.
    use ferrocx_plugin_sdk::DeviceGraph;
    let c = filled(dev, n, 5);
    let o = filled(dev, n, 0);
    dev.graph_begin_capture(s).expect("begin capture");
    let captured = ccl.all_reduce(c, o, n, DataType::I32, ReduceOp::SUM, comm, s);
    let graph = dev.graph_end_capture(s).expect("the capture stays valid");
    captured.expect("all_reduce while capturing");
    assert_eq!(
        download(dev, o, n),
        vec![0; n],
        "nothing ran while capturing"
    );
    assert!(drained(ccl, comm), "the captured record is dropped");
    dev.graph_launch(graph, s).expect("graph launch");
    dev.stream_synchronize(s).expect("synchronize");
    assert_eq!(
        download(dev, o, n),
        vec![5; n],
        "the graph ran the collective"
    );
    assert_eq!(
        ccl.comm_async_error(comm).expect("async error"),
        Status::SUCCESS,
        "the captured event is no failure"
    );
    // An eager call on the same stream is watched again.
    all_reduce(ccl, b, n, comm, s).expect("all_reduce after the graph");
    dev.stream_synchronize(s).expect("synchronize");
    assert!(drained(ccl, comm), "watched and retired");
    dev.graph_destroy(graph).expect("graph_destroy");
    dev.mem_free(c, MemKind::DEVICE).expect("free");
    dev.mem_free(o, MemKind::DEVICE).expect("free");

    // The window group: registered where libnccl has it (>= 2.27), else UNSUPPORTED naming
    // the missing symbol.
    let version = ccl.version().expect("version");
    let bytes = 1 << 21;
    match ccl.mem_alloc(bytes) {
        Ok(p) => {
            let flags = ccl
                .window_register(comm, p, bytes, 1 << 31)
                .expect_err("not an NCCL flag");
            assert_eq!(flags.status(), Status::INVALID_ARGUMENT);
            // 1: NCCL_WIN_COLL_SYMMETRIC.
            match ccl.window_register(comm, p, bytes, 1) {
                Ok(w) => {
                    assert!(version >= 22_700, "{version}");
                    assert!(!w.is_null());
                    ccl.window_deregister(comm, w).expect("window_deregister");
                    println!("window registered and deregistered (NCCL {version})");
                }
                Err(e) => {
                    assert_eq!(e.status(), Status::UNSUPPORTED, "{e:?}");
                    if version < 22_700 {
                        assert!(e.message().contains("(needs 2.27)"), "{e:?}");
                    }
                    println!("window_register: {}", e.message());
                }
            }
            ccl.mem_free(p).expect("mem_free");
        }
        Err(e) => println!("mem_alloc: {}", e.message()),
    }

    ccl.comm_destroy(off).expect("destroy");
    ccl.comm_destroy(comm).expect("destroy");
    let gone = ccl.comm_destroy(comm).expect_err("destroyed once");
    assert_eq!(gone.status(), Status::INVALID_HANDLE);
    dev.mem_free(b, MemKind::DEVICE).expect("free");
    dev.stream_destroy(s).expect("stream_destroy");
}

/// Starts rank `rank` of the abort test, its output going to `log`.
fn spawn(rank: usize, uid: &str, done: &Path, log: &Path) -> Child {
    let out = File::create(log).expect("rank log");
    let err = out.try_clone().expect("rank log");
    Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", "child_rank", "--nocapture", "--test-threads=1"])
        .env(ROLE, rank.to_string())
        .env(UID, uid)
        .env(DONE, done)
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("spawn a rank")
}

#[test]
fn a_peer_that_aborts_becomes_the_watchdogs_error_within_the_timeout() {
    if std::env::var_os(ROLE).is_some() {
        return;
    }
    let Some((_, ccl)) = gpus(2) else { return };
    // This process hosts NCCL's bootstrap root for the two ranks.
    let uid = hex(&ccl.unique_id().expect("unique id"));
    let dir = std::env::temp_dir().join(format!("ferrocx-nccl-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let done = dir.join("done");
    let logs = [dir.join("rank0.log"), dir.join("rank1.log")];
    let mut ranks = [
        spawn(0, &uid, &done, &logs[0]),
        spawn(1, &uid, &done, &logs[1]),
    ];
    let deadline = Instant::now() + TIMEOUT + Duration::from_secs(60);
    let mut outs = Vec::new();
    for (r, child) in ranks.iter_mut().enumerate() {
        let status = loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let text = std::fs::read_to_string(&logs[r]).unwrap_or_default();
        println!("---- rank {r} ({status:?})\n{text}");
        outs.push((status.is_some_and(|s| s.success()), text));
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (r, (ok, text)) in outs.iter().enumerate() {
        assert!(ok, "rank {r} failed (or was killed at the deadline)");
        assert!(text.contains("1 passed"), "rank {r} ran its part: {text}");
    }
    assert!(
        outs[1].1.contains("rank 1: watchdog error"),
        "{}",
        outs[1].1
    );
}

/// One rank of the abort test (runs only in the processes the test above starts).
#[test]
fn child_rank() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let rank: i32 = role.parse().expect("rank");
    let uid = unhex(&std::env::var(UID).expect("unique id"));
    let done = PathBuf::from(std::env::var_os(DONE).expect("done file"));
    let dev = CudaDevice::instance();
    dev.init(&Options::default()).expect("CUDA adaptor init");
    dev.set_device(rank).expect("set_device");
    let ccl = NcclCcl::instance();
    ccl.init(&Options::default()).expect("nccl init");
    let comm = ccl
        .comm_init_rank(&init_args(rank, 2, &uid, TIMEOUT, Options::default()))
        .expect("communicator");
    assert_eq!(ccl.watchdog_outstanding(comm), Some(0), "watched");
    let s = dev.stream_create(0).expect("stream");
    let n = 10;
    let b = filled(dev, n, rank + 1);
    // Op #1, joined by both ranks.
    all_reduce(ccl, b, n, comm, s).expect("all_reduce #1");
    dev.stream_synchronize(s).expect("synchronize #1");
    assert_eq!(download(dev, b, n), vec![3; n], "1 + 2 on every element");
    assert!(drained(ccl, comm), "op #1 retired");

    if rank == 0 {
        // Never joins op #2: aborts while rank 1 waits in it, then stays alive until rank 1
        // is done, so rank 1 sees an aborted peer, not a dead process.
        std::thread::sleep(Duration::from_millis(500));
        ccl.comm_abort(comm).expect("comm_abort");
        println!("rank 0: aborted");
        let until = Instant::now() + TIMEOUT + Duration::from_secs(30);
        while !done.exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        return;
    }

    let start = Instant::now();
    all_reduce(ccl, b, n, comm, s).expect("all_reduce #2 is enqueued");
    // Returns once the watchdog aborted the communicator (NCCL's kernels exit).
    let synced = dev.stream_synchronize(s);
    let took = start.elapsed();
    let _ = std::fs::write(&done, b"done");
    println!("rank 1: synchronize after {took:?}: {synced:?}");
    assert!(
        took <= TIMEOUT + GRACE,
        "the error took {took:?}, past {TIMEOUT:?} + {GRACE:?}"
    );
    let status = ccl.comm_async_error(comm).expect("comm_get_async_error");
    assert!(
        status == Status::TIMEOUT || status == Status::PEER_FAILURE,
        "async error {status:?}"
    );
    // Every later call fails with the watchdog's error.
    let err = ccl
        .all_reduce(b, b, n, DataType::I32, ReduceOp::SUM, comm, s)
        .expect_err("the communicator is broken");
    assert_eq!(err.status(), status);
    let m = err.message();
    println!("rank 1: watchdog error ({status:?}): {m}");
    assert!(m.contains("rank 1 of 2"), "{m}");
    assert!(m.contains("all_reduce (op #2)"), "{m}");
    assert!(
        m.contains("communicator aborted; a peer failed or never joined"),
        "{m}"
    );
    if status == Status::TIMEOUT {
        assert!(m.contains("made no progress"), "{m}");
        assert!(took >= TIMEOUT, "timed out early: {took:?}");
    }
    assert_eq!(ccl.comm_count(comm).expect_err("broken").message(), m);
    assert_eq!(ccl.comm_finalize(comm).expect_err("broken").message(), m);
    // The user's destroy only releases the handle: no second abort, no error.
    ccl.comm_destroy(comm).expect("released");
    let gone = ccl.comm_destroy(comm).expect_err("released once");
    assert_eq!(gone.status(), Status::INVALID_HANDLE);
}
