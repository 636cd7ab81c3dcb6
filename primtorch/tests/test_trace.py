"""The tracer: graphs of prims that compute what the traced function computes."""

import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ember.ir import NODE_META_KEY, graph_from_ir, graph_to_ir
from ember.primtorch import (
    DECOMPOSITIONS, DataDependentError, MetaMismatchError, NotDecomposableError, TraceError, Tracer,
    is_extern, is_prim, prims, trace_to_prims, utils,
)  # fmt: skip

aten = torch.ops.aten


def _relu(a):
    return prims.where(prims.gt(a, 0.0), a, 0.0)


def _gelu(a, approximate="none"):
    inner = prims.erf(prims.mul(a, 0.7071067811865476))
    return prims.mul(prims.mul(a, 0.5), prims.add(inner, 1.0))


# Decompositions the tests need while the shared table is being written; the shared table's own
# entries take precedence, so these only fill gaps.
TEST_ONLY = {aten.relu.default: _relu, aten.gelu.default: _gelu}


def decomps():
    return {**TEST_ONLY, **DECOMPOSITIONS}


def trace(fn, *args, **kw):
    kw.setdefault("decompositions", decomps())
    kw.setdefault("check", True)
    return trace_to_prims(fn, *args, **kw)


def assert_prim_graph(gm):
    for n in gm.graph.nodes:
        if n.op == "call_function":
            assert is_prim(n.target) or is_extern(n.target) or n.target is operator.getitem, n
            assert NODE_META_KEY in n.meta, n
        assert n.op in ("placeholder", "call_function", "output", "get_attr"), n


def test_mlp_matches_eager_and_serialises():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    params = dict(mlp.named_parameters())

    def fn(x, params):
        return F.log_softmax(torch.func.functional_call(mlp, params, (x,)), -1)

    gm = trace(fn, x, params)
    assert_prim_graph(gm)
    assert any(n.target is prims.extern.addmm for n in gm.graph.nodes)
    flat = [x, *params.values()]
    torch.testing.assert_close(gm(*flat), fn(x, params))
    again = graph_from_ir(graph_to_ir(gm))  # every target is in the vocabulary
    torch.testing.assert_close(again(*flat), fn(x, params))


class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_bn_relu_eval(channels_last):
    torch.manual_seed(0)
    block = ConvBnRelu().eval()
    block.bn.running_mean.uniform_(-0.5, 0.5)
    block.bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 6, 6)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    gm = trace(block, x)  # parameters are unknown tensors: constants
    assert_prim_graph(gm)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"].count(
        prims.extern.convolution
    ) == 1
    out = gm(x)
    torch.testing.assert_close(out, block(x))
    assert out.stride() == block(x).stride()


def test_conv_bn_relu_training_reports_buffer_mutation():
    torch.manual_seed(0)
    block = ConvBnRelu().train()
    x = torch.randn(2, 3, 6, 6)
    state = dict(block.named_parameters()) | dict(block.named_buffers())
    before = {k: v.detach().clone() for k, v in state.items()}
    expected_block = ConvBnRelu().train()
    expected_block.load_state_dict(block.state_dict())
    expected = expected_block(x)

    tracer = Tracer(decompositions=decomps(), check=True)
    tracer.placeholder(x, "x")
    for name, t in state.items():
        tracer.placeholder(t, name.replace(".", "_"))
    with tracer:
        out = block(x)
    # Returning the written buffers is how a consumer (aot_autograd) keeps their new values.
    gm = tracer.output((out, block.bn.running_mean, block.bn.running_var))
    torch.testing.assert_close(out, expected)
    mutated = {n.name for n in tracer.mutated_inputs}
    assert {"bn_running_mean", "bn_running_var", "bn_num_batches_tracked"} <= mutated
    got, mean, var = gm(x, *before.values())
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(mean, expected_block.bn.running_mean)
    torch.testing.assert_close(var, expected_block.bn.running_var)
    torch.testing.assert_close(block.bn.running_mean, expected_block.bn.running_mean)

    fresh = ConvBnRelu().train()
    with pytest.raises(TraceError, match="mutates"):
        trace(fresh, x)


