"""The guard-soundness walk (dynamo/tests/guard_walk.py) through backends that trace and compile
the graph (aot_eager; inductor, shorter): such a backend bakes dtypes, sizes and process state
into its code, so a guard that is missing shows up as a wrong result, not just a missed
recompile."""

import importlib.util
from pathlib import Path

import pytest
import torch

import ember

_PATH = Path(__file__).parents[1] / "dynamo" / "tests" / "guard_walk.py"


def _guard_walk():
    spec = importlib.util.spec_from_file_location("guard_walk", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


def test_walk_with_aot_eager():
    walk = _guard_walk().run_walk("aot_eager", steps=80, seed=3)
    assert walk.fn_counter.count <= len(walk.seen_fn) < 81


def test_walk_with_inductor():
    walk = _guard_walk().run_walk("inductor", steps=25, seed=1)
    assert 0 < walk.fn_counter.count <= len(walk.seen_fn) < 26


def test_default_dtype_change_gives_eagers_dtype_under_aot_eager():
    """aot_eager traces torch.ones(3) with the default dtype in force: the graph was reused after
    torch.set_default_dtype(torch.float64), returning float32 where eager returns float64."""

    def f(x):
        return x + torch.ones(3)

    cf = ember.compile(f, backend="aot_eager")
    x = torch.ones(3)
    assert cf(x).dtype == torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert cf(x).dtype == f(x).dtype == torch.float64
    finally:
        torch.set_default_dtype(default)
    assert cf(x).dtype == torch.float32


def test_a_parameter_changed_in_place_is_traced_again_through_inductor():
    """Dynamo's guards pin every graph input (parameters too: identity and metadata), so the
    compiled program is called without keying each call by its tensors. A parameter whose
    `.data` is replaced by one of other sizes, strides, dtype or requires_grad must fail a guard
    and be traced again, never reach a program compiled for the old one."""
    from ember.dynamo import convert
    from ember.ir import GUARDED_INPUTS_META_KEY

    lin = torch.nn.Linear(4, 3)
    compiled = ember.compile(lin)
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), lin(x))
        assert convert.stats.graphs[-1].gm.meta.get(GUARDED_INPUTS_META_KEY) is True
        changes = [lambda: torch.randn(3, 4).t().contiguous().t(),  # strides
                   lambda: torch.randn(3, 4, dtype=torch.float64)]  # dtype
        for change in changes:
            lin.weight.data = change()
            xx = x.to(lin.weight.dtype)
            lin.bias.data = lin.bias.data.to(lin.weight.dtype)
            torch.testing.assert_close(compiled(xx), lin(xx))
        lin.weight.data, lin.bias.data = torch.randn(5, 4), torch.randn(5)  # sizes
        torch.testing.assert_close(compiled(x), lin(x))
