"""Python's per-call overhead at 8 bytes: an in-place all-reduce of 2 floats enqueued on torch's
current stream, world 1, timed per call over many back-to-back calls (enqueue only: the stream
is synchronized outside the timed loop), three ways:

- rust:   a loop in Rust over `Call::all_reduce` (`Communicator.bench_all_reduce`), the baseline;
- binding: a Python loop over `ferrocx.Communicator.all_reduce` on raw addresses;
- torch:  a Python loop over `torch.distributed.all_reduce` on the "ferrocx" backend.

    FERROCX_CONFIG=configs/nccl.toml torchrun --nproc-per-node 1 python/gpu/overhead.py [iters]

The same on CPU (host device, host CCL) with no CUDA config: `torchrun --nproc-per-node 1
python/gpu/overhead.py`. Prints one line per way with microseconds per call (best of 5 runs)
and the overhead over the Rust loop."""

import sys
import time

import torch
import torch.distributed as dist

import ferrocx
import ferrocx.torch  # noqa: F401 - registers the backend

iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
dist.init_process_group("ferrocx")
pg = dist.distributed_c10d._get_default_group()
comm = pg.comm
cuda = comm.device == "cuda"
if cuda:
    torch.cuda.set_device(comm.device_index)
    dev = torch.device("cuda", comm.device_index)
else:
    dev = torch.device("cpu")
t = torch.ones(2, dtype=torch.float32, device=dev)  # 8 bytes


def sync():
    if cuda:
        torch.cuda.current_stream().synchronize()
    else:
        comm.synchronize()


stream = comm.wrap_stream(torch.cuda.current_stream().cuda_stream) if cuda else None
addr = t.data_ptr()


def rust():
    return comm.bench_all_reduce(addr, 2, ferrocx.F32, iters, stream)


def binding():
    ar, f32, s = comm.all_reduce, ferrocx.F32, ferrocx.SUM
    start = time.perf_counter()
    for _ in range(iters):
        ar(addr, addr, 2, f32, s, stream)
    secs = time.perf_counter() - start
    sync()
    return secs


def via_torch():
    ar = dist.all_reduce
    start = time.perf_counter()
    for _ in range(iters):
        ar(t)
    secs = time.perf_counter() - start
    sync()
    return secs


results = {}
for name, fn in (("rust", rust), ("binding", binding), ("torch", via_torch)):
    fn()  # warm up
    results[name] = min(fn() for _ in range(5)) / iters * 1e6
base = results["rust"]
where = f"{comm.device} + {comm.ccl}" + (f", {torch.cuda.get_device_name(dev)}" if cuda else "")
print(f"per-call time of an 8-byte all_reduce, world 1, {where}, {iters} calls, best of 5:")
for name, us in results.items():
    print(f"  {name:8s} {us:8.2f} us/call   (+{us - base:6.2f} us over the Rust loop)")
dist.destroy_process_group()
