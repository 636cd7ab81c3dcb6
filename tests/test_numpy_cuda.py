"""NumPy programs compiled by inductor under `with torch.device("cuda")` (GPU only): the graph
computes on the GPU (its inputs are device copies, every value and every compiled kernel's
inputs and outputs are CUDA tensors), results equal NumPy's own (values, dtypes, NumPy scalars for
0-d results), in-place updates reach the caller's arrays, each program is one graph with no break,
and the default device is guarded (a call without it compiles a CPU graph)."""

import warnings

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

import ember
from ember.dynamo import convert
from ember.ir import NODE_META_KEY, TensorMeta

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICE = "cuda"


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


class DeviceRecorder:
    """The inductor backend, recording for each graph the devices of its example inputs and of
    every value in it and, at run time, of the inputs the compiled graph gets and the outputs it
    returns."""

    def __init__(self):
        self.graphs: list[dict] = []

    def __call__(self, gm, example_inputs):
        seen = {"example": {t.device.type for t in example_inputs}, "run_in": set(),
                "values": {str(m.device).split(":")[0] for n in gm.graph.nodes
                           for m in pytree.tree_leaves(n.meta.get(NODE_META_KEY))
                           if isinstance(m, TensorMeta)},
                "run_out": set()}  # fmt: skip
        self.graphs.append(seen)
        compiled = ember.dynamo.lookup_backend("inductor")(gm, example_inputs)

        def run(*args):
            seen["run_in"] |= {a.device.type for a in args if isinstance(a, torch.Tensor)}
            out = compiled(*args)
            seen["run_out"] |= {o.device.type for o in out if isinstance(o, torch.Tensor)}
            return out

        return run

    def assert_on(self, device: str, graph=None):
        """Every graph (or graph number `graph`) ran on `device`, all of it."""
        for seen in self.graphs if graph is None else [self.graphs[graph]]:
            assert all(devices == {device} for devices in seen.values()), seen


def _same(got, expected):
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, tuple):
        for g, e in zip(got, expected):
            _same(g, e)
        return
    if isinstance(expected, torch.Tensor):
        assert got.device == expected.device
        torch.testing.assert_close(got, expected)
        return
    assert got.dtype == expected.dtype and np.shape(got) == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _run_on_gpu(fn, *args, graphs=1, breaks=0):
    """fn compiled by inductor and called twice under the CUDA default device, against NumPy's
    own run on copies of args (results and the arguments after the call)."""
    b0, f0 = len(convert.stats.breaks), len(convert.stats.failures)
    rec = DeviceRecorder()
    compiled = ember.compile(fn, backend=rec)
    for _ in range(2):
        args_c, args_e = [_copy(a) for a in args], [_copy(a) for a in args]
        expected = fn(*args_e)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a frame that ran eagerly warns
            with torch.device(DEVICE):
                got = compiled(*args_c)
        _same(got, expected)
        for c, e in zip(args_c, args_e):
            _same(c, e)
    assert not convert.stats.failures[f0:], convert.stats.failures[f0:]
    assert len(convert.stats.breaks[b0:]) == breaks, convert.stats.breaks[b0:]
    assert len(rec.graphs) == graphs
    return rec


def _copy(a):
    return a.clone() if isinstance(a, torch.Tensor) else a.copy()


def rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# -- the programs ----------------------------------------------------------------------------------
def softmax_stats(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    p = e / np.sum(e, axis=-1, keepdims=True)
    return p, np.mean(p), np.argmax(p, axis=1), np.std(x, axis=(0, 1))


def ufuncs_mixed_dtypes(x, n):
    h = np.maximum(np.sin(x) * 2.5 + n, 0)  # float32 * python float + int64 -> float64
    return np.sqrt(np.abs(h)), (n % 3 == 0).sum(axis=0), np.cumsum(n, axis=1), np.tanh(x).min()


def creation(x):
    ramp = np.arange(x.shape[1], dtype=np.float32)
    grid = np.zeros((2, x.shape[1])) + np.linspace(0.0, 1.0, x.shape[1])
    eye = np.eye(x.shape[1]) * np.full(x.shape[1], 3.0) + np.ones((x.shape[1],), np.int32)
    return x * ramp + np.array([1.0, 2.0], np.float32)[:, None], grid, eye @ x.T.astype(np.float64)


def matmuls(a, w):
    h = np.maximum(a @ w + 0.5, 0)  # int64 @ float64 -> float64
    return np.dot(h, h.T), np.einsum("ij,jk->ik", a.astype(np.float32), w.astype(np.float32))


def inplace_updates(x, idx):
    x *= 2.0
    x += np.arange(x.shape[1], dtype=np.float32)
    x[:, 0] = -1.0  # through a view
    x[idx] += 10.0  # an index array
    return np.sqrt(np.abs(x)).mean(axis=0)


def zero_d(x):
    return x.sum(), np.max(x), x[1, 2], np.float32(2) * x.mean()


PROGRAMS = {
    "ufuncs and reductions with axis": (softmax_stats, rand(8, 16)),
    "mixed dtypes (NEP 50)": (ufuncs_mixed_dtypes, rand(4, 5),
                              np.random.default_rng(1).integers(-4, 5, (4, 5))),
    "creation functions": (creation, rand(2, 3)),
    "matmul, dot, einsum": (matmuls, np.random.default_rng(2).integers(-3, 4, (6, 5)),
                            rand(5, 3, dtype=np.float64)),
    "in-place update of an input": (inplace_updates, rand(4, 6), np.array([0, 2])),
    "0-d results are NumPy scalars": (zero_d, rand(3, 4)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_runs_on_the_gpu_and_matches_numpy(name):
    fn, *args = PROGRAMS[name]
    _run_on_gpu(fn, *args).assert_on(DEVICE)


def test_mix_with_torch_ops():
    def f(a, t):
        return np.tanh(a).sum(axis=0), torch.relu(t) * 2 + t.sum(dim=0)

    t = torch.randn(4, 3, device=DEVICE)
    _run_on_gpu(f, rand(4, 3), t).assert_on(DEVICE)


def test_default_device_is_guarded():
    x = rand(3, 4)
    rec = DeviceRecorder()
    compiled = ember.compile(softmax_stats, backend=rec)
    expected = softmax_stats(x)
    with torch.device(DEVICE):
        _same(compiled(x), expected)
    _same(compiled(x), expected)  # no default device: a graph of its own, on the CPU
    torch.set_default_device(DEVICE)
    try:
        _same(compiled(x), expected)  # the same default device set the other way: no recompile
    finally:
        torch.set_default_device(None)
    assert len(rec.graphs) == 2
    rec.assert_on(DEVICE, graph=0)
    rec.assert_on("cpu", graph=1)


def test_torch_from_numpy_breaks_and_gives_a_cpu_tensor():
    def f(a):
        b = np.sin(a) * 2
        return torch.from_numpy(b) + 1  # a CPU tensor sharing b's memory, as in eager

    a = rand(3, 4)
    expected = f(a.copy())
    with torch.device(DEVICE):
        got = ember.compile(f, backend="inductor")(a)
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, expected)


def test_graph_break_brings_arrays_back_to_the_host():
    def f(a):
        h = np.sin(a) * 2
        order = np.argsort(h)  # no mapping: a graph break, h comes back as a host array
        h += 1
        return h, order, np.cos(a).sum()

    _run_on_gpu(f, np.arange(8.0), graphs=2, breaks=1)
