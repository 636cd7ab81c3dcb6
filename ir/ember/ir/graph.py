"""The graph format: an fx.GraphModule of vocabulary ops, serialised losslessly.

In process a graph is an `fx.GraphModule` whose call targets are vocabulary ops (or `getitem`) and
whose values carry `TensorMeta` under `NODE_META_KEY`. Across processes it is a `GraphIR`; the
subgraphs of control-flow ops (`get_attr` nodes naming `fx.GraphModule` attributes) travel as
named `SubgraphIR`s of the graph that references them, nested as deep as the control flow is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch.fx as fx

from .codec import OMIT_DEFAULT, schema_class, value_from_json, value_to_json
from .meta import NODE_META_KEY, TensorMeta
from .ops import OPSET_VERSION, resolve, target_name
from .symbols import SymbolSpec
from .version import IR_VERSION, READABLE_VERSIONS


@schema_class
@dataclasses.dataclass(frozen=True)
class NodeIR:
    """One node: fx opcode, name, qualified target, arguments and the metas of its outputs."""

    name: str
    op: str
    target: str
    args: Any
    kwargs: Any
    metas: tuple[Optional[TensorMeta], ...]


@schema_class
@dataclasses.dataclass(frozen=True)
class SubgraphIR:
    """A graph that a `get_attr` node of the enclosing graph names (a control-flow op's body)."""

    name: str
    graph: GraphIR


@schema_class
@dataclasses.dataclass(frozen=True)
class GraphIR:
    """A whole graph: versions, the dynamic symbols it uses, its nodes in order, and the
    subgraphs its `get_attr` nodes name (added to v1 before its release, with a default: a
    document without them reads as a graph without subgraphs, and a graph without them is
    written as before, so readers older than the field read it)."""

    ir_version: int
    opset_version: int
    symbols: tuple[SymbolSpec, ...]
    nodes: tuple[NodeIR, ...]
    subgraphs: tuple[SubgraphIR, ...] = dataclasses.field(default=(), metadata=OMIT_DEFAULT)


def lazy_graph_module(root, graph: fx.Graph) -> fx.GraphModule:
    """An fx.GraphModule of `graph` that writes and compiles its Python code only when it is
    first called or its code is read. The compilers build, edit and hand on graphs that nobody
    runs as Python (a joint graph, its partitions, the graph inductor lowers); fx's eager
    recompile of each was ~0.5 s of a 12-layer GPT-2's training compile."""
    try:  # torch's own, private: a torch without it gets the eager kind (same graph, slower)
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:
        return fx.GraphModule(root, graph)
    return _LazyGraphModule(root, graph)


def _metas(node: fx.Node) -> tuple:
    meta = node.meta.get(NODE_META_KEY)
    if meta is None:
        return ()
    return tuple(meta) if isinstance(meta, (tuple, list)) else (meta,)


def _encode_arg(a):
    if isinstance(a, fx.Node):
        return {"node": a.name}
    if isinstance(a, (list, tuple)):
        items = [_encode_arg(x) for x in a]
        return items if isinstance(a, list) else {"tuple": items}
    if isinstance(a, dict):
        raise TypeError("dict arguments are not part of the IR graph format")
    return value_to_json(a)


def graph_to_ir(gm: fx.GraphModule, symbols: tuple[SymbolSpec, ...] = ()) -> GraphIR:
    """Serialise a graph of vocabulary ops. A `get_attr` node may name only a subgraph (an
    `fx.GraphModule` attribute, serialised with it); call_module is not allowed."""
    nodes, subgraphs = [], {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            sub = _attr(gm, n.target)
            if not isinstance(sub, fx.GraphModule):
                what = "nothing" if sub is None else f"a {type(sub).__name__}"
                raise TypeError(f"node {n.name}: get_attr {n.target} names {what}, not a "
                                "subgraph; only subgraphs can cross a component boundary")
            if n.target not in subgraphs:
                subgraphs[n.target] = SubgraphIR(n.target, graph_to_ir(sub, symbols))
        elif n.op not in ("placeholder", "call_function", "output"):
            raise TypeError(f"node {n.name}: opcode {n.op} cannot cross a component boundary")
        target = target_name(n.target) if n.op == "call_function" else str(n.target)
        nodes.append(
            NodeIR(
                name=n.name,
                op=n.op,
                target=target,
                args=_encode_arg(tuple(n.args)),
                kwargs={"tuple": [[k, _encode_arg(v)] for k, v in n.kwargs.items()]},
                metas=_metas(n),
            )
        )
    return GraphIR(IR_VERSION, OPSET_VERSION, tuple(symbols), tuple(nodes),
                   tuple(subgraphs.values()))


def _attr(gm: fx.GraphModule, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def graph_from_ir(g: GraphIR) -> fx.GraphModule:
    """Rebuild the fx.GraphModule that `graph_to_ir` serialised."""
    if g.ir_version not in READABLE_VERSIONS:
        raise ValueError(f"IR version {g.ir_version} is not readable (readable: {READABLE_VERSIONS})")
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    subgraphs = {}
    for s in g.subgraphs:
        if s.name in subgraphs:
            raise ValueError(f"subgraph {s.name} appears twice in the serialised graph")
        subgraphs[s.name] = graph_from_ir(s.graph)
    for n in g.nodes:
        args = value_from_json(n.args, env.__getitem__)
        kwargs = dict(value_from_json(n.kwargs, env.__getitem__))
        if n.op == "placeholder":
            node = graph.placeholder(n.target)
        elif n.op == "output":
            node = graph.output(args[0])
        elif n.op == "get_attr":
            if n.target not in subgraphs:
                raise ValueError(f"node {n.name}: get_attr {n.target} names no subgraph of the "
                                 "serialised graph")  # fmt: skip
            node = graph.get_attr(n.target)
        else:
            node = graph.call_function(resolve(n.target), tuple(args), kwargs)
        node.name = n.name
        if n.metas:
            node.meta[NODE_META_KEY] = n.metas[0] if len(n.metas) == 1 else n.metas
        env[n.name] = node
    return fx.GraphModule(subgraphs, graph)
