"""A graph pass: CPU values computed from constants alone, of one number (a scalar, or one
broadcast), that a GPU program reads become constants made on the GPU.

Models build scalars on the CPU from sizes and numbers (`torch.sqrt(torch.tensor(head_dim) *
factor)` for an attention scale, `torch.log(torch.tensor(max_pos / mid))` in relative-position
buckets) and divide GPU tensors by them: eager copies the scalar to the device on every call
(`.to`, or implicitly: a CUDA op may read a CPU scalar). In a compiled program that copy is an
extern step that runs on the host, and a program with host steps cannot be replayed from a CUDA
graph, so one such scale sent a whole transformer back to launching each kernel from Python.
With static sizes the scalar's value is known at compile time: this pass computes it once, on
the CPU with the prims' own reference implementations, and puts a `prims.full` of that value on
the target device in its place, which the lowering inlines into the kernels that read it. What depends on an input (a symbolic size, a tensor argument, a random
draw) is left as it is.
"""

from __future__ import annotations

import math

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, TensorMeta, target_name
from ember.primtorch import prims
from ember.primtorch.prims.core import is_prim

_RANDOM = ("philox", "rand", "bernoulli", "normal")
# A CPU value read on the GPU is computed at compile time only up to this many elements
MAX_ELEMENTS = 1 << 16


def fold_device_constants(gm: fx.GraphModule) -> fx.GraphModule:
    """`gm` with each CPU value computed from constants alone and read on a GPU (moved by a
    `device_put`, or read directly by an op on the GPU, which the lowering would copy over)
    replaced by a `full` on that GPU, when all its elements are one number (see the module
    doc); `gm` itself when there is none."""
    found = {}  # (the node reading it on the GPU, or None for a device_put, source) -> value
    values = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if target_name(node.target) == "prims.device_put":
            source, device = node.args[0], torch.device(node.args[1])
            if device.type != "cpu" and isinstance(source, fx.Node):
                value = _cached_value(source, values)
                if value is not None:
                    found[(None, node.name)] = value
            continue
        if not is_prim(node.target) or target_name(node.target).startswith("extern."):
            continue  # an extern takes its arguments where they are (a host seed, say)
        if _device_of(node) in (None, "cpu"):
            continue
        for source in node.all_input_nodes:
            value = _cached_value(source, values)
            if value is not None:
                found[(node.name, source.name)] = value
    if not found:
        return gm
    # A copy: the caller's graph (aot_autograd's forward, say) stays as it was.
    graph, env = fx.Graph(), {}
    graph.output(graph.graph_copy(gm.graph, env))
    copied = fx.GraphModule(gm, graph)
    copied.meta.update(gm.meta)
    gm = copied
    by_name = {n.name: n for n in graph.nodes}
    for (reader, source), value in found.items():
        node = by_name[source if reader is None else reader]
        device = torch.device(node.args[1]) if reader is None else torch.device(_device_of(node))
        with graph.inserting_before(node):
            full = graph.call_function(
                prims.full, (tuple(value.shape), value.flatten()[0].item(), value.dtype, device)
            )
        full.meta[NODE_META_KEY] = prims.full.meta(*full.args)
        if reader is None:
            node.replace_all_uses_with(full)
            graph.erase_node(node)
        else:
            node.replace_input_with(by_name[source], full)
    graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _device_of(node: fx.Node):
    meta = node.meta.get(NODE_META_KEY)
    metas = [m for m in pytree.tree_leaves(meta) if isinstance(m, TensorMeta)]
    return str(metas[0].device) if metas else None


def _cached_value(node: fx.Node, values: dict):
    if node not in values:
        values[node] = _constant_value(node)
    return values[node]


def _constant_value(node: fx.Node):
    """The value of `node` as a CPU tensor when it depends on no input, draws no random numbers
    and all its elements are one number (a scalar, or a scalar broadcast); else None."""
    order, seen = [], set()

    def visit(n):  # the node's ancestors, inputs first
        if n in seen:
            return True
        seen.add(n)
        if n.op != "call_function" or not is_prim(n.target):
            return False  # an input, a constant attribute, an extern: not ours to compute
        if any(word in target_name(n.target) for word in _RANDOM):
            return False
        if not all(visit(a) for a in n.all_input_nodes):
            return False
        order.append(n)
        return True

    meta = node.meta.get(NODE_META_KEY)
    if not isinstance(meta, TensorMeta) or str(meta.device) != "cpu":
        return None
    if not all(s.is_Integer for s in meta.sizes) or math.prod(map(int, meta.sizes)) > MAX_ELEMENTS:
        return None  # a symbolic size, or too large to compute while compiling
    if not visit(node):
        return None
    values = {}
    try:
        for n in order:
            args, kwargs = pytree.tree_map(
                lambda a: values[a] if isinstance(a, fx.Node) else _plain(a), (n.args, n.kwargs)
            )
            values[n] = n.target(*args, **kwargs)
    except Exception:  # noqa: BLE001  (a symbolic size, or a prim that cannot run here)
        return None
    value = values[node]
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu" or value.numel() == 0:
        return None
    if value.numel() > 1 and not bool((value == value.flatten()[0]).all()):
        return None
    return value


def _plain(a):
    """An argument as the reference implementations take it; raises for a symbolic size."""
    if isinstance(a, sympy.Basic):
        if not a.is_Number:
            raise ValueError(f"symbolic argument {a}")
        return int(a) if a.is_Integer else float(a)
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise ValueError("symbolic argument")
    return a
