"""Convolution as window gathers + matmul (or a reduction): eager, traced and rewritten graphs."""

import pytest
import torch

from ember.ir import NODE_META_KEY
from ember.primtorch import NotDecomposableError, decompose_externs, trace_to_prims
from ember.primtorch.decomp.conv import convolution_as_matmul

aten = torch.ops.aten

# (input shape, weight shape, stride, padding, dilation, groups)
CASES = [
    ((2, 3, 9, 9), (4, 3, 3, 3), 1, 1, 1, 1),  # the common 3x3
    ((2, 3, 9, 9), (4, 3, 1, 1), 1, 0, 1, 1),  # 1x1: a plain matmul
    ((2, 3, 9, 9), (4, 3, 1, 1), 2, 0, 1, 1),  # 1x1 stride 2 (ResNet downsample)
    ((1, 5, 8, 7), (6, 5, 1, 1), 1, 1, 1, 1),  # 1x1 with padding
    ((2, 3, 16, 16), (8, 3, 7, 7), 2, 3, 1, 1),  # a ResNet stem
    ((2, 4, 9, 8), (4, 1, 3, 3), (2, 1), (1, 2), (2, 1), 4),  # depthwise, uneven
    ((2, 6, 10, 10), (12, 1, 3, 3), 1, 1, 1, 6),  # depthwise with a channel multiplier
    ((2, 4, 9, 8), (6, 2, 3, 2), (1, 2), (0, 1), 1, 2),  # grouped
    ((1, 3, 5, 5), (2, 3, 5, 5), 1, 0, 1, 1),  # the window covers the input
    ((2, 3, 11), (5, 3, 3), 2, 1, 2, 1),  # 1-D
    ((2, 4, 12), (4, 1, 5), 1, 2, 1, 4),  # 1-D depthwise
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), (1, 2, 1), (1, 0, 1), (1, 1, 2), 1),  # 3-D
]


def _args(nsp, stride, padding, dilation, groups):
    def tup(v):
        return list(v) if isinstance(v, tuple) else [v] * nsp

    return tup(stride), tup(padding), tup(dilation), False, [0] * nsp, groups


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_matches_aten_convolution(case, bias):
    x_shape, w_shape, *rest = case
    torch.manual_seed(0)
    x, w = torch.randn(x_shape), torch.randn(w_shape)
    b = torch.randn(w_shape[0]) if bias else None
    args = _args(len(x_shape) - 2, *rest)
    got, want = convolution_as_matmul(x, w, b, *args), torch.convolution(x, w, b, *args)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert got.stride() == want.stride()


def test_layouts_follow_the_extern():
    """A channels-last input and a strided (sliced) input give eager's values and strides."""
    w = torch.randn(4, 3, 3, 3)
    args = _args(2, 1, 1, 1, 1)
    for x in (torch.randn(2, 3, 9, 9).to(memory_format=torch.channels_last),
              torch.randn(2, 3, 9, 20)[..., ::2]):  # fmt: skip
        got, want = convolution_as_matmul(x, w, None, *args), torch.convolution(x, w, None, *args)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert got.stride() == want.stride()


def test_half_precision_accumulates_in_float():
    x, w = torch.randn(2, 8, 6, 6).half(), torch.randn(8, 1, 3, 3).half()
    args = _args(2, 1, 1, 1, 8)
    got = convolution_as_matmul(x, w, None, *args)
    want = torch.convolution(x.float(), w.float(), None, *args)
    assert got.dtype is torch.float16
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)


def test_transposed_is_not_decomposed():
    with pytest.raises(NotDecomposableError, match="transposed"):
        convolution_as_matmul(torch.randn(1, 2, 4, 4), torch.randn(2, 3, 3, 3), None, [1, 1],
                              [0, 0], [1, 1], True, [0, 0], 1)  # fmt: skip


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.Conv2d(8, 4, 1),
        torch.nn.ConvTranspose2d(4, 2, 2),  # no decomposition: stays an extern
    ).eval()  # fmt: skip


def test_tracer_no_extern_records_prims_and_matmuls():
    net, x = _net()[:4], torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        gm = trace_to_prims(net, x, no_extern=[aten.convolution])
        want = net(x)
    assert "extern.convolution" not in _targets(gm)
    assert _targets(gm).count("extern.bmm") == 2  # the depthwise conv is a reduction
    torch.testing.assert_close(gm(x), want, atol=1e-5, rtol=1e-5)


def test_decompose_externs_rewrites_a_traced_graph():
    net, x = _net(), torch.randn(2, 3, 10, 10)
    with torch.no_grad():
        gm = trace_to_prims(net, x)
        want = net(x)
    before = _targets(gm)
    rewritten = decompose_externs(gm, ["extern.convolution"])
    assert _targets(gm) == before  # the input graph is left alone
    after = _targets(rewritten)
    assert after.count("extern.convolution") == 1  # the transposed one
    assert after.count("extern.bmm") == 2
    torch.testing.assert_close(rewritten(x), want, atol=1e-5, rtol=1e-5)
    for node in rewritten.graph.nodes:  # every new node carries its TensorMeta
        if node.op == "call_function":
            assert node.meta.get(NODE_META_KEY) is not None, node
