"""One rank of the bad-input check. Each case must raise ferrocx.Error with ferrocx's message
(never crash the interpreter or hang): `python errors.py CASE...`, in order, on one group.
Prints "error ok: CASE: message" for each check.

- dtype: a dtype ferrocx has no type for (uint16);
- op: a reduce op ferrocx has not (BAND), and AVG on bool;
- local: sizes and dtypes that disagree within one call, a send to oneself, a receive of a dtype
  ferrocx has no type for (refused before any communication; the group works on);
- shape: all_reduce with a different element count on each rank (the communicator stays failed:
  the next call raises the same);
- dead: the last rank exits; the others' all_reduce fails naming it (within FERROCX_TIMEOUT_MS).
"""

import os
import sys

import torch
import torch.distributed as dist

import ferrocx
import ferrocx.torch  # noqa: F401 - registers the backend

dist.init_process_group("ferrocx")
rank, world = dist.get_rank(), dist.get_world_size()


def expect(what, fn, *needles):
    try:
        fn()
    except ferrocx.Error as e:
        msg = str(e)
        for n in needles:
            if n not in msg:
                raise AssertionError(f"{what}: the error does not say {n!r}: {msg}") from e
        print(f"error ok: {what}: {msg}", flush=True)
        return
    raise AssertionError(f"{what}: no error")


for case in sys.argv[1:]:
    if case == "dtype":
        expect("dtype", lambda: dist.all_reduce(torch.ones(3, dtype=torch.uint16)), "unsupported dtype torch.uint16")
        expect("dtype broadcast", lambda: dist.broadcast(torch.ones(3, dtype=torch.uint32), 0), "unsupported dtype")
    elif case == "op":
        expect("op", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND), "unsupported reduce op BAND")
        expect("op bool", lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG), "AVG", "bool")
        # the group still works after refusing
        t = torch.ones(3)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((3,), float(world))), t
    elif case == "local":
        # refused before any communication (the short paths leave these to the general one)
        expect("local", lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)), "all_gather output holds 3 elements")
        f64 = torch.empty(2 * world, dtype=torch.float64)
        expect("local gather dtype", lambda: dist.all_gather_into_tensor(f64, torch.ones(2)), "all_gather output is torch.float64")
        odd = torch.ones(2 * world + 1)
        expect("local scatter size", lambda: dist.reduce_scatter_tensor(torch.empty(2), odd), f"input holds {odd.numel()} elements")
        pg = dist.distributed_c10d._get_default_group()  # torch's send refuses oneself before it
        expect("local send to self", lambda: pg.send([torch.ones(2)], rank, 0), f"cannot send to rank {rank}")
        expect("local recv dtype", lambda: dist.recv(torch.ones(2, dtype=torch.uint16), (rank + 1) % world), "unsupported dtype torch.uint16")
        t = torch.ones(3)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((3,), float(world))), t
    elif case == "shape":
        n = 4 + 3 * rank
        expect("shape", lambda: dist.all_reduce(torch.ones(n)), "ranks disagree", "count 4")
        # the communicator stays failed (as NCCL's after an abort): later calls say why
        expect("after shape", lambda: dist.all_reduce(torch.ones(5)), "failed earlier", "ranks disagree")
    elif case == "dead":
        if rank == world - 1:
            os._exit(0)
        expect("dead", lambda: dist.all_reduce(torch.ones(1000)), f"rank {world - 1}", "died")
    else:
        raise SystemExit(f"unknown case {case}")
sys.stdout.flush()
os._exit(0)
