"""User operators (torch.library) as single graph nodes, opaque to the tracer.

A call of a `torch.library.custom_op` function, or of `torch.ops.<ns>.<op>` for an operator
defined outside torch (a `Library("ns", "DEF")` definition), is recorded as one call_function
node whose target is the operator itself (the `OpOverload` of a custom_op function); its output
metadata comes from running it on the example values. The callable is guarded by identity where
it was read (a global, an attribute of `torch.ops.<ns>`). Backends see the operator as one op:
aot_autograd/primtorch keep it as `extern.custom_op`, inductor calls it from its wrapper.

An operator called where autograd would need its gradient (grad mode on, a tensor argument
that requires grad) but that has no autograd formula breaks the graph there, naming the
operator: eager runs it, and torch raises its own error if the backward reaches it.
"""

from __future__ import annotations

import torch

from . import variables as V
from .exc import Unsupported

# Namespaces of torch's own operators (recorded as any torch op is); primtorch's prims/custom.py
# keeps the same list (dynamo imports ember.ir only).
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "profiler", "quantized", "_c10d_functional",
                               "c10d", "_quantized", "rngprims", "debugprims", "higher_order",
                               "inductor", "mkldnn", "onednn", "fbgemm"})  # fmt: skip


def _opdef_overload(fn):
    """The OpOverload behind a `torch.library.custom_op` function object, else None."""
    if type(fn).__name__ != "CustomOpDef":
        return None
    op = getattr(fn, "_opoverload", None)
    return op if isinstance(op, torch._ops.OpOverload) else None


def user_op_target(fn):
    """The graph target for a call of `fn` when it is a user operator, else None."""
    op = _opdef_overload(fn)
    if op is not None:
        return op
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        namespace = getattr(fn, "namespace", None) or fn._qualified_op_name.split("::")[0]
        if namespace not in _TORCH_NAMESPACES:
            return fn
    return None


def _qualname(op) -> str:
    if isinstance(op, torch._ops.OpOverload):
        return op._schema.name
    return op._qualified_op_name


def has_autograd_formula(op) -> bool:
    """Whether autograd can differentiate through the user operator `op`."""
    name = _qualname(op)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(name, "CompositeImplicitAutograd"):
        return True  # decomposes into differentiable ops
    try:
        from torch._library.custom_ops import OPDEFS  # where custom_op keeps its definitions
    except ImportError:  # pragma: no cover (older torch)
        OPDEFS = {}
    opdef = OPDEFS.get(name)
    if opdef is not None:  # custom_op always registers an Autograd kernel; the formula may lack
        return getattr(opdef, "_backward_fn", None) is not None
    return any(has(name, key) for key in ("Autograd", "AutogradCPU", "AutogradCUDA"))


def call_user_op(tx, target, args, kwargs) -> V.VT:
    """`target(*args, **kwargs)` for a user operator: one node, or a break (see module doc)."""
    from .output import has_tensor

    if torch.is_grad_enabled() and has_tensor((args, kwargs), lambda t: t.example.requires_grad):
        if not has_autograd_formula(target):
            raise Unsupported(f"custom operator {_qualname(target)} needs a gradient here but has "
                              "no autograd formula (register one with "
                              "torch.library.register_autograd)")  # fmt: skip
    return tx.output.call("call_function", target, tuple(args), kwargs)
