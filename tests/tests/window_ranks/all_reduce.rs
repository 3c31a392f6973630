//! All-reduce cases shared by the window-collective tests of the host backend and of GPUs:
//! counter-based random inputs (every rank can compute every rank's input without storing
//! it), the references they are checked against, and the workloads.

use std::time::Instant;

use ferrocx::abi::{DataType, DevicePtr, MemKind, ReduceOp};
use ferrocx::comm::Communicator;
use ferrocx::window::collectives::WindowAlgo;
use ferrocx_adaptor_host::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

use super::{host_ptr, host_ptr_mut, Finished};

pub const TYPES: [DataType; 4] = [DataType::F32, DataType::BF16, DataType::F16, DataType::I32];
pub const OPS: [ReduceOp; 3] = [ReduceOp::SUM, ReduceOp::MIN, ReduceOp::MAX];

/// splitmix64.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The bits of element `i` of rank `rank`'s input in case `case`: uniform in [-1, 1) for the
/// float types (rounded to the type), in [-2^20, 2^20) for i32.
pub fn input_bits(case: u64, rank: usize, i: usize, dtype: DataType) -> u32 {
    let r = mix(mix(case ^ ((rank as u64) << 48)) ^ i as u64);
    let unit = (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
    match dtype {
        DataType::F32 => unit.to_bits(),
        DataType::BF16 => u32::from(f32_to_bf16(unit)),
        DataType::F16 => u32::from(f32_to_f16(unit)),
        _ => ((r >> 32) as i32 >> 11) as u32,
    }
}

pub fn size_of(dtype: DataType) -> usize {
    dtype.size().expect("a known type")
}

/// The value of element bits as f64 (i32 as an integer).
pub fn value(bits: u32, dtype: DataType) -> f64 {
    match dtype {
        DataType::F32 => f64::from(f32::from_bits(bits)),
        DataType::BF16 => f64::from(bf16_to_f32(bits as u16)),
        DataType::F16 => f64::from(f16_to_f32(bits as u16)),
        _ => f64::from(bits as i32),
    }
}

pub fn to_f32(bits: u32, dtype: DataType) -> f32 {
    value(bits, dtype) as f32
}

pub fn from_f32(v: f32, dtype: DataType) -> u32 {
    match dtype {
        DataType::F32 => v.to_bits(),
        DataType::BF16 => u32::from(f32_to_bf16(v)),
        _ => u32::from(f32_to_f16(v)),
    }
}

/// Rank `rank`'s input of case `case` as bytes.
pub fn input(case: u64, rank: usize, count: usize, dtype: DataType) -> Vec<u8> {
    let es = size_of(dtype);
    let mut out = Vec::with_capacity(count * es);
    for i in 0..count {
        let b = input_bits(case, rank, i, dtype);
        out.extend_from_slice(&b.to_le_bytes()[..es]);
    }
    out
}

pub fn element(bytes: &[u8], i: usize, dtype: DataType) -> u32 {
    let es = size_of(dtype);
    let mut w = [0u8; 4];
    w[..es].copy_from_slice(&bytes[i * es..(i + 1) * es]);
    u32::from_le_bytes(w)
}

/// The spacing of `dtype`'s values near `m` (its unit in the last place).
pub fn ulp(m: f64, dtype: DataType) -> f64 {
    let (mantissa, min_exp) = match dtype {
        DataType::F32 => (23, -126),
        DataType::BF16 => (7, -126),
        _ => (10, -14),
    };
    // 2^floor(log2 m): m's exponent bits alone.
    let power = f64::from_bits(m.to_bits() & 0x7ff0_0000_0000_0000);
    let floor = 2f64.powi(min_exp);
    power.max(floor) * 2f64.powi(-mantissa)
}

/// Checks elements `range` of `got` (a rank's result of case `case`) one by one:
/// - min, max and i32 sums exactly against the reduction of the inputs;
/// - float sums of one-shot and two-shot exactly against the sum accumulated in f32 in rank
///   order and rounded once (what both compute);
/// - float sums of the ring within `world` units in the last place of the type at the sum of
///   magnitudes of a double-precision sum (its partial sums are rounded to the type).
#[allow(clippy::too_many_arguments)]
pub fn check(
    got: &[u8],
    range: std::ops::Range<usize>,
    case: u64,
    world: usize,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    algo: WindowAlgo,
) {
    let mut inputs = [0u32; 8];
    for i in range {
        for (r, x) in inputs[..world].iter_mut().enumerate() {
            *x = input_bits(case, r, i, dtype);
        }
        let xs = &inputs[..world];
        let g = element(got, i, dtype);
        let what = || {
            format!(
                "{algo} {dtype:?} {op:?} of {count} elements on {world} ranks, element {i}: inputs {:?}",
                xs.iter().map(|&x| value(x, dtype)).collect::<Vec<_>>()
            )
        };
        if dtype == DataType::I32 {
            let v = xs.iter().map(|&x| x as i32);
            let want = match op {
                ReduceOp::SUM => v.fold(0i32, i32::wrapping_add),
                ReduceOp::MIN => v.min().unwrap_or(0),
                _ => v.max().unwrap_or(0),
            };
            assert_eq!(g as i32, want, "{}", what());
            continue;
        }
        if op != ReduceOp::SUM {
            let pick = |a: &u32, b: &u32| value(*a, dtype).total_cmp(&value(*b, dtype));
            let want = if op == ReduceOp::MIN {
                xs.iter().min_by(|a, b| pick(a, b))
            } else {
                xs.iter().max_by(|a, b| pick(a, b))
            };
            assert_eq!(Some(&g), want, "{}", what());
            continue;
        }
        if algo != WindowAlgo::Ring {
            let acc = xs[1..]
                .iter()
                .fold(to_f32(xs[0], dtype), |a, &x| a + to_f32(x, dtype));
            assert_eq!(
                g,
                from_f32(acc, dtype),
                "{}: got {}, rank-order f32 sum {acc}",
                what(),
                value(g, dtype)
            );
        } else {
            let exact: f64 = xs.iter().map(|&x| value(x, dtype)).sum();
            let magnitude: f64 = xs.iter().map(|&x| value(x, dtype).abs()).sum();
            let tol = world as f64 * ulp(magnitude, dtype);
            let d = (value(g, dtype) - exact).abs();
            assert!(
                d <= tol,
                "{}: got {}, exact {exact}, off by {d} > {tol}",
                what(),
                value(g, dtype)
            );
        }
    }
}

/// FNV-1a of a result, printed by every rank: they must agree bit for bit.
pub fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Device buffers of `bytes` for input and output.
pub struct Buffers<'a> {
    comm: &'a Communicator,
    pub send: DevicePtr,
    pub recv: DevicePtr,
}

