"""Whole models through compile_fx (aot_autograd + inductor): inference and a training step."""

import copy

import pytest
import torch
from ember.inductor import compile_fx, compile_prims, metrics
from ember.primtorch import trace_to_prims
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


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_small_matmuls_as_reductions(batch, monkeypatch):
    """At batch 1 or 2 a Linear becomes a generated reduction (on CUDA by default; forced here);
    from batch 3 it stays a library GEMM. Either way the result matches eager."""
    from ember.inductor import config as inductor_config

    monkeypatch.setattr(inductor_config, "small_mm_as_reduction", True)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    x = torch.randn(batch, 64)
    prims = trace_to_prims(m, x)
    compiled = compile_prims(prims, [x])
    with torch.no_grad():
        out = compiled(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, m(x), atol=1e-5, rtol=1e-5)
    externs = [s.target for s in compiled.artifact.steps if s.kind == "extern"]
    assert (externs == []) == (batch <= 2), externs
    if batch <= 2:  # each layer one kernel: the reduction with its bias and ReLU epilogue
        assert len(compiled.program.kernels) == 2, len(compiled.program.kernels)


@pytest.mark.parametrize("inner,cols,thin", [(4, 4, True), (16, 8, True), (32, 4, False)])
def test_thin_matmuls_as_reductions(inner, cols, thin, monkeypatch):
    """A product with K and N a few elements (CaiT's 4x4 head-mixing Linear over every
    attention score) becomes a generated reduction at any number of rows: a GEMM library runs
    such memory-bound work slowly. A wider inner size stays a library GEMM."""
    from ember.inductor import config as inductor_config

    monkeypatch.setattr(inductor_config, "small_mm_as_reduction", True)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(inner, cols), torch.nn.Softmax(-1))
    x = torch.randn(3, 40, inner)
    compiled = compile_prims(trace_to_prims(m, x), [x])
    with torch.no_grad():
        out = compiled(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, m(x), atol=1e-5, rtol=1e-5)
    externs = [s.target for s in compiled.artifact.steps if s.kind == "extern"]
    assert (externs == []) == thin, externs


@pytest.mark.parametrize("mode,graphed", [(None, True), ("reduce-overhead", True),
                                          ("max-autotune", True),
                                          ("max-autotune-no-cudagraphs", False)])  # fmt: skip
def test_modes_ask_for_cuda_graphs_as_documented(mode, graphed, monkeypatch):
    """Every mode but "max-autotune-no-cudagraphs" offers an inference graph to CUDA-graph
    replay (which then applies on CUDA only); an unknown mode is refused."""
    from ember.inductor import compile_fx, pipeline

    asked = []
    monkeypatch.setattr(pipeline.CompiledGraph, "use_cudagraphs", lambda self: asked.append(1))
    monkeypatch.setattr(pipeline.config, "fx_cache", False)
    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) * 2)
    x = torch.randn(4, 4)
    with torch.no_grad():
        out = compile_fx(gm, [x], mode=mode)(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, torch.relu(x) * 2)
    assert bool(asked) == graphed
    with pytest.raises(ValueError, match="unknown mode"):
        compile_fx(gm, [x], mode="fastest")
