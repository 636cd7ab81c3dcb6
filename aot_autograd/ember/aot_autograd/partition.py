"""Partitioners: split a joint forward+backward graph into a forward and a backward fx graph.

A joint graph has placeholders `primals_*` (and other forward inputs such as an RNG seed) and
`tangents_*`, and returns `[*forward_outputs, *gradients]`. A partition returns

    forward(*forward_inputs) -> [*forward_outputs, *saved]
    backward(*saved, *tangents) -> [*gradients]

where `saved` are the values the backward needs from the forward. `default_partition` saves every
forward value the backward uses; `min_cut_partition` chooses the set of values with the fewest
bytes that still lets the backward recompute the rest from them (cheap ops only).

Inputs that the program mutates (named in `gm.meta[MUTATED_INPUTS_META]`) are overwritten by the
runtime's copy-back right after the forward, so a saved value must never be such an input or a
view of one: the backward would read the new value (and autograd's version check would fail).
Either partitioner saves a copy in their place (`_copy_overwritten`); the min-cut one first
prices them above their bytes, so it saves a fresh value (the mutation's result) where one serves.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

import sympy
import torch.fx as fx

from ember.ir import NODE_META_KEY, RECOMPUTE_META_KEY, TensorMeta, lookup, target_name
from ember.ir.graph import lazy_graph_module
from ember.primtorch.prims import movement

from .maxflow import INF, FlowNetwork

# Ops with one of these tags are cheap to run again in the backward.
RECOMPUTABLE_TAGS = frozenset({"pointwise", "view", "creation"})
# Data movement that costs one pass over memory (gathers and scatters are not on this list).
RECOMPUTABLE_OPS = frozenset(
    {"prims.cat", "prims.pad", "prims.clone", "prims.copy_strided", "prims.rev"}
)
REDUCTION_TAGS = frozenset({"reduction"})
# Never recomputed: expensive (matmul, conv, attention) or not reproducible.
BANNED_TAGS = frozenset({"extern", "data_dependent", "nondeterministic", "side_effect"})
RANDOM_TAGS = frozenset({"random"})
# What keeping a checkpointed value costs in the min cut (RECOMPUTE_META_KEY): more than any
# activation, yet finite, so a graph whose only cut runs through one still partitions.
CHECKPOINT_SAVE_COST = 1 << 40
# gm.meta key of a joint graph: the names of the forward inputs the program writes in place.
MUTATED_INPUTS_META = "ember_mutated_inputs"


@dataclasses.dataclass
class PartitionConfig:
    """Knobs of the min-cut partitioner, in one place."""

    recompute_reductions: bool = True  # reductions are cheap next to what saving them costs
    # The longest chain of ops (views free) and of reductions the backward may run to rebuild a
    # value from saved ones (`_chain_ends`). The cut prices bytes, not chains: on BERT-base
    # (train-amp) it saved each layer's bf16 matmul outputs and rebuilt the float32 residual
    # stream through all 24 layer norms at the backward's start, every rebuilt value alive
    # from there on, in one kernel of 99 outputs that took 16 s to compile.
    max_recompute_ops: int = 20
    max_recompute_reductions: int = 2
    # Size used for a dynamic dimension when weighing a value whose size is symbolic.
    symbolic_size_hint: int = 4096


config = PartitionConfig()


# --- graph queries ----------------------------------------------------------------------------
def is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and node.name.startswith("tangents")


def _output_values(gm: fx.GraphModule) -> list:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = out.args[0]
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _ancestors(roots: Iterable, stop: frozenset = frozenset()) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [r for r in roots if isinstance(r, fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n not in stop:
            stack.extend(n.all_input_nodes)
    return seen


def _descendants(roots: Iterable[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(u for u in n.users if u.op != "output")
    return seen


def op_tags(node: fx.Node) -> tuple[str, ...]:
    """The vocabulary tags of a call node's op (empty for targets outside the vocabulary)."""
    if node.op != "call_function":
        return ()
    try:
        return tuple(lookup(target_name(node.target)).tags)
    except KeyError:
        return ()


def _has_seed_argument(node: fx.Node) -> bool:
    # primtorch's random prims are pure functions of their (seed, offset) tensor arguments, which
    # the backward can load like any saved value; a random op without one keeps hidden state.
    return bool(node.all_input_nodes)


