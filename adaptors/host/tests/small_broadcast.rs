//! The small broadcast (at most one line of payload), whose root publishes and returns without
//! waiting for its receivers: values from every root, odd sizes and several types, on random
//! data; many calls back to back with no synchronization between them (the root runs ahead of
//! its receivers, so a line reused too early would show as a wrong value); small broadcasts
//! interleaved with every other path of all-reduce, broadcast, all-gather and reduce-scatter
//! (each of which must wait for the receivers the broadcasts left behind before it reuses a
//! buffer); a receiver that arrives late; and stream semantics: the root's stream completes
//! the call before any receiver has made it, and a receiver's call still runs after what its
//! stream held before it.

mod common;

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_all_ok, comm, host, spawn, wait, worker, Rng};
use ferrocx::abi::{DataType, DevicePtr, ReduceOp, Stream};
use ferrocx::adaptor::Device;

/// Runs `f` on the stream's worker in stream order.
fn host_fn(dev: &Device, s: Stream, f: Box<dyn FnOnce() + Send>) {
    unsafe extern "C" fn tramp(user: *mut c_void) {
        // SAFETY: `user` is the box leaked below, called exactly once.
        let f = unsafe { Box::from_raw(user as *mut Box<dyn FnOnce() + Send>) };
        f();
    }
    let user = Box::into_raw(Box::new(f)) as *mut c_void;
    let launch = dev.tables().root.get().launch_host_func.unwrap();
    // SAFETY: `tramp(user)` is sound to call once on any thread; `user` is a leaked box.
    let st = unsafe { launch(s, Some(tramp), user) };
    assert_eq!(st, ferrocx::abi::Status::SUCCESS, "launch_host_func");
}

/// Random bytes of call `k` from `root`: what every rank expects.
fn payload(k: u64, root: usize, bytes: usize) -> Vec<u8> {
    let mut rng = Rng::new(0xB0AD ^ k, root as u64 + 1);
    (0..bytes).map(|_| rng.range(0, 255) as u8).collect()
}

