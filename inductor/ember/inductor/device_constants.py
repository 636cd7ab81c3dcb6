"""A graph pass: one-element CPU tensors computed from constants alone, then moved to the GPU,
become constants made on the GPU.

Models build scalars on the CPU from sizes and numbers (`torch.sqrt(torch.tensor(head_dim) *
factor)` for an attention scale, `torch.log(torch.tensor(max_pos / mid))` in relative-position
buckets) and divide GPU tensors by them: eager copies the scalar to the device on every call. In
a compiled program that copy is an extern step that runs on the host, and a program with host
steps cannot be replayed from a CUDA graph, so one such scale sent a whole transformer back to
launching each kernel from Python. With static sizes the scalar's value is known at compile time:
this pass computes it once, on the CPU with the prims' own reference implementations, and puts a
`prims.full` of that value on the target device in its place, which the lowering inlines into the
kernels that read it. What depends on an input (a symbolic size, a tensor argument, a random
draw) is left as it is.
"""

from __future__ import annotations

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, target_name
from ember.primtorch import prims
from ember.primtorch.prims.core import is_prim

_RANDOM = ("philox", "rand", "bernoulli", "normal")


def fold_device_constants(gm: fx.GraphModule) -> fx.GraphModule:
    """`gm` with each `device_put` of a constant one-element CPU tensor replaced by a `full` on
    the target device (see the module doc); `gm` itself when there is none."""
    found = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or target_name(node.target) != "prims.device_put":
            continue
        source, device = node.args[0], torch.device(node.args[1])
        if device.type == "cpu" or not isinstance(source, fx.Node):
            continue
        value = _constant_value(source)
        if value is not None:
            found[node.name] = value
    if not found:
        return gm
    # A copy: the caller's graph (aot_autograd's forward, say) stays as it was.
    graph, env = fx.Graph(), {}
    graph.output(graph.graph_copy(gm.graph, env))
    copied = fx.GraphModule(gm, graph)
    copied.meta.update(gm.meta)
    gm = copied
    for node in list(graph.nodes):
        value = found.get(node.name)
        if value is None or node.op != "call_function":
            continue
        device = torch.device(node.args[1])
        meta = node.meta.get(NODE_META_KEY)
        with gm.graph.inserting_before(node):
            full = gm.graph.call_function(
                prims.full, (tuple(value.shape), value.item(), value.dtype, device)
            )
        full.meta.update(node.meta)
        if meta is not None:
            full.meta[NODE_META_KEY] = meta
        node.replace_all_uses_with(full)
        gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _constant_value(node: fx.Node):
    """The value of `node` as a one-element CPU tensor when it depends on no input and draws no
    random numbers; else None."""
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
    if meta is None or str(meta.device) != "cpu" or not visit(node):
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
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.device.type != "cpu":
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