def is_recomputable(node: fx.Node) -> bool:
    """Whether the backward may run `node` again instead of loading a saved copy."""
    if node.op == "placeholder":
        return False
    if node.op == "get_attr":
        return True  # a constant of the module: free in either graph
    name = target_name_or_none(node)
    if name == "getitem":
        return True  # free; its tuple-valued input decides
    if name in RECOMPUTABLE_OPS:
        return True
    tags = set(op_tags(node))
    if tags & BANNED_TAGS:
        return False
    if tags & RANDOM_TAGS:
        return _has_seed_argument(node)
    allowed = RECOMPUTABLE_TAGS | (REDUCTION_TAGS if config.recompute_reductions else frozenset())
    return bool(tags & allowed)


def is_checkpointed(node: fx.Node) -> bool:
    """Tagged by the frontend (torch.utils.checkpoint) to be recomputed, and safe to run again:
    anything but an op with hidden state or effects, matmuls and convolutions included."""
    if not node.meta.get(RECOMPUTE_META_KEY) or node.op != "call_function":
        return False
    tags = set(op_tags(node))
    if tags & (BANNED_TAGS - {"extern"}):
        return False
    return _has_seed_argument(node) if tags & RANDOM_TAGS else True


def target_name_or_none(node: fx.Node) -> Optional[str]:
    try:
        return target_name(node.target)
    except KeyError:
        return None


def _concrete(expr, hint: int) -> int:
    expr = sympy.sympify(expr)
    if not expr.is_number:
        expr = expr.subs({s: hint for s in expr.free_symbols})
    return int(expr)


def value_bytes(node: fx.Node) -> int:
    """Bytes it costs to keep `node`'s value from the forward to the backward."""
    meta = node.meta.get(NODE_META_KEY)
    if isinstance(meta, TensorMeta):
        return _concrete(meta.nbytes(), config.symbolic_size_hint)
    if isinstance(meta, (tuple, list)):
        return INF  # a tuple is never saved whole: its getitems are
    return 1  # a scalar


def saved_bytes(fw_gm: fx.GraphModule, num_fwd_outputs: int) -> int:
    """Total bytes of the values a partitioned forward graph saves for the backward."""
    return sum(value_bytes(n) for n in _output_values(fw_gm)[num_fwd_outputs:] if n is not None)


# --- the two partitioners ---------------------------------------------------------------------
@dataclasses.dataclass
class _Joint:
    gm: fx.GraphModule
    fw_inputs: list[fx.Node]
    tangents: list[fx.Node]
    fw_outputs: list
    bw_outputs: list

    @classmethod
    def of(cls, gm: fx.GraphModule, num_fwd_outputs: int) -> "_Joint":
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        outs = _output_values(gm)
        return cls(
            gm,
            [p for p in placeholders if not is_tangent(p)],
            [p for p in placeholders if is_tangent(p)],
            outs[:num_fwd_outputs],
            outs[num_fwd_outputs:],
        )


def default_partition(joint_gm: fx.GraphModule, *, num_fwd_outputs: int):
    """Save every forward value the backward uses; recompute nothing."""
    j = _Joint.of(joint_gm, num_fwd_outputs)
    in_forward = _ancestors(j.fw_outputs) | set(j.fw_inputs)
    bw_needed = _ancestors(j.bw_outputs, stop=frozenset(in_forward))
    saved = {n for n in bw_needed & in_forward if _used_outside(n, bw_needed - in_forward)}
    saved |= {n for n in j.bw_outputs if isinstance(n, fx.Node) and n in in_forward}
    return _build(j, _in_graph_order(joint_gm, saved))


def _used_outside(node: fx.Node, backward_nodes: set) -> bool:
    return any(u in backward_nodes for u in node.users)


