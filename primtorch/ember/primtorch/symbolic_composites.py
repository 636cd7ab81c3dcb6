"""Composite ops decomposed in Python while tracing with symbolic sizes.

torch's C++ composites (CompositeImplicitAutograd kernels such as `linear`) run above the dispatch
key where the tracer sees ops. A few of them read a tensor's sizes as plain ints (`sizes()`, not
`sym_sizes()`), so the symbolic sizes of a SymbolicTensor come back as their hints and the shape
arithmetic that follows (a view to the flattened size, say) is baked for this example's sizes.
While a symbolic trace runs, `SymbolicComposites` (a TorchFunctionMode) answers those functions
with Python decompositions whose shape arithmetic is done on SymInts, so it stays symbolic; the
ATen ops they call reach the tracer as usual. A rule returns NotImplemented for the cases the C++
composite handles symbolically itself.
"""

from __future__ import annotations

import operator
from functools import reduce

import torch
from torch.overrides import TorchFunctionMode


def _linear(input, weight, bias=None):
    """linear on an input of 3 or more dims with a bias: torch flattens it to 2-d for one addmm
    and views the result back, reading the sizes as ints; here the flattened size is a SymInt."""
    if bias is None or input.dim() < 3 or not isinstance(input, torch.Tensor):
        return NotImplemented
    sizes = input.shape
    if not input.is_contiguous():
        return torch.matmul(input, weight.t()) + bias  # torch's own path for this layout
    flat = reduce(operator.mul, sizes[:-1], 1)
    out = torch.addmm(bias, input.reshape(flat, sizes[-1]), weight.t())
    return out.view(*sizes[:-1], out.shape[-1])


def _dropout(input, p=0.5, training=True, inplace=False):
    """dropout: torch's composite asks `numel()`, which a tensor with symbolic sizes refuses; this
    is what it computes on CPU (a Bernoulli mask scaled by 1 / (1 - p))."""
    if not isinstance(input, torch.Tensor) or inplace or not 0 <= p <= 1:
        return NotImplemented
    if not training or p == 0:
        return input
    if p == 1:
        return input * torch.zeros_like(input)
    noise = torch.empty_like(input).bernoulli_(1 - p).div_(1 - p)
    return input * noise


_RULES = {
    torch._C._nn.linear: _linear,
    torch.nn.functional.linear: _linear,
    torch.nn.functional.dropout: _dropout,
    torch.dropout: lambda input, p, train: _dropout(input, p, train),
}


class SymbolicComposites(TorchFunctionMode):
    """While active, the composites in `_RULES` run as Python decompositions (see the module)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rule = _RULES.get(func)
        if rule is not None:
            out = rule(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


__all__ = ["SymbolicComposites"]
