#!/usr/bin/env python3
"""PyTorch's all_reduce on NCCL (or on ferrocx's backend, `--backend ferrocx`), timed as
`ferrocx bench` times its collectives: the outside reference next to `ferrocx bench --direct`.

    torchrun --nproc-per-node N scripts/torch-allreduce.py -b 8 -e 256M -f 4 [--graph]

The same sizes (-b/-e/-f, with K, M, G suffixes in powers of 2), warm-up (-w, default 5) and
timed iterations (-n, default 20) as the bench; float32, sum; bus bandwidth = algbw x 2(n-1)/n.
A timed run reads the host clock around enqueuing `iters` calls of
torch.distributed.all_reduce and one synchronisation, after `warmup` untimed calls and a fresh
input; with --graph the `iters` calls are captured into one CUDA graph (after an eager
warm-up, replayed once untimed), and a timed run is one replay. A run's time is the slowest
rank's; each size is timed --repeats times (default 1) and the median is printed. Every size is
checked against the reference (element i of rank r is (7r + 3i) mod 11, as in the bench).
torch.distributed.all_reduce works in place only: the out-of-place columns print N/A.

`--symm-mem` times PyTorch's SymmetricMemory one-shot all-reduce instead
(torch.ops.symm_mem.one_shot_all_reduce_out: every rank reads every peer's input from a
symmetric buffer made by symm_mem.empty and rendezvous, on its CUDA backend): out of place, so
the in-place columns print N/A. It is the outside reference for ferrocx's window all-reduce at
small sizes.

NCCL_NVLS_ENABLE is set to 0 and TORCH_SYMM_MEM_DISABLE_MULTICAST to 1 when the environment
leaves them unset, before NCCL or SymmetricMemory start, so neither creates multicast objects.
"""

import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import argparse  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse_size(text):
    """A byte count with an optional K, M or G suffix (powers of 2): 8, 64K, 1M, 2GiB."""
    m = re.fullmatch(r"(\d+)([KMG])?(I?B)?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: expected a byte count with an optional K, M or G suffix"
        )
    shift = {None: 0, "K": 10, "M": 20, "G": 30}[m.group(2)]
    return int(m.group(1)) << shift


def sizes(lo, hi, factor):
    out, s = [], lo
    while 0 < s <= hi:
        out.append(s)
        s *= factor
    return out


