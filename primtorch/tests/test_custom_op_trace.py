"""The tracer keeps user operators (torch.library) as one extern.custom_op node."""

import pytest
import torch

from ember.ir import NODE_META_KEY, graph_from_ir, graph_to_ir, target_name
from ember.primtorch import trace_to_prims
from ember.primtorch.errors import MetaMismatchError
from ember.primtorch.prims.extern import custom_op


@torch.library.custom_op("ember_primtorch_test::rowsum_t", mutates_args=())
def rowsum_t(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.sum(1, keepdim=True) * scale).expand(-1, 3).t().contiguous()


@rowsum_t.register_fake
def _(x, scale):
    return x.new_empty((3, x.shape[0]))


@torch.library.custom_op("ember_primtorch_test::bump", mutates_args=("counter",))
def bump(counter: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    counter.add_(1)
    return x * counter


@bump.register_fake
def _(counter, x):
    return torch.empty_like(x)


@torch.library.custom_op("ember_primtorch_test::wrong_fake", mutates_args=())
def wrong_fake(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@wrong_fake.register_fake
def _(x):
    return x.new_empty((x.shape[0] + 1,))  # a fake kernel that disagrees with the real one


def _custom_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is custom_op]


def test_custom_op_is_one_node_with_fake_kernel_metadata():
    x = torch.randn(4, 5)
    gm = trace_to_prims(lambda x: rowsum_t(x * 2, 0.5) + 1, x)
    (node,) = _custom_nodes(gm)
    assert node.args[0] == "ember_primtorch_test::rowsum_t.default"
    assert node.args[1][1] == 0.5 and node.args[2] == []
    (meta,) = node.meta[NODE_META_KEY]
    assert tuple(meta.sizes) == (3, 4) and tuple(meta.strides) == (4, 1)
    torch.testing.assert_close(gm(x), rowsum_t(x * 2, 0.5) + 1)


def test_custom_op_graph_serialises_and_runs_after_a_round_trip():
    x = torch.randn(4, 5)
    gm = trace_to_prims(lambda x: rowsum_t(x, 2.0), x)
    again = graph_from_ir(graph_to_ir(gm))
    assert [target_name(n.target) for n in again.graph.nodes if n.op == "call_function"][0] == (
        "extern.custom_op"
    )
    torch.testing.assert_close(again(x), rowsum_t(x, 2.0))


def test_mutated_argument_gets_its_new_value_functionally():
    def f(x):
        counter = torch.zeros(())
        a = bump(counter, x)
        b = bump(counter, x)
        return a + b, counter

    x = torch.randn(3)
    gm = trace_to_prims(f, x)
    nodes = _custom_nodes(gm)
    assert len(nodes) == 2 and all(n.args[2] == [0] for n in nodes)
    # the second call reads the first call's new counter: a functional chain, no in-place op
    assert nodes[1].args[1][0].args[0] is nodes[0]
    out, counter = gm(x)
    torch.testing.assert_close(out, x * 3)
    assert counter.item() == 2


def test_fake_kernel_disagreeing_with_the_kernel_is_reported():
    expected = "ember_primtorch_test::wrong_fake.default: its fake"
    with pytest.raises(MetaMismatchError, match=expected):
        trace_to_prims(lambda x: wrong_fake(x), torch.randn(4), check=True)


def test_meta_rule_runs_the_fake_kernel_on_metas():
    from ember.ir import TensorMeta

    m = TensorMeta.from_tensor(torch.randn(4, 5))
    (out,) = custom_op.meta("ember_primtorch_test::rowsum_t.default", [m, 1.0])
    assert tuple(out.sizes) == (3, 4) and out.dtype == torch.float32 and str(out.device) == "cpu"


@torch.library.custom_op("ember_primtorch_test::pad_rows", mutates_args=())
def pad_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x.new_zeros(8 - x.shape[0] if x.shape[0] < 8 else 1, x.shape[1])])


@pad_rows.register_fake
def _(x):
    extra = 8 - x.shape[0] if x.shape[0] < 8 else 1  # a decision on a size: a guard
    return x.new_empty((x.shape[0] + extra, x.shape[1]))


def test_fake_kernels_run_on_symbolic_sizes():
    """With symbolic sizes the fake kernel sees the trace's SymInts: the output sizes it computes
    are the node's (rowsum_t of an s0 x s1 input is (3, s0)); what it decides on a size is a
    guard of the trace (pad_rows: s0 < 8, so 8 rows); the value is the operator's at the hints."""
    import sympy

    from ember.ir import SymbolSpec, TensorMeta, contiguous_strides
    from ember.ir.symbols import sym
    from ember.primtorch import Tracer
    from ember.primtorch.symbolic import ShapeEnv, SymbolicTensor

    s0, s1 = sym("s0"), sym("s1")
    env = ShapeEnv([SymbolSpec("s0"), SymbolSpec("s1")], {"s0": 5, "s1": 4})
    value = torch.randn(5, 4)
    x = SymbolicTensor(value, TensorMeta(torch.float32, (s0, s1), contiguous_strides((s0, s1))),
                       env)  # fmt: skip
    tracer = Tracer()
    tracer.shape_env = env
    tracer.placeholder(x, "x")
    with tracer:
        out = (rowsum_t(x, 2.0), pad_rows(x))
    gm = tracer.output(out)
    metas = [n.meta[NODE_META_KEY].sizes for n in gm.graph.output_node().args[0]]
    assert metas == [(3, s0), (8, s1)]
    assert sympy.Lt(s0, 8) in env.guards
    torch.testing.assert_close(out[0].value, rowsum_t(value, 2.0))
    torch.testing.assert_close(out[1].value, pad_rows(value))
