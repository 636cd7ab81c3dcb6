"""Runs every corpus case compiled (counting backend) and compares with eager execution."""

import copy
import dataclasses
import importlib
import pkgutil
import warnings

import numpy as np
import pytest
import torch

import corpus
import ember
from ember.dynamo import CompileCounter, convert

for _m in pkgutil.iter_modules(corpus.__path__):
    importlib.import_module(f"corpus.{_m.name}")


def assert_same(got, expected, path="result"):
    assert type(got) is type(expected), f"{path}: {type(got)} vs {type(expected)}"
    if isinstance(expected, torch.Tensor):
        assert got.shape == expected.shape and got.dtype == expected.dtype, path
        torch.testing.assert_close(got, expected, equal_nan=True, msg=path)
        assert got.requires_grad == expected.requires_grad, f"{path}: requires_grad"
    elif isinstance(expected, (np.ndarray, np.generic)):  # NumPy programs: dtypes must match
        assert got.dtype == expected.dtype and got.shape == expected.shape, f"{path}: {got.dtype}"
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True,
                                   err_msg=path)  # fmt: skip
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), f"{path}: length"
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert list(got) == list(expected), f"{path}: keys"
        for k in expected:
            assert_same(got[k], expected[k], f"{path}[{k!r}]")
    elif dataclasses.is_dataclass(expected):
        for f in dataclasses.fields(expected):
            assert_same(getattr(got, f.name), getattr(expected, f.name), f"{path}.{f.name}")
    elif hasattr(expected, "__dict__") and not callable(expected):
        assert_same(vars(got), vars(expected), f"{path}.__dict__")
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def _fresh_inputs(case):
    torch.manual_seed(0)
    return case.inputs()


@pytest.mark.parametrize("case", corpus.CASES, ids=lambda c: c.name)
def test_case(case):
    ember.reset()
    cnt = CompileCounter()
    if case.module is not None:
        torch.manual_seed(0)
        eager_target = case.module()
        target = copy.deepcopy(eager_target)
    else:
        eager_target = target = case.fn
    breaks0, failures0 = len(convert.stats.breaks), len(convert.stats.failures)
    compiled = ember.compile(target, backend=cnt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(case.calls):
            args_e, args_c = _fresh_inputs(case), _fresh_inputs(case)
            torch.manual_seed(1)
            expected = eager_target(*args_e)
            torch.manual_seed(1)
            got = compiled(*args_c)
            assert_same(got, expected)
            assert_same(args_c, args_e, "inputs after the call")
            if case.module is not None:
                assert_same(target.state_dict(), eager_target.state_dict(), "state_dict")
    failures = convert.stats.failures[failures0:]
    breaks = convert.stats.breaks[breaks0:]
    if case.eager_fallback:
        assert failures, "expected the frame to run eagerly"
        return
    assert not failures, f"frame ran eagerly: {failures}"
    if case.graphs is not None:
        got = cnt.frame_count
        assert got == case.graphs, f"graphs {got} != {case.graphs}: {breaks}"
    if case.breaks is not None:
        assert len(breaks) == case.breaks, f"breaks {len(breaks)} != {case.breaks}: {breaks}"


def test_the_capture_constructs_have_at_least_40_programs():
    """Issue #25's bar: NumPy programs, custom operators, autograd.Functions with checkpoint,
    and control flow together hold at least 40 corpus programs, each one graph without a break
    unless its case says otherwise (test_case above runs them)."""
    modules = ("numpy_programs", "custom_ops", "autograd_functions", "control_flow")
    counts = {m: sum(c.name.startswith(m + ".") for c in corpus.CASES) for m in modules}
    assert all(counts.values()) and sum(counts.values()) >= 40, counts
    one_graph = [c for c in corpus.CASES if c.name.split(".")[0] in modules
                 and c.graphs == 1 and c.breaks == 0 and not c.eager_fallback]  # fmt: skip
    assert len(one_graph) >= 40
