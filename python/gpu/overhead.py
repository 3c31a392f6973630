"""Python's per-call overhead at 8 bytes: each hot call on 2 floats, timed per call over many
back-to-back calls (best of several runs), layer by layer:

- rust:    a loop in Rust over `Call::all_reduce` (`Communicator.bench_all_reduce`), the baseline;
- binding: a Python loop over `ferrocx.Communicator.<op>` on raw addresses;
- torch:   a Python loop over `torch.distributed.<op>` on the "ferrocx" backend (without
           `async_op`, and for all_reduce also with `async_op=True`, the work dropped).

On CUDA (a rank whose cluster runs the cuda device) every call is enqueued on torch's current
stream and only enqueued: the stream is synchronized outside the timed loop. On the host device
a call without `async_op` waits for its completion; there the synchronous layers are compared
with the Rust loop and the binding that also wait after each call (`+sync`).

    FERROCX_CONFIG=configs/nccl.toml torchrun --nproc-per-node 1 python/gpu/overhead.py [iters]
    torchrun --nproc-per-node 2 python/gpu/overhead.py --device cpu [iters]

`--device cpu` runs the ranks on the host device and host CCL whatever the machine has (a
configuration of one host cluster, written for the run); the default takes the device that the
configuration gives this rank. `--ops` picks the operations (default: all_reduce, broadcast,
all_gather_into_tensor, reduce_scatter_tensor, and send/recv on 2 or more ranks). Prints, on
rank 0, microseconds per call of wall-clock time and of the calling thread's CPU time, and each
torch layer's overhead over its baseline (the Rust loop for all_reduce, the binding's same call
for the others)."""

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import ferrocx
import ferrocx.torch  # noqa: F401 - registers the backend

OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "send_recv")

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("iters", nargs="?", type=int, default=20000, help="calls per timed loop")
parser.add_argument("--device", choices=("auto", "cpu"), default="auto")
parser.add_argument("--ops", default=",".join(OPS), help="comma-separated, of " + ", ".join(OPS))
parser.add_argument("--runs", type=int, default=5, help="timed loops per layer (the best counts)")
args = parser.parse_args()
ops = [o for o in args.ops.split(",") if o]
unknown = set(ops) - set(OPS)
if unknown:
    parser.error(f"unknown ops {sorted(unknown)}")

if args.device == "cpu":
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = os.path.join(tempfile.gettempdir(), f"ferrocx-overhead-host-{world}-{os.getuid()}.toml")
    with open(cfg + f".{os.getpid()}", "w") as f:
        f.write(f'[[cluster]]\nname = "cpu"\nranks = "0-{world - 1}"\ndevice = "host"\nccl = "host"\n')
    os.replace(cfg + f".{os.getpid()}", cfg)
    os.environ["FERROCX_CONFIG"] = cfg

iters = args.iters
dist.init_process_group("ferrocx")
pg = dist.distributed_c10d._get_default_group()
comm = pg.comm
rank, world = dist.get_rank(), dist.get_world_size()
cuda = comm.device == "cuda"
if cuda:
    torch.cuda.set_device(comm.device_index)
    dev = torch.device("cuda", comm.device_index)
else:
    dev = torch.device("cpu")
if world % 2 and "send_recv" in ops:  # pairs of ranks: 0-1, 2-3, ...
    ops.remove("send_recv")

F32, SUM = ferrocx.F32, ferrocx.SUM
t = torch.ones(2, dtype=torch.float32, device=dev)  # 8 bytes
big = torch.ones(2 * world, dtype=torch.float32, device=dev)  # all_gather's output, reduce_scatter's input
stream = comm.wrap_stream(torch.cuda.current_stream().cuda_stream) if cuda else None
a, b = t.data_ptr(), big.data_ptr()
peer = rank ^ 1 if world % 2 == 0 else None


def sync():
    if cuda:
        torch.cuda.current_stream().synchronize()
    else:
        comm.synchronize()


