//! The watchdog end to end without a GPU, over `tests/fake/fake_gpu.c`: a stand-in for libcuda
//! and libnccl in one library (built here with the system C compiler), whose streams complete
//! their operations at once or only when the test says (or an abort drains them), as NCCL's
//! kernels do. Each test uses its own rank number, so the fake's counters are its own.
//!
//! The fake is this process's CUDA driver: named to the CUDA adaptor's loader (the one the
//! watchdog goes through) before anything loads a driver, with a stub for every other symbol
//! that loader binds (`tests/fake/cuda_symbols.txt`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferrocx::abi::{Comm, DataType, DevicePtr, ReduceOp, Status, Stream, WindowHandle};
use ferrocx_adaptor_cuda::shared;
use ferrocx_adaptor_nccl::NcclCcl;
use ferrocx_plugin_sdk::{CclAdaptor, CclWindow, CommInit, Options};
use libloading::Library;

/// The fake library's controls.
struct Fake {
    stream_new: unsafe extern "C" fn() -> *mut std::ffi::c_void,
    stream_hold: unsafe extern "C" fn(*mut std::ffi::c_void, i32),
    stream_capture: unsafe extern "C" fn(*mut std::ffi::c_void, i32),
    stream_complete: unsafe extern "C" fn(*mut std::ffi::c_void, u64),
    stream_idle: unsafe extern "C" fn(*mut std::ffi::c_void) -> i32,
    aborts: unsafe extern "C" fn(i32) -> i32,
    destroys: unsafe extern "C" fn(i32) -> i32,
    set_async_error: unsafe extern "C" fn(i32, i32),
    init_hold: unsafe extern "C" fn(i32, i32),
    abort_hold: unsafe extern "C" fn(i32, i32),
    aborts_finished: unsafe extern "C" fn(i32) -> i32,
}

/// Builds and loads the fake (once per process) and initialises the adaptor over it.
fn fake() -> &'static Fake {
    static FAKE: OnceLock<Fake> = OnceLock::new();
    FAKE.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nccl-fake-gpu");
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let so = dir.join(format!("libfake_gpu_{}.so", std::process::id()));
        let fake_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake");
        let src = fake_dir.join("fake_gpu.c");
        let stubs = dir.join(format!("driver_stubs_{}.c", std::process::id()));
        std::fs::write(&stubs, driver_stubs(&fake_dir.join("cuda_symbols.txt")))
            .expect("write the driver stubs");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let out = Command::new(&cc)
            .args([
                "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-shared", "-fPIC",
            ])
            .arg(&src)
            .arg(&stubs)
            .arg("-o")
            .arg(&so)
            .output()
            .unwrap_or_else(|e| panic!("could not run the C compiler `{cc}`: {e}"));
        assert!(
            out.status.success(),
            "`{cc}` failed on {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // SAFETY: the fake's initialisers do nothing. Leaked: the controls below stay valid.
        let lib: &'static Library = Box::leak(Box::new(
            unsafe { Library::new(&so) }.expect("load the fake"),
        ));
        shared::use_library(&so).expect("the fake is named before any driver load");
        if let Err(e) = shared::Driver::get() {
            panic!(
                "the CUDA adaptor's loader refuses the fake (a symbol missing from \
                 tests/fake/cuda_symbols.txt?): {e}"
            );
        }
        let path = so.to_str().expect("UTF-8 path").to_string();
        NcclCcl::instance()
            .init(&Options::new(vec![("library".into(), path)]))
            .expect("the adaptor loads the fake as its libnccl");
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type is the C declaration in fake_gpu.c.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.expect($name)
            };
        }
        Fake {
            stream_new: sym!("fake_stream_new"),
            stream_hold: sym!("fake_stream_hold"),
            stream_capture: sym!("fake_stream_capture"),
            stream_complete: sym!("fake_stream_complete"),
            stream_idle: sym!("fake_stream_idle"),
            aborts: sym!("fake_aborts"),
            destroys: sym!("fake_destroys"),
            set_async_error: sym!("fake_set_async_error"),
            init_hold: sym!("fake_init_hold"),
            abort_hold: sym!("fake_abort_hold"),
            aborts_finished: sym!("fake_aborts_finished"),
        }
    })
}

