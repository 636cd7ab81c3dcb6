"""extern.custom_op: a user-defined operator (torch.library) kept opaque, called by its name.

A custom operator (`torch.library.custom_op`, or a `torch.library.Library("ns", "DEF")` definition
with a kernel and a fake kernel) has no decomposition: the graph keeps it as one node that names
the operator ("probe::mysin.default") and carries its arguments in schema order. The meta rule
runs the operator's fake kernel on meta tensors (so the output metadata is the user's promise,
checked against the real output while tracing); the reference calls the operator.

Mutation is functional: `mutated` lists the argument positions the operator writes (its
`mutates_args`). The reference writes clones of those arguments and returns their new values
after the operator's own tensor outputs, so the graph stays functional and the caller rebinds
the written tensors to them, as for an in-place ATen op.
"""

from __future__ import annotations

import torch

from ember.ir import TensorMeta

from ..errors import MetaMismatchError
from ..symbolic import _node_expr
from ..utils import _active_env
from .core import prim

# Namespaces of torch's own operators: these are decomposed or refused, never kept opaque.
TORCH_NAMESPACES = frozenset({
    "aten", "prims", "prim", "profiler", "quantized", "_quantized", "_c10d_functional", "c10d",
    "rngprims", "debugprims", "_test", "higher_order", "inductor", "mkldnn", "onednn", "fbgemm",
    "_inductor_test",
})  # fmt: skip


def qualified_name(func) -> str:
    """"ns::op.overload" for an OpOverload: what extern.custom_op records and resolves."""
    return f"{func._schema.name}.{func._overloadname}"


def resolve_op(name: str):
    """The OpOverload named by `qualified_name`; a clear error when it is not registered."""
    ns, _, rest = name.partition("::")
    op_name, _, overload = rest.rpartition(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), op_name), overload)
    except (AttributeError, RuntimeError):
        raise RuntimeError(
            f"custom operator {name} is not registered in this process: import the module that "
            "defines it (torch.library) before running a graph that calls it"
        ) from None


def is_custom_op(func) -> bool:
    """True for an operator defined outside torch (a torch.library user operator)."""
    return isinstance(func, torch._ops.OpOverload) and func.namespace not in TORCH_NAMESPACES


def _split(op, args):
    """Positional and keyword-only arguments of `op` from its arguments in schema order."""
    pos, kw = [], {}
    for spec, value in zip(op._schema.arguments, args):
        if spec.kwarg_only:
            kw[spec.name] = value
        else:
            pos.append(value)
    return pos, kw


def _outputs(op, out) -> list:
    if out is None:
        return []
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    for o in outs:
        if not isinstance(o, torch.Tensor):
            raise NotImplementedError(
                f"custom operator {qualified_name(op)} returns a {type(o).__name__}: only tensor "
                "outputs can be kept in a graph"
            )
    return outs


def _clone(t: torch.Tensor) -> torch.Tensor:
    c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return c.copy_(t)


def _ref(op, args, mutated=()):
    func = resolve_op(op)
    args = list(args)
    for i in mutated:
        args[i] = _clone(args[i])
    pos, kw = _split(func, args)
    outs = _outputs(func, func(*pos, **kw))
    return tuple(outs) + tuple(args[i] for i in mutated)


def _to_meta_tensor(op, m, env):
    if not isinstance(m, TensorMeta):
        return m
    if m.is_static():
        sizes, strides = tuple(int(s) for s in m.sizes), tuple(int(s) for s in m.strides)
    elif env is None:
        raise NotImplementedError(f"custom operator {op} with symbolic sizes outside a trace "
                                  "(its fake kernel needs the trace's symbols)")  # fmt: skip
    else:  # sizes as SymInts of the trace: what the fake kernel decides on them is guarded
        sizes, strides = tuple(map(env.symint, m.sizes)), tuple(map(env.symint, m.strides))
    return torch.empty_strided(sizes, strides, dtype=m.dtype, device="meta")


def _size_expr(v):
    return _node_expr(v.node) if isinstance(v, torch.SymInt) else int(v)


def _meta(op, args, mutated=()):
    func = resolve_op(op)
    metas = [a for a in _leaves(args) if isinstance(a, TensorMeta)]
    device = metas[0].device if metas else "cpu"
    env = _active_env()
    meta_args = [_map(lambda m: _to_meta_tensor(op, m, env), a) for a in args]
    pos, kw = _split(func, meta_args)
    # The fake kernel (registered for the Meta key by register_fake / impl_abstract) gives the
    # sizes, strides and dtype, symbolic where the inputs' are; the device is the inputs' (a fake
    # kernel runs on meta tensors).
    outs = _outputs(func, func(*pos, **kw))
    result = [TensorMeta(o.dtype, tuple(map(_size_expr, o.shape)),
                         tuple(map(_size_expr, o.stride())), 0, device) for o in outs]  # fmt: skip
    return tuple(result) + tuple(args[i] for i in mutated)


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def _map(fn, x):
    if isinstance(x, (list, tuple)):
        return type(x)(_map(fn, v) for v in x)
    return fn(x)


def _canon(op, args, mutated=()):
    return (op, list(args), sorted(int(i) for i in mutated)), {}


custom_op = prim(
    "custom_op",
    "(str op, Any[] args, int[] mutated=[]) -> Tensor[]",
    meta=_meta,
    ref=_ref,
    canon=_canon,
    tags=("extern", "opaque"),
    namespace="extern",
    doc="a user-defined torch.library operator, called by its qualified name: (outputs..., new "
    "values of the mutated arguments...)",
)

__all__ = ["custom_op", "is_custom_op", "qualified_name", "resolve_op"]


def _bound_arguments(func, args, kwargs) -> list:
    """Every argument of `func` in schema order, defaults filled in."""
    full = []
    for i, spec in enumerate(func._schema.arguments):
        if i < len(args):
            full.append(args[i])
        elif spec.name in kwargs:
            full.append(kwargs[spec.name])
        elif spec.has_default_value():
            full.append(spec.default_value)
        else:
            raise TypeError(f"{qualified_name(func)}: missing argument {spec.name!r}")
    return full


def record_custom_op(record, func, args, kwargs, check_tensor):
    """Record a call of the user operator `func` through `record(prim, args, kwargs)` (a tracer's
    record_prim). Returns (the operator's result as it returns it, the tensors it writes, their
    new values). `check_tensor(t)` is called on each written tensor before anything runs."""
    full = _bound_arguments(func, args, kwargs)
    mutated = []
    for i, spec in enumerate(func._schema.arguments):
        if spec.alias_info is None or not spec.alias_info.is_write or full[i] is None:
            continue
        if not isinstance(full[i], torch.Tensor):
            raise NotImplementedError(f"custom operator {qualified_name(func)} writes its argument "
                                      f"{spec.name!r}, a list of tensors: only tensor arguments "
                                      "can be functionalised")  # fmt: skip
        mutated.append(i)
    written = [full[i] for i in mutated]
    for t in written:
        check_tensor(t)
    try:
        results = list(record(custom_op, (qualified_name(func), full, mutated), {}))
    except MetaMismatchError as e:
        raise MetaMismatchError(f"custom operator {qualified_name(func)}: its fake kernel "
                                f"(register_fake) disagrees with its kernel: {e}") from None
    n_out = len(results) - len(mutated)
    outs, new_values = results[:n_out], results[n_out:]
    returns = func._schema.returns
    if not returns:
        result = None
    elif len(returns) == 1 and str(returns[0].type).startswith("List"):
        result = outs
    elif len(returns) == 1:
        result = outs[0]
    else:
        result = tuple(outs)
    return result, written, new_values
