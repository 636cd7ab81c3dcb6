"""Autotuning on the GPU (trial_timing's CUDA measure, GPU only): configs are timed together in
rounds by CUDA events, a clearly slower launch loses, and a compiled program's kernels are tuned
at their first call, their choices remembered, their results eager's, within a small budget."""

import json

import pytest
import torch

import ember
from ember.inductor import config, trial_timing
from ember.ir import progress, toolchain

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_the_slower_launch_loses_and_every_round_samples_each_config():
    a = torch.randn(256, 256, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    launches = [lambda: b @ b, lambda: a @ a]  # the second does 4096 times less work
    measure = trial_timing.cuda_measure(launches)
    samples = measure([0, 1], 7, 1)
    assert [len(s) for s in samples] == [7, 7]
    assert all(t > 0 for s in samples for t in s)
    times = trial_timing.choose(measure, 2, warm_ms=1, rep_ms=5)
    assert times[1] < times[0] / 10


def test_a_program_tunes_its_kernels_quickly_and_remembers_them(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path)
    monkeypatch.setattr(config, "autotune", True)
    ember.reset()
    progress.reset_stage_totals()

    def f(x, w):
        y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w) * torch.sigmoid(x)
        return y.softmax(-1) + y.t().contiguous().t(), (x * 2).sum(0)

    x = torch.randn(2048, 768, device="cuda")
    w = torch.randn(768, device="cuda")
    got = ember.compile(f)(x, w)
    want = f(x, w)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    chosen = json.loads((tmp_path / "autotune.json").read_text())
    assert len(chosen) >= 2
    tuned = sum(t for path, t in progress.stage_totals().items() if path.endswith("autotune"))
    assert tuned < 0.25 * len(chosen), (tuned, len(chosen))
    ember.reset()
