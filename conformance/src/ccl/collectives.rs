//! Every collective of the CCL table and grouped point-to-point, against references each rank
//! computes from every rank's reproducible inputs. Sizes: 0, 1, odd and about 1 MiB.
//! Outputs are poisoned first (`0x7f` bytes: NaN or far out of range in every type), so an
//! element left unwritten shows.

use ferrocx::abi::{DataType, DevicePtr, ReduceOp};

use super::{Ctx, Planned};
use crate::boundary::{fail, Stop, Verdict};
use crate::buffer::DevBuf;
use crate::reference::{
    compare, dt_name, encode, input, inputs, op_name, reduced, size_of, tag, Rng,
};

/// The byte outputs are filled with before a collective writes them.
const POISON: u8 = 0x7f;
/// Elements of the large case: 1 MiB and 12 bytes of `f32`.
const BIG: usize = (1 << 18) + 3;
/// Odd size.
const ODD: usize = 1027;

/// A device buffer holding `bytes`. A rank that cannot make its buffers skips the collective
/// its peers enter, so the communicator is marked broken.
fn upload<'a>(ctx: &'a Ctx<'a>, bytes: &[u8]) -> Result<DevBuf<'a>, Stop> {
    let made = DevBuf::device(ctx.dev, bytes.len()).and_then(|b| b.upload(bytes).map(|()| b));
    made.map_err(|e| {
        ctx.spoil("a device buffer for a collective");
        e.into()
    })
}

/// A device buffer of `len` poisoned bytes (marks the communicator broken on failure, as
/// [`upload`]).
fn poisoned<'a>(ctx: &'a Ctx<'a>, len: usize) -> Result<DevBuf<'a>, Stop> {
    let made = DevBuf::device(ctx.dev, len).and_then(|b| b.fill(POISON).map(|()| b));
    made.map_err(|e| {
        ctx.spoil("a device buffer for a collective");
        e.into()
    })
}

/// Compares `n` elements of `got` with `want`, the reason naming the case.
fn expect(case: &str, dt: DataType, got: &[u8], n: usize, want: impl Fn(usize) -> f64) -> Verdict {
    compare(dt, got, n, want).map_err(|e| fail(format!("{case}: {e}")))
}

/// The per-rank size of the large case of collectives whose buffers hold one block per rank:
/// about 1 MiB in all.
fn share(ctx: &Ctx<'_>) -> usize {
    (BIG / ctx.world).max(1) | 1
}