impl<'a> Buffers<'a> {
    pub fn new(comm: &'a Communicator, bytes: usize) -> Self {
        let alloc = || {
            comm.device()
                .mem_alloc(bytes.max(1), MemKind::DEVICE)
                .expect("alloc")
        };
        Buffers {
            comm,
            send: alloc(),
            recv: alloc(),
        }
    }
}

impl Drop for Buffers<'_> {
    fn drop(&mut self) {
        for p in [self.send, self.recv] {
            // SAFETY: the allocations `new` made, freed once; every user of `Buffers` synchronizes
            // before dropping it.
            let _ = unsafe { self.comm.device().mem_free(p, MemKind::DEVICE) };
        }
    }
}

/// Runs case `case` of `algo` (in place when `in_place`) and checks it; returns the result's
/// digest.
#[allow(clippy::too_many_arguments)]
pub fn run_case(
    comm: &Communicator,
    bufs: &Buffers<'_>,
    case: u64,
    count: usize,
    dtype: DataType,
    op: ReduceOp,
    algo: Option<WindowAlgo>,
    in_place: bool,
    chunk: usize,
) -> u64 {
    let (me, world) = (comm.rank(), comm.world());
    let bytes = count * size_of(dtype);
    let mine = input(case, me, count, dtype);
    let dev = comm.device();
    // SAFETY: `bufs` buffers hold the largest case, at least `bytes`; `mine` holds `bytes`.
    unsafe { dev.mem_copy(bufs.send, host_ptr(&mine), bytes) }.expect("upload");
    let recv = if in_place { bufs.send } else { bufs.recv };
    // SAFETY: the case's buffers hold `count` elements of `dtype` and outlive the
    // synchronize below.
    unsafe { comm.all_reduce_window(bufs.send, recv, count, dtype, op, algo) }
        .unwrap_or_else(|e| panic!("case {case}: {e}"));
    comm.synchronize()
        .unwrap_or_else(|e| panic!("case {case}: {e}"));
    let mut got = vec![0u8; bytes];
    // SAFETY: as above, after the synchronize; `got` holds `bytes`.
    unsafe { dev.mem_copy(host_ptr_mut(&mut got), recv, bytes) }.expect("download");
    // The ring is the algorithm beyond one parity of the scratch window, whatever was asked.
    let ran = match algo {
        Some(a) if bytes <= world * chunk => a,
        _ => WindowAlgo::Ring,
    };
    // Large results: each rank checks its own slice, and the digests (compared across ranks
    // by the parent) show that every rank holds the same bits.
    let range = if count >= 1 << 16 {
        let per = count.div_ceil(world);
        (me * per).min(count)..((me + 1) * per).min(count)
    } else {
        0..count
    };
    check(&got, range, case, world, count, dtype, op, ran);
    digest(&got)
}

