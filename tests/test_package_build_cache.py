"""Packaging builds each kernel once: no in-process kernel build while packaging, no compiler run
on a second packaging, cached kernels shared between models, cubins compiled in parallel
processes and cached. Counted (compiler runs, processes), never timed."""

import math
import subprocess

import pytest
import torch

import ember
import ember.cpp_wrapper._C  # noqa: F401  (the extension, built before the cache moves)
from ember.cpp_wrapper import load_package, package
from ember.cpp_wrapper import library_build
from ember.cpp_wrapper.library_build import counters
from ember.inductor import runtime
from ember.ir import toolchain


def conv_bn_relu(cin, cout):
    return [torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout),
            torch.nn.ReLU()]  # fmt: skip


def cnn(widths):
    torch.manual_seed(0)
    layers = []
    for cin, cout in zip(widths, widths[1:]):
        layers += conv_bn_relu(cin, cout)
    model = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path / "cache")
    counters.reset()
    built = []  # ember.inductor's in-process kernel builds
    build = runtime._cpp_build
    monkeypatch.setattr(runtime, "_cpp_build", lambda *a: built.append(a[0]) or build(*a))
    return tmp_path, built


def test_a_second_packaging_compiles_nothing_and_runs(fresh_cache):
    tmp, inprocess_builds = fresh_cache
    model, x = cnn([3, 8, 8, 16]), torch.randn(2, 3, 8, 8)
    ep = ember.export(model, (x,))
    package(ep, tmp / "first")
    assert counters.compiled >= 2 and counters.linked == 1  # the wrapper, the kernels
    assert inprocess_builds == []  # the package compiled the kernels; inductor built none
    counters.reset()
    path = package(ember.export(model, (x,)), tmp / "second")
    assert (counters.compiled, counters.linked) == (0, 0)
    assert counters.cached >= 2
    torch.testing.assert_close(load_package(path)(x)[0], model(x), atol=1e-4, rtol=1e-4)


def test_a_model_sharing_kernels_compiles_only_its_new_ones(fresh_cache, monkeypatch):
    # a unit per kernel: which kernels share a unit is content-chosen (test_library_build.py
    # shows a new kernel changes only its own group)
    monkeypatch.setattr(library_build, "KERNELS_PER_UNIT", 1)
    tmp, _ = fresh_cache
    x = torch.randn(2, 3, 8, 8)
    package(ember.export(cnn([3, 8, 8]), (x,)), tmp / "small")
    first = counters.compiled
    counters.reset()
    deeper = cnn([3, 8, 8, 12])  # the same first two layers (and weights), one more
    path = package(ember.export(deeper, (x,)), tmp / "deeper")
    assert counters.cached >= 1  # the first layers' kernels
    assert counters.compiled < first + 2
    torch.testing.assert_close(load_package(path)(x)[0], deeper(x), atol=1e-4, rtol=1e-4)


def test_cubins_compile_in_parallel_processes_and_are_cached(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from ember.inductor import pipeline, triton_aot
    from ember.inductor.config import config

    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path / "cache")
    monkeypatch.setattr(config, "cpu_backend", "triton")  # a CPU graph rendered as Triton
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton_aot, "workers", lambda: 2)
    spawned = []
    popen = subprocess.Popen

    def spy(cmd, *a, **k):  # the compile processes (not Triton's own ptxas --version)
        if "ember.inductor.triton_aot" in cmd:
            spawned.append(cmd)
        return popen(cmd, *a, **k)

    monkeypatch.setattr(subprocess, "Popen", spy)
    acts = [torch.relu, torch.tanh, torch.sigmoid, torch.nn.functional.silu, torch.exp,
            torch.nn.functional.gelu, torch.sin, torch.cos]  # fmt: skip

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in acts)

        def forward(self, x):
            for fc, act in zip(self.fc, acts):
                x = act(fc(x))
            return x

    ep = ember.export(Stack().eval(), (torch.randn(4, 8),))
    compiled = pipeline.compile_prims(ep.graph_module, ep.example_inputs())
    n = sum(k.language == "triton" for k in compiled.artifact.kernels)
    art = triton_aot.attach_cubins(compiled, arch=90)
    assert n >= 8 and len(spawned) == min(2, math.ceil(n / triton_aot.PARALLEL_MIN))
    assert all(k.binary for k in art.kernels if k.language == "triton")
    spawned.clear()
    again = triton_aot.attach_cubins(compiled, arch=90)
    assert spawned == [] and again.kernels == art.kernels  # every cubin from the cache
