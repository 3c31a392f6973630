//! The host CCL's chunked all-reduce (and reduce) on random data: sizes around the chunk
//! boundaries (a 4 KiB slot, so small buffers take many chunks), buffers at offsets that are
//! and are not aligned for the type or a cache line, in place and out of place, with and
//! without streaming stores and helper threads; every result is checked exactly against a
//! reference each rank computes itself from every rank's (reproducible) inputs, and the bytes
//! around each output are checked untouched.

mod common;

use std::time::Duration;

use common::{assert_all_ok, host, spawn, unhex, wait, worker, Rng};
use ferrocx::abi::{DataType, DevicePtr, ReduceOp};
use ferrocx_adaptor_host::{bf16_to_f32, f32_to_bf16};

const SEED: u64 = 0x1A26_E5A1_1ED0;
/// The slot (and so the chunk) size the workers' communicators use.
const SLOT: usize = 4096;
/// Bytes around an output buffer that must stay as they were.
const GUARD: usize = 80;
/// What the guard bytes hold.
const FILL: u8 = 0xA5;

/// A value of `dt` as the i64 it exactly represents (wrapped into the type).
fn wrap(dt: DataType, v: i64) -> i64 {
    match dt {
        DataType::U8 => v as u8 as i64,
        DataType::I32 => v as i32 as i64,
        _ => v,
    }
}

fn encode(dt: DataType, v: i64, out: &mut [u8]) {
    match dt {
        DataType::F32 => out.copy_from_slice(&(v as f32).to_ne_bytes()),
        DataType::F64 => out.copy_from_slice(&(v as f64).to_ne_bytes()),
        DataType::BF16 => out.copy_from_slice(&f32_to_bf16(v as f32).to_ne_bytes()),
        DataType::U8 => out[0] = v as u8,
        DataType::I32 => out.copy_from_slice(&(v as i32).to_ne_bytes()),
        _ => unreachable!("types of this test"),
    }
}

fn decode(dt: DataType, b: &[u8]) -> i64 {
    match dt {
        DataType::F32 => f32::from_ne_bytes(b.try_into().unwrap()) as i64,
        DataType::F64 => f64::from_ne_bytes(b.try_into().unwrap()) as i64,
        DataType::BF16 => bf16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as i64,
        DataType::U8 => b[0] as i64,
        DataType::I32 => i32::from_ne_bytes(b.try_into().unwrap()) as i64,
        _ => unreachable!("types of this test"),
    }
}

/// Rank `rank`'s input of operation `tag`: values whose results are exact in the type (float
/// sums of small integers; integer sums wrap).
fn input(tag: u64, rank: usize, n: usize, dt: DataType) -> Vec<i64> {
    let mut rng = Rng::new(SEED ^ tag, rank as u64 + 1);
    let (lo, hi) = match dt {
        DataType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DataType::U8 => (0, 255),
        DataType::BF16 => (-30, 30),
        _ => (-1_000_000, 1_000_000),
    };
    (0..n).map(|_| rng.range(lo, hi)).collect()
}

fn reference(dt: DataType, op: ReduceOp, inputs: &[Vec<i64>], i: usize) -> i64 {
    inputs[1..].iter().fold(inputs[0][i], |acc, inp| {
        let x = inp[i];
        wrap(
            dt,
            match op {
                ReduceOp::MIN => acc.min(x),
                ReduceOp::MAX => acc.max(x),
                _ => acc.wrapping_add(x),
            },
        )
    })
}

/// `len` bytes at byte offset `off` of an 8-byte-aligned buffer, with [`GUARD`] bytes of
/// [`FILL`] on each side.
struct Buf {
    words: Vec<u64>,
    off: usize,
    len: usize,
}

impl Buf {
    fn new(off: usize, len: usize) -> Buf {
        let mut b = Buf {
            words: vec![0; (GUARD + off + len + GUARD).div_ceil(8)],
            off,
            len,
        };
        b.all().fill(FILL);
        b
    }
    fn all(&mut self) -> &mut [u8] {
        let n = self.words.len() * 8;
        // SAFETY: the Vec<u64> holds `n` bytes, borrowed uniquely.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), n) }
    }
    fn data(&mut self) -> &mut [u8] {
        let (at, len) = (GUARD + self.off, self.len);
        &mut self.all()[at..at + len]
    }
    fn ptr(&mut self) -> DevicePtr {
        DevicePtr(self.data().as_mut_ptr() as u64)
    }
    /// Panics unless the guard bytes are as they were.
    fn check_guards(&mut self, what: &str) {
        let (at, len) = (GUARD + self.off, self.len);
        let all = self.all();
        let bad = all[..at]
            .iter()
            .chain(&all[at + len..])
            .position(|b| *b != FILL);
        assert!(
            bad.is_none(),
            "{what}: a byte around the output was written"
        );
    }
}

