"""NumPy programs under a non-CPU default torch device, checked without a GPU on the meta device:
the graph's inputs are copies on the device, creation functions make their tensors there, the
graph runs there (the host copy of a meta result then fails, as torch's own `.cpu()` of it does),
written inputs leave the graph to be copied back, the default device is guarded, and
torch.from_numpy / Tensor.numpy() keep torch's CPU semantics by breaking the graph.
tests/test_numpy_cuda.py checks values on a GPU."""

import numpy as np
import pytest
import torch

import ember
from ember.dynamo import GraphBreakError, convert, numpy_device
from ember.ir import NODE_META_KEY


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


class Recorder:
    """A backend recording each graph, its example inputs' devices and, at run time, the devices
    of the inputs it is called with and of the outputs it returns; it runs the graph eagerly."""

    def __init__(self):
        self.graphs, self.example_devices, self.run_devices, self.out_devices = [], [], [], []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        self.example_devices.append({t.device.type for t in example_inputs})

        def run(*args):
            self.run_devices.append({a.device.type for a in args})
            out = gm.forward(*args)
            self.out_devices.append({o.device.type for o in out})
            return out

        return run


def _meta_call(compiled, *args):
    """Call under `with torch.device("meta")`: the graph runs on meta tensors; bringing a result
    (or a written input) back to the host is where meta's missing data shows."""
    with torch.device("meta"):
        with pytest.raises(NotImplementedError, match="meta"):
            compiled(*args)


def softmax_and_creation(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    p = e / np.sum(e, axis=-1, keepdims=True)
    ramp = np.arange(x.shape[1], dtype=np.float32) + np.zeros(x.shape[1], np.float32)
    return p * ramp + np.array([1.0], np.float32), np.mean(p)


def test_graph_runs_on_the_default_device():
    rec = Recorder()
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    _meta_call(ember.compile(softmax_and_creation, backend=rec), x)
    (gm,) = rec.graphs
    assert rec.example_devices == [{"meta"}] and rec.run_devices == [{"meta"}]
    assert rec.out_devices == [{"meta"}]
    metas = [n.meta[NODE_META_KEY] for n in gm.graph.nodes if NODE_META_KEY in n.meta]
    assert len(metas) > 10 and {str(m.device) for m in metas} == {"meta"}  # every value
    made = [n for n in gm.graph.nodes if n.target in (torch.arange, torch.zeros, torch.tensor)]
    assert len(made) == 3 and all(n.kwargs["device"] == torch.device("meta") for n in made)


def test_default_device_is_guarded():
    rec = Recorder()
    compiled = ember.compile(softmax_and_creation, backend=rec)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    expected = softmax_and_creation(x)
    np.testing.assert_allclose(compiled(x)[0], expected[0], rtol=1e-6)
    assert len(rec.graphs) == 1
    assert not any("device" in n.kwargs for n in rec.graphs[0].graph.nodes)  # as before
    guards = convert.stats.graphs[-1].guards
    assert "<torch default device>.current == None" in guards, guards
    _meta_call(compiled, x)
    assert len(rec.graphs) == 2  # another default device: compiled anew, not the CPU graph
    torch.set_default_device("meta")
    try:  # the same default device set the other way: the meta graph again
        with pytest.raises(NotImplementedError, match="meta"):
            compiled(x)
        assert len(rec.graphs) == 2
        with torch.device("cpu"):  # the innermost default device counts: the CPU again
            got = compiled(x)
    finally:
        torch.set_default_device(None)
    assert len(rec.graphs) == 3 and rec.run_devices[-1] == {"cpu"}
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)
    assert type(got[1]) is np.float32
    got = compiled(x)  # no default device: the first graph, still cached
    assert len(rec.graphs) == 3
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)


def _output_placeholders(gm):
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    return [n.name for n in out.args[0] if n.op == "placeholder"]


def test_written_inputs_leave_the_graph_to_be_copied_back():
    def write_through_view(a, b):
        a[:, 0] += 1.0  # a view of input a
        return (a * b).sum(axis=1)

    def write_whole(a, b):
        b.fill(2)
        a *= 3
        return a + b

    def read_only(a, b):
        return a * b

    for fn, written in ((write_through_view, ["a"]), (write_whole, ["b", "a"]),
                        (read_only, [])):  # fmt: skip
        rec = Recorder()
        a, b = np.ones((2, 3)), np.ones((2, 3))
        _meta_call(ember.compile(fn, backend=rec), a, b)
        assert _output_placeholders(rec.graphs[0]) == [f"l_{n}" for n in written], fn.__name__
        np.testing.assert_array_equal(a, np.ones((2, 3)))  # nothing came back from meta
    # On the CPU the graph writes the arrays' own memory: no input leaves the graph.
    rec = Recorder()
    a, b = np.ones((2, 3)), np.ones((2, 3))
    ember.compile(write_whole, backend=rec)(a, b)
    assert _output_placeholders(rec.graphs[0]) == []
    np.testing.assert_array_equal(a, np.full((2, 3), 3.0))