def min_cut_partition(joint_gm: fx.GraphModule, *, num_fwd_outputs: int):
    """Save the fewest bytes: a minimum cut between forward inputs and tangent-dependent nodes."""
    j = _Joint.of(joint_gm, num_fwd_outputs)
    in_forward = _ancestors(j.fw_outputs)
    bw_needed = _ancestors(j.bw_outputs)
    tangent_dependent = _descendants(j.tangents)
    fw_inputs = set(j.fw_inputs)
    overwritten = _overwritten_aliases(joint_gm)
    chain_ends = _chain_ends(joint_gm, bw_needed - tangent_dependent)

    net = FlowNetwork()
    net.vertex("source")
    net.vertex("sink")
    for n in joint_gm.graph.nodes:
        if n not in bw_needed or n.op == "output":
            continue
        if n in tangent_dependent:
            net.add_edge((n, "in"), "sink", INF)
            continue
        checkpointed = is_checkpointed(n)
        rebuilt = checkpointed or (is_recomputable(n) and n not in chain_ends)
        if n in fw_inputs or (n in in_forward and not rebuilt):
            net.add_edge("source", (n, "in"), INF)
        elif n.op == "placeholder":
            raise ValueError(f"joint graph input {n.name} is neither a forward input nor a tangent")
        # Saving an alias of an overwritten input costs a copy (made in _build): its bytes twice.
        # Every value costs at least 1: with an empty input's edges at capacity 0 the cut found
        # left the backward needing that (unsaved) input (a fuzzer program, tests/test_fuzz*).
        cost = max(1, value_bytes(n)) * (2 if n in overwritten else 1)
        if checkpointed:
            cost += CHECKPOINT_SAVE_COST
        net.add_edge((n, "in"), (n, "out"), cost)
        for user in n.users:
            if user in bw_needed and user.op != "output":
                net.add_edge((n, "out"), (user, "in"), INF)
        if n in j.bw_outputs:
            net.add_edge((n, "out"), "sink", INF)  # a gradient that is a forward value
    value, cut = net.min_cut("source", "sink")
    if value >= INF:
        raise RuntimeError("min-cut partition found no finite cut (an unsavable value is needed)")
    saved = {u[0] for u, v in cut if isinstance(u, tuple) and u[1] == "in" and v == (u[0], "out")}
    return _build(j, _in_graph_order(joint_gm, saved))


def _chain_ends(gm: fx.GraphModule, forward: set) -> set[fx.Node]:
    """The recomputable forward nodes the backward may not rebuild: where a chain of rebuilt ops
    would pass `config.max_recompute_ops` ops or `max_recompute_reductions` reductions. Counted
    as if everything recomputable were rebuilt (the cut is not known yet); a node that ends a
    chain is kept from the forward (saved, or rebuilt from what is), and chains through it
    start again at zero. Checkpointed nodes are the user's choice and are not counted."""
    depth: dict[fx.Node, tuple[int, int]] = {}  # rebuildable node -> (ops, reductions)
    ends: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n not in forward or is_checkpointed(n) or not is_recomputable(n):
            continue
        ops = reductions = 0
        for a in n.all_input_nodes:
            o, r = depth.get(a, (0, 0))
            ops, reductions = max(ops, o), max(reductions, r)
        tags = op_tags(n)
        counted = n.op == "call_function" and "view" not in tags
        ops += counted and target_name_or_none(n) != "getitem"
        reductions += "reduction" in tags
        if ops > config.max_recompute_ops or reductions > config.max_recompute_reductions:
            ends.add(n)
        else:
            depth[n] = (ops, reductions)
    return ends


def _in_graph_order(gm: fx.GraphModule, nodes: set) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n in nodes]


def _overwritten_aliases(gm: fx.GraphModule) -> set[fx.Node]:
    """Forward inputs the runtime overwrites after the forward, and the views of them."""
    names = set(gm.meta.get(MUTATED_INPUTS_META, ()))
    if not names:
        return set()
    found = {n for n in gm.graph.nodes if n.op == "placeholder" and n.name in names}
    for n in gm.graph.nodes:  # topological: a view's base is seen before the view
        if "view" in op_tags(n) and n.args and n.args[0] in found:
            found.add(n)
    return found


def _copy_overwritten(j: _Joint, saved: list[fx.Node]) -> tuple[_Joint, list[fx.Node]]:
    """Replace each saved alias of an overwritten input by a copy made in the forward, read by
    the backward in its place (the forward's own uses keep reading the input)."""
    overwritten = _overwritten_aliases(j.gm)
    aliases = [s for s in saved if s in overwritten]
    if not aliases:
        return j, saved
    stop = frozenset([*saved, *j.tangents])
    backward_nodes = _ancestors(j.bw_outputs, stop=stop) - stop
    copies: dict[fx.Node, fx.Node] = {}
    for s in aliases:
        with j.gm.graph.inserting_after(s):
            c = j.gm.graph.call_function(movement.clone, (s,))
        c.meta[NODE_META_KEY] = movement.clone.meta(s.meta[NODE_META_KEY])
        for user in [u for u in s.users if u in backward_nodes]:
            user.replace_input_with(s, c)
        copies[s] = c
    bw_outputs = [copies.get(o, o) if isinstance(o, fx.Node) else o for o in j.bw_outputs]
    output = next(n for n in reversed(j.gm.graph.nodes) if n.op == "output")
    output.args = ([*j.fw_outputs, *bw_outputs],)
    j.gm.recompile()
    return dataclasses.replace(j, bw_outputs=bw_outputs), [copies.get(s, s) for s in saved]


