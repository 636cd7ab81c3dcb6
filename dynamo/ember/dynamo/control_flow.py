"""torch.cond, torch.while_loop and map: bodies traced as subgraphs, the call one node of the graph.

Each body (a branch, a loop's condition and body, a map's function) is traced by the same
interpreter into a fresh fx graph: its tensor arguments become placeholders, tensors it reads
from outside (closures, globals, module attributes, values of the enclosing graph) are lifted to
extra placeholders (so are sizes of dynamic shapes it reads from the enclosing code; its own
placeholders keep the operands' symbolic sizes), and it returns a tuple of tensors. The subgraphs are `fx.GraphModule`s held
as attributes of the enclosing graph's module, and the call becomes one `ember.ir` control-flow
node (`control.cond`, `control.while_loop`, `control.map`). A predicate that is a Python value (a
constant or a decision on sizes) is decided now, guarded, and only the chosen branch is traced;
a comparison of dynamic sizes nothing else read is instead computed in the graph.
A body may not have Python side effects (they would happen once at trace time, or never): the
frame breaks at the call with the body's file:line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Callable, Optional

import sympy
import torch
import torch.fx as fx

from ember.ir import NODE_META_KEY, TensorMeta, contiguous_strides
from ember.ir import control_flow as cf_ops

from . import variables as V
from .exc import Unsupported
from .symbolic import SizeDecisionVT, graph_arg


# -- which user functions are control flow -------------------------------------------------------
def _torch_map():
    # torch has no public name for map (functorch.experimental.control_flow re-exports it from
    # torch._higher_order_ops.map). `import torch` has loaded that module already; we read the
    # function from sys.modules only to recognise it by identity, never importing or calling it.
    module = sys.modules.get("torch._higher_order_ops.map")
    return getattr(module, "map", None)


def handler_for(fn) -> Optional[Callable]:
    """The tracer of a control-flow function the user calls, or None for any other function."""
    if fn is torch.cond:
        return trace_cond
    if fn is getattr(torch, "while_loop", None):
        return trace_while_loop
    mapped = _torch_map()
    if mapped is not None and fn is mapped:
        return trace_map
    return None


def _bind(name: str, params: tuple, args: list, kwargs: dict, defaults: dict) -> list:
    bound = dict(zip(params, args))
    if len(args) > len(params):
        raise Unsupported(f"{name}: too many arguments")
    for k, v in kwargs.items():
        if k not in params or k in bound:
            raise Unsupported(f"{name}: unexpected argument {k!r}")
        bound[k] = v
    for p in params:
        if p not in bound:
            if p not in defaults:
                raise Unsupported(f"{name}: missing argument {p!r}")
            bound[p] = defaults[p]
    return [bound[p] for p in params]


# -- side effects inside a body ------------------------------------------------------------------
class _NoAppend(list):
    def __init__(self, items, what):
        super().__init__(items)
        self.what = what

    def append(self, effect):
        raise Unsupported(f"a Python side effect ({effect[0]}) inside {self.what}: it would run "
                          "once while tracing, not on every call; compute it outside")


class _NoSet(dict):
    def __init__(self, items, what):
        super().__init__(items)
        self.what = what

    def __setitem__(self, key, value):
        raise Unsupported(f"a Python side effect (changing a pre-existing list, dict or attribute) "
                          f"inside {self.what}; compute it outside")


def _refuse(self, *args, **kwargs):
    raise Unsupported(f"a Python side effect (changing a {type(self).kind} of the enclosing code) "
                      f"inside {self.what}; compute it outside")  # fmt: skip


class _FrozenList(list):
    """Stands in for the items of a list of the enclosing code while a body is traced."""

    kind = "list"
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse


class _FrozenDict(dict):
    """Stands in for the items of a dict or set, or an object's attributes, likewise."""

    kind = "dict, set or object"
    __setitem__ = __delitem__ = pop = popitem = clear = update = setdefault = _refuse


