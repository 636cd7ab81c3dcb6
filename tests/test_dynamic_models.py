"""Dynamic sequence lengths and batch sizes on small GPT-2, BERT, ViT and ResNet configurations.

ember.compile's automatic dynamic compiles the first size static and, at the first change, one
symbolic program (aot_autograd traces with SymbolicTensors; inductor generates kernels whose sizes
are arguments) that serves every later size: at most two compiles over six sizes, every output
(and, in training, every gradient) equal to eager's, and no new kernels after the symbolic one.
The models have what the benchmark suite's do: 3-d Linears, views with symbolic sizes, a causal
mask sliced from a buffer, an additive padding mask, tied embeddings, GELU, LayerNorm, dropout,
`torch.arange(t)` positions and scaled_dot_product_attention.
"""

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.inductor import metrics

SEQ_LENS = (3, 5, 7, 9, 12, 16)
BATCH_SEQ = ((2, 3), (3, 5), (2, 7), (4, 9), (3, 12), (5, 16))


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout=0.0, causal=False, max_len=16, sdpa=False):
        super().__init__()
        self.heads, self.causal, self.sdpa = heads, causal, sdpa
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.attn_drop, self.resid_drop = nn.Dropout(dropout), nn.Dropout(dropout)
        if causal:
            mask = torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, max_len, max_len), persistent=False)

    def forward(self, x, attn_bias=None):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, is_causal=self.causal)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if self.causal:
                att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
            if attn_bias is not None:
                att = att + attn_bias
            y = self.attn_drop(F.softmax(att, dim=-1)) @ v
        return self.resid_drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class GPT2(nn.Module):
    def __init__(self, vocab=64, dim=32, depth=2, heads=4, max_len=16, dropout=0.0, sdpa=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(dict(
                ln1=nn.LayerNorm(dim), ln2=nn.LayerNorm(dim),
                attn=SelfAttention(dim, heads, dropout, causal=True, max_len=max_len, sdpa=sdpa),
                fc=nn.Linear(dim, 4 * dim), proj=nn.Linear(4 * dim, dim), drop=nn.Dropout(dropout),
            )) for _ in range(depth)
        )  # fmt: skip
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.wte(ids) + self.wpe(pos)[None])
        for blk in self.blocks:
            x = x + blk["attn"](blk["ln1"](x))
            h = F.gelu(blk["fc"](blk["ln2"](x)), approximate="tanh")
            x = x + blk["drop"](blk["proj"](h))
        return self.lm_head(self.ln_f(x))


class BertLayer(nn.Module):
    def __init__(self, dim, heads, ffn, dropout, sdpa):
        super().__init__()
        self.attn = SelfAttention(dim, heads, dropout, sdpa=sdpa)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, bias):
        x = self.ln1(x + self.attn(x, bias))
        return self.ln2(x + self.drop(self.ffn(x)))


class Bert(nn.Module):
    def __init__(self, vocab=50, dim=32, depth=2, heads=4, ffn=64, max_len=16, dropout=0.0,
                 sdpa=False):  # fmt: skip
        super().__init__()
        self.tok, self.pos, self.typ = (nn.Embedding(vocab, dim), nn.Embedding(max_len, dim),
                                        nn.Embedding(2, dim))  # fmt: skip
        self.ln, self.drop = nn.LayerNorm(dim), nn.Dropout(dropout)
        self.layers = nn.ModuleList(BertLayer(dim, heads, ffn, dropout, sdpa) for _ in range(depth))
        self.pool = nn.Linear(dim, dim)

    def forward(self, ids, attention_mask):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)[None] + self.typ(torch.zeros_like(ids))
        x = self.drop(self.ln(x))
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        return x, torch.tanh(self.pool(x[:, 0]))


class ResNet(nn.Module):
    """Two conv-BatchNorm-ReLU stages (the second strided), pooled into a Linear head."""

    def __init__(self, widths=(8, 16), classes=10):
        super().__init__()
        layers, cin = [], 3
        for i, w in enumerate(widths):
            layers += [nn.Conv2d(cin, w, 3, 1 + i, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
            cin = w
        self.features, self.fc = nn.Sequential(*layers), nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class ViT(nn.Module):
    """Patch embedding, a class token, post-norm encoder layers (BertLayer), a Linear head."""

    def __init__(self, patch=4, dim=32, depth=2, heads=4, classes=10, n=16):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim))
        self.layers = nn.ModuleList(BertLayer(dim, heads, 2 * dim, 0.0, False)
                                    for _ in range(depth))  # fmt: skip
        self.head = nn.Linear(dim, classes)

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for layer in self.layers:
            x = layer(x, None)
        return self.head(x[:, 0])


