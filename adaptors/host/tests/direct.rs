//! Large reduce-scatters, all-gathers and all-reduces of the host CCL that read the peers'
//! buffers where they lie (device memory of the host device: shared-memory segments), on random data
//! checked exactly against a reference each rank computes from every rank's inputs: blocks of
//! 256 KiB and odd sizes past it, out of place and in place (the own block), the output
//! overlapping the input otherwise (no rank reads in place then), one rank's input in C-heap
//! memory (every rank takes the slot path), and the same buffers call after call (mapped once).
//! Each rank counts the calls that read in place (`reads_in_place`): every call that can, and
//! none that cannot (C-heap memory on one rank, the reads in place off).

mod common;

use std::time::Duration;

use common::{assert_all_ok, host, spawn, unhex, wait, worker, Rng};
use ferrocx::abi::{DataType, DevicePtr, MemKind, ReduceOp};

const SEED: u64 = 0xD1_4EC7;

fn input(tag: u64, rank: usize, n: usize) -> Vec<i32> {
    let mut rng = Rng::new(SEED ^ tag, rank as u64 + 1);
    (0..n)
        .map(|_| rng.range(-1_000_000, 1_000_000) as i32)
        .collect()
}

/// Element `at` reduced over every rank's input by `op` (the reference).
fn reduced(ins: &[Vec<i32>], at: usize, op: ReduceOp) -> i32 {
    ins.iter().skip(1).fold(ins[0][at], |a, v| match op {
        ReduceOp::MAX => a.max(v[at]),
        _ => a.wrapping_add(v[at]),
    })
}

/// A buffer of `n` i32: device memory of the host device, or C-heap memory (`heap`).
struct Buf {
    ptr: DevicePtr,
    n: usize,
    heap: Option<Vec<i32>>,
}

impl Buf {
    fn new(dev: &ferrocx::adaptor::Device, n: usize, heap: bool) -> Buf {
        if heap {
            let mut v = vec![0i32; n];
            return Buf {
                ptr: DevicePtr(v.as_mut_ptr() as u64),
                n,
                heap: Some(v),
            };
        }
        Buf {
            ptr: dev.mem_alloc(n * 4, MemKind::DEVICE).expect("alloc"),
            n,
            heap: None,
        }
    }
    fn at(&self, i: usize) -> DevicePtr {
        DevicePtr(self.ptr.0 + 4 * i as u64)
    }
    /// Writes `data` at element `at`.
    fn set(&self, at: usize, data: &[i32]) {
        assert!(at + data.len() <= self.n);
        // SAFETY: within the buffer's `n` i32 of this process's memory (the host device
        // addresses it), not in use by a collective.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.ptr.0 as *mut i32).add(at),
                data.len(),
            )
        };
    }
    /// Elements `at..at + len`.
    fn get(&self, at: usize, len: usize) -> Vec<i32> {
        assert!(at + len <= self.n);
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts((self.ptr.0 as *const i32).add(at), len) }.to_vec()
    }
    fn free(self, dev: &ferrocx::adaptor::Device) {
        if self.heap.is_none() {
            // SAFETY: allocated above, freed once.
            unsafe { dev.mem_free(self.ptr, MemKind::DEVICE) }.expect("free");
        }
    }
}

