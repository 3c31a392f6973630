"""One rank of the operations check: every operation of the ferrocx backend against gloo's on the
same inputs (random, several sizes including odd ones), in one job: the default group is
ferrocx's, a second group over the same ranks is gloo's. Prints "ops ok: N checks" on success;
any mismatch raises (the rank exits non-zero)."""

import os
import sys
import zlib

import torch
import torch.distributed as dist

import ferrocx.torch  # noqa: F401 - registers the backend
from reference import reduce_stack

R = dist.ReduceOp
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8, torch.bool]
FLOATS = {torch.float32, torch.float16, torch.bfloat16, torch.float64}
SIZES = [1, 7, 1000, 4099]
OPS = [R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT]

dist.init_process_group("ferrocx")
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
checks = 0


def data(n, dtype, seed, low=-4, high=5):
    """Integer-valued random data (sums and products are exact in every dtype)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype == torch.uint8:
        low = max(low, 0)
    return torch.randint(low, high, (n,), generator=g).to(dtype)


def same(got, want, what):
    global checks
    checks += 1
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{what}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
    if got.dtype in FLOATS:
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-2 if got.element_size() == 2 else 1e-6, atol=1e-3, msg=lambda m: f"{what}: {m}")
    elif not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{what}: differs at {bad}: got {got[bad].tolist()}, want {want[bad].tolist()}")


def gathered(t):
    """Every rank's `t`, through gloo (as int64/float64, which gloo takes whatever `t` is)."""
    wide = t.double() if t.dtype in FLOATS else t.long()
    out = [torch.empty_like(wide) for _ in range(world)]
    dist.all_gather(out, wide, group=gloo)
    return torch.stack(out)


def reference(op, t):
    """op over ranks of `t`: gloo's own all_reduce where gloo has it, else computed here from
    gloo's all_gather."""
    if t.dtype != torch.bool and op != R.AVG:
        try:
            g = t.clone()
            dist.all_reduce(g, op=op, group=gloo)
            return g
        except RuntimeError:
            pass
    s = gathered(t)
    if t.dtype == torch.bool:
        r = s.bool().any(0) if op in (R.SUM, R.MAX) else s.bool().all(0)
        return r
    return reduce_stack(op, s).to(t.dtype)


def ops_for(dtype):
    if dtype == torch.bool:
        return [R.SUM, R.MIN, R.MAX, R.PRODUCT]
    return OPS if dtype in FLOATS else [R.SUM, R.MIN, R.MAX, R.PRODUCT]


def seed(*parts):
    return zlib.crc32(repr((rank,) + parts).encode())


# all_reduce, reduce, broadcast
for dtype in DTYPES:
    for n in SIZES:
        for op in ops_for(dtype):
            lo = 1 if op == R.PRODUCT else -4
            hi = 3 if op == R.PRODUCT else 5
            x = data(n, dtype, seed("ar", str(dtype), n, str(op)), lo, hi)
            mine = x.clone()
            dist.all_reduce(mine, op=op)
            same(mine, reference(op, x), f"all_reduce {dtype} n={n} {op}")
        root = n % world
        x = data(n, dtype, seed("bc", str(dtype), n))
        mine, theirs = x.clone(), x.clone()
        dist.broadcast(mine, src=root)
        dist.broadcast(theirs, src=root, group=gloo)
        same(mine, theirs, f"broadcast {dtype} n={n} root={root}")
        for op in (R.SUM, R.MAX) if dtype != torch.bool else (R.MAX,):
            x = data(n, dtype, seed("rd", str(dtype), n, str(op)))
            mine = x.clone()
            dist.reduce(mine, dst=root, op=op)
            if rank == root:
                same(mine, reference(op, x), f"reduce {dtype} n={n} {op} root={root}")
            else:
                reference(op, x)  # every rank takes part in gloo's

