"""Masked attention on CUDA compiles to the memory-efficient kernel (not the float32 math path that
materializes every head's scores), forward and backward, and matches eager. Skipped without CUDA."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.inductor import config
from ember.primtorch.config import config as primtorch_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def attention(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_amp(q, k, v, mask):
    """Called under the caller's bfloat16 autocast (as the benchmark runs models)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()


def _amp(fn):
    if fn is attention_amp:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _inputs(length, dtype, mask_kind):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, length, 64, device="cuda", dtype=dtype, generator=gen)
               for _ in range(3))  # fmt: skip
    keep = torch.rand(2, 1, length, length, device="cuda", generator=gen) > 0.3
    keep[..., 0] = True  # no row fully masked
    if mask_kind == "bool":
        return q, k, v, keep
    mask = torch.zeros(keep.shape, device="cuda", dtype=dtype).masked_fill(~keep, -1e4)
    return q, k, v, mask


@pytest.mark.parametrize("fn", [attention, attention_amp], ids=["bf16", "autocast"])
@pytest.mark.parametrize("length,mask_kind", [(128, "bool"), (77, "float")])
def test_masked_attention_uses_the_efficient_kernel(monkeypatch, capsys, fn, length, mask_kind):
    dtype = torch.bfloat16 if fn is attention else torch.float32
    args = _inputs(length, dtype, mask_kind)
    monkeypatch.setattr(config, "output_code", True)
    # where torch would run it on cuDNN, so does Ember (test_attention_cudnn_cuda.py): this is
    # the path with that off
    monkeypatch.setattr(primtorch_config, "cudnn_attention", False)
    compiled = ember.compile(fn, fullgraph=True)
    with torch.no_grad(), _amp(fn):
        got = compiled(*args)
        want = fn(*args)
    code = capsys.readouterr().out
    assert "extern.sdpa_efficient'" in code, code[-3000:]
    assert "extern.bmm" not in code
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("fn", [attention, attention_amp], ids=["bf16", "autocast"])
def test_masked_attention_training_matches_eager(fn):
    dtype = torch.bfloat16 if fn is attention else torch.float32
    q, k, v, mask = _inputs(77, dtype, "bool")
    args = [q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), mask]
    with _amp(fn):
        got = ember.compile(fn, fullgraph=True)(*args)
        want = fn(*args)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    grads = torch.autograd.grad(got.float().square().sum(), args[:3])
    ref = torch.autograd.grad(want.float().square().sum(), args[:3])
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, atol=5e-2, rtol=5e-2)


def causal_from_sizes(q, k, v):
    """A causal mask built from the sizes alone (as transformers builds one with no mask given)."""
    n = q.shape[2]
    pos = torch.arange(n, device=q.device)
    mask = pos[None, :] <= pos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None].expand(q.shape[0], 1, n, n))