def timed(body):
    """One timed loop of `iters` calls: (wall seconds, this thread's CPU seconds)."""

    def run():
        sync()
        dist.barrier()
        w0, c0 = time.perf_counter(), time.thread_time()
        body()
        w, c = time.perf_counter() - w0, time.thread_time() - c0
        sync()
        return w, c

    return run


def loop(call, *xs):
    def body():
        for _ in range(iters):
            call(*xs)

    return timed(body)


def loop_sync(call, *xs):
    wait = comm.synchronize

    def body():
        for _ in range(iters):
            call(*xs)
            wait()

    return timed(body)


def rust(sync_each):
    def body():
        comm.bench_all_reduce(a, 2, F32, iters, stream, sync_each)

    return timed(body)


# Each op's binding call (as the backend makes it: in place for all_reduce and broadcast, 2
# floats per rank for the others) and torch call.
calls = {
    "all_reduce": ((comm.all_reduce, a, a, 2, F32, SUM, stream), (dist.all_reduce, t)),
    "broadcast": ((comm.broadcast, a, a, 2, F32, 0, stream), (dist.broadcast, t, 0)),
    "all_gather_into_tensor": ((comm.all_gather, a, b, 2, F32, stream), (dist.all_gather_into_tensor, big, t)),
    "reduce_scatter_tensor": ((comm.reduce_scatter, b, a, 2, F32, SUM, stream), (dist.reduce_scatter_tensor, t, big)),
}
if peer is not None:
    sends = rank < peer
    calls["send_recv"] = (
        ((comm.send if sends else comm.recv), a, 2, F32, peer, stream),
        ((dist.send if sends else dist.recv), t, peer),
    )

# (op, layer) -> a timed loop, baselines first.
layers = {}
for op in ops:
    binding, via_torch = calls[op]
    if op == "all_reduce":
        layers[(op, "rust")] = rust(False)
    layers[(op, "binding")] = loop(*binding)
    if not cuda:
        if op == "all_reduce":
            layers[(op, "rust+sync")] = rust(True)
        layers[(op, "binding+sync")] = loop_sync(*binding)
    if op == "all_reduce":
        layers[(op, "torch async")] = loop(dist.all_reduce, t, dist.ReduceOp.SUM, None, True)
    layers[(op, "torch")] = loop(*via_torch)

# What each layer is compared with: the Rust loop where there is one, else the binding; on the
# host device, a synchronous layer with the synchronous baseline.
BASE = {"binding": "rust", "binding+sync": "rust+sync", "torch async": "rust", "torch": "rust"}
if not cuda:
    BASE["torch"] = "rust+sync"


def baseline(op, layer):
    base = BASE.get(layer)
    if base is not None and (op, base) not in layers:
        base = {"torch": "binding+sync" if not cuda else "binding", "torch async": "binding"}.get(layer)
    return base if (op, base) in layers else None


best = {}
for fn in layers.values():
    fn()  # warm up
for _ in range(args.runs):
    for key, fn in layers.items():
        w, c = fn()
        old = best.get(key, (float("inf"), float("inf")))
        best[key] = (min(old[0], w / iters * 1e6), min(old[1], c / iters * 1e6))

if rank == 0:
    where = f"{comm.device} + {comm.ccl}" + (f", {torch.cuda.get_device_name(dev)}" if cuda else "")
    print(
        f"per-call time at 8 bytes, world {world}, {where}, torch {torch.__version__}, "
        f"{iters} calls, best of {args.runs} (wall-clock / calling thread's CPU time, us):"
    )
    for op in ops:
        if not any(k[0] == op for k in layers):
            continue
        print(f"  {op}:")
        for (o, layer), (w, c) in best.items():
            if o != op:
                continue
            line = f"    {layer:13s} {w:8.2f} wall {c:8.2f} cpu"
            base = baseline(op, layer)
            if base is not None:
                bw, bc = best[(op, base)]
                line += f"   {w - bw:+7.2f} wall {c - bc:+7.2f} cpu over {base}"
            print(line)
dist.destroy_process_group()
