"""Which parameters of an artifact's Triton kernels are divisible by 16 at every launch.

Triton's JIT specialises a launch on pointers that are 16-byte aligned and integers that are
multiples of 16 (the "tt.divisibility" attribute), which is what lets it emit vector and
asynchronous (cp.async) loads. A cubin compiled ahead of time sees no argument values, so the
promise is derived here from the launch plan, per kernel, for every launch the C++ wrapper makes
(cpp_wrapper's `kernel_call` passes each buffer's data pointer and each size expression):

- a pointer is the storage base of the buffer's root plus its element offset times its itemsize.
  Pool allocations (intermediates, outputs) and constants (a package's weights start every
  constant's storage at a 64-byte boundary) have aligned bases, so such a pointer is aligned when
  offset * itemsize is provably a multiple of 16. An input's storage base is the caller's and
  unknown; what the runtime guarantees instead is that the input's own data pointer is 16-byte
  aligned (ember_runtime.h: a misaligned input is run from an aligned copy), so a pointer into
  an input is aligned when (offset - the input's offset) * itemsize is a multiple of 16.
- an integer is divisible when its expression provably is for every value of its symbols: a
  polynomial whose integer coefficients are all multiples of 16 (symbol ranges carry no
  divisibility, so a lone symbol never is).
"""

from __future__ import annotations

import sympy

from ember.ir import CompiledArtifact
from ember.ir.symbols import exact_quotient, expr_from_json

ALIGN = 16  # bytes for a pointer, and the divisor for an integer, that Triton specialises on
_POOLED = ("intermediate", "output", "constant")


def multiple_of(expr, n: int = ALIGN) -> bool:
    """Is the integer expression `expr` a multiple of n for every integer value of its symbols?
    (every coefficient of its expansion is: ember.ir's exact_quotient)"""
    return exact_quotient(expr, n) is not None


def _expr(value):
    """A step's integer argument (int, {"expr": e} or ember.ir's expression JSON) as sympy, or
    None when it is not an integer expression."""
    if isinstance(value, (bool, float)):
        return None
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, dict) and set(value) == {"expr"}:
        value = value["expr"]
    try:
        return expr_from_json(value)
    except (TypeError, ValueError, KeyError):
        return None


def _ref(value):
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"node"}:
        return value["node"]
    return None


class _Layouts:
    """Each buffer's root (storage owner) and element offset, as the C++ wrapper tracks them while
    it walks the plan (a view step re-points a buffer at its source's storage)."""

    def __init__(self, artifact: CompiledArtifact):
        self.kind = {b.name: b.kind for b in artifact.buffers}
        self.itemsize = {b.name: b.meta.dtype.itemsize for b in artifact.buffers}
        self.offset = {b.name: b.meta.storage_offset for b in artifact.buffers}
        self.root = {b.name: b.name for b in artifact.buffers}

    def view(self, step) -> None:
        src, out = _ref(step.args[0]), step.outputs[0]
        if src not in self.root or out not in self.root:
            return
        if len(step.args) > 1 and step.args[1] is not None:
            self.offset[out] = _expr(step.args[1][2])
        self.root[out] = self.root[src]

    def aligned(self, name) -> bool:
        """Is the data pointer the wrapper passes for buffer `name` 16-byte aligned?"""
        if name not in self.root:
            return False
        root = self.root[name]
        if self.offset[name] is None:
            return False
        if self.kind[root] in _POOLED:
            start = self.offset[name]
        elif self.kind[root] == "input":
            start = self.offset[name] - self.offset[root]
        else:
            return False
        return multiple_of(start * self.itemsize[name])


def divisible_args(artifact: CompiledArtifact) -> dict[str, tuple[int, ...]]:
    """For each Triton kernel the plan launches, the indices (in its arg_types order) of the
    parameters divisible by 16 at every launch: aligned pointers and multiple-of-16 integers."""
    types = {k.name: k.arg_types for k in artifact.kernels if k.language == "triton"}
    layouts = _Layouts(artifact)
    found: dict[str, set[int]] = {}
    for step in artifact.steps:
        if step.kind == "view":
            layouts.view(step)
        if step.kind != "kernel" or step.target not in types:
            continue
        arg_types = types[step.target]
        if len(step.args) != len(arg_types):
            found[step.target] = set()
            continue
        here = set()
        for i, (value, ty) in enumerate(zip(step.args, arg_types)):
            if ty.startswith("*"):
                ok = layouts.aligned(_ref(value))
            elif ty.lstrip("u").startswith("i") and ty != "i1":
                e = _expr(value)
                ok = e is not None and multiple_of(e)
            else:
                ok = False
            if ok:
                here.add(i)
        found[step.target] = found[step.target] & here if step.target in found else here
    return {name: tuple(sorted(s)) for name, s in found.items()}


__all__ = ["ALIGN", "divisible_args", "multiple_of"]
