"""The decomposition table: ATen OpOverload -> a Python function written in prims and ATen ops."""

from __future__ import annotations

import inspect
from typing import Callable, Optional

import torch

# One table, keyed by OpOverload. The tracer looks an op up here, calls the function on the op's
# arguments, and re-enters itself for every ATen op the function calls.
DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {}


def _is_functional_tensor_op(schema) -> bool:
    """True for overloads we decompose from a packet: no out=/in-place args, a Tensor result,
    no named-dimension (Dimname) arguments."""
    if schema.is_mutable:
        return False
    if any("Dimname" in str(a.type) for a in schema.arguments):
        return False
    returns = [str(r.type) for r in schema.returns]
    return any("Tensor" in r for r in returns)


def _binds(fn: Callable, schema) -> bool:
    """True when `fn` accepts the schema's arguments by the schema's names and positions."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    names = {p.name for p in params}
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    schema_pos = [a for a in schema.arguments if not a.kwarg_only]
    if len(schema_pos) > len(positional) and not var_pos:
        return False
    # Every argument must be one the function names (var.default's `unbiased` is not var's
    # `correction`), unless the function takes **kwargs and *args.
    if not (var_kw and var_pos) and any(a.name not in names for a in schema.arguments):
        return False
    if not var_pos and any(p.name != a.name for p, a in zip(positional, schema_pos)):
        return False
    # A required parameter the schema never passes means the function is for another overload.
    schema_names = {a.name for a in schema.arguments}
    for i, p in enumerate(positional):
        if p.default is p.empty and i >= len(schema_pos) and p.name not in schema_names:
            return False
    return True


def _overloads(op) -> list[torch._ops.OpOverload]:
    if isinstance(op, torch._ops.OpOverload):
        return [op]
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    raise TypeError(f"register_decomposition expects ATen ops, got {op!r}")


def register_decomposition(*ops) -> Callable[[Callable], Callable]:
    """Register the decorated function for each op; a packet registers the overloads it handles.

    An explicit OpOverload is registered as given (in-place and out= variants included); from an
    OpOverloadPacket only the functional tensor overloads whose arguments the function binds.
    """

    def deco(fn: Callable) -> Callable:
        for op in ops:
            explicit = isinstance(op, torch._ops.OpOverload)
            for overload in _overloads(op):
                schema = overload._schema
                if not explicit and not (_is_functional_tensor_op(schema) and _binds(fn, schema)):
                    continue
                DECOMPOSITIONS[overload] = fn
        return fn

    return deco


def get_decomposition(op: torch._ops.OpOverload) -> Optional[Callable]:
    """The decomposition registered for `op`, or None."""
    return DECOMPOSITIONS.get(op)
