"""Every prim as an attribute (`prims.add(a, b)`, `prims.sum(a, dims)`); extern ops: `prims.extern`.

The families live in their own modules; this module re-exports each registered "prims.*" op by
name (so `prims.sum` is the prim, not the builtin) and lists them in `__all__`.
"""

from . import creation, custom, elementwise, extern, movement, random, reductions, views  # noqa: F401
from .core import PRIMS, Prim, is_extern, is_prim, prim

for _qualname, _prim in PRIMS.items():
    if _prim.namespace == "prims":
        globals()[_prim.name] = _prim

__all__ = sorted(p.name for p in PRIMS.values() if p.namespace == "prims") + [
    "PRIMS", "Prim", "extern", "is_extern", "is_prim", "prim",
]  # fmt: skip