/// C source with a weak stub, answering `CUDA_ERROR_NOT_SUPPORTED`, for every driver symbol
/// listed in `list` (fake_gpu.c's own definitions win over them at link time).
fn driver_stubs(list: &std::path::Path) -> String {
    let names =
        std::fs::read_to_string(list).unwrap_or_else(|e| panic!("read {}: {e}", list.display()));
    let mut c = String::from("/* Generated by fake_runtime.rs from cuda_symbols.txt. */\n");
    for name in names
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        c.push_str(&format!(
            "__attribute__((weak)) int {name}(void) {{ return 801; }}\n"
        ));
    }
    c
}

impl Fake {
    fn stream(&self, held: bool) -> Stream {
        // SAFETY: plain calls into the fake; the stream lives for the process.
        unsafe {
            let s = (self.stream_new)();
            (self.stream_hold)(s, held as i32);
            Stream(s)
        }
    }
    fn capture(&self, s: Stream, on: bool) {
        // SAFETY: a stream of the fake.
        unsafe { (self.stream_capture)(s.0, on as i32) }
    }
    fn complete(&self, s: Stream, n: u64) {
        // SAFETY: a stream of the fake.
        unsafe { (self.stream_complete)(s.0, n) }
    }
    fn idle(&self, s: Stream) -> bool {
        // SAFETY: a stream of the fake.
        unsafe { (self.stream_idle)(s.0) != 0 }
    }
    fn aborts(&self, rank: i32) -> i32 {
        // SAFETY: a plain read.
        unsafe { (self.aborts)(rank) }
    }
    fn destroys(&self, rank: i32) -> i32 {
        // SAFETY: a plain read.
        unsafe { (self.destroys)(rank) }
    }
    fn set_async_error(&self, rank: i32, rc: i32) {
        // SAFETY: a plain write.
        unsafe { (self.set_async_error)(rank, rc) }
    }
    fn init_hold(&self, rank: i32, hold: bool) {
        // SAFETY: a plain write.
        unsafe { (self.init_hold)(rank, hold as i32) }
    }
    fn abort_hold(&self, rank: i32, ms: i32) {
        // SAFETY: a plain write.
        unsafe { (self.abort_hold)(rank, ms) }
    }
    fn aborts_finished(&self, rank: i32) -> i32 {
        // SAFETY: a plain read.
        unsafe { (self.aborts_finished)(rank) }
    }
}

fn comm(rank: i32, timeout_ms: u64, options: Vec<(String, String)>) -> Comm {
    NcclCcl::instance()
        .comm_init_rank(&CommInit {
            rank,
            nranks: 16,
            device: 0,
            unique_id: &[0u8; 128],
            timeout_ms,
            options: Options::new(options),
        })
        .expect("communicator")
}

fn all_reduce(c: Comm, s: Stream) -> ferrocx_plugin_sdk::Result<()> {
    let p = DevicePtr(0x1000);
    NcclCcl::instance().all_reduce(p, p, 2, DataType::F32, ReduceOp::SUM, c, s)
}

/// Polls `f` every millisecond until it holds, at most `limit`; how long it took.
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

fn async_error(c: Comm) -> Status {
    NcclCcl::instance()
        .comm_async_error(c)
        .expect("comm_get_async_error")
}

const CONSEQUENCE: &str = "communicator aborted; a peer failed or never joined";

