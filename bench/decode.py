"""Token-by-token decoding of a Llama-style model with a static KV cache: tokens per second for
eager, torch.compile and Ember, with bf16, int8 and int4 weights (ember.quantize_weights).

Each variant generates --tokens tokens greedily, one at a time (batch --batch, one token per
row), from a fixed-length cache updated in place with index_copy_; the position is an input, so
one compiled program serves every step. Each quantized variant's logits are checked against the
float model holding its dequantized weights (relative error of the logits, over teacher-forced
steps) before it is timed.

    python bench/decode.py --device cpu --threads 2 --layers 2 --hidden 256 --heads 4 \\
        --kv-heads 2 --intermediate 512 --vocab 1024 --tokens 32           # a tiny model
    python bench/decode.py --device cuda --out $OUT/decode                # ~1.2B parameters
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time


def model_args(p: argparse.ArgumentParser) -> None:
    """The Llama's shape (about 1.2B parameters by default) and the device: what
    decode_package.py's model takes too."""
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--max-len", type=int, default=256, help="the KV cache's length")


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(p)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (torch and OpenMP)")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per timed run")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--group-size", type=int, default=128, help="int4 group size")
    p.add_argument("--weights", default=None,
                   help="float (the activation dtype's weights), int8, int4; default all three")
    p.add_argument("--backends", default="eager,torch_compile,ember")
    p.add_argument("--dtype", default="bf16", help="activation dtype: bf16 or fp32")
    p.add_argument("--check-steps", type=int, default=4)
    p.add_argument("--out", default=None, help="a directory for results.json and results.md")
    return p.parse_args(argv)


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.threads:  # before torch starts its OpenMP runtime
    os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)

import _paths  # noqa: E402,F401
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import ember  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.to(x.dtype) * self.weight


def _rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, self.h, self.kvh = cfg.hidden, cfg.heads, cfg.kv_heads
        self.hd = d // self.h
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, self.kvh * self.hd, bias=False)
        self.v = nn.Linear(d, self.kvh * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x, pos, cos, sin, mask, k_cache, v_cache):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(x).view(b, t, self.kvh, self.hd).transpose(1, 2)
        v = self.v(x).view(b, t, self.kvh, self.hd).transpose(1, 2)
        k_cache.index_copy_(2, pos, _rotate(k, cos, sin))
        v_cache.index_copy_(2, pos, v)
        a = F.scaled_dot_product_attention(_rotate(q, cos, sin), k_cache, v_cache,
                                           attn_mask=mask, enable_gqa=True)  # fmt: skip
        return self.o(a.transpose(1, 2).reshape(b, t, -1))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn = Attention(cfg)
        self.n1, self.n2 = RMSNorm(cfg.hidden), RMSNorm(cfg.hidden)
        self.gate = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x, pos, cos, sin, mask, k_cache, v_cache):
        x = x + self.attn(self.n1(x), pos, cos, sin, mask, k_cache, v_cache)
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Step(nn.Module):
    """One decoder step over T new tokens, its caches inputs written in place."""

    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        hd = cfg.hidden // cfg.heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(cfg.max_len).float(), inv)
        self.register_buffer("cos", torch.cat([ang.cos()] * 2, -1), persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin()] * 2, -1), persistent=False)
        self.register_buffer("slots", torch.arange(cfg.max_len), persistent=False)

    def forward(self, tokens, positions, *caches):
        x = self.embed(tokens)
        cos, sin = self.cos[positions].to(x.dtype), self.sin[positions].to(x.dtype)
        mask = (self.slots[None, :] <= positions[:, None])[None, None]  # (1, 1, T, S)
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, cos, sin, mask, caches[2 * i], caches[2 * i + 1])
        return self.lm_head(self.norm(x))


class Cached(nn.Module):
    """`step` with its caches held as buffers: forward(tokens, positions) -> logits."""

    def __init__(self, step, caches):
        super().__init__()
        self.step = step
        for i, c in enumerate(caches):
            self.register_buffer(f"cache{i}", c, persistent=False)
        self.n = len(caches)

    def forward(self, tokens, positions):
        return self.step(tokens, positions, *(getattr(self, f"cache{i}") for i in range(self.n)))


