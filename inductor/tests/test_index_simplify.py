"""Index simplification: each rule where it must fire, where it must not, and its result checked
against the unsimplified index by evaluation over the loop ranges; then the generated Triton and
C++ code of a reshaped layer norm and of a (batch*heads) softmax read through a (batch, heads) view.
"""

import itertools
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this process

import pytest
import sympy
import torch
import torch.nn.functional as F
from ember.inductor import config
from ember.inductor.index_simplify import interval, simplify_index
from ember.ir import FloorDiv, ModularIndexing
from inductor_helpers import check

x0, x1, x2 = sympy.symbols("x0 x1 x2", integer=True, nonnegative=True)
s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
t = sympy.Symbol("tmp3", integer=True)  # an indirect index: sign not known


def _value(e, point):
    """`e` at `point` (symbol -> int) with floor division and modulo."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return point[e]
    args = [_value(a, point) for a in e.args]
    if isinstance(e, FloorDiv):
        return args[0] // args[1]
    if isinstance(e, ModularIndexing):
        return (args[0] // args[1]) % args[2]
    if isinstance(e, sympy.Add):
        return sum(args)
    if isinstance(e, sympy.Mul):
        out = 1
        for a in args:
            out *= a
        return out
    raise NotImplementedError(e)


def simplified(e, ranges, samples=None):
    """simplify_index(e, ranges), after checking it equals `e` on every point of the ranges (or on
    `samples` random points and the corners, for large ranges)."""
    out = simplify_index(e, ranges)
    vars_ = sorted(ranges, key=str)
    sizes = [int(ranges[v]) for v in vars_]
    if samples is None:
        points = itertools.product(*[range(n) for n in sizes])
    else:
        g = torch.Generator().manual_seed(0)
        corners = itertools.product(*[(0, n - 1) for n in sizes])
        rand = zip(*[torch.randint(0, n, (samples,), generator=g).tolist() for n in sizes])
        points = itertools.chain(corners, rand)
    for p in points:
        point = dict(zip(vars_, p))
        assert _value(out, point) == _value(e, point), (e, out, point)
    return out


# --- rules that must fire ------------------------------------------------------------------------


def test_a_shared_subexpression_is_simplified_once(monkeypatch):
    # Views of views repeat their source's index inside each new div and mod; simplifying every
    # occurrence again made Funnel Transformer's backward take minutes to compile.
    from ember.inductor import index_simplify

    x = sympy.Symbol("x0", integer=True, nonnegative=True)
    e = x
    for k in range(12):  # each level uses the previous expression twice
        e = FloorDiv(e, 2) + ModularIndexing(e, 1, 2 + k % 3)
    seen = []
    visit = index_simplify._Simplifier._visit
    monkeypatch.setattr(index_simplify._Simplifier, "_visit",
                        lambda self, a: seen.append(a) or visit(self, a))  # fmt: skip
    simplify_index(e, {x: 4096})
    assert len(seen) == len(set(seen)) and len(seen) < 2000, len(seen)


def test_gpt2_layer_norm_read_through_a_reshape():
    """The brief's first example: (4096, 768) loops reading a (4, 512, 768) tensor and its
    (4, 512) row statistics."""
    ranges = {x0: 4096, x1: 768}
    f = 768 * x0 + x1
    data = x1 + 393216 * FloorDiv(f, 393216) + 768 * ModularIndexing(f, 768, 512)
    stats = 512 * FloorDiv(f, 393216) + ModularIndexing(f, 768, 512)
    assert simplified(data, ranges, samples=2000) == 768 * x0 + x1
    assert simplified(stats, ranges, samples=2000) == x0


def test_bert_attention_read_through_a_heads_view():
    """The brief's second example: a (96, 512, 512) tensor read as (8, 12, 512, 512)."""
    ranges = {x0: 96, x1: 512, x2: 512}
    f = 262144 * x0 + 512 * x1 + x2
    e = 512 * x1 + x2 + 3145728 * FloorDiv(f, 3145728) + 262144 * ModularIndexing(f, 262144, 12)
    assert simplified(e, ranges, samples=2000) == 262144 * x0 + 512 * x1 + x2


def test_common_factor_of_floordiv_and_modular_indexing():
    ranges = {x0: 24, x1: 6}
    assert simplified(FloorDiv(6 * x0 + x1, 18), ranges) == FloorDiv(x0, 3)
    assert simplified(ModularIndexing(6 * x0 + x1, 6, 4), ranges) == ModularIndexing(x0, 1, 4)
    # the factor divides the divisor only in part: 12 | 24, r = x1 + 6 < 12 with x1 < 6
    assert simplified(FloorDiv(12 * x0 + x1 + 6, 24), ranges) == FloorDiv(x0, 2)