_ITEMS = ((V.ListVT, "items", _FrozenList), (V.DictVT, "items", _FrozenDict),
          (V.SetVT, "items", _FrozenDict), (V.NewObjectVT, "attrs", _FrozenDict))  # fmt: skip


def _reachable(vts) -> list:
    """Containers and cells of the enclosing code a body can reach (its function, arguments)."""
    seen, out, todo = set(), [], list(vts)
    while todo:
        vt = todo.pop()
        if id(vt) in seen:
            continue
        seen.add(id(vt))
        out.append(vt)
        if isinstance(vt, V.CellVT) and vt.value is not None:
            todo.append(vt.value)
        elif isinstance(vt, V.ListVT):
            todo += vt.items
        elif isinstance(vt, (V.DictVT, V.NewObjectVT)):
            todo += list(vt.items.values() if isinstance(vt, V.DictVT) else vt.attrs.values())
        elif isinstance(vt, V.NestedFunctionVT):
            todo += list(vt.closure or ())
        elif isinstance(vt, V.BoundMethodVT):
            todo += [vt.fn, vt.self_vt]
    return out


@contextlib.contextmanager
def _frozen(tx, what: str, watched: list):
    """Make the containers a body can reach refuse changes (the error names the changing line);
    a closure cell rebound (`nonlocal`) is found afterwards, at the call's line."""
    swapped, cells = [], []
    for vt in _reachable(watched):
        if isinstance(vt, V.CellVT):
            cells.append((vt, vt.value))
        for cls, attr, frozen in _ITEMS:
            if isinstance(vt, cls):
                original = getattr(vt, attr)
                stand_in = frozen(original)
                stand_in.what = what
                setattr(vt, attr, stand_in)
                swapped.append((vt, attr, original))
                break
    try:
        yield
        for cell, value in cells:
            if cell.value is not value:
                raise Unsupported(f"a Python side effect (rebinding a variable of the enclosing "
                                  f"code) inside {what}; compute it outside",
                                  tx.root.innermost_where())  # fmt: skip
    finally:  # the stand-ins refused every change: the originals are still right
        for vt, attr, original in swapped:
            setattr(vt, attr, original)


@contextlib.contextmanager
def _subtrace(tx, what: str, watched: list):
    """Route the output graph's new nodes into a fresh graph and forbid side effects."""
    out = tx.output
    saved = (out.graph, out.root_module, out.side_effects, out.mutated, out.pending_attrs)
    graph, holder = fx.Graph(), torch.nn.Module()
    out.graph, out.root_module = graph, holder
    out.side_effects = _NoAppend(out.side_effects, what)
    out.mutated, out.pending_attrs = _NoSet(out.mutated, what), _NoSet(out.pending_attrs, what)
    # Size reads inside the body are nodes of the body's graph (from its own placeholders);
    # sizes the enclosing code computed are lifted into it like tensors.
    env = out.shape_env
    env_saved = (env.graph, env.nodes) if env is not None else None
    if env is not None:
        env.graph, env.nodes = graph, {}
    try:
        with _frozen(tx, what, watched):
            yield graph, holder
    finally:  # the originals: the stand-ins refused every change, so nothing is lost
        out.graph, out.root_module, out.side_effects, out.mutated, out.pending_attrs = saved
        if env is not None:
            env.graph, env.nodes = env_saved


# -- tracing one body ----------------------------------------------------------------------------
class Body:
    """A traced body: its graph module, its flat output values and structure, and the nodes of
    the enclosing graph it reads (lifted to placeholders after its arguments)."""

    def __init__(self, graph, holder, params, outputs, spec, lifted):
        self.graph, self.holder, self.params = graph, holder, params
        self.outputs, self.spec, self.lifted = outputs, spec, lifted

    def module(self, inputs: list) -> fx.GraphModule:
        """The GraphModule taking `params` then the enclosing `inputs` (nodes), in that order."""
        graph = self.graph
        phs = list(self.params)
        for node in inputs:
            ph = self.lifted.get(node)
            if ph is None:  # read by another body of the same op only: an unused input
                ph = graph.placeholder(f"unused_{node.name}")
                _copy_meta(node, ph)
            phs.append(ph)
        anchor = next(n for n in graph.nodes if n.op != "placeholder")
        for ph in phs:
            anchor.prepend(ph)
        gm = fx.GraphModule(self.holder, graph)
        gm.graph.lint()
        return gm


