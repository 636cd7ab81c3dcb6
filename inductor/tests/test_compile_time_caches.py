"""The caches that cut compile time return what the uncached computation returns: memoised
index expansion, free symbols and printing, and fusion candidates remembered by group key."""

import types

import sympy
import torch
from ember.inductor import scheduler
from ember.inductor.loop_ir import ComputedBuffer, printed
from ember.inductor.lowering import lower_graph
from ember.inductor.scheduler import Kernel, schedule
from ember.ir import FloorDiv, ModularIndexing
from ember.ir.symbols import expand_index, free_symbols_of, sym
from ember.primtorch import trace_to_prims

x0, x1, r0 = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("x0", "x1", "r0"))
s0 = sym("s0")
EXPRS = [
    (x0 + 3) * (x1 + 2 * s0),
    768 * FloorDiv(x0 * 4 + x1, 3) + ModularIndexing((x0 + 1) * (s0 + 2), 4, 8),
    (x0 + r0) ** 2 - x0 * r0,
    sympy.Integer(7),
    s0 * (s0 - 1) + 2 * (x1 + 1),
]


def test_expand_index_is_sympy_expand_and_remembers():
    for e in EXPRS:
        want = sympy.expand(e)
        got = expand_index(e)
        assert got == want and str(got) == str(want)
        assert expand_index(e) is got  # the second answer is the remembered one
    assert expand_index(5) == 5


def test_free_symbols_of_matches_sympy():
    for e in EXPRS:
        assert free_symbols_of(e) == frozenset(e.free_symbols)
    assert free_symbols_of(4) == frozenset()


def test_printed_index_is_str():
    for e in EXPRS:
        assert printed(e) == str(e) and printed(e) == str(e)


def _norm_over_channels(a, r, w, b):
    x = a + r  # stored (B, C, L); the norm reduces over C through a permute
    return torch.nn.functional.layer_norm(x.permute(0, 2, 1), (a.shape[1],), w, b), x


def _sum_and_transpose(a):
    return a.sum(1), (a.exp().transpose(1, 2) * 2).contiguous()


def _scheduled(fn, *args):
    gm = trace_to_prims(fn, *args)
    low = lower_graph(gm, list(args))
    return low.buffers, schedule(low.buffers, [o.name for o in low.outputs])


def _describe(steps) -> list:
    return [(s.name, s.xsizes, s.rsizes, [(m.node.name, m.role, m.perm) for m in s.members])
            if isinstance(s, Kernel) else s.name for s in steps]  # fmt: skip


def test_remembered_fusion_candidates_are_the_computed_ones():
    """Shapes equal in size but laid out otherwise (C == L) meet warm tables: every candidate
    list, and the schedule, is what a cold computation gives, with the kernel's own sizes."""
    graphs = [
        (_norm_over_channels, torch.randn(2, 48, 40), torch.randn(2, 48, 40), torch.randn(48),
         torch.randn(48)),
        (_norm_over_channels, torch.randn(2, 32, 32), torch.randn(2, 32, 32), torch.randn(32),
         torch.randn(32)),
        (_sum_and_transpose, torch.randn(4, 16, 16)),
    ]  # fmt: skip
    scheduler._CANDIDATES.clear()
    cold = []
    for fn, *args in graphs:
        scheduler._CANDIDATES.clear()
        cold.append(_describe(_scheduled(fn, *args)[1]))
    for (fn, *args), want in zip(graphs, cold):  # warm: every graph's entries are there
        buffers, steps = _scheduled(fn, *args)
        assert _describe(steps) == want
        kernels = [s for s in steps if isinstance(s, Kernel)]
        nodes = [b for b in buffers if isinstance(b, ComputedBuffer)]
        for k in kernels:
            for n in nodes:
                got = scheduler._candidates(k, n)
                assert got == scheduler._candidates_of(k, n)
                for _, _, xsizes, rsizes, *_ in got:
                    assert xsizes in (k.xsizes, n.ranges)
                    assert xsizes is k.xsizes or xsizes is n.ranges or xsizes == n.ranges


def test_candidates_take_this_kernels_size_objects():
    """An equal key may have been filled by a kernel of ints: this kernel's sympy sizes come
    back, not that kernel's."""
    buffers, steps = _scheduled(lambda a: (a.exp(), a.exp().sum(1)), torch.randn(8, 12))
    node = next(b for b in buffers if isinstance(b, ComputedBuffer) and not b.is_reduction())
    ints = Kernel("k_ints", tuple(int(n) for n in node.ranges), ())
    exprs = Kernel("k_exprs", tuple(sympy.Integer(n) for n in node.ranges), ())
    scheduler._CANDIDATES.clear()
    assert scheduler._candidates(ints, node)
    for _, _, xsizes, _, *_ in scheduler._candidates(exprs, node):
        assert xsizes is exprs.xsizes


class _Node:
    """What `_candidates` reads of a node: its loop sizes and its layout's strides."""

    def __init__(self, ranges, strides, rranges=()):
        self.ranges, self.reduction_ranges = tuple(ranges), tuple(rranges)
        self.layout = types.SimpleNamespace(strides=tuple(strides))

    def is_reduction(self) -> bool:
        return bool(self.reduction_ranges)


def test_candidates_of_equal_sizes_in_another_layout_are_not_shared():
    """Two nodes of one shape, one stored transposed: their ways into a kernel come in another
    order (the one matching the node's own layout first), so neither may take the other's."""
    k = Kernel("k", (32, 32), ())
    rows, cols = _Node((32, 32), (32, 1)), _Node((32, 32), (1, 32))
    scheduler._CANDIDATES.clear()
    got = [scheduler._candidates(k, n) for n in (rows, cols)]
    assert got == [scheduler._candidates_of(k, n) for n in (rows, cols)]
    assert got[0] != got[1]


def test_remembered_gcd_is_sympys():
    from ember.inductor.index_simplify import _gcd

    for t, d in ((12 * x0 * s0, 8), (6 * x0 + 9, 3 * s0), (s0 * s0, s0 * 4), (x0, 7)):
        assert _gcd(t, d) == sympy.gcd(t, d)
        assert _gcd(t, d) is _gcd(t, d)
