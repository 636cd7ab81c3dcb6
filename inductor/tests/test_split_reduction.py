"""Split reductions: reductions of few long rows run as partial reductions over chunks of their
rows, then a reduction of the partials; results match eager in both renderers."""

import pytest
import torch
import torch.nn.functional as F
from ember.inductor import config
from ember.inductor.lowering import lower_graph
from ember.inductor.split_reduction import _parts, split_reductions
from ember.primtorch import trace_to_prims
from inductor_helpers import check


@pytest.fixture(params=["cpp", "triton"])
def split_on(request, monkeypatch):
    monkeypatch.setattr(config, "split_reductions", True)
    monkeypatch.setattr(config, "cpu_backend", request.param)
    return request.param


def _reductions(fn, *args):
    low = lower_graph(trace_to_prims(fn, *args), list(args))
    return [b for b in low.buffers if getattr(b, "is_reduction", lambda: False)()]


def test_column_sums_of_a_tall_matrix_are_split(split_on):
    # a bias gradient: 4096 rows, 96 columns; the partial kernel and the final one
    x = torch.randn(4096, 96)
    check(lambda a: a.sum(0), x, kernels=2, atol=1e-4, rtol=1e-5)


def test_every_combinable_reduction_matches_eager(split_on):
    x = torch.randn(2048, 12)
    check(lambda a: (a.amax(0), a.amin(0), (a > 2.5).any(0), a.mean()), x, atol=1e-5, rtol=1e-5)
    check(lambda a: (1 + a * 1e-3).prod(0), x, atol=1e-5, rtol=1e-4)


def test_a_bfloat16_reduction_keeps_its_partials_in_float32(split_on):
    # a max over bfloat16 values is a bfloat16 reduction: its partials are float32 (the dtype
    # its kernels compute in), the final reduction rounds once (a sum already reduces in float32)
    x = torch.randn(8192, 8).to(torch.bfloat16)
    check(lambda a: (a.sum(0), a.amax(0)), x, atol=0.1, rtol=1e-2)
    parts = split_reductions(_reductions(lambda a: a.amax(0), x), "cpu")
    assert [b.dtype for b in parts] == [torch.float32, torch.bfloat16]


def test_batch_norm_statistics_over_several_dims_are_split(split_on):
    # per channel over (N, H, W) of a channels-last activation: the split cuts N, then H
    x = torch.randn(4, 8, 16, 16).to(memory_format=torch.channels_last)
    check(lambda a: (a.sum((0, 2, 3)), (a * a).mean((0, 2, 3))), x, atol=1e-4, rtol=1e-5)


def test_an_elementwise_sibling_joins_the_partial_kernel(split_on):
    # a LayerNorm backward's pattern: a column sum and a pointwise value over the same rows
    x, y = torch.randn(2048, 32), torch.randn(2048, 32)
    check(lambda a, b: ((a * b).sum(0), a * 2 + b), x, y, kernels=2, atol=1e-4, rtol=1e-5)


def test_which_reductions_split():
    tall = _reductions(lambda a: a.sum(0), torch.randn(4096, 768))[0]
    assert _parts(tall) == [16]  # 48 blocks of 16 columns -> 768 programs of 256 rows
    wide = _reductions(lambda a: a.sum(0), torch.randn(4096, 65536))[0]
    assert _parts(wide) is None  # 4096 programs already
    short = _reductions(lambda a: a.sum(-1), torch.randn(4, 512))[0]
    assert _parts(short) is None  # rows of 512: fewer than 4 chunks of 256
    many_rows = _reductions(lambda a: a.sum(-1), torch.randn(1024, 8192))[0]
    assert _parts(many_rows) is None  # 1024 rows, a program each
    arg = _reductions(lambda a: a.argmax(0), torch.randn(4096, 8))[0]
    assert _parts(arg) is None  # a partial argmax's index is not the argmax's
    row = _reductions(lambda a: a.pow(2).mean(-1), torch.randn(1, 4096))[0]
    assert _parts(row) is None  # a decoding step's RMSNorm: one persistent row, fused
    whole = _reductions(lambda a: a.sum(), torch.randn(4096, 64))[0]
    assert _parts(whole) == [1024, 1]  # one row of 262144: 1024 chunks of 256 (4 rows of 64)