fn run_worker(rank: usize, world: usize) {
    let (dev, ccl) = host();
    let uid = unhex(&std::env::var("FERROCX_TEST_UID").expect("uid"));
    let c = ccl
        .comm_init_rank(rank as i32, world as i32, 0, &uid, 60_000, &[])
        .unwrap_or_else(|e| panic!("rank {rank}: comm_init_rank: {e}"));
    let s = dev.stream_create().unwrap();
    let heap_rank = std::env::var("HEAP_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let mut tag = 0u64;
    // Blocks of exactly 256 KiB (the smallest read in place), odd, and larger.
    for block in [65_536usize, 65_537, 100_003] {
        for op in [ReduceOp::SUM, ReduceOp::MAX] {
            // 0: out of place; 1: in place (the own block); 2: the output is the input's
            // start (overlapping other ranks' blocks: nobody reads in place).
            for place in 0..3 {
                tag += 1;
                let what =
                    format!("rank {rank}: reduce_scatter {op:?} block={block} place={place}");
                let ins: Vec<Vec<i32>> = (0..world).map(|r| input(tag, r, block * world)).collect();
                let send = Buf::new(&dev, block * world, heap_rank == Some(rank));
                send.set(0, &ins[rank]);
                let recv = Buf::new(&dev, block, false);
                let out = match place {
                    0 => recv.ptr,
                    1 => send.at(rank * block),
                    _ => send.ptr,
                };
                // Several calls on the same buffers (the later ones find them mapped).
                for call in 0..3 {
                    if call > 0 {
                        send.set(0, &ins[rank]);
                    }
                    // SAFETY: `send` holds world blocks, `out` one block, in this process.
                    unsafe { ccl.reduce_scatter(send.ptr, out, block, DataType::I32, op, c, s) }
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    dev.stream_synchronize(s)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    // SAFETY: `out` holds one block of i32, written by the call.
                    let got = unsafe { std::slice::from_raw_parts(out.0 as *const i32, block) };
                    for (i, g) in got.iter().enumerate() {
                        let at = rank * block + i;
                        assert_eq!(
                            *g,
                            reduced(&ins, at, op),
                            "{what}, call {call}: element {i}"
                        );
                    }
                }
                send.free(&dev);
                recv.free(&dev);
            }
        }
        // All-gather: out of place, and in place (the input is the own block of the output).
        for in_place in [false, true] {
            tag += 1;
            let what = format!("rank {rank}: all_gather block={block} in_place={in_place}");
            let ins: Vec<Vec<i32>> = (0..world).map(|r| input(tag, r, block)).collect();
            let recv = Buf::new(&dev, block * world, false);
            let send = Buf::new(&dev, block, heap_rank == Some(rank));
            let src = if in_place {
                recv.set(rank * block, &ins[rank]);
                recv.at(rank * block)
            } else {
                send.set(0, &ins[rank]);
                send.ptr
            };
            for call in 0..3 {
                // SAFETY: `src` holds a block, `recv` world blocks, in this process.
                unsafe { ccl.all_gather(src, recv.ptr, block, DataType::I32, c, s) }
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                dev.stream_synchronize(s)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                for (r, want) in ins.iter().enumerate() {
                    assert!(
                        recv.get(r * block, block) == want[..],
                        "{what}, call {call}: block {r}"
                    );
                }
            }
            send.free(&dev);
            recv.free(&dev);
        }
    }
    // All-reduce: out of place and in place, 256 KiB a share and odd sizes past it.
    for count in [65_536 * world, 65_536 * world + 5, 90_001 * world + 3] {
        for op in [ReduceOp::SUM, ReduceOp::MAX] {
            for place in 0..2 {
                tag += 1;
                let what = format!("rank {rank}: all_reduce {op:?} count={count} place={place}");
                let ins: Vec<Vec<i32>> = (0..world).map(|r| input(tag, r, count)).collect();
                let send = Buf::new(&dev, count, heap_rank == Some(rank));
                let recv = Buf::new(&dev, count, false);
                let (sp, rp) = match place {
                    0 => (send.ptr, recv.ptr),
                    _ => (send.ptr, send.ptr),
                };
                for call in 0..2 {
                    send.set(0, &ins[rank]);
                    // SAFETY: `sp` and `rp` hold `count` i32 each, in this process.
                    unsafe { ccl.all_reduce(sp, rp, count, DataType::I32, op, c, s) }
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    dev.stream_synchronize(s)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    // SAFETY: `rp` holds `count` i32 written by the call.
                    let got = unsafe { std::slice::from_raw_parts(rp.0 as *const i32, count) };
                    for (i, g) in got.iter().enumerate() {
                        assert_eq!(*g, reduced(&ins, i, op), "{what}, call {call}: element {i}");
                    }
                }
                send.free(&dev);
                recv.free(&dev);
            }
        }
    }
    ccl.comm_finalize(c).unwrap();
    ccl.comm_destroy(c).unwrap();
    dev.stream_destroy(s).unwrap();
    // Which path the calls took (the values above are the same on every path): of the 96
    // calls above, 78 can read in place (36 of the 54 reduce-scatters: not those whose output
    // overlaps other ranks' blocks; the 18 all-gathers; the 24 all-reduces); with C-heap
    // memory on one rank, only its 9 all-gathers in place (their input is device memory, the
    // own block of the output); with the reads off, none.
    let want: u64 = std::env::var("EXPECT_READS")
        .expect("EXPECT_READS")
        .parse()
        .expect("a count");
    let took = ferrocx_adaptor_host::reads_in_place();
    assert_eq!(
        took, want,
        "rank {rank}: calls that read the peers' buffers in place"
    );
}

#[test]
fn direct_worker() {
    if let Some((rank, world)) = worker("direct_worker") {
        run_worker(rank, world);
    }
}

fn on(n: usize, env: &[(&str, String)]) {
    let children = spawn("direct_worker", n, env);
    assert_all_ok(&wait(children, Duration::from_secs(120)));
}

#[test]
fn reads_in_place_on_3_ranks() {
    on(3, &[("EXPECT_READS", "78".to_string())]);
}

#[test]
fn reads_in_place_on_4_ranks_with_helpers() {
    on(
        4,
        &[
            ("FERROCX_HOST_THREADS", "3".to_string()),
            ("EXPECT_READS", "78".to_string()),
        ],
    );
}

#[test]
fn one_rank_in_c_heap_memory_sends_every_rank_the_slot_way() {
    on(
        3,
        &[
            ("HEAP_RANK", "1".to_string()),
            ("EXPECT_READS", "9".to_string()),
        ],
    );
}

#[test]
fn with_the_reads_in_place_off_every_rank_takes_the_slot_way() {
    on(
        3,
        &[
            ("FERROCX_HOST_DIRECT", "0".to_string()),
            ("EXPECT_READS", "0".to_string()),
        ],
    );
}
