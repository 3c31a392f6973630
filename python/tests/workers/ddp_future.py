"""One rank of the check of what DDP takes from the backend's works: their futures.

On 2 ranks a sum over ranks is one addition (exact in any order), so DDP over the ferrocx
backend must give the parameters of DDP over gloo to the last bit, from the same initial
parameters and data: with DDP's own reducer (it calls ``allreduce`` on each bucket, then
``get_future()``, and waits for the future at the end of the backward pass) and with a Python
comm hook (torch's ``allreduce_hook``: ``get_future().then(...)`` on the bucket's all-reduce).
Then the futures themselves, on random tensors of several sizes: the value is the list of the
call's output tensors (the caller's, reduced in place), equal to the sum computed here from
every rank's input; ``then`` callbacks see it; a work gives one future however often asked, done at once when
asked for after the call has completed; the future of a call that fails raises its error.

Prints "ddp future ok" on each rank."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import ferrocx.torch  # noqa: F401 - registers the backend

STEPS = 6

dist.init_process_group("ferrocx")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 2, "run on 2 ranks (a sum of two is exact in either order)"
pg = dist.distributed_c10d._get_default_group()
gloo = dist.new_group(backend="gloo")


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 33), nn.Tanh(), nn.Linear(33, 31), nn.ReLU(), nn.Linear(31, 3))


def train(hook):
    """Both models after STEPS steps, DDP over ferrocx and over gloo, `hook` registered on both."""
    ours = DDP(mlp(), bucket_cap_mb=0.002)  # several buckets, of odd sizes
    theirs = DDP(mlp(), process_group=gloo, bucket_cap_mb=0.002)
    if hook is not None:
        ours.register_comm_hook(pg, hook)
        theirs.register_comm_hook(gloo, hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ours, theirs)]
    g = torch.Generator().manual_seed(1000 + rank)
    for _ in range(STEPS):
        x = torch.randn(8 + rank, 16, generator=g)  # ranks hold batches of different sizes
        y = torch.randint(0, 3, (8 + rank,), generator=g)
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return ours.module, theirs.module


calls = {"get_future": 0}
inner = ferrocx.torch._Work.get_future


def counted(self):
    calls["get_future"] += 1
    return inner(self)


ferrocx.torch._Work.get_future = counted
for hook in (None, default_hooks.allreduce_hook):
    name = "reducer" if hook is None else "allreduce_hook"
    calls["get_future"] = 0
    ours, theirs = train(hook)
    assert calls["get_future"] >= STEPS, f"{name}: DDP asked for {calls['get_future']} futures"
    for (pname, a), b in zip(ours.named_parameters(), theirs.parameters()):
        if not torch.equal(a, b):
            diff = (a - b).abs().max().item()
            raise AssertionError(f"{name}: parameter {pname} differs from gloo's by up to {diff:.3g}")
ferrocx.torch._Work.get_future = inner

# The futures themselves.
g = torch.Generator().manual_seed(7 + rank)
for n in (1, 7, 1000, 65537):
    for dtype in (torch.float32, torch.float64, torch.int64):
        x = (torch.randn(n, generator=g) * 100).to(dtype)
        both = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(both, x, group=gloo)
        want = both[0] + both[1]
        t = x.clone()
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future()
        # A second get_future() is the same future (torch wraps it anew for Python, so it is
        # not the same Python object): the same value.
        again = work.get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2)
        value = fut.wait()
        assert isinstance(value, list) and len(value) == 1, f"the value is {type(value)}: {value!r}"
        assert value[0].data_ptr() == t.data_ptr(), "the value is not the caller's tensor"
        assert torch.equal(value[0], want), f"{dtype} n={n}: the future's value is not the sum"
        assert torch.equal(fut.value()[0], want) and fut.done()
        assert torch.equal(doubled.wait(), want * 2), f"{dtype} n={n}: then() saw another value"
        assert again.wait()[0].data_ptr() == t.data_ptr(), "a second get_future() holds another value"
        # Asked for after the call has completed: a future completed at once.
        t = x.clone()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        fut = work.get_future()
        assert fut.done() and torch.equal(fut.value()[0], want), f"{dtype} n={n}: late future"

# A call that fails on the communicator's stream (ranks disagree on the count; on a group of
# its own, which stays failed): its future raises ferrocx's error, from wait() and in then().
bad = dist.new_group(backend="ferrocx")
fut = dist.all_reduce(torch.ones(4 + 3 * rank), group=bad, async_op=True).get_future()
child = fut.then(lambda f: f.value()[0] * 2)
# (The error is the C++ future's, so that it reaches C++ consumers too: torch makes it a
# RuntimeError that quotes ferrocx's, as it does for an error raised in a callback.)
for what, f, kind in (("wait", fut, RuntimeError), ("then", child, RuntimeError)):
    try:
        f.wait()
    except kind as e:
        assert "ranks disagree" in str(e), f"{what}: {e}"
    else:
        raise AssertionError(f"{what}: no error from the future of an all_reduce whose ranks disagree")

dist.barrier(group=gloo)
print(f"ddp future ok on rank {rank}", flush=True)
dist.destroy_process_group()
# As ddp.py: leave without finalizing the interpreter while gloo's threads may hold tensors.
sys.stdout.flush()
os._exit(0)
