"""Custom torch.autograd.Functions and torch.utils.checkpoint inside a captured graph.

A custom Function whose inputs need gradients becomes one graph node, `AutogradFunctionCall`
(functional_apply.py), that calls the user's class: a backend that runs the graph (eager) or
traces it through torch's autograd (ember.aot_autograd) gets the user's own `backward`, never the
derivative of the forward's ops. Before that node is recorded, the forward (and
`setup_context`) and the backward are traced symbolically, their nodes thrown away: that checks
they hold nothing the graph cannot express (a graph break naming the user's line) and adds the
guards on what they read.

`checkpoint(fn, *args)` inlines `fn` and tags its nodes with `RECOMPUTE_META_KEY`, which
aot_autograd's partitioner honours: the backward computes those values again, none is saved.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import threading

import torch
import torch.utils.checkpoint as torch_checkpoint

from ember.ir import RECOMPUTE_META_KEY, WRITTEN_AFTER_CALL_META_KEY

from . import variables as V
from .exc import Unsupported
from .functional_apply import AutogradFunctionCall, has_setup_context, write_dirty_input
from .source import AttrSource

_BASE = torch.autograd.Function
CHECKPOINT = torch_checkpoint.checkpoint


# -- the ctx objects traced code sees ---------------------------------------------------------
class _ForwardOnlyCtx:
    """The `ctx` of a forward where no input needs a gradient: what it saves for the backward is
    never read, so saving does nothing; the inputs it marks dirty decide which object apply
    returns for them (`_marks` holds them)."""

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        self._ember_dirty = self._ember_dirty + tensors

    def set_materialize_grads(self, value):
        pass


class _CheckedCtx:
    """The `ctx` the forward and backward are traced with, to check them: it keeps what they
    save and mark (attributes they set land on it as on torch's ctx)."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        self._ember_non_differentiable = self._ember_non_differentiable + tensors

    def mark_dirty(self, *tensors):
        self._ember_dirty = self._ember_dirty + tensors

    def set_materialize_grads(self, value):
        pass


def _marks() -> dict:
    """The attributes a traced ctx starts with: the tensors marked so far."""
    return {"_ember_dirty": V.TupleVT([]), "_ember_non_differentiable": V.TupleVT([])}


# -- autograd.Function ------------------------------------------------------------------------
def call_autograd_function(tx, cls_vt: V.ClassVT, args: list, kwargs: dict):
    """`cls.apply(*args)` for a torch.autograd.Function subclass (`cls_vt`)."""
    from .output import has_tensor

    cls = cls_vt.cls

    _not_inside_a_function_body(f"custom autograd.Function {cls.__qualname__}")
    if not (torch.is_grad_enabled()
            and has_tensor((args, kwargs), lambda t: t.example.requires_grad)):  # fmt: skip
        # No gradient can flow (inference, or grad mode off: both guarded): apply is its forward.
        return _forward_inlined(tx, cls_vt, args, kwargs)
    _check_class(cls)
    with _thrown_away(tx, cls):
        checked = _check_traceable(tx, cls_vt, args, kwargs)
    sym = checked.syms if tx.output.shape_env is not None else None
    if checked.dirty:
        _check_dirty(tx, cls, args, checked)
    target = AutogradFunctionCall(cls, tuple(sorted(checked.dirty)))
    result = tx.output.call("call_function", target, tuple(args), kwargs, sym)
    if checked.dirty:
        result = _write_dirty_inputs(tx, args, result, checked)
    return result


def _forward_inlined(tx, cls_vt, args: list, kwargs: dict):
    """apply where no gradient can flow: the forward traced into the graph (its in-place ops
    stay in-place ops), and an input it returns given back as eager's apply gives it."""
    from .calls import call

    cls = cls_vt.cls
    forward = _method(tx, cls_vt, "forward")
    flags = V.TupleVT([V.ConstVT(False) for _ in args])
    ctx = V.NewObjectVT(_ForwardOnlyCtx, {"needs_input_grad": flags, **_marks()})
    if not has_setup_context(cls):
        out = call(tx, forward, [ctx, *args], kwargs)
    else:
        out = call(tx, forward, list(args), kwargs)
        if not _returned_inputs(out, args):
            return out  # setup_context only saves and marks; nothing it marks changes the result
        inputs = V.TupleVT(_with_defaults(cls.forward, args))
        call(tx, _method(tx, cls_vt, "setup_context"), [ctx, inputs, out], {})
    returned = _returned_inputs(out, args)
    if not returned:
        return out
    dirty = ctx.attrs["_ember_dirty"].items
    items = list(out.items) if isinstance(out, V.ListVT) else [out]
    for k, a in returned.items():
        # eager's apply with no gradient to record: an input that requires grad comes back as
        # a detached alias, one marked dirty as itself, any other as a new alias (view_as)
        if a.example.requires_grad:
            items[k] = tx.output.call("call_method", "detach", (a,), {})
        elif any(isinstance(d, V.TensorVT) and d.example is a.example for d in dirty):
            items[k] = a
        else:
            items[k] = tx.output.call("call_method", "view_as", (a, a), {})
    return _same_structure(out, items)


def _returned_inputs(out, args) -> dict:
    """{output position: the argument VT it is} for outputs that are arguments themselves."""
    items = out.items if isinstance(out, V.ListVT) else [out]
    found = {}
    for k, o in enumerate(items):
        if isinstance(o, V.TensorVT):
            for a in args:
                if isinstance(a, V.TensorVT) and a.example is o.example:
                    found[k] = a
                    break
    return found


def _same_structure(out, items: list):
    if not isinstance(out, V.ListVT):
        return items[0]
    if isinstance(out, V.NamedTupleVT):
        return V.NamedTupleVT(out.cls, items, out.fields)
    return V.ListVT(items, is_tuple=out.is_tuple)


def _check_class(cls) -> None:
    name = cls.__qualname__
    if cls.backward is _BASE.backward and getattr(cls, "vjp", _BASE.vjp) is _BASE.vjp:
        raise Unsupported(f"custom autograd.Function {name} defines no backward")
    own = cls.__mro__[: cls.__mro__.index(_BASE)]
    if any("apply" in klass.__dict__ for klass in own):
        raise Unsupported(f"custom autograd.Function {name} overrides apply")


def _method(tx, cls_vt, name: str):
    """cls.<name> (a staticmethod's function), guarded by identity when the class has a source:
    the graph node runs the class's methods as they are at run time."""
    source = AttrSource(cls_vt.source, name) if cls_vt.source is not None else None
    return tx.builder.wrap(getattr(cls_vt.cls, name), source)


def _backward_code(tx, cls_vt):
    """The backward to trace: `@once_differentiable`'s wrapper only runs the user's function
    under no_grad and checks that no double backward is asked for."""
    name = "backward" if cls_vt.cls.backward is not _BASE.backward else "vjp"
    bw = _method(tx, cls_vt, name)
    inner = getattr(bw.fn, "__wrapped__", None)
    if inner is not None and bw.fn.__code__.co_filename == torch.autograd.function.__file__:
        source = AttrSource(bw.source, "__wrapped__") if bw.source is not None else None
        return tx.builder.wrap(inner, source)
    return bw


@dataclasses.dataclass
class _Checked:
    """What the checking trace learnt: the forward's output sizes (`OutputGraph.call`'s `sym`),
    the inputs marked dirty (argument position -> the output position returning it) and the
    outputs marked non-differentiable."""

    syms: object
    dirty: dict
    non_differentiable: set
    rebound: set = dataclasses.field(default_factory=set)  # dirty inputs the new value replaces
    written_back: set = dataclasses.field(default_factory=set)  # those that are frame inputs


def _check_traceable(tx, cls_vt, args, kwargs) -> _Checked:
    """Trace the forward and the backward once (grad mode off, as torch runs them). A forward
    that marks inputs dirty runs on private copies of the arguments' values: its writes must not
    change the values the rest of the trace sees."""
    from .calls import call, unpack

    cls = cls_vt.cls
    name = cls.__qualname__
    private = _may_mark_dirty(cls)
    if private:
        args = [_private(a) for a in args]
        kwargs = {k: _private(v) for k, v in kwargs.items()}
    flags = V.TupleVT([V.ConstVT(isinstance(a, V.TensorVT) and a.example.requires_grad)
                       for a in args])  # fmt: skip
    ctx = V.NewObjectVT(_CheckedCtx, {"needs_input_grad": flags, **_marks()})
    forward = _method(tx, cls_vt, "forward")
    if has_setup_context(cls):
        if kwargs:
            raise Unsupported(f"keyword arguments to {name}.apply")
        out = call(tx, forward, list(args), {})
        inputs = V.TupleVT(_with_defaults(cls.forward, args))  # what torch's apply passes
        call(tx, _method(tx, cls_vt, "setup_context"), [ctx, inputs, out], {})
    else:
        out = call(tx, forward, [ctx, *args], kwargs)
    outs = unpack(tx, out) if isinstance(out, V.ListVT) else [out]
    for o in outs:
        if not isinstance(o, (V.TensorVT, V.ConstVT)):
            raise Unsupported(f"{name}.forward returns a {type(o).__name__}")
    if ctx.attrs["_ember_dirty"].items and not private:
        raise Unsupported(f"{name} marks an input dirty from a function its forward calls: "
                          "call ctx.mark_dirty in forward or setup_context itself")  # fmt: skip
    dirty = _dirty_outputs(name, ctx.attrs["_ember_dirty"].items, args, outs)
    non_differentiable = {k for m in ctx.attrs["_ember_non_differentiable"].items
                          for k in _positions(m, outs)}  # fmt: skip
    syms = [o.sym if isinstance(o, V.TensorVT) else None for o in outs]
    grads = [tx.output.call("call_function", torch.ones_like, (o,), {})
             if isinstance(o, V.TensorVT) else V.ConstVT(None) for o in outs]  # fmt: skip
    result = call(tx, _backward_code(tx, cls_vt), [ctx, *grads], {})
    results = unpack(tx, result) if isinstance(result, V.ListVT) else [result]
    for r in results:
        if not (isinstance(r, V.TensorVT) or (isinstance(r, V.ConstVT) and r.value is None)):
            raise Unsupported(f"{name}.backward returns a {type(r).__name__}, not a tensor or None")
    return _Checked(syms if isinstance(out, V.ListVT) else syms[0], dirty, non_differentiable)


def _may_mark_dirty(cls) -> bool:
    """Whether cls's forward or setup_context code names `mark_dirty` (copying every argument's
    value for every call would double the examples' memory while tracing)."""

    def names(fn) -> set:
        fn = inspect.unwrap(fn)
        found, codes = set(), [getattr(fn, "__code__", None)]
        while codes:
            code = codes.pop()
            if code is not None:
                found.update(code.co_names)
                codes += [c for c in code.co_consts if isinstance(c, type(code))]
        return found

    fns = [cls.forward] + ([cls.setup_context] if has_setup_context(cls) else [])
    return any("mark_dirty" in names(fn) for fn in fns)


def _private(vt):
    """`vt` with a private copy of its example value (same node, same sizes)."""
    from .output import _example_clone

    if not isinstance(vt, V.TensorVT):
        return vt
    mine = copy.copy(vt)
    mine.example = _example_clone(vt.example)
    return mine


def _positions(vt, items) -> list:
    """Where the tensor `vt` (by its value's identity) is among `items`."""
    if not isinstance(vt, V.TensorVT):
        return []
    return [k for k, o in enumerate(items)
            if isinstance(o, V.TensorVT) and o.example is vt.example]  # fmt: skip


def _dirty_outputs(name: str, marked, args, outs) -> dict:
    """{argument position: output position} for the inputs the forward marked dirty, with the
    checks eager's apply makes on them."""
    dirty = {}
    for m in marked:
        where = _positions(m, args)
        if not where:
            raise Unsupported(f"{name}.forward marks dirty a tensor that is not one of its "
                              "(positional) arguments")  # fmt: skip
        for i in where:
            returned = _positions(args[i], outs)
            if not returned:  # eager's own error
                raise Unsupported(f"{name}.forward: some elements marked as dirty during the "
                                  "forward method were not returned as output (the inputs that "
                                  "are modified inplace must all be outputs of the Function)")
            if len(returned) > 1:
                raise Unsupported(f"{name}.forward returns the input it marks dirty twice")
            dirty[i] = returned[0]
    for i in dirty:
        storage = _storage(args[i].example)
        for k, o in enumerate(outs):
            if k != dirty[i] and isinstance(o, V.TensorVT) and _storage(o.example) == storage:
                raise Unsupported(f"{name}.forward returns a view of the input it marks dirty")
    return dirty


def _storage(t: torch.Tensor):
    return (t.device, t.untyped_storage().data_ptr())


# -- inputs marked dirty ----------------------------------------------------------------------
# The graph node never writes its arguments (functional_apply.py hands the user's forward copies
# of the dirty ones); the write happens here, one of three ways. A value that carries no
# gradient (nor did the input) is written into the input with `copy_`: an in-place op like any
# other, which aot_autograd functionalises (and copies back into a graph input). A value that
# carries a gradient takes the tensor's place: its TensorVT is pointed at the node's output, so
# every name and container holding it reads the new value, and `apply(y) is y` holds, as in
# eager. (torch's `copy` has no derivative formula, so aot_autograd cannot trace a `copy_` of a
# value that needs a gradient.) That is only sound for a tensor that nothing else views. When
# that tensor is an input of the frame, the graph reads the new value from then on and, after
# the graph, `write_dirty_input` copies it into the caller's tensor with autograd recording the
# copy; the frame gives back the caller's tensor wherever it returns or stores it, and the
# placeholder is tagged so that aot_autograd saves no reference to the overwritten input. The
# other cases run eagerly.


def _check_dirty(tx, cls, args, checked: _Checked) -> None:
    name = cls.__qualname__
    inputs = {id(vt.example) for _, _, vt in tx.output.inputs}
    for i in checked.dirty:
        a = args[i]
        ex = a.example
        what = f"{name}.forward marks argument {i} dirty (in-place)"
        if tx.output.graph is not tx.output.root_graph:  # bodies must not write their inputs
            raise Unsupported(f"{what} inside a control-flow body")
        if any(j != i and isinstance(b, V.TensorVT) and _storage(b.example) == _storage(ex)
               for j, b in enumerate(args)):  # fmt: skip
            raise Unsupported(f"{what} and another argument shares its memory")
        differentiable = checked.dirty[i] not in checked.non_differentiable and (
            ex.is_floating_point() or ex.is_complex())
        if not differentiable and not ex.requires_grad:
            if any(t.requires_grad for t in _aliases(tx, a)):  # as `y.detach().add_(1)`
                raise Unsupported(f"{what}, a tensor sharing memory with one that requires grad: "
                                  "the write would change a value autograd tracks")  # fmt: skip
            continue  # written with copy_
        if not differentiable:
            raise Unsupported(f"{what} and non-differentiable while it requires grad: eager "
                              "keeps its autograd history with new data, which a functional "
                              "graph cannot express")  # fmt: skip
        if ex._base is not None and id(ex._base) in inputs:
            raise Unsupported(f"{what}, a view of an input of the compiled frame: the write "
                              "would have to reach the caller's tensor through the view")
        frame_input = a.written_back or id(ex) in inputs
        leaf = a.real if frame_input else ex  # (an input's example is a leaf of the trace's own)
        if leaf.is_leaf and leaf.requires_grad:  # eager's error, which it then raises
            raise Unsupported(f"{what}: a leaf Variable that requires grad has been used in an "
                              "in-place operation")  # fmt: skip
        if ex._base is not None or _aliases(tx, a):
            raise Unsupported(f"{what}, a tensor that is a view or that other tensors view: "
                              "the write would have to reach them too")  # fmt: skip
        if frame_input and tx.output.exporting:
            raise Unsupported(f"{what}, an input of the exported program")
        checked.rebound.add(i)
        if frame_input:
            checked.written_back.add(i)


def _aliases(tx, vt: V.TensorVT) -> list:
    """The values of other nodes the program still holds that share `vt`'s memory: views, and
    the results of in-place ops on it (`z = y.mul_(2)`: z's node has y's very value)."""
    storage = _storage(vt.example)
    return [v for node, v in list(tx.output._values.items())
            if node is not vt.node and isinstance(v, torch.Tensor) and _storage(v) == storage]


def _write_dirty_inputs(tx, args, result, checked: _Checked):
    """The dirty inputs written with the node's results; apply's result with each dirty output
    replaced by its input (eager returns the input itself)."""
    items = list(result.items) if isinstance(result, V.ListVT) else [result]
    for i, k in checked.dirty.items():
        a, new = args[i], items[k]
        if i in checked.written_back:
            caller = copy.copy(a)  # the caller's tensor, rebuilt from its source
            if a.node.op == "placeholder":  # written the first time
                a.node.meta[WRITTEN_AFTER_CALL_META_KEY] = True  # aot_autograd saves it for none
                # the backend's example input stays the input's value (`a` will hold the new one)
                tx.output.inputs = [(s, t, caller if vt is a else vt)
                                    for s, t, vt in tx.output.inputs]  # fmt: skip
            write = tx.builder.wrap(write_dirty_input, None)
            where = V.ConstVT(tx.output.where())
            tx.output.record_side_effect("call", write, [caller, new, where], {})
            a.written_back = True  # rebuilt as the caller's tensor, which the call writes
        if i in checked.rebound:
            a.node, a.example, a.sym = new.node, new.example, new.sym
        else:
            tx.output.call("call_method", "copy_", (a, new), {})
        items[k] = a
    return _same_structure(result, items)


def _with_defaults(forward, args) -> list:
    from .calls import wrap_const

    try:
        bound = inspect.signature(forward).bind(*args)
    except (TypeError, ValueError) as e:
        raise Unsupported(f"{forward.__qualname__}: {e}") from None
    bound.apply_defaults()
    return [a if isinstance(a, V.VT) else wrap_const(a) for a in bound.args]


# How many custom Function bodies this thread is tracing to check them.
_CHECKING = threading.local()


def _not_inside_a_function_body(what: str) -> None:
    # At run time the user's forward and backward run under a torch.func.functionalize of
    # their own (functional_apply.py), where torch refuses custom Functions and checkpoint.
    if getattr(_CHECKING, "depth", 0):
        raise Unsupported(f"{what} called inside a custom autograd.Function's forward or backward")


@contextlib.contextmanager
def _thrown_away(tx, cls):
    """Trace with grad mode off, then drop the nodes the trace added. What the trace did must
    stay inside it: new graph inputs or Python side effects break the graph."""
    out = tx.output
    before = set(out.graph.nodes)
    effects = _effects(out)
    grad = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    _CHECKING.depth = getattr(_CHECKING, "depth", 0) + 1
    try:
        yield
    finally:
        _CHECKING.depth -= 1
        torch._C._set_grad_enabled(grad)
    added = [n for n in out.graph.nodes if n not in before]
    if any(n.op == "placeholder" for n in added):
        raise Unsupported(f"custom autograd.Function {cls.__qualname__} reads a tensor that is "
                          "not one of its arguments (pass it to apply)")  # fmt: skip
    if _effects(out) != effects:
        raise Unsupported(f"custom autograd.Function {cls.__qualname__} has Python side effects")
    for n in reversed(added):
        out.graph.erase_node(n)
    if out.shape_env is not None:  # sizes computed by the dropped nodes are computed again
        erased = set(added)
        out.shape_env.nodes = {e: n for e, n in out.shape_env.nodes.items() if n not in erased}


def _effects(out) -> tuple:
    """What the frame will do to Python objects: effects, attribute writes, and the contents of
    the containers it changes (a thrown-away tensor must not stay in one)."""
    contents = []
    for key, vt in out.mutated.items():
        items = getattr(vt, "items", None)
        if isinstance(items, dict):
            items = [*items, *items.values()]
        contents.append((key, tuple(map(id, items or ()))))
    return len(out.side_effects), len(out.pending_attrs), tuple(contents)


# -- torch.utils.checkpoint -------------------------------------------------------------------
_CHECKPOINT_OPTIONS = ("use_reentrant", "preserve_rng_state", "determinism_check", "debug")


def call_checkpoint(tx, args: list, kwargs: dict):
    """`checkpoint(fn, *args, use_reentrant=..., **fn_kwargs)`: fn inlined, its nodes tagged to
    be recomputed in the backward. The results are the same as eager's; so is the RNG (random
    ops in the region run once per call, their recomputation reads the same seed)."""
    from .calls import call, const_of
    from .output import has_tensor

    if not args:
        raise Unsupported("checkpoint() without a function")
    _not_inside_a_function_body("torch.utils.checkpoint")
    kwargs = dict(kwargs)
    options = {k: const_of(kwargs.pop(k), f"checkpoint's {k}") for k in _CHECKPOINT_OPTIONS
               if k in kwargs}  # fmt: skip
    context_fn = kwargs.pop("context_fn", None)
    if context_fn is not None and getattr(context_fn, "fn", None) is not _noop_context_fn():
        raise Unsupported("checkpoint() with a context_fn")
    reentrant = options.get("use_reentrant")
    if reentrant is None:
        raise Unsupported("checkpoint() without use_reentrant (torch warns, then takes the "
                          "reentrant form): pass use_reentrant=False")  # fmt: skip
    if reentrant and kwargs:
        raise Unsupported("checkpoint(use_reentrant=True) with keyword arguments")
    fn, fargs = args[0], list(args[1:])
    if reentrant and torch.is_grad_enabled() and not has_tensor(
        fargs, lambda t: t.example.requires_grad
    ):
        # Reentrant checkpoint runs fn under no_grad when no input needs a gradient: its
        # outputs need none either, whatever fn's parameters do.
        raise Unsupported("checkpoint(use_reentrant=True) with no input that requires grad")
    before = set(tx.output.graph.nodes)
    out = call(tx, fn, fargs, kwargs)
    for n in tx.output.graph.nodes:
        if n not in before and n.op in ("call_function", "call_method", "call_module"):
            n.meta[RECOMPUTE_META_KEY] = True
    return out


def _noop_context_fn():
    return getattr(torch_checkpoint, "noop_context_fn", None)
