"""The graph node that calls a custom torch.autograd.Function (the user's class) at run time.

Run plainly (the eager backend), the node is `cls.apply(*args)`. Run under
`torch.func.functionalize`, which is how ember.aot_autograd traces a graph, torch's `apply`
cannot work: it refuses a Function without `setup_context` and, with one, has no functionalize
rule; and torch's autograd sits below that transform, so the functional tensors it sees have no
gradient history. So the node unwraps its functional tensors and runs, one transform level down
(where autograd sees the real tensors and records a backward node for the engine to run), a
generated Function whose forward and backward run the user's under a functionalize of their own:
views written in place inside them become functional ops before the tracer sees them. What the
user's code saves or marks on its ctx is carried over to the real ctx, unwrapped.
"""

from __future__ import annotations

import inspect
import weakref

import torch
from torch._C import _functorch

_BASE_SETUP_CONTEXT = torch.autograd.Function.setup_context


class AutogradFunctionCall:
    """Graph target standing for `cls.apply(*args, **kwargs)`. `dirty`: the positions of the
    arguments the forward writes in place (`ctx.mark_dirty`); the node hands the forward copies
    of them, so it never writes its arguments: its outputs are their new values (dynamo writes
    them back, autograd_function.py)."""

    __module__ = __name__

    def __init__(self, cls: type, dirty: tuple = ()):
        self.cls = cls
        self.dirty = tuple(dirty)
        written = "".join(f"_{i}" for i in self.dirty)
        self.__name__ = self.__qualname__ = f"autograd_function_{cls.__name__}" + (
            f"_dirty{written}" if self.dirty else "")

    def __call__(self, *args, **kwargs):
        if not _under_functionalize():
            if not self.dirty:
                return self.cls.apply(*args, **kwargs)
            args = list(_bound_args(self.cls, args, kwargs))
            for i in self.dirty:  # recorded by autograd: the copy's gradient reaches the input
                args[i] = args[i].clone()
            return self.cls.apply(*args)
        args = _bound_args(self.cls, args, kwargs)
        return _one_level_down(_functionalized(self.cls, self.dirty).apply, *args)

    def __repr__(self):
        dirty = f", dirty={self.dirty}" if self.dirty else ""
        return f"AutogradFunctionCall({self.cls.__module__}.{self.cls.__qualname__}{dirty})"


def _under_functionalize() -> bool:
    if not torch._C._are_functorch_transforms_active():
        return False
    top = _functorch.peek_interpreter_stack()
    return top is not None and top.key() == _functorch.TransformType.Functionalize


def _one_level_down(fn, *args):
    """fn(*args) below the innermost functionalize: its functional tensors unwrapped, the
    results wrapped again."""
    level = _functorch.current_level()
    args = _unwrap_functional(args)
    layer = _functorch.pop_dynamic_layer_stack()
    try:
        out = fn(*args)
    finally:
        _functorch.push_dynamic_layer_stack(layer)
    return _wrap_functional(out, level)


def _wrap_functional(x, level):
    if isinstance(x, torch.Tensor):
        return _functorch._wrap_functional_tensor(x, level)
    if isinstance(x, (tuple, list)):
        return type(x)(_wrap_functional(i, level) for i in x)
    return x


def _unwrap_functional(x):
    if isinstance(x, torch.Tensor) and _functorch.is_functionaltensor(x):
        torch._sync(x)  # pending writes through views land in the value first
        return torch._from_functional_tensor(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_unwrap_functional(i) for i in x)
    if isinstance(x, dict):
        return {k: _unwrap_functional(v) for k, v in x.items()}
    return x


def has_setup_context(cls) -> bool:
    """Whether `cls` is of the form forward(*args) + setup_context(ctx, inputs, output)."""
    return getattr(cls, "setup_context", _BASE_SETUP_CONTEXT) is not _BASE_SETUP_CONTEXT


