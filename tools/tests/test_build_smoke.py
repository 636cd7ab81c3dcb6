"""Smoke tests of the Bazel setup (see tools/BUILD.bazel); also plain-pytest safe."""
import importlib.util
import os
import sys

import pytest


def test_torch_imports_from_venv():
    import torch

    assert torch.ones(2).add(1).sum().item() == 4.0
    assert sys.version_info[:2] >= (3, 11)


@pytest.mark.parametrize("i", range(4))
def test_shard_member(i):
    # Four trivial items: with shard_count = 2 each shard must run exactly two.
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    assert total in (1, 2)


def test_nanobind_extension():
    path = os.path.join(os.path.dirname(__file__), "..", "nb_smoke.so")
    if not os.path.exists(path):
        pytest.skip("nb_smoke.so is built by Bazel only")
    spec = importlib.util.spec_from_file_location("nb_smoke", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.add(2, 3) == 5
