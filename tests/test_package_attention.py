"""Attention in CPU packages: scaled_dot_product_attention (causal, additive masks, GQA) and a
transformers GQA decoder, exported, packaged and run by `run_package` (no Python, no libtorch)
in float32, bfloat16 and float16, against eager.

Cross-component: dynamo exports, primtorch records torch's CPU flash call, inductor lowers it to
its generated flash kernel (ember.inductor.cpu_attention), cpp_wrapper compiles it into model.so.
"""

import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.cpp_wrapper import install_run_package, package
from ember.cpp_wrapper.exported import compile_exported

FP32 = dict(atol=2e-5, rtol=1e-4)
BF16 = dict(atol=3e-2, rtol=3e-2)


@pytest.fixture(scope="module")
def run_package(tmp_path_factory):
    return install_run_package(tmp_path_factory.mktemp("bin"))


def _standalone(run_package, path, inputs, tmp_path):
    """The package's first output, run by `run_package` on .npy files (bfloat16 travels as
    float32: numpy has no bfloat16)."""
    names = []
    for i, x in enumerate(inputs):
        names.append(str(tmp_path / f"in{i}.npy"))
        x = x.float() if x.dtype == torch.bfloat16 else x
        np.save(names[-1], x.numpy())
    out = tmp_path / "out.npy"
    run = subprocess.run([str(run_package), str(path), *names, str(out)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return torch.from_numpy(np.load(out)).float()


def _no_attention_extern(exported):
    artifact, _ = compile_exported(exported, "cpu")
    assert any(k.name.startswith("flash_attention_") for k in artifact.kernels)
    assert not [s.target for s in artifact.steps if s.kind == "extern" and "sdpa" in s.target]


class Attentions(torch.nn.Module):
    """Three attention calls of one program: causal, an additive mask broadcast over heads, and
    GQA with an additive mask broadcast over the batch (head dim 80, a non-power of two)."""

    def forward(self, q, k, v, mask):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        kg, vg = k[:, :2], v[:, :2]
        grouped = F.scaled_dot_product_attention(q, kg, vg, attn_mask=mask[:1], enable_gqa=True)
        return causal + masked + grouped


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])  # fmt: skip
def test_attention_calls_run_standalone(run_package, tmp_path, dtype):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 19, 80, generator=gen).to(dtype) for _ in range(3))
    mask = torch.randn(2, 1, 19, 19, generator=gen).to(dtype)
    model = Attentions()
    exported = ember.export(model, (q, k, v, mask))
    _no_attention_extern(exported)
    path = package(exported, tmp_path / "pkg", device="cpu")
    q2, k2, v2 = (torch.randn_like(t) for t in (q, k, v))  # not the export's example
    got = _standalone(run_package, path, (q2, k2, v2, mask), tmp_path)
    want = model(q2, k2, v2, mask).float()
    torch.testing.assert_close(got, want, **(FP32 if dtype == torch.float32 else BF16))


class Logits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, attention_mask):
        return self.lm(input_ids=ids, attention_mask=attention_mask, use_cache=False).logits


def _decoder(kind, dtype):
    transformers = pytest.importorskip("transformers")
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    torch.manual_seed(0)
    config = config_cls(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        attn_implementation="sdpa")  # fmt: skip
    return Logits(model_cls(config).eval().to(dtype))


@pytest.mark.parametrize(
    "kind,dtype", [("llama", torch.float32), ("llama", torch.bfloat16), ("qwen2", torch.float16)]
)
def test_gqa_decoder_runs_standalone(run_package, tmp_path, kind, dtype):
    model = _decoder(kind, dtype)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones(2, 12, dtype=torch.int64)
    attention_mask[1, :3] = 0  # left padding: an additive mask, not only causal
    exported = ember.export(model, (ids, attention_mask))
    path = package(exported, tmp_path / "pkg", device="cpu")
    with torch.no_grad():
        want = model(ids, attention_mask).float()
    got = _standalone(run_package, path, (ids, attention_mask), tmp_path)
    assert got.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, **FP32)
    else:  # 16-bit rounding differs by op order: the logits agree to a few ulps
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9
