"""SymNode, ShapeEnv and SymbolicTensor: symbolic sizes through torch and the tracer."""

import sympy
import torch
import torch.nn.functional as F

from ember.ir import NODE_META_KEY, SymbolSpec, TensorMeta, contiguous_strides
from ember.ir.symbols import FloorDiv, sym
from ember.primtorch import Tracer
from ember.primtorch.symbolic import ShapeEnv, SymbolicTensor
from ember.primtorch.symbolic_composites import SymbolicComposites

s0, s1 = sym("s0"), sym("s1")


def _env():
    return ShapeEnv([SymbolSpec("s0"), SymbolSpec("s1")], {"s0": 4, "s1": 24})


def test_arithmetic_stays_symbolic_and_decisions_become_guards():
    env = _env()
    a, b = env.symint(s0), env.symint(s1)
    assert (a * b + 1).node.expr == s0 * s1 + 1
    assert (b // 12).node.expr == FloorDiv(s1, 12)
    assert bool(a >= 2) and env.guards == []  # the range decides it: no guard
    assert not bool(a > 8)
    assert env.guards == [sympy.Le(s0, 8)]
    assert int(b) == 24 and sympy.Eq(s1, 24) in env.guards


def test_tracer_records_symbolic_sizes():
    env = _env()
    meta = TensorMeta(torch.float32, (s0, s1, 64), contiguous_strides((s0, s1, 64)))
    x = SymbolicTensor(torch.randn(4, 24, 64), meta, env)
    assert [str(s) for s in x.shape] == ["s0", "s1", "64"]
    tracer = Tracer()
    tracer.shape_env = env
    tracer.placeholder(x, "x")
    with tracer:
        b, t, c = x.shape
        out = x.view(b, t, 4, c // 4).sum(2).mean(0)
    gm = tracer.output(out)
    reshape = next(n for n in gm.graph.nodes if "reshape" in str(n.target))
    assert tuple(reshape.args[1]) == (s0, s1, 4, 16)
    assert gm.graph.output_node().args[0].meta[NODE_META_KEY].sizes == (s1, 16)
    torch.testing.assert_close(out.value, x.value.view(4, 24, 4, 16).sum(2).mean(0))
    assert env.guards == []


def test_exact_quotients_and_huge_bounds_need_no_guard():
    env = _env()
    a, b = env.symint(s0), env.symint(s1)
    assert ((a * b * 32) // b).node.expr == 32 * s0  # torch's inferred -1 in a reshape
    assert ((a * b + b) // b).node.expr == s0 + 1
    assert isinstance(((a + b) // b).node.expr, FloorDiv)  # not exact: stays a FloorDiv
    assert bool(a < 2**63 - 1) and not bool(a * b > 2**63 - 1)  # a slice's default end
    assert env.guards == []


def test_guards_imply_and_equal_hints_unify():
    env = ShapeEnv([SymbolSpec("s0"), SymbolSpec("s1")], {"s0": 5, "s1": 5})
    assert not env.implies(sympy.Le(s1, 32))
    env.guard_bool(sympy.Le(s1, 32))
    assert env.implies(sympy.Le(s1, 32))
    assert env.guard_equal(s0, s1) and env.guards[-1] == sympy.Eq(s0, s1)
    assert env.implies(sympy.Eq(4 * s1, 4 * s0))  # through the recorded equality
    assert not env.guard_equal(s0, 2 * s1)  # hints differ: not equal, no guard
    assert len(env.guards) == 2


def _trace_symbolic(fn, hints=(4, 24)):
    env = ShapeEnv([SymbolSpec("s0"), SymbolSpec("s1")], dict(zip(("s0", "s1"), hints)))
    meta = TensorMeta(torch.float32, (s0, s1, 32), contiguous_strides((s0, s1, 32)))
    x = SymbolicTensor(torch.randn(*hints, 32), meta, env)
    tracer = Tracer()
    tracer.shape_env = env
    tracer.placeholder(x, "x")
    with tracer, SymbolicComposites():
        out = torch.func.functionalize(fn)(x)
    return tracer.output(out), env, x, out


def test_linear_arange_and_slices_of_symbolic_sizes():
    """C++ composites that read sizes as ints (3-d linear, with a bias or without: on CUDA the
    latter's checks call numel()) run as Python decompositions; arange(t) and ones(t, t) keep t;
    slicing a static buffer to t guards t."""
    w, bias, buf = torch.randn(8, 32), torch.randn(8), torch.randn(16, 16)

    def fn(x):
        t = x.size(1)
        y = F.linear(x, w, bias) + torch.arange(t).view(1, t, 1)
        mask = torch.ones(t, t, dtype=torch.bool).tril() & (buf[:t, :t] > 0)
        return y, mask, x.transpose(0, 1).reshape(t, -1), F.linear(x, w)

    gm, env, x, (y, mask, flat, z) = _trace_symbolic(fn, hints=(4, 6))
    metas = [n.meta[NODE_META_KEY].sizes for n in gm.graph.output_node().args[0]]
    assert metas == [(s0, s1, 8), (s1, s1), (s1, 32 * s0), (s0, s1, 8)]
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any("linear" in t or "matmul" in t for t in targets), targets
    torch.testing.assert_close(z.value, F.linear(x.value, w))
    assert env.guards == [sympy.Le(s1, 16)]  # the buffer is 16 long
    torch.testing.assert_close(y.value, F.linear(x.value, w, bias) + torch.arange(6).view(1, 6, 1))
    want = torch.ones(6, 6, dtype=torch.bool).tril() & (buf[:6, :6] > 0)
    torch.testing.assert_close(mask.value, want)


def test_dropout_of_symbolic_sizes():
    gm, env, x, out = _trace_symbolic(lambda x: F.dropout(x, 0.25, training=True))
    assert gm.graph.output_node().args[0].meta[NODE_META_KEY].sizes == (s0, s1, 32)
    kept = out.value != 0
    torch.testing.assert_close(out.value[kept], x.value[kept] / 0.75)
    assert 0.5 < kept.float().mean() < 0.95 and env.guards == []
    gm, env, x, out = _trace_symbolic(lambda x: torch.dropout(x, 0.25, True))
    assert gm.graph.output_node().args[0].meta[NODE_META_KEY].sizes == (s0, s1, 32)
    assert env.guards == []


def test_a_size_padded_to_a_multiple_is_known_to_cover_it():
    # torch pads an attention bias to s - s % 8 + 8 columns and slices s of them back
    from ember.primtorch.utils import known_le, known_lt

    s = sym("s4")
    padded = s - sympy.Mod(s, 8) + 8
    assert known_le(s, padded) and known_lt(s, padded)
    assert known_le(s - sympy.Mod(s, 8), s)
    assert not known_le(padded, s)
    assert not known_le(s, s - sympy.Mod(s, 8))  # a multiple of 8 below s: not above it
    assert not known_le(s, s - sympy.Mod(s, 8) + sympy.Mod(s, 8) ** 2 - 60)  # not linear


def test_a_size_rounded_up_by_integer_division_is_known_to_cover_it():
    # symbolic attention pads its bias to 16 * ((s + 15) // 16) columns and slices s of them back
    from ember.ir.symbols import CeilDiv, FloorDiv
    from ember.primtorch.utils import known_le, known_lt

    s = sym("s4")
    for padded in (16 * FloorDiv(s + 15, 16), 16 * CeilDiv(s, 16), 16 * sympy.ceiling(s / 16)):
        assert known_le(s, padded) and known_le(padded, s + 15)
        assert not known_lt(s, padded)  # equal when s is a multiple of 16
        assert not known_le(s + 1, padded)
    assert known_le(16 * FloorDiv(s, 16), s) and not known_le(s, 16 * FloorDiv(s, 16))
    assert not known_le(s, FloorDiv(s, sym("s5")) * sym("s5"))  # a symbolic divisor: undecided


def test_an_attention_bias_in_rows_rounded_up_to_16_keeps_its_layout():
    """The memory-efficient kernel's bias: a view whose row strides are multiples of 16 for every
    size (symbolic, or 0 where broadcast) is passed as it is; other layouts get aligned rows."""
    from ember.ir.symbols import FloorDiv
    from ember.primtorch.prims.extern import _aligned_bias

    s = sym("s4")
    row = 16 * FloorDiv(s + 15, 16)
    assert _aligned_bias((2, 12, s, s), (s * row, 0, row, 1)) == (s * row, 0, row, 1)
    relaid = _aligned_bias((2, 12, s, s), (s * s, 0, s, 1))
    assert relaid[-1] == 1 and all(relaid[-2].subs(s, n) == row.subs(s, n) for n in (2, 16, 17, 77))
    assert _aligned_bias((2, 12, 77, 77), (77 * 80, 0, 80, 1)) == (77 * 80, 0, 80, 1)
    assert _aligned_bias((2, 12, 77, 77), (77 * 77, 0, 77, 1))[-2] == 80


def test_requires_grad_is_read_through_functionalize():
    """Attention picks its kernel by whether it is training: functionalize's wrapper of a tensor
    that requires grad reads requires_grad=False, so the check looks at the wrapped tensor."""
    from ember.primtorch.symbolic_composites import requires_grad

    seen = []

    def fn(x, y):
        seen.append((requires_grad(x), requires_grad(y)))
        return x * y

    torch.func.functionalize(fn)(torch.randn(3, requires_grad=True), torch.randn(3))
    assert seen == [(True, False)]
