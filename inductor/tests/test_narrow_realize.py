"""A value stored only because float32 readers read it twice is stored at its own (narrower)
width: split attention's radix sums read a bf16 activation in float32, and the float32 copy
was stored instead, twice the bytes to write and to read back (resnest50d, H200: 0.72x
reduce-overhead; its three such kernels 665 us of 5,160)."""

import math

import torch
from ember.inductor.loop_ir import ComputedBuffer
from ember.inductor.lowering import lower_graph
from ember.primtorch import trace_to_prims

B, R, C, H, W = 2, 2, 8, 4, 4


def _wide(a, w, b):
    x = torch.sigmoid(a.float() * w + b).to(torch.bfloat16)  # (B, R*C, H, W), bf16
    return x.reshape(B, R, C, H, W).float()


def _split_attention(a, w, b, s):
    y = _wide(a, w, b)  # read twice, in float32
    return y.sum(1), (y * s).sum(1)


def _inputs():
    a = torch.randn(B, R * C, H, W).to(torch.bfloat16)
    a = a.contiguous(memory_format=torch.channels_last)  # as a channels-last conv leaves it
    w, b = torch.randn(1, R * C, 1, 1), torch.randn(1, R * C, 1, 1)
    return a, w, b, torch.randn(B, R, C, 1, 1)


def _stored(args):
    low = lower_graph(trace_to_prims(_split_attention, *args), list(args))
    whole = B * R * C * H * W
    return [b for b in low.buffers
            if isinstance(b, ComputedBuffer) and math.prod(b.layout.sizes) == whole]


def test_the_activation_is_stored_in_bf16_in_the_wide_values_layout():
    args = _inputs()
    (buf,) = _stored(args)
    assert buf.layout.dtype == torch.bfloat16
    assert tuple(int(s) for s in buf.layout.strides) == _wide(*args[:3]).stride()


def _also_returned(a, w, b):
    y = _wide(a, w, b)
    return y.sum(1), y.amax(1), y  # the wide value is stored anyway: as the output


def test_a_wide_value_stored_anyway_is_not_stored_twice():
    args = _inputs()[:3]
    low = lower_graph(trace_to_prims(_also_returned, *args), list(args))
    whole = B * R * C * H * W
    stored = [b.layout.dtype for b in low.buffers
              if isinstance(b, ComputedBuffer) and math.prod(b.layout.sizes) == whole]
    assert stored == [torch.float32]


def test_the_values_are_eager_ones():
    from inductor_helpers import check

    check(_split_attention, *_inputs())
