"""Which input sizes are dynamic: `mark_dynamic`, `dynamic=True/None/False`, automatic dynamic
(a size that changed since the frame's last compile), and export's `Dim`s.

The rules themselves are listed in symbolic.py's docstring.
"""

from __future__ import annotations

import builtins
import weakref
from typing import Optional

import torch

from .symbolic import DimRange, SpecializationError

_MARKS = "_ember_dynamic_dims"


def mark_dynamic(t: torch.Tensor, dim, min: Optional[int] = None, max: Optional[int] = None):
    """Compile `t.size(dim)` as a symbol (range [min, max]) instead of its current value."""
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    marks = dict(getattr(t, _MARKS, {}))
    for d in dims:
        d = d + t.dim() if d < 0 else d
        if not 0 <= d < t.dim():
            raise IndexError(f"mark_dynamic: dimension {d} of a {t.dim()}-d tensor")
        if min is not None and max is not None and min > max:
            raise ValueError(f"mark_dynamic: min {min} > max {max}")
        marks[d] = DimRange(lower=builtins.max(2, min or 2), upper=max)
    setattr(t, _MARKS, marks)
    return t


class Dim:
    """A named dynamic size for ember.export: `Dim("batch", min=2, max=64)`; `2 * d` is a size
    twice `d`. Inputs sharing a Dim have equal sizes."""

    scale = 1

    def __init__(self, name: str, *, min: Optional[int] = None, max: Optional[int] = None):
        self.name = name
        self.min = min
        self.max = max

    def root(self) -> "Dim":
        return self

    def __rmul__(self, k):
        if not isinstance(k, int) or k < 1:
            raise TypeError(f"a Dim can be scaled by a positive int, not {k!r}")
        return DerivedDim(self, k)

    __mul__ = __rmul__

    def __repr__(self):
        return f"Dim({self.name!r}, min={self.min}, max={self.max})"

    def __str__(self):
        return self.name


class DerivedDim:
    """`scale * dim`: a size that is always `scale` times the size of `dim`."""

    def __init__(self, dim: Dim, scale: int):
        self.dim, self.scale = dim, scale

    def root(self) -> Dim:
        return self.dim

    def __rmul__(self, k):
        return DerivedDim(self.dim, self.scale * k)

    __mul__ = __rmul__

    def __str__(self):
        return f"{self.scale} * {self.dim.name}"


def dim_range(d) -> DimRange:
    root = d.root()
    lower = 2 if root.min is None else builtins.max(2, root.min)
    return DimRange(lower=lower, upper=root.max, dim=d)


class DynamicPolicy:
    """Decides, for each graph input tensor, which of its sizes are symbols and their ranges.

    mode True: every eligible size; None: marked sizes and `automatic` ones; False: none.
    `export_dims` (export only): {id(tensor): {dim: Dim}}.
    """

    def __init__(self, mode: Optional[bool], code=None, export_dims: Optional[dict] = None):
        self.mode = mode
        self.code = code
        self.export_dims = export_dims

    def dims(self, t: torch.Tensor, source) -> dict[int, DimRange]:
        """{dim: range} of the dynamic sizes of graph input `t` read from `source`."""
        if isinstance(t, torch.nn.Parameter) or _is_buffer(source):
            return {}
        if self.export_dims is not None:
            wanted = {d: dim_range(x) for d, x in self.export_dims.get(id(t), {}).items()}
        else:
            wanted = self._compile_dims(t, source)
        if not wanted:
            return {}
        shape, row_major = t.shape, _row_major(t)
        dims = {d: r for d, r in wanted.items()
                if row_major and shape[d] >= 2 and _in_range(shape[d], r)}  # fmt: skip
        if self.export_dims is not None and len(dims) != len(wanted):
            d = next(d for d in wanted if d not in dims)
            raise SpecializationError(
                f"ember.export: {source.name()}.size()[{d}] is declared dynamic "
                f"({wanted[d].dim}) but cannot be: its size {shape[d]} is 0, 1 or outside the "
                "Dim's range, or the tensor is not row-major contiguous (see ember.dynamo."
                "symbolic for the rules)")  # fmt: skip
        return dims

    def _compile_dims(self, t, source) -> dict[int, DimRange]:
        if self.mode is False:
            return {}
        if self.mode is True:
            return {d: DimRange() for d in range(t.dim())}
        wanted = dict(getattr(t, _MARKS, {}))
        if self.code is not None:
            for d in automatic_dims(self.code, source, tuple(t.shape)):
                wanted.setdefault(d, DimRange())
        return wanted


def _in_range(value: int, r: DimRange) -> bool:
    return value >= r.lower and (r.upper is None or value <= r.upper)


def _row_major(t: torch.Tensor) -> bool:
    expected, stride = [], 1
    for size in reversed(t.shape):
        expected.append(stride)
        stride *= size
    return tuple(reversed(expected)) == tuple(t.stride())


def _is_buffer(source) -> bool:
    base = getattr(source, "base", None)
    return getattr(base, "attr", None) in ("_buffers", "_parameters")


# -- automatic dynamic: sizes that changed between compiles of the same frame ----------------------
# code -> {source: (sizes last compiled, dims seen changing)}
_SEEN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def automatic_dims(code, source, shape: tuple) -> set[int]:
    """Dims of `source` whose size differs from an earlier compile of `code` (remembered)."""
    table = _SEEN.setdefault(code, {})
    prev = table.get(source)
    if prev is None:
        table[source] = (shape, set())
        return set()
    old, changed = prev
    if len(old) == len(shape):
        changed |= {d for d, (a, b) in enumerate(zip(old, shape)) if a != b}
    table[source] = (shape, changed)
    return changed


def reset_automatic() -> None:
    _SEEN.clear()