/// Every algorithm, type and op at 1, 7, 4099 and 1 MiB + 3 elements, alternately in place;
/// prints each result's digest. `chunk`: the backend's chunk slot (a parity is `world` of them).
pub fn every_type_op_and_algorithm(comm: &Communicator, test: &str, chunk: usize) {
    let (me, world) = (comm.rank(), comm.world());
    let max = (1 << 20) + 3 * 4;
    let bufs = Buffers::new(comm, max);
    let mut case = 0u64;
    for algo in WindowAlgo::ALL {
        for dtype in TYPES {
            let es = size_of(dtype);
            for op in OPS {
                for count in [1, 7, 4099, (1 << 20) / es + 3] {
                    case += 1;
                    let d = run_case(
                        comm,
                        &bufs,
                        case,
                        count,
                        dtype,
                        op,
                        Some(algo),
                        case % 2 == 0,
                        chunk,
                    );
                    println!("DIGEST {case} {d:016x}");
                }
            }
        }
    }
    println!("{test}: rank {me} of {world}: {case} cases checked");
    println!("RANK OK");
}

/// Every rank printed the same digest for every case.
pub fn same_digests(out: &[Finished]) {
    let first = out[0].lines("DIGEST ");
    assert!(!first.is_empty(), "{}", out[0].stdout);
    for f in out {
        assert_eq!(f.lines("DIGEST "), first, "rank {} differs", f.rank);
    }
}

/// 64 MiB of f32 summed (the ring, in many rounds; also what the size-based choice picks), and
/// odd sizes over several rounds for the half types.
pub fn large(comm: &Communicator, test: &str, chunk: usize) {
    let bytes = (64 << 20) + 4 * 3;
    let bufs = Buffers::new(comm, bytes);
    let f32s = bytes / 4;
    let start = Instant::now();
    let d1 = run_case(
        comm,
        &bufs,
        101,
        f32s,
        DataType::F32,
        ReduceOp::SUM,
        Some(WindowAlgo::Ring),
        false,
        chunk,
    );
    // What the size picks (the ring), in place.
    let d2 = if comm.world() == 2 {
        run_case(
            comm,
            &bufs,
            102,
            f32s,
            DataType::F32,
            ReduceOp::SUM,
            None,
            true,
            chunk,
        )
    } else {
        0
    };
    let odd = 3 * comm.world() * (1 << 20) / 2 + 5;
    let d3 = run_case(
        comm,
        &bufs,
        103,
        odd,
        DataType::BF16,
        ReduceOp::SUM,
        Some(WindowAlgo::Ring),
        false,
        chunk,
    );
    let d4 = run_case(
        comm,
        &bufs,
        104,
        odd,
        DataType::F16,
        ReduceOp::MAX,
        Some(WindowAlgo::TwoShot),
        true,
        chunk,
    );
    println!("DIGEST {d1:016x} {d2:016x} {d3:016x} {d4:016x}");
    println!(
        "{test}: rank {}: 64 MiB f32 and {odd} halves twice in {:.1} s",
        comm.rank(),
        start.elapsed().as_secs_f64()
    );
    println!("RANK OK");
}

