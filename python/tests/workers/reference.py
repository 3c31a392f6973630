"""What the workers compare against: a reduction over ranks of tensors gathered (through gloo)
into one stacked tensor, computed here in the wide dtype the stack holds."""

import torch.distributed as dist

R = dist.ReduceOp


def reduce_stack(op, s):
    """`op` over the first dimension of `s` (one row per rank): SUM, AVG, MIN, MAX, else PRODUCT."""
    if op == R.SUM:
        return s.sum(0)
    if op == R.AVG:
        return s.sum(0) / s.shape[0]
    if op == R.MIN:
        return s.min(0).values
    if op == R.MAX:
        return s.max(0).values
    return s.prod(0)