def test_unknown_op_names_the_overload():
    with pytest.raises(NotDecomposableError, match=r"aten\.sin\.default has no decomposition"):
        trace_to_prims(torch.sin, torch.randn(3), decompositions={})
    with pytest.raises(NotDecomposableError, match="allow_extern=False"):
        trace_to_prims(torch.mm, torch.randn(2, 2), torch.randn(2, 2), decompositions={},
                       allow_extern=False)  # fmt: skip


def test_keep_records_aten_ops():
    gm = trace_to_prims(lambda x: torch.sin(x) + 1, torch.randn(3), keep={aten.sin.default},
                        decompositions=decomps())  # fmt: skip
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert aten.sin.default in targets
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), torch.sin(x) + 1)


def test_prims_called_directly_and_scalars_and_tuples():
    def fn(x):
        y = prims.mul(x, 2.0)
        values, indices = torch.sort(y, dim=-1)
        return {"v": values, "i": indices, "n": 3, "s": prims.sum(y, (0, 1))}

    x = torch.randn(3, 4)
    gm = trace(fn, x)
    out = gm(x)
    ref = fn(x)
    assert out["n"] == 3
    for k in ("v", "i", "s"):
        torch.testing.assert_close(out[k], ref[k])
    assert any(n.target is prims.extern.sort for n in gm.graph.nodes)


def test_inplace_and_out_are_functionalised():
    def fn(x):
        y = x * 2
        y.add_(1)
        y.mul_(torch.ones(3, 4, dtype=torch.float64))  # result dtype stays y's
        buf = torch.empty(3, 4)
        torch.sub(y, 0.5, out=buf)
        return buf

    x = torch.randn(3, 4)
    gm = trace(fn, x)
    assert_prim_graph(gm)
    torch.testing.assert_close(gm(x), fn(x))


def test_inplace_view_ops_change_metadata_only():
    # Eager's adaptive_avg_pool2d of a channels-last input restrides its (N, C, 1, 1) result with
    # as_strided_; transpose_/unsqueeze_ likewise change only a tensor's metadata.
    def fn(x):
        y = F.adaptive_avg_pool2d(x + 1, 1)
        z = x * 2
        z.transpose_(1, 2)
        z.unsqueeze_(0)
        return y.flatten(1), z + 1

    x = torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
    gm = trace(fn, x)
    assert_prim_graph(gm)
    for got, want in zip(gm(x), fn(x)):
        torch.testing.assert_close(got, want)
    with pytest.raises(NotDecomposableError, match="metadata of an input"):
        trace(lambda t: t.transpose_(0, 1), torch.randn(2, 3))


def test_input_mutation_is_reported():
    x = torch.randn(4)
    tracer = Tracer(decompositions=decomps())
    p = tracer.placeholder(x, "x")
    before = x.clone()
    with tracer:
        x.mul_(3)
        out = x + 1
    gm = tracer.output(out)
    new_node = tracer.mutated_inputs[p]
    assert new_node is not None
    torch.testing.assert_close(gm(before), before * 3 + 1)
    with pytest.raises(TraceError, match="mutates x|mutates arg0"):
        trace(lambda t: t.add_(1), torch.randn(2))


def test_writing_through_a_view_makes_aliases_stale():
    def fn(x):
        y = x + 1
        row = y[0]
        y.mul_(2)
        return row.sum()

    with pytest.raises(TraceError, match="written through an alias"):
        trace(fn, torch.randn(2, 3))


