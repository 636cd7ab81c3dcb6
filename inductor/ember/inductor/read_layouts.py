"""Layouts chosen from how a value's body reads memory.

A value computed into a buffer can be laid out in any dense order. Stored in the order its
loads walk their sources, the kernel that computes it reads and writes memory in the same
order (both coalesced on a GPU, both sequential on a CPU); stored row-major over a
channels-last source, one side of the copy walks memory with a stride of the channel count.
"""

from __future__ import annotations

from collections import Counter

from ember.ir import contiguous_strides
from ember.primtorch.utils import strides_from_perm

from .index_simplify import linear_parts
from .loop_ir import SketchHandler, loop_vars, set_handler


class LoadRecorder(SketchHandler):
    """The index of every load of a body."""

    def __init__(self):
        super().__init__()
        self.indices: list = []

    def load(self, name, index):
        self.indices.append(index)
        return super().load(name, index)


def read_orders(x) -> tuple[list, list]:
    """(x's dims larger than 1, and for each load of x's body that is affine in them with
    distinct positive coefficients: those dims ordered as that load walks memory, outermost
    first). A broadcast, indirect or non-affine load has no opinion and is left out."""
    dims = [d for d, s in enumerate(x.sizes) if s != 1]
    vs = loop_vars("i", len(x.sizes))
    with set_handler(LoadRecorder()) as rec:
        x.fn(list(vs))
    orders = []
    for index in rec.indices:
        lin = linear_parts(index, [vs[d] for d in dims])
        if lin is None or any(not (c.is_Integer and c > 0) for c in lin[0]):
            continue
        if len(set(lin[0])) == len(dims):
            coeff = dict(zip(dims, lin[0]))
            orders.append(sorted(dims, key=lambda d: -int(coeff[d])))
    return dims, orders


def _strides_for(x, order) -> tuple:
    """Dense strides for `x` whose dims larger than 1 run in `order` (outermost first); size-1
    dims keep their logical places."""
    dims = set(order)
    walk = iter(order)
    outermost_first = [next(walk) if d in dims else d for d in range(len(x.sizes))]
    return strides_from_perm(x.sizes, outermost_first[::-1])


def read_order_strides(x) -> tuple:
    """Dense strides that store `x` in the order its loads walk memory, when they all agree
    (a cast of a transposed weight is then a straight copy, and stays a transposed operand for
    a matmul); contiguous strides when they disagree or say nothing."""
    dims, orders = read_orders(x)
    if len(dims) < 2 or not orders or any(order != orders[0] for order in orders):
        return contiguous_strides(x.sizes)
    return _strides_for(x, orders[0])


def voted_strides(x, row_major_wins_ties: bool = True) -> tuple | None:
    """Dense strides in the order most of `x`'s loads walk memory (row-major order included;
    with `row_major_wins_ties`, row-major wins a tie it is part of: a residual add of a
    transposed branch to a row-major stream); None on another tie, or when the loads say
    nothing."""
    dims, orders = read_orders(x)
    if len(dims) < 2 or not orders:
        return None
    votes = Counter(tuple(order) for order in orders)
    top = max(votes.values())
    best = [order for order, n in votes.items() if n == top]
    if len(best) > 1:
        if not row_major_wins_ties or tuple(dims) not in best:
            return None
        best = [tuple(dims)]
    return _strides_for(x, list(best[0]))
