"""A program's C++ kernels build concurrently (in the background until its first call), and a
kernel that fails to build is named."""

import dataclasses
import threading
import time

import pytest
import torch
from ember.inductor import CompiledGraph, compile_prims, runtime
from ember.ir import toolchain
from ember.primtorch.trace import trace_to_prims


def _three_kernels(a, b):
    # a reduction, then two pointwise consumers that cannot fuse into it: several kernels
    s = torch.softmax(a, -1)
    return s.sum(0) * 2, (b.t() + 1).exp()


@pytest.fixture
def fresh_builds(tmp_path, monkeypatch):
    """An empty build cache (kernels really compile) and a log of when each build ran."""
    monkeypatch.setattr(toolchain.config, "cache_dir", tmp_path)
    runtime._pch_dir.cache_clear()
    spans, build = [], toolchain.compile_shared

    def timed(name, *args, **kwargs):
        start = time.perf_counter()
        try:
            return build(name, *args, **kwargs)
        finally:
            spans.append((name, start, time.perf_counter(), threading.current_thread().name))

    monkeypatch.setattr(toolchain, "compile_shared", timed)
    yield spans
    runtime._pch_dir.cache_clear()


def _program():
    a, b = torch.randn(6, 9), torch.randn(5, 7)
    compiled = compile_prims(trace_to_prims(_three_kernels, a, b), [a, b])
    compiled(a, b)  # its own builds are done
    return compiled.program, (a, b)


def test_kernels_build_concurrently_and_run(fresh_builds, monkeypatch):
    program, (a, b) = _program()
    assert len([k for k in program.kernels if k.language == "cpp"]) >= 2
    monkeypatch.setattr(runtime, "build_pool", _pool_of(2))
    fresh_builds.clear()
    graph = CompiledGraph(_renamed(program, "again"), {})  # sources differ: nothing cached
    outputs = graph(a, b)  # waits for the builds
    kernels = [s for s in fresh_builds if s[0] != "ember_cpu.h"]
    assert len(kernels) == len(program.kernels)
    assert all(thread.startswith("ember-build") for *_, thread in kernels)
    # some two builds were under way at the same time
    assert any(s1 < e2 and s2 < e1 for i, (_, s1, e1, _) in enumerate(kernels)
               for (_, s2, e2, _) in kernels[i + 1:])  # fmt: skip
    for got, want in zip(outputs, _three_kernels(a, b)):
        torch.testing.assert_close(got, want)


def test_a_failed_build_names_its_kernel(fresh_builds):
    program, _ = _program()
    bad = program.kernels[-1]
    broken = dataclasses.replace(bad, source=bad.source.replace("{", "{ this is not C++;", 1))
    program = _renamed(program, "broken")
    program.source = program.source.replace(
        _loader_text(program.kernels[-1]), _loader_text(_renamed_kernel(broken, "broken"))
    )
    a, b = torch.randn(6, 9), torch.randn(5, 7)
    graph = CompiledGraph(program, {})
    with pytest.raises(toolchain.BuildError) as e:
        graph(a, b)
    message = str(e.value)
    assert f"1 of {len(program.kernels)} kernels failed to build" in message
    assert f"kernel {bad.name}" in message and "this is not C++" in message


def _pool_of(n):
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="ember-build")
    return lambda: pool


def _renamed_kernel(k, tag):
    # a comment changes the source (so its content hash), not what the kernel does
    return dataclasses.replace(k, source=f"// {tag}\n{k.source}")


def _loader_text(k) -> str:
    return k.source.rstrip("\n")


def _renamed(program, tag):
    """The same program with every C++ kernel's source changed by a comment."""
    source = program.source
    kernels = []
    for k in program.kernels:
        new = _renamed_kernel(k, tag)
        source = source.replace(_loader_text(k), _loader_text(new))
        kernels.append(new)
    return dataclasses.replace(program, source=source, kernels=kernels)