fn run_worker(rank: usize, world: usize) {
    let (dev, ccl) = host();
    let uid = unhex(&std::env::var("FERROCX_TEST_UID").expect("uid"));
    let opts = [("slot_bytes".to_string(), SLOT.to_string())];
    let c = ccl
        .comm_init_rank(rank as i32, world as i32, 0, &uid, 60_000, &opts)
        .unwrap_or_else(|e| panic!("rank {rank}: comm_init_rank: {e}"));
    let s = dev.stream_create().unwrap();
    let mut tag = 0u64;
    let kinds = [
        (DataType::F32, ReduceOp::SUM),
        (DataType::F32, ReduceOp::MIN),
        (DataType::F64, ReduceOp::SUM),
        (DataType::I32, ReduceOp::SUM),
        (DataType::I32, ReduceOp::MAX),
        (DataType::BF16, ReduceOp::SUM),
        (DataType::U8, ReduceOp::SUM),
    ];
    for (dt, op) in kinds {
        let es = dt.size().unwrap();
        let per = SLOT / es;
        // Just above the one-shot path, around one and two chunks, and many chunks with a
        // short last one.
        let sizes = [
            per + 1,
            2 * per - 1,
            2 * per,
            2 * per + 1,
            5 * per + 3,
            37 * per + 11,
        ];
        // (send offset, recv offset, in place): aligned for the type but not a line, and one
        // byte off (misaligned for every type but U8).
        let places = [
            (0, 0, false),
            (es, 3 * es, false),
            (0, 1, false),
            (1, 0, false),
            (0, 0, true),
            (es, es, true),
            (1, 1, true),
        ];
        for n in sizes {
            for (so, ro, in_place) in places {
                tag += 1;
                let what = format!(
                    "rank {rank}: all_reduce {dt:?} {op:?} n={n} send+{so} recv+{ro}{}",
                    if in_place { " in place" } else { "" }
                );
                let ins: Vec<Vec<i64>> = (0..world).map(|r| input(tag, r, n, dt)).collect();
                let mut send = Buf::new(so, n * es);
                for (i, v) in ins[rank].iter().enumerate() {
                    encode(dt, *v, &mut send.data()[i * es..(i + 1) * es]);
                }
                let mut recv = Buf::new(ro, n * es);
                let (sp, rp) = if in_place {
                    (send.ptr(), send.ptr())
                } else {
                    (send.ptr(), recv.ptr())
                };
                // SAFETY: both pointers hold `n` elements of `dt` in this process (the host
                // device addresses process memory); read after the stream is synchronized.
                unsafe { ccl.all_reduce(sp, rp, n, dt, op, c, s) }.unwrap();
                dev.stream_synchronize(s)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let out = if in_place { &mut send } else { &mut recv };
                out.check_guards(&what);
                let got = out.data();
                for i in 0..n {
                    let want = reference(dt, op, &ins, i);
                    let g = decode(dt, &got[i * es..(i + 1) * es]);
                    assert_eq!(g, want, "{what}: element {i}");
                }
            }
        }
    }
    // A reduce to a root over many chunks: only the root's output is written.
    for root in [0, world - 1] {
        tag += 1;
        let (dt, n) = (DataType::F32, 9 * SLOT / 4 + 5);
        let ins: Vec<Vec<i64>> = (0..world).map(|r| input(tag, r, n, dt)).collect();
        let mut send = Buf::new(4, n * 4);
        for (i, v) in ins[rank].iter().enumerate() {
            encode(dt, *v, &mut send.data()[i * 4..(i + 1) * 4]);
        }
        let mut recv = Buf::new(12, n * 4);
        let before = recv.data().to_vec();
        // SAFETY: as above.
        unsafe {
            ccl.reduce(
                send.ptr(),
                recv.ptr(),
                n,
                dt,
                ReduceOp::SUM,
                root as i32,
                c,
                s,
            )
        }
        .unwrap();
        dev.stream_synchronize(s).unwrap();
        recv.check_guards("reduce");
        let got = recv.data();
        if rank == root {
            for i in 0..n {
                let want = reference(dt, ReduceOp::SUM, &ins, i);
                assert_eq!(decode(dt, &got[i * 4..(i + 1) * 4]), want, "reduce {i}");
            }
        } else {
            assert_eq!(got, &before[..], "reduce: a non-root's output was written");
        }
    }
    ccl.comm_finalize(c).unwrap();
    ccl.comm_destroy(c).unwrap();
    dev.stream_destroy(s).unwrap();
}

#[test]
fn large_all_reduce_worker() {
    if let Some((rank, world)) = worker("large_all_reduce_worker") {
        run_worker(rank, world);
    }
}

/// `n` ranks with `threads` threads each (every copy and reduction split over them) and the
/// output written by streaming stores at every size (`stream`) or never.
fn on(n: usize, threads: usize, stream: bool) {
    let env = [
        ("FERROCX_HOST_THREADS", threads.to_string()),
        ("FERROCX_HOST_PAR_MIN", "0".to_string()),
        (
            "FERROCX_HOST_STREAM_MIN",
            if stream { "0" } else { "18446744073709551615" }.to_string(),
        ),
    ];
    let outcomes = wait(
        spawn("large_all_reduce_worker", n, &env),
        Duration::from_secs(600),
    );
    assert_all_ok(&outcomes);
}

#[test]
fn two_ranks_three_threads_streaming() {
    on(2, 3, true);
}

#[test]
fn three_ranks_two_threads_cached() {
    on(3, 2, false);
}

#[test]
fn four_ranks_one_thread_streaming() {
    on(4, 1, true);
}

#[test]
fn four_ranks_two_threads_cached() {
    on(4, 2, false);
}
