"""Layouts chosen from how a value's body reads memory (read_layouts.py), in channels-last mode:
the convolutions' NHWC outputs change the layouts that eager's strides were derived from."""

import math

import pytest
import torch
import torch.nn.functional as F
from ember.inductor.config import config
from ember.inductor.loop_ir import ComputedBuffer
from ember.inductor.lowering import lower_graph
from ember.primtorch import trace_to_prims
from inductor_helpers import check

B, R, C, H, W = 2, 2, 8, 4, 4


@pytest.fixture
def channels_last(monkeypatch):
    monkeypatch.setattr(config, "conv_channels_last", True)
    monkeypatch.setattr(config, "fx_cache", False)


def _stored(fn, *args):
    low = lower_graph(trace_to_prims(fn, *args), list(args))
    return [b for b in low.buffers if isinstance(b, ComputedBuffer)]


def _split_attention(a, wc, s, *bn):
    # an inference batch norm and ReLU of a convolution: (B, R*C, H, W), NHWC in channels-last
    # mode, five loads an element: worth storing for its two readers
    y = torch.nn.functional.batch_norm(torch.conv2d(a, wc), *bn)
    y = torch.relu(y)
    y = y.reshape(B, R, C, H, W)
    gap = y.sum(1).mean((2, 3), keepdim=True)  # read once for the gap...
    return torch.conv2d((y * (s + gap.unsqueeze(1))).sum(1), wc[:C, :C])  # ...and once weighted


def test_a_5d_view_of_an_nhwc_activation_is_stored_in_its_order(channels_last):
    torch.manual_seed(0)
    a = torch.randn(B, R * C, H, W).contiguous(memory_format=torch.channels_last)
    wc, s = torch.randn(R * C, R * C, 1, 1), torch.randn(B, R, C, 1, 1)
    bn = [torch.randn(R * C), torch.rand(R * C) + 0.5, torch.randn(R * C), torch.randn(R * C)]
    stored = _stored(_split_attention, a, wc, s, *bn)
    (buf,) = [b for b in stored if math.prod(b.layout.sizes) == B * R * C * H * W]
    reds = [b for b in stored if b.is_reduction()]
    # (B, R, C, H, W) laid out as the NHWC (B, R*C, H, W) it views: B, H, W, R, C outermost first
    assert tuple(int(v) for v in buf.layout.strides) == (H * W * R * C, C, 1, W * R * C, R * C)
    assert len(reds) == 1  # the gap's mean over H and W; the radix sums are pointwise
    check(_split_attention, a, wc, s, *bn, atol=1e-4, rtol=1e-4)  # two convolutions' sums




N = 12  # 3 x 4 patches


def _mixer(img, wc, a1, b1, wt, w1, w2):
    # a vision MLP: patches out of an NHWC convolution, (B, N, C), mixed across N and across C
    x = torch.conv2d(img, wc, stride=2).flatten(2).transpose(1, 2)
    for _ in range(2):
        x = x + F.linear((a1 * x + b1).transpose(1, 2), wt).transpose(1, 2)
        x = x + F.linear(F.gelu(F.linear(a1 * x + b1, w1)), w2)
    return x.mean(1)


def test_a_residual_stream_keeps_the_layout_its_reads_have(channels_last):
    # eager's (B, N, C) patches are (B, C, N) in memory (NCHW); out of an NHWC convolution they
    # are (B, N, C), as the channel MLP's products are: the residual adds store them so
    # (ResMLP: each block's add stored (B, C, N) and transposed both its operands, 31 us a
    # launch against torch's 7.5 on an H200)
    torch.manual_seed(0)
    img, wc = torch.randn(B, 3, 6, 8), torch.randn(C, 3, 2, 2)
    a1, b1, wt = torch.randn(C), torch.randn(C), torch.randn(N, N)
    w1, w2 = torch.randn(4 * C, C), torch.randn(C, 4 * C)
    args = (img, wc, a1, b1, wt, w1, w2)
    adds = [b for b in _stored(_mixer, *args) if tuple(b.layout.sizes) == (B, N, C)]
    assert adds and all(tuple(map(int, b.layout.strides)) == (N * C, C, 1) for b in adds), [
        b.layout.strides for b in adds]
    check(_mixer, *args, atol=1e-3, rtol=1e-4)
