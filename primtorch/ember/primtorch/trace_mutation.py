"""Which ATen ops mutate which arguments, and the functional op the tracer records instead."""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten


def _written(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


@functools.lru_cache(maxsize=None)
def functional_variant(func):
    """(functional OpOverload or None, kind): kind "inplace" (add_), "out" (add.out) or
    "functional" (a mutating op like _native_batch_norm_legit whose *_functional twin returns
    the new values of the written arguments after its own outputs)."""
    schema = func._schema
    base, overload = func.overloadpacket.__name__, func._overloadname
    written = [a for a in schema.arguments if _written(a)]
    if base.endswith("_") and not base.endswith("__") and not any(a.kwarg_only for a in written):
        packet = getattr(aten, base[:-1], None)
        if packet is None:
            return None, ""
        op = getattr(packet, overload, None)
        if op is not None and not op._schema.is_mutable:
            return op, "inplace"
        # Overload names differ at times (bernoulli_.float -> bernoulli.p): match by arguments;
        # a few in-place ops have a *_functional twin instead (normal_ -> normal_functional).
        names = [a.name for a in schema.arguments]
        op = _overload_with_args(packet, names)
        twin = getattr(aten, base[:-1] + "_functional", None)
        if op is None and twin is not None:
            op = _overload_with_args(twin, names)
        return op, "inplace"
    if written and all(a.kwarg_only for a in written):
        keep = [a.name for a in schema.arguments if not _written(a)]
        op = _overload_with_args(func.overloadpacket, keep)
        return (op, "out") if op is not None else (None, "")
    packet = getattr(aten, base + "_functional", None)
    if packet is not None:
        op = getattr(packet, overload, None)
        if op is not None:
            return op, "functional"
    return None, ""


def _overload_with_args(packet, names):
    for name in packet.overloads():
        cand = getattr(packet, name)
        if not cand._schema.is_mutable and [a.name for a in cand._schema.arguments] == names:
            return cand
    return None


def mutated_arguments(func, args, kwargs) -> list:
    """The tensors `func(*args, **kwargs)` writes, in schema order."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if not _written(arg):
            continue
        if not arg.kwarg_only and i < len(args):
            value = args[i]
        else:
            value = kwargs.get(arg.name)
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out
