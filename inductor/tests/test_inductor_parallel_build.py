"""A program's kernels build concurrently, in the background until its first call: C++ kernels
(a failure names its kernel and fails the program) and Triton kernels compiled ahead of their
first launch (a failure there only warns: the launch compiles again)."""

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
    names = sorted(k.name for k in program.kernels if k.language == "cpp")
    assert len(names) == 3
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runtime, "build_pool", _pool_of(2))
    fresh_builds.clear()
    graph = CompiledGraph(_renamed(program, "again"), {})  # sources differ: nothing cached
    outputs = graph(a, b)  # waits for the builds
    units = [s for s in fresh_builds if s[0] != "ember_cpu.h"]
    # one translation unit per core, each kernel in one of them
    assert len(units) == 2
    # (kernels are built under names from their content: the same kernel twice builds once)
    built = [n for label, *_ in units
             for n in (label.split("_")[1:] if label.startswith("kernels_") else [label])]
    assert len(built) == len(set(built)) == len(names)
    assert all(thread.startswith("ember-build") for *_, thread in units)
    (_, s1, e1, _), (_, s2, e2, _) = units
    assert s1 < e2 and s2 < e1  # both were under way at the same time
    for got, want in zip(outputs, _three_kernels(a, b)):
        torch.testing.assert_close(got, want)


def test_the_same_kernel_twice_builds_once(fresh_builds):
    # two layers' identical kernels (a relu after each matmul): one build, both launchers bound
    a, w = torch.randn(8, 8), torch.randn(8, 8)

    def two_layers(a, w):
        return torch.relu(torch.relu(a @ w) @ w)

    compiled = compile_prims(trace_to_prims(two_layers, a, w), [a, w])
    out = compiled(a, w)
    cpp = [k for k in compiled.program.kernels if k.language == "cpp"]
    units = [s for s in fresh_builds if s[0] != "ember_cpu.h"]
    assert len(cpp) == 2 and len(units) == 1 and not units[0][0].startswith("kernels_")
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, two_layers(a, w))


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


class _WarmupLog:
    """Stands in for a Triton JITFunction (no GPU here): records `warmup` calls, or fails."""

    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def warmup(self, *args, grid, num_warps, **constants):
        if self.fail:
            raise RuntimeError("no GPU")
        self.calls.append((args, grid, num_warps, constants, threading.current_thread().name))


def _triton_launcher(fn, configs):
    launcher = runtime.TritonLauncher.__new__(runtime.TritonLauncher)
    launcher._fn, launcher.key, launcher.configs = fn, "k" * 20, configs
    launcher.sizes, launcher.cfg, launcher.fast = (1000, 64), None, None
    return launcher


def test_triton_kernels_compile_ahead_on_the_pool(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(runtime, "cache_dir", lambda: tmp_path)  # no remembered autotune choice
    configs = [{"XBLOCK": 8, "RBLOCK": 64, "num_warps": 2},
               {"XBLOCK": 16, "RBLOCK": 64, "num_warps": 4}]  # fmt: skip
    fn = _WarmupLog()
    with runtime.collect_builds() as builds:
        runtime.precompile_triton("k0", _triton_launcher(fn, configs),
                                  ("*bf16", "*fp32", "i64", "i64"))  # fmt: skip
    builds.finish()
    # every config autotuning will try, with the pointer dtypes, sizes and grid of the launch
    assert [(c[0], c[1], c[2], c[3]) for c in fn.calls] == [
        ((torch.bfloat16, torch.float32, 1000, 64), (125,), 2, {"XBLOCK": 8, "RBLOCK": 64}),
        ((torch.bfloat16, torch.float32, 1000, 64), (63,), 4, {"XBLOCK": 16, "RBLOCK": 64}),
    ]
    assert all(c[4].startswith("ember-build") for c in fn.calls)


def test_a_failed_triton_precompile_only_warns(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(runtime, "cache_dir", lambda: tmp_path)
    with runtime.collect_builds() as builds:
        launcher = _triton_launcher(_WarmupLog(fail=True), [{"XBLOCK": 8, "num_warps": 1}])
        runtime.precompile_triton("k7", launcher, ("*fp32", "i64"))
    builds.finish()  # the launch compiles again and reports its own error
    assert "kernel k7 ahead of launch failed: RuntimeError: no GPU" in caplog.text


def test_one_kernel_source_loaded_from_two_threads_is_whole_in_both(monkeypatch, tmp_path):
    # Two launchers of one source, one precompiling on the build pool and one launching, load
    # the same module at once; the second must not get the first's half-executed module.
    monkeypatch.setattr(runtime, "cache_dir", lambda: tmp_path)
    source = f"import time\ntime.sleep(0.3)\n\ndef kernel_{time.time_ns()}():\n    return 7\n"
    name = source.split("def ")[1].split("(")[0]
    start, got = threading.Barrier(2), []

    def load():
        start.wait()
        got.append(getattr(runtime._load_module(source), name, None))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [f() if f else None for f in got] == [7, 7]
