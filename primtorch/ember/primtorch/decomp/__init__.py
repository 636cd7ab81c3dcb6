"""Decompositions of ATen ops into prims (and into other ATen ops, decomposed in turn).

`DECOMPOSITIONS` maps an ATen OpOverload to a Python function that computes it with prims (and
with other ATen ops: the tracer re-enters itself for those). Families: pointwise (arithmetic,
comparisons, math, promotion), reductions (sums, statistics, arg-reductions, softmax), views,
creation (factories, ranges, random), movement (cat, padding, indexing, scatters), misc (the long
tail), nn (norms, embedding, dropout), nn_act, nn_loss, nn_pool, nn_upsample, nn_grid, special.

`EXTERN_DECOMPOSITIONS` holds decompositions of ops the tracer normally records as extern ops,
used when the target has no kernel for that extern (`Tracer(no_extern=...)`) or a generated
kernel beats it: conv, cumsum, and matrix products of one or two rows.
"""

from ._registry import DECOMPOSITIONS, get_decomposition, register_decomposition
from . import creation, misc, movement, nn, nn_act, nn_grid, nn_loss, nn_pool  # noqa: F401
from . import nn_upsample, pointwise, reductions, special, views  # noqa: F401
from . import conv, scan, small_mm

EXTERN_DECOMPOSITIONS = {**conv.EXTERN_DECOMPOSITIONS, **scan.EXTERN_DECOMPOSITIONS,
                         **small_mm.EXTERN_DECOMPOSITIONS}  # fmt: skip

__all__ = ["DECOMPOSITIONS", "EXTERN_DECOMPOSITIONS", "get_decomposition", "register_decomposition"]
