"""Attention written out by hand (matmul, scale, bias or mask, softmax, matmul) compiles to one
scaled_dot_product_attention call (ember.inductor.attention_rewrite), with eager's results and
gradients; where folding it would change a result, it is left as written."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.inductor import attention_rewrite, config

D, H, T = 32, 4, 8


@pytest.fixture
def rewrites(monkeypatch):
    """The number of attentions rewritten in each graph compiled."""
    counts = []
    rewrite = attention_rewrite.rewrite

    def counting(gm):
        counts.append(rewrite(gm))
        return counts[-1]

    monkeypatch.setattr(attention_rewrite, "rewrite", counting)
    ember.reset()
    yield counts
    ember.reset()


def _heads(t, transpose=(1, 2)):
    b = t.shape[0]
    return t.view(b, T, H, -1).transpose(*transpose)


class Mpt(nn.Module):
    """Keys transposed by the permute, a scale, an ALiBi-like bias, masked_fill with the dtype's
    minimum, an upcast softmax, a dropout that is off outside training."""

    def __init__(self, p=0.0):
        super().__init__()
        self.qkv, self.drop = nn.Linear(D, 3 * D), nn.Dropout(p)

    def forward(self, x, bias, mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, v = _heads(q), _heads(v)
        k = k.view(x.shape[0], T, H, -1).permute(0, 2, 3, 1)
        w = q.matmul(k) * (1 / math.sqrt(D // H))
        w = (w + bias).masked_fill(mask, torch.finfo(w.dtype).min)
        w = self.drop(torch.softmax(w.float(), dim=-1).to(v.dtype))
        return torch.matmul(w, v)


class Bloom(nn.Module):
    """baddbmm over (batch x heads) with the bias as its input, a view to four dimensions for
    the mask, softmax(dtype=float32), a view back and bmm."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)

    def forward(self, x, alibi, mask):
        b, hd = x.shape[0], D // H
        q, k, v = self.qkv(x).view(b, T, H, 3, hd).unbind(3)
        q = q.transpose(1, 2).reshape(b * H, T, hd)
        k = k.permute(0, 2, 3, 1).reshape(b * H, hd, T)
        v = v.transpose(1, 2).reshape(b * H, T, hd)
        w = alibi.baddbmm(batch1=q, batch2=k, beta=1.0, alpha=1 / math.sqrt(hd))
        w = torch.masked_fill(w.view(b, H, T, -1), mask, torch.finfo(w.dtype).min)
        p = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.bmm(F.dropout(p, 0.0, self.training).view(b * H, T, -1), v)