pub(super) fn plan<'a>(ctx: &'a Ctx<'a>) -> Vec<Planned<'a>> {
    use DataType as D;
    use ReduceOp as O;
    let all = [0, 1, ODD, BIG];
    let blocks = [0, 1, ODD, share(ctx)];
    let mut p = Vec::new();
    for dt in D::ALL {
        let sizes: Vec<usize> = if dt == D::F32 {
            all.to_vec()
        } else {
            vec![0, 1, ODD]
        };
        p.push(Planned::new(
            "ccl",
            format!("all_reduce {} sum", dt_name(dt)),
            move || all_reduce(ctx, dt, O::SUM, &sizes, false),
        ));
    }
    for dt in [D::F32, D::I32, D::BF16, D::U8] {
        for op in [O::PROD, O::MIN, O::MAX, O::AVG] {
            p.push(Planned::new(
                "ccl",
                format!("all_reduce {} {}", dt_name(dt), op_name(op)),
                move || all_reduce(ctx, dt, op, &[1, ODD], false),
            ));
        }
    }
    p.push(Planned::new(
        "ccl",
        "all_reduce f32 sum in place",
        move || all_reduce(ctx, D::F32, O::SUM, &[ODD, BIG], true),
    ));
    let (mid, last) = (ctx.world / 2, ctx.world - 1);
    p.push(Planned::new("ccl", "reduce f32 sum", move || {
        reduce(ctx, D::F32, O::SUM, &all, mid)
    }));
    p.push(Planned::new("ccl", "reduce i64 max", move || {
        reduce(ctx, D::I64, O::MAX, &[1, ODD], last)
    }));
    p.push(Planned::new("ccl", "broadcast f32", move || {
        broadcast(ctx, D::F32, &all, last, false)
    }));
    p.push(Planned::new("ccl", "broadcast u8", move || {
        broadcast(ctx, D::U8, &[1, ODD], 0, false)
    }));
    p.push(Planned::new("ccl", "broadcast f64 in place", move || {
        broadcast(ctx, D::F64, &[1, ODD], mid, true)
    }));
    p.push(Planned::new("ccl", "all_gather f32", move || {
        all_gather(ctx, D::F32, &blocks)
    }));
    p.push(Planned::new("ccl", "all_gather u8", move || {
        all_gather(ctx, D::U8, &[1, ODD])
    }));
    p.push(Planned::new("ccl", "reduce_scatter f32 sum", move || {
        reduce_scatter(ctx, D::F32, O::SUM, &blocks)
    }));
    p.push(Planned::new("ccl", "reduce_scatter i32 max", move || {
        reduce_scatter(ctx, D::I32, O::MAX, &[1, ODD])
    }));
    p.push(Planned::new("ccl", "gather f32", move || {
        gather(ctx, D::F32, &blocks, 0)
    }));
    p.push(Planned::new("ccl", "gather u8", move || {
        gather(ctx, D::U8, &[1, ODD], last)
    }));
    p.push(Planned::new("ccl", "scatter f32", move || {
        scatter(ctx, D::F32, &blocks, 0)
    }));
    p.push(Planned::new("ccl", "scatter i64", move || {
        scatter(ctx, D::I64, &[1, ODD], last)
    }));
    p.push(Planned::new("ccl", "all_to_all f32", move || {
        all_to_all(ctx, D::F32, &blocks)
    }));
    p.push(Planned::new("ccl", "all_to_all i64", move || {
        all_to_all(ctx, D::I64, &[1, ODD])
    }));
    p.push(Planned::new("ccl", "all_to_allv i64", move || {
        all_to_allv(ctx, D::I64, 3000, false)
    }));
    p.push(Planned::new(
        "ccl",
        "all_to_allv f32 (about 1 MiB)",
        move || all_to_allv(ctx, D::F32, share(ctx) / ctx.world.max(1), true),
    ));
    p.push(Planned::new(
        "ccl",
        "grouped send/recv ring f32",
        move || ring(ctx, &[0, 1, ODD, BIG]),
    ));
    p.push(Planned::new(
        "ccl",
        "all_to_all of grouped send/recv i32",
        move || p2p_all_to_all(ctx, ODD),
    ));
    p
}

fn case(op: &str, dt: DataType, n: usize) -> String {
    format!("{op} {} n={n}", dt_name(dt))
}

fn all_reduce(
    ctx: &Ctx<'_>,
    dt: DataType,
    op: ReduceOp,
    sizes: &[usize],
    in_place: bool,
) -> Verdict {
    ctx.claims(dt, Some(op))?;
    let es = size_of(dt);
    for &n in sizes {
        let what = format!(
            "{} {}{}",
            case("all_reduce", dt, n),
            op_name(op),
            if in_place { " in place" } else { "" }
        );
        let ins = inputs(tag(&what), ctx.world, n, dt, op);
        let send = upload(ctx, &encode(dt, &ins[ctx.rank]))?;
        let recv = if in_place {
            None
        } else {
            Some(poisoned(ctx, n * es)?)
        };
        let out = recv.as_ref().unwrap_or(&send);
        ctx.run(&what, || {
            ctx.ccl.seen(
                // SAFETY: `send` and `out` hold `n` elements of `dt` (the same buffer in place);
                // `run` waits for the stream before they drop.
                unsafe {
                    ctx.ccl
                        .ccl
                        .all_reduce(send.ptr(), out.ptr(), n, dt, op, ctx.comm, ctx.s)
                },
            )
        })?;
        expect(&what, dt, &out.download(n * es)?, n, |i| {
            reduced(dt, op, &ins, i)
        })?;
    }
    Ok(())
}