def test_small_operands_and_nesting():
    ranges = {x0: 5, x1: 7}
    assert simplified(FloorDiv(x0, 5), ranges) == 0
    assert simplified(ModularIndexing(x1, 1, 7), ranges) == x1
    assert simplified(ModularIndexing(x1, 2, 4), ranges) == FloorDiv(x1, 2)  # x1 < 2*4
    big = {x0: 200}
    assert simplified(FloorDiv(FloorDiv(x0, 4), 8), big) == FloorDiv(x0, 32)
    assert simplified(ModularIndexing(FloorDiv(x0, 4), 2, 3), big) == ModularIndexing(x0, 8, 3)
    assert simplified(FloorDiv(ModularIndexing(x0, 2, 12), 4), big) == ModularIndexing(x0, 8, 3)


def test_split_digits_recombine():
    ranges = {x0: 60}
    assert simplified(12 * FloorDiv(x0, 4) + 3 * ModularIndexing(x0, 1, 4), ranges) == 3 * x0
    two = 20 * ModularIndexing(x0, 4, 3) + 5 * ModularIndexing(x0, 1, 4)  # 5 * (x0 % 12)
    assert simplified(two, ranges) == 5 * ModularIndexing(x0, 1, 12)
    three = 60 * FloorDiv(x0, 12) + 20 * ModularIndexing(x0, 4, 3) + 5 * ModularIndexing(x0, 1, 4)
    assert simplified(three, ranges) == 5 * x0


def test_symbolic_sizes_where_provable():
    ranges = {x0: 4, x1: s0}
    assert simplify_index(FloorDiv(s0 * x0 + x1, s0), ranges) == x0
    assert simplify_index(ModularIndexing(s0 * x0 + x1, 1, s0), ranges) == x1
    assert simplify_index(FloorDiv(s0 * s1 * x0 + x1, s1), {x0: 4, x1: s1}) == s0 * x0
    assert simplify_index(FloorDiv(s0 * s1 * x0 + x1, s0 * s1), {x0: 4, x1: s0}) == x0
    digits = s0 * s1 * FloorDiv(x0, s1) + s0 * ModularIndexing(x0, 1, s1)
    assert simplify_index(digits, {x0: 8}) == s0 * x0


# --- rules that must not fire --------------------------------------------------------------------


def test_no_common_factor_when_the_remainder_may_reach_it():
    # x1 < 769: 768*x0 + x1 can carry into the next row
    e = FloorDiv(768 * x0 + x1, 393216)
    assert simplified(e, {x0: 1024, x1: 769}, samples=500) == e
    m = ModularIndexing(768 * x0 + x1, 768, 512)
    assert simplified(m, {x0: 1024, x1: 769}, samples=500) == m
    # x1's range is not known: nothing is proven
    assert simplify_index(e, {x0: 1024}) == e


def test_no_rule_over_operands_of_unknown_sign():
    ranges = {x0: 8, x1: 4}
    for e in (FloorDiv(16 * x0 + t, 16), ModularIndexing(16 * x0 - x1 + 2, 1, 16),
              FloorDiv(4 * x0 - x1, 4), FloorDiv(x0 - 8, 8)):  # fmt: skip
        assert simplify_index(e, ranges) == e
    assert interval(4 * x0 - x1, ranges) == (-3, 28)
    # the same shape of index, proven non-negative: 16*x0 - x1 + 3 >= 0 with x1 < 4
    assert simplified(ModularIndexing(16 * x0 - x1 + 3, 1, 16), ranges) == 3 - x1


def test_small_operand_rule_needs_the_bound():
    assert simplified(FloorDiv(x0, 5), {x0: 6}) == FloorDiv(x0, 5)
    assert simplified(ModularIndexing(x0, 1, 7), {x0: 8}) == ModularIndexing(x0, 1, 7)
    assert simplified(ModularIndexing(x0, 2, 4), {x0: 9}) == ModularIndexing(x0, 2, 4)


