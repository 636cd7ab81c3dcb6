"""NumPy programs whose array sizes change: after the automatic-dynamic recompile (or with
dynamic=True) an ndarray input has symbolic sizes, one graph serves every size, and the guard on
the array (sizes, C order) sends what the graph cannot take to a new compile."""

import copy
import warnings

import numpy as np
import pytest

import ember
from ember.dynamo import CompileCounter, convert


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


def rand(*shape, dtype=np.float32):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)


def assert_same(got, expected):
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e)
        return
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, (np.ndarray, np.generic)):
        assert got.dtype == expected.dtype and np.shape(got) == np.shape(expected)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    else:
        assert got == expected


def run(fn, arrays, **compile_kwargs):
    """Call compiled `fn` on each array (a fresh copy for eager and for compiled); results and
    the arrays after the call equal NumPy's; returns the counting backend."""
    cnt = CompileCounter(dynamic=True)
    compiled = ember.compile(fn, backend=cnt, **compile_kwargs)
    f0 = len(convert.stats.failures)
    for a in arrays:
        a_e, a_c = copy.deepcopy(a), copy.deepcopy(a)
        assert_same(compiled(a_c), fn(a_e))
        np.testing.assert_array_equal(a_c, a_e)
    assert not convert.stats.failures[f0:]
    return cnt


def sin_exp_sum(a):
    return np.sum(np.exp(np.sin(a)), axis=1)


def test_a_changing_size_compiles_once_more_then_never():
    cnt = run(sin_exp_sum, [rand(n, 5) for n in (3, 4, 6, 9, 17, 40)])
    assert cnt.frame_count == 2  # static first, then the size that changed is a symbol
    (symbol,) = cnt.graphs[1].meta["ember_symbols"]
    assert symbol.lower == 2 and cnt.graphs[0].meta.get("ember_symbols") is None


def test_dynamic_true_compiles_once_for_every_size():
    cnt = run(sin_exp_sum, [rand(n, m) for n, m in ((3, 5), (4, 7), (8, 2))], dynamic=True)
    assert cnt.frame_count == 1
    assert len(cnt.graphs[0].meta["ember_symbols"]) == 2


def test_the_guard_recompiles_what_the_graph_cannot_take():
    arrays = [rand(3, 5), rand(4, 5),  # static, then dynamic dim 0
              rand(6, 5).astype(np.float64),  # another dtype
              rand(5, 6).T,  # not C order: strides differ from the sizes'
              rand(1, 5),  # size 1 is outside a symbol's range
              rand(3, 5, 2)]  # another rank
    cnt = run(sin_exp_sum, arrays)
    assert cnt.frame_count == 6


def test_sizes_read_by_the_program_are_symbolic():
    def f(a):
        n, m = a.shape
        return a.reshape(n * m)[: len(a)] + np.ones(len(a), dtype=np.float32)

    cnt = run(f, [rand(n, 4) for n in (3, 5, 7, 11)])
    assert cnt.frame_count == 2


def test_in_place_updates_of_a_dynamic_input_reach_the_caller():
    def f(a):
        a += 1
        a[:, 0] = a[:, 1] * 2
        return np.std(a, axis=1), np.median(a), a.T @ a

    assert run(f, [rand(n, 4) for n in (3, 5, 6, 8)]).frame_count == 2


def test_shape_functions_stay_dynamic():
    def f(a):
        return (np.expand_dims(a, (0, 2)), np.squeeze(a[None]), np.atleast_2d(a[0]),
                np.vstack([a[0], a[1]]), np.atleast_1d(a[0, 0]))  # fmt: skip

    assert run(f, [rand(n, 4) for n in (3, 5, 6, 8)]).frame_count == 2


def test_a_size_read_as_a_python_int_traces_the_frame_static():
    def f(a):
        return np.sin(a) * a.size

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cnt = run(f, [rand(n, 4) for n in (3, 5, 6)])
    assert cnt.frame_count == 3  # each size its own static graph, as before dynamic arrays
    assert all(gm.meta.get("ember_symbols") is None for gm in cnt.graphs)
    assert any("ndarray.size of a NumPy array with dynamic sizes" in str(w.message)
               for w in caught)  # fmt: skip


def test_the_guard_names_the_array_and_its_symbolic_size():
    f = ember.compile(sin_exp_sum, backend=CompileCounter(dynamic=True))
    g0 = len(convert.stats.graphs)
    f(rand(3, 5))
    f(rand(4, 5))
    first, second = convert.stats.graphs[g0:]
    assert "L['a'].shape == (3, 5)" in first.guards
    assert "L['a']: ndarray shape=(slot0, 5) C order" in second.guards
    assert not any(".shape ==" in g or ".strides" in g for g in second.guards)


def test_the_guard_vm_reads_an_arrays_dynamic_sizes():
    import sympy

    from ember.dynamo import source as S
    from ember.dynamo.guards import GuardSet

    gs = GuardSet()
    gs.add("SYM_ARRAY", S.LocalSource("a", 0), (4, (-1, 5)))  # float32: 4-byte items
    slot = sympy.Symbol("_slot0", integer=True, positive=True)
    gs.add_relations([slot >= 2, slot <= 10], 1)
    prog = gs.compile()

    def check(a):
        return prog.check((None, a), {}, {})

    assert check(rand(3, 5)) == -1 and check(rand(10, 5)) == -1
    assert check(rand(11, 5)) >= 0 and check(rand(1, 5)) >= 0  # the slot's range
    assert check(rand(3, 6)) >= 0 and check(rand(3, 5, 1)) >= 0  # static size, rank
    assert check(rand(5, 3).T) >= 0  # C order
    assert check(rand(3, 10)[:, ::2]) >= 0  # a strided view: bytes between rows differ
    assert check(rand(3, 5).astype(np.float64)) >= 0  # 8-byte items: strides differ


def test_sizes_in_array_arithmetic_stay_symbolic_where_numpy_cannot_overflow():
    def f(a):
        i = a.astype(np.int64)
        return (a.shape[0] * np.mean(a, axis=0) + len(a), a / len(a), i // a.shape[0],
                i % len(a), a > a.shape[0])  # fmt: skip

    assert run(f, [rand(n, 4) * 5 for n in (3, 5, 6, 9)]).frame_count == 2

    def narrow(a):  # int8 + a size: NumPy raises past int8's range, so the value is guarded
        return a.astype(np.int8) + len(a)

    def power(a):  # torch's Tensor.__pow__ takes no SymInt exponent: guarded too
        return a ** len(a)

    for fn in (narrow, power):
        assert run(fn, [rand(n, 4) * 5 for n in (3, 5, 6)]).frame_count == 3
