"""Tensors a program makes from Python numbers (`torch.tensor(3.0)`), traced as the constants
they are.

`torch.tensor(data)` builds its tensor outside the dispatcher and hands it to the trace through
`aten.lift_fresh`: to the tracer it is a tensor made outside the trace, so it became an input of
the graph (a lifted constant) whose value no compiler pass could see. A one-element CPU one is
now a `prims.full` of its value: passes fold what is computed from it (an attention scale,
`sqrt(tensor(head_dim) * factor)`, a log-bucket's `log(tensor(max_pos / mid))`), and a GPU
program reading it needs no copy from the host, which would keep it off CUDA graphs. The value
is the one eager computes on every call; a tensor the program closes over (a global the user
may write between calls) does not come through lift_fresh and stays an input.
"""

from __future__ import annotations

import torch

from .prims import full

aten = torch.ops.aten

LIFT_FRESH = (aten.lift_fresh.default, aten.lift_fresh_copy.default)


def fresh_constant(tracer, t):
    """`t`, a fresh tensor of `torch.tensor(number)`, recorded as a `prims.full` of its value;
    None when it is not a one-element plain CPU tensor made outside the trace."""
    if (type(t) is not torch.Tensor or t.device.type != "cpu" or t.numel() != 1
            or t.requires_grad or t.dtype.is_complex or tracer.is_traced(t)):  # fmt: skip
        return None
    return full(tuple(t.shape), t.item(), t.dtype, t.device)