fn reduce(ctx: &Ctx<'_>, dt: DataType, op: ReduceOp, sizes: &[usize], root: usize) -> Verdict {
    ctx.claims(dt, Some(op))?;
    let es = size_of(dt);
    for &n in sizes {
        let what = format!("{} {} root {root}", case("reduce", dt, n), op_name(op));
        let ins = inputs(tag(&what), ctx.world, n, dt, op);
        let send = upload(ctx, &encode(dt, &ins[ctx.rank]))?;
        let recv = poisoned(ctx, n * es)?;
        ctx.run(&what, || {
            // SAFETY: `send` and `recv` hold `n` elements of `dt`; `run` waits for the stream
            // before they drop.
            ctx.ccl.seen(unsafe {
                ctx.ccl.ccl.reduce(
                    send.ptr(),
                    recv.ptr(),
                    n,
                    dt,
                    op,
                    root as i32,
                    ctx.comm,
                    ctx.s,
                )
            })
        })?;
        if ctx.rank == root {
            expect(&what, dt, &recv.download(n * es)?, n, |i| {
                reduced(dt, op, &ins, i)
            })?;
        }
    }
    Ok(())
}

fn broadcast(ctx: &Ctx<'_>, dt: DataType, sizes: &[usize], root: usize, in_place: bool) -> Verdict {
    ctx.claims(dt, None)?;
    let es = size_of(dt);
    for &n in sizes {
        let what = format!(
            "{} root {root}{}",
            case("broadcast", dt, n),
            if in_place { " in place" } else { "" }
        );
        let ins = inputs(tag(&what), ctx.world, n, dt, ReduceOp::SUM);
        let send = upload(ctx, &encode(dt, &ins[ctx.rank]))?;
        let recv = if in_place {
            None
        } else {
            Some(poisoned(ctx, n * es)?)
        };
        let out = recv.as_ref().unwrap_or(&send);
        ctx.run(&what, || {
            // SAFETY: `send` and `out` hold `n` elements of `dt` (the same buffer in place); `run`
            // waits for the stream before they drop.
            ctx.ccl.seen(unsafe {
                ctx.ccl
                    .ccl
                    .broadcast(send.ptr(), out.ptr(), n, dt, root as i32, ctx.comm, ctx.s)
            })
        })?;
        expect(&what, dt, &out.download(n * es)?, n, |i| {
            ins[root][i] as f64
        })?;
    }
    Ok(())
}

fn all_gather(ctx: &Ctx<'_>, dt: DataType, sizes: &[usize]) -> Verdict {
    ctx.claims(dt, None)?;
    let es = size_of(dt);
    let w = ctx.world;
    for &n in sizes {
        let what = case("all_gather", dt, n);
        let ins = inputs(tag(&what), w, n, dt, ReduceOp::SUM);
        let send = upload(ctx, &encode(dt, &ins[ctx.rank]))?;
        let recv = poisoned(ctx, n * es * w)?;
        ctx.run(&what, || {
            ctx.ccl.seen(
                // SAFETY: `send` holds `n` and `recv` `n * w` elements of `dt`; `run` waits for the
                // stream before they drop.
                unsafe {
                    ctx.ccl
                        .ccl
                        .all_gather(send.ptr(), recv.ptr(), n, dt, ctx.comm, ctx.s)
                },
            )
        })?;
        expect(&what, dt, &recv.download(n * es * w)?, n * w, |i| {
            ins[i / n.max(1)][i % n.max(1)] as f64
        })?;
    }
    Ok(())
}

