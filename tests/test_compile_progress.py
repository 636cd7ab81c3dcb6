"""A training compile says what it is doing: with the threshold at zero, every stage of a cold
compile (capture, trace, partition, lowering, kernel builds) is reported on ember.progress."""

import logging

import torch
from torch import nn

import ember
import ember.dynamo
from ember.inductor import fx_cache, pipeline
from ember.ir import progress


def test_a_cold_training_compile_reports_each_stage(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(fx_cache, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(pipeline.cache, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(progress.config, "enabled", True)
    monkeypatch.setattr(progress.config, "after_s", 0.0)
    monkeypatch.setattr(progress.config, "every_s", 0.0)
    monkeypatch.setattr(progress.config, "watch", False)
    caplog.set_level(logging.INFO, logger="ember.progress")
    ember.dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.LayerNorm(24), nn.Linear(24, 3))
    x = torch.randn(5, 12)
    ember.compile(model)(x).sum().backward()
    ember.dynamo.reset()
    text = "\n".join(caplog.messages)
    for stage in ("capture of forward", "aot_autograd > trace", "aot_autograd > partition",
                  "forward graph compile > lowering", "backward graph compile > scheduling",
                  "code generation", "kernel compile"):  # fmt: skip
        assert stage in text, text
    assert all(m.startswith("ember: compiling for ") for m in caplog.messages)


def test_silenced_progress_prints_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(fx_cache, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(pipeline.cache, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(progress.config, "enabled", False)
    monkeypatch.setattr(progress.config, "after_s", 0.0)
    caplog.set_level(logging.INFO, logger="ember.progress")
    ember.dynamo.reset()
    ember.compile(nn.Linear(4, 4))(torch.randn(2, 4)).sum().backward()
    ember.dynamo.reset()
    assert caplog.messages == []
