"""A tiny Llama-style decoder whose KV caches are inputs written in place at the positions (the
decode-step convention of ember.cpp_wrapper.package_decode_step), and an eager greedy loop over
it, and the two fixtures the CPU package tests share: shared by test_decode_package.py,
test_decode_prefill.py and the CUDA counterpart."""

import concurrent.futures
import importlib
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS, MAX_LEN = 128, 64, 4, 2, 2, 48
HEAD_DIM = HIDDEN // HEADS


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


def _rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.kv = nn.Linear(HIDDEN, 2 * KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.n1, self.n2 = RMSNorm(HIDDEN), RMSNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x, pos, cos, sin, mask, k_cache, v_cache):
        b, t, _ = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, KV_HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4).unbind(0)
        k_cache.index_copy_(2, pos, _rotate(k, cos, sin))  # the static cache, in place
        v_cache[:, :, pos] = v  # an indexed assignment works as well
        a = F.scaled_dot_product_attention(_rotate(q, cos, sin), k_cache, v_cache,
                                           attn_mask=mask, enable_gqa=True)  # fmt: skip
        x = x + self.o(a.transpose(1, 2).reshape(b, t, HIDDEN))
        g, u = self.up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Decoder(nn.Module):
    """forward(tokens (B, 1), positions (1,), k0, v0, k1, v1) -> logits (B, 1, VOCAB)."""

    def __init__(self, max_len=MAX_LEN):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        ang = torch.outer(torch.arange(max_len).float(), inv)
        self.register_buffer("cos", torch.cat([ang.cos()] * 2, -1), persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin()] * 2, -1), persistent=False)
        self.register_buffer("slots", torch.arange(max_len), persistent=False)

    def forward(self, tokens, positions, *caches):
        x = self.embed(tokens)
        cos, sin = self.cos[positions], self.sin[positions]
        mask = (self.slots[None, :] <= positions[:, None])[None, None]  # the filled slots
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, cos, sin, mask, caches[2 * i], caches[2 * i + 1])
        return self.head(self.norm(x))


BATCH = 2  # rows decode side by side


def zero_caches(batch=BATCH, max_len=MAX_LEN, device="cpu"):
    shape = (batch, KV_HEADS, max_len, HEAD_DIM)
    return [torch.zeros(shape, device=device) for _ in range(2 * LAYERS)]


def eager_greedy(model, prompt, n, max_len=MAX_LEN, device="cpu"):
    """Greedy tokens and each step's logits, token-by-token through the prompt, as generate."""
    kv, tokens, logits = zero_caches(prompt.shape[0], max_len, device), [], []
    prompt = prompt.to(device)
    with torch.no_grad():
        for s in range(prompt.shape[1] + n - 1):
            tok = prompt[:, s : s + 1] if s < prompt.shape[1] else tokens[-1][:, None]
            out = model(tok, torch.tensor([s], device=device), *kv)[:, -1]
            if s >= prompt.shape[1] - 1:
                logits.append(out)
                tokens.append(out.argmax(-1))
    return torch.stack(tokens, 1).cpu(), torch.stack(logits, 1).cpu()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Decoder().eval()


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """run_package and the in-process binding, built in threads while the package compiles
    (each build is a compiler subprocess: they overlap on a second core)."""
    import ember.cpp_wrapper as cw

    pool = concurrent.futures.ThreadPoolExecutor(2)
    program = pool.submit(cw.install_run_package, tmp_path_factory.mktemp("bin"))
    binding = pool.submit(importlib.import_module, "ember.cpp_wrapper._C")
    yield program, binding
    pool.shutdown()


def edited_copy(pkg, tmp_path, edit):
    """A copy of the package with its manifest edited (the manifest is not hashed)."""
    path = tmp_path / "pkg"
    shutil.copytree(pkg, path)
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path