fn reduce_scatter(ctx: &Ctx<'_>, dt: DataType, op: ReduceOp, sizes: &[usize]) -> Verdict {
    ctx.claims(dt, Some(op))?;
    let es = size_of(dt);
    let (w, me) = (ctx.world, ctx.rank);
    for &n in sizes {
        let what = format!("{} {}", case("reduce_scatter", dt, n), op_name(op));
        let ins = inputs(tag(&what), w, n * w, dt, op);
        let send = upload(ctx, &encode(dt, &ins[me]))?;
        let recv = poisoned(ctx, n * es)?;
        ctx.run(&what, || {
            // SAFETY: `send` holds `n * w` and `recv` `n` elements of `dt`; `run` waits for the
            // stream before they drop.
            ctx.ccl.seen(unsafe {
                ctx.ccl
                    .ccl
                    .reduce_scatter(send.ptr(), recv.ptr(), n, dt, op, ctx.comm, ctx.s)
            })
        })?;
        expect(&what, dt, &recv.download(n * es)?, n, |i| {
            reduced(dt, op, &ins, me * n + i)
        })?;
    }
    Ok(())
}

fn gather(ctx: &Ctx<'_>, dt: DataType, sizes: &[usize], root: usize) -> Verdict {
    ctx.claims(dt, None)?;
    let es = size_of(dt);
    let w = ctx.world;
    for &n in sizes {
        let what = format!("{} root {root}", case("gather", dt, n));
        let ins = inputs(tag(&what), w, n, dt, ReduceOp::SUM);
        let send = upload(ctx, &encode(dt, &ins[ctx.rank]))?;
        let recv = poisoned(ctx, n * es * w)?;
        ctx.run(&what, || {
            // SAFETY: `send` holds `n` and `recv` `n * w` elements of `dt`; `run` waits for the
            // stream before they drop.
            ctx.ccl.seen(unsafe {
                ctx.ccl
                    .ccl
                    .gather(send.ptr(), recv.ptr(), n, dt, root as i32, ctx.comm, ctx.s)
            })
        })?;
        if ctx.rank == root {
            expect(&what, dt, &recv.download(n * es * w)?, n * w, |i| {
                ins[i / n.max(1)][i % n.max(1)] as f64
            })?;
        }
    }
    Ok(())
}

fn scatter(ctx: &Ctx<'_>, dt: DataType, sizes: &[usize], root: usize) -> Verdict {
    ctx.claims(dt, None)?;
    let es = size_of(dt);
    let (w, me) = (ctx.world, ctx.rank);
    for &n in sizes {
        let what = format!("{} root {root}", case("scatter", dt, n));
        let ins = inputs(tag(&what), w, n * w, dt, ReduceOp::SUM);
        let send = upload(ctx, &encode(dt, &ins[me]))?;
        let recv = poisoned(ctx, n * es)?;
        ctx.run(&what, || {
            // SAFETY: `send` holds `n * w` and `recv` `n` elements of `dt`; `run` waits for the
            // stream before they drop.
            ctx.ccl.seen(unsafe {
                ctx.ccl
                    .ccl
                    .scatter(send.ptr(), recv.ptr(), n, dt, root as i32, ctx.comm, ctx.s)
            })
        })?;
        expect(&what, dt, &recv.download(n * es)?, n, |i| {
            ins[root][me * n + i] as f64
        })?;
    }
    Ok(())
}

