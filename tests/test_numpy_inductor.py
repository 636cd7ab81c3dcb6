"""NumPy programs end to end through inductor on CPU: one graph each, compiled to C++ kernels,
results equal NumPy's own (values, dtypes, NumPy scalars) and in-place updates reach the
caller's arrays."""

import warnings

import numpy as np
import pytest
import torch

import ember
from ember.dynamo import convert


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


def _same(got, expected):
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, tuple):
        for g, e in zip(got, expected):
            _same(g, e)
        return
    assert got.dtype == expected.dtype and np.shape(got) == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _run_inductor(fn, *args):
    """fn compiled by inductor and NumPy's own run on copies of args; one graph, no break."""
    b0, f0, g0 = (len(convert.stats.breaks), len(convert.stats.failures),
                  len(convert.stats.graphs))  # fmt: skip
    compiled = ember.compile(fn, backend="inductor")
    for _ in range(2):
        args_c, args_e = [a.copy() for a in args], [a.copy() for a in args]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a frame that ran eagerly warns
            got = compiled(*args_c)
        _same(got, fn(*args_e))
        for c, e in zip(args_c, args_e):
            _same(c, e)
    assert not convert.stats.failures[f0:] and not convert.stats.breaks[b0:]
    assert len(convert.stats.graphs) - g0 == 1


def softmax_stats(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    p = e / np.sum(e, axis=-1, keepdims=True)
    return p, np.mean(p), np.argmax(p, axis=1)


def int_features(a, w):
    h = np.maximum(a @ w + 0.5, 0)  # int64 @ float64 -> float64, as NumPy
    return np.sum(np.sin(h), axis=0), (a % 3 == 0).sum()


def inplace_scale(x):
    x *= 2.0
    x += np.arange(x.shape[1], dtype=np.float32)
    return np.sqrt(np.abs(x)).mean(axis=0)


def test_softmax_float32():
    _run_inductor(softmax_stats, np.random.default_rng(0).standard_normal((8, 16), np.float32))


def test_int_promotion_matmul():
    g = np.random.default_rng(1)
    _run_inductor(int_features, g.integers(-4, 5, (6, 5)), g.standard_normal((5, 3)))


def test_inplace_update_reaches_the_caller():
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    _run_inductor(inplace_scale, x)
    before = x.copy()
    ember.compile(inplace_scale, backend="inductor")(x)
    np.testing.assert_allclose(x, before * 2 + np.arange(6, dtype=np.float32), rtol=1e-6)


def test_copying_path_through_inductor(monkeypatch):
    """The path a GPU takes (inputs copied to the default device, creation there, written inputs
    copied back), run on the CPU by taking the CPU for a device: the graph returns the written
    input and inductor compiles the explicit `device=` factories."""
    from ember.dynamo import numpy_device

    monkeypatch.setattr(numpy_device, "IN_PLACE_DEVICE_TYPES", set())
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    with torch.device("cpu"):
        _run_inductor(inplace_scale, x)
        (out,) = [n for n in convert.stats.graphs[-1].gm.graph.nodes if n.op == "output"]
        assert [n.op for n in out.args[0]][-1] == "placeholder"  # x, to be copied back
        _run_inductor(softmax_stats, x)


def test_changing_sizes_compile_once_more_as_one_dynamic_kernel_program():
    """The issue's program over a stream of row counts: static, then one symbolic graph that
    inductor compiles once and runs for every later size; an in-place update of a dynamic input
    still reaches the caller."""
    g0 = len(convert.stats.graphs)
    compiled = ember.compile(inplace_scale, backend="inductor")
    for n in (3, 5, 8, 13, 21):
        x = np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)
        x_e = x.copy()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = compiled(x)
        _same(got, inplace_scale(x_e))
        _same(x, x_e)
    graphs = convert.stats.graphs[g0:]
    assert len(graphs) == 2
    assert graphs[1].gm.meta.get("ember_symbols")
