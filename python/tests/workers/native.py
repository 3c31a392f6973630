"""One rank of the native backend's check (host device): which calls the native backend takes
itself and which it hands to the Python process group, each with values against a reference
computed from gloo's all_gather (random data, odd sizes), and a failure on the native path as
ferrocx's error. With FERROCX_TORCH_NATIVE=0 in the environment, or EXPECT_BUILD_FAILURE=1 (the
test breaks the compiler): the group is the Python one, with the same values. Prints "native ok: N checks"."""

import os

import torch
import torch.distributed as dist

import ferrocx._native
import ferrocx.torch
from reference import reduce_stack

R = dist.ReduceOp
dist.init_process_group("ferrocx")
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
pg = dist.distributed_c10d._get_default_group()
broken = os.environ.get("EXPECT_BUILD_FAILURE") == "1"
wanted = os.environ.get("FERROCX_TORCH_NATIVE", "1") != "0" and not broken
native = getattr(pg, "_native", None)
assert (native is not None) == wanted, f"native backend {native!r}, wanted: {wanted}"
if broken:
    # The build failed (no working compiler): the Python group took over, and says why.
    why = ferrocx._native.failure()
    assert why, "no reason kept for the failed build"
    print(f"build failed as expected: {why.splitlines()[0][:200]}", flush=True)
assert isinstance(pg, ferrocx.torch.ProcessGroupFerrocx)
checks = 0


def counts():
    return native.counts() if native is not None else (0, 0)


def reference(op, t):
    wide = t.double() if t.is_floating_point() else t.long()
    out = [torch.empty_like(wide) for _ in range(world)]
    dist.all_gather(out, wide, group=gloo)
    return reduce_stack(op, torch.stack(out)).to(t.dtype)


def check(got, want, what):
    global checks
    checks += 1
    if got.is_floating_point():
        tol = 1e-2 if got.element_size() == 2 else 1e-6
        torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=1e-3, msg=lambda m: f"{what}: {m}")
    elif not torch.equal(got, want):
        raise AssertionError(f"{what}: {got[:8].tolist()} != {want[:8].tolist()}")


g = torch.Generator().manual_seed(11 + rank)
# A call whose caller waits at once: the native backend's own (on the host device).
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8):
    for op in (R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT):
        if op == R.AVG and not dtype.is_floating_point:
            continue
        for n in (1, 7, 1000, 4099):
            x = torch.randint(-3, 4, (n,), generator=g).to(dtype)
            t = x.clone()
            before = counts()
            assert dist.all_reduce(t, op=op) is None
            after = counts()
            if native is not None:
                assert after == (before[0] + 1, before[1]), f"{dtype} {op} n={n}: {before} -> {after}"
            check(t, reference(op, x), f"all_reduce {dtype} {op} n={n}")

# Handed to Python: a caller that waits later, bool (a strided tensor: values only; torch may
# hand the backend a contiguous copy).
for what, x, op, async_op in (
    ("async", torch.randn(1001, generator=g), R.SUM, True),
    ("bool", torch.randint(0, 2, (33,), generator=g).bool(), R.MAX, False),
    ("strided", torch.randn(64, 3, generator=g)[:, 1], R.SUM, False),
):
    t = x.clone()
    before = counts()
    w = dist.all_reduce(t, op=op, async_op=async_op)
    if w is not None:
        assert w.wait() is True and w.is_completed() and w.is_success() and w.exception() is None
        assert w.get_future().wait()[0].data_ptr() == t.data_ptr()
    after = counts()
    if native is not None and what != "strided":
        assert after == (before[0], before[1] + 1), f"{what}: {before} -> {after}"
    want = reference(R.MAX, x.long()).bool() if x.dtype == torch.bool else reference(op, x)
    check(t.long() if x.dtype == torch.bool else t, want.long() if x.dtype == torch.bool else want, what)

# A failure on the native path: ferrocx's error, naming what the ranks disagree on (on a group
# of its own, which stays failed).
bad = dist.new_group(backend="ferrocx")
try:
    dist.all_reduce(torch.ones(4 + 3 * rank), group=bad)
except ferrocx.torch.Error as e:
    assert "ranks disagree" in str(e), e
    checks += 1
else:
    raise AssertionError("no error from an all_reduce whose ranks disagree on the count")

dist.barrier(group=gloo)
print(f"native ok: {checks} checks on rank {rank}", flush=True)
dist.destroy_process_group()
os._exit(0)
