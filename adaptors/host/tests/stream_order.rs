//! The host CCL's fast path (a small collective run on the calling thread when its stream is
//! idle, `FERROCX_HOST_INLINE_US`) keeps stream semantics: a collective enqueued behind other
//! work or an event wait runs after it; enqueueing never waits for a late peer (the call is
//! handed to the stream's worker); many calls in flight, some run inline and some handed over,
//! all complete in order with the right results. Each scenario also runs with the fast path off
//! and with helper threads on.

mod common;

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// A gate a host function waits on until the test opens it.
fn gate(dev: &Device, s: Stream, then: Box<dyn FnOnce() + Send>) -> Arc<AtomicBool> {
    let open = Arc::new(AtomicBool::new(false));
    let o = open.clone();
    host_fn(
        dev,
        s,
        Box::new(move || {
            while !o.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_micros(200));
            }
            then();
        }),
    );
    open
}

fn f32s(v: &[u8]) -> Vec<f32> {
    v.chunks(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// Rank `r`'s values for call `k` of `n` elements (small integers: exact sums).
fn values(k: u64, r: usize, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(0x0DE5 ^ k, r as u64 + 1);
    (0..n).map(|_| rng.range(-50, 50) as f32).collect()
}

fn sum(k: u64, world: usize, n: usize) -> Vec<f32> {
    let mut acc = vec![0f32; n];
    for r in 0..world {
        for (a, v) in acc.iter_mut().zip(values(k, r, n)) {
            *a += v;
        }
    }
    acc
}

fn run_worker(rank: usize, world: usize) {
    let (dev, ccl) = host();
    let c = comm(&ccl, rank, world, 60_000);
    let s = dev.stream_create().unwrap();
    let s2 = dev.stream_create().unwrap();
    let n = 2;

    // 1. Behind a host function: the all-reduce reads what the function wrote.
    let send = Arc::new(std::sync::Mutex::new(vec![0u8; n * 4]));
    let mut recv = vec![0u8; n * 4];
    let sp = send.lock().unwrap().as_ptr() as u64;
    let fill = send.clone();
    let opened = gate(
        &dev,
        s,
        Box::new(move || {
            // Write in place (the collective holds the address).
            let mut b = fill.lock().unwrap();
            b.copy_from_slice(&to_bytes(&values(1, rank, n)));
        }),
    );
    // SAFETY: `send` (kept alive, never reallocated) and `recv` hold `n` f32s; read after the
    // stream is synchronized.
    unsafe {
        ccl.all_reduce(
            DevicePtr(sp),
            DevicePtr(recv.as_mut_ptr() as u64),
            n,
            DataType::F32,
            ReduceOp::SUM,
            c,
            s,
        )
    }
    .unwrap();
    assert!(
        !dev.stream_query(s).unwrap(),
        "rank {rank}: the all-reduce ran before the host function ahead of it"
    );
    opened.store(true, Ordering::Release);
    dev.stream_synchronize(s).unwrap();
    assert_eq!(
        f32s(&recv),
        sum(1, world, n),
        "rank {rank}: behind a host function"
    );

    // 2. Behind an event wait: stream s waits for an event recorded after a gated function on s2.
    let e = dev.event_create(0).unwrap();
    let input = Arc::new(std::sync::Mutex::new(vec![0u8; n * 4]));
    let ip = input.lock().unwrap().as_ptr() as u64;
    let fill = input.clone();
    let opened = gate(
        &dev,
        s2,
        Box::new(move || {
            let mut b = fill.lock().unwrap();
            b.copy_from_slice(&to_bytes(&values(2, rank, n)));
        }),
    );
    dev.event_record(e, s2).unwrap();
    dev.stream_wait_event(s, e).unwrap();
    let mut recv = vec![0u8; n * 4];
    // SAFETY: as above.
    unsafe {
        ccl.all_reduce(
            DevicePtr(ip),
            DevicePtr(recv.as_mut_ptr() as u64),
            n,
            DataType::F32,
            ReduceOp::SUM,
            c,
            s,
        )
    }
    .unwrap();
    assert!(
        !dev.stream_query(s).unwrap(),
        "rank {rank}: ran before the event"
    );
    opened.store(true, Ordering::Release);
    dev.stream_synchronize(s).unwrap();
    dev.stream_synchronize(s2).unwrap();
    assert_eq!(
        f32s(&recv),
        sum(2, world, n),
        "rank {rank}: behind an event wait"
    );
    dev.event_destroy(e).unwrap();

    // 3. A late peer: rank 0's call on an idle stream returns before the others call (they
    // wait for its marker); the worker finishes it.
    let marker = PathBuf::from(std::env::var("FERROCX_TEST_MARKER").unwrap());
    let send = to_bytes(&values(3, rank, n));
    let mut recv = vec![0u8; n * 4];
    if rank != 0 {
        let t = Instant::now();
        while !marker.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "rank {rank}: rank 0's all-reduce did not return while its peers were late"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // SAFETY: as above.
    unsafe {
        ccl.all_reduce(
            DevicePtr(send.as_ptr() as u64),
            DevicePtr(recv.as_mut_ptr() as u64),
            n,
            DataType::F32,
            ReduceOp::SUM,
            c,
            s,
        )
    }
    .unwrap();
    if rank == 0 {
        std::fs::write(&marker, b"enqueued").unwrap();
    }
    dev.stream_synchronize(s).unwrap();
    assert_eq!(
        f32s(&recv),
        sum(3, world, n),
        "rank {rank}: with a late peer"
    );

    // 4. Many calls in flight, with ranks pausing at random so some run inline and some are
    // handed over; a host function after each reads its result in stream order.
    let sizes = [1usize, 2, 7, 48, 49, 1000, 4099, 70_001];
    let calls = 120u64;
    let mut sends = Vec::new();
    let mut recvs: Vec<Vec<u8>> = Vec::new();
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(u64, Vec<f32>)>::new()));
    let mut rng = Rng::new(0xABCD, rank as u64 + 7);
    for k in 0..calls {
        let len = sizes[(k as usize) % sizes.len()];
        sends.push(to_bytes(&values(100 + k, rank, len)));
        recvs.push(vec![0u8; len * 4]);
    }
    for k in 0..calls {
        let i = k as usize;
        let len = sizes[i % sizes.len()];
        if rng.range(0, 9) == 0 {
            std::thread::sleep(Duration::from_micros(rng.range(0, 3000) as u64));
        }
        let (sp, rp) = (sends[i].as_ptr() as u64, recvs[i].as_mut_ptr() as u64);
        if k % 5 == 4 {
            // A broadcast from a rotating root instead.
            let root = (k as usize / 5) % world;
            // SAFETY: `sends[i]` and `recvs[i]` hold `len` f32s, alive until the end.
            unsafe {
                ccl.broadcast(
                    DevicePtr(sp),
                    DevicePtr(rp),
                    len,
                    DataType::F32,
                    root as i32,
                    c,
                    s,
                )
            }
            .unwrap();
        } else {
            // SAFETY: as above.
            unsafe {
                ccl.all_reduce(
                    DevicePtr(sp),
                    DevicePtr(rp),
                    len,
                    DataType::F32,
                    ReduceOp::SUM,
                    c,
                    s,
                )
            }
            .unwrap();
        }
        let (log, at) = (seen.clone(), rp as usize);
        host_fn(
            &dev,
            s,
            Box::new(move || {
                // SAFETY: `recvs[i]` is alive and written only by the collective before this.
                let b = unsafe { std::slice::from_raw_parts(at as *const u8, len * 4) };
                log.lock().unwrap().push((k, f32s(b)));
            }),
        );
    }
    dev.stream_synchronize(s).unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), calls as usize);
    for (j, (k, got)) in seen.iter().enumerate() {
        assert_eq!(*k, j as u64, "rank {rank}: host functions ran out of order");
        let len = sizes[j % sizes.len()];
        let want = if k % 5 == 4 {
            values(100 + k, (*k as usize / 5) % world, len)
        } else {
            sum(100 + k, world, len)
        };
        assert_eq!(got, &want, "rank {rank}: call {k} of {len} elements");
        assert_eq!(f32s(&recvs[j]), want, "rank {rank}: call {k} at the end");
    }
    assert_eq!(
        ccl.comm_async_error(c).unwrap(),
        ferrocx::abi::Status::SUCCESS
    );
    ccl.comm_finalize(c).unwrap();
    ccl.comm_destroy(c).unwrap();
    dev.stream_destroy(s).unwrap();
    dev.stream_destroy(s2).unwrap();
}

