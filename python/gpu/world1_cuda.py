"""World 1 on CUDA tensors through the "ferrocx" backend (CUDA device + NCCL): every operation,
every dtype and reduce op, checked against the values computed here; that calls run on torch's
current stream with no host synchronization; CPU tensors on the GPU rank (staged); async works
and their futures (completed at once on the call's stream, CUDA futures elsewhere).

    FERROCX_CONFIG=configs/nccl.toml torchrun --nproc-per-node 1 python/gpu/world1_cuda.py

Prints "world1 cuda ok: N checks" (exit 0), else raises."""

import sys

import torch
import torch.distributed as dist

import ferrocx.torch  # noqa: F401 - registers the backend

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
DTYPES = FLOATS + [torch.int32, torch.int64, torch.uint8, torch.bool]
SIZES = [1, 7, 1000, 1 << 20 | 3]

torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
dist.init_process_group("ferrocx")
pg = dist.distributed_c10d._get_default_group()
# The caller's stream first (the communication stream's own checks come below).
pg._set_comm_stream(False)
assert dist.get_world_size() == 1, "world 1: run with --nproc-per-node 1"
assert pg.comm.device == "cuda", f"this rank's cluster runs {pg.comm.device!r}: name a CUDA config in FERROCX_CONFIG"
print(repr(pg), flush=True)
checks = 0


def same(got, want, what):
    global checks
    checks += 1
    assert got.device.type == "cuda", f"{what}: the result moved to {got.device}"
    if not torch.equal(got.cpu(), want.cpu()):
        raise AssertionError(f"{what}: got {got.flatten()[:8].tolist()}..., want {want.flatten()[:8].tolist()}...")


def rand(n, dtype):
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), device=dev).bool()
    return torch.randint(0, 9, (n,), device=dev).to(dtype)


for dtype in DTYPES:
    ops = [R.SUM, R.MIN, R.MAX, R.PRODUCT] + ([R.AVG] if dtype in FLOATS else [])
    for n in SIZES:
        x = rand(n, dtype)
        for op in ops:
            t = x.clone()
            dist.all_reduce(t, op=op)
            same(t, x, f"all_reduce {dtype} n={n} {op}")
        t = x.clone()
        dist.broadcast(t, 0)
        same(t, x, f"broadcast {dtype} n={n}")
        t = x.clone()
        dist.reduce(t, 0, op=R.MAX)
        same(t, x, f"reduce {dtype} n={n}")
        outs = [torch.empty_like(x)]
        dist.all_gather(outs, x)
        same(outs[0], x, f"all_gather {dtype} n={n}")
        flat = torch.empty_like(x)
        dist.all_gather_into_tensor(flat, x)
        same(flat, x, f"all_gather_into_tensor {dtype} n={n}")
        out = torch.empty_like(x)
        dist.reduce_scatter_tensor(out, x, op=R.MAX if dtype == torch.bool else R.SUM)
        same(out, x, f"reduce_scatter_tensor {dtype} n={n}")
        out = torch.empty_like(x)
        dist.reduce_scatter(out, [x], op=R.MAX if dtype == torch.bool else R.SUM)
        same(out, x, f"reduce_scatter {dtype} n={n}")
        outs = [torch.empty_like(x)]
        dist.gather(x, outs, dst=0)
        same(outs[0], x, f"gather {dtype} n={n}")
        out = torch.empty_like(x)
        dist.scatter(out, [x], src=0)
        same(out, x, f"scatter {dtype} n={n}")
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        same(out, x, f"all_to_all_single {dtype} n={n}")
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, [n], [n])
        same(out, x, f"all_to_all_single (splits) {dtype} n={n}")
dist.barrier()

# Calls are enqueued on torch's current stream, and return before it runs: a side stream held
# up by a sleeping kernel is still busy when the call returns, and the result is right after.
side = torch.cuda.Stream()
x = rand(1 << 16, torch.float32)
t = x.clone()
torch.cuda.synchronize()
with torch.cuda.stream(side):
    torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU cycles
    work = dist.all_reduce(t, async_op=True)
    busy = not side.query()
    work.wait()
assert busy, "the side stream was idle when all_reduce returned: the call waited on the host"
assert torch.cuda.current_stream().query(), "the call went to the default stream, not the current one"
side.synchronize()
same(t, x, "all_reduce on a side stream")

# The same without async_op (no work comes back: nothing to wait for on the host), and for the
# other short paths: still enqueued on the side stream, results right after it.
t = x.clone()
flat = torch.empty_like(x)
small = torch.empty_like(x)
torch.cuda.synchronize()
with torch.cuda.stream(side):
    torch.cuda._sleep(200_000_000)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.all_gather_into_tensor(flat, t)
    dist.reduce_scatter_tensor(small, flat)
    busy = not side.query()