/// Rank `r`'s f32 input of all-reduce call `k` (small integers: exact sums).
fn values(k: u64, r: usize, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(0xA11 ^ k, r as u64 + 1);
    (0..n).map(|_| rng.range(-50, 50) as f32).collect()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn sum_bytes(k: u64, world: usize, n: usize) -> Vec<u8> {
    let mut acc = vec![0f32; n];
    for r in 0..world {
        for (a, v) in acc.iter_mut().zip(values(k, r, n)) {
            *a += v;
        }
    }
    to_bytes(&acc)
}

fn p(v: &[u8]) -> DevicePtr {
    DevicePtr(v.as_ptr() as u64)
}

fn pm(v: &mut [u8]) -> DevicePtr {
    DevicePtr(v.as_mut_ptr() as u64)
}

/// One call of a mixed sequence, its buffers kept until the stream is synchronized.
struct Call {
    what: String,
    send: Vec<u8>,
    recv: Vec<u8>,
    want: Option<Vec<u8>>,
}

/// (type, elements): every size fits one line (192 bytes), several are odd; the first three
/// ride in the root's tiny record (up to 8 bytes).
const SMALL: [(DataType, usize); 7] = [
    (DataType::U8, 1),
    (DataType::U8, 7),
    (DataType::F32, 2),
    (DataType::F32, 3),
    (DataType::I64, 5),
    (DataType::F16, 33),
    (DataType::U8, 191),
];

fn run_worker(rank: usize, world: usize) {
    let (dev, ccl) = host();
    let c = comm(&ccl, rank, world, 60_000);
    let s = dev.stream_create().unwrap();
    let sync = |what: &str| {
        dev.stream_synchronize(s)
            .unwrap_or_else(|e| panic!("rank {rank}: {what}: {e}"))
    };
    let bcast = |send: &[u8], recv: &mut [u8], n: usize, dt: DataType, root: usize| {
        // SAFETY: `send` and `recv` hold `n` elements of `dt` and stay alive (unmoved) until
        // the stream is synchronized.
        unsafe { ccl.broadcast(p(send), pm(recv), n, dt, root as i32, c, s) }.unwrap()
    };

    // 1. Every root, every small size, many calls back to back (no synchronization between
    //    them), each into its own buffer; in place on the root every other call.
    let mut k = 0u64;
    for root in 0..world {
        for (dt, n) in SMALL {
            let bytes = n * dt.size().unwrap();
            let mut calls = Vec::new();
            // More calls than a root may run ahead by (63 through its lines, 255 through its
            // tiny records).
            for i in 0..300 {
                k += 1;
                let want = payload(k, root, bytes);
                let send = if rank == root {
                    want.clone()
                } else {
                    vec![0u8; bytes]
                };
                calls.push((want, send, vec![0xEEu8; bytes], i % 2 == 1));
            }
            for (_, send, recv, in_place) in calls.iter_mut() {
                if *in_place && rank == root {
                    let ptr = send.as_mut_ptr();
                    // SAFETY: in place: `send` holds `n` elements and stays alive until the
                    // stream is synchronized.
                    unsafe {
                        ccl.broadcast(
                            DevicePtr(ptr as u64),
                            DevicePtr(ptr as u64),
                            n,
                            dt,
                            root as i32,
                            c,
                            s,
                        )
                    }
                    .unwrap();
                } else {
                    bcast(send, recv, n, dt, root);
                }
            }
            sync("back-to-back broadcasts");
            for (i, (want, send, recv, in_place)) in calls.iter().enumerate() {
                let got = if *in_place && rank == root {
                    send
                } else {
                    recv
                };
                assert_eq!(
                    got, want,
                    "rank {rank}: broadcast {i} of {n} x {dt:?} from root {root}"
                );
            }
        }
    }

    // 2. Small broadcasts from rotating roots interleaved with every other kind of call, none
    //    synchronized until the end: each buffer reuse after a broadcast must wait for its
    //    receivers.
    let mut calls: Vec<Call> = Vec::new();
    let mut rng = Rng::new(0x5EED, 99);
    for i in 0..240u64 {
        k += 1;
        let root = (i as usize * 7 + 3) % world;
        let call = match i % 8 {
            // small all-reduce in the line, one-shot through the slot, chunked (a slot of
            // 1 MiB: 300 000 floats take two chunks)
            3 | 6 => {
                let n = [5usize, 700, 300_000][rng.range(0, 2) as usize];
                Call {
                    what: format!("all_reduce {n}"),
                    send: to_bytes(&values(k, rank, n)),
                    recv: vec![0u8; n * 4],
                    want: Some(sum_bytes(k, world, n)),
                }
            }
            // a broadcast through the slot
            5 => {
                let bytes = [193usize, 4099, 70_001][rng.range(0, 2) as usize];
                let want = payload(k, root, bytes);
                Call {
                    what: format!("broadcast {bytes} B from {root}"),
                    send: if rank == root {
                        want.clone()
                    } else {
                        Vec::new()
                    },
                    recv: vec![0u8; bytes],
                    want: Some(want),
                }
            }
            // an all-gather of odd size
            7 => {
                let bytes = 1001;
                let mut want = Vec::new();
                for r in 0..world {
                    want.extend(payload(k, r, bytes));
                }
                Call {
                    what: "all_gather 1001 B".into(),
                    send: payload(k, rank, bytes),
                    recv: vec![0u8; bytes * world],
                    want: Some(want),
                }
            }
            _ => {
                let bytes = [1usize, 8, 77, 192][rng.range(0, 3) as usize];
                let want = payload(k, root, bytes);
                Call {
                    what: format!("small broadcast {bytes} B from {root}"),
                    send: if rank == root {
                        want.clone()
                    } else {
                        Vec::new()
                    },
                    recv: vec![0xEEu8; bytes],
                    want: Some(want),
                }
            }
        };
        calls.push(call);
        let call = calls.last_mut().unwrap();
        let root_of = |w: &str| w.rsplit(' ').next().unwrap().parse::<usize>().unwrap();
        if call.what.starts_with("all_reduce") {
            let n = call.recv.len() / 4;
            // SAFETY: both hold `n` f32s and stay alive until the stream is synchronized.
            unsafe {
                ccl.all_reduce(
                    p(&call.send),
                    pm(&mut call.recv),
                    n,
                    DataType::F32,
                    ReduceOp::SUM,
                    c,
                    s,
                )
            }
            .unwrap();
        } else if call.what.starts_with("all_gather") {
            let n = call.send.len();
            // SAFETY: `send` holds `n` bytes, `recv` `n * world`; alive until synchronized.
            unsafe { ccl.all_gather(p(&call.send), pm(&mut call.recv), n, DataType::U8, c, s) }
                .unwrap();
        } else {
            let root = root_of(&call.what);
            let n = call.recv.len();
            let send = if rank == root {
                call.send.as_slice()
            } else {
                call.recv.as_slice()
            };
            let send = p(send);
            // SAFETY: `send` (on the root) and `recv` hold `n` bytes; alive until synchronized.
            unsafe { ccl.broadcast(send, pm(&mut call.recv), n, DataType::U8, root as i32, c, s) }
                .unwrap();
        }
    }
    sync("mixed sequence");
    for (i, call) in calls.iter().enumerate() {
        if let Some(want) = &call.want {
            assert!(
                call.recv == *want,
                "rank {rank}: call {i} ({}) has wrong values",
                call.what
            );
        }
    }

    // 3. A late receiver: the last rank starts its calls 100 ms after the others, so the root
    //    runs ahead until its lines (13 bytes) or its tiny records (5 bytes) run out and must
    //    wait; the values stay right.
    for (bytes, n) in [(13, 200), (5, 600)] {
        let late = world - 1;
        if rank == late && world > 1 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut calls = Vec::new();
        for _ in 0..n {
            k += 1;
            let want = payload(k, 0, bytes);
            let send = if rank == 0 {
                want.clone()
            } else {
                vec![0u8; bytes]
            };
            calls.push((want, send, vec![0u8; bytes]));
        }
        for (_, send, recv) in calls.iter_mut() {
            bcast(send, recv, bytes, DataType::U8, 0);
        }
        sync("broadcasts to a late receiver");
        for (i, (want, _, recv)) in calls.iter().enumerate() {
            assert_eq!(
                recv, want,
                "rank {rank}: broadcast {i} of {bytes} B to a late receiver"
            );
        }
    }

    // 4. Stream semantics, through the root's line (100 bytes) and its tiny record (8 bytes).
    //    The root's call completes on its stream before any receiver has made its call (the
    //    root does not wait for them): the root synchronizes, then tells the receivers to
    //    start through a file. A receiver's call still waits for its stream: a host function
    //    holding the stream runs first, and the result is there after it.
    let dir = PathBuf::from(std::env::var("BCAST_TEST_DIR").expect("BCAST_TEST_DIR"));
    for size in [100usize, 8] {
        let flag = dir.join(format!("root-done-{size}"));
        k += 1;
        let want = payload(k, 0, size);
        if rank == 0 {
            let send = want.clone();
            let mut recv = vec![0u8; size];
            bcast(&send, &mut recv, size, DataType::U8, 0);
            sync("the root's broadcast, no receiver there yet");
            assert_eq!(recv, want, "the root's own output");
            std::fs::write(&flag, b"done").unwrap();
        } else {
            let t0 = std::time::Instant::now();
            while !flag.exists() {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "rank {rank}: the root's broadcast did not complete without its receivers"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            let held = Arc::new(AtomicBool::new(false));
            let open = Arc::new(AtomicBool::new(false));
            let (h, o) = (held.clone(), open.clone());
            host_fn(
                &dev,
                s,
                Box::new(move || {
                    h.store(true, Ordering::Release);
                    while !o.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }),
            );
            let send = vec![0u8; size];
            let mut recv = vec![0u8; size];
            bcast(&send, &mut recv, size, DataType::U8, 0);
            while !held.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_micros(200));
            }
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: a volatile read of memory the stream has not written yet (it is held).
            let early: Vec<u8> = (0..size)
                .map(|i| unsafe { std::ptr::read_volatile(recv.as_ptr().add(i)) })
                .collect();
            assert_eq!(
                early,
                vec![0u8; size],
                "rank {rank}: the broadcast ran before the stream's earlier work"
            );
            open.store(true, Ordering::Release);
            sync("a receiver's broadcast behind a host function");
            assert_eq!(recv, want, "rank {rank}: broadcast after the host function");
        }
    }

    // 5. A communicator used afterwards by everything else still agrees (a final all-reduce).
    k += 1;
    let send = to_bytes(&values(k, rank, 3));
    let mut recv = vec![0u8; 12];
    // SAFETY: both hold 3 f32s; read after the synchronize.
    unsafe {
        ccl.all_reduce(
            p(&send),
            pm(&mut recv),
            3,
            DataType::F32,
            ReduceOp::SUM,
            c,
            s,
        )
    }
    .unwrap();
    sync("final all_reduce");
    assert_eq!(recv, sum_bytes(k, world, 3));
    assert_eq!(
        ccl.comm_async_error(c).unwrap(),
        ferrocx::abi::Status::SUCCESS
    );
    ccl.comm_finalize(c).unwrap();
    ccl.comm_destroy(c).unwrap();
    dev.stream_destroy(s).unwrap();
}

