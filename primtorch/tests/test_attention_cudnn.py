"""cuDNN attention on CPU: the extern's meta and layout fix, and when the tracer chooses it.

The choice asks torch's `_fused_sdp_choice`, which never answers cuDNN without a GPU: here it is
stubbed (`ask=`), so these tests check Ember's half of the decision. The kernel itself is run in
test_extern_cuda.py and inductor/tests/test_inductor_gpu.py (marked gpu).
"""

import pytest
import torch
from torch.nn.attention import SDPBackend

from ember.primtorch import prims
from ember.primtorch.attention import (
    CUDNN_MASKED,
    choose_cudnn,
    cudnn_attention,
    cudnn_bias,
    cudnn_takes_mask,
)
from ember.primtorch.config import config
from ember.primtorch.prims.extern import ARG_STRIDES, cudnn_output_strides, in_cudnn_layout

B, H, L, S, E = 2, 4, 40, 24, 16


def _bhle(length=L, dtype=torch.bfloat16):
    return torch.randn(B, H, length, E, dtype=dtype)


def _blhe(length=L, dtype=torch.bfloat16):  # (B, L, H, E) storage, as after a head split
    return torch.randn(B, length, H, E, dtype=dtype).transpose(1, 2)


def _ints(strides):
    return tuple(int(s) for s in strides)


# --- the extern's meta and the layout it promises ------------------------------------------------


def test_meta_declares_the_querys_layout():
    for q in (_bhle(), _blhe()):
        k, v = _bhle(S), _bhle(S)
        meta = prims.extern.sdpa_cudnn.meta(q, k, v, None, True, scale=0.5)
        assert tuple(int(n) for n in meta.sizes) == (B, H, L, E)
        assert _ints(meta.strides) == q.stride() and meta.dtype == torch.bfloat16
    bias = torch.zeros(1, 1, L, S, dtype=torch.bfloat16)
    assert _ints(prims.extern.sdpa_cudnn.meta(_blhe(), _bhle(S), _bhle(S), bias).strides) == \
        _blhe().stride()  # fmt: skip


def test_meta_follows_torchs_rule_when_value_head_differs():
    # torch's rule: the output takes the query's dimension order, dense in its own sizes
    q = _blhe()  # order B, L, H, E outermost first
    assert _ints(cudnn_output_strides(q.shape, q.stride(), (B, H, L, 32))) == (
        L * H * 32, 32, H * 32, 1)  # fmt: skip
    c = _bhle()
    assert _ints(cudnn_output_strides(c.shape, c.stride(), (B, H, L, 32))) == (
        H * L * 32, L * 32, 32, 1)  # fmt: skip


def test_meta_refuses_what_cudnn_does_not_take():
    q = _bhle()
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        prims.extern.sdpa_cudnn.meta(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match="attn_bias"):
        prims.extern.sdpa_cudnn.meta(q, q, q, torch.zeros(L, L + 1, dtype=torch.bfloat16))


@pytest.mark.parametrize("query_layout", [_bhle, _blhe])
@pytest.mark.parametrize("returned", ["bhle", "blhe"])
def test_the_output_is_copied_into_the_declared_layout_only_when_it_differs(query_layout,
                                                                            returned):  # fmt: skip
    # cuDNN's output layout depends on the torch and cuDNN versions: fake outputs of both
    # layouts (on the meta device: only strides matter) against queries of both layouts
    q = query_layout().to("meta")
    out = (_bhle() if returned == "bhle" else _blhe()).to("meta")
    fixed = in_cudnn_layout(out, q)
    assert fixed.stride() == q.stride() and fixed.shape == out.shape
    assert (fixed is out) == (out.stride() == q.stride())


def test_the_layout_fix_keeps_values():
    q = _blhe(dtype=torch.float32)
    out = torch.randn(B, H, L, E)  # contiguous, where the query is (B, L, H, E)
    fixed = in_cudnn_layout(out, q)
    assert fixed.stride() == q.stride() and torch.equal(fixed, out)


def test_the_lowering_aligns_the_bias_and_keeps_unit_stride_rows():
    rules = ARG_STRIDES["extern.sdpa_cudnn"]
    assert _ints(rules[3]((2, 1, 77, 77), (5929, 5929, 77, 1))) == (6160, 6160, 80, 1)
    assert _ints(rules[0]((B, H, L, E), (L * H * E, E, H * E, 1))) == (L * H * E, E, H * E, 1)
    assert _ints(rules[1]((B, H, L, E), (H * L * E, L * E, 1, L))) == (H * L * E, L * E, E, 1)


# --- the decision ---------------------------------------------------------------------------------


class _Ask:
    """A stand-in for torch's choice: answers `backend` and remembers what it was asked."""

    def __init__(self, backend=SDPBackend.CUDNN_ATTENTION):
        self.backend, self.calls = backend, []

    def __call__(self, *args, cudnn=None):
        self.calls.append((args, cudnn))
        return self.backend


