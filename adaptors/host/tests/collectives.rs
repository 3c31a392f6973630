//! Every collective of the host CCL on 1, 2, 3, 4 and 7 processes, on random data, against a
//! reference each rank computes independently from every rank's (reproducible) inputs.

mod common;

use std::time::Duration;

use common::{assert_all_ok, comm, host, spawn, wait, worker, Rng};
use ferrocx::abi::{DataType, DevicePtr, ReduceOp};
use ferrocx_adaptor_host::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

const SEED: u64 = 0x5EED_F00D;
/// 1 MiB + 3 elements.
const BIG: usize = (1 << 20) + 3;
const SIZES: [usize; 4] = [0, 1, 7, 1027];

fn encode(dt: DataType, v: i64) -> Vec<u8> {
    match dt {
        DataType::F32 => (v as f32).to_ne_bytes().to_vec(),
        DataType::F64 => (v as f64).to_ne_bytes().to_vec(),
        DataType::F16 => f32_to_f16(v as f32).to_ne_bytes().to_vec(),
        DataType::BF16 => f32_to_bf16(v as f32).to_ne_bytes().to_vec(),
        DataType::I8 => (v as i8).to_ne_bytes().to_vec(),
        DataType::U8 => (v as u8).to_ne_bytes().to_vec(),
        DataType::I32 => (v as i32).to_ne_bytes().to_vec(),
        DataType::U32 => (v as u32).to_ne_bytes().to_vec(),
        DataType::I64 => v.to_ne_bytes().to_vec(),
        _ => (v as u64).to_ne_bytes().to_vec(),
    }
}

fn decode(dt: DataType, b: &[u8]) -> f64 {
    match dt {
        DataType::F32 => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::F64 => f64::from_ne_bytes(b.try_into().unwrap()),
        DataType::F16 => f16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64,
        DataType::BF16 => bf16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64,
        DataType::I8 => i8::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::U8 => b[0] as f64,
        DataType::I32 => i32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::U32 => u32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::I64 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
        _ => u64::from_ne_bytes(b.try_into().unwrap()) as f64,
    }
}

fn is_float(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::BF16
    )
}

fn unsigned(dt: DataType) -> bool {
    matches!(dt, DataType::U8 | DataType::U32 | DataType::U64)
}

/// Wraps an exact integer result the way the type's arithmetic does.
fn wrap(dt: DataType, v: i64) -> i64 {
    match dt {
        DataType::I8 => v as i8 as i64,
        DataType::U8 => v as u8 as i64,
        DataType::I32 => v as i32 as i64,
        DataType::U32 => v as u32 as i64,
        _ => v,
    }
}

/// Rank `rank`'s input `k` of operation `tag`: `n` small integers chosen so every result is
/// exact in every type (prod draws from ±1, ±2).
fn input(tag: u64, rank: usize, n: usize, dt: DataType, op: ReduceOp) -> Vec<i64> {
    let mut rng = Rng::new(SEED ^ tag, rank as u64 + 1);
    (0..n)
        .map(|_| match (op, unsigned(dt)) {
            (ReduceOp::PROD, false) => [-2, -1, 1, 2][rng.range(0, 3) as usize],
            (ReduceOp::PROD, true) => rng.range(1, 2),
            (_, true) => rng.range(0, 9),
            _ => rng.range(-9, 9),
        })
        .collect()
}

fn bytes(dt: DataType, v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| encode(dt, *x)).collect()
}

fn reference(dt: DataType, op: ReduceOp, inputs: &[Vec<i64>], i: usize) -> f64 {
    let n = inputs.len();
    let mut acc = inputs[0][i];
    for inp in &inputs[1..] {
        let x = inp[i];
        acc = wrap(
            dt,
            match op {
                ReduceOp::PROD => acc.wrapping_mul(x),
                ReduceOp::MIN => acc.min(x),
                ReduceOp::MAX => acc.max(x),
                _ => acc.wrapping_add(x),
            },
        );
    }
    if op == ReduceOp::AVG {
        if is_float(dt) {
            return acc as f64 / n as f64;
        }
        return wrap(dt, acc / n as i64) as f64;
    }
    acc as f64
}