/// 1000 calls enqueued back to back in one window, alternating algorithms, sizes, types and
/// in-place use, with one rank's stream held up now and then (so that peers run rounds ahead
/// of it and reuse the scratch window's parities while it still reads), synchronized once; then
/// every result is checked.
pub fn back_to_back(comm: &Communicator, test: &str) {
    let (me, world) = (comm.rank(), comm.world());
    let dev = comm.device();
    const CALLS: usize = 1000;
    let plan: Vec<(WindowAlgo, DataType, ReduceOp, usize, bool)> = (0..CALLS)
        .map(|k| {
            let r = mix(k as u64 ^ 0xbac0);
            (
                WindowAlgo::ALL[k % 3],
                TYPES[(r % 4) as usize],
                OPS[((r >> 8) % 3) as usize],
                1 + (r >> 16) as usize % 300,
                (r >> 40) % 3 == 0,
            )
        })
        .collect();
    let slot = 300 * 4;
    let ins = dev.mem_alloc(CALLS * slot, MemKind::DEVICE).expect("alloc");
    let outs = dev.mem_alloc(CALLS * slot, MemKind::DEVICE).expect("alloc");
    let stall = dev.mem_alloc(16 << 20, MemKind::DEVICE).expect("alloc");
    for (k, &(_, dtype, _, count, _)) in plan.iter().enumerate() {
        let data = input(1000 + k as u64, me, count, dtype);
        // SAFETY: slot `k` of `ins`, `slot >= data.len()` bytes.
        unsafe {
            dev.mem_copy(
                DevicePtr(ins.0 + (k * slot) as u64),
                host_ptr(&data),
                data.len(),
            )
        }
        .expect("upload");
    }
    comm.barrier().expect("barrier");
    let start = Instant::now();
    for (k, &(algo, dtype, op, count, in_place)) in plan.iter().enumerate() {
        let send = DevicePtr(ins.0 + (k * slot) as u64);
        let recv = if in_place {
            send
        } else {
            DevicePtr(outs.0 + (k * slot) as u64)
        };
        if k % 37 == me % 37 {
            // Holds this rank's stream up for a while: its peers run ahead into the next rounds.
            // SAFETY: `stall` holds 16 MiB and is freed after the synchronize below.
            unsafe { dev.mem_set_async(stall, (k % 251) as u8, 16 << 20, comm.stream()) }
                .expect("stall");
        }
        // SAFETY: slots of buffers sized for every call, freed after the synchronize below.
        unsafe { comm.all_reduce_window(send, recv, count, dtype, op, Some(algo)) }
            .unwrap_or_else(|e| panic!("call {k}: {e}"));
    }
    comm.synchronize().expect("synchronize");
    let elapsed = start.elapsed();
    for (k, &(algo, dtype, op, count, in_place)) in plan.iter().enumerate() {
        let at = if in_place { ins.0 } else { outs.0 } + (k * slot) as u64;
        let mut got = vec![0u8; count * size_of(dtype)];
        // SAFETY: slot `k` of `ins` or `outs`, `slot >= got.len()` bytes, after the synchronize.
        unsafe { dev.mem_copy(host_ptr_mut(&mut got), DevicePtr(at), got.len()) }
            .expect("download");
        check(
            &got,
            0..count,
            1000 + k as u64,
            world,
            count,
            dtype,
            op,
            algo,
        );
    }
    for p in [ins, outs, stall] {
        // SAFETY: the allocations made above; the stream was synchronized.
        unsafe { dev.mem_free(p, MemKind::DEVICE) }.expect("free");
    }
    println!(
        "CALLS {test}: rank {me}: {CALLS} calls in {:.1} ms, every result checked",
        elapsed.as_secs_f64() * 1e3
    );
    println!("RANK OK");
}
