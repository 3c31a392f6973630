#!/usr/bin/env python3
"""A DDP training step on ferrocx's backend against the same step on torch's ``nccl``, in one
job: two copies of one model, each wrapped in DDP over its own process group (the default group
on ``nccl``, a whole-world group on ``"ferrocx"``), stepped alternately on the same batches.

    torchrun --nproc-per-node N python/gpu/ddp_step.py [--steps 40] [--width 4096] [--layers 8]
    torchrun --nproc-per-node 2 python/gpu/ddp_step.py --width 64 --bucket-mb 0.01 --breakdown


The model is ``--layers`` square linear layers of ``--width`` (f32, ReLU between them); each
rank feeds a batch of ``--batch`` rows of its own. DDP's gradient buckets (25 MiB by default)
are all-reduced during the backward pass, overlapping it, as in training. A step is timed from
the forward pass to the optimizer's step, the device synchronized on both ends; after
``--warmup`` untimed steps of each, the two alternate (which goes first alternates too). The
median step time of each, their ratio and the largest difference between the two models'
parameters at the end (they see the same data from the same initial weights) are printed by
rank 0. Exit status 1 when the parameters differ by more than the tolerance. On a machine
without a GPU it runs on CPU tensors against gloo instead (a check of the script; with small
buckets, ``--bucket-mb``, a measure of the backend's Python per bucket on the host device).

``--breakdown`` also prints, per call (median and mean over the run, slowest rank), the time
DDP's bucket calls spend in the ferrocx group's Python ``allreduce`` (and of it in the
communicator's Rust call) and in its works' ``get_future`` (DDP makes them from its autograd
thread), and the same calls on a tensor of one bucket's size made from a plain loop, for
comparison. With the native backend (the default) DDP's calls never reach Python: those
counts are 0, and the line after the step times says how many calls the native backend took
and handed to Python.

Before the steps, on CUDA, each group's all_reduce is checked for stream order (a sleeping
kernel, then the tensor filled, then the all_reduce on the same stream: the sum must see the
fill); a failure exits 1.

NCCL_NVLS_ENABLE is set to 0 when the environment leaves it unset (no multicast objects).
"""

import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("FERROCX_MULTICAST", "0")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ferrocx.torch  # noqa: E402,F401  registers the backend


