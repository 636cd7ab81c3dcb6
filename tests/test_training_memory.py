"""A compiled training step holds no more memory than eager's (issue #4).

Live tensor bytes are counted on CPU by `memory_timeline.LiveBytes` (every storage an op creates,
until nothing holds it), through forward, loss and backward, above what existed before the step
(parameters, input). The compiled backward must free what eager's frees as it goes: saved
activations after their last use, recomputed values just in time, each gradient once consumed.
"""


import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import ember
from aot_models import load as _models
from ember.inductor import pipeline
from memory_timeline import step_profile, unreleased, wrapper_peak



def _resnet():
    """A two-stage ResNet with BatchNorm and a projected shortcut; activations dominate."""
    m = _models().ResNet(widths=(16, 32))
    x, target = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    return m, x, lambda out: F.cross_entropy(out.float(), target)


def _gpt2():
    m = _models().GPT2(vocab=256, dim=64, depth=2, heads=4, max_len=64)
    ids, target = torch.randint(0, 256, (8, 64)), torch.randint(0, 256, (8, 64))
    return m, ids, lambda out: F.cross_entropy(out.float().flatten(0, 1), target.flatten())


@pytest.fixture
def wrapper_sources(monkeypatch):
    """The Python wrapper source of every graph ember.inductor builds (compiled or cached)."""
    sources = []
    init = pipeline.CompiledGraph.__init__

    def record(self, program, constants):
        sources.append(program.source)
        init(self, program, constants)

    monkeypatch.setattr(pipeline.CompiledGraph, "__init__", record)
    return sources


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("make", [_resnet, _gpt2], ids=["resnet_bn", "gpt2"])
def test_compiled_step_peak_memory_is_no_higher_than_eager(make, autocast, wrapper_sources):
    torch.manual_seed(0)
    model, x, loss_fn = make()
    params = list(model.parameters())
    eager = step_profile(model, (x,), loss_fn, params, autocast)

    compiled = ember.compile(model)
    for _ in range(2):  # compile, then a call with every kernel built
        step_profile(compiled, (x,), loss_fn, params, autocast)
    ours = step_profile(compiled, (x,), loss_fn, params, autocast)

    report = f"eager: {eager.mib()}; ember: {ours.mib()}"
    # The partitioner saves less than eager (recomputing BN and activations in the backward)...
    assert ours.after_forward <= eager.after_forward, report
    # ...and the backward, recomputing and freeing as it goes, stays under eager's peak.
    assert ours.peak_step <= eager.peak_step, report
    assert len(wrapper_sources) >= 2  # forward and backward
    for source in wrapper_sources:
        assert unreleased(source) == [], source


def test_wrapper_tools_read_a_wrapper():
    """The static readers of a wrapper: live-bytes peak over allocations, reuses and dels, and
    variables left holding memory."""
    source = "\n".join([
        "def call(args):",
        "    arg0, = args",
        "    buf0 = empty_strided((4, 4), (4, 1), torch.float32, 'cpu')",
        "    buf1 = empty_strided((8,), (1,), torch.bfloat16, 'cpu')",
        "    del arg0",
        "    buf2 = reinterpret(buf0, (16,), (1,), 0)  # reuses buf0",
        "    del buf0",
        "    buf3 = extern_mm(buf2, buf2)",
        "    del buf2",
        "    buf4 = empty_strided((2, 2), (2, 1), torch.float32, 'cpu')",
        "    return (buf1,)",
    ])  # fmt: skip
    assert wrapper_peak(source) == 16 * 4 + 8 * 2
    assert unreleased(source) == ["buf3", "buf4"]


def _first_step_peaks(mode: str, arch: str) -> dict:
    script = Path(__file__).with_name("first_step_peak.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, str(script), mode, arch], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _least_first_step_peaks(mode: str, arch: str, runs: int = 2) -> dict:
    """The run with the lowest first-step peak of `runs` fresh processes: RSS varies by about
    15 MiB from run to run (allocator layout, when a collection runs), and one high
    run of the compiled side put it 1 MiB over the bound in CI; both sides are measured alike."""
    return min((_first_step_peaks(mode, arch) for _ in range(runs)), key=lambda r: r["first"])


def _can_reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# What compiling may add to the first step's peak above eager's: the graphs' Python objects
# (fx nodes, TensorMeta, sympy), the kernels' shared libraries, the build threads' allocator
# arenas, and what the C allocator lays out differently. The trace runs on meta tensors
# (aot_autograd/meta_trace.py), the capture's values are collected and the heap trimmed before
# the first step runs. Measured (2 cores, cold cache, compiler code warmed; RSS varies by about
# 15 MiB from run to run): transformer eager 121-129 MiB, Ember 145-161 (441 before: example
# values on nodes, the capture's cyclic garbage, a trace on real values; 223 with all but the
# meta trace); CNN eager 128, Ember 126-130 (366 before). With the capture saving nothing for
# backward (dynamo/convert.py `_SavedNothing`): transformer 145 (163 saving), CNN 92 (126).
_COMPILE_MARGIN = (1.25, 16)  # at most eager * 1.25 + 16 MiB


@pytest.mark.skipif(not _can_reset_peak_rss(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("arch", ["transformer", "cnn"])
def test_first_training_step_with_a_cold_compile_peaks_near_eager(arch):
    """The first step's peak resident memory, compile included and with a cold cache, above
    eager's first step by at most a fixed margin.

    Measured as peak RSS growth (VmHWM after resetting it) in a fresh process per mode, not as
    live tensor bytes: the compiler's costs are not all tensors (graphs, kernels, allocator
    fragmentation), and the issue is the process's memory. A fresh process keeps one
    measurement's heap out of the other's. The compiler's fixed per-process cost (imports, the
    C++ runtime) is warmed away first, on code of its own (first_step_peak.py). Shapes make
    eager's step about 130 MiB: big enough that a compile holding a step's activations (the
    capture's, the trace's) fails the test by far, small enough to compile in about 10 s."""
    eager = _least_first_step_peaks("eager", arch)
    ours = _least_first_step_peaks("ember", arch)
    report = f"first-step peak RSS growth: eager {eager}, ember {ours} (MiB)"
    scale, extra = _COMPILE_MARGIN
    assert ours["first"] <= eager["first"] * scale + extra, report