class Causal(nn.Module):
    """q @ k.transpose, masked_fill(-inf) from a buffer, or where(keep, w, min) and a division."""

    def __init__(self, where=False, fill=float("-inf")):
        super().__init__()
        self.qkv, self.where, self.fill = nn.Linear(D, 3 * D), where, fill
        self.register_buffer("tri", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        q, k, v = (_heads(t) for t in self.qkv(x).split(D, dim=2))
        if self.where:
            w = torch.where(self.tri > 0, q @ k.transpose(-1, -2) / (D // H) ** 0.5, self.fill)
        else:
            w = (q @ k.transpose(-2, -1)) * 0.25
            w = w.masked_fill(self.tri == 0, self.fill)
        return F.softmax(w, dim=-1) @ v


def _inputs():
    torch.manual_seed(0)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return torch.randn(2, T, D), torch.randn(1, H, 1, T), torch.randn(2 * H, 1, T), mask


def _cases():
    x, bias, alibi, mask = _inputs()
    return [(Mpt(), (x, bias, mask)), (Bloom(), (x, alibi, mask)), (Causal(), (x,)),
            (Causal(where=True, fill=-3.0e38), (x,))]  # fmt: skip


@pytest.mark.parametrize("index", range(4))
def test_each_spelling_is_one_attention_call_with_eager_results(rewrites, index):
    model, args = _cases()[index]
    model.eval()
    with torch.no_grad():
        out = ember.compile(model)(*args)
        torch.testing.assert_close(out, model(*args), rtol=1e-4, atol=1e-5)
    assert rewrites == [1]


@pytest.mark.parametrize("index", range(4))
def test_training_gives_eager_gradients(rewrites, index):
    model, args = _cases()[index]
    model.train()
    model(*args).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ember.compile(model)(*args).square().sum().backward()
    for want, got in zip(expected, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert rewrites == [1]


def test_a_row_with_every_key_masked_keeps_eagers_uniform_weights(rewrites):
    x, bias, _, mask = _inputs()
    mask = mask.clone()
    mask[3] = True  # the fill (float32's minimum) stays the minimum with a score added
    model = Mpt().eval()
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(model)(x, bias, mask), model(x, bias, mask),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
    assert rewrites == [1]


def test_what_folding_would_change_is_left_as_written(rewrites):
    x, bias, _, mask = _inputs()

    class Returns(Causal):  # the probabilities are a result too
        def forward(self, x):
            q, k, v = (_heads(t) for t in self.qkv(x).split(D, dim=2))
            p = F.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1)
            return p @ v, p

    # a fill the scores could move (float16's minimum): a fully masked row would differ
    cases = [(Returns().eval(), (x,)), (Causal(fill=-65504.0).eval(), (x,)),
             (Mpt(p=0.5).train(), (x, bias, mask))]  # fmt: skip
    for model, args in cases:
        ember.reset()
        torch.manual_seed(1)
        out = ember.compile(model)(*args)
        if not model.training:
            torch.testing.assert_close(out, model(*args), rtol=1e-4, atol=1e-5)
    assert rewrites == [0, 0, 0]


def test_a_bias_that_needs_a_gradient_is_left_as_written(rewrites):
    x, _, _, mask = _inputs()
    bias = torch.zeros(1, H, 1, T, requires_grad=True)
    model = Mpt().train()
    ember.compile(model)(x, bias, mask).sum().backward()
    expected = bias.grad.clone()
    bias.grad = None
    model(x, bias, mask).sum().backward()
    torch.testing.assert_close(bias.grad, expected, rtol=1e-4, atol=1e-5)
    assert rewrites == [0]


def test_symbolic_sizes_and_the_switch(rewrites, monkeypatch):
    model = Causal().eval()
    compiled = ember.compile(model, dynamic=True)
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, T, D)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert rewrites and all(n == 1 for n in rewrites)
    ember.reset()
    rewrites.clear()
    monkeypatch.setattr(config, "attention_rewrite", False)
    with torch.no_grad():
        ember.compile(model)(torch.randn(2, T, D))
    assert rewrites == []


def _scores(q, k):
    return q @ k.transpose(-1, -2)


def _uint8_biases(q, k, v, b1, b2):
    return F.softmax(_scores(q, k) + b1 + b2, -1) @ v  # (eager's sum promotes each to float)


def _upcast_then_fill(q, k, v, mask):  # the float32 minimum on bfloat16 scores upcast first
    w = _scores(q, k).float().masked_fill(mask, torch.finfo(torch.float32).min)
    return F.softmax(w, -1).to(v.dtype) @ v


def _written_between(q, k, v, bias):
    w = _scores(q, k) + bias
    bias.mul_(0)  # (the call would read the bias after this)
    return F.softmax(w, -1) @ v


_B, _L, _E = 2, 8, 16
_q, _k, _v = (torch.randn(_B, H, _L, _E, generator=torch.Generator().manual_seed(i))
              for i in range(3))  # fmt: skip
_full_row = torch.zeros(_L, _L, dtype=torch.bool)
_full_row[0] = True
# (name, function, arguments, attentions rewritten)
_EDGES = [
    ("a batch broadcast up by the values", lambda q, k, v: F.softmax(_scores(q, k), -1) @ v,
     (_q[0], _k[0], _v), 0),
    ("a batch broadcast up by the bias", lambda q, k, v, b: F.softmax(_scores(q, k) + b, -1) @ v,
     (_q[:1], _k[:1], _v, torch.randn(_B, 1, _L, _L)), 0),
    ("a softmax given its input by keyword",
     lambda q, k, v: F.softmax(input=_scores(q, k), dim=-1) @ v, (_q, _k, _v), 1),
    ("a bias of one dimension", lambda q, k, v, b: F.softmax(_scores(q, k) + b, -1) @ v,
     (_q, _k, _v, torch.randn(_L)), 1),
    ("a bias of none", lambda q, k, v, b: F.softmax(_scores(q, k) + b, -1) @ v,
     (_q, _k, _v, torch.randn(())), 1),
    ("two uint8 biases", _uint8_biases,
     (_q, _k, _v, torch.randint(0, 3, (_L, _L), dtype=torch.uint8) * 100,
      torch.randint(0, 2, (_L, _L), dtype=torch.uint8) * 50), 1),
    ("a fill after an upcast", _upcast_then_fill,
     (_q.bfloat16(), _k.bfloat16(), _v.bfloat16(), _full_row), 0),
    ("a bias written in place", _written_between, (_q, _k, _v, torch.randn(_L, _L)), 0),
    ("probabilities cast to integers",
     lambda q, k, v: F.softmax(_scores(q, k), -1).to(torch.int32).float() @ v, (_q, _k, _v), 0),
]  # fmt: skip


@pytest.mark.parametrize("case", _EDGES, ids=[c[0] for c in _EDGES])
def test_edges_compile_to_eagers_results(rewrites, case):
    _, fn, args, expected = case
    want = fn(*[a.clone() for a in args])
    got = ember.compile(fn)(*[a.clone() for a in args])
    loose = got.dtype == torch.bfloat16
    tolerance = dict(rtol=2e-2, atol=2e-2) if loose else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, **tolerance)
    assert rewrites == [expected]