# all_gather (list and into a tensor), reduce_scatter (list and tensor)
for dtype in DTYPES:
    for n in SIZES[:3]:
        x = data(n, dtype, seed("ag", str(dtype), n))
        mine = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(mine, x)
        theirs = [torch.empty_like(x) for _ in range(world)]
        if dtype == torch.bool:
            theirs = [g.to(torch.bool) for g in gathered(x)]
        else:
            dist.all_gather(theirs, x, group=gloo)
        for i in range(world):
            same(mine[i], theirs[i], f"all_gather {dtype} n={n} [{i}]")
        flat = torch.empty(world * n, dtype=dtype)
        dist.all_gather_into_tensor(flat, x)
        same(flat, torch.cat(theirs), f"all_gather_into_tensor {dtype} n={n}")
        for op in ops_for(dtype):
            lo, hi = (1, 3) if op == R.PRODUCT else (-4, 5)
            big = data(world * n, dtype, seed("rs", str(dtype), n, str(op)), lo, hi)
            want = reference(op, big)[rank * n : (rank + 1) * n]
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, big, op=op)
            same(out, want, f"reduce_scatter_tensor {dtype} n={n} {op}")
            out2 = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out2, list(big.chunk(world)), op=op)
            same(out2, want, f"reduce_scatter (list) {dtype} n={n} {op}")

# gather and scatter, every rank as the root
for dtype in (torch.float32, torch.float16, torch.int64, torch.bool):
    for n in (1, 1001):
        for root in range(world):
            x = data(n, dtype, seed("ga", str(dtype), n, root))
            everyone = gathered(x)
            mine = [torch.empty_like(x) for _ in range(world)] if rank == root else None
            dist.gather(x, mine, dst=root)
            if rank == root:
                for i in range(world):
                    same(mine[i], everyone[i].to(dtype), f"gather {dtype} n={n} root={root} [{i}]")
            # the same blocks on every rank (seeded without the rank): block i goes to rank i
            parts = [data(n, dtype, zlib.crc32(repr(("sc", str(dtype), n, root, i)).encode())) for i in range(world)]
            out = torch.empty_like(x)
            dist.scatter(out, parts if rank == root else None, src=root)
            same(out, parts[rank], f"scatter {dtype} n={n} root={root}")

# all_to_all_single: even and uneven splits (rows of 3 elements), and the list form
for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
    for rows in (1, 5):
        x = data(world * rows * 3, dtype, seed("a2a", str(dtype), rows)).reshape(world * rows, 3)
        mine, theirs = torch.empty_like(x), torch.empty_like(x)
        dist.all_to_all_single(mine, x)
        if dtype == torch.bool:
            t = torch.empty_like(x, dtype=torch.uint8)
            dist.all_to_all_single(t, x.to(torch.uint8), group=gloo)
            theirs = t.bool()
        else:
            dist.all_to_all_single(theirs, x, group=gloo)
        same(mine, theirs, f"all_to_all_single even {dtype} rows={rows}")
    # splits[i][j]: rows rank i sends to rank j (the same table on every rank), some zero
    g = torch.Generator().manual_seed(99)
    splits = torch.randint(0, 4, (world, world), generator=g).tolist()
    ins, outs = splits[rank], [splits[i][rank] for i in range(world)]
    x = data(sum(ins) * 3, dtype, seed("a2av", str(dtype))).reshape(sum(ins), 3)
    mine = torch.empty(sum(outs), 3, dtype=dtype)
    dist.all_to_all_single(mine, x, output_split_sizes=outs, input_split_sizes=ins)
    xt = x.to(torch.uint8) if dtype == torch.bool else x
    theirs = torch.empty(sum(outs), 3, dtype=xt.dtype)
    dist.all_to_all_single(theirs, xt, output_split_sizes=outs, input_split_sizes=ins, group=gloo)
    same(mine, theirs.to(dtype), f"all_to_all_single uneven {dtype} splits={splits}")
    ins_l = list(x.split(ins))
    outs_l = [torch.empty(k, 3, dtype=dtype) for k in outs]
    dist.all_to_all(outs_l, ins_l)
    for i in range(world):
        same(outs_l[i], theirs[sum(outs[:i]) : sum(outs[: i + 1])].to(dtype), f"all_to_all list {dtype} [{i}]")

