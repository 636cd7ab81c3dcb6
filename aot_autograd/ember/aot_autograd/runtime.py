"""The runtime side: run compiled forward/backward graphs as one `torch.autograd.Function`.

Around the compiled call it does what the functional graphs cannot: draws the RNG seed, copies new
values of mutated inputs back into the caller's tensors, and rebuilds outputs that alias inputs or
each other as real views (so the caller sees eager's aliasing).

Per-call cost is a product number, so each runtime decides at construction what its calls need
and builds one `call(inputs: tuple)` closure doing only that: no seed draw without random ops, no
copy-back or aliasing check without mutated inputs, no alias rebuilding or pytree unflatten when
the outputs are the graph's outputs in order, and no autograd.Function for an inference graph.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Optional

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from .signature import storage_ptr

_is_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)
_AUTOCAST_DEVICES = ("cpu", "cuda")


def _without_autocast(fn: Callable, *args):
    """`fn(*args)` with autocast off. A compiled graph holds its casts already: under the
    caller's autocast an extern (a matmul) would be cast again to the autocast dtype, also
    where the program had switched autocast off (a rotary embedding computed in float32)."""
    if _any_autocast is not None and not _any_autocast():
        return fn(*args)
    on = [d for d in _AUTOCAST_DEVICES if torch.is_autocast_enabled(d)]
    for d in on:
        torch.set_autocast_enabled(d, False)
    try:
        return fn(*args)
    finally:
        for d in on:
            torch.set_autocast_enabled(d, True)


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


class MutatedAliasingError(NotImplementedError):
    """A mutated input shares its storage with another input: a property of one call's
    arguments, not of the program (the trace treats inputs as distinct)."""


def check_mutated_aliasing(plan: RuntimePlan, inputs) -> None:
    """Raise if a mutated input shares its storage with another input (the trace assumed not)."""
    ptrs = [storage_ptr(t) for t in inputs]
    # counted once (a decode step's 32 caches among 180 inputs: a count per cache over every
    # input cost as much again)
    counts = collections.Counter(ptrs)
    for i in plan.mutated_inputs:
        if ptrs[i] and counts[ptrs[i]] > 1:
            raise MutatedAliasingError(
                f"aot_autograd: input {i} is mutated and shares its storage with another input; "
                "pass separate tensors (the trace treats inputs as distinct)"
            )


def finish(plan: RuntimePlan, inputs, graph_outs):
    """Copy mutations back, rebuild aliases, and assemble the user's output structure."""
    _copy_back(plan, inputs, graph_outs)
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


def _copy_back(plan: RuntimePlan, inputs, graph_outs) -> None:
    if not plan.mutated_inputs:
        return
    new_values = graph_outs[plan.num_graph_outputs : plan.num_fw_outputs]
    prev = _is_grad_enabled()
    _set_grad_enabled(False)
    try:
        for index, value in zip(plan.mutated_inputs, new_values):
            if not _same_memory(inputs[index], value):  # not already written in place
                inputs[index].copy_(value)
    finally:
        _set_grad_enabled(prev)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Is `b` `a`'s elements where they are (a compiler wrote the new value in place)? Checked
    on every call for every mutated input: a pointer, then the layout (a copy onto the same
    memory in another layout would be wrong, not just slow)."""
    if a is b:
        return True
    if a.data_ptr() != b.data_ptr() or a.shape != b.shape:
        return False
    sa, sb = a.stride(), b.stride()  # a size-1 dimension's stride is any
    return sa == sb or all(n == 1 or x == y for n, x, y in zip(a.shape, sa, sb))


def make_finisher(plan: RuntimePlan) -> Callable:
    """`(inputs, graph_outs) -> user outputs`, as cheap as this plan allows (see `finish`)."""
    n = len(plan.outputs)
    in_order = plan.num_graph_outputs == n and all(
        s.kind == "graph" and s.index == k for k, s in enumerate(plan.outputs)
    )
    if not in_order:
        return lambda inputs, outs: finish(plan, inputs, outs)
    build = _structure_builder(plan.out_spec, n)
    if plan.mutated_inputs:

        def finish_mutating(inputs, outs):
            _copy_back(plan, inputs, outs)
            return build(outs[:n])

        return finish_mutating
    return lambda inputs, outs: build(outs)


def _structure_builder(spec, n: int) -> Callable:
    """flat outputs (exactly n) -> the user's structure, without pytree for the common ones."""
    if spec.is_leaf():
        return lambda flat: flat[0]
    if spec == pytree.tree_structure(tuple(range(n))):
        return tuple
    if spec == pytree.tree_structure(list(range(n))):
        return list
    return lambda flat: pytree.tree_unflatten(list(flat), spec)


