"""Attention in CUDA packages: scaled_dot_product_attention and a transformers GQA decoder in
bfloat16, exported on CUDA, packaged (Ember's Triton flash kernel as a cubin in place of torch's
attention externs, which a package cannot call) and run in process and by `run_package`, against
eager. Skipped without CUDA.

Cross-component: dynamo exports, primtorch records torch's CUDA attention extern, inductor lowers
it to ember.inductor.triton_attention while cpp_wrapper compiles for the package.
"""

import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ember
from ember.cpp_wrapper import install_run_package, load_package, package
from ember.cpp_wrapper.exported import compile_exported

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BF16 = dict(atol=3e-2, rtol=3e-2)
FP32 = dict(atol=2e-4, rtol=2e-4)


@pytest.fixture(scope="module")
def run_package(tmp_path_factory):
    return install_run_package(tmp_path_factory.mktemp("bin"))


def _flash_only(exported):
    """The package's artifact runs Ember's flash kernel and calls no attention extern."""
    artifact, _ = compile_exported(exported, "cuda")
    flash = [k for k in artifact.kernels if k.name.startswith("flash_attention_")]
    externs = [s.target for s in artifact.steps if s.kind == "extern"]
    assert not [t for t in externs if "sdpa" in t], externs
    return flash


def _standalone(run_package, path, inputs, tmp_path):
    """The package's first output by `run_package`, as float32 (bfloat16 travels as float32
    .npy: numpy has none)."""
    names = []
    for i, x in enumerate(inputs):
        names.append(str(tmp_path / f"in{i}.npy"))
        x = x.float() if x.dtype == torch.bfloat16 else x
        np.save(names[-1], x.cpu().numpy())
    out = tmp_path / "out.npy"
    run = subprocess.run([str(run_package), str(path), *names, str(out)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return torch.from_numpy(np.load(out)).float()


class Attentions(torch.nn.Module):
    """Causal attention, an additive mask broadcast over heads, and GQA with a mask."""

    def forward(self, q, k, v, mask):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        grouped = F.scaled_dot_product_attention(q, k[:, :2], v[:, :2], attn_mask=mask,
                                                 enable_gqa=True)  # fmt: skip
        return causal + masked + grouped


@pytest.mark.parametrize("dtype,e", [(torch.bfloat16, 64), (torch.bfloat16, 80),
                                     (torch.float16, 128), (torch.float32, 80)])  # fmt: skip
def test_attention_calls_in_a_cuda_package(run_package, tmp_path, dtype, e):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 77, e, device="cuda", generator=gen).to(dtype)
               for _ in range(3))  # fmt: skip
    mask = torch.randn(2, 1, 77, 77, device="cuda", generator=gen).to(dtype)
    model = Attentions()
    exported = ember.export(model, (q, k, v, mask))
    assert _flash_only(exported)  # causal and masked at least (GQA with a mask may be math)
    path = package(exported, tmp_path / "pkg", device="cuda")
    q2, k2, v2 = (torch.randn_like(t) for t in (q, k, v))
    with torch.no_grad():
        want = model(q2, k2, v2, mask)
    tol = FP32 if dtype == torch.float32 else BF16
    torch.testing.assert_close(load_package(path)(q2, k2, v2, mask)[0].float(), want.float(),
                               **tol)  # fmt: skip
    got = _standalone(run_package, path, (q2, k2, v2, mask), tmp_path)
    torch.testing.assert_close(got, want.float().cpu(), **tol)


class Logits(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, attention_mask=None):
        return self.lm(input_ids=ids, attention_mask=attention_mask, use_cache=False).logits


def _decoder():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        attn_implementation="sdpa",
    )  # fmt: skip
    return Logits(transformers.LlamaForCausalLM(config).eval().to("cuda", torch.bfloat16))


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "padded"])
def test_gqa_decoder_in_a_cuda_package(run_package, tmp_path, padded):
    """A 4-layer Llama-style decoder (4 query heads, 2 key/value heads, head dim 64) in
    bfloat16 with transformers' default (SDPA) attention: issue #29's model, which could not be
    packaged (extern.sdpa_* on CUDA). Without a mask transformers asks for causal attention with
    enable_gqa; with left padding, for an additive mask over repeated key/value heads. Whichever
    kernel torch picks, none stays a call into torch (torch's math path is matmuls and a
    softmax, which packages run)."""
    model = _decoder()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (2, 24), generator=gen).cuda()
    inputs = (ids,)
    if padded:
        attention_mask = torch.ones(2, 24, dtype=torch.int64, device="cuda")
        attention_mask[1, :5] = 0
        inputs = (ids, attention_mask)
    exported = ember.export(model, inputs)
    _flash_only(exported)
    path = package(exported, tmp_path / "pkg", device="cuda")
    with torch.no_grad():
        want = model(*inputs).float()
    got = load_package(path)(*inputs)[0].float()
    torch.testing.assert_close(got, want, atol=6e-2, rtol=6e-2)
    standalone = _standalone(run_package, path, inputs, tmp_path)
    torch.testing.assert_close(standalone, got.cpu(), atol=1e-2, rtol=1e-2)  # the same model.so