def ones_from_sizes(q, k, v):
    mask = torch.ones(q.shape[0], 1, q.shape[2], k.shape[2], dtype=torch.bool, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("fn", [causal_from_sizes, ones_from_sizes])
def test_constant_mask_runs_flash(monkeypatch, capsys, fn):
    q, k, v, _ = _inputs(128, torch.bfloat16, "bool")
    monkeypatch.setattr(config, "output_code", True)
    monkeypatch.setattr(primtorch_config, "cudnn_attention", False)  # (as above)
    with torch.no_grad():
        got = ember.compile(fn, fullgraph=True)(q, k, v)
        want = fn(q, k, v)
    code = capsys.readouterr().out
    assert "extern.sdpa_flash'" in code and "extern.sdpa_efficient'" not in code, code[-3000:]
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def causal_from_sizes_again(q, k, v):
    """The same attention in a frame of its own (test_constant_mask_runs_flash compiled the
    other one statically)."""
    return causal_from_sizes(q, k, v)


def ones_from_sizes_again(q, k, v):
    return ones_from_sizes(q, k, v)


def causal_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gqa_flag_attention(q, k, v):
    """As transformers calls it with no mask: enable_gqa=True whether or not heads are grouped."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def grouped_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k[:, :2], v[:, :2], is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("fn,mask_kind,kernel", [
    (attention_amp, "bool", "sdpa_efficient"),
    (attention, "float", "sdpa_efficient"),
    (causal_attention, None, "sdpa_flash"),
    (gqa_flag_attention, None, "sdpa_flash"),
    (grouped_attention, None, "sdpa_flash"),
    (causal_from_sizes_again, None, "sdpa_flash"),  # the mask is proved causal for every length
    (ones_from_sizes_again, None, "sdpa_flash"),  # ... and to allow everything
])  # fmt: skip
def test_symbolic_lengths_call_the_kernels_in_one_graph(monkeypatch, capsys, fn, mask_kind,
                                                        kernel):  # fmt: skip
    """With dynamic=True, one compiled graph runs every length through the flash or
    memory-efficient kernel (torch's C++ attention never sees the symbolic sizes)."""
    monkeypatch.setattr(config, "output_code", True)
    compiled = ember.compile(fn, dynamic=True, fullgraph=True)
    dtype = torch.float32 if fn is attention_amp else torch.bfloat16
    for length in (77, 100, 128, 161):
        q, k, v, mask = _inputs(length, dtype, mask_kind or "bool")
        args = (q, k, v) if mask_kind is None else (q, k, v, mask)
        with torch.no_grad(), _amp(fn):
            got = compiled(*args)
            want = fn(*args)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    code = capsys.readouterr().out
    assert code.count("def call(") == 1, "recompiled for a length"
    assert f"extern.{kernel}'" in code and "extern.bmm" not in code, code[-3000:]


def test_symbolic_lm_head_without_bias_under_autocast_is_one_graph(monkeypatch, capsys):
    """A 3-d linear without a bias (GPT-2's LM head) with a symbolic length: torch's C++ linear
    calls numel() on CUDA, so it runs as one mm over the flattened rows (symbolic_composites)."""
    monkeypatch.setattr(config, "output_code", True)
    weight = torch.randn(96, 64, device="cuda")

    def head(x):
        return F.linear(x, weight).float()

    compiled = ember.compile(head, dynamic=True, fullgraph=True)
    for length in (77, 100, 161):
        x = torch.randn(2, length, 64, device="cuda")
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            got, want = compiled(x), head(x)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert capsys.readouterr().out.count("def call(") == 1, "recompiled for a length"


@pytest.mark.parametrize("mask_kind", ["bool", "float", None])
def test_inference_attention_runs_on_cudnn_where_torch_would(monkeypatch, capsys, mask_kind):
    """ember.compile (dynamo, aot_autograd's functionalize, the tracer) records extern.sdpa_cudnn
    exactly where torch itself picks cuDNN for the call, and matches eager. Static sizes: earlier
    tests compile the same functions at other lengths, which would make these sizes symbolic, and
    symbolic traces keep the flash and memory-efficient kernels."""
    from torch.nn.attention import SDPBackend

    import ember.dynamo
    from ember.primtorch.attention import torch_choice

    ember.dynamo.reset()

    q, k, v, mask = _inputs(128, torch.bfloat16, mask_kind or "bool")
    fn, args = (attention, (q, k, v, mask)) if mask_kind else (causal_attention, (q, k, v))
    picks = torch_choice(q, k, v, mask if mask_kind else None, 0.0, not mask_kind, None, False)
    monkeypatch.setattr(config, "output_code", True)
    with torch.no_grad():
        got = ember.compile(fn, fullgraph=True)(*args)
        want = fn(*args)
    code = capsys.readouterr().out
    print(f"torch picks {picks.name}")
    on_cudnn = "extern.sdpa_cudnn'" in code
    assert on_cudnn == (picks == SDPBackend.CUDNN_ATTENTION), code[-3000:]
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def causal_from_sizes_training(q, k, v):
    """The same attention in a frame of its own, trained."""
    return causal_from_sizes(q, k, v).float()


def test_constant_causal_mask_in_training_runs_flash_forward_and_backward(monkeypatch, capsys):
    """A causal mask built from the sizes (transformers' GPT-2 passes one) is dropped in training
    too: torch would run the memory-efficient kernel with the mask, flash attention without."""
    q, k, v, _ = _inputs(128, torch.bfloat16, "bool")
    args = [t.requires_grad_() for t in (q, k, v)]
    monkeypatch.setattr(config, "output_code", True)
    compiled = ember.compile(causal_from_sizes_training, fullgraph=True)
    got = compiled(*args)
    grads = torch.autograd.grad(got.square().sum(), args)
    code = capsys.readouterr().out
    assert "extern.sdpa_flash'" in code and "extern.sdpa_flash_backward'" in code, code[-3000:]
    assert "extern.sdpa_efficient" not in code
    want = causal_from_sizes_training(*args)
    ref = torch.autograd.grad(want.square().sum(), args)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, atol=5e-2, rtol=5e-2)


class _MaskedBlock(torch.nn.Module):
    """Attention over projections, with a mask the caller passes (so it stays a mask)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(64, 3 * 64, device="cuda")

    def forward(self, x, mask):
        q, k, v = self.qkv(x).view(2, 128, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()


def test_efficient_backward_without_dropout_replays_from_a_cuda_graph(monkeypatch):
    """The memory-efficient kernel's seed and offset are CPU tensors; a backward without dropout
    never reads them and gets empty ones on the GPU (attention.without_unread_rng_state), so no
    host tensor keeps the backward from a CUDA graph, and the gradients stay eager's."""
    from ember.inductor import metrics, pipeline

    monkeypatch.setattr(pipeline, "MIN_GRAPHED_STEPS", 1)
    torch.manual_seed(0)
    block = _MaskedBlock()
    compiled = ember.compile(block)
    _, _, _, mask = _inputs(128, torch.bfloat16, "bool")
    metrics.reset()
    inputs, got = [torch.randn(2, 128, 64, device="cuda") for _ in range(6)], []
    for x in inputs:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = compiled(x, mask)
        grads = torch.autograd.grad(out.square().sum(), list(block.parameters()))
        got.append([g.clone() for g in grads])
        del grads  # as a training loop lets go of them: the next replay reuses their memory
    for x, grads in zip(inputs, got):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            want = block(x, mask)
        ref = torch.autograd.grad(want.square().sum(), list(block.parameters()))
        for g, r in zip(grads, ref):
            torch.testing.assert_close(g, r, atol=5e-2, rtol=5e-2)
    skips = [s for s in metrics.cudagraph_skips if "not a CUDA tensor" in s]
    assert not skips, skips
    why = (metrics.cudagraph_skips, metrics.cudagraph_plain_calls)
    assert metrics.cudagraph_replays >= 6, why  # forward and backward, 4 times each