#[test]
fn a_hung_operation_times_out_aborts_once_and_breaks_the_communicator() {
    let (f, ccl, rank) = (fake(), NcclCcl::instance(), 0);
    let c = comm(rank, 300, vec![]);
    let s = f.stream(true);
    let start = Instant::now();
    all_reduce(c, s).expect("enqueued");
    assert_eq!(ccl.watchdog_outstanding(c), Some(1));
    // What a stream synchronize would do: wait for the stream, which the abort drains.
    let drained = within(Duration::from_secs(5), || f.idle(s)).expect("the abort drains it");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(300),
        "timed out early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(1_300),
        "late: {took:?} ({drained:?})"
    );
    assert_eq!(async_error(c), Status::TIMEOUT);
    assert_eq!(f.aborts(rank), 1);
    let e = all_reduce(c, s).expect_err("broken");
    assert_eq!(e.status(), Status::TIMEOUT);
    let m = e.message();
    assert!(
        m.starts_with("rank 0 of 16: all_reduce (op #1) made no progress for "),
        "{m}"
    );
    assert!(m.contains(" s (timeout 300 ms): "), "{m}");
    assert!(m.ends_with(CONSEQUENCE), "{m}");
    for other in [
        ccl.comm_count(c).map(|_| ()),
        ccl.comm_finalize(c),
        ccl.group_start()
            .and_then(|()| all_reduce(c, s))
            .and_then(|()| Err(ferrocx_plugin_sdk::Error::internal("accepted"))),
    ] {
        assert_eq!(other.expect_err("broken").message(), m);
    }
    ccl.group_end().expect("group_end");
    assert!(f.idle(s), "nothing more was enqueued");
    // Releasing the handle does not abort (or destroy) the communicator a second time.
    ccl.comm_destroy(c).expect("released");
    assert_eq!((f.aborts(rank), f.destroys(rank)), (1, 0));
    let gone = ccl.comm_destroy(c).expect_err("released once");
    assert_eq!(gone.status(), Status::INVALID_HANDLE);
}

/// The user sees the failure (the abort drained the stream) while the watchdog's
/// `ncclCommAbort` is still running. Releasing the handle then must not return before that abort
/// has: the caller's next step (finalizing the device, exiting) would pull CUDA away from under
/// it, which on GPUs ended in a SIGSEGV inside NCCL's teardown.
#[test]
fn releasing_a_communicator_waits_for_the_watchdogs_running_abort() {
    let (f, ccl, rank) = (fake(), NcclCcl::instance(), 10);
    f.abort_hold(rank, 500);
    let c = comm(rank, 200, vec![]);
    let s = f.stream(true);
    all_reduce(c, s).expect("enqueued");
    within(Duration::from_secs(5), || f.idle(s)).expect("the abort drains the stream");
    assert_eq!(f.aborts(rank), 1, "the abort began");
    assert_eq!(f.aborts_finished(rank), 0, "and is still running");
    let start = Instant::now();
    ccl.comm_destroy(c).expect("released");
    let took = start.elapsed();
    assert_eq!(
        f.aborts_finished(rank),
        1,
        "comm_destroy returned after {took:?}, before the watchdog's abort did"
    );
    assert!(took < Duration::from_secs(3), "waited {took:?}");
    assert_eq!(
        (f.aborts(rank), f.destroys(rank)),
        (1, 0),
        "one abort, no destroy"
    );
}

#[test]
fn an_init_that_waits_for_a_missing_peer_fails_within_the_timeout() {
    let f = fake();
    const RANK: i32 = 9;
    f.init_hold(RANK, true);
    let start = Instant::now();
    let err = NcclCcl::instance()
        .comm_init_rank(&CommInit {
            rank: RANK,
            nranks: 16,
            device: 0,
            unique_id: &[0u8; 128],
            timeout_ms: 300,
            options: Options::default(),
        })
        .expect_err("NCCL's init never returns");
    let took = start.elapsed();
    assert_eq!(err.status(), Status::TIMEOUT, "{}", err.message());
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "failed after {took:?}"
    );
    assert!(
        err.message()
            .contains("rank 9 of 16: ncclCommInitRank did not return within 0.3 s"),
        "{}",
        err.message()
    );
    assert_eq!(f.aborts(RANK), 0, "nothing to abort yet");
    // NCCL returns at last: the abandoned communicator is aborted, never handed out.
    f.init_hold(RANK, false);
    assert!(
        within(Duration::from_secs(5), || f.aborts(RANK) == 1).is_some(),
        "the late communicator is aborted"
    );
    // With the watchdog off the init is NCCL's own, unbounded (here it returns at once).
    let off = comm(RANK, 300, vec![("watchdog".into(), "off".into())]);
    NcclCcl::instance().comm_destroy(off).expect("destroy");
}