def test_from_numpy_and_tensor_numpy_keep_cpu_semantics():
    def from_numpy(a):
        return torch.from_numpy(a) * 2

    def to_numpy(t):
        return np.sin(t.numpy())

    a, t = np.arange(6.0).reshape(2, 3), torch.ones(3)
    with torch.device("meta"):
        with pytest.raises(GraphBreakError, match="torch.from_numpy where NumPy arrays compute on "
                                                  "meta"):  # fmt: skip
            ember.compile(from_numpy, backend="eager", fullgraph=True)(a)
        with pytest.raises(GraphBreakError, match=r"Tensor.numpy\(\) where NumPy arrays compute"):
            ember.compile(to_numpy, backend="eager", fullgraph=True)(t)
        got = ember.compile(from_numpy, backend="eager")(a)  # the break: from_numpy runs eagerly
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, torch.from_numpy(a) * 2)
    # Without a default device both stay in the graph, sharing memory as before.
    out = ember.explain(from_numpy)(a)
    assert (out.graph_count, out.graph_break_count) == (1, 0)


def test_break_with_a_view_of_an_input_alive_runs_eagerly():
    def f(a):
        row = a[0]  # a view: code after the break may write through it
        spectrum = np.fft.fft(row)  # no mapping: a graph break
        row[0] = spectrum.real[0]
        return a

    a = np.arange(6.0).reshape(2, 3)
    expected = f(a.copy())
    f0 = len(convert.stats.failures)
    with torch.device("meta"):  # the frame runs eagerly: pure NumPy, which meta does not touch
        with pytest.warns(UserWarning, match="runs eagerly: a graph break with a view"):
            got = ember.compile(f, backend="eager")(a)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(a, expected)
    reasons = [r.reason for r in convert.stats.failures[f0:]]
    assert any("view of a NumPy array alive" in r for r in reasons), reasons


@pytest.fixture
def copying_cpu(monkeypatch):
    """`with torch.device("cpu")` takes the copying path (as a GPU would): real values."""
    monkeypatch.setattr(numpy_device, "IN_PLACE_DEVICE_TYPES", set())
    with torch.device("cpu"):
        yield


def writes_and_creation(a, b, i):
    a[:, 0] += 1.0  # through a view
    a[i] = 5.0  # an item assignment
    b.sort()  # in place
    z = np.zeros((2, 3)) + np.arange(3) + np.linspace(0, 1, 3) + np.eye(2, 3) + np.full(3, 2.0)
    return (a @ b.T).sum(axis=1), np.mean(a), z * np.array([1, 2, 3]), b.max()


def test_copying_path_values(copying_cpu):
    rec = Recorder()
    compiled = ember.compile(writes_and_creation, backend=rec)
    for i in (1, 1):  # the second call reuses the graph
        a, b = np.ones((2, 3), np.float32), np.array([[3, 1, 2], [9, 7, 8]], np.int64)
        a_e, b_e = a.copy(), b.copy()
        expected = writes_and_creation(a_e, b_e, i)
        got = compiled(a, b, i)
        for g, e in zip(got, expected):
            assert type(g) is type(e) and g.dtype == e.dtype, (g, e)
            np.testing.assert_allclose(g, e, rtol=1e-6)
        np.testing.assert_array_equal(a, a_e)  # the writes were copied back
        np.testing.assert_array_equal(b, b_e)
    assert len(rec.graphs) == 1 and _output_placeholders(rec.graphs[0]) == ["l_a", "l_b"]
    made = [n for n in rec.graphs[0].graph.nodes if "device" in n.kwargs]
    assert len(made) >= 6 and all(n.kwargs["device"] == torch.device("cpu") for n in made)


def test_copying_path_break_rebuilds_host_arrays(copying_cpu):
    def f(a):
        h = np.sin(a) * 2  # computed in the graph, no other value shares it
        spectrum = np.fft.fft(h)  # a graph break: h comes back as a host array
        h += 1  # the code after the break writes its own copy
        return h, spectrum, a

    a = np.arange(4.0)
    expected = f(a.copy())
    b0, f0 = len(convert.stats.breaks), len(convert.stats.failures)
    got = ember.compile(f, backend="eager")(a)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12)
    assert got[2] is a
    assert not convert.stats.failures[f0:] and len(convert.stats.breaks[b0:]) == 1

    def view_alive(a):
        row = a[1:]  # a view of the input: its host copy would not be one
        order = np.argsort(row)  # a graph break
        row[0] = order[0]
        return a

    a = np.arange(4.0)
    with pytest.warns(UserWarning, match="runs eagerly: a graph break with a view"):
        got = ember.compile(view_alive, backend="eager")(a)
    np.testing.assert_array_equal(got, view_alive(np.arange(4.0)))
    assert got is a and a[1] == 0.0
    reasons = [r.reason for r in convert.stats.failures[f0:]]
    assert any("view of a NumPy array alive" in r for r in reasons), reasons


def test_inputs_sharing_memory_are_read_as_copies_and_never_written(copying_cpu):
    def write(a, b):
        a += 1
        return b.sum()

    def read(a, b):
        return (a * 2).sum() + b.sum()

    base = np.arange(9.0).reshape(3, 3)
    f0 = len(convert.stats.failures)
    assert ember.compile(read, backend="eager")(base, base[0]) == read(base, base[0])
    assert not convert.stats.failures[f0:]
    with pytest.warns(UserWarning, match="runs eagerly: a write into one of two"):
        got = ember.compile(write, backend="eager")(base, base[0])
    assert got == 6.0 and base[0, 0] == 1.0
    reasons = [r.reason for r in convert.stats.failures[f0:]]
    assert any("two NumPy input arrays that share memory" in r for r in reasons), reasons