fn check(what: &str, dt: DataType, got: &[u8], want: impl Fn(usize) -> f64, n: usize) {
    let es = dt.size().unwrap();
    assert_eq!(got.len(), n * es, "{what}: output length");
    for i in 0..n {
        let g = decode(dt, &got[i * es..(i + 1) * es]);
        let w = want(i);
        let tol = if matches!(dt, DataType::F16 | DataType::BF16) {
            w.abs() / 100.0 + 1e-2
        } else {
            w.abs() * 1e-6
        };
        assert!(
            (g - w).abs() <= tol,
            "{what} {dt:?}: element {i} of {n} is {g}, expected {w}"
        );
    }
}

fn p(v: &[u8]) -> DevicePtr {
    DevicePtr(v.as_ptr() as u64)
}

/// The address of a buffer the adaptor writes (the host device addresses process memory).
fn pm(v: &mut [u8]) -> DevicePtr {
    DevicePtr(v.as_mut_ptr() as u64)
}

fn run_worker(rank: usize, world: usize) {
    let (dev, ccl) = host();
    let c = comm(&ccl, rank, world, 60_000);
    assert_eq!(ccl.comm_count(c).unwrap(), world as i32);
    assert_eq!(ccl.comm_user_rank(c).unwrap(), rank as i32);
    let s = dev.stream_create().unwrap();
    let sync = |what: &str| {
        dev.stream_synchronize(s)
            .unwrap_or_else(|e| panic!("rank {rank}: {what}: {e}"))
    };
    let mut tag = 0u64;
    let all = |tag: u64, n: usize, dt: DataType, op: ReduceOp| -> Vec<Vec<i64>> {
        (0..world).map(|r| input(tag, r, n, dt, op)).collect()
    };

    // all_reduce: every type with sum; every op on f32, i32, bf16; one large size; in place.
    let mut cases: Vec<(DataType, ReduceOp, usize)> = Vec::new();
    for dt in DataType::ALL {
        for n in SIZES {
            cases.push((dt, ReduceOp::SUM, n));
        }
    }
    for dt in [DataType::F32, DataType::I32, DataType::BF16, DataType::U8] {
        for op in ReduceOp::ALL {
            cases.push((dt, op, 1027));
        }
    }
    cases.push((DataType::F32, ReduceOp::SUM, BIG));
    cases.push((DataType::BF16, ReduceOp::MAX, BIG));
    for (dt, op, n) in cases {
        tag += 1;
        let ins = all(tag, n, dt, op);
        let send = bytes(dt, &ins[rank]);
        let mut recv = vec![0u8; send.len()];
        // SAFETY: `send` and `recv` hold `n` elements of `dt` (the host device addresses this
        // process's memory); `recv` is read after the stream is synchronized.
        unsafe { ccl.all_reduce(p(&send), pm(&mut recv), n, dt, op, c, s) }.unwrap();
        sync("all_reduce");
        check(
            &format!("all_reduce {op:?} n={n}"),
            dt,
            &recv,
            |i| reference(dt, op, &ins, i),
            n,
        );
    }
    tag += 1;
    let ins = all(tag, BIG, DataType::F32, ReduceOp::SUM);
    let mut buf = bytes(DataType::F32, &ins[rank]);
    let b = pm(&mut buf);
    // SAFETY: `buf` holds `BIG` f32s, in place; it is read after the stream is synchronized.
    unsafe { ccl.all_reduce(b, b, BIG, DataType::F32, ReduceOp::SUM, c, s) }.unwrap();
    sync("all_reduce in place");
    check(
        "all_reduce in place",
        DataType::F32,
        &buf,
        |i| reference(DataType::F32, ReduceOp::SUM, &ins, i),
        BIG,
    );

    // reduce to a root.
    for (dt, n) in [
        (DataType::F32, 7),
        (DataType::I64, BIG / 4),
        (DataType::F16, 0),
    ] {
        tag += 1;
        let root = world / 2;
        let ins = all(tag, n, dt, ReduceOp::SUM);
        let send = bytes(dt, &ins[rank]);
        let mut recv = vec![0u8; send.len()];
        // SAFETY: `send` and `recv` hold `n` elements of `dt` (the host device addresses this
        // process's memory); `recv` is read after the stream is synchronized.
        unsafe {
            ccl.reduce(
                p(&send),
                pm(&mut recv),
                n,
                dt,
                ReduceOp::SUM,
                root as i32,
                c,
                s,
            )
        }
        .unwrap();
        sync("reduce");
        if rank == root {
            check(
                "reduce",
                dt,
                &recv,
                |i| reference(dt, ReduceOp::SUM, &ins, i),
                n,
            );
        }
    }

    // broadcast, all_gather, gather.
    for (dt, n) in [
        (DataType::F32, 1),
        (DataType::U8, 7),
        (DataType::I32, BIG),
        (DataType::F64, 0),
    ] {
        tag += 1;
        let root = world - 1;
        let ins = all(tag, n, dt, ReduceOp::SUM);
        let send = bytes(dt, &ins[rank]);
        let mut recv = vec![0u8; send.len()];
        // SAFETY: as for `reduce`.
        unsafe { ccl.broadcast(p(&send), pm(&mut recv), n, dt, root as i32, c, s) }.unwrap();
        sync("broadcast");
        check("broadcast", dt, &recv, |i| ins[root][i] as f64, n);

        let mut gathered = vec![0u8; send.len() * world];
        // SAFETY: `send` holds `n` and `gathered` `n * world` elements of `dt`; read after the
        // stream is synchronized.
        unsafe { ccl.all_gather(p(&send), pm(&mut gathered), n, dt, c, s) }.unwrap();
        sync("all_gather");
        check(
            "all_gather",
            dt,
            &gathered,
            |i| ins[i / n.max(1)][i % n.max(1)] as f64,
            n * world,
        );

        let mut at_root = vec![0u8; send.len() * world];
        // SAFETY: `send` holds `n` and `at_root` `n * world` elements of `dt`; read after the
        // stream is synchronized.
        unsafe { ccl.gather(p(&send), pm(&mut at_root), n, dt, 0, c, s) }.unwrap();
        sync("gather");
        if rank == 0 {
            check(
                "gather",
                dt,
                &at_root,
                |i| ins[i / n.max(1)][i % n.max(1)] as f64,
                n * world,
            );
        }
    }

    // Large reduce_scatter and all_gather in place (several chunks of the slot; the blocks at
    // odd offsets), and a large reduce_scatter of another type and op.
    for (dt, op, n) in [
        (DataType::BF16, ReduceOp::MAX, 700_003),
        (DataType::U8, ReduceOp::SUM, 1_500_007),
    ] {
        tag += 1;
        let es = dt.size().unwrap();
        let ins = all(tag, n * world, dt, op);
        let mut buf = bytes(dt, &ins[rank]);
        let b = pm(&mut buf);
        // SAFETY: `buf` holds `n * world` elements of `dt`; the output (its first `n`) is read
        // after the stream is synchronized.
        unsafe { ccl.reduce_scatter(b, b, n, dt, op, c, s) }.unwrap();
        sync("reduce_scatter in place");
        check(
            "reduce_scatter in place",
            dt,
            &buf[..n * es],
            |i| reference(dt, op, &ins, rank * n + i),
            n,
        );
        // In place as NCCL defines it: the output is this rank's block of the input.
        let mut buf = bytes(dt, &ins[rank]);
        let b = pm(&mut buf);
        let own = DevicePtr(b.0 + (rank * n * es) as u64);
        // SAFETY: as above; the output is this rank's block of `buf`.
        unsafe { ccl.reduce_scatter(b, own, n, dt, op, c, s) }.unwrap();
        sync("reduce_scatter into its own block");
        check(
            "reduce_scatter into its own block",
            dt,
            &buf[rank * n * es..(rank + 1) * n * es],
            |i| reference(dt, op, &ins, rank * n + i),
            n,
        );
        let mine = bytes(dt, &ins[rank][rank * n..(rank + 1) * n]);
        let mut all_of = vec![0u8; n * es * world];
        all_of[rank * n * es..(rank + 1) * n * es].copy_from_slice(&mine);
        let send_at = DevicePtr(pm(&mut all_of).0 + (rank * n * es) as u64);
        let whole = pm(&mut all_of);
        // SAFETY: `all_of` holds `n * world` elements; this rank's block is `send_at` (in
        // place); read after the stream is synchronized.
        unsafe { ccl.all_gather(send_at, whole, n, dt, c, s) }.unwrap();
        sync("all_gather in place");
        check(
            "all_gather in place",
            dt,
            &all_of,
            |i| ins[i / n][(i / n) * n + i % n] as f64,
            n * world,
        );
    }

    // reduce_scatter, all_to_all, scatter: inputs of n elements per rank block.
    for (dt, op, n) in [
        (DataType::F32, ReduceOp::SUM, 7),
        (DataType::I32, ReduceOp::MAX, 1),
        (DataType::BF16, ReduceOp::SUM, 0),
        (DataType::F32, ReduceOp::SUM, 300_001),
    ] {
        tag += 1;
        let ins = all(tag, n * world, dt, op);
        let send = bytes(dt, &ins[rank]);
        let es = dt.size().unwrap();
        let mut recv = vec![0u8; n * es];
        // SAFETY: `send` holds `n * world` and `recv` `n` elements of `dt` (the host device
        // addresses this process's memory); `recv` is read after the stream is synchronized.
        unsafe { ccl.reduce_scatter(p(&send), pm(&mut recv), n, dt, op, c, s) }.unwrap();
        sync("reduce_scatter");
        check(
            "reduce_scatter",
            dt,
            &recv,
            |i| reference(dt, op, &ins, rank * n + i),
            n,
        );

        let mut a2a = vec![0u8; n * es * world];
        // SAFETY: `send` and `a2a` hold `n * world` elements of `dt`; read after the stream is
        // synchronized.
        unsafe { ccl.all_to_all(p(&send), pm(&mut a2a), n, dt, c, s) }.unwrap();
        sync("all_to_all");
        // Block r of my output is block `rank` of rank r's input.
        check(
            "all_to_all",
            dt,
            &a2a,
            |i| ins[i / n.max(1)][rank * n + i % n.max(1)] as f64,
            n * world,
        );

        let root = 0;
        let mut sc = vec![0u8; n * es];
        // SAFETY: `send` holds `n * world` and `sc` `n` elements of `dt`; read after the stream is
        // synchronized.
        unsafe { ccl.scatter(p(&send), pm(&mut sc), n, dt, root, c, s) }.unwrap();
        sync("scatter");
        check(
            "scatter",
            dt,
            &sc,
            |i| ins[root as usize][rank * n + i] as f64,
            n,
        );
    }

    // all_to_allv with per-pair random counts (the same formula on every rank).
    tag += 1;
    let cnt = |from: usize, to: usize| {
        Rng::new(SEED ^ tag, (from * 31 + to) as u64).range(0, 3000) as usize
    };
    let sc: Vec<usize> = (0..world).map(|d| cnt(rank, d)).collect();
    let rc: Vec<usize> = (0..world).map(|r| cnt(r, rank)).collect();
    let displs = |v: &[usize]| -> Vec<usize> {
        v.iter()
            .scan(0, |a, x| {
                let d = *a;
                *a += x + 5;
                Some(d)
            })
            .collect()
    };
    let (sd, rd) = (displs(&sc), displs(&rc));
    let val = |from: usize, to: usize, i: usize| (from * 1000 + to * 10 + i % 7) as i64;
    let mut sendv = vec![0i64; sd[world - 1] + sc[world - 1] + 5];
    for d in 0..world {
        for i in 0..sc[d] {
            sendv[sd[d] + i] = val(rank, d, i);
        }
    }
    let send = bytes(DataType::I64, &sendv);
    let mut recv = vec![0u8; (rd[world - 1] + rc[world - 1] + 5) * 8];
    // SAFETY: every block of `sc`/`sd` lies in `send` and of `rc`/`rd` in `recv` (the host device
    // addresses this process's memory); `recv` is read after the stream is synchronized.
    unsafe {
        ccl.all_to_allv(
            p(&send),
            &sc,
            &sd,
            pm(&mut recv),
            &rc,
            &rd,
            DataType::I64,
            c,
            s,
        )
    }
    .unwrap();
    sync("all_to_allv");
    for r in 0..world {
        for i in 0..rc[r] {
            let got = decode(DataType::I64, &recv[(rd[r] + i) * 8..(rd[r] + i + 1) * 8]);
            assert_eq!(
                got,
                val(r, rank, i) as f64,
                "all_to_allv from {r} element {i}"
            );
        }
    }

    // Grouped point-to-point: a ring exchange of a large message, both directions at once.
    tag += 1;
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    let ins = all(tag, BIG, DataType::F32, ReduceOp::SUM);
    let send = bytes(DataType::F32, &ins[rank]);
    let mut from_prev = vec![0u8; send.len()];
    let mut from_next = vec![0u8; send.len()];
    ccl.group_start().unwrap();
    // SAFETY: `send`, `from_prev` and `from_next` hold `BIG` f32s (the host device addresses this
    // process's memory); read after the stream is synchronized.
    unsafe { ccl.send(p(&send), BIG, DataType::F32, next as i32, c, s) }.unwrap();
    // SAFETY: as above.
    unsafe { ccl.send(p(&send), BIG, DataType::F32, prev as i32, c, s) }.unwrap();
    // SAFETY: as above.
    unsafe { ccl.recv(pm(&mut from_prev), BIG, DataType::F32, prev as i32, c, s) }.unwrap();
    // SAFETY: as above.
    unsafe { ccl.recv(pm(&mut from_next), BIG, DataType::F32, next as i32, c, s) }.unwrap();
    ccl.group_end().unwrap();
    sync("ring exchange");
    check(
        "recv from prev",
        DataType::F32,
        &from_prev,
        |i| ins[prev][i] as f64,
        BIG,
    );
    check(
        "recv from next",
        DataType::F32,
        &from_next,
        |i| ins[next][i] as f64,
        BIG,
    );

    // An all-to-all built from grouped sends and receives.
    tag += 1;
    let n = 5001;
    let ins = all(tag, n * world, DataType::I32, ReduceOp::SUM);
    let send = bytes(DataType::I32, &ins[rank]);
    let mut recv = vec![0u8; send.len()];
    ccl.group_start().unwrap();
    for peer in 0..world {
        // SAFETY: block `peer` of `send` and of `recv` holds `n` i32s (both hold `n * world`); read
        // after the stream is synchronized.
        unsafe {
            ccl.send(
                DevicePtr(p(&send).0 + (peer * n * 4) as u64),
                n,
                DataType::I32,
                peer as i32,
                c,
                s,
            )
        }
        .unwrap();
        // SAFETY: as above.
        unsafe {
            ccl.recv(
                DevicePtr(pm(&mut recv).0 + (peer * n * 4) as u64),
                n,
                DataType::I32,
                peer as i32,
                c,
                s,
            )
        }
        .unwrap();
    }
    ccl.group_end().unwrap();
    sync("p2p all-to-all");
    check(
        "p2p all-to-all",
        DataType::I32,
        &recv,
        |i| ins[i / n][rank * n + i % n] as f64,
        n * world,
    );

    assert_eq!(
        ccl.comm_async_error(c).unwrap(),
        ferrocx::abi::Status::SUCCESS
    );
    ccl.comm_finalize(c).unwrap();
    ccl.comm_destroy(c).unwrap();
    dev.stream_destroy(s).unwrap();
}

