"""Weight-only int8/int4 Linears (ember.quantize_weights) compiled by inductor on the CPU: results
match the eager quantized model, and decoding-sized products never write the float weight."""

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported (the Triton test)
import torch.nn.functional as F
from torch import nn

import ember
from ember.inductor import pipeline
from ember.inductor.config import config


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    """A Llama decoder layer: the new token attends to a given cache of keys and values."""

    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.n1, self.n2 = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x, k_cache, v_cache):
        b, t, d = x.shape
        h = self.n1(x)
        q, k, v = (f(h).view(b, t, self.heads, -1).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        k, v = torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, dim=128, heads=4, hidden=256, vocab=256, layers=2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm, self.head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, x, caches):
        for blk, (kc, vc) in zip(self.blocks, caches):
            x = blk(x, kc, vc)
        return self.head(self.norm(x))


class MLP(nn.Module):
    def __init__(self, dim=128, hidden=256):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


@pytest.fixture
def programs(monkeypatch):
    """The Programs each compile makes (caches off, so every graph is compiled here; dynamo's
    code cache emptied, so each test's sizes are compiled static)."""
    ember.reset()
    monkeypatch.setattr(config, "cache", False)
    monkeypatch.setattr(config, "fx_cache", False)
    made, compile_prims = [], pipeline.compile_prims

    def recording(gm, inputs):
        compiled = compile_prims(gm, inputs)
        made.append(compiled.program)
        return compiled

    monkeypatch.setattr(pipeline, "compile_prims", recording)
    return made


def _float_buffers(programs, numel):
    """Buffers the programs allocate (not their inputs) of floats with at least `numel` elements."""
    return [(b.name, tuple(int(s) for s in b.meta.sizes)) for p in programs
            for b in p.artifact.buffers
            if b.kind in ("intermediate", "output") and b.meta.dtype.is_floating_point
            and math.prod(int(s) for s in b.meta.sizes) >= numel]  # fmt: skip


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _quantized_pair(model, mode, group):
    """(the quantized model, the float model holding its dequantized weights)."""
    import copy

    q = ember.quantize_weights(model, mode, group_size=group)
    return q, ember.dequantize_weights(copy.deepcopy(q))


CASES = [("int8", 128), ("int4", 32), ("int4", 128)]


@pytest.mark.parametrize("mode,group", CASES)
@pytest.mark.parametrize("rows", [1, 4])
def test_mlp_reads_quantized_bytes(programs, mode, group, rows):
    torch.manual_seed(0)
    ref = MLP()
    import copy

    q, deq = _quantized_pair(copy.deepcopy(ref), mode, group)
    x = torch.randn(rows, 1, 128)
    with torch.no_grad():
        out = ember.compile(q)(x)
        torch.testing.assert_close(out, q(x), rtol=1e-5, atol=1e-5)
        assert _rel(out, deq(x)) < 1e-5
        assert _rel(out, ref(x)) < (0.02 if mode == "int8" else 0.2)
    # no float copy of either weight (128*256 elements), and no library GEMM
    assert _float_buffers(programs, 128 * 256) == []
    steps = [s.target for p in programs for s in p.artifact.steps if s.kind == "extern"]
    assert not any("mm" in op for op in steps), steps
    src = "\n".join(k.source for p in programs for k in p.artifact.kernels)
    assert ("vload_i8" if mode == "int8" else "vload_u8_dup2") in src  # the weight is read vectorised


@pytest.mark.parametrize("mode,group,rows", [("int8", 128, 1), ("int4", 32, 4), ("int4", 128, 1)])
def test_decoder_logits(programs, mode, group, rows):
    torch.manual_seed(0)
    import copy

    ref = Decoder()
    q, deq = _quantized_pair(copy.deepcopy(ref), mode, group)
    x = torch.randn(rows, 1, 128)
    caches = [(torch.randn(rows, 4, 6, 32), torch.randn(rows, 4, 6, 32)) for _ in range(2)]
    with torch.no_grad():
        logits = ember.compile(q)(x, caches)
        torch.testing.assert_close(logits, q(x, caches), rtol=1e-4, atol=1e-4)
        assert _rel(logits, deq(x, caches)) < 1e-2
        assert _rel(logits, ref(x, caches)) < (0.05 if mode == "int8" else 0.3)
    assert _float_buffers(programs, 128 * 128) == []


@pytest.mark.parametrize("mode,group,rows", [("int8", 128, 1), ("int4", 32, 4)])
def test_triton_reduction_reads_quantized_bytes(programs, monkeypatch, mode, group, rows):
    """The same rewrite feeds the Triton renderer (on the GPU where there is one; on the CPU, its
    interpreter): one generated reduction per Linear that loads the int8/uint8 weight."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        monkeypatch.setattr(config, "cpu_backend", "triton")
    torch.manual_seed(0)
    q = ember.quantize_weights(MLP(), mode, group_size=group).to(dev)
    x = torch.randn(rows, 1, 128, device=dev)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(q)(x), q(x), rtol=1e-5, atol=1e-5)
    assert _float_buffers(programs, 128 * 256) == []
    kernels = [k for p in programs for k in p.artifact.kernels]
    assert kernels and all(k.language == "triton" for k in kernels)
    assert not [s for p in programs for s in p.artifact.steps if s.kind == "extern"]


def test_prefill_dequantizes_for_the_gemm(programs):
    """Many rows (a prompt): the weight is dequantized once and multiplied by the library GEMM."""
    torch.manual_seed(0)
    q = ember.quantize_weights(MLP(), "int4", group_size=32)
    x = torch.randn(2, 16, 128)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(q)(x), q(x), rtol=1e-5, atol=1e-5)
    steps = [s.target for p in programs for s in p.artifact.steps if s.kind == "extern"]
    # one GEMM per layer: the first layer's output is read elementwise (its activation), so on
    # the CPU it is an mm whose bias that kernel adds; the last layer's is the output: addmm
    assert sorted(steps) == ["extern.addmm", "extern.mm"], steps


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_bfloat16_model(programs, mode):
    """bf16 activations: the dequantization has more casts, and is still fused and vectorised."""
    torch.manual_seed(0)
    q = ember.quantize_weights(MLP().to(torch.bfloat16), mode, group_size=64)
    x = torch.randn(1, 1, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        out = ember.compile(q)(x)
        assert out.dtype == torch.bfloat16
        assert _rel(out.float(), q(x).float()) < 1e-2
    assert _float_buffers(programs, 128 * 256) == []
    src = "\n".join(k.source for p in programs for k in p.artifact.kernels)
    assert ("vload_i8" if mode == "int8" else "vload_u8_dup2") in src


def test_quantize_weights_filter_and_errors():
    m = MLP()
    ember.quantize_weights(m, "int8", filter=lambda name, lin: name == "up")
    assert type(m.up).__name__ == "Int8WeightLinear" and type(m.down) is nn.Linear
    with pytest.raises(ValueError, match="group_size"):
        ember.quantize_weights(MLP(128, 96), "int4", group_size=64)
    with pytest.raises(ValueError, match="mode"):
        ember.quantize_weights(MLP(), "int3")


def test_int4_packing_round_trips():
    """Each byte holds columns 2j (low nibble) and 2j+1 (high); dequantized values lie within
    half a step of the float weight."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 8)
    q = ember.quantize_weights(nn.Sequential(lin), "int4", group_size=32)[0]
    assert q.weight_packed.dtype == torch.uint8 and q.weight_packed.shape == (8, 32)
    err = (q.dequantized_weight() - lin.weight).abs()
    step = q.scales.repeat_interleave(32, dim=1)
    assert (err <= step / 2 + 1e-6).all()
