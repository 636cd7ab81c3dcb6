"""Graphs with control-flow nodes (control.cond, control.while_loop, control.map) compiled in pieces.

Tracing under a dispatch mode runs one branch on the example values and would record it as the
whole program, so a graph with control flow is split at its control-flow nodes: the straight-line
pieces between them, and every subgraph (each branch, a loop's condition and body, a map's body),
are compiled separately through the same compilers (`compile_graph`, which is aot_module_simplified
with the caller's fw/bw compilers: each piece gets its own forward and backward, and nested control
flow splits again). A small Python runner calls them in order; at a control-flow node it reads the
predicate on the host (one device-to-host read per decision) and calls the compiled subgraph it
chose. Gradients flow between pieces through eager autograd, each piece and each taken branch
being its own `autograd.Function`, so the backward of a cond is the backward of the branch taken.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.fx as fx

from ember.ir import NODE_META_KEY, TensorMeta
from ember.ir import control_flow as cf_ops
from ember.ir.control_flow import is_control_flow

# (graph module, example inputs) -> a callable of the flat tensors returning a sequence of tensors
GraphCompiler = Callable[[fx.GraphModule, list], Callable]


def has_control_flow(gm) -> bool:
    """Whether `gm`'s graph calls a control-flow op (its subgraphs are not looked into)."""
    graph = getattr(gm, "graph", None)
    return graph is not None and any(is_control_flow(n) for n in graph.nodes)


def _example(node: fx.Node):
    meta = node.meta.get(NODE_META_KEY)
    if isinstance(meta, TensorMeta) and all(isinstance(s, int) or s.is_Integer for s in meta.sizes):
        sizes, strides = [int(s) for s in meta.sizes], [int(s) for s in meta.strides]
        return torch.empty_strided(sizes, strides, dtype=meta.dtype, device=meta.device)
    return node.meta.get("example_value")


def _is_result_item(node: fx.Node) -> bool:
    """`getitem(control_flow_node, i)`: read from the op's result by the runner itself."""
    return (node.op == "call_function" and node.target is operator.getitem
            and isinstance(node.args[0], fx.Node) and is_control_flow(node.args[0]))  # fmt: skip


def _piece(gm: fx.GraphModule, nodes: list, later_users: set, compile_graph: GraphCompiler):
    """A straight-line run of nodes as its own graph: (input nodes, output nodes, compiled)."""
    inside = set(nodes)
    inputs: dict = {}
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in inside:
                inputs.setdefault(a)
    outputs = [n for n in nodes if any(u not in inside for u in n.users) or n in later_users]
    graph = fx.Graph()
    env = {}
    for a in inputs:
        env[a] = graph.placeholder(a.name)
        env[a].meta.update({k: v for k, v in a.meta.items() if k in (NODE_META_KEY,)})
    for n in nodes:
        env[n] = graph.node_copy(n, lambda x: env[x])
    graph.output(tuple(env[n] for n in outputs))
    piece = fx.GraphModule(gm, graph)
    compiled = compile_graph(piece, [_example(a) for a in inputs])
    return list(inputs), outputs, compiled


def _decide(pred) -> bool:
    return bool(pred)  # a one-element tensor: the one device-to-host read of this decision


def compile_with_control_flow(gm: fx.GraphModule, compile_graph: GraphCompiler) -> Callable:
    """`run(*flat_inputs)` for a graph with control-flow nodes: its pieces and subgraphs each
    compiled through `compile_graph`, run in order by Python."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    subgraph_nodes = {a for n in gm.graph.nodes if is_control_flow(n)
                      for a in cf_ops.subgraph_args(n)}  # fmt: skip
    steps: list[Callable] = []
    segment: list = []

    def flush():
        if segment:
            later = set(out_node.all_input_nodes)
            inputs, outputs, compiled = _piece(gm, list(segment), later, compile_graph)
            steps.append(_run_piece(inputs, outputs, compiled))
            segment.clear()

    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or node in subgraph_nodes or _is_result_item(node):
            continue
        if is_control_flow(node):
            flush()
            steps.append(_control_step(gm, node, compile_graph))
        else:
            segment.append(node)
    flush()

    def run(*flat):
        env = dict(zip(placeholders, flat))
        for step in steps:
            step(env)
        return fx.node.map_arg(out_node.args[0], lambda n: env[n])

    run.steps = steps  # for tests: how the graph was split
    return run


def _run_piece(inputs, outputs, compiled):
    def step(env):
        values = compiled(*[env[a] for a in inputs])
        for n, v in zip(outputs, values):
            env[n] = v

    step.kind = "piece"
    return step


def _subgraph(gm: fx.GraphModule, attr_node: fx.Node, compile_graph: GraphCompiler):
    sub = getattr(gm, attr_node.target)
    examples = [_example(p) for p in sub.graph.nodes if p.op == "placeholder"]
    return compile_graph(sub, examples)


def _store(env, node, results) -> None:
    results = tuple(results)
    env[node] = results
    for user in node.users:
        if _is_result_item(user):
            env[user] = results[user.args[1]]


def _control_step(gm: fx.GraphModule, node: fx.Node, compile_graph: GraphCompiler):
    """The runner's step for one control-flow node, its subgraphs compiled now."""
    value = lambda env, args: [env[a] for a in args]  # noqa: E731
    if node.target is cf_ops.cond:
        pred, t_attr, f_attr, operands = node.args
        true_fn = _subgraph(gm, t_attr, compile_graph)
        false_fn = _subgraph(gm, f_attr, compile_graph)

        def step(env):
            branch = true_fn if _decide(env[pred]) else false_fn
            _store(env, node, branch(*value(env, operands)))

    elif node.target is cf_ops.while_loop:
        c_attr, b_attr, carried_nodes, additional = node.args
        cond_fn = _subgraph(gm, c_attr, compile_graph)
        body_fn = _subgraph(gm, b_attr, compile_graph)

        def step(env):
            carried, extra = value(env, carried_nodes), value(env, additional)
            while _decide(cond_fn(*carried, *extra)[0]):
                carried = list(body_fn(*carried, *extra))
            _store(env, node, carried)

    else:  # control.map
        b_attr, xs_nodes, arg_nodes = node.args
        body_fn = _subgraph(gm, b_attr, compile_graph)

        def step(env):
            xs, args = value(env, xs_nodes), value(env, arg_nodes)
            rows = [tuple(body_fn(*[x[i] for x in xs], *args)) for i in range(xs[0].shape[0])]
            _store(env, node, [torch.stack(col) for col in zip(*rows)])

    step.kind = node.target.__name__
    return step