fn all_to_all(ctx: &Ctx<'_>, dt: DataType, sizes: &[usize]) -> Verdict {
    ctx.claims(dt, None)?;
    let es = size_of(dt);
    let (w, me) = (ctx.world, ctx.rank);
    for &n in sizes {
        let what = case("all_to_all", dt, n);
        let ins = inputs(tag(&what), w, n * w, dt, ReduceOp::SUM);
        let send = upload(ctx, &encode(dt, &ins[me]))?;
        let recv = poisoned(ctx, n * es * w)?;
        ctx.run(&what, || {
            ctx.ccl.seen(
                // SAFETY: `send` and `recv` hold `n * w` elements of `dt`; `run` waits for the
                // stream before they drop.
                unsafe {
                    ctx.ccl
                        .ccl
                        .all_to_all(send.ptr(), recv.ptr(), n, dt, ctx.comm, ctx.s)
                },
            )
        })?;
        // Block r of this rank's output is block `me` of rank r's input.
        expect(&what, dt, &recv.download(n * es * w)?, n * w, |i| {
            ins[i / n.max(1)][me * n + i % n.max(1)] as f64
        })?;
    }
    Ok(())
}

/// Per-pair counts (the same formula on every rank, some of them 0), blocks laid out with
/// gaps of 5 elements that must stay untouched.
fn all_to_allv(ctx: &Ctx<'_>, dt: DataType, max: usize, large: bool) -> Verdict {
    ctx.claims(dt, None)?;
    let es = size_of(dt);
    let (w, me) = (ctx.world, ctx.rank);
    let what = format!(
        "all_to_allv {}{}",
        dt_name(dt),
        if large { " large" } else { "" }
    );
    let t = tag(&what);
    let count = |from: usize, to: usize| -> usize {
        if large {
            max + from + to
        } else if (from + to) % 4 == 1 {
            0
        } else {
            Rng::new(t, (from * 31 + to) as u64).range(0, max as i64) as usize
        }
    };
    let displs = |v: &[usize]| -> Vec<usize> {
        v.iter()
            .scan(0, |at, x| {
                let d = *at;
                *at += x + 5;
                Some(d)
            })
            .collect()
    };
    let sc: Vec<usize> = (0..w).map(|to| count(me, to)).collect();
    let rc: Vec<usize> = (0..w).map(|from| count(from, me)).collect();
    let (sd, rd) = (displs(&sc), displs(&rc));
    let value = |from: usize, to: usize, i: usize| (from * 1000 + to * 10 + i % 7) as i64;
    let slen = sd[w - 1] + sc[w - 1] + 5;
    let rlen = rd[w - 1] + rc[w - 1] + 5;
    let mut sendv = vec![0i64; slen];
    for to in 0..w {
        for i in 0..sc[to] {
            sendv[sd[to] + i] = value(me, to, i);
        }
    }
    let send = upload(ctx, &encode(dt, &sendv))?;
    let recv = poisoned(ctx, rlen * es)?;
    ctx.run(&what, || {
        // SAFETY: `send` holds `slen` and `recv` `rlen` elements of `dt`, and every block of
        // `sc`/`sd` and `rc`/`rd` lies within them; `run` waits for the stream before they drop.
        ctx.ccl.seen(unsafe {
            ctx.ccl.ccl.all_to_allv(
                send.ptr(),
                &sc,
                &sd,
                recv.ptr(),
                &rc,
                &rd,
                dt,
                ctx.comm,
                ctx.s,
            )
        })
    })?;
    let got = recv.download(rlen * es)?;
    for from in 0..w {
        let at = rd[from] * es;
        expect(
            &format!("{what}, the block from rank {from}"),
            dt,
            &got[at..],
            rc[from],
            |i| value(from, me, i) as f64,
        )?;
        // The gap after the block is untouched.
        let gap = &got[at + rc[from] * es..at + (rc[from] + 5) * es];
        if gap.iter().any(|&b| b != POISON) {
            return Err(fail(format!(
                "{what}: the 5 elements after the block from rank {from} were written"
            )));
        }
    }
    Ok(())
}

/// Sends and receives issued between `group_start` and `group_end`; the group is always
/// closed, even when an operation in it failed.
fn grouped(
    ctx: &Ctx<'_>,
    ops: impl FnOnce() -> crate::boundary::Res<()>,
) -> crate::boundary::Res<()> {
    ctx.ccl.seen(ctx.ccl.ccl.group_start())?;
    let issued = ops();
    let ended = ctx.ccl.seen(ctx.ccl.ccl.group_end());
    issued.and(ended)
}

