"""Control-flow ops of the vocabulary: cond, while_loop and map, whose bodies are subgraphs.

A graph calls them with `get_attr` nodes naming `fx.GraphModule`s held by the graph's module; each
subgraph takes tensors and returns a tuple of tensors. They are defined here, not by primtorch,
because dynamo (which may import only ir) writes them into the graphs it captures, and every
later stage reads them. The functions are the reference semantics: the predicate is read on the
host (one device-to-host read per decision) and the chosen subgraph runs. A component that traces
graphs under a dispatch mode must handle these nodes itself (ember.aot_autograd splits the graph
at them); running them under a tracer would record one branch as if it were the whole program,
so that raises instead.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .ops import ArgSpec, OpSchema, define

CONTROL_FLOW_TAG = "control_flow"


def _check_not_traced(name: str) -> None:
    if _get_current_dispatch_mode() is not None:
        raise NotImplementedError(
            f"control.{name} was run under a dispatch tracer, which would record only the branch "
            "taken for the example inputs; split the graph at control-flow nodes instead "
            "(ember.aot_autograd does)"
        )


def _decide(pred, name: str) -> bool:
    if isinstance(pred, torch.Tensor):
        if pred.numel() != 1:
            raise RuntimeError(f"control.{name}: the predicate has {pred.numel()} elements, not 1")
        return bool(pred)  # the one device-to-host read of this decision
    return bool(pred)


def cond(pred, true_graph, false_graph, operands):
    """`true_graph(*operands)` if pred else `false_graph(*operands)`, as a tuple of tensors."""
    _check_not_traced("cond")
    branch = true_graph if _decide(pred, "cond") else false_graph
    return tuple(branch(*operands))


def while_loop(cond_graph, body_graph, carried, additional):
    """Run `carried = body_graph(*carried, *additional)` while `cond_graph(*carried,
    *additional)` holds; the final carried values, as a tuple. `additional` are tensors the
    bodies read but do not carry (closures lifted to inputs)."""
    _check_not_traced("while_loop")
    carried = tuple(carried)
    while _decide(cond_graph(*carried, *additional)[0], "while_loop"):
        carried = tuple(body_graph(*carried, *additional))
    return carried


def map(body_graph, xs, args):  # noqa: A001  (the op's name)
    """Stack `body_graph(*[x[i] for x in xs], *args)` over i in range(len(xs[0])): a tuple of
    tensors, each with a new leading dimension."""
    _check_not_traced("map")
    n = xs[0].shape[0]
    results = [tuple(body_graph(*[x[i] for x in xs], *args)) for i in range(n)]
    if not results:
        raise RuntimeError("control.map over a leading dimension of size 0")
    return tuple(torch.stack(column) for column in zip(*results))


def _arg(name, type_):
    return ArgSpec(name, type_)


define(OpSchema("control.cond", 1, (_arg("pred", "Tensor"), _arg("true_graph", "Graph"),
                                    _arg("false_graph", "Graph"), _arg("operands", "Tensor[]")),
                ("Tensor[]",), (CONTROL_FLOW_TAG,)), cond)  # fmt: skip
define(OpSchema("control.while_loop", 1, (_arg("cond_graph", "Graph"), _arg("body_graph", "Graph"),
                                          _arg("carried", "Tensor[]"),
                                          _arg("additional", "Tensor[]")),
                ("Tensor[]",), (CONTROL_FLOW_TAG,)), while_loop)  # fmt: skip
define(OpSchema("control.map", 1, (_arg("body_graph", "Graph"), _arg("xs", "Tensor[]"),
                                   _arg("args", "Tensor[]")),
                ("Tensor[]",), (CONTROL_FLOW_TAG,)), map)  # fmt: skip

CONTROL_FLOW_OPS = (cond, while_loop, map)


def is_control_flow(node) -> bool:
    """Whether an fx node calls one of the control-flow ops."""
    return node.op == "call_function" and any(node.target is op for op in CONTROL_FLOW_OPS)


def subgraph_args(node) -> list:
    """The `get_attr` nodes naming a control-flow node's subgraphs, in argument order."""
    return [a for a in node.args if getattr(a, "op", None) == "get_attr"]