assert busy, "the side stream was idle when the calls returned: a call waited on the host"
side.synchronize()
same(t, x, "all_reduce and broadcast on a side stream, no async_op")
same(small, x, "all_gather_into_tensor then reduce_scatter_tensor on a side stream")

# Work.wait() on another stream than the call's orders that stream after the call: the
# default stream waits for the side stream's sleeping kernel.
t = x.clone()
torch.cuda.synchronize()
with torch.cuda.stream(side):
    torch.cuda._sleep(200_000_000)
    work = dist.all_reduce(t, async_op=True)
work.wait()
assert not torch.cuda.current_stream().query(), "wait() did not order the current stream after the call"
torch.cuda.current_stream().synchronize()
assert side.query(), "the current stream ran ahead of the call it waited for"
same(t, x, "all_reduce waited for from the default stream")

# async_op: the future's value, then() on it
f = dist.all_reduce(x.clone(), async_op=True).get_future().then(lambda fut: fut.value()[0] * 2)
same(f.wait(), x * 2, "get_future().then")

# The future of a call on the current stream is completed at once, with no wait on the host
# (the stream is still busy after all of it): its value is ready in stream order, and a then()
# callback's kernels (run at once, on this stream) follow the call.
t = x.clone()
torch.cuda.synchronize()
torch.cuda._sleep(200_000_000)
fut = dist.all_reduce(t, async_op=True).get_future()
assert fut.done(), "the future of a call on the current stream is not completed at once"
assert fut.value()[0].data_ptr() == t.data_ptr(), "the future's value is not the call's tensor"
doubled = fut.then(lambda f: f.value()[0] * 2).wait()
assert not torch.cuda.current_stream().query(), "the stream was idle after get_future: something waited on the host"
torch.cuda.synchronize()
same(doubled, x * 2, "then() on the completed future, in stream order")

# Asked for after the caller switched streams: a CUDA future, whose wait() orders the then
# current stream after the call's.
t = x.clone()
torch.cuda.synchronize()
with torch.cuda.stream(side):
    torch.cuda._sleep(200_000_000)
    work = dist.all_reduce(t, async_op=True)
fut = work.get_future()
got = fut.wait()[0]
assert not torch.cuda.current_stream().query(), "the future's wait() did not order the current stream after the call"
torch.cuda.synchronize()
same(got, x, "get_future() asked for on another stream than the call's")

# On the group's communication stream (FERROCX_TORCH_COMM_STREAM=1): the call runs there, and
# the caller's stream goes on; the future's wait() and then(), and Work.wait(), order the
# caller's stream after the call (held up here by a sleeping kernel on the communication stream).
pg._set_comm_stream(True)
try:
    t = x.clone()
    dist.all_reduce(t, async_op=True).wait()  # makes the communication stream
    comm_stream = pg._comm_stream_of(0)
    assert comm_stream is not None and comm_stream != torch.cuda.current_stream(), comm_stream
    for how in ("future wait", "future then", "work wait"):
        torch.cuda.synchronize()
        with torch.cuda.stream(comm_stream):
            torch.cuda._sleep(200_000_000)
        work = dist.all_reduce(t, async_op=True)
        assert torch.cuda.current_stream().query(), f"{how}: the current stream waited for the communication stream"
        if how == "future wait":
            got = work.get_future().wait()[0]
        elif how == "future then":
            got = work.get_future().then(lambda f: f.value()[0] * 2).wait() / 2
        else:
            work.wait()
            got = t
        if how != "future then":
            # (A then() callback of a CUDA future may wait on the host: torch's choice, so only
            # its value is checked.)
            assert not torch.cuda.current_stream().query(), f"{how}: the current stream is not ordered after the call"
        torch.cuda.synchronize()
        same(got, x, f"all_reduce on the communication stream, {how}")
finally:
    pg._set_comm_stream(False)

# CPU tensors on the GPU rank: staged through device memory
c = torch.arange(10, dtype=torch.float32)
dist.all_reduce(c)
checks += 1
assert torch.equal(c, torch.arange(10, dtype=torch.float32)), c

# Bad input: a Python exception with ferrocx's message
try:
    dist.all_reduce(torch.ones(3, device=dev, dtype=torch.uint16))
except ferrocx.torch.Error as e:
    print("unsupported dtype:", e)
else:
    raise AssertionError("no error for uint16")

native = getattr(pg, "_native", None)
if native is not None:
    took, handed = native.counts()
    # The common CUDA all_reduce calls above are the native backend's own.
    assert took > 0, (took, handed)
    print(f"native backend: {took} all_reduce calls taken, {handed} handed to Python")
print(f"world1 cuda ok: {checks} checks", flush=True)
dist.destroy_process_group()
sys.exit(0)