def _bound_args(cls, args, kwargs) -> tuple:
    """Positional arguments as torch's apply passes them to the forward (the setup_context form
    binds keywords and defaults; the other form takes positional ones only)."""
    if not has_setup_context(cls):
        if kwargs:
            raise TypeError(f"{cls.__qualname__}.apply() takes no keyword arguments")
        return tuple(args)
    bound = inspect.signature(cls.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    if bound.kwargs:
        raise TypeError(f"{cls.__qualname__}.forward has keyword-only parameters")
    return tuple(bound.args)


class _Ctx:
    """The ctx the user's code sees inside the generated Function's functionalize: it records
    what is saved and marked, for the generated Function to pass to the real ctx."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.__dict__["_ember_record"] = {"saved": (), "non_differentiable": [],
                                          "materialize": True}  # fmt: skip

    def save_for_backward(self, *tensors):
        self._ember_record["saved"] = tensors

    def mark_non_differentiable(self, *tensors):
        self._ember_record["non_differentiable"].extend(tensors)

    def mark_dirty(self, *tensors):
        pass  # the dirty inputs are copies the forward got (dynamo found which when tracing)

    def set_materialize_grads(self, value):
        self._ember_record["materialize"] = bool(value)

    def user_attributes(self) -> dict:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_ember_record", "needs_input_grad", "saved_tensors")}  # fmt: skip


_GENERATED: "weakref.WeakKeyDictionary[type, dict]" = weakref.WeakKeyDictionary()


def _functionalized(cls: type, dirty: tuple) -> type:
    """A Function computing what `cls` computes, its forward and backward each functionalized;
    the forward writes copies of the `dirty` arguments, never the arguments."""
    by_dirty = _GENERATED.setdefault(cls, {})
    if dirty not in by_dirty:
        by_dirty[dirty] = _generate(cls, dirty)
    return by_dirty[dirty]


def _generate(user_cls: type, dirty: tuple) -> type:
    setup = has_setup_context(user_cls)
    # Weakly: the generated class is the value of a weak-keyed cache entry for user_cls.
    user_ref = weakref.ref(user_cls)
    name, qualname = user_cls.__name__, user_cls.__qualname__

    def forward(ctx, *args):
        cls = user_ref()
        user_ctx = _Ctx(ctx.needs_input_grad)
        marked = []

        def body(*inputs):
            # copies inside the functionalize: the writes become functional ops on them, and
            # nothing is written back into the arguments when it ends
            inputs = tuple(t.clone() if i in dirty else t for i, t in enumerate(inputs))
            if setup:
                out = cls.forward(*inputs)
                cls.setup_context(user_ctx, inputs, out)
            else:
                out = cls.forward(user_ctx, *inputs)
            record = user_ctx._ember_record
            outs = out if isinstance(out, tuple) else (out,)
            ids = {id(t) for t in record["non_differentiable"]}
            marked.extend(i for i, o in enumerate(outs) if id(o) in ids)
            return out, tuple(record["saved"]), user_ctx.user_attributes()

        out, saved, attributes = torch.func.functionalize(body)(*args)
        ctx.save_for_backward(*saved)
        ctx.set_materialize_grads(user_ctx._ember_record["materialize"])
        outs = out if isinstance(out, tuple) else (out,)
        if marked:
            ctx.mark_non_differentiable(*(outs[i] for i in marked))
        ctx.ember_attributes = attributes
        return out

    def backward(ctx, *grads):
        cls = user_ref()

        def body(saved, *grads):
            user_ctx = _Ctx(ctx.needs_input_grad)
            user_ctx.__dict__.update(ctx.ember_attributes)
            user_ctx.saved_tensors = tuple(saved)
            return cls.backward(user_ctx, *grads)

        if not _under_functionalize():
            return torch.func.functionalize(body)(ctx.saved_tensors, *grads)
        # The engine runs this inside the trace's functionalize of the whole backward, with
        # gradients of that level: run one level down, as the forward ran.
        return _one_level_down(torch.func.functionalize(body), ctx.saved_tensors, *grads)

    return type(f"Functionalized{name}", (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward),
        "__module__": __name__, "__qualname__": f"Functionalized{qualname}",
    })  # fmt: skip


def write_dirty_input(target: torch.Tensor, value: torch.Tensor, where: str) -> None:
    """After a graph: write the new value of a frame input that a custom Function at `where`
    marked dirty into the caller's tensor, autograd recording the write (eager's apply rebases
    the input's history there). Leafness is not guarded: a leaf that requires grad, where the
    trace saw none, gets eager's error."""
    if target.is_leaf and target.requires_grad:
        raise RuntimeError("a leaf Variable that requires grad has been used in an in-place "
                           f"operation (ctx.mark_dirty of the custom autograd.Function at {where})")
    with torch.enable_grad():
        target.copy_(value)
