"""max-autotune's matmul templates on a real GPU (skipped without CUDA): every config compiled by
Triton and run against eager, and the choice timed in a subprocess, then read from the cache."""

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ember.inductor import compile_fx, config, metrics
from ember.ir import toolchain
from inductor_helpers import check

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def cuda(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda", dtype=dtype)


@pytest.fixture
def forced(monkeypatch):
    monkeypatch.setattr(config, "max_autotune_gemm", True)
    monkeypatch.setattr(config, "gemm_force", 0)
    monkeypatch.setattr(config, "cudagraphs", False)


def test_templates_with_epilogues_match_eager(forced):
    a, w, b = cuda(512, 256, dtype=torch.bfloat16), cuda(256, 384, dtype=torch.bfloat16), cuda(
        384, dtype=torch.bfloat16)  # fmt: skip
    check(lambda a, w, b: F.gelu(a @ w + b), a, w, b, kernels=1, atol=6e-2, rtol=2e-2)
    x, wt, bias = cuda(300, 130), cuda(200, 130), cuda(200)  # not multiples of any block
    check(lambda x, w, b: F.relu(F.linear(x, w, b)), x, wt, bias, kernels=1, atol=1e-4, rtol=1e-4)
    p, q, r = (cuda(4, 96, 64, dtype=torch.float16), cuda(4, 64, 80, dtype=torch.float16),
               cuda(4, 96, 80, dtype=torch.float16))  # fmt: skip
    check(lambda p, q, r: torch.bmm(p, q) + r, p, q, r, kernels=1, atol=2e-2, rtol=1e-2)
    assert metrics.gemm_templates == 1


def test_every_config_compiles_and_runs(forced):
    from ember.inductor.gemm_template import HOPPER_CONFIGS

    for dtype, tol in ((torch.bfloat16, 6e-2), (torch.float32, 1e-4)):
        a, w = cuda(256, 512, dtype=dtype), cuda(512, 384, dtype=dtype)
        for i in range(len(HOPPER_CONFIGS)):
            config.gemm_force = i
            check(lambda a, w: torch.sigmoid(a @ w) * 2, a, w, kernels=1, atol=tol, rtol=tol)
            assert metrics.gemm_templates == 1


def test_max_autotune_times_once_then_reads_the_choice(tmp_path, monkeypatch):
    """mode="max-autotune" times the template configs against cuBLAS in a subprocess on the
    first compile; a second compile of the same graph (no compile cache) reads the choice."""
    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.GELU()).cuda().to(torch.bfloat16)
    x = cuda(2048, 1024, dtype=torch.bfloat16)
    with torch.no_grad():
        out = compile_fx(model, [x], mode="max-autotune")(x)
        torch.testing.assert_close(out, model(x), atol=6e-2, rtol=2e-2)
        assert metrics.gemm_autotune_runs == 1 and metrics.gemm_autotune_hits == 0
        out = compile_fx(model, [x], mode="max-autotune-no-cudagraphs")(x)
        torch.testing.assert_close(out, model(x), atol=6e-2, rtol=2e-2)
    assert metrics.gemm_autotune_runs == 1 and metrics.gemm_autotune_hits == 1
    assert not config.max_autotune_gemm
    (entry,) = (tmp_path / "inductor" / "gemm_autotune").glob("*.json")
    times = json.loads(entry.read_text())["times"]  # every candidate's time, as measured
    assert times["extern"] is not None and len(times) > 2, times
    assert sum(t is not None for t in times.values()) >= len(times) // 2, times
