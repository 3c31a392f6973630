#!/usr/bin/env python3
"""PyTorch's all_reduce on gloo, the outside reference for jobs across clusters: ranks named by
--cuda-ranks hold CUDA tensors (gloo stages them through the host), the others CPU tensors.

    torchrun --nproc-per-node 4 scripts/gloo-allreduce.py --cuda-ranks 0 -b 8 -e 64M -f 4

Sizes (-b/-e/-f, K/M/G suffixes in powers of 2), warm-up (-w, default 5) and timed iterations
(-n, default 20) as `ferrocx bench`; float32, sum; bus bandwidth = algbw x 2(n-1)/n. A timed run
reads the host clock around `iters` calls and a synchronisation (CUDA ranks synchronise their
device); the slowest rank's time is printed. Every size is checked against the reference
(element i of rank r is (7r + 3i) mod 11, as in the bench).
"""

import argparse
import os
import re
import time

import torch
import torch.distributed as dist


def parse_size(text):
    """A byte count with an optional K, M or G suffix (powers of 2)."""
    m = re.fullmatch(r"(\d+)([KMG])?(I?B)?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(m.group(1)) << {None: 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-b", type=parse_size, default=8)
    p.add_argument("-e", type=parse_size, default=64 << 20)
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("--cuda-ranks", default="", help="comma-separated ranks with CUDA tensors")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda_ranks = {int(x) for x in a.cuda_ranks.split(",") if x}
    on_cuda = rank in cuda_ranks
    # The k-th CUDA rank (in rank order) uses GPU k.
    gpu = sorted(cuda_ranks).index(rank) if on_cuda else 0
    device = torch.device("cuda", gpu) if on_cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    if rank == 0:
        kinds = ["cuda" if r in cuda_ranks else "cpu" for r in range(world)]
        print(f"# gloo all_reduce, {world} ranks: {', '.join(kinds)}")
        print(f"# {'size':>12} {'count':>12} {'time(us)':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>6}")
    size = a.b
    while size <= a.e:
        count = max(size // 4, 1)
        idx = torch.arange(count, dtype=torch.int64)
        base = ((7 * rank + 3 * idx) % 11).to(torch.float32).to(device)
        want = sum(((7 * r + 3 * idx) % 11).to(torch.float32) for r in range(world))
        x = base.clone()
        for _ in range(a.w):
            x.copy_(base)
            dist.all_reduce(x)
        x.copy_(base)
        dist.all_reduce(x)
        sync()
        wrong = int((x.cpu() != want).sum())
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(a.n):
            dist.all_reduce(x)
        sync()
        t = (time.perf_counter() - t0) / a.n
        slowest = torch.tensor([t, float(wrong)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            t, wrong = slowest[0].item(), int(slowest[1].item())
            algbw = count * 4 / t / 1e9
            busbw = algbw * 2 * (world - 1) / world
            print(f"  {count * 4:>12} {count:>12} {t * 1e6:>10.1f} {algbw:>8.2f} {busbw:>8.2f} {wrong:>6}")
        size *= a.f
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main()