#[test]
fn small_broadcast_worker() {
    if let Some((rank, world)) = worker("small_broadcast_worker") {
        run_worker(rank, world);
    }
}

fn on(n: usize, env: &[(&str, &str)]) {
    let dir = std::env::temp_dir().join(format!(
        "ferrocx-bcast-{}-{n}-{}",
        std::process::id(),
        env.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut vars: Vec<(&str, String)> = vec![("BCAST_TEST_DIR", dir.display().to_string())];
    vars.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    let outcomes = wait(
        spawn("small_broadcast_worker", n, &vars),
        Duration::from_secs(600),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_all_ok(&outcomes);
}

#[test]
fn small_broadcasts_on_2_ranks() {
    on(2, &[]);
}

#[test]
fn small_broadcasts_on_3_ranks_with_helpers() {
    on(3, &[("FERROCX_HOST_THREADS", "2")]);
}

#[test]
fn small_broadcasts_on_4_ranks_with_the_inline_path() {
    on(4, &[("FERROCX_HOST_INLINE_US", "1000")]);
}

/// Every rooted call checks its root against the communicator (in the same lookup that
/// enqueues it): a root out of range is an invalid argument naming it, nothing runs, and the
/// communicator and the stream still work.
#[test]
fn rooted_calls_reject_a_root_out_of_range() {
    let (dev, ccl) = host();
    let uid = ccl.unique_id().unwrap();
    let c = ccl.comm_init_rank(0, 1, 0, &uid, 10_000, &[]).unwrap();
    let s = dev.stream_create().unwrap();
    let send = [1.5f32, -2.0];
    let mut recv = [0f32; 2];
    let (sp, rp) = (
        DevicePtr(send.as_ptr() as u64),
        DevicePtr(recv.as_mut_ptr() as u64),
    );
    let call = |what: &str, root: i32| {
        // SAFETY: both buffers hold 2 f32 and outlive the synchronize below.
        unsafe {
            match what {
                "broadcast" => ccl.broadcast(sp, rp, 2, DataType::F32, root, c, s),
                "reduce" => ccl.reduce(sp, rp, 2, DataType::F32, ReduceOp::SUM, root, c, s),
                "gather" => ccl.gather(sp, rp, 2, DataType::F32, root, c, s),
                _ => ccl.scatter(sp, rp, 2, DataType::F32, root, c, s),
            }
        }
    };
    for root in [1, -1, i32::MAX] {
        for what in ["broadcast", "reduce", "gather", "scatter"] {
            let e = call(what, root).expect_err(what).to_string();
            assert!(
                e.contains(&format!("root {root} is not a rank of 1 ranks")),
                "{what}: {e}"
            );
        }
    }
    dev.stream_synchronize(s).unwrap();
    assert_eq!(recv, [0.0; 2], "a rejected call wrote its output");
    // SAFETY: as above.
    unsafe { ccl.broadcast(sp, rp, 2, DataType::F32, 0, c, s) }.unwrap();
    dev.stream_synchronize(s).unwrap();
    assert_eq!(recv, send);
    ccl.comm_finalize(c).unwrap();
    ccl.comm_destroy(c).unwrap();
    dev.stream_destroy(s).unwrap();
}
