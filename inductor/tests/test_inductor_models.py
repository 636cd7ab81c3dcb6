"""Whole models through compile_fx (aot_autograd + inductor): inference and a training step."""

import copy

import pytest
import torch
from ember.inductor import compile_fx, metrics
from torch import nn


def mlp():
    return nn.Sequential(
        nn.Linear(32, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.GELU(),
        nn.LayerNorm(64),
        nn.Linear(64, 10),
    )


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=2),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def _inputs(name):
    torch.manual_seed(0)
    return (mlp(), torch.randn(16, 32)) if name == "mlp" else (cnn(), torch.randn(2, 3, 10, 10))


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_inference_matches_eager(name):
    model, x = _inputs(name)
    model.eval()
    compiled = compile_fx(torch.fx.symbolic_trace(model), [x])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-4)
    assert metrics.generated_kernel_count >= 1 and not metrics.fallbacks


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_training_step_matches_eager(name):
    model, x = _inputs(name)
    model.train()
    twin = copy.deepcopy(model)
    compiled = compile_fx(torch.fx.symbolic_trace(model), [x])
    opt, opt_ref = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    for _ in range(2):
        for m, o, run in ((model, opt, compiled), (twin, opt_ref, twin)):
            o.zero_grad()
            loss = run(x).square().mean()
            loss.backward()
            o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)
    for b, c in zip(model.buffers(), twin.buffers()):  # batch-norm running statistics
        torch.testing.assert_close(b, c, atol=1e-5, rtol=1e-4)
    assert not metrics.fallbacks


def test_torch_compile_backend():
    model, x = _inputs("mlp")
    model.eval()
    opt = torch.compile(model, backend=compile_fx)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), model(x), atol=1e-5, rtol=1e-4)
    assert metrics.generated_kernel_count >= 1
