"""Graphs with control-flow nodes (control.cond, .while_loop, .map) compiled and exported in pieces.

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

from ember.ir import NODE_META_KEY, WRITTEN_AFTER_CALL_META_KEY, TensorMeta
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


def _piece_module(gm: fx.GraphModule, nodes: list):
    """A straight-line run of nodes as its own graph module: (input nodes, output nodes, gm)."""
    inside = set(nodes)
    inputs: dict = {}
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in inside:
                inputs.setdefault(a)
    outputs = [n for n in nodes if any(u not in inside for u in n.users)]
    graph = fx.Graph()
    env = {}
    for a in inputs:
        env[a] = graph.placeholder(a.name)
        for key in (NODE_META_KEY, WRITTEN_AFTER_CALL_META_KEY):
            if key in a.meta:
                env[a].meta[key] = a.meta[key]
    for n in nodes:
        env[n] = graph.node_copy(n, lambda x: env[x])
    graph.output(tuple(env[n] for n in outputs))
    piece = fx.GraphModule(gm, graph)
    # a piece of a training graph is one (the layout choices differ); the rest of the whole's
    # meta names its own inputs and outputs (input updates, size symbols): not carried over
    if "ember_training" in gm.meta:
        piece.meta["ember_training"] = gm.meta["ember_training"]
    return list(inputs), outputs, piece


def plan(gm: fx.GraphModule) -> list:
    """The graph as steps in order: ("piece", [nodes]) for straight-line runs and ("control",
    node) for control-flow nodes (their subgraph get_attrs and result getitems belong to them)."""
    subgraph_nodes = {a for n in gm.graph.nodes if is_control_flow(n)
                      for a in cf_ops.subgraph_args(n)}  # fmt: skip
    steps, segment = [], []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or node in subgraph_nodes or _is_result_item(node):
            continue
        if is_control_flow(node):
            if segment:
                steps.append(("piece", segment))
                segment = []
            steps.append(("control", node))
        else:
            segment.append(node)
    if segment:
        steps.append(("piece", segment))
    return steps


def _decide(pred) -> bool:
    return bool(pred)  # a one-element tensor: the one device-to-host read of this decision


def compile_with_control_flow(gm: fx.GraphModule, compile_graph: GraphCompiler):
    """A PiecewiseProgram for a graph with control-flow nodes: its pieces and subgraphs each
    compiled through `compile_graph`, run in order by Python."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    steps: list[Callable] = []
    for kind, item in plan(gm):
        if kind == "piece":
            inputs, outputs, piece = _piece_module(gm, item)
            compiled = compile_graph(piece, [_example(a) for a in inputs])
            steps.append(_run_piece(inputs, outputs, compiled))
        else:
            steps.append(_control_step(gm, item, compile_graph))
    return PiecewiseProgram(placeholders, out_node, steps)


class PiecewiseProgram:
    """What `compile_with_control_flow` returns: `program(*flat_inputs)` runs the steps."""

    def __init__(self, placeholders, out_node, steps):
        self.placeholders, self.out_node = placeholders, out_node
        self.steps = steps  # for tests and debugging: how the graph was split

    def __call__(self, *flat):
        env = dict(zip(self.placeholders, flat))
        for step in self.steps:
            step(env)
        return fx.node.map_arg(self.out_node.args[0], lambda n: env[n])

    @property
    def artifact(self):
        # What ember.cpp_wrapper reads to run or package a compiled graph: there is none to give.
        # The artifact format has no control-flow step (the host reading a predicate, then
        # launching one subgraph's kernels, or a loop's until its condition fails).
        raise NotImplementedError(
            "a program with control flow (torch.cond, torch.while_loop, map) runs in pieces from "
            "Python and has no single CompiledArtifact yet: the C++ wrapper cannot run or "
            "package it, because the CompiledArtifact has no control-flow steps (a predicate read "
            "on the host choosing which subgraph's kernels run). Run it in process instead "
            "(ExportedProgram, ember.compile); ExportedProgram.save and "
            "ember.dynamo.load_exported keep it, subgraphs included"
        )


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


# -- export: one prim graph whose control-flow nodes hold prim subgraphs --------------------------
def _subgraph_examples(node: fx.Node, real: Callable) -> list[list]:
    """Example inputs of each subgraph of a control-flow node, from the real operand values."""
    if node.target is cf_ops.cond:
        operands = [real(a) for a in node.args[3]]
        return [operands, operands]
    if node.target is cf_ops.while_loop:
        values = [real(a) for a in (*node.args[2], *node.args[3])]
        return [values, values]
    xs, args = [real(a) for a in node.args[1]], [real(a) for a in node.args[2]]
    return [[x[0] for x in xs] + args]