def _copy_meta(src: fx.Node, dst: fx.Node) -> None:
    for key in ("example_value", NODE_META_KEY):
        if key in src.meta:
            dst.meta[key] = src.meta[key]


def _placeholder(graph: fx.Graph, name: str, vt: V.TensorVT) -> V.TensorVT:
    node = graph.placeholder(name)
    with torch.no_grad():
        example = vt.example.detach().clone()
    if example.is_floating_point() or example.is_complex():
        example.requires_grad_(vt.example.requires_grad)
    node.meta["example_value"] = example
    meta = TensorMeta.from_tensor(example)
    if vt.sym is not None:  # the operand's symbolic sizes: the body is traced for every size
        meta = dataclasses.replace(meta, sizes=vt.sym, strides=_sym_strides(vt))
    node.meta[NODE_META_KEY] = meta
    ph = V.TensorVT(node, example)
    ph.sym = vt.sym
    return ph


def _sym_strides(vt: V.TensorVT) -> tuple:
    meta = vt.node.meta.get(NODE_META_KEY)
    if isinstance(meta, TensorMeta) and tuple(meta.sizes) == tuple(vt.sym):
        return tuple(meta.strides)
    return contiguous_strides(vt.sym)


def _flatten(vt, what) -> tuple[list, object]:
    """Tensor leaves of a body's result and its structure."""
    if isinstance(vt, V.TensorVT):
        return [vt], "tensor"
    if isinstance(vt, V.ListVT) and not isinstance(vt, V.NamedTupleVT):
        leaves, specs = [], []
        for item in vt.items:
            sub, spec = _flatten(item, what)
            leaves += sub
            specs.append(spec)
        return leaves, ("tuple" if vt.is_tuple else "list", tuple(specs))
    raise Unsupported(f"{what} returns a {type(vt).__name__}; a body returns tensors (in tuples "
                      "or lists)")  # fmt: skip


def _unflatten(leaves: list, spec):
    if spec == "tensor":
        return leaves.pop(0)
    kind, specs = spec
    return V.ListVT([_unflatten(leaves, s) for s in specs], is_tuple=kind == "tuple")


def trace_body(tx, fn_vt, args: list, what: str, regroup=None) -> Body:
    """Trace `fn_vt(*args)` into its own graph; tensors in `args` become its placeholders (with
    their symbolic sizes). `regroup(args)`, when given, turns them into the arguments the user's
    function takes."""
    from . import calls
    from .codegen import eliminate_dead_code

    with _subtrace(tx, what, [fn_vt, *args]) as (graph, holder):
        params, body_args = [], []
        for i, a in enumerate(args):
            if isinstance(a, V.TensorVT):
                ph = _placeholder(graph, f"arg{i}", a)
                params.append(ph.node)
                body_args.append(ph)
            else:
                body_args.append(a)
        result = calls.call(tx, fn_vt, regroup(body_args) if regroup else body_args, {})
        outputs, spec = _flatten(result, what)
        graph.output(tuple(o.node for o in outputs))
    lifted = _lift_foreign_inputs(graph)
    eliminate_dead_code(graph)
    return Body(graph, holder, params, outputs, spec, lifted)