def show_time(us):
    """Time in nccl-tests' widths, as the bench prints it."""
    if us >= 10_000:
        return f"{us:7.0f}"
    if us >= 100:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=1, help="timed runs per size (median)")
    p.add_argument("--graph", action="store_true", help="time CUDA graph replays")
    p.add_argument(
        "--backend",
        default="nccl",
        help="torch.distributed backend: nccl (default), or ferrocx (imports ferrocx.torch)",
    )
    p.add_argument(
        "--symm-mem",
        action="store_true",
        help="time torch.ops.symm_mem.one_shot_all_reduce_out on a SymmetricMemory buffer "
        "(out of place) instead of torch.distributed.all_reduce",
    )
    a = p.parse_args()
    if a.minbytes < 1 or a.minbytes > a.maxbytes or a.stepfactor < 2 or a.iters < 1:
        p.error("need 1 <= -b <= -e, -f >= 2 and -n >= 1")
    if a.repeats < 1 or a.warmup < 0:
        p.error("need --repeats >= 1 and -w >= 0")

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    if a.backend == "ferrocx":
        import ferrocx.torch  # noqa: F401  registers the backend

    if a.backend != "nccl":
        dist.init_process_group(a.backend)
    else:
        try:
            dist.init_process_group(a.backend, device_id=device)
        except TypeError:  # torch without device_id
            dist.init_process_group(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    bus_factor = 2 * (n - 1) / n

    me = (os.getpid(), socket.gethostname(), local, torch.cuda.get_device_name(local))
    everyone = [None] * n
    dist.all_gather_object(everyone, me)

    all_sizes = sizes(a.minbytes, a.maxbytes, a.stepfactor)
    largest = max(all_sizes) // 4
    if a.symm_mem:
        import torch.distributed._symmetric_memory as symm_mem

        try:
            symm_mem.set_backend("CUDA")  # P2P loads over NVLink; no NVSHMEM, no multicast
        except (AttributeError, RuntimeError):
            pass
        group_name = dist.group.WORLD.group_name
        buf = symm_mem.empty(max(largest, 1), dtype=torch.float32, device=device)
        symm_mem.rendezvous(buf, group_name)
        out = torch.empty(max(largest, 1), dtype=torch.float32, device=device)

        def reduce(t):
            o = out[: t.numel()]
            torch.ops.symm_mem.one_shot_all_reduce_out(t, "sum", group_name, o)
            return o

    else:
        buf = torch.empty(max(largest, 1), dtype=torch.float32, device=device)

        def reduce(t):
            dist.all_reduce(t)
            return t

    side = torch.cuda.Stream(device)

    def fresh(count):
        i = torch.arange(count, device=device)
        mine = ((7 * rank + 3 * i) % 11).float()
        want = sum(((7 * r + 3 * i) % 11) for r in range(n)).float()
        return mine, want

    def capture(t, k):
        # Collectives are captured on a side stream after an eager warm-up there, as
        # PyTorch's CUDA-graph documentation asks; thread-local mode, as ferrocx captures.
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side, capture_error_mode="thread_local"):
            for _ in range(k):
                reduce(t)
        return g

    def timed_run(t, mine, graph):
        t.copy_(mine)
        for _ in range(a.warmup):
            reduce(t)
        torch.cuda.synchronize()
        start = time.perf_counter()
        if graph is not None:
            graph.replay()
        else:
            for _ in range(a.iters):
                reduce(t)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e6 / a.iters

    if rank == 0:
        mode = (
            "graph replays (iters captured into one CUDA graph, after an eager warm-up)"
            if a.graph
            else "back-to-back"
        )
        v = torch.cuda.nccl.version()
        nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        print(f"# torch all_reduce: torch {torch.__version__}, NCCL {nccl}, {n} ranks")
        print(
            f"#  dtype: f32  redop: sum  root: 0  minBytes {a.minbytes} maxBytes {a.maxbytes} "
            f"step: {a.stepfactor}(factor) warmup iters: {a.warmup} iters: {a.iters} check iters: 1"
        )
        print(
            f"#  timing: {mode}, host clock around enqueue and synchronize; "
            f"median of {a.repeats} run(s) per size"
        )
        print(
            "#  NCCL_NVLS_ENABLE=" + os.environ.get("NCCL_NVLS_ENABLE", "")
            + "  TORCH_SYMM_MEM_DISABLE_MULTICAST="
            + os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST", "")
        )
        print("#")
        print("# Using devices")
        for r, (pid, host, dev, name) in enumerate(everyone):
            print(f"#  Rank {r:2} Pid {pid:6} on {host:>10} device {dev:2} [{name}]")
        print("#")
        if a.symm_mem:
            print("# all_reduce (torch.ops.symm_mem.one_shot_all_reduce_out, out of place only)")
        else:
            print("# all_reduce (torch.distributed, in place only)")
        print(f"#{'out-of-place':>73}{'in-place':>30}")
        print(
            "#       size         count      type   redop    root     time   algbw   busbw "
            "#wrong     time   algbw   busbw #wrong"
        )
        print(
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
            "            (us)  (GB/s)  (GB/s)"
        )
        sys.stdout.flush()

    total_wrong, busbws = 0, []
    for size in all_sizes:
        count = size // 4
        t = buf[:count]
        mine, want = fresh(count)
        graph = None
        if a.graph:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                t.copy_(mine)
                for _ in range(a.warmup):
                    reduce(t)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = capture(t, a.iters)
            graph.replay()  # the first replay uploads the graph: untimed
            torch.cuda.synchronize()
        times = [timed_run(t, mine, graph) for _ in range(a.repeats)]
        # The check: fresh input, one all_reduce (from a graph with --graph), the reference.
        one = capture(t, 1) if a.graph else None
        t.copy_(mine)
        if one is not None:
            one.replay()
            result = out[:count] if a.symm_mem else t
        else:
            result = reduce(t)
        torch.cuda.synchronize()
        wrong = int((result != want).sum().item())
        del graph, one
        stats = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        bad = torch.tensor([wrong], dtype=torch.int64, device=device)
        dist.all_reduce(bad)
        us = statistics.median(stats.tolist())
        wrong = int(bad.item())
        total_wrong += wrong
        alg = count * 4 / us / 1e3 if us > 0 else 0.0
        bus = alg * bus_factor
        busbws.append(bus)
        if rank == 0:
            na = f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>5}"
            got = f"  {show_time(us)}  {alg:6.2f}  {bus:6.2f}  {wrong:>5}"
            cols = got + na if a.symm_mem else na + got
            print(f"{count * 4:>12}  {count:>12}  {'f32':>8}  {'sum':>6}  {-1:>6}{cols}")
            sys.stdout.flush()

    if rank == 0:
        verdict = "OK" if total_wrong == 0 else "FAILED"
        print(f"# Out of bounds values : {total_wrong} {verdict}")
        print(f"# Avg bus bandwidth : {sum(busbws) / max(len(busbws), 1):.4f}")
    dist.barrier()
    dist.destroy_process_group()
    return 1 if total_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
