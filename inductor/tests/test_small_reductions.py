"""A reduction of a few elements across an outer dimension (split attention's sum over its radix
branches) is a pointwise value, and a 5-D view of a channels-last activation is stored in its
source's order: resnest50d's radix sums ran as reduction kernels whose loops followed the
output's row-major index over NHWC data (one element per 32-byte sector), 1.4 ms of its 4.8
(H200, bf16, batch 32; reduce-overhead 0.70x)."""

import math

import pytest
import torch
from ember.inductor.config import config
from ember.inductor.loop_ir import ComputedBuffer
from ember.inductor.lowering import lower_graph
from ember.primtorch import trace_to_prims
from inductor_helpers import check

B, R, C, H, W = 2, 2, 8, 4, 4


def _reductions(fn, *args):
    low = lower_graph(trace_to_prims(fn, *args), list(args))
    return low, [b for b in low.buffers if isinstance(b, ComputedBuffer) and b.is_reduction()]


def test_a_sum_over_few_outer_elements_is_pointwise():
    x = torch.randn(B, R, C, H, W)
    _, reds = _reductions(lambda x: x.sum(1), x)
    assert reds == []


def test_a_row_reduction_stays_a_reduction():
    # softmax over short rows: one kernel reduces the row and writes it, with no copy between
    x = torch.randn(B, C, 4)
    _, reds = _reductions(lambda x: torch.softmax(x, -1), x)
    assert len(reds) == 2  # max and sum, fused into one kernel by the scheduler


def test_a_long_outer_reduction_stays_a_reduction():
    x = torch.randn(B, 16, C)
    _, reds = _reductions(lambda x: x.sum(1), x)
    assert len(reds) == 1


@pytest.mark.parametrize("rtype", ["sum", "amax", "amin", "prod", "mean", "any"])
def test_unrolled_values_are_eager_ones(rtype):
    x = torch.randn(B, 3, C, 5)
    x[0, 1, 2, 3] = float("nan")  # max and min propagate it, as eager's do
    if rtype == "any":
        check(lambda x: (x > 1).any(1), x)
    else:
        check(lambda x: getattr(torch, rtype)(x, 1), x)
    check(lambda x: x.var(1), x)  # var's mean, then its squared deviations: both unrolled


def test_bf16_sum_rounds_once_as_eager():
    x = torch.randn(B, 4, C, H).to(torch.bfloat16)
    check(lambda x: x.sum(1) * 3, x)


def _split_attention(a, wc, s, *bn):
    # an inference batch norm and ReLU of a convolution: (B, R*C, H, W), NHWC in channels-last
    # mode, five loads an element: worth storing for its two readers
    y = torch.nn.functional.batch_norm(torch.conv2d(a, wc), *bn)
    y = torch.relu(y)
    y = y.reshape(B, R, C, H, W)
    gap = y.sum(1).mean((2, 3), keepdim=True)  # read once for the gap...
    return torch.conv2d((y * (s + gap.unsqueeze(1))).sum(1), wc[:C, :C])  # ...and once weighted


@pytest.fixture
def channels_last(monkeypatch):
    monkeypatch.setattr(config, "conv_channels_last", True)
    monkeypatch.setattr(config, "fx_cache", False)


def test_a_5d_view_of_an_nhwc_activation_is_stored_in_its_order(channels_last):
    a = torch.randn(B, R * C, H, W).contiguous(memory_format=torch.channels_last)
    wc, s = torch.randn(R * C, R * C, 1, 1), torch.randn(B, R, C, 1, 1)
    bn = [torch.randn(R * C), torch.rand(R * C) + 0.5, torch.randn(R * C), torch.randn(R * C)]
    low, reds = _reductions(_split_attention, a, wc, s, *bn)
    whole = B * R * C * H * W
    (buf,) = [b for b in low.buffers if isinstance(b, ComputedBuffer)
              and math.prod(b.layout.sizes) == whole]  # fmt: skip
    # (B, R, C, H, W) laid out as the NHWC (B, R*C, H, W) it views: B, H, W, R, C outermost first
    assert tuple(int(v) for v in buf.layout.strides) == (H * W * R * C, C, 1, W * R * C, R * C)
    assert len(reds) == 1  # the gap's mean over H and W; the radix sums are pointwise
    check(_split_attention, a, wc, s, *bn)
