"""Training through scaled_dot_product_attention on the CPU with Ember's own kernels: the
generated flash-attention forward (which then writes the log-sum-exp too) and its backward
(ember.inductor.cpu_attention_backward): gradients against eager's, and that neither graph
calls torch's attention.

Cross-component: dynamo captures, aot_autograd saves the forward's output and log-sum-exp,
primtorch records torch's CPU flash calls, inductor lowers both.
"""

import pytest
import torch
import torch.nn.functional as F

import ember
import ember.dynamo
from ember.inductor import config


@pytest.fixture(autouse=True)
def _the_generated_kernel(monkeypatch):
    """These tests are of Ember's kernel: "auto" would leave bf16 to torch on a CPU with AMX."""
    monkeypatch.setattr(config, "cpu_flash_attention", True)


FP32 = dict(atol=2e-5, rtol=1e-4)
BF16 = dict(atol=3e-2, rtol=3e-2)


def _output_and_grads(fn, q, k, v, m, grad):
    """fn's output and q, k, v's gradients after one backward of `grad` (the grads reset)."""
    out = fn(q, k, v, m)
    out.backward(grad)
    got = [out.detach()] + [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    return got


def _inputs(b, h, length, source, e, dtype, hkv=None, mask_shape=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, length, e, generator=g).to(dtype).requires_grad_()
    k = torch.randn(b, hkv or h, source, e, generator=g).to(dtype).requires_grad_()
    v = torch.randn(b, hkv or h, source, e, generator=g).to(dtype).requires_grad_()
    m = None if mask_shape is None else torch.randn(mask_shape, generator=g).to(dtype)
    grad = torch.randn(b, h, length, e, generator=g).to(dtype)
    return q, k, v, m, grad


def _check(monkeypatch, fn, q, k, v, m, grad, tol=FP32):
    """Ember's output and gradients against eager's; the programs' sources, which must run
    the generated forward and backward and call no torch attention."""
    sources = []
    monkeypatch.setattr(config, "output_code", True)
    monkeypatch.setattr("builtins.print", lambda *a, **kw: sources.append(" ".join(map(str, a))))
    ember.dynamo.reset()
    got = _output_and_grads(ember.compile(fn), q, k, v, m, grad)
    want = _output_and_grads(fn, q, k, v, m, grad)
    for name, a, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.dtype == w.dtype and a.shape == w.shape, name
        torch.testing.assert_close(a.float(), w.float(), **tol, msg=lambda s: f"{name}: {s}")
    text = "\n".join(sources)
    assert "flash_attention_buf" in text and "flash_attention_backward_" in text, text[-3000:]
    assert "extern_sdpa" not in text, text[-3000:]


def _sdpa(causal=False, gqa=False):
    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                              enable_gqa=gqa)  # fmt: skip

    return fn


@pytest.mark.parametrize("length, source", [(37, 45), (70, 21), (1, 9)])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_at_odd_lengths(monkeypatch, length, source, causal):
    # lengths that fill no block; causal with more keys than queries and fewer
    _check(monkeypatch, _sdpa(causal), *_inputs(2, 3, length, source, 40, torch.float32))


@pytest.mark.parametrize("shape", [(37, 45), (2, 1, 1, 45), (2, 4, 37, 45), (1, 4, 1, 45)])
def test_gradients_with_masks(monkeypatch, shape):
    _check(monkeypatch, _sdpa(), *_inputs(2, 4, 37, 45, 32, torch.float32, mask_shape=shape))


@pytest.mark.parametrize("hkv, causal", [(2, False), (1, True)])
def test_gradients_of_grouped_and_multi_query_attention(monkeypatch, hkv, causal):
    # dk and dv sum over the query heads of a group
    _check(monkeypatch, _sdpa(causal, gqa=True), *_inputs(2, 4, 33, 50, 64, torch.float32, hkv))


def test_boolean_mask_with_a_row_that_allows_nothing(monkeypatch):
    # eager gives such a row no output and no gradient; so do the kernels
    q, k, v, _, grad = _inputs(2, 2, 33, 40, 32, torch.float32)
    mask = torch.rand(2, 1, 33, 40, generator=torch.Generator().manual_seed(2)) > 0.4
    mask[:, :, 5] = False
    _check(monkeypatch, _sdpa(), q, k, v, mask, grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("masked", [False, True])
def test_half_precision_gradients(monkeypatch, dtype, masked):
    inputs = _inputs(2, 4, 45, 67, 64, dtype, hkv=2, mask_shape=(45, 67) if masked else None)
    _check(monkeypatch, _sdpa(not masked, gqa=True), *inputs, tol=BF16)


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_builds_by_isa(monkeypatch, isa):
    monkeypatch.setattr(config, "isa", isa)
    inputs = _inputs(2, 4, 37, 45, 80, torch.float32, hkv=2, mask_shape=(2, 1, 37, 45))
    _check(monkeypatch, _sdpa(gqa=True), *inputs)


def test_switched_off_keeps_torch_s_kernels(monkeypatch):
    monkeypatch.setattr(config, "cpu_flash_attention", False)
    q, k, v, m, grad = _inputs(1, 2, 20, 24, 16, torch.float32)
    with pytest.raises(AssertionError, match="flash_attention_buf"):
        _check(monkeypatch, _sdpa(True), q, k, v, m, grad)


def test_dynamic_batch_and_lengths(monkeypatch):
    # the second size makes batch and lengths symbols: both kernels read them at run time, the
    # backward's scratch is sized by them, and later sizes reuse the programs
    fn = _sdpa(causal=True, gqa=True)
    sources = []
    monkeypatch.setattr(config, "output_code", True)
    monkeypatch.setattr("builtins.print", lambda *a, **kw: sources.append(" ".join(map(str, a))))
    ember.dynamo.reset()
    compiled = ember.compile(fn)
    for b, length, source in ((2, 33, 40), (3, 70, 21), (4, 5, 130)):
        q, k, v, _, grad = _inputs(b, 4, length, source, 32, torch.float32, hkv=2, seed=b)
        got = _output_and_grads(compiled, q, k, v, None, grad)
        for a, w in zip(got, _output_and_grads(fn, q, k, v, None, grad)):
            torch.testing.assert_close(a, w, **FP32)
    backward = [s for s in sources if "flash_attention_backward_" in s]
    assert len(backward) == 2 and "const int64_t s0 = " in backward[1], sources
    assert not any("extern_sdpa" in s for s in sources)


class Attention(torch.nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                   for z in self.qkv(x).split(d, dim=-1))  # fmt: skip
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(att.transpose(1, 2).reshape(b, t, d))


def test_training_step_of_a_projected_attention(monkeypatch):
    # q, k, v are (B, L, H, E) views of one projection; a padding mask; parameter gradients
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(3, 37, 64)
    mask = torch.zeros(3, 1, 1, 37)
    mask[1, ..., 30:] = float("-inf")
    sources = []
    monkeypatch.setattr(config, "output_code", True)
    monkeypatch.setattr("builtins.print", lambda *a, **kw: sources.append(" ".join(map(str, a))))
    ember.dynamo.reset()
    ember.compile(model)(x, mask).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x, mask).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, **FP32)
    text = "\n".join(sources)
    assert "flash_attention_backward_" in text and "extern_sdpa" not in text