def _lift_foreign_inputs(graph: fx.Graph) -> dict:
    """Replace every use of a node of another (enclosing) graph by a placeholder of this one."""
    lifted: dict = {}
    for node in list(graph.nodes):
        for a in list(node.all_input_nodes):
            if a.graph is graph:
                continue
            is_tensor = isinstance(a.meta.get("example_value"), torch.Tensor)
            if a.op == "get_attr" or not (is_tensor or _is_size(a)):
                raise Unsupported(f"a body reads {a.name} of the enclosing graph, not a tensor")
            if a not in lifted:
                with graph.inserting_before(next(iter(graph.nodes))):
                    lifted[a] = graph.placeholder(f"lifted_{a.name}")
                _copy_meta(a, lifted[a])
            node.replace_input_with(a, lifted[a])
    return lifted


def _is_size(node: fx.Node) -> bool:
    """A symbolic size the enclosing graph computes (`x.size(0)`, `n * 2`): no tensor value."""
    return "example_value" not in node.meta and node.op in ("call_method", "call_function")


def _lifted_values(tx, nodes: list) -> list:
    """The values the enclosing trace has for lifted nodes (a size: its current value)."""
    env = tx.output.shape_env
    exprs = {n: e for e, n in env.nodes.items()} if env is not None else {}
    return [env.hint(exprs[n]) if n in exprs else tx.output.value_of(n) for n in nodes]


def _union(*bodies) -> list:
    nodes: dict = {}
    for b in bodies:
        nodes.update(dict.fromkeys(b.lifted))
    return list(nodes)