def zero_caches(cfg, device, dtype, batch=1):
    shape = (batch, cfg.kv_heads, cfg.max_len, cfg.hidden // cfg.heads)
    return [torch.zeros(shape, device=device, dtype=dtype) for _ in range(2 * cfg.layers)]


def build_step(cfg, device, dtype):
    """The step (seed 0), in `dtype`, for inference: what decode_package.py races too."""
    torch.manual_seed(0)
    with torch.device(device):
        step = Step(cfg)
    for m in step.modules():  # small weights: logits of a sensible scale through the layers
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
    return step.to(dtype).eval()


def build(cfg, device, dtype):
    """The step with its caches (batch cfg.batch) held as buffers: forward(tokens, pos)."""
    return Cached(build_step(cfg, device, dtype), zero_caches(cfg, device, dtype, cfg.batch))


def variant(base, weights, group_size):
    """(model, reference): the model with `weights`, and the float model it should reproduce."""
    m = copy.deepcopy(base)
    if weights == "float":
        return m, None
    ember.quantize_weights(m, weights, group_size=group_size)
    return m, ember.dequantize_weights(copy.deepcopy(m))


def backend_of(name, model):
    if name == "eager":
        return model
    if name == "torch_compile":
        return torch.compile(model)
    if name == "ember":
        return ember.compile(model)
    raise ValueError(f"unknown backend {name}")


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def generate(fn, cfg, device, n, start=0):
    tok = torch.zeros(cfg.batch, 1, dtype=torch.long, device=device)
    for i in range(n):
        pos = torch.tensor([start + i], device=device)
        tok = fn(tok, pos).argmax(-1)
    return tok


def check(fn, reference, cfg, device, steps):
    """The largest relative error of `fn`'s logits against `reference`'s, teacher-forced on the
    reference's greedy tokens (each keeps its own cache)."""
    worst, tok = 0.0, torch.zeros(cfg.batch, 1, dtype=torch.long, device=device)
    for i in range(steps):
        pos = torch.tensor([i], device=device)
        want, got = reference(tok, pos).float(), fn(tok, pos).float()
        worst = max(worst, ((got - want).norm() / want.norm()).item())
        tok = want.argmax(-1)
    return worst


def run_one(base, cfg, device, weights, backend):
    model, reference = variant(base, weights, cfg.group_size)
    fn = backend_of(backend, model)
    row = {"weights": cfg.dtype if weights == "float" else weights, "backend": backend}
    with torch.no_grad():
        t0 = time.perf_counter()
        generate(fn, cfg, device, 2)  # compiles
        _sync(device)
        row["first_calls_s"] = round(time.perf_counter() - t0, 2)
        if reference is not None:
            row["logits_rel_err"] = check(fn, reference, cfg, device, cfg.check_steps)
            row["check"] = "ok" if row["logits_rel_err"] < 1e-2 else "FAILED (> 1e-2)"
        generate(fn, cfg, device, 4)  # warm
        _sync(device)
        t0 = time.perf_counter()
        generate(fn, cfg, device, cfg.tokens)
        _sync(device)
        dt = time.perf_counter() - t0
    row["tokens_per_s"] = round(cfg.tokens * cfg.batch / dt, 2)
    row["ms_per_step"] = round(1000 * dt / cfg.tokens, 3)
    return row


def main(cfg):
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.dtype]
    base = build(cfg, device, dtype)
    params = sum(p.numel() for p in base.parameters())
    print(f"# decode: {params / 1e6:.1f}M parameters, {cfg.layers} layers, hidden {cfg.hidden}, "
          f"batch {cfg.batch}, {cfg.tokens} tokens, {device}, {cfg.dtype} activations, "
          f"{torch.get_num_threads()} threads", flush=True)  # fmt: skip
    rows = []
    for weights in (cfg.weights or "float,int8,int4").split(","):
        for backend in cfg.backends.split(","):
            try:
                row = run_one(base, cfg, device, weights, backend)
            except Exception as e:  # a backend's failure is a result, not a crash
                label = cfg.dtype if weights == "float" else weights
                row = {"weights": label, "backend": backend,
                       "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            ember.reset()
    md = _table(rows)
    print(md)
    if cfg.out:
        os.makedirs(cfg.out, exist_ok=True)
        with open(os.path.join(cfg.out, "results.json"), "w") as f:
            json.dump({"config": vars(cfg), "device": device, "params": params, "rows": rows}, f,
                      indent=1)
        with open(os.path.join(cfg.out, "results.md"), "w") as f:
            f.write(md)
    return rows


def _table(rows):
    lines = ["| weights | backend | tokens/s | ms/step | first 2 calls (s) | logits vs dequantized |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['weights']} | {r['backend']} | failed: {r['error'][:80]} | | | |")
            continue
        err = f"{r['logits_rel_err']:.1e} {r['check']}" if "logits_rel_err" in r else "-"
        lines.append(f"| {r['weights']} | {r['backend']} | {r['tokens_per_s']} | {r['ms_per_step']} "
                     f"| {r['first_calls_s']} | {err} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(0 if main(ARGS) else 1)