def test_digits_with_mismatched_coefficients_stay_split():
    ranges = {x0: 60}
    for e in (11 * FloorDiv(x0, 4) + 3 * ModularIndexing(x0, 1, 4),  # 11 != 3*4
              12 * FloorDiv(x0, 5) + 3 * ModularIndexing(x0, 1, 4),  # 5 != 1*4
              12 * FloorDiv(x0, 4) + 3 * ModularIndexing(x0 + 1, 1, 4)):  # different operands
        assert simplified(e, ranges) == sympy.expand(e)


def test_symbolic_divisors_stay_unless_proven():
    for e, ranges in [
        (FloorDiv(s0 * x0 + x1, s1), {x0: 4, x1: s0}),  # s1 unrelated to s0
        (ModularIndexing(s0 * x0 + x1, 1, s1), {x0: 4, x1: s0}),
        (FloorDiv(x1, s0), {x1: s0 + 1}),  # x1 may equal s0
        (FloorDiv(x1, s0), {x1: s1}),
    ]:
        assert simplify_index(e, ranges) == e
    # x1 < s0 + 1: only the multiple of s0 comes out
    assert simplify_index(FloorDiv(s0 * x0 + x1, s0), {x0: 4, x1: s0 + 1}) == x0 + FloorDiv(
        x1, s0
    )


# --- generated code ------------------------------------------------------------------------------


def _loads(compiled, language):
    text = "\n".join(k.source for k in compiled.program.kernels if k.language == language)
    if language == "triton":
        return [line for line in text.splitlines() if "tl.load(" in line or "tl.store(" in line]
    return [line for line in text.splitlines() if "_ptr" in line and "[" in line]


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_reshaped_layer_norm_reads_plain_indices(backend):
    config.cpu_backend = backend
    B, S, H = 2, 8, 16

    def fn(x, w, b, W):
        return F.layer_norm(x, (H,), w, b).view(B * S, H) @ W

    args = (torch.randn(B, S, H), torch.randn(H), torch.randn(H), torch.randn(H, 8))
    # one kernel: the normalisation, laid out as the matmul's (B*S, H) operand, joins the
    # statistics' loop over (B, S), so the statistics are never written or read back
    compiled = check(fn, *args, kernels=1, atol=1e-4, rtol=1e-4)
    lines = _loads(compiled, backend)
    div = "//" if backend == "triton" else "/"
    assert lines and not any(div in line or "%" in line for line in lines), lines
    if backend == "triton":  # x, the weight and the bias in; the normalised rows out
        assert sum("tl.load(" in line for line in lines) == 3, lines


@pytest.mark.parametrize("backend", ["triton", "cpp"])
def test_softmax_through_a_heads_view_is_one_flat_loop(backend):
    config.cpu_backend = backend

    def fn(q, k):
        s = torch.bmm(q, k.transpose(1, 2)).view(2, 3, 8, 8)
        return torch.softmax(s, -1).view(6, 8, 8)

    args = (torch.randn(6, 8, 4), torch.randn(6, 8, 4))
    compiled = check(fn, *args, atol=1e-5, rtol=1e-4)
    lines = _loads(compiled, backend)
    div = "//" if backend == "triton" else "/"
    assert lines and not any(div in line or "%" in line for line in lines), lines
    if backend == "triton":  # the (2, 3) view merged back: only rows (x0) and columns (x1)
        text = "\n".join(k.source for k in compiled.program.kernels)
        assert "x2 =" not in text, text


def test_printing_rounded_up_sizes_and_max():
    """A size rounded up to a multiple (torch pads an attention mask to 16 columns) prints as an
    integer division; Max(1, size) (a stride) prints as the size when it is a positive integer,
    else as each language's max."""
    from ember.inductor.codegen_common import PY_MINMAX, TRITON_MINMAX, print_index

    s1, s2 = sympy.symbols("s1 s2", integer=True, positive=True)
    padded = 16 * sympy.ceiling(s1 / 16)
    assert print_index(padded, floordiv="//") == "16 * (((15 + s1) // 16))"
    assert print_index(sympy.floor(s1 / s2)) == "((s1) / s2)"
    assert print_index(sympy.Max(1, padded, evaluate=False), floordiv="//") == print_index(
        padded, floordiv="//"
    )
    k = sympy.Symbol("k", integer=True)  # of unknown sign: the max stays
    assert print_index(sympy.Max(1, k)) == "std::max<int64_t>(1, k)"
    assert print_index(sympy.Max(1, k), minmax=TRITON_MINMAX) == "tl.maximum(1, k)"
    assert print_index(sympy.Max(1, k), minmax=PY_MINMAX) == "max(1, k)"