def _choose(*args, ask=None, cudnn_enabled=True, **kwargs):
    ask = ask or _Ask()
    with torch.no_grad():
        return choose_cudnn(*args, cudnn_enabled=cudnn_enabled, ask=ask, **kwargs)


def test_cudnn_is_chosen_exactly_when_torch_would_choose_it():
    q, k, v = _bhle(), _bhle(S), _bhle(S)
    mask = torch.rand(B, 1, L, S) > 0.2
    ask = _Ask()
    assert _choose(q, k, v, mask, ask=ask)
    (args, cudnn), = ask.calls
    assert cudnn is True and args[3] is mask  # asked about the user's mask, cuDNN on
    for other in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
        assert not _choose(q, k, v, mask, ask=_Ask(other))
    assert _choose(q, k, v, is_causal=True) and _choose(q, k, v)


def test_cudnn_is_not_chosen_against_the_users_setting_or_config(monkeypatch):
    q, k, v = _bhle(), _bhle(S), _bhle(S)
    ask = _Ask()
    assert not _choose(q, k, v, ask=ask, cudnn_enabled=False)
    monkeypatch.setattr(config, "cudnn_attention", False)
    assert not _choose(q, k, v, ask=ask)
    assert not ask.calls  # decided before asking torch


def test_training_keeps_todays_path():
    q, k, v = _bhle(), _bhle(S), _bhle(S)
    with torch.enable_grad():
        assert not choose_cudnn(q, k, v, cudnn_enabled=True, ask=_Ask())


@pytest.mark.parametrize(
    "case",
    ["float32", "head_not_multiple_of_8", "head_over_256", "value_head_differs", "dropout",
     "gqa", "3d", "mask_heads", "mask_keys", "int_mask", "3d_mask_batch"],
)  # fmt: skip
def test_outside_cudnns_supported_set_torch_is_not_even_asked(case):
    q, k, v, mask = _bhle(), _bhle(S), _bhle(S), None
    kwargs = {}
    if case == "float32":
        q, k, v = (t.float() for t in (q, k, v))
    elif case == "head_not_multiple_of_8":
        q, k, v = (t[..., :12] for t in (q, k, v))
    elif case == "head_over_256":
        q, k, v = (torch.randn(B, H, n, 264, dtype=torch.bfloat16) for n in (L, S, S))
    elif case == "value_head_differs":
        v = torch.randn(B, H, S, 32, dtype=torch.bfloat16)
    elif case == "dropout":
        kwargs["dropout_p"] = 0.1
    elif case == "gqa":
        kwargs["enable_gqa"] = True
    elif case == "3d":
        q, k, v = (t[0] for t in (q, k, v))
    elif case == "mask_heads":
        mask = torch.zeros(B, 3, L, S)
    elif case == "mask_keys":
        mask = torch.zeros(L, S + 1)
    elif case == "int_mask":
        mask = torch.zeros(L, S, dtype=torch.int32)
    elif case == "3d_mask_batch":
        mask = torch.zeros(B, L, S)  # ATen would expand it to (B, 1, L, S): a failure
    ask = _Ask()
    assert not _choose(q, k, v, mask, ask=ask, **kwargs)
    assert not ask.calls


def test_masks_cudnn_takes():
    q, k = _bhle(), _bhle(S)
    for shape in ((L, S), (1, L, S), (B, 1, L, S), (1, H, L, S), (B, H, 1, S), (1, 1, 1, S)):
        assert cudnn_takes_mask(torch.zeros(shape), q, k), shape
        assert cudnn_takes_mask(torch.zeros(shape, dtype=torch.bool), q, k), shape