# barrier, point to point: send/recv, isend/irecv, batch_isend_irecv (a ring both ways)
dist.barrier()
for dtype in (torch.float32, torch.int64, torch.float16):
    for n in (1, 4099):
        right, left = (rank + 1) % world, (rank - 1) % world
        x = data(n, dtype, seed("p2p", str(dtype), n))
        want = gathered(x)[left].to(dtype)
        got = torch.empty_like(x)
        if rank % 2 == 0:
            dist.send(x, right)
            dist.recv(got, left)
        else:
            dist.recv(got, left)
            dist.send(x, right)
        same(got, want, f"send/recv {dtype} n={n}")
        got = torch.empty_like(x)
        reqs = [dist.irecv(got, left), dist.isend(x, right)] if rank % 2 else [dist.isend(x, right), dist.irecv(got, left)]
        for q in reqs:
            q.wait()
        same(got, want, f"isend/irecv {dtype} n={n}")
        got_l, got_r = torch.empty_like(x), torch.empty_like(x)
        reqs = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.irecv, got_l, left),
                dist.P2POp(dist.irecv, got_r, right),
                dist.P2POp(dist.isend, x, right),
                dist.P2POp(dist.isend, x, left),
            ]
        )
        for q in reqs:
            q.wait()
        same(got_l, want, f"batch_isend_irecv from left {dtype} n={n}")
        same(got_r, gathered(x)[right].to(dtype), f"batch_isend_irecv from right {dtype} n={n}")

# async_op=True: a Work as torch's (wait, is_completed, result, get_future), overlapped calls
xs = [data(1000, torch.float32, seed("async", i)) for i in range(4)]
mine = [x.clone() for x in xs]
works = [dist.all_reduce(m, async_op=True) for m in mine]
futs = [w.get_future() for w in works[:2]]
for i, w in enumerate(works):
    assert w.wait() is True
    assert w.is_completed() and w.is_success() and w.exception() is None
    same(mine[i], reference(R.SUM, xs[i]), f"async all_reduce [{i}]")
for f in futs:
    v = f.wait()
    assert isinstance(v, list) and len(v) == 1, v
f = dist.all_reduce(mine[0].clone(), async_op=True).get_future().then(lambda fut: fut.value()[0] * 2)
same(f.wait(), reference(R.SUM, mine[0]) * 2, "get_future().then")

# async_op=True on the other short paths: the works complete with the results, and a temporary
# input (no other owner once the call returns) is kept alive until then
n = 1001
x = data(n, torch.float32, seed("async-bc"))
theirs = x.clone()
dist.broadcast(theirs, src=world - 1, group=gloo)
mine = x.clone()
w_bc = dist.broadcast(mine, src=world - 1, async_op=True)
flat = torch.empty(world * n, dtype=torch.float32)
x_ag = data(n, torch.float32, seed("async-ag"))
w_ag = dist.all_gather_into_tensor(flat, x_ag.clone(), async_op=True)
big = data(world * n, torch.float32, seed("async-rs"))
out = torch.empty(n, dtype=torch.float32)
w_rs = dist.reduce_scatter_tensor(out, big.clone(), async_op=True)
for w in (w_bc, w_ag, w_rs):
    assert w.wait() is True and w.is_completed() and w.exception() is None
same(mine, theirs, "async broadcast")
same(flat, gathered(x_ag).to(torch.float32).reshape(-1), "async all_gather_into_tensor")
same(w_ag.result()[0], flat, "async all_gather_into_tensor result()")
same(out, reference(R.SUM, big)[rank * n : (rank + 1) * n], "async reduce_scatter_tensor")

