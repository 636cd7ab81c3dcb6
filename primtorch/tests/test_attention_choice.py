"""The tracer's attention choices that need no GPU: which constant masks become flash attention."""

import torch
import torch.fx as fx

from ember.primtorch.attention import _constant_mask_kind, _depends_on_inputs, efficient_attention


def test_constant_mask_kinds():
    n = 6
    zeros = torch.zeros(2, 1, n, n)
    assert _constant_mask_kind(zeros, n, n) == "none"
    causal = torch.zeros(n, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf)
    assert _constant_mask_kind(causal.expand(2, 3, n, n), n, n) == "causal"
    finfo_min = torch.zeros(n, n).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(),
                                              torch.finfo(torch.float32).min)  # fmt: skip
    assert _constant_mask_kind(finfo_min, n, n) == "causal"
    assert _constant_mask_kind(causal.T.contiguous(), n, n) is None  # anti-causal
    soft = causal.clone()
    soft[3, 0] = -1.0  # a bias that is neither zero nor masked out
    assert _constant_mask_kind(soft, n, n) is None
    assert _constant_mask_kind(causal[:4], 4, n) is None  # not square: no is_causal equivalent


def test_depends_on_inputs():
    g = fx.Graph()
    x = g.placeholder("x")
    const = g.call_function(torch.ones, ((3,),))
    mixed = g.call_function(torch.add, (const, x))
    assert not _depends_on_inputs(const)
    assert _depends_on_inputs(mixed)


def test_cpu_attention_is_left_to_torch():
    q = torch.randn(1, 2, 8, 16)
    with torch.no_grad():
        assert efficient_attention(q, q, q, torch.ones(8, 8, dtype=torch.bool)) is None


def test_the_efficient_kernels_bias_is_padded_to_16_and_broadcast_where_size_1():
    from ember.primtorch.attention import efficient_bias

    query = torch.zeros(2, 4, 77, 64)
    keep = torch.rand(2, 1, 77, 77) > 0.3
    bias = efficient_bias(keep, query, torch.bfloat16)
    assert bias.shape == (2, 4, 77, 77) and bias.stride() == (77 * 80, 0, 80, 1)
    assert bias.dtype == torch.bfloat16
    assert torch.equal(bias[:, 0] == float("-inf"), ~keep[:, 0])
    assert (bias[:, 3][keep[:, 0]] == 0).all()
    row = efficient_bias(torch.randn(2, 1, 1, 80), query, torch.float32)  # aligned: no copy
    assert row.shape == (2, 4, 77, 80) and row.stride() == (80, 0, 0, 1)
    assert efficient_bias(torch.ones(1, 1, 1, 1, 77, dtype=torch.bool), query, torch.float32) is None
    assert efficient_bias(torch.ones(2, 1, 77, 77, dtype=torch.int64), query, torch.float32) is None