#[test]
fn an_asynchronous_error_aborts_at_once_with_its_status() {
    let (f, ccl, rank) = (fake(), NcclCcl::instance(), 1);
    let c = comm(rank, 60_000, vec![]);
    let s = f.stream(true);
    all_reduce(c, s).expect("enqueued");
    f.set_async_error(rank, 6); // ncclRemoteError
    let took = within(Duration::from_secs(5), || f.idle(s)).expect("aborted");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(async_error(c), Status::PEER_FAILURE);
    let e = all_reduce(c, s).expect_err("broken");
    assert_eq!(e.status(), Status::PEER_FAILURE);
    let m = e.message();
    assert!(m.starts_with("rank 1 of 16: NCCL reported an asynchronous error: remote process exited or there was a network error (ncclResult 6)"), "{m}");
    assert!(m.contains("during all_reduce (op #1)"), "{m}");
    assert!(m.ends_with(CONSEQUENCE), "{m}");
    ccl.comm_abort(c).expect("released");
    assert_eq!((f.aborts(rank), f.destroys(rank)), (1, 0), "aborted once");
}

#[test]
fn operations_queued_behind_a_long_one_get_their_own_full_timeout() {
    let (f, ccl, rank) = (fake(), NcclCcl::instance(), 2);
    let c = comm(rank, 1_000, vec![]);
    let s = f.stream(true);
    let t0 = Instant::now();
    all_reduce(c, s).expect("op 1");
    all_reduce(c, s).expect("op 2");
    assert_eq!(ccl.watchdog_outstanding(c), Some(2));
    // Op 1 runs for 0.7 s; op 2's clock starts then, so at 1.3 s (past a second since it was
    // enqueued) it is still fine, and it completes at 1.4 s.
    std::thread::sleep(Duration::from_millis(700).saturating_sub(t0.elapsed()));
    f.complete(s, 1);
    std::thread::sleep(Duration::from_millis(1_300).saturating_sub(t0.elapsed()));
    assert_eq!(
        async_error(c),
        Status::SUCCESS,
        "op 2 was timed out from its enqueue"
    );
    f.complete(s, 1);
    within(Duration::from_secs(2), || {
        ccl.watchdog_outstanding(c) == Some(0)
    })
    .expect("both retired");
    assert_eq!(async_error(c), Status::SUCCESS);
    assert_eq!(f.aborts(rank), 0);
    // Completed events are reused: many more operations, all retired, nothing aborted.
    let quick = f.stream(false);
    for _ in 0..1_000 {
        all_reduce(c, quick).expect("all_reduce");
    }
    within(Duration::from_secs(2), || {
        ccl.watchdog_outstanding(c) == Some(0)
    })
    .expect("all retired");
    ccl.comm_destroy(c).expect("destroy");
    assert_eq!((f.aborts(rank), f.destroys(rank)), (0, 1));
}

#[test]
fn captured_streams_stay_clean_and_a_group_records_once_at_its_end() {
    let (f, ccl, rank) = (fake(), NcclCcl::instance(), 3);
    let c = comm(rank, 300, vec![]);
    let s = f.stream(true);
    f.capture(s, true);
    all_reduce(c, s).expect("captured");
    assert_eq!(
        ccl.watchdog_outstanding(c),
        Some(0),
        "no event while capturing"
    );
    f.capture(s, false);
    f.complete(s, 1);
    ccl.group_start().expect("group_start");
    for _ in 0..3 {
        all_reduce(c, s).expect("grouped");
    }
    assert_eq!(
        ccl.watchdog_outstanding(c),
        Some(0),
        "nothing before the end"
    );
    ccl.group_end().expect("group_end");
    assert_eq!(
        ccl.watchdog_outstanding(c),
        Some(1),
        "one event for the group"
    );
    // The group never completes: its label covers ops 2 to 4 (op 1 was the captured one).
    within(Duration::from_secs(5), || f.idle(s)).expect("aborted");
    let e = all_reduce(c, s).expect_err("broken");
    assert!(
        e.message()
            .contains("a group of 3 ops from all_reduce (ops #2 to #4) made no progress"),
        "{}",
        e.message()
    );
    ccl.comm_destroy(c).expect("released");
    assert_eq!(f.aborts(rank), 1);
}