def test_views_and_output_aliases():
    def fn(x):
        return x.t(), x[1:].view(-1), x + 1

    x = torch.randn(3, 4)
    tracer = Tracer(decompositions=decomps(), check=True)
    tracer.placeholder(x, "x")
    with tracer:
        out = fn(x)
    gm = tracer.output(out)
    assert set(tracer.output_aliases) == {0, 1}
    got = gm(x)
    for g, e in zip(got, fn(x)):
        torch.testing.assert_close(g, e)
    assert got[0].stride() == (1, 4)


def test_data_dependence_is_an_error():
    with pytest.raises(DataDependentError, match=r"\.item\(\)"):
        trace(lambda x: x * x.sum().item(), torch.randn(3))
    with pytest.raises(DataDependentError, match="nonzero"):
        trace(lambda x: torch.nonzero(x), torch.randn(3))
    gm = trace(lambda x: torch.nonzero(x > 0), torch.randn(5), allow_data_dependent=True)
    (nz,) = [n for n in gm.graph.nodes if n.target is prims.extern.nonzero]
    assert nz.meta[NODE_META_KEY].sizes[0].name.startswith("u")


def test_unknown_tensors():
    w = torch.randn(3)

    def fn(x):
        return x * w

    x = torch.randn(3)
    gm = trace(fn, x)
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    torch.testing.assert_close(gm(x), fn(x))
    tracer = Tracer(decompositions=decomps(), unknown_tensors="placeholder")
    tracer.placeholder(x, "x")
    with tracer:
        out = fn(x)
    gm = tracer.output(out)
    assert [n for n, _ in tracer.lifted][0].op == "placeholder"
    torch.testing.assert_close(gm(x, w), fn(x))
    with pytest.raises(TraceError, match="made outside the trace"):
        trace(fn, x, unknown_tensors="error")


def test_a_tensor_made_from_a_number_is_a_constant_of_the_graph():
    """`torch.tensor(number)` is traced as a prims.full of its value (its passes can fold what is
    computed from it); a tensor the program closes over stays an input, read at each call."""
    w = torch.tensor(2.0)

    def fn(x):
        return x / torch.sqrt(torch.tensor(x.shape[-1], dtype=torch.float32) * 3) + w

    x = torch.randn(3)
    tracer = Tracer(decompositions=decomps(), unknown_tensors="placeholder")
    tracer.placeholder(x, "x")
    with tracer:
        out = fn(x)
    gm = tracer.output(out)
    fulls = [n for n in gm.graph.nodes if n.target is prims.full]
    assert [f.args[:3] for f in fulls] == [((), 3.0, torch.float32)]
    assert [t for _, t in tracer.lifted] == [w]  # the closed-over tensor only
    torch.testing.assert_close(gm(x, w), fn(x))
    w.fill_(5.0)
    torch.testing.assert_close(gm(x, w), fn(x))


def test_check_mode_catches_a_wrong_decomposition():
    table = {**decomps(), aten.relu.default: lambda a: prims.abs(a)}
    with pytest.raises(MetaMismatchError, match="aten.relu.default"):
        trace_to_prims(torch.relu, torch.randn(8), decompositions=table, check=True)


def test_tracer_output_metas_match_values():
    def fn(x, y):
        return torch.where(x > 0, x, y).sum(1, keepdim=True) * 2

    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    y = torch.randn(3, 1, 5)
    gm = trace(fn, x, y)
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is prims.where:
            assert n.meta[NODE_META_KEY].strides == utils.make_channels_last_strides_for(
                (2, 3, 4, 5)
            )
    torch.testing.assert_close(gm(x, y), fn(x, y))


def test_repeated_inputs_and_keep_packets():
    x = torch.randn(3)
    gm = trace(lambda a, b: torch.sin(a) * b, x, x, keep={aten.sin})
    assert len([n for n in gm.graph.nodes if n.op == "placeholder"]) == 2
    assert any(n.target is aten.sin.default for n in gm.graph.nodes)
    torch.testing.assert_close(gm(x, x), torch.sin(x) * x)