#[test]
fn collectives_worker() {
    if let Some((rank, world)) = worker("collectives_worker") {
        run_worker(rank, world);
    }
}

fn on(n: usize) {
    on_with(n, &[]);
}

fn on_with(n: usize, env: &[(&str, String)]) {
    // Generous: a loaded 2-core machine runs 17 of these processes at once.
    let outcomes = wait(
        spawn("collectives_worker", n, env),
        Duration::from_secs(900),
    );
    assert_all_ok(&outcomes);
}

/// Every collective again with 3 threads per rank (the large copies and reductions split over
/// helper threads) and the fast path that runs small calls on the calling thread.
fn with_helpers_and_fast_path(n: usize) {
    on_with(
        n,
        &[
            ("FERROCX_HOST_THREADS", "3".to_string()),
            ("FERROCX_HOST_INLINE_US", "1000".to_string()),
        ],
    );
}

#[test]
fn every_collective_on_2_ranks_with_helpers_and_the_fast_path() {
    with_helpers_and_fast_path(2);
}

#[test]
fn every_collective_on_3_ranks_with_helpers_and_the_fast_path() {
    with_helpers_and_fast_path(3);
}

#[test]
fn every_collective_on_4_ranks_with_helpers_and_the_fast_path() {
    with_helpers_and_fast_path(4);
}

#[test]
fn every_collective_on_1_rank() {
    on(1);
}

#[test]
fn every_collective_on_2_ranks() {
    on(2);
}

#[test]
fn every_collective_on_3_ranks() {
    on(3);
}

#[test]
fn every_collective_on_4_ranks() {
    on(4);
}

#[test]
fn every_collective_on_7_ranks() {
    on(7);
}