#[test]
fn the_option_turns_the_watchdog_off() {
    let (f, ccl, rank) = (fake(), NcclCcl::instance(), 4);
    let c = comm(rank, 100, vec![("watchdog".into(), "off".into())]);
    assert_eq!(ccl.watchdog_outstanding(c), None);
    let s = f.stream(true);
    all_reduce(c, s).expect("enqueued");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(async_error(c), Status::SUCCESS, "nobody watches");
    assert_eq!(f.aborts(rank), 0);
    let bad = NcclCcl::instance()
        .comm_init_rank(&CommInit {
            rank,
            nranks: 16,
            device: 0,
            unique_id: &[0u8; 128],
            timeout_ms: 0,
            options: Options::new(vec![("watchdog".into(), "sometimes".into())]),
        })
        .expect_err("not on or off");
    assert_eq!(bad.status(), Status::INVALID_ARGUMENT);
    // The user's abort of a live communicator is NCCL's abort, once.
    ccl.comm_abort(c).expect("abort");
    assert_eq!((f.aborts(rank), f.destroys(rank)), (1, 0));
}

#[test]
fn entries_of_missing_symbols_name_them_and_the_release_that_has_them() {
    let (ccl, rank) = (NcclCcl::instance(), 5);
    fake();
    let c = comm(rank, 0, vec![]);
    for comm in [Comm::NULL, c] {
        let e = ccl
            .window_register(comm, DevicePtr(0x1000), 4096, 0)
            .expect_err("the fake is 2.26.5");
        assert_eq!(e.status(), Status::UNSUPPORTED);
        assert_eq!(
            e.message(),
            "libnccl 2.26.5 lacks ncclCommWindowRegister (needs 2.27)"
        );
        let e = ccl
            .window_deregister(comm, WindowHandle::NULL)
            .expect_err("2.26.5");
        assert_eq!(
            e.message(),
            "libnccl 2.26.5 lacks ncclCommWindowDeregister (needs 2.27)"
        );
        let e = ccl
            .mem_register(comm, DevicePtr(0x1000), 4096)
            .expect_err("the fake has no registration");
        assert_eq!(
            e.message(),
            "libnccl 2.26.5 lacks ncclCommRegister (needs 2.19)"
        );
    }
    assert_eq!(
        ccl.mem_alloc(64).expect_err("no ncclMemAlloc").message(),
        "libnccl 2.26.5 lacks ncclMemAlloc (needs 2.19)"
    );
    // query_support (ABI 1.2) says the same up front, without a communicator.
    for (entry, why) in [
        (
            "window_register",
            "libnccl 2.26.5 lacks ncclCommWindowRegister (needs 2.27)",
        ),
        (
            "window_deregister",
            "libnccl 2.26.5 lacks ncclCommWindowRegister (needs 2.27)",
        ),
        (
            "mem_register",
            "libnccl 2.26.5 lacks ncclCommRegister (needs 2.19)",
        ),
        ("mem_free", "libnccl 2.26.5 lacks ncclMemAlloc (needs 2.19)"),
    ] {
        assert_eq!(
            ccl.query_support(entry).expect("query_support"),
            Some(why.to_string()),
            "{entry}"
        );
    }
    for entry in ["all_reduce", "send", "comm_abort"] {
        assert_eq!(ccl.query_support(entry).expect("query_support"), None);
    }
    assert_eq!(ccl.comm_timeout_ms(c), Some(0), "0 asks for the default");
    ccl.comm_destroy(c).expect("destroy");
}
