"""Decompositions of ATen ops into prims (and into other ATen ops, decomposed in turn)."""

from ._registry import DECOMPOSITIONS, get_decomposition, register_decomposition
from . import creation, misc, movement, nn, nn_act, nn_loss, nn_pool, nn_upsample  # noqa: F401
from . import pointwise, reductions, views  # noqa: F401

__all__ = ["DECOMPOSITIONS", "get_decomposition", "register_decomposition"]
