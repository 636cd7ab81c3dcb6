"""Rewrite extern-op nodes of a prim graph into their decompositions (EXTERN_DECOMPOSITIONS).

A graph traced once (an exported program) keeps `extern.convolution` nodes; a consumer whose
runtime lacks that kernel on its device (the C++ runtime on CUDA) replaces each such node by the
prims its decomposition records. Each node is traced alone on zero tensors of its arguments'
TensorMetas (the decomposition depends on shapes, strides and dtypes only), and the recorded
subgraph is inlined in its place.
"""

from __future__ import annotations

from typing import Container, Iterable, Optional

import sympy
import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ember.ir import NODE_META_KEY, TensorMeta

from .errors import NotDecomposableError
from .prims.core import PRIMS
from .prims.extern import ATEN_TO_EXTERN
from .trace import Tracer


def _aten_of(name: str):
    """The ATen overload an extern op name ("extern.convolution") stands for."""
    target = PRIMS.get(name)
    for op, (p, _) in ATEN_TO_EXTERN.items():
        if p is target:
            return op
    raise KeyError(f"{name} is not an extern op that mirrors an ATen op")


def _zeros_like_meta(meta: TensorMeta) -> torch.Tensor:
    sizes, strides = (tuple(int(s) for s in v) for v in (meta.sizes, meta.strides))
    return torch.zeros(sizes, dtype=meta.dtype, device=meta.device).as_strided(sizes, strides)


def decompose_externs(gm: fx.GraphModule, names: Iterable[str],
                      only: Optional[Container[str]] = None) -> fx.GraphModule:
    """A copy of `gm` with every call of the extern ops `names` (of the nodes named in `only`,
    when given) replaced by its decomposition.

    A node the decomposition refuses (a transposed convolution) or whose sizes are symbolic stays
    an extern call; the caller's runtime reports it."""
    ops = {PRIMS[n]: _aten_of(n) for n in names}
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copied = fx.GraphModule(gm, graph)
    copied.meta.update(gm.meta)  # what the graph's users told the compiler (its input updates)
    gm = copied
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in ops:
            continue
        if only is not None and node.name not in only:
            continue
        try:
            sub = _trace_node(node, ops[node.target])
        except NotDecomposableError:
            continue
        if sub is None:
            continue
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        env = dict(zip(placeholders, _tensor_args(node)))
        with gm.graph.inserting_before(node):
            result = gm.graph.graph_copy(sub.graph, env)
        node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    """The distinct nodes among a call's arguments, in order (the subgraph's placeholders)."""
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    return list(dict.fromkeys(a for a in leaves if isinstance(a, fx.Node)))


def _trace_node(node: fx.Node, aten_op):
    """The decomposition of one extern call as a graph over its tensor arguments; None when a
    size or stride is symbolic (the rewrite is for static shapes)."""
    metas = [a.meta[NODE_META_KEY] for a in _tensor_args(node)]
    if not all(sympy.sympify(s).is_Integer for m in metas for s in (*m.sizes, *m.strides)):
        return None
    values = {a: _zeros_like_meta(m) for a, m in zip(_tensor_args(node), metas)}
    args, kwargs = pytree.tree_map(
        lambda a: values[a] if isinstance(a, fx.Node) else a, (node.args, node.kwargs)
    )
    tracer = Tracer(no_extern=(aten_op,), unknown_tensors="error")
    for i, t in enumerate(values.values()):
        tracer.placeholder(t, f"arg{i}")
    with tracer:
        out = aten_op(*args, **kwargs)
    return tracer.output(out)