def _build(j: _Joint, saved: list[fx.Node]):
    saved = _with_size_carriers(j, saved)
    j, saved = _copy_overwritten(j, saved)
    fw = extract_graph(j.gm, j.fw_inputs, [*j.fw_outputs, *saved])
    bw_inputs = [*saved, *j.tangents]
    missing = _ancestors(j.bw_outputs, stop=frozenset(bw_inputs)) - set(bw_inputs)
    extra = [n for n in missing if n.op == "placeholder"]
    if extra:
        raise RuntimeError(f"backward graph would need unsaved inputs {[n.name for n in extra]}")
    bw = extract_graph(j.gm, bw_inputs, j.bw_outputs, order=_backward_order(j, bw_inputs))
    return fw, bw


def _size_symbols(node: fx.Node) -> set:
    """The size symbols `node`'s arguments and value's sizes are written in."""
    found: set = set()

    def collect(v):
        if isinstance(v, sympy.Basic):
            found.update(v.free_symbols)
        return v

    fx.node.map_aggregate((node.args, node.kwargs), collect)
    meta = node.meta.get(NODE_META_KEY)
    if isinstance(meta, TensorMeta):
        for size in (*meta.sizes, *meta.strides):
            collect(sympy.sympify(size))
    return found


def _with_size_carriers(j: _Joint, saved: list[fx.Node]) -> list[fx.Node]:
    """`saved`, plus a forward value for each size symbol the backward computes with that no
    saved value or tangent carries in its sizes: the gradient of a sum over a dim of symbolic
    size is the scalar tangent broadcast to that size, and nothing else in the backward says
    what the size is. The forward input of that size is saved (the caller holds it anyway)."""
    from .dynamic import _symbol_sources

    inputs = [*saved, *j.tangents]
    backward = _ancestors(j.bw_outputs, stop=frozenset(inputs)) - set(inputs)
    needed = set().union(*(_size_symbols(n) for n in backward)) if backward else set()
    missing = needed - set(_symbol_sources(inputs))
    if not missing:
        return saved
    saved = list(saved)
    for s in sorted(missing, key=str):  # symbols are sizes of the inputs (dynamo's, export's)
        carrier = next((c for c in j.fw_inputs if s in _symbol_sources([c])), None)
        if carrier is not None and carrier not in saved:
            saved.append(carrier)
    return saved


def _backward_order(j: _Joint, bw_inputs: list) -> list[fx.Node]:
    """The backward's nodes in the autograd engine's order, each value it recomputes from the
    saved ones placed right before its first use (in joint order they would all come first,
    every recomputed activation alive from the backward's start: twice eager's peak)."""
    needed = _ancestors(j.bw_outputs, stop=frozenset(bw_inputs))
    tangent_dependent = _descendants(j.tangents)
    order: list[fx.Node] = []
    placed = set(bw_inputs)

    def place(root: fx.Node) -> None:
        stack = [(root, False)]
        while stack:
            n, inputs_placed = stack.pop()
            if n in placed:
                continue
            if inputs_placed:
                placed.add(n)
                order.append(n)
                continue
            stack.append((n, True))
            stack.extend((i, False) for i in reversed(n.all_input_nodes) if i not in placed)

    for n in j.gm.graph.nodes:
        if n in needed and n in tangent_dependent:
            place(n)
    for n in j.gm.graph.nodes:  # what no tangent reaches (a gradient that is a forward value)
        if n in needed:
            place(n)
    return order


def extract_graph(gm: fx.GraphModule, inputs: list[fx.Node], outputs: list,
                  order: Optional[list[fx.Node]] = None) -> fx.GraphModule:  # fmt: skip
    """A new GraphModule computing `outputs` from `inputs` (nodes of `gm`), metadata kept;
    its nodes in `order` (a topological order of the needed ones) or else in `gm`'s."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for n in inputs:
        p = graph.placeholder(n.name)
        p.meta = dict(n.meta)
        env[n] = p
    needed = _ancestors(outputs, stop=frozenset(inputs))
    for n in gm.graph.nodes if order is None else order:
        if n in env or n not in needed:
            continue
        if n.op == "placeholder":
            raise RuntimeError(f"graph needs input {n.name}, which is not among its inputs")
        env[n] = graph.node_copy(n, env.__getitem__)
    graph.output([env[o] if isinstance(o, fx.Node) else o for o in outputs])
    graph.lint()
    return lazy_graph_module(gm, graph)  # its code is written if it is ever run
