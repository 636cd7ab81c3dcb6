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
import inspect
import threading

import torch
import torch.utils.checkpoint as torch_checkpoint

from ember.ir import RECOMPUTE_META_KEY

from . import variables as V
from .exc import Unsupported
from .functional_apply import AutogradFunctionCall, has_setup_context
from .source import AttrSource

_BASE = torch.autograd.Function
CHECKPOINT = torch_checkpoint.checkpoint


# -- the ctx objects traced code sees ---------------------------------------------------------
class _ForwardOnlyCtx:
    """The `ctx` of a forward where no input needs a gradient: what it saves for the backward is
    never read, so saving and marking do nothing."""

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


class _CheckedCtx:
    """The `ctx` the forward and backward are traced with, to check them: it keeps what they
    save and mark (attributes they set land on it as on torch's ctx)."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        pass  # the real apply marks them; the check only needs the forward to run

    def mark_dirty(self, *tensors):
        self._ember_dirty = True

    def set_materialize_grads(self, value):
        pass


# -- autograd.Function ------------------------------------------------------------------------
def call_autograd_function(tx, cls_vt: V.ClassVT, args: list, kwargs: dict):
    """`cls.apply(*args)` for a torch.autograd.Function subclass (`cls_vt`)."""
    from .calls import call
    from .output import has_tensor

    cls = cls_vt.cls

    _not_inside_a_function_body(f"custom autograd.Function {cls.__qualname__}")
    if not (torch.is_grad_enabled()
            and has_tensor((args, kwargs), lambda t: t.example.requires_grad)):  # fmt: skip
        # No gradient can flow (inference, or grad mode off: both guarded): apply is its forward.
        forward = _method(tx, cls_vt, "forward")
        if has_setup_context(cls):
            return call(tx, forward, list(args), kwargs)  # setup_context only saves
        flags = V.TupleVT([V.ConstVT(False) for _ in args])
        ctx = V.NewObjectVT(_ForwardOnlyCtx, {"needs_input_grad": flags})
        return call(tx, forward, [ctx, *args], kwargs)
    _check_class(cls)
    with _thrown_away(tx, cls):
        sym = _check_traceable(tx, cls_vt, args, kwargs)
    if tx.output.shape_env is None:
        sym = None
    return tx.output.call("call_function", AutogradFunctionCall(cls), tuple(args), kwargs, sym)


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


def _check_traceable(tx, cls_vt, args, kwargs):
    """Trace the forward and the backward once (grad mode off, as torch runs them); returns
    the forward's symbolic output sizes (as OutputGraph.call takes them)."""
    from .calls import call, unpack

    cls = cls_vt.cls
    name = cls.__qualname__
    flags = V.TupleVT([V.ConstVT(isinstance(a, V.TensorVT) and a.example.requires_grad)
                       for a in args])  # fmt: skip
    ctx = V.NewObjectVT(_CheckedCtx, {"needs_input_grad": flags})
    forward = _method(tx, cls_vt, "forward")
    if has_setup_context(cls):
        if kwargs:
            raise Unsupported(f"keyword arguments to {name}.apply")
        out = call(tx, forward, list(args), {})
        inputs = V.TupleVT(_with_defaults(cls.forward, args))  # what torch's apply passes
        call(tx, _method(tx, cls_vt, "setup_context"), [ctx, inputs, out], {})
    else:
        out = call(tx, forward, [ctx, *args], kwargs)
    if ctx.attrs.get("_ember_dirty") is not None:
        raise Unsupported(f"custom autograd.Function {name} marks an input dirty (in-place)")
    outs = unpack(tx, out) if isinstance(out, V.ListVT) else [out]
    for o in outs:
        if not isinstance(o, (V.TensorVT, V.ConstVT)):
            raise Unsupported(f"{name}.forward returns a {type(o).__name__}")
    syms = [o.sym if isinstance(o, V.TensorVT) else None for o in outs]
    grads = [tx.output.call("call_function", torch.ones_like, (o,), {})
             if isinstance(o, V.TensorVT) else V.ConstVT(None) for o in outs]  # fmt: skip
    result = call(tx, _backward_code(tx, cls_vt), [ctx, *grads], {})
    results = unpack(tx, result) if isinstance(result, V.ListVT) else [result]
    for r in results:
        if not (isinstance(r, V.TensorVT) or (isinstance(r, V.ConstVT) and r.value is None)):
            raise Unsupported(f"{name}.backward returns a {type(r).__name__}, not a tensor or None")
    return syms if isinstance(out, V.ListVT) else syms[0]


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