fn ring(ctx: &Ctx<'_>, sizes: &[usize]) -> Verdict {
    let dt = DataType::F32;
    ctx.claims(dt, None)?;
    let es = size_of(dt);
    let (w, me) = (ctx.world, ctx.rank);
    let (next, prev) = ((me + 1) % w, (me + w - 1) % w);
    for &n in sizes {
        let what = case("send/recv ring", dt, n);
        let ins = inputs(tag(&what), w, n, dt, ReduceOp::SUM);
        let send = upload(ctx, &encode(dt, &ins[me]))?;
        let from_prev = poisoned(ctx, n * es)?;
        let from_next = poisoned(ctx, n * es)?;
        let c = &ctx.ccl.ccl;
        ctx.run(&what, || {
            grouped(ctx, || {
                ctx.ccl
                    // SAFETY: `send`, `from_prev` and `from_next` hold `n` elements of `dt`; `run`
                    // waits for the stream before they drop.
                    .seen(unsafe { c.send(send.ptr(), n, dt, next as i32, ctx.comm, ctx.s) })?;
                ctx.ccl
                    // SAFETY: as above.
                    .seen(unsafe { c.send(send.ptr(), n, dt, prev as i32, ctx.comm, ctx.s) })?;
                ctx.ccl
                    // SAFETY: as above.
                    .seen(unsafe {
                        c.recv(from_prev.ptr(), n, dt, prev as i32, ctx.comm, ctx.s)
                    })?;
                ctx.ccl
                    // SAFETY: as above.
                    .seen(unsafe { c.recv(from_next.ptr(), n, dt, next as i32, ctx.comm, ctx.s) })
            })
        })?;
        expect(
            &format!("{what}, from rank {prev}"),
            dt,
            &from_prev.download(n * es)?,
            n,
            |i| ins[prev][i] as f64,
        )?;
        expect(
            &format!("{what}, from rank {next}"),
            dt,
            &from_next.download(n * es)?,
            n,
            |i| ins[next][i] as f64,
        )?;
    }
    Ok(())
}

fn p2p_all_to_all(ctx: &Ctx<'_>, n: usize) -> Verdict {
    let dt = DataType::I32;
    ctx.claims(dt, None)?;
    let es = size_of(dt);
    let (w, me) = (ctx.world, ctx.rank);
    let what = case("all_to_all of send/recv", dt, n);
    let t = tag(&what);
    let ins: Vec<Vec<i64>> = (0..w)
        .map(|r| input(t, r, n * w, dt, ReduceOp::SUM))
        .collect();
    let send = upload(ctx, &encode(dt, &ins[me]))?;
    let recv = poisoned(ctx, n * es * w)?;
    let block = |b: &DevBuf<'_>, peer: usize| DevicePtr(b.ptr().0 + (peer * n * es) as u64);
    let c = &ctx.ccl.ccl;
    ctx.run(&what, || {
        grouped(ctx, || {
            for peer in 0..w {
                ctx.ccl
                    // SAFETY: block `peer` of `send` and of `recv` holds `n` elements of `dt` (both
                    // hold `n * w`); `run` waits for the stream before they drop.
                    .seen(unsafe {
                        c.send(block(&send, peer), n, dt, peer as i32, ctx.comm, ctx.s)
                    })?;
                ctx.ccl
                    // SAFETY: as above.
                    .seen(unsafe {
                        c.recv(block(&recv, peer), n, dt, peer as i32, ctx.comm, ctx.s)
                    })?;
            }
            Ok(())
        })
    })?;
    expect(&what, dt, &recv.download(n * es * w)?, n * w, |i| {
        ins[i / n][me * n + i % n] as f64
    })
}
