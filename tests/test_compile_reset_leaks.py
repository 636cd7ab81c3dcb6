"""Compile / call / reset cycles through inductor (warm kernel cache) grow neither host memory
nor, on a GPU, allocated device memory by more than 5%."""

import importlib.util
from pathlib import Path

import pytest
import torch

import ember

_PATH = Path(__file__).parents[1] / "dynamo" / "tests" / "test_leaks.py"


def _leaks():
    spec = importlib.util.spec_from_file_location("dynamo_test_leaks", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_inductor_compile_reset_cycles_do_not_grow_host_memory():
    ember.reset()
    (base, _), (end, _) = _leaks().compile_reset_cycles("inductor", cycles=200, warmup=20)
    assert end <= base * 1.05, f"RSS grew from {base >> 20} MiB to {end >> 20} MiB"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_two_hundred_cycles_do_not_grow_gpu_memory(backend):
    ember.reset()
    (base, _), (end, _) = _leaks().compile_reset_cycles(backend, cycles=200, warmup=20,
                                                        device="cuda")  # fmt: skip
    assert end <= base * 1.05 + (1 << 20), f"allocated grew from {base} to {end} bytes"