def plain_callable(compiled: Callable) -> Callable:
    """A GraphModule's generated forward (skips nn.Module.__call__), else `compiled` itself."""
    if isinstance(compiled, fx.GraphModule) and not (
        compiled._forward_hooks or compiled._forward_pre_hooks
    ):
        return compiled.forward
    return compiled


def _seed_source(plan: RuntimePlan) -> Optional[Callable[[], tuple]]:
    if not plan.rng_devices:
        return None
    return lambda: tuple(draw_seeds(plan))


def _aliasing_check(plan: RuntimePlan) -> Optional[Callable]:
    if not plan.mutated_inputs:
        return None
    return lambda inputs: check_mutated_aliasing(plan, inputs)


class InferenceRuntime:
    """Calls a compiled graph with no autograd (grad disabled, or nothing needs a gradient)."""

    def __init__(self, plan: RuntimePlan, compiled: Callable):
        self.plan, self.compiled = plan, compiled
        self.call = _inference_call(plan, plain_callable(compiled))

    def __call__(self, inputs):
        return self.call(tuple(inputs))


def _inference_call(plan: RuntimePlan, fn: Callable) -> Callable:
    constants = tuple(plan.constants)
    seeds, check, finish_ = _seed_source(plan), _aliasing_check(plan), make_finisher(plan)

    def call(inputs: tuple):
        if check is not None:
            check(inputs)
        args = inputs + constants if constants else inputs
        if seeds is not None:
            args = args + seeds()
        if _is_grad_enabled():  # a graph traced without gradients runs without them
            _set_grad_enabled(False)
            try:
                outs = _without_autocast(fn, *args)
            finally:
                _set_grad_enabled(True)
        else:
            outs = _without_autocast(fn, *args)
        return finish_(inputs, outs)

    return call


class TrainingRuntime:
    """Runs the compiled forward inside an autograd.Function whose backward is the compiled one."""

    def __init__(self, plan: RuntimePlan, forward: Callable, backward: Callable):
        self.plan, self.forward, self.backward = plan, forward, backward
        self.fw_call, self.bw_call = plain_callable(forward), plain_callable(backward)
        # A backward that takes its inputs boxed (a list it empties) can free each saved
        # activation after its last use instead of holding them all to the end.
        self.bw_boxed = getattr(backward, "call_boxed", None)
        self.constants = tuple(plan.constants)
        self.num_fw_outputs = plan.num_fw_outputs
        diff = plan.differentiable + [False] * len(plan.mutated_inputs)
        self.non_differentiable = tuple(i for i, d in enumerate(diff) if not d)
        self.tangent_index = tuple(i for i, d in enumerate(plan.differentiable) if d)
        self.every_grad = all(plan.grad_inputs)
        self.saved_layout: Optional[tuple] = None  # () once every saved value is a tensor
        self._seeds, self._check = _seed_source(plan), _aliasing_check(plan)
        self._finish = make_finisher(plan)

    def call(self, inputs: tuple):
        """inputs tuple -> outputs. A method, not a closure stored on the runtime: the closure
        held the runtime, a cycle that kept each compiled step (its programs and constants)
        after reset() until a full garbage collection."""
        if self._check is not None:
            self._check(inputs)
        s = self._seeds() if self._seeds is not None else ()
        # Under functorch transforms Function.apply's own path is required.
        apply = _py_apply if _functorch_active() else _c_apply
        return self._finish(inputs, apply(self, s, *inputs))

    def __call__(self, inputs):
        return self.call(tuple(inputs))


