"""Tracing on metadata: the program runs on meta-device copies of its inputs, so a trace holds
no activations, then the graph's devices are set back to the inputs' device.

A trace on real tensors computes the whole forward and backward once more (decomposed, so with
more temporaries than eager): on a training step its peak was the eager step's plus a third, on
top of what the capture and the first call hold. On meta tensors every op computes only sizes,
strides and dtypes, which is all the graph records.

Only where the meta device cannot change what is recorded; otherwise (or when the meta run fails
in any way) the trace runs on real copies as before:
- every tensor input on the CPU (on CUDA, torch's composite ops choose kernels by device: cuDNN
  batch norm, fused dropout), autocast off (its casts are keyed by device); with symbolic sizes
  the SymbolicTensors wrap meta values at the hints;
- no random ops (their seeds are per device), no `scaled_dot_product_attention` (its kernel is
  chosen by device), no float16/bfloat16 value (primtorch's norms keep CPU statistics in the
  input dtype, other devices' in float32), no value check (`EMBER_PRIMTORCH_CHECK=1`).
`config.metadata_trace` (env `EMBER_AOT_METADATA_TRACE=0`) turns it off.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, TensorMeta
from ember.ir.example import MetadataOnly
from ember.primtorch import LentInputWritten

from .joint import Traced, trace

log = logging.getLogger("ember.aot_autograd")


@dataclasses.dataclass
class MetaTraceConfig:
    """Whether traces that allow it run on meta-device copies of the inputs."""

    metadata_trace: bool = os.environ.get("EMBER_AOT_METADATA_TRACE", "1") != "0"


config = MetaTraceConfig()

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_META = torch.device("meta")


class _NeedsRealValues(Exception):
    """The meta device could change what this trace records."""


# Calls whose decomposition torch picks by device (attention's kernel), by name: a function,
# or an aten overload of it
_BY_DEVICE = ("scaled_dot_product",)


def _chosen_by_device(fn) -> bool:
    name = getattr(fn, "__name__", None) or str(fn)
    return any(part in name for part in _BY_DEVICE)


class _DeviceChoices(TorchFunctionMode):
    """Stops a meta trace at functions whose decomposition torch picks by device, and at any
    call made under CPU autocast (the program switched it on: it would not cast meta tensors)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _chosen_by_device(func):
            raise _NeedsRealValues(f"{getattr(func, '__name__', func)} chooses a kernel by device")
        if torch.is_autocast_enabled("cpu"):
            raise _NeedsRealValues("the program runs under CPU autocast")
        return func(*args, **(kwargs or {}))


def trace_program(flat_fn: Callable, inputs: list, symbolic=None, program=None,
                  overwritten=()) -> Traced:
    """`joint.trace`, on meta-device copies of the inputs where that records the same graph.
    `program`: the graph module flat_fn runs, when there is one: its calls are looked at first,
    since a graph's own calls can reach the tracer without passing a function mode (an
    attention call was traced up to, its mask proved, then the attempt failed and was redone)."""
    device = _single_cpu_device(inputs)
    graph = getattr(program, "graph", None)
    if graph is not None and any(n.op == "call_function" and _chosen_by_device(n.target)
                                 for n in graph.nodes):  # fmt: skip
        device = None
    if device is not None and _allowed():
        try:
            with _DeviceChoices():
                traced = trace(flat_fn, inputs, symbolic, clone=_meta_copy, overwritten=overwritten)
            _check_recordable(traced)
            return _on_device(traced, device)
        except Exception as e:  # noqa: BLE001  (any failure: the real trace decides)
            log.debug("aot_autograd: tracing on real values: %s: %s", type(e).__name__, e)
    try:  # the parameters read where they are, not copied (joint.lendable)
        return trace(flat_fn, inputs, symbolic, overwritten=overwritten, lend=True)
    except LentInputWritten as e:
        log.debug("aot_autograd: tracing on copies of the parameters: %s", e)
    return trace(flat_fn, inputs, symbolic, overwritten=overwritten)


def _allowed() -> bool:
    from ember.primtorch.config import config as primtorch_config

    return config.metadata_trace and not primtorch_config.check


def _single_cpu_device(inputs: list):
    """The CPU device when every tensor input is on it and autocast is off there, else None."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    if not tensors or any(t.device.type != "cpu" for t in tensors):
        return None
    if any(type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter for t in tensors):
        return None  # a subclass may compute its metadata from its data
    if torch.is_autocast_enabled("cpu") or any(t.dtype in _LOW_PRECISION for t in tensors):
        return None
    return tensors[0].device


def _meta_copy(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor of t's sizes, strides, dtype and requires_grad."""
    c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
    return c.requires_grad_(t.requires_grad)


def _check_recordable(traced: Traced) -> None:
    if traced.plan.rng_devices:
        raise _NeedsRealValues("random ops draw from a seed per device")
    for node in traced.gm.graph.nodes:
        for meta in _metas(node):
            if meta.dtype in _LOW_PRECISION:
                raise _NeedsRealValues(f"{node.name} is {meta.dtype}")
    if any(isinstance(t, torch.Tensor) and t.is_meta for t in traced.gm.state_dict().values()):
        raise _NeedsRealValues("a constant was made on the meta device")


def _metas(node) -> list:
    value = node.meta.get(NODE_META_KEY)
    values = value if isinstance(value, (tuple, list)) else [value]
    return [m for m in values if isinstance(m, TensorMeta)]


def _on_device(traced: Traced, device: torch.device) -> Traced:
    """The traced graph with every "meta" device (in TensorMeta and in call arguments) set to
    `device`, and example inputs on it."""
    name = str(device)

    def fix_meta(m):
        if isinstance(m, TensorMeta) and m.device == "meta":
            return dataclasses.replace(m, device=name)
        return m

    def is_meta(a):
        return (isinstance(a, torch.device) and a.type == "meta") or (
            isinstance(a, str) and a == "meta")  # fmt: skip

    def fix_arg(a):
        if is_meta(a):
            return device if isinstance(a, torch.device) else name
        return a

    for node in traced.gm.graph.nodes:
        value = node.meta.get(NODE_META_KEY)
        if isinstance(value, (tuple, list)):
            node.meta[NODE_META_KEY] = type(value)(fix_meta(m) for m in value)
        elif value is not None:
            node.meta[NODE_META_KEY] = fix_meta(value)
        # Only nodes that name the device are rewritten: setting args re-links every input's
        # users, which for a whole training graph cost more than the rest of this pass.
        if any(is_meta(a) for a in pytree.tree_leaves((node.args, node.kwargs))):
            node.args = pytree.tree_map(fix_arg, node.args)
            node.kwargs = pytree.tree_map(fix_arg, node.kwargs)
    traced.gm.recompile()
    traced.example_inputs = [_example_on(t, device) for t in traced.example_inputs]
    return traced


def _example_on(t, device: torch.device):
    if not isinstance(t, torch.Tensor) or t.device.type != "meta":
        return t
    return MetadataOnly(t.shape, t.stride(), t.storage_offset(), t.dtype, device, t.requires_grad)
