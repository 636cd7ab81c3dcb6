"""SymNode, ShapeEnv and SymbolicTensor: symbolic sizes through torch and the tracer."""

import sympy
import torch

from ember.ir import NODE_META_KEY, SymbolSpec, TensorMeta, contiguous_strides
from ember.ir.symbols import FloorDiv, sym
from ember.primtorch import Tracer
from ember.primtorch.symbolic import ShapeEnv, SymbolicTensor

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