def _inputs(name, b, t):
    ids = torch.randint(0, 50, (b, t))
    if name.startswith("gpt2"):
        return (ids,)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[-1, t - 2 :] = 0  # the last sequence is padded
    return ids, mask


MODELS = {
    "gpt2": lambda **kw: GPT2(**kw),
    "gpt2_sdpa": lambda **kw: GPT2(sdpa=True, **kw),
    "bert": lambda **kw: Bert(**kw),
    "bert_sdpa": lambda **kw: Bert(sdpa=True, **kw),
}


def _compile_counting(model, backend):
    calls = []

    def counting(gm, example_inputs):
        calls.append(bool(gm.meta.get("ember_symbols")))
        return ember.dynamo.lookup_backend(backend)(gm, example_inputs)

    counting.ember_supports_dynamic = True
    return ember.compile(model, backend=counting), calls


def _loss(out):
    if isinstance(out, tuple):
        return out[0].square().mean() + out[1].sum()
    return out.float().square().mean()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference_six_sizes_compile_at_most_twice(name, backend):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    compiled, calls = _compile_counting(model, backend)
    with torch.no_grad():
        for i, (b, t) in enumerate((2, t) for t in SEQ_LENS):
            args = _inputs(name, b, t)
            torch.testing.assert_close(compiled(*args), model(*args), atol=1e-4, rtol=1e-4)
            if i == 1:
                kernels = metrics.generated_kernel_count
    assert calls == [False, True], calls  # static first, then one symbolic program
    assert metrics.generated_kernel_count == kernels  # later sizes reuse the symbolic kernels


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_batch_and_sequence_vary_together(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    compiled, calls = _compile_counting(model, "inductor")
    with torch.no_grad():
        for b, t in BATCH_SEQ:
            args = _inputs(name, b, t)
            torch.testing.assert_close(compiled(*args), model(*args), atol=1e-4, rtol=1e-4)
    assert calls == [False, True], calls


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", ["gpt2", "bert_sdpa"])
def test_training_gradients_match_eager_for_six_sizes(name, backend):
    torch.manual_seed(0)
    model = MODELS[name]()
    ref = copy.deepcopy(model)
    compiled, calls = _compile_counting(model, backend)
    for t in SEQ_LENS:
        args = _inputs(name, 2, t)
        out = compiled(*args)
        _loss(out).backward()
        want = ref(*args)
        _loss(want).backward()
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=n)
        model.zero_grad()
        ref.zero_grad()
    assert calls == [False, True], calls


@pytest.mark.slow
@pytest.mark.parametrize("model_cls", [ResNet, ViT], ids=["resnet", "vit"])
def test_training_batch_sizes_compile_at_most_twice(model_cls):
    """Batch sizes in training: BatchNorm's statistics and running-variance correction, and the
    gradients, with the batch size symbolic."""
    torch.manual_seed(0)
    model = model_cls()
    ref = copy.deepcopy(model)
    compiled, calls = _compile_counting(model, "inductor")
    for b in (2, 3, 4, 5, 7, 9):
        x = torch.randn(b, 3, 16, 16)
        out, want = compiled(x), ref(x)
        out.square().mean().backward()
        want.square().mean().backward()
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=n)
        for (n, b1), b2 in zip(model.named_buffers(), ref.buffers()):
            torch.testing.assert_close(b1, b2, atol=1e-5, rtol=1e-5, msg=n)  # running statistics
        model.zero_grad()
        ref.zero_grad()
    assert calls == [False, True], calls


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_training_with_dropout_compiles_at_most_twice(name):
    """Dropout draws from the compiled program's own generator, so values differ from eager's;
    what must hold is one symbolic program, finite losses and gradients for every size."""
    torch.manual_seed(0)
    model = MODELS[name](dropout=0.1)
    no_dropout = copy.deepcopy(model).eval()
    compiled, calls = _compile_counting(model, "inductor")
    for t in SEQ_LENS:
        args = _inputs(name, 2, t)
        out = compiled(*args)
        with torch.no_grad():
            want = no_dropout(*args)
        for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (out, want))):
            assert a.shape == b.shape and not torch.allclose(a, b)  # dropout did drop
        loss = _loss(out)
        loss.backward()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        model.zero_grad()
    assert calls == [False, True], calls


def test_huggingface_bert_sequence_lengths_compile_at_most_twice():
    """A tiny transformers BertModel (sdpa attention) when transformers is installed."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=16)  # fmt: skip
    config._attn_implementation = "sdpa"
    model = transformers.BertModel(config).eval()
    compiled, calls = _compile_counting(model, "inductor")
    with torch.no_grad():
        for t in SEQ_LENS:
            ids, mask = _inputs("bert", 2, t)
            got = compiled(input_ids=ids, attention_mask=mask)
            want = model(input_ids=ids, attention_mask=mask)
            torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-4)
    assert calls == [False, True], calls