def model(width, layers, device):
    torch.manual_seed(1234)
    mods = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if i + 1 < layers:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods).to(device)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb (both models)")
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="also time, per backend, a step without communication (DDP's no_sync) and an "
        "all-reduce of every gradient at once through the group: what the step hides",
    )
    a = p.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    ref = "nccl" if cuda else "gloo"  # a machine without a GPU: CPU tensors against gloo
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        try:
            dist.init_process_group(ref, device_id=device)
        except TypeError:
            dist.init_process_group(ref)
    else:
        device = torch.device("cpu")
        dist.init_process_group(ref)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ids = [local] if cuda else None
    rank, n = dist.get_rank(), dist.get_world_size()
    fx = dist.new_group(backend="ferrocx")
    if cuda:
        # Stream order first: an all_reduce on the current stream reads what the kernels
        # before it wrote (a sleeping kernel holds the stream while the tensor is filled
        # after it).
        for name, group in ((ref, None), ("ferrocx", fx)):
            for _ in range(3):
                t = torch.zeros(1 << 20, device=device)
                torch.cuda._sleep(50_000_000)
                t.fill_(rank + 1)
                dist.all_reduce(t, group=group)
                want = n * (n + 1) / 2
                got = t[:8].tolist()
                if any(v != want for v in got):
                    print(f"rank {rank}: {name} all_reduce out of stream order: {got}, want {want}", flush=True)
                    sys.exit(1)
    # --breakdown: the time DDP's bucket calls spend in the backend's Python (the call and its
    # future), counted around the ferrocx group's methods.
    spent = {"allreduce": [], "get_future": [], "ferrocx call": []}
    if a.breakdown:
        import ferrocx.torch as fxt

        def timed(cls, name):
            inner = getattr(cls, name)

            def wrapper(*args, **kwargs):
                t0 = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    spent[name].append(time.perf_counter() - t0)

            setattr(cls, name, wrapper)

        timed(fxt.ProcessGroupFerrocx, "allreduce")

        class TimedComm:
            """The group's communicator, its all_reduce timed (the Rust call inside allreduce)."""

            def __init__(self, comm):
                self._inner = comm

            def all_reduce(self, *args):
                t0 = time.perf_counter()
                try:
                    return self._inner.all_reduce(*args)
                finally:
                    spent["ferrocx call"].append(time.perf_counter() - t0)

            def __getattr__(self, name):
                return getattr(self._inner, name)

        fx._comm = TimedComm(fx._comm)
        for cls in (fxt._Work, getattr(fxt, "_StreamWork", None)):
            if cls is not None and "get_future" in vars(cls):
                timed(cls, "get_future")

    runs = {
        ref: DDP(model(a.width, a.layers, device), device_ids=ids, bucket_cap_mb=a.bucket_mb),
        "ferrocx": DDP(
            model(a.width, a.layers, device), device_ids=ids, process_group=fx, bucket_cap_mb=a.bucket_mb
        ),
    }
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in runs.items()}
    params = sum(x.numel() for x in runs[ref].parameters())

    def batch(step):
        g = torch.Generator(device="cpu").manual_seed(step * 1000 + rank)
        x = torch.randn(a.batch, a.width, generator=g).to(device)
        y = torch.randn(a.batch, a.width, generator=g).to(device)
        return x, y

    def step(name, i):
        m, opt = runs[name], opts[name]
        x, y = batch(i)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        sync()
        return (time.perf_counter() - t0) * 1e3

    for i in range(a.warmup):
        for name in runs:
            step(name, i)
    times = {k: [] for k in runs}
    for i in range(a.warmup, a.warmup + a.steps):
        order = list(runs) if i % 2 == 0 else list(runs)[::-1]
        for name in order:
            times[name].append(step(name, i))

    steps_fx = a.warmup + a.steps
    extra = []
    if a.breakdown:
        calls_ar, t_ar = len(spent["allreduce"]), sum(spent["allreduce"])
        calls_fut, t_fut = len(spent["get_future"]), sum(spent["get_future"])
        kinds = ("allreduce", "ferrocx call", "get_future")
        ddp_med = [statistics.median(spent[k] or [0.0]) * 1e6 for k in kinds]
        # The same calls on one bucket's worth of gradients, from a plain loop (as DDP makes
        # them: allreduce, then get_future, waited for at the end).
        per_step = max(1, calls_ar // steps_fx)
        per_bucket = max(1, params // per_step)
        buf = torch.zeros(per_bucket, device=device)
        for k in spent:
            spent[k] = []
        loops = max(200, a.steps * per_step)
        for i in range(loops):
            fx.allreduce([buf], dist.AllreduceOptions()).get_future().wait()
            if i % per_step == per_step - 1:
                sync()  # a step's worth at a time, as DDP's (the CCL's queue never fills)
        sync()
        loop_med = [statistics.median(spent[k] or [0.0]) * 1e6 for k in kinds]
        us = torch.tensor(
            [t_ar / max(1, calls_ar) * 1e6, t_fut / max(1, calls_fut) * 1e6] + ddp_med + loop_med, device=device
        )
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            mean_ar, mean_fut, ddp_ar, ddp_call, ddp_fut, loop_ar, loop_call, loop_fut = us.tolist()
            print(
                f"# ferrocx group, per step: {calls_ar / steps_fx:.1f} allreduce calls, "
                f"{t_ar / steps_fx * 1e3:.3f} ms in them; {calls_fut / steps_fx:.1f} get_future "
                f"calls, {t_fut / steps_fx * 1e3:.3f} ms in them (rank 0, Python time)\n"
                f"# per call, us (median; mean), slowest rank: from DDP allreduce {ddp_ar:.1f} "
                f"({mean_ar:.1f}), of it the ferrocx call {ddp_call:.1f}, get_future {ddp_fut:.1f} "
                f"({mean_fut:.1f}); from a loop ({per_bucket} floats, {loops} calls) allreduce "
                f"{loop_ar:.1f}, of it the ferrocx call {loop_call:.1f}, get_future {loop_fut:.1f}",
                flush=True,
            )
        groups = {ref: None, "ferrocx": fx}
        flat = torch.zeros(params, device=device)
        for name in runs:
            quiet = []
            for i in range(a.steps // 2):
                with runs[name].no_sync():
                    quiet.append(step(name, 10_000 + i))
            comm = []
            for _ in range(a.steps // 2):
                sync()
                t0 = time.perf_counter()
                dist.all_reduce(flat, group=groups[name])
                sync()
                comm.append((time.perf_counter() - t0) * 1e3)
            extra += [statistics.median(quiet), statistics.median(comm)]

    # The slowest rank's median per backend.
    med = torch.tensor([statistics.median(times[k]) for k in runs] + extra, device=device)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    diff = max(
        (x - y).abs().max().item()
        for x, y in zip(runs[ref].parameters(), runs["ferrocx"].parameters())
    )
    d = torch.tensor([diff], device=device)
    dist.all_reduce(d, op=dist.ReduceOp.MAX)
    ok = d.item() <= a.tolerance
    if rank == 0:
        t_ref, t_fx = med.tolist()[:2]
        print(
            f"# DDP step: {n} ranks, {a.layers} x Linear({a.width}), {params / 1e6:.1f} M "
            f"parameters (f32), batch {a.batch} per rank, {a.steps} steps each, alternating"
        )
        print(f"{ref:8} median step {t_ref:8.3f} ms")
        print(f"ferrocx  median step {t_fx:8.3f} ms   ratio ferrocx/{ref} {t_fx / t_ref:.3f}")
        native = getattr(fx, "_native", None)
        if native is not None:
            took, handed = native.counts()
            print(f"# the native backend took {took} all_reduce calls, handed {handed} to Python (rank 0)")
        else:
            print("# no native backend: every call through the Python process group")
        if extra:
            e = med.tolist()[2:]
            for k, name in enumerate(runs):
                quiet, comm = e[2 * k], e[2 * k + 1]
                step_ms = med.tolist()[k]
                print(
                    f"{name:8} no_sync step {quiet:8.3f} ms, all-reduce of every gradient "
                    f"{comm:8.3f} ms, hidden by the step {quiet + comm - step_ms:8.3f} ms"
                )
        verdict = "OK" if ok else "FAILED"
        print(f"# largest parameter difference {d.item():.3g} (tolerance {a.tolerance}) {verdict}")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    rc = main()
    # Leave without finalizing the interpreter (as the tests' workers do): on a machine without a
    # GPU the reference is gloo, whose worker thread may still drop its last work then, and a
    # thread that takes the interpreter's lock after finalization is killed mid-destructor
    # (std::terminate, SIGABRT).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