# a caller that waits at once (asyncOp false, as torch's functions without async_op pass it)
# gets no work, as from torch's NCCL backend, and the result is there on return
pg = dist.distributed_c10d._get_default_group()
if hasattr(dist.AllreduceOptions(), "asyncOp"):
    x = data(257, torch.float32, seed("sync-opts"))
    mine = x.clone()
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    assert pg.allreduce([mine], opts) is None
    same(mine, reference(R.SUM, x), "allreduce with asyncOp false")
    opts.asyncOp = True
    w = pg.allreduce([mine], opts)
    assert w is not None and w.wait() is True

# torch's coalescing manager: the calls in it issued together at its end, waited or not
for async_ops in (False, True):
    xs = [data(n, torch.float32, seed("coal-ar", async_ops, i)) for i in range(3)]
    mine = [x.clone() for x in xs]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for m in mine:
            dist.all_reduce(m)
    if async_ops:
        cm.wait()
    for i in range(3):
        same(mine[i], reference(R.SUM, xs[i]), f"coalesced all_reduce async_ops={async_ops} [{i}]")
    bigs = [data(world * n, torch.float32, seed("coal-rs", async_ops, i)) for i in range(2)]
    outs = [torch.empty(n, dtype=torch.float32) for _ in bigs]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for o, b in zip(outs, bigs):
            dist.reduce_scatter_tensor(o, b)
    if async_ops:
        cm.wait()
    for i in range(2):
        same(outs[i], reference(R.SUM, bigs[i])[rank * n : (rank + 1) * n], f"coalesced reduce_scatter_tensor async_ops={async_ops} [{i}]")
    ins = [data(n, torch.float32, seed("coal-ag", async_ops, i)) for i in range(2)]
    flats = [torch.empty(world * n, dtype=torch.float32) for _ in ins]
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for f, i in zip(flats, ins):
            dist.all_gather_into_tensor(f, i)
    if async_ops:
        cm.wait()
    for i in range(2):
        same(flats[i], gathered(ins[i]).to(torch.float32).reshape(-1), f"coalesced all_gather_into_tensor async_ops={async_ops} [{i}]")

# a non-contiguous tensor
x = data(6 * 5, torch.float32, seed("nc")).reshape(6, 5)
t = x.clone().t()
dist.all_reduce(t)
same(t, reference(R.SUM, x).t(), "all_reduce of a transposed tensor")
x = data(5, torch.float32, seed("nc-ag"))
flat = torch.empty(5, world).t()  # world x 5, not contiguous
dist.all_gather_into_tensor(flat, x)
same(flat, gathered(x).to(torch.float32), "all_gather_into_tensor into a transposed tensor")
big = data(world * 4, torch.float32, seed("nc-rs")).reshape(4, world)
out = torch.empty(2, 2).t()  # 4 elements, not contiguous
dist.reduce_scatter_tensor(out, big.t())
want = reference(R.SUM, big.t().contiguous().reshape(-1))[rank * 4 : (rank + 1) * 4]
same(out.reshape(-1), want, "reduce_scatter_tensor of transposed tensors")

# a subgroup of the ranks (every rank makes it; its members use it)
if world >= 3:
    members = [1, 2]
    sub = dist.new_group(members, backend="ferrocx")
    sub_gloo = dist.new_group(members, backend="gloo")
    if rank in members:
        x = data(1001, torch.float32, seed("sub"))
        mine, theirs = x.clone(), x.clone()
        dist.all_reduce(mine, group=sub)
        dist.all_reduce(theirs, group=sub_gloo)
        same(mine, theirs, "all_reduce on a subgroup")

dist.barrier()
print(f"ops ok: {checks} checks on rank {rank} of {world}", flush=True)
dist.destroy_process_group()
# Leave without finalizing the interpreter: gloo's worker thread may still be dropping its
# last work (and the Python tensors it holds) then, and a thread that takes the interpreter's
# lock after finalization is killed mid-destructor (std::terminate, SIGABRT).
sys.stdout.flush()
os._exit(0)
