"""A warm start of ember.compile (after ember.dynamo.reset, on-disk cache kept) neither traces
nor lowers, and runs like eager in inference and in a training step (BatchNorm buffers too)."""

import copy

import ember.aot_autograd.api as aot_api
import pytest
import torch
from ember.inductor import config, fx_cache, metrics, pipeline
from torch import nn

import ember
import ember.dynamo


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(y.mean((2, 3)))


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    monkeypatch.setattr(fx_cache, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(pipeline.cache, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(config, "cache", True)
    monkeypatch.setattr(config, "fx_cache", True)
    metrics.reset()
    ember.dynamo.reset()
    yield tmp_path
    ember.dynamo.reset()


def _forbid_cold_path(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a warm start traced or lowered a graph")

    monkeypatch.setattr(aot_api, "trace", fail)
    monkeypatch.setattr(pipeline, "lower_graph", fail)


def test_warm_inference_start(cache_on, monkeypatch):
    torch.manual_seed(0)
    model, x = ConvNet().eval(), torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(ember.compile(model)(x), expected, rtol=1e-4, atol=1e-5)
        assert metrics.fx_cache_misses == 1
        ember.dynamo.reset()
        _forbid_cold_path(monkeypatch)
        warm = ember.compile(model)(x)
    assert metrics.fx_cache_hits == 1
    torch.testing.assert_close(warm, expected, rtol=1e-4, atol=1e-5)


def _train_step(model, x):
    model.zero_grad()
    out = model(x)
    out.pow(2).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()], [
        b.clone() for b in model.buffers()
    ]


def test_warm_training_step(cache_on, monkeypatch):
    torch.manual_seed(0)
    model, x = ConvNet().train(), torch.randn(2, 3, 8, 8)
    cold_model, warm_model = copy.deepcopy(model), copy.deepcopy(model)
    expected = _train_step(model, x)
    torch.testing.assert_close(_train_step(ember.compile(cold_model), x), expected, rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    ember.dynamo.reset()
    _forbid_cold_path(monkeypatch)
    warm = _train_step(ember.compile(warm_model), x)
    assert metrics.fx_cache_hits == 1
    # outputs, every parameter's gradient and the running statistics BatchNorm updated in place
    torch.testing.assert_close(warm, expected, rtol=1e-4, atol=1e-5)
