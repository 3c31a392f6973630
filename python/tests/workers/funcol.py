"""One rank of the functional-collectives check: torch.distributed._functional_collectives and a
torch.compile'd function that calls them run through the ferrocx backend and match gloo's
results. Prints "funcol ok"."""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import ferrocx.torch  # noqa: F401 - registers the backend

dist.init_process_group("ferrocx")
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
pg = dist.group.WORLD

x = torch.arange(12, dtype=torch.float32) * (rank + 1) - 3
want = x.clone()
dist.all_reduce(want, group=gloo)
got = funcol.all_reduce(x, "sum", pg)
torch.testing.assert_close(got, want)

want_ag = [torch.empty_like(x) for _ in range(world)]
dist.all_gather(want_ag, x, group=gloo)
got_ag = funcol.all_gather_tensor(x, 0, pg)
torch.testing.assert_close(got_ag, torch.cat(want_ag))

big = torch.arange(4 * world, dtype=torch.float32) + rank
want_rs = torch.empty(4)
dist.reduce_scatter_tensor(want_rs, big, group=gloo)
got_rs = funcol.reduce_scatter_tensor(big, "sum", 0, pg)
torch.testing.assert_close(got_rs, want_rs)


def step(t):
    y = funcol.all_reduce(t * 2, "sum", pg)
    return torch.relu(y) + 1


backend = os.environ.get("FUNCOL_COMPILE_BACKEND", "aot_eager")
compiled = torch.compile(step, backend=backend, fullgraph=True)
want_c = x * 2
dist.all_reduce(want_c, group=gloo)
torch.testing.assert_close(compiled(x), torch.relu(want_c) + 1)
print(f"funcol ok on rank {rank} of {world} (torch.compile backend {backend})", flush=True)
dist.destroy_process_group()
# Leave without finalizing the interpreter: gloo's worker thread may still be dropping its
# last work (and the Python tensors it holds) then, and a thread that takes the interpreter's
# lock after finalization is killed mid-destructor (std::terminate, SIGABRT).
sys.stdout.flush()
os._exit(0)