def _meta(value):
    if isinstance(value, (tuple, list)):
        return tuple(TensorMeta.from_tensor(v) for v in value)
    return TensorMeta.from_tensor(value)


class _Stitcher:
    """Builds the exported graph: lowered pieces inlined in order, control-flow nodes kept with
    their lowered subgraphs as attributes of the graph's module."""

    def __init__(self):
        self.graph, self.holder = fx.Graph(), torch.nn.Module()
        self.node, self.real = {}, {}  # outer node -> new node, and -> its value on the examples

    def attr(self, base: str, gm: fx.GraphModule) -> fx.Node:
        i = 0
        while hasattr(self.holder, f"{base}_{i}"):
            i += 1
        self.holder.add_module(f"{base}_{i}", gm)
        return self.graph.get_attr(f"{base}_{i}")

    def inline(self, prim: fx.GraphModule, args: list) -> list:
        env = dict(zip([n for n in prim.graph.nodes if n.op == "placeholder"], args))
        for n in prim.graph.nodes:
            if n.op == "output":
                return [env[a] for a in n.args[0]]
            if n.op == "placeholder":
                continue
            if n.op == "get_attr":  # a nested control-flow subgraph of the lowered piece
                env[n] = self.attr(n.target.rsplit("_", 1)[0], getattr(prim, n.target))
            else:
                env[n] = self.graph.node_copy(n, lambda x: env[x])
        raise AssertionError("a graph without output")


def lower_for_export(gm: fx.GraphModule, tensors: list, names: list, lower: Callable):
    """Lower a torch-level graph with control flow to one prim graph: every straight-line piece
    and every subgraph through `lower` (export_inference_graph, so nested control flow recurses);
    returns the graph, whose placeholders are named `names` in order."""
    st = _Stitcher()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for p, name, value in zip(placeholders, names, tensors):
        new = st.graph.placeholder(name)
        new.meta[NODE_META_KEY] = TensorMeta.from_tensor(value)
        st.node[p], st.real[p] = new, value
    for kind, item in plan(gm):
        if kind == "piece":
            _lower_piece(st, gm, item, lower)
        else:
            _lower_control(st, gm, item, lower)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    if len(set(outs)) != len(outs) or any(o.op == "placeholder" for o in outs):
        raise NotImplementedError("ember.export: a program with control flow that returns an input "
                                  "or one tensor twice; return a copy (x.clone())")  # fmt: skip
    st.graph.output(tuple(st.node[o] for o in outs))
    out = fx.GraphModule(st.holder, st.graph)
    out.graph.lint()
    return out


def _lower_piece(st: _Stitcher, gm, nodes, lower) -> None:
    inputs, outputs, piece = _piece_module(gm, nodes)
    examples = [st.real[a] for a in inputs]
    prim, consts = lower(piece, examples, {}, [a.name for a in inputs])
    if consts:
        raise NotImplementedError(f"ember.export: a piece of a program with control flow closes "
                                  f"over tensors {sorted(consts)}")  # fmt: skip
    results = st.inline(prim, [st.node[a] for a in inputs])
    with torch.no_grad():
        real = piece(*examples)
    for n, new, value in zip(outputs, results, real):
        st.node[n], st.real[n] = new, value


def _lower_control(st: _Stitcher, gm, node, lower) -> None:
    real = lambda a: st.real[a]  # noqa: E731
    attrs = cf_ops.subgraph_args(node)
    new_attrs = {}
    for attr, examples in zip(attrs, _subgraph_examples(node, real)):
        sub = getattr(gm, attr.target)
        sub_names = [p.name for p in sub.graph.nodes if p.op == "placeholder"]
        prim, consts = lower(sub, examples, {}, sub_names)
        if consts:
            raise NotImplementedError(f"ember.export: a control-flow subgraph closes over tensors "
                                      f"{sorted(consts)}")  # fmt: skip
        new_attrs[attr] = st.attr(attr.target.rsplit("_", 1)[0], prim)
    args = fx.node.map_arg(node.args, lambda a: new_attrs.get(a) or st.node[a])
    new = st.graph.create_node("call_function", node.target, args, {})
    with torch.no_grad():
        value = node.target(*fx.node.map_arg(
            node.args, lambda a: getattr(gm, a.target) if a in new_attrs else st.real[a]))
    new.meta[NODE_META_KEY] = _meta(value)
    st.node[node], st.real[node] = new, tuple(value)
    for user in node.users:
        if _is_result_item(user):
            i = user.args[1]
            item = st.graph.call_function(operator.getitem, (new, i))
            item.meta[NODE_META_KEY] = TensorMeta.from_tensor(value[i])
            st.node[user], st.real[user] = item, value[i]
