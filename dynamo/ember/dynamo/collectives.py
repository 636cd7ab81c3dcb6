"""Collectives as torch.library operators, for graphs that Ember captured from tensor parallel
modules (tensor_parallel.py): backends keep them opaque and their wrappers call them, and each
carries the autograd formula DTensor's redistribution has. Imported when such a module is first
traced, so programs without one register nothing."""

import torch  # no `from __future__ import annotations`: custom_op reads the annotations


def _group(name: str):
    from torch.distributed import distributed_c10d

    return distributed_c10d._resolve_process_group(name)


@torch.library.custom_op("ember_dist::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """The sum of `x` over the ranks of the process group `group_name` (a new tensor)."""
    out = x.clone(memory_format=torch.contiguous_format)
    torch.distributed.all_reduce(out, group=_group(group_name))
    return out


@all_reduce.register_fake
def _(x, group_name):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _all_reduce_backward(ctx, grad):
    return grad, None  # Partial -> Replicate: the replicated gradient is every rank's share


all_reduce.register_autograd(_all_reduce_backward)


@torch.library.custom_op("ember_dist::grad_all_reduce", mutates_args=())
def grad_all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """`x` itself (a copy); its gradient is summed over the group (a replicated input read by
    sharded computation: each rank's gradient is a partial sum)."""
    return x.clone()


@grad_all_reduce.register_fake
def _(x, group_name):
    return torch.empty_like(x)


def _setup_grad_all_reduce(ctx, inputs, output):
    ctx.group_name = inputs[1]


def _grad_all_reduce_backward(ctx, grad):
    return all_reduce(grad, ctx.group_name), None


grad_all_reduce.register_autograd(_grad_all_reduce_backward, setup_context=_setup_grad_all_reduce)
