"""The runtime side: run compiled forward/backward graphs as one `torch.autograd.Function`.

Around the compiled call it does what the functional graphs cannot: draws the RNG seed, copies new
values of mutated inputs back into the caller's tensors, and rebuilds outputs that alias inputs or
each other as real views (so the caller sees eager's aliasing).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch
from torch.utils import _pytree as pytree


@dataclasses.dataclass(frozen=True)
class AliasSpec:
    """An output rebuilt after the call as a view of an input (`of_input`) or of a graph output."""

    of_input: bool
    index: int
    sizes: tuple
    strides: tuple
    offset: Any  # storage offset relative to the base's own storage offset
    requires_grad: bool

    def rebuild(self, base: torch.Tensor) -> torch.Tensor:
        if not self.requires_grad:
            base = base.detach()
        return base.as_strided(self.sizes, self.strides, base.storage_offset() + self.offset)


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """Where one flat user output comes from: a graph output, an alias, or a traced constant."""

    kind: str  # "graph" | "alias" | "const"
    index: int = 0
    alias: Optional[AliasSpec] = None
    value: Any = None


@dataclasses.dataclass
class RuntimePlan:
    """Everything the runtime needs to know about one traced signature."""

    outputs: list[OutputSpec]
    out_spec: Any  # pytree spec of the user's outputs
    num_graph_outputs: int  # graph outputs that user outputs (or alias bases) come from
    mutated_inputs: list[int]  # their new values follow the graph outputs, in this order
    differentiable: list[bool]  # per graph output: does it get a gradient (a tangent)?
    grad_inputs: list[bool]  # per flat tensor input: does the backward return its gradient?
    # Tensors the program closes over, passed after the tensor inputs.
    constants: list = dataclasses.field(default_factory=list)
    # One int64 seed input per device with random ops, after the constants, drawn per call.
    rng_devices: list[str] = dataclasses.field(default_factory=list)

    @property
    def num_fw_outputs(self) -> int:
        return self.num_graph_outputs + len(self.mutated_inputs)


def draw_seeds(plan: RuntimePlan) -> list[torch.Tensor]:
    """Fresh seeds from torch's generator, so repeated calls differ and manual_seed replays."""
    return [torch.empty((), dtype=torch.int64).random_().to(d) for d in plan.rng_devices]


def finish(plan: RuntimePlan, inputs: list, graph_outs: list):
    """Copy mutations back, rebuild aliases, and assemble the user's output structure."""
    mutated = graph_outs[plan.num_graph_outputs : plan.num_fw_outputs]
    for index, value in zip(plan.mutated_inputs, mutated):
        target = inputs[index]
        with torch.no_grad():
            target.copy_(value)
    flat = []
    for spec in plan.outputs:
        if spec.kind == "graph":
            flat.append(graph_outs[spec.index])
        elif spec.kind == "const":
            flat.append(spec.value)
        else:
            a = spec.alias
            flat.append(a.rebuild(inputs[a.index] if a.of_input else graph_outs[a.index]))
    return pytree.tree_unflatten(flat, plan.out_spec)


class InferenceRuntime:
    """Calls a compiled graph with no autograd (grad disabled, or nothing needs a gradient)."""

    def __init__(self, plan: RuntimePlan, compiled: Callable):
        self.plan, self.compiled = plan, compiled

    def __call__(self, inputs: list):
        args = [*inputs, *self.plan.constants, *draw_seeds(self.plan)]
        with torch.no_grad():
            outs = list(self.compiled(*args))
        return finish(self.plan, inputs, outs)


class TrainingRuntime:
    """Runs the compiled forward inside an autograd.Function whose backward is the compiled one."""

    def __init__(self, plan: RuntimePlan, forward: Callable, backward: Callable):
        self.plan, self.forward, self.backward = plan, forward, backward

    def __call__(self, inputs: list):
        seeds = draw_seeds(self.plan)
        outs = _CompiledFunction.apply(self, seeds, *inputs)
        return finish(self.plan, inputs, list(outs))


class _CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, runtime: TrainingRuntime, seeds: list, *inputs):
        plan = runtime.plan
        outs = list(runtime.forward(*inputs, *plan.constants, *seeds))
        n = plan.num_fw_outputs
        fw_outs, saved = _distinct(outs[:n]), outs[n:]
        tensors = [s for s in saved if isinstance(s, torch.Tensor)]
        ctx.save_for_backward(*tensors)
        ctx.saved_layout = [isinstance(s, torch.Tensor) for s in saved]
        ctx.saved_others = [s for s in saved if not isinstance(s, torch.Tensor)]
        ctx.runtime = runtime
        diff = plan.differentiable + [False] * len(plan.mutated_inputs)
        ctx.mark_non_differentiable(*(o for o, d in zip(fw_outs, diff) if not d and _is_t(o)))
        return tuple(fw_outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        plan = ctx.runtime.plan
        tensors, others = iter(ctx.saved_tensors), iter(ctx.saved_others)
        saved = [next(tensors) if is_t else next(others) for is_t in ctx.saved_layout]
        # The backward graph was traced with contiguous tangents; eager hands us any layout
        # (an expanded gradient of sum(), for one).
        tangents = [
            g.contiguous()
            for g, d in zip(grads[: plan.num_graph_outputs], plan.differentiable)
            if d
        ]
        results = iter(ctx.runtime.backward(*saved, *tangents))
        grad_inputs = [next(results) if need else None for need in plan.grad_inputs]
        return (None, None, *grad_inputs)


def _distinct(outs: list) -> list:
    # autograd.Function marks each returned tensor once: a value returned twice (an output that is
    # also a mutated input's new value) gets its own copy so each can be marked on its own.
    seen: set[int] = set()
    result = []
    for o in outs:
        if _is_t(o) and id(o) in seen:
            o = o.clone()
        seen.add(id(o))
        result.append(o)
    return result


def _is_t(x) -> bool:
    return isinstance(x, torch.Tensor)
