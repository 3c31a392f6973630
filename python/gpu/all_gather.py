#!/usr/bin/env python3
"""torch.distributed.all_gather_into_tensor on ferrocx's backend against torch's ``nccl``, in
one job: the default group on ``nccl`` and a whole-world group on ``"ferrocx"``, the same
tensors and stream, alternating size by size.

    torchrun --nproc-per-node N python/gpu/all_gather.py [-b 256K] [-e 16M] [-n 100] [--repeats 5]

Sizes are the whole output (-b/-e, doubling, K/M suffixes in powers of 2), float32. A timed
run reads the host clock around enqueuing ``-n`` calls and one synchronisation, after 5 untimed
calls; each size is timed ``--repeats`` times per backend, the two alternating, and the median
of each is printed with their ratio (nccl's time over ferrocx's: above 1, ferrocx is faster)
and the bus bandwidth, algbw x (n-1)/n as for NCCL's all_gather. Every call's output is checked
first (element i of rank r's input is r * 1000 + i mod 997); a wrong value exits 1.

NCCL_NVLS_ENABLE is set to 0 and FERROCX_MULTICAST to 0 when the environment leaves them unset
(no multicast objects).
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

import ferrocx.torch  # noqa: E402,F401  registers the backend


def size(text):
    t = text.strip().upper()
    shift = {"K": 10, "M": 20, "G": 30}.get(t[-1:], 0)
    return int(t[:-1] if shift else t) << shift


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-b", type=size, default=size("256K"))
    p.add_argument("-e", type=size, default=size("16M"))
    p.add_argument("-n", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    groups = {"nccl": dist.group.WORLD, "ferrocx": dist.new_group(backend="ferrocx")}
    if rank == 0:
        print(f"# all_gather_into_tensor, float32, {world} ranks, {a.n} calls a run, "
              f"median of {a.repeats}; ratio = nccl time / ferrocx time")
        print(f"# {'output (B)':>12} {'nccl (us)':>10} {'ferrocx (us)':>12} {'ratio':>6} "
              f"{'nccl busbw':>10} {'ferrocx busbw':>13}")
    bad = 0
    nbytes = a.b
    while nbytes <= a.e:
        per = nbytes // 4 // world
        inp = ((torch.arange(per, device=device) % 997) + rank * 1000).float()
        out = torch.empty(per * world, device=device)
        want = torch.cat([((torch.arange(per, device=device) % 997) + r * 1000).float()
                          for r in range(world)])
        for name, g in groups.items():
            out.fill_(-1)
            dist.all_gather_into_tensor(out, inp, group=g)
            torch.cuda.synchronize()
            if not torch.equal(out, want):
                print(f"rank {rank}: {name} all_gather of {nbytes} B is wrong", flush=True)
                bad = 1
        times = {k: [] for k in groups}
        for r in range(a.repeats):
            order = list(groups.items()) if r % 2 == 0 else list(groups.items())[::-1]
            for name, g in order:
                for _ in range(5):
                    dist.all_gather_into_tensor(out, inp, group=g)
                torch.cuda.synchronize()
                dist.barrier(group=groups["nccl"])
                t0 = time.perf_counter()
                for _ in range(a.n):
                    dist.all_gather_into_tensor(out, inp, group=g)
                torch.cuda.synchronize()
                t = (time.perf_counter() - t0) / a.n
                slowest = torch.tensor([t], device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=groups["nccl"])
                times[name].append(slowest.item())
        if rank == 0:
            m = {k: statistics.median(v) for k, v in times.items()}
            bus = {k: nbytes / m[k] * (world - 1) / world / 1e9 for k in m}
            print(f"  {nbytes:>12} {m['nccl'] * 1e6:>10.2f} {m['ferrocx'] * 1e6:>12.2f} "
                  f"{m['nccl'] / m['ferrocx']:>6.2f} {bus['nccl']:>10.1f} {bus['ferrocx']:>13.1f}",
                  flush=True)
        nbytes *= 2
    dist.destroy_process_group()
    sys.exit(bad)


if __name__ == "__main__":
    main()
