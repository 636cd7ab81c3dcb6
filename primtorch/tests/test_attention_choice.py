"""The tracer's attention choices that need no GPU: which constant masks become flash attention."""

import pytest
import torch
import torch.fx as fx

from ember.primtorch.attention import (
    _constant_mask_kind,
    _depends_on_inputs,
    efficient_attention,
    without_unread_rng_state,
)
from ember.primtorch.prims.extern import ATEN_TO_EXTERN, rng_state_of

aten = torch.ops.aten


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


def test_boolean_constant_mask_kinds():
    n = 5
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    assert _constant_mask_kind(torch.ones(1, 1, n, n, dtype=torch.bool), n, n) == "none"
    assert _constant_mask_kind(tril[None, None], n, n) == "causal"
    assert _constant_mask_kind(tril.T.contiguous(), n, n) is None


def _cpu_attention_trace(mask_of):
    from ember.primtorch.trace import trace_to_prims

    def fn(x, w):
        b, t, _ = x.shape
        q = (x @ w).view(b, t, 2, 8).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask_of(x, t))

    x, w = torch.randn(2, 7, 16), torch.randn(16, 16)
    gm = trace_to_prims(fn, x, w)
    (call,) = [n for n in gm.graph.nodes if "sdpa_flash_cpu" in str(n.target)]
    out = gm(x, w)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, fn(x, w))
    return call


def test_a_constant_mask_on_the_cpu_becomes_the_flash_kernels_own():
    # transformers builds a causal or an all-allowing mask from the sizes when none is given; the
    # CPU flash kernel then runs causally (skipping the blocks above the diagonal), without a mask
    causal = _cpu_attention_trace(lambda x, t: torch.ones(t, t, dtype=torch.bool).tril())
    assert causal.kwargs.get("attn_mask") is None and causal.args[4] is True
    ones = _cpu_attention_trace(lambda x, t: torch.zeros(x.shape[0], 1, t, t))
    assert ones.kwargs.get("attn_mask") is None and ones.args[4] is False
    # a mask read from the input, or one with another pattern, stays
    read = _cpu_attention_trace(lambda x, t: (x.sum(-1) > -1e30)[:, None, None, :])
    assert read.kwargs.get("attn_mask") is not None
    banded = _cpu_attention_trace(lambda x, t: torch.ones(t, t, dtype=torch.bool).triu(-1).tril(1))
    assert banded.kwargs.get("attn_mask") is not None


_ATTENTION_BACKWARDS = [aten._scaled_dot_product_efficient_attention_backward.default,
                        aten._scaled_dot_product_flash_attention_backward.default]  # fmt: skip


@pytest.mark.parametrize("func", _ATTENTION_BACKWARDS)
def test_an_attention_backwards_rng_state_is_declared_where_aten_has_it(func):
    # the tracer and inductor's CUDA graphs both read the extern's declaration: its positions
    # must be those of ATen's own arguments, the extern and the ATen op alike
    state = rng_state_of(func)
    names = [a.name for a in func._schema.arguments]
    assert names[state.dropout] == "dropout_p"
    assert [names[i] for i in state.args] == ["philox_seed", "philox_offset"]
    extern_op = ATEN_TO_EXTERN[func][0]
    assert rng_state_of(extern_op) is state is rng_state_of(extern_op.schema.name)
    assert rng_state_of(aten.mm.default) is None and rng_state_of("extern.mm") is None


def test_the_efficient_forwards_seed_and_offset_are_its_declared_rng_results():
    state = rng_state_of(aten._scaled_dot_product_efficient_attention.default)
    assert state.results == (2, 3) and state.args == ()
    assert state.without_dropout([1, 2, 3, None, True], {})  # dropout_p left to its default
    assert not state.without_dropout([1, 2, 3, None, True], {"dropout_p": 0.1})


@pytest.mark.parametrize("func", _ATTENTION_BACKWARDS)
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_backward_without_dropout_gets_its_own_empty_rng_state(func, dropout):
    state = rng_state_of(func)
    args = [torch.empty(0, device="meta") for _ in range(max(state.dropout, *state.args) + 1)]
    args[state.dropout] = dropout
    seed, offset = (args[i] for i in state.args)
    got = without_unread_rng_state(func, tuple(args), lambda d: torch.empty((), device=d))
    if dropout:
        assert got == tuple(args)  # a dropout reads the forward's state
    else:
        assert got[state.args[0]] is not seed and got[state.args[1]] is not offset
        assert [got[i].shape for i in state.args] == [(), ()]
        others = [i for i in range(len(args)) if i not in state.args]
        assert all(got[i] is args[i] for i in others)


def test_a_wrong_rng_state_declaration_is_refused_when_the_extern_is_registered():
    from ember.primtorch.prims.extern import RngState, _check_rng_state, sdpa_efficient_backward

    with pytest.raises(ValueError, match="not dropout_p"):
        _check_rng_state(sdpa_efficient_backward, RngState(dropout=8, args=(7,)))
    with pytest.raises(ValueError, match="not a philox argument"):
        _check_rng_state(sdpa_efficient_backward, RngState(dropout=9, args=(6, 7)))