def _function_apply() -> Callable:
    """autograd.Function's C apply, bound to _CompiledFunction (skips Function.apply's Python)."""
    try:
        return torch._C._FunctionBase.__dict__["apply"].__get__(None, _CompiledFunction)
    except (AttributeError, KeyError, TypeError):  # another torch: the public path
        return _CompiledFunction.apply


class _CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rt: TrainingRuntime, seeds: tuple, *inputs):
        outs = _without_autocast(rt.fw_call, *inputs, *rt.constants, *seeds)
        n = rt.num_fw_outputs
        fw_outs, saved = outs[:n], outs[n:]
        if n > 1 and len(set(map(id, fw_outs))) < n:
            fw_outs = _distinct(fw_outs)
        if rt.saved_layout is None:  # the compiled forward's output types are fixed: look once
            layout = tuple(isinstance(s, torch.Tensor) for s in saved)
            rt.saved_layout = () if all(layout) else layout
        if rt.saved_layout:
            _save_mixed(ctx, rt.saved_layout, saved)
        else:
            ctx.save_for_backward(*saved)
        ctx.runtime = rt
        # An output whose gradient never comes (a model's logits next to its loss) gets None,
        # not a zeros buffer autograd would make and hold through the whole backward: the
        # zeros made in backward() live in the boxed arguments only until their last use.
        ctx.set_materialize_grads(False)
        ctx.tangent_metas = [(fw_outs[i].shape, fw_outs[i].dtype, fw_outs[i].device)
                             for i in rt.tangent_index]  # fmt: skip
        if rt.non_differentiable:
            ctx.mark_non_differentiable(*[fw_outs[i] for i in rt.non_differentiable])
        return tuple(fw_outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        rt = ctx.runtime
        saved = _load_mixed(ctx, rt.saved_layout) if rt.saved_layout else ctx.saved_tensors
        # The backward graph was traced with contiguous tangents; eager hands us any layout
        # (an expanded gradient of sum(), for one).
        tangents = [
            grads[i].contiguous() if grads[i] is not None
            else torch.zeros(shape, dtype=dtype, device=device)
            for i, (shape, dtype, device) in zip(rt.tangent_index, ctx.tangent_metas)
        ]
        if rt.bw_boxed is not None:
            args = [*saved, *tangents]
            del saved, tangents, grads
            ctx.maybe_clear_saved_tensors()  # a no-op under retain_graph=True
            results = _without_autocast(rt.bw_boxed, args)
        else:
            results = _without_autocast(rt.bw_call, *saved, *tangents)
        if rt.every_grad:
            return (None, None, *results)
        it = iter(results)
        return (None, None, *[next(it) if need else None for need in rt.plan.grad_inputs])


_c_apply, _py_apply = _function_apply(), _CompiledFunction.apply
_functorch_active = torch._C._are_functorch_transforms_active


def _save_mixed(ctx, layout: tuple, saved) -> None:
    ctx.save_for_backward(*[s for s, is_t in zip(saved, layout) if is_t])
    ctx.saved_others = [s for s, is_t in zip(saved, layout) if not is_t]


def _load_mixed(ctx, layout: tuple) -> list:
    tensors, others = iter(ctx.saved_tensors), iter(ctx.saved_others)
    return [next(tensors) if is_t else next(others) for is_t in layout]


def _distinct(outs) -> list:
    # autograd.Function marks each returned tensor once: a value returned twice (an output that is
    # also a mutated input's new value) gets its own copy so each can be marked on its own.
    seen: set[int] = set()
    result = []
    for o in outs:
        if isinstance(o, torch.Tensor) and id(o) in seen:
            o = o.clone()
        seen.add(id(o))
        result.append(o)
    return result
