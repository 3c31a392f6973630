//! The host device's memops group (ABI 1.3) through the core's safe handle: a chain of waits
//! and stores across streams, enqueued all at once, runs in the order the counter imposes,
//! with the counter wrapping past `u32::MAX`.

use std::sync::atomic::{AtomicU32, Ordering};

use ferrocx::abi::{DevicePtr, Status, Stream, WAIT_VALUE_EQ, WAIT_VALUE_GEQ};
use ferrocx::adaptor::{AdaptorError, Device};
use ferrocx::registry::Registry;
use ferrocx_test_support::{fresh_seed, Rng};

fn host() -> Device {
    ferrocx_adaptor_host::link();
    let registry = Registry::with_builtins();
    let dev = registry
        .device("host")
        .expect("the host adaptor is built in")
        .device()
        .expect("device");
    dev.init(&[]).expect("init");
    dev
}

/// Step `k` (on stream `k % streams`) waits until the counter reaches `base + k` (GEQ), copies
/// the value step `k - 1` stored into `seen[k]`, stores its own random value into `log[k]`,
/// then moves the counter to `base + k + 1`. Everything is enqueued before anything runs: only
/// the waits order the steps.
fn chain(dev: &Device, streams: usize, steps: usize, base: u32, seed: u64) {
    let mut rng = Rng::new(seed, streams as u64);
    let values: Vec<u32> = (0..steps).map(|_| rng.next_u64() as u32).collect();
    let counter = Box::new(AtomicU32::new(base));
    let log: Vec<AtomicU32> = (0..steps).map(|_| AtomicU32::new(0)).collect();
    let seen: Vec<AtomicU32> = (0..steps).map(|_| AtomicU32::new(0)).collect();
    let ss: Vec<Stream> = (0..streams).map(|_| dev.stream_create().unwrap()).collect();
    // Enqueue in a shuffled order of streams, so no stream's queue order hides a missing wait.
    let mut order: Vec<usize> = (0..steps).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.range(0, i as i64) as usize);
    }
    let mut by_stream: Vec<Vec<usize>> = vec![Vec::new(); streams];
    for k in 0..steps {
        by_stream[k % streams].push(k);
    }
    // Each stream's steps stay in increasing order (its own queue order), the streams
    // interleave in the shuffled order.
    let mut next = vec![0usize; streams];
    for &k in &order {
        let si = k % streams;
        let k = by_stream[si][next[si]];
        next[si] += 1;
        let s = ss[si];
        // SAFETY: every word lives until the streams are synchronized below.
        unsafe {
            dev.stream_wait_value32(
                s,
                counter.as_ptr(),
                base.wrapping_add(k as u32),
                WAIT_VALUE_GEQ,
            )
            .unwrap();
            if k > 0 {
                dev.mem_copy_async(
                    DevicePtr(seen[k].as_ptr() as u64),
                    DevicePtr(log[k - 1].as_ptr() as u64),
                    4,
                    s,
                )
                .unwrap();
            }
            dev.stream_write_value32(s, log[k].as_ptr(), values[k])
                .unwrap();
            dev.stream_write_value32(s, counter.as_ptr(), base.wrapping_add(k as u32 + 1))
                .unwrap();
        }
    }
    for &s in &ss {
        dev.stream_synchronize(s).unwrap();
    }
    assert_eq!(
        counter.load(Ordering::SeqCst),
        base.wrapping_add(steps as u32)
    );
    for k in 0..steps {
        assert_eq!(log[k].load(Ordering::SeqCst), values[k], "log[{k}]");
        if k > 0 {
            assert_eq!(
                seen[k].load(Ordering::SeqCst),
                values[k - 1],
                "step {k} ran before step {} stored (seed {seed})",
                k - 1
            );
        }
    }
    for s in ss {
        dev.stream_destroy(s).unwrap();
    }
}

#[test]
fn the_host_device_exports_the_memops_group() {
    let dev = host();
    assert!(dev.has_memops());
    let caps = dev.caps();
    assert!(caps.has_memops());
    assert_eq!(caps.memops.as_ref().unwrap().version, (1, 3));
}

#[test]
fn a_chain_of_waits_across_streams_runs_in_counter_order() {
    let dev = host();
    let seed = fresh_seed();
    let mut rng = Rng::new(seed, 99);
    // Counters that wrap past u32::MAX mid-chain, start at 0, and start anywhere.
    let random_base = rng.next_u64() as u32;
    for (streams, steps, base) in [
        (2, 7, u32::MAX - 3),
        (3, 64, 0),
        (5, 129, random_base),
        (4, 33, u32::MAX),
    ] {
        chain(&dev, streams, steps, base, seed ^ steps as u64);
    }
}

#[test]
fn eq_waits_for_the_exact_value_and_bad_arguments_are_refused() {
    let dev = host();
    let word = Box::new(AtomicU32::new(0));
    let out = Box::new(AtomicU32::new(0));
    let (a, b) = (dev.stream_create().unwrap(), dev.stream_create().unwrap());
    // SAFETY: both words outlive the streams' work (synchronized below).
    unsafe {
        // b: wait for exactly 3, then store 1 to `out`. a stores 4 first (past 3: not equal),
        // then 3 only after b's wait would have passed wrongly.
        dev.stream_wait_value32(b, word.as_ptr(), 3, WAIT_VALUE_EQ)
            .unwrap();
        dev.stream_write_value32(b, out.as_ptr(), 1).unwrap();
        dev.stream_write_value32(a, word.as_ptr(), 4).unwrap();
        dev.stream_synchronize(a).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(out.load(Ordering::SeqCst), 0, "EQ 3 passed at 4");
        dev.stream_write_value32(a, word.as_ptr(), 3).unwrap();
        dev.stream_synchronize(b).unwrap();
        assert_eq!(out.load(Ordering::SeqCst), 1);

        for (what, r) in [
            ("flags 7", dev.stream_wait_value32(a, word.as_ptr(), 0, 7)),
            (
                "a null address",
                dev.stream_write_value32(a, std::ptr::null_mut(), 0),
            ),
            (
                "a misaligned address",
                dev.stream_wait_value32(a, (word.as_ptr() as usize + 1) as *const u32, 0, 0),
            ),
        ] {
            match r {
                Err(AdaptorError::Failed {
                    status, message, ..
                }) => {
                    assert_eq!(status, Status::INVALID_ARGUMENT, "{what}: {message}");
                    assert!(!message.is_empty());
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    dev.stream_destroy(a).unwrap();
    dev.stream_destroy(b).unwrap();
}
