"""One rank of the group check: the default group on gloo, bound to a device (``device_id``,
as training scripts bind theirs to their GPU), then ferrocx groups made with
``torch.distributed.new_group``: one over every rank and one over the first two. torch asks a
new group's backend whether it can split (``supports_splitting``) when the default group is
bound to a device. Each group's all_reduce and broadcast are checked against values computed
here. Prints "groups ok"."""

import torch
import torch.distributed as dist

import ferrocx.torch  # noqa: F401 - registers the backend

try:
    dist.init_process_group("gloo", device_id=torch.device("cpu", 0))
except (TypeError, ValueError):  # a torch whose device_id takes CUDA devices only
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

everyone = dist.new_group(backend="ferrocx")
pair = dist.new_group(ranks=[0, 1], backend="ferrocx")

g = torch.Generator().manual_seed(7)
inputs = [torch.randn(1001, generator=g) for _ in range(world)]

t = inputs[rank].clone()
dist.all_reduce(t, group=everyone)
want = torch.stack(inputs).sum(0)
assert torch.allclose(t, want, rtol=1e-5, atol=1e-5), (rank, (t - want).abs().max())

b = inputs[rank].clone()
dist.broadcast(b, src=world - 1, group=everyone)
assert torch.equal(b, inputs[world - 1]), rank

if rank < 2:
    p = inputs[rank].clone()
    dist.all_reduce(p, group=pair)
    assert torch.allclose(p, inputs[0] + inputs[1], rtol=1e-5, atol=1e-5), rank

dist.barrier()
print(f"groups ok rank {rank}", flush=True)
dist.destroy_process_group()