#[test]
fn stream_order_worker() {
    if let Some((rank, world)) = worker("stream_order_worker") {
        run_worker(rank, world);
    }
}

fn on(n: usize, inline_us: &str, threads: &str) {
    let marker = std::env::temp_dir().join(format!(
        "ferrocx-stream-order-{}-{n}-{inline_us}-{threads}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&marker);
    let outcomes = wait(
        spawn(
            "stream_order_worker",
            n,
            &[
                ("FERROCX_HOST_INLINE_US", inline_us.to_string()),
                ("FERROCX_HOST_THREADS", threads.to_string()),
                ("FERROCX_TEST_MARKER", marker.display().to_string()),
            ],
        ),
        Duration::from_secs(600),
    );
    let _ = std::fs::remove_file(&marker);
    assert_all_ok(&outcomes);
}

#[test]
fn inline_fast_path_keeps_stream_order_on_2_ranks() {
    on(2, "200000", "1");
}

#[test]
fn inline_fast_path_keeps_stream_order_on_3_ranks_with_helpers() {
    on(3, "200000", "3");
}

#[test]
fn inline_fast_path_keeps_stream_order_on_4_ranks() {
    on(4, "50", "2");
}

#[test]
fn stream_order_without_the_fast_path() {
    on(2, "0", "1");
}