def _check_same_meta(what: str, a: list, b: list, names=("true_fn", "false_fn")) -> None:
    if len(a) != len(b):
        raise Unsupported(f"{what}: {names[0]} returns {len(a)} tensors, {names[1]} {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        ex, ey = x.example, y.example
        if (ex.shape, ex.dtype, ex.device, x.sym) != (ey.shape, ey.dtype, ey.device, y.sym):
            raise Unsupported(f"{what}: output {i} differs between {names[0]} "
                              f"({ex.dtype}{list(ex.shape)} on {ex.device}) and {names[1]} "
                              f"({ey.dtype}{list(ey.shape)} on {ey.device})")  # fmt: skip


def _add_subgraph(tx, prefix: str, gm: fx.GraphModule) -> fx.Node:
    out = tx.output
    holder = out.root_module
    i = 0
    while hasattr(holder, f"{prefix}_{i}"):
        i += 1
    name = f"{prefix}_{i}"
    holder.add_module(name, gm)
    return out.graph.get_attr(name)


def _emit(tx, op, args: tuple, example_args: tuple, sym=None) -> V.VT:
    """The control-flow node, run once on the example values for its result; `sym`: the
    symbolic sizes of each result (None where static)."""
    out = tx.output
    node = out.graph.create_node("call_function", op, args, {})
    node.meta["ember_where"] = out.where()
    out.op_count += 1
    result = op(*example_args)
    return out.wrap_result(node, tuple(result), sym if sym and any(sym) else None)


def _drop_examples(*gms) -> None:
    for gm in gms:  # the enclosing graph keeps its own; these would only pin memory
        for node in gm.graph.nodes:
            node.meta.pop("example_value", None)


def _tensors(vt, what) -> list:
    items = vt.items if isinstance(vt, V.ListVT) else [vt]
    for x in items:
        if not isinstance(x, (V.TensorVT, V.ConstVT)):
            raise Unsupported(f"{what}: operands are tensors or constants, got {type(x).__name__}")
    return list(items)


def _flat_operands(items: list):
    """Tensor and constant leaves of operands that may be tuples, lists and dicts of them, and
    the function giving a body its arguments back from the leaves (in the same order)."""
    leaves: list = []

    def flatten(vt):
        if isinstance(vt, (V.TensorVT, V.ConstVT)):
            leaves.append(vt)
            return None
        if isinstance(vt, V.ListVT) and not isinstance(vt, V.NamedTupleVT):
            return ("list", vt.is_tuple, [flatten(i) for i in vt.items])
        if isinstance(vt, V.DictVT) and vt.cls is dict:
            return ("dict", list(vt.items), [flatten(i) for i in vt.items.values()])
        raise Unsupported(f"torch.cond: an operand holds a {type(vt).__name__}; operands are "
                          "tensors, constants, and tuples, lists and dicts of them")  # fmt: skip

    specs = [flatten(i) for i in items]

    def build(spec, it):
        if spec is None:
            return next(it)
        kind, extra, children = spec
        values = [build(c, it) for c in children]
        if kind == "list":
            return V.ListVT(values, is_tuple=extra)
        return V.DictVT(dict(zip(extra, values)))

    def rebuild(flat: list) -> list:
        it = iter(flat)
        return [build(spec, it) for spec in specs]

    return leaves, rebuild


# -- the three ops -------------------------------------------------------------------------------
def trace_cond(tx, args: list, kwargs: dict) -> V.VT:
    """torch.cond(pred, true_fn, false_fn, operands)."""
    from . import calls

    pred, true_fn, false_fn, operands = _bind(
        "torch.cond", ("pred", "true_fn", "false_fn", "operands"), args, kwargs,
        {"operands": V.TupleVT([])})  # fmt: skip
    items = operands.items if isinstance(operands, V.ListVT) else [operands]
    if isinstance(pred, SizeDecisionVT) and pred.retract():
        # A comparison of dynamic sizes nothing else read: computed in the graph, both branches
        # captured (one graph for every size); where a branch cannot be, decided as before.
        try:
            return _trace_cond(tx, _size_predicate(tx, pred), true_fn, false_fn, items)
        except Unsupported:
            pred.restore()
    if not isinstance(pred, V.TensorVT):  # a Python bool or a decision on sizes: guarded
        return calls.call(tx, true_fn if calls.truth(tx, pred) else false_fn, list(items), {})
    if pred.example.numel() != 1:
        raise Unsupported(f"torch.cond: the predicate has {pred.example.numel()} elements, not 1")
    return _trace_cond(tx, (pred.node, pred.example), true_fn, false_fn, items)


def _size_predicate(tx, pred: SizeDecisionVT) -> tuple:
    """(node, value): the comparison as a graph node over the size nodes, and its value now."""
    node = tx.output.graph.call_function(pred.op, (graph_arg(pred.a), graph_arg(pred.b)))
    return node, pred._value


def _trace_cond(tx, pred: tuple, true_fn, false_fn, items: list) -> V.VT:
    pred_node, pred_example = pred
    ops, rebuild = _flat_operands(items)  # operands may be pytrees: bodies see them rebuilt
    t = trace_body(tx, true_fn, ops, "the true branch of torch.cond", rebuild)
    f = trace_body(tx, false_fn, ops, "the false branch of torch.cond", rebuild)
    _check_same_meta("torch.cond", t.outputs, f.outputs)
    if t.spec != f.spec:
        raise Unsupported("torch.cond: the branches return different structures")
    lifted = _union(t, f)
    gm_t, gm_f = t.module(lifted), f.module(lifted)
    tensor_ops = [o for o in ops if isinstance(o, V.TensorVT)]
    nodes = tuple([o.node for o in tensor_ops] + lifted)
    examples = tuple([o.example for o in tensor_ops] + _lifted_values(tx, lifted))
    t_node, f_node = _add_subgraph(tx, "cond_true", gm_t), _add_subgraph(tx, "cond_false", gm_f)
    result = _emit(tx, cf_ops.cond, (pred_node, t_node, f_node, nodes),
                   (pred_example, gm_t, gm_f, examples), [o.sym for o in t.outputs])  # fmt: skip
    _drop_examples(gm_t, gm_f)
    return _unflatten(list(result.items), t.spec)


def trace_while_loop(tx, args: list, kwargs: dict) -> V.VT:
    """torch.while_loop(cond_fn, body_fn, carried_inputs)."""
    cond_fn, body_fn, carried = _bind("torch.while_loop", ("cond_fn", "body_fn", "carried_inputs"),
                                      args, kwargs, {})  # fmt: skip
    items = _tensors(carried, "torch.while_loop")
    if not all(isinstance(x, V.TensorVT) for x in items) or not isinstance(carried, V.ListVT):
        raise Unsupported("torch.while_loop: carried_inputs must be a tuple of tensors")
    c = trace_body(tx, cond_fn, items, "the cond_fn of torch.while_loop")
    b = trace_body(tx, body_fn, items, "the body_fn of torch.while_loop")
    if len(c.outputs) != 1 or c.spec != "tensor" or c.outputs[0].example.numel() != 1:
        raise Unsupported("torch.while_loop: cond_fn must return one tensor of one element")
    _check_same_meta("torch.while_loop", items, b.outputs, ("carried_inputs", "body_fn's result"))
    lifted = _union(c, b)
    gm_c, gm_b = c.module(lifted), b.module(lifted)
    c_node, b_node = _add_subgraph(tx, "while_cond", gm_c), _add_subgraph(tx, "while_body", gm_b)
    result = _emit(tx, cf_ops.while_loop,
                   (c_node, b_node, tuple(x.node for x in items), tuple(lifted)),
                   (gm_c, gm_b, tuple(x.example for x in items), tuple(_lifted_values(tx, lifted))),
                   [x.sym for x in items])  # fmt: skip
    _drop_examples(gm_c, gm_b)
    return V.ListVT(list(result.items), is_tuple=carried.is_tuple)


def trace_map(tx, args: list, kwargs: dict) -> V.VT:
    """map(f, xs, *args): f over the leading dimension of xs (a tensor or a tuple of them)."""
    if kwargs or len(args) < 2:
        raise Unsupported("map(f, xs, *args) takes positional arguments")
    fn, xs, rest = args[0], args[1], list(args[2:])
    xs_items = _tensors(xs, "map")
    extra = _tensors(V.TupleVT(rest), "map")
    if not xs_items or not all(isinstance(x, V.TensorVT) and x.example.dim() > 0 for x in xs_items):
        raise Unsupported("map: xs must be tensors with a leading dimension")
    lead = [x.sym[0] if x.sym is not None else x.example.shape[0] for x in xs_items]
    if xs_items[0].example.shape[0] == 0 or any(n != lead[0] for n in lead):
        raise Unsupported("map: xs must share a nonzero leading dimension")
    slices = [V.TensorVT(x.node, x.example[0]) for x in xs_items]  # examples of one slice
    for sl, x in zip(slices, xs_items):
        sl.sym = tuple(x.sym[1:]) if x.sym is not None else None
    single = isinstance(xs, V.TensorVT)

    def regroup(flat: list) -> list:  # the slices as the user passed xs, then the extras
        first, rest = flat[: len(slices)], flat[len(slices) :]
        return [first[0] if single else V.ListVT(first, is_tuple=xs.is_tuple), *rest]

    body = trace_body(tx, fn, slices + extra, "the body of map", regroup)
    lifted = _union(body)
    gm = body.module(lifted)
    node = _add_subgraph(tx, "map_body", gm)
    extra_t = [e for e in extra if isinstance(e, V.TensorVT)]
    arg_nodes = tuple([e.node for e in extra_t] + lifted)
    arg_examples = tuple([e.example for e in extra_t] + _lifted_values(tx, lifted))
    sym = [None if o.sym is None and xs_items[0].sym is None else
           tuple(sympy.sympify(e) for e in (lead[0], *(o.sym or o.example.shape)))
           for o in body.outputs]  # fmt: skip
    result = _emit(tx, cf_ops.map, (node, tuple(x.node for x in xs_items), arg_nodes),
                   (gm, tuple(x.example for x in xs_items), arg_examples), sym)  # fmt: skip
    _drop_examples(gm)
    return _unflatten(list(result.items), body.spec)
