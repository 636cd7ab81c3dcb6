"""Public entry points: aot_function, aot_module, aot_module_simplified and the aot_eager backend."""

from __future__ import annotations

import functools
import time
from typing import Callable, Optional

import torch
import torch.fx as fx
import torch.nn as nn
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, TensorMeta

from .joint import trace
from .partition import min_cut_partition
from .runtime import InferenceRuntime, TrainingRuntime
from .signature import input_signature, storage_groups

# A compiler turns a graph and example inputs into a callable taking the same inputs.
Compiler = Callable[[fx.GraphModule, list], Callable]


def run_as_fx(gm: fx.GraphModule, example_inputs: list) -> Callable:
    """The identity compiler: the graph module itself runs the prims' reference implementations."""
    return gm


def example_inputs_from_meta(gm: fx.GraphModule) -> list:
    """Tensors of the placeholders' TensorMeta (values unspecified), for compilers to inspect."""
    out = []
    for n in gm.graph.find_nodes(op="placeholder"):
        meta = n.meta.get(NODE_META_KEY)
        if not isinstance(meta, TensorMeta):
            out.append(None)
            continue
        sizes = [int(s) for s in meta.sizes]  # static shapes only until SymNode lands
        strides = [int(s) for s in meta.strides]
        out.append(torch.empty_strided(sizes, strides, dtype=meta.dtype, device=meta.device))
    return out


class AOTFunction:
    """The callable `aot_function` returns: traces once per input signature, then runs compiled."""

    def __init__(self, fn, fw_compiler, bw_compiler, partition_fn, inference_compiler):
        self.fn = fn
        self.fw_compiler = fw_compiler
        self.bw_compiler = bw_compiler or fw_compiler
        self.inference_compiler = inference_compiler or fw_compiler
        self.partition_fn = partition_fn
        self.cache: dict = {}
        self.last_graphs: dict[str, fx.GraphModule] = {}  # for debugging and tests
        self.compile_seconds = 0.0
        functools.update_wrapper(self, fn, updated=())

    @property
    def trace_count(self) -> int:
        return len(self.cache)

    def __call__(self, *args, **kwargs):
        flat, in_spec = pytree.tree_flatten((args, kwargs))
        key = (in_spec, input_signature(flat))
        runtime = self.cache.get(key)
        if runtime is None:
            start = time.perf_counter()
            runtime = self.cache[key] = self._compile(flat, in_spec)
            self.compile_seconds += time.perf_counter() - start
        return runtime([a for a in flat if isinstance(a, torch.Tensor)])

    def _compile(self, flat: list, in_spec):
        flat_fn = _flat_program(self.fn, flat, in_spec)
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        traced = trace(flat_fn, tensors)
        _check_aliased_mutations(tensors, traced.plan.mutated_inputs)
        example = list(traced.example_inputs)
        example += [torch.zeros((), dtype=torch.int64, device=d) for d in traced.plan.rng_devices]
        if not traced.is_joint:
            self.last_graphs = {"inference": traced.gm}
            return InferenceRuntime(traced.plan, self.inference_compiler(traced.gm, example))
        fw_gm, bw_gm = self.partition_fn(traced.gm, num_fwd_outputs=traced.plan.num_fw_outputs)
        self.last_graphs = {"joint": traced.gm, "forward": fw_gm, "backward": bw_gm}
        forward = self.fw_compiler(fw_gm, example)
        backward = self.bw_compiler(bw_gm, example_inputs_from_meta(bw_gm))
        return TrainingRuntime(traced.plan, forward, backward)


def _check_aliased_mutations(tensors: list, mutated: list[int]) -> None:
    groups = storage_groups(tensors)
    for i in mutated:
        if sum(g == groups[i] for g in groups) > 1:
            raise NotImplementedError(
                f"aot_autograd: input {i} is mutated and shares its storage with another input; "
                "pass separate tensors (the trace treats inputs as distinct)"
            )


def _flat_program(fn: Callable, flat: list, in_spec):
    """fn as a function of the flat tensor arguments alone (the rest are baked constants)."""
    positions = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]

    def flat_fn(*tensors):
        args = list(flat)
        for pos, t in zip(positions, tensors):
            args[pos] = t
        a, kw = pytree.tree_unflatten(args, in_spec)
        flat_out, flat_fn.out_spec = pytree.tree_flatten(fn(*a, **kw))
        return flat_out

    flat_fn.out_spec = None
    return flat_fn


def aot_function(
    fn: Callable,
    fw_compiler: Compiler,
    bw_compiler: Optional[Compiler] = None,
    partition_fn=min_cut_partition,
    inference_compiler: Optional[Compiler] = None,
) -> AOTFunction:
    """Trace `fn` ahead of time (forward and backward as prim graphs) and run it compiled."""
    return AOTFunction(fn, fw_compiler, bw_compiler, partition_fn, inference_compiler)


def _state(module: nn.Module) -> tuple[dict, dict]:
    return dict(module.named_parameters()), dict(module.named_buffers())


class AOTModule(nn.Module):
    """`module` with its forward traced and compiled; parameters and buffers stay the module's."""

    def __init__(self, module: nn.Module, compiled: AOTFunction):
        super().__init__()
        self.orig_module = module
        self._compiled = compiled

    def forward(self, *args, **kwargs):
        params, buffers = _state(self.orig_module)
        return self._compiled(params, buffers, *args, **kwargs)


def _functional(module: nn.Module) -> Callable:
    def call(params, buffers, *args, **kwargs):
        return torch.func.functional_call(module, {**params, **buffers}, args, kwargs)

    return call


def aot_module(
    module: nn.Module,
    fw_compiler: Compiler,
    bw_compiler=None,
    partition_fn=min_cut_partition,
    inference_compiler=None,
) -> AOTModule:
    """An nn.Module running `module` through aot_function, parameters and buffers lifted."""
    compiled = aot_function(
        _functional(module), fw_compiler, bw_compiler, partition_fn, inference_compiler
    )
    return AOTModule(module, compiled)


def aot_module_simplified(
    gm: nn.Module,
    example_inputs: list,
    fw_compiler: Compiler,
    bw_compiler=None,
    partition_fn=min_cut_partition,
    inference_compiler=None,
) -> Callable:
    """A compiler-backend body (the dynamo contract): `(*flat_inputs) -> what gm returns`."""
    compiled = aot_function(
        _functional(gm), fw_compiler, bw_compiler, partition_fn, inference_compiler
    )

    def run(*args):
        params, buffers = _state(gm)
        return compiled(params, buffers, *args)

    run.aot_function = compiled  # the trace cache and graphs, for inspection
    return run


def aot_eager(gm: nn.Module, example_inputs: list, **kwargs) -> Callable:
    """Backend: aot_module_simplified with every graph run as fx (prim reference kernels)."""
    kwargs.setdefault("fw_compiler", run_as_fx)
    return aot_module_simplified(gm, example_inputs, **kwargs)


BACKENDS = {"aot_eager": aot_eager}
