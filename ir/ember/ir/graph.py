"""The graph format: an fx.GraphModule of vocabulary ops, serialised losslessly.

In process a graph is an `fx.GraphModule` whose call targets are vocabulary ops (or `getitem`) and
whose values carry `TensorMeta` under `NODE_META_KEY`. Across processes it is a `GraphIR`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch.fx as fx

from .codec import schema_class, value_from_json, value_to_json
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
class GraphIR:
    """A whole graph: versions, the dynamic symbols it uses, and its nodes in order."""

    ir_version: int
    opset_version: int
    symbols: tuple[SymbolSpec, ...]
    nodes: tuple[NodeIR, ...]


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
    """Serialise a graph of vocabulary ops (get_attr and call_module are not allowed)."""
    nodes = []
    for n in gm.graph.nodes:
        if n.op not in ("placeholder", "call_function", "output"):
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
    return GraphIR(IR_VERSION, OPSET_VERSION, tuple(symbols), tuple(nodes))


def graph_from_ir(g: GraphIR) -> fx.GraphModule:
    """Rebuild the fx.GraphModule that `graph_to_ir` serialised."""
    if g.ir_version not in READABLE_VERSIONS:
        raise ValueError(f"IR version {g.ir_version} is not readable (readable: {READABLE_VERSIONS})")
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for n in g.nodes:
        args = value_from_json(n.args, env.__getitem__)
        kwargs = dict(value_from_json(n.kwargs, env.__getitem__))
        if n.op == "placeholder":
            node = graph.placeholder(n.target)
        elif n.op == "output":
            node = graph.output(args[0])
        else:
            node = graph.call_function(resolve(n.target), tuple(args), kwargs)
        node.name = n.name
        if n.metas:
            node.meta[NODE_META_KEY] = n.metas[0] if len(n.metas) == 1 else n.metas
        env[n.name] = node
    return fx.GraphModule({}, graph)