def test_autocast_inputs_count_in_autocasts_dtype():
    q, k, v = (t.float() for t in (_bhle(), _bhle(S), _bhle(S)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _choose(q, k, v)


# --- the bias -------------------------------------------------------------------------------------


def test_a_boolean_mask_becomes_torchs_cudnn_bias():
    keep = torch.rand(B, 1, 77, 77) > 0.3
    bias = cudnn_bias(keep, torch.bfloat16)
    assert bias.shape == (B, 1, 77, 77) and bias.stride() == (77 * 80, 77 * 80, 80, 1)
    assert bias.dtype == torch.bfloat16
    want = torch.zeros(keep.shape, dtype=torch.bfloat16).masked_fill(~keep, CUDNN_MASKED)
    assert torch.equal(bias, want)


def test_a_float_mask_is_lifted_to_4d_with_broadcast_dims_of_size_1():
    mask = torch.randn(L, 64)
    bias = cudnn_bias(mask, torch.float16)
    assert bias.shape == (1, 1, L, 64) and bias.stride()[-2:] == (64, 1)  # aligned: as it is
    assert torch.equal(bias[0, 0], mask.half())


def test_cudnn_attention_leaves_what_torch_would_not_run_on_cudnn_to_the_other_paths():
    q, k, v = _bhle(), _bhle(S), _bhle(S)
    keep = torch.rand(L, S) > 0.5
    with torch.no_grad():
        refused = _Ask(SDPBackend.EFFICIENT_ATTENTION)
        assert cudnn_attention(q, k, v, keep, cudnn_enabled=True, ask=refused) is None
        # and where the kernel itself refuses (here: no CUDA), torch's choice decides as before
        assert cudnn_attention(q, k, v, keep, cudnn_enabled=True, ask=_Ask()) is None


# --- in the tracer --------------------------------------------------------------------------------


def _stub_cudnn(monkeypatch, backend=SDPBackend.CUDNN_ATTENTION):
    """torch answers `backend`; the kernel is a CPU stand-in (the math attention of its call)."""
    from ember.primtorch import attention

    def ref(query, key, value, attn_bias=None, is_causal=False, *, scale=None):
        if is_causal:
            attn_bias = torch.zeros(query.shape[2], key.shape[2], dtype=query.dtype).masked_fill(
                ~torch.ones(query.shape[2], key.shape[2], dtype=torch.bool).tril(), CUDNN_MASKED)
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_bias, scale=scale)

    monkeypatch.setattr(attention, "torch_choice", _Ask(backend))
    monkeypatch.setattr(prims.extern.sdpa_cudnn, "ref", ref)


def _trace(fn, *args):
    from ember.primtorch.trace import trace_to_prims

    with torch.no_grad():
        gm = trace_to_prims(fn, *args)
    return gm, [n for n in gm.graph.nodes if n.target is prims.extern.sdpa_cudnn]


def _one(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _sliding_window(x, w):
    b, t, _ = x.shape
    q = (x @ w).view(b, t, 2, 16).transpose(1, 2)
    i = torch.arange(t)
    keep = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 4)
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=keep)


def _causal_from_sizes(x, w):
    b, t, _ = x.shape
    q = (x @ w).view(b, t, 2, 16).transpose(1, 2)
    keep = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=keep)


def test_the_tracer_records_sdpa_cudnn_where_torch_would_choose_cudnn(monkeypatch):
    _stub_cudnn(monkeypatch)
    x, w = torch.randn(2, 12, 32, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    gm, (call,) = _trace(_sliding_window, x, w)
    bias = call.args[3]
    assert bias is not None and call.args[4] is False
    with torch.no_grad():
        torch.testing.assert_close(_one(gm(x, w)), _sliding_window(x, w), atol=2e-2, rtol=2e-2)


def test_a_constant_causal_mask_becomes_is_causal_without_a_bias(monkeypatch):
    _stub_cudnn(monkeypatch)
    x, w = torch.randn(2, 12, 32, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    gm, (call,) = _trace(_causal_from_sizes, x, w)
    assert call.args[3] is None and call.args[4] is True
    with torch.no_grad():
        torch.testing.assert_close(_one(gm(x, w)), _causal_from_sizes(x, w), atol=2e-2, rtol=2e-2)


def test_where_torch_would_not_choose_cudnn_the_trace_is_todays(monkeypatch):
    _stub_cudnn(monkeypatch, SDPBackend.FLASH_ATTENTION)
    x, w = torch.randn(2, 12, 32, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    _, calls = _trace(_sliding_window, x, w)
    assert not calls
    monkeypatch.setattr(config, "cudnn_attention", False)
    _stub_cudnn(monkeypatch)
    _, calls = _trace(_sliding_window, x, w)
    assert not calls


def test_the_tracer_records_only_the_inference_form_of_the_aten_op(monkeypatch):
    # a training call (log-sum-exp for the backward) has no extern: not decomposable, as before
    from ember.primtorch.errors import NotDecomposableError

    _stub_cudnn(monkeypatch)
    q, k, v = _bhle(), _bhle(S), _bhle(S)
    aten = torch.ops.aten
    gm, (call,) = _trace(lambda q, k, v: aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, False, 0.0, True, False, scale=0.5)[0], q, k, v)
    assert call.args[3:] == (None, True) and call.kwargs == {"scale": 0.5}
    with pytest.raises(NotDecomposableError):
        _trace(lambda q, k, v: aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, False, False)[0], q, k, v)


def test_the_tracer_asks_with_cudnn_as_the_user_had_it(monkeypatch):
    _stub_cudnn(monkeypatch)
    x, w = torch.randn(2, 12, 32, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(False)
        _, calls = _trace(_sliding_window, x, w)
        assert not calls and not torch.backends.cuda.cudnn_sdp_enabled()
        torch.backends.cuda.enable_cudnn_sdp(True)
        _, calls = _trace(_sliding_window, x, w)
        assert len(calls) == 1 and torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
