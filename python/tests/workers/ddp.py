"""One rank of the DDP check: a small MLP trained for 20 steps with DDP over the ferrocx backend
(the default group) and, from the same initial parameters and data, over gloo (a second group);
the parameters must end equal within float tolerance. Under a configuration of several clusters
the ferrocx group spans them (collectives run as cross-cluster plans).

On a rank whose ferrocx cluster runs the CUDA device, the ferrocx model and its data live on the
GPU (heterogeneous jobs: CUDA tensors on GPU ranks, CPU tensors on CPU ranks); gloo's stays on
the CPU. Prints "ddp ok" with the largest difference."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ferrocx.torch  # noqa: F401 - registers the backend

STEPS = int(os.environ.get("DDP_STEPS", "20"))

dist.init_process_group("ferrocx")
rank, world = dist.get_rank(), dist.get_world_size()
pg = dist.distributed_c10d._get_default_group()
comm = pg.comm if hasattr(pg, "comm") else None
gloo = dist.new_group(backend="gloo")
device = torch.device("cpu")
if comm is not None and comm.device == "cuda":
    torch.cuda.set_device(comm.device_index)
    device = torch.device("cuda", comm.device_index)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))


ours = DDP(mlp().to(device), device_ids=None, bucket_cap_mb=0.004)  # several buckets
theirs = DDP(mlp(), process_group=gloo, bucket_cap_mb=0.004)
opt_ours = torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9)
opt_theirs = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1000 + rank)
for step in range(STEPS):
    x = torch.randn(8 + rank, 16, generator=g)  # ranks hold batches of different sizes
    y = torch.randint(0, 3, (8 + rank,), generator=g)
    for model, opt, dev in ((ours, opt_ours, device), (theirs, opt_theirs, torch.device("cpu"))):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()

worst = 0.0
for (name, a), b in zip(ours.module.named_parameters(), theirs.module.parameters()):
    a = a.detach().cpu()
    torch.testing.assert_close(a, b.detach(), rtol=1e-4, atol=1e-5, msg=lambda m: f"parameter {name}: {m}")
    worst = max(worst, (a - b.detach()).abs().max().item())
# The ranks agree with one another, too.
flat = torch.cat([p.detach().cpu().reshape(-1) for p in ours.module.parameters()])
first = flat.clone()
dist.broadcast(first, 0, group=gloo)
torch.testing.assert_close(flat, first, rtol=0, atol=0)
print(f"ddp ok on rank {rank} of {world} ({comm.cluster if comm else '?'}, {device}): {STEPS} steps, max |ferrocx - gloo| = {worst:.3g}", flush=True)
dist.destroy_process_group()
# Leave without finalizing the interpreter: gloo's worker thread may still be dropping its
# last work (and the Python tensors it holds) then, and a thread that takes the interpreter's
# lock after finalization is killed mid-destructor (std::terminate, SIGABRT).
sys.stdout.flush()
os._exit(0)
