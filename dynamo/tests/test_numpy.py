"""NumPy programs under ember.compile: ndarray inputs become graph inputs, NumPy calls become tensor
ops with NumPy's dtypes, results come back as ndarrays and NumPy scalars, in-place updates reach
the caller's arrays, and a NumPy function with no mapping is a graph break that names it."""

import copy
import warnings

import numpy as np
import pytest
import torch

import ember
from ember.dynamo import CompileCounter, GraphBreakError, convert


@pytest.fixture(autouse=True)
def _reset():
    ember.reset()
    yield
    ember.reset()


def assert_same_np(got, expected, path="result"):
    assert type(got) is type(expected), f"{path}: {type(got)} vs {type(expected)}"
    if isinstance(expected, (np.ndarray, np.generic)):
        assert got.dtype == expected.dtype, f"{path}: dtype {got.dtype} vs {expected.dtype}"
        assert np.shape(got) == np.shape(expected), f"{path}: shape"
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, equal_nan=True,
                                   err_msg=path)  # fmt: skip
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), f"{path}: length"
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same_np(g, e, f"{path}[{i}]")
    elif isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def check(fn, *args, graphs=1, breaks=0, calls=2):
    """Compile `fn` with a counting backend; every call equals NumPy's own (results, their types
    and dtypes, and the arguments after the call); graphs and breaks are as given."""
    cnt = CompileCounter()
    compiled = ember.compile(fn, backend=cnt)
    b0, f0 = len(convert.stats.breaks), len(convert.stats.failures)
    for _ in range(calls):
        args_e, args_c = copy.deepcopy(args), copy.deepcopy(args)
        expected = fn(*args_e)
        got = compiled(*args_c)
        assert_same_np(got, expected)
        assert_same_np(list(args_c), list(args_e), "arguments after the call")
    assert not convert.stats.failures[f0:], convert.stats.failures[f0:]
    assert graphs is None or cnt.frame_count == graphs, convert.stats.breaks[b0:]
    assert breaks is None or len(convert.stats.breaks[b0:]) == breaks, convert.stats.breaks[b0:]
    return cnt


def rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def ints(*shape, dtype=np.int64, seed=0):
    return np.random.default_rng(seed).integers(-5, 6, shape).astype(dtype)


def test_issue_example_is_one_graph():
    def f(x):
        return np.sum(np.exp(np.sin(x)), axis=1)

    out = ember.explain(f)(np.random.rand(4, 5).astype(np.float32))
    assert (out.graph_count, out.graph_break_count) == (1, 0), out.break_reasons
    assert out.ops_per_graph[0] == ["sin", "exp", "sum"]
    check(f, rand(4, 5))


PROMOTION = {
    "int64 + python float -> float64": (lambda a: a + 1.5, ints(3)),
    "float32 + python float stays float32": (lambda a: a * 2.5 - 1, rand(3)),
    "int8 + python int stays int8": (lambda a: a + 3, ints(4, dtype=np.int8)),
    "uint8 * python int stays uint8": (lambda a: a * 7, ints(4, dtype=np.uint8)),
    "int / int -> float64": (lambda a: a / 2, ints(3)),
    "int // int stays int": (lambda a: a // 2 + a % 3, ints(5)),
    "float32 * np.float64 scalar -> float64": (lambda a: a * np.float64(2.0), rand(3)),
    "float32 * np.float32 scalar": (lambda a: a * np.float32(2.0), rand(3)),
    "bool + bool stays bool": (lambda a: (a > 0) + (a < 1), rand(4)),
    "comparison is bool": (lambda a: (a >= 0) & (a != 1), rand(4)),
    "python int - array (reflected)": (lambda a: 2 - a, ints(3, dtype=np.int32)),
    "float ** int": (lambda a: a**2 + 2.0**a, rand(3)),
    "unary minus and abs": (lambda a: -abs(a), ints(3, dtype=np.int16)),
    "sin of int -> float64": (lambda a: np.sin(a), ints(3)),
    "sqrt of int8 -> float16": (lambda a: np.sqrt(a * a), ints(3, dtype=np.int8)),
    "maximum with python scalar": (lambda a: np.maximum(a, 0.0), rand(5)),
    "int32 + int64 -> int64": (lambda a: a + a.astype(np.int64), ints(3, dtype=np.int32)),
    "ufunc dtype= argument": (lambda a: np.add(a, 1, dtype=np.float64), rand(3)),
    "list operand": (lambda a: a + [1, 2, 3], rand(3)),
}


@pytest.mark.parametrize("name", PROMOTION)
def test_dtype_promotion_matches_numpy(name):
    fn, arg = PROMOTION[name]
    check(fn, arg)


REDUCTIONS = {
    "sum all (scalar)": lambda a: np.sum(a),
    "sum axis keepdims": lambda a: np.sum(a, axis=-1, keepdims=True),
    "sum tuple axis": lambda a: a.sum(axis=(0, 2)),
    "mean": lambda a: (np.mean(a), a.mean(axis=1)),
    "max/min": lambda a: (np.max(a, axis=0), a.min(), np.amax(a, axis=(1, 2), keepdims=True)),
    "argmax/argmin": lambda a: (np.argmax(a), np.argmin(a, axis=1), a.argmax(axis=-1)),
    "argmax keepdims": lambda a: np.argmax(a, axis=1, keepdims=True),
    "prod": lambda a: (np.prod(a, axis=1), np.prod(a)),
    "std/var": lambda a: (np.std(a), np.var(a, axis=0, ddof=1)),
    "all/any": lambda a: (np.all(a > -10), np.any(a > 1, axis=2)),
    "cumsum": lambda a: (np.cumsum(a), np.cumsum(a, axis=1)),
    "norm": lambda a: (np.linalg.norm(a), np.linalg.norm(a, axis=1)),
}


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_reductions_axis_keepdims_dtypes(name, dtype):
    arg = rand(2, 3, 4) if dtype == np.float32 else ints(2, 3, 4, dtype=dtype)
    check(REDUCTIONS[name], arg)


def test_reductions_return_numpy_scalars():
    def f(a):
        return np.sum(a), a.max(), np.mean(a), a[0, 1], np.dot(a[0], a[1])

    cnt = check(f, rand(2, 3))
    got = ember.compile(f, backend=cnt)(rand(2, 3))
    assert all(type(g) is np.float32 for g in got), [type(g) for g in got]


def test_products_and_joins():
    def f(a, b, v):
        return (a @ b, np.matmul(a, b), np.dot(a, b), np.dot(v, v), v @ a,
                np.outer(v, v), np.concatenate([a, b.T], axis=0),
                np.concatenate((a, a), axis=None), np.stack([v, v * 2], axis=1))  # fmt: skip

    check(f, rand(3, 4), rand(4, 3, seed=1), rand(3, seed=2))


def test_joins_promote_dtypes():
    def f(a, b):
        return np.concatenate([a, b]), np.stack((b, a)), np.array([a, b])

    check(f, ints(3, dtype=np.int32), rand(3, dtype=np.float32))


def test_shapes_and_views():
    def f(a):
        return (a.reshape(4, 3), np.reshape(a, (-1,)), a.T, np.transpose(a, (1, 0, 2)),
                a.transpose(2, 0, 1), np.swapaxes(a, 0, 2), np.expand_dims(a, 1),
                np.squeeze(a[:, :1]), a.ravel(), a.flatten(), np.moveaxis(a, 0, -1),
                np.flip(a, 1), np.roll(a, 1, axis=2), np.tile(a, (1, 2, 1)),
                np.repeat(a, 2, axis=0), np.broadcast_to(a[:1], (3, 3, 2)),
                np.atleast_2d(a[0, 0]))  # fmt: skip

    check(f, rand(2, 3, 2))


def test_indexing_and_slicing():
    def f(a, idx):
        return (a[0], a[-1, 1:], a[:, None, ::2], a[..., 1], a[idx], a[1, 2], a[idx, 0],
                a[(0, 1)], a[[0, 1]])  # fmt: skip

    check(f, rand(3, 4), np.array([2, 0]))


def test_item_assignment_mutates_like_numpy():
    def f(a, b):
        a[0] = 5
        a[1:, 1] = b[:2]
        a[a < 0] = 0.0
        b[...] = 1.5
        return a.sum()

    check(f, rand(3, 3), rand(4, dtype=np.float64))


def test_inplace_operators_mutate_callers_array():
    def f(a, b):
        a += 1
        b *= 2.5
        b -= a[:3]
        return a, b

    a, b = ints(4), rand(3)
    check(f, a, b)
    a0, b0 = a.copy(), b.copy()
    ember.compile(f, backend="eager")(a, b)
    np.testing.assert_array_equal(a, a0 + 1)
    assert a.dtype == np.int64 and b.dtype == np.float32
    np.testing.assert_allclose(b, b0 * 2.5 - (a0[:3] + 1), rtol=1e-6)


def test_inplace_cast_error_is_numpys():
    def f(a):
        a += 1.5
        return a

    with pytest.raises(TypeError, match="Cannot cast ufunc 'add' output"):
        f(ints(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TypeError, match="Cannot cast ufunc 'add' output"):
            ember.compile(f, backend="eager")(ints(3))


def test_creation_functions_default_to_float64():
    def f(a):
        return (np.zeros(3), np.ones((2, 2), dtype=np.float32), np.arange(5),
                np.arange(1, 2, 0.25), np.arange(6, dtype=np.float32), np.linspace(0, 1, 5),
                np.linspace(-1, 1, 4, endpoint=False), np.full((2,), 7), np.full(2, 0.5),
                np.eye(3), np.zeros_like(a), np.ones_like(a, dtype=int), np.full_like(a, 2),
                np.identity(2, dtype=np.int32), np.array([1, 2, 3]), np.array(2.5),
                a + np.arange(3))  # fmt: skip

    check(f, rand(3))


def test_astype_attributes_and_dtype_branches():
    def f(a):
        b = a.astype(np.float64) if a.dtype == np.float32 else a
        c = a.astype("int32")
        return b, c, a.shape, a.ndim, a.size, a.dtype, b.dtype.itemsize, len(a), np.shape(a)

    check(f, rand(3, 2))
    check(f, rand(3, 2, dtype=np.float64))


def test_where_clip_round_isclose():
    def f(a, b):
        return (np.where(a > 0, a, 0), np.where(a > 0, 1.0, 0.0), np.where(a > b, a, b),
                np.clip(a, -0.5, 0.5), a.clip(0), np.clip(a, None, 0.1), np.round(a, 2),
                np.isclose(a, b), np.abs(a), np.maximum(a, b))  # fmt: skip

    check(f, rand(5), rand(5, seed=1).astype(np.float64))


def test_torch_interop_inside_region():
    def f(a, t):
        x = torch.from_numpy(a) * 2
        y = (t + 1).numpy()
        return x, np.sin(y), y

    check(f, rand(3), torch.ones(3))


def test_python_loop_over_rows_and_list_sum():
    def f(a):
        total = np.zeros(a.shape[1], dtype=a.dtype)
        for row in a:
            total = total + row
        return total, sum(a[i] for i in range(len(a)))

    check(f, rand(3, 4))


def test_guards_recompile_on_dtype_shape_and_strides():
    cnt = CompileCounter()
    f = ember.compile(lambda a: a * 2 + 1, backend=cnt)
    f(rand(3))
    f(rand(3, seed=1))
    assert cnt.frame_count == 1
    for arg in (rand(4), rand(3, dtype=np.float64), rand(3, 2).T, rand(6)[::2]):
        out = f(arg)
        np.testing.assert_allclose(out, arg * 2 + 1, rtol=1e-6)
        assert out.dtype == arg.dtype
    assert cnt.frame_count == 5


def test_unsupported_function_breaks_with_its_name():
    def f(a):
        b = np.sin(a)
        c = np.fft.fft(b)
        return np.abs(c) + 1

    check(f, rand(8), graphs=2, breaks=1)
    out = ember.explain(f)(rand(8))
    reason = out.break_reasons[0]
    assert "numpy.fft.fft" in reason.reason and "no tensor mapping" in reason.reason, reason
    line = f.__code__.co_firstlineno + 2  # the np.fft.fft call
    assert reason.where == f"{__file__}:{line}", reason.where


def test_data_dependent_uses_break():
    def f(a):
        s = np.sum(a)
        if s > 0:  # a Python decision on array data
            return a * 2
        return a - float(np.max(a))

    for seed in range(3):  # either branch
        check(f, rand(5, seed=seed), graphs=None, breaks=None)
    reasons = [r.reason for r in ember.explain(f)(-np.ones(3, dtype=np.float32)).break_reasons]
    assert len(reasons) == 2 and all("data-dependent" in r or "constant" in r for r in reasons)


def test_fullgraph_raises_naming_the_function():
    f = ember.compile(lambda a: np.unique(a), backend="eager", fullgraph=True)
    with pytest.raises(GraphBreakError, match="numpy.unique"):
        f(ints(5))


def test_ndarray_global_is_a_graph_input():
    check(_uses_global, rand(3))
    _W[:] = 3.0  # the graph reads the array anew on each call
    check(_uses_global, rand(3))


_W = np.ones(3, dtype=np.float32)


def _uses_global(a):
    return a * _W


def test_integer_division_by_zero_gives_numpys_zeros():
    def f(a, b):
        return a // b, a % b, np.fmod(a, b), a // 3

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy warns about the division by zero
        check(f, np.array([5, -7, 9]), np.array([2, 0, -4]))
        check(f, np.array([5, -7, 9]), np.zeros(3, dtype=np.int64))


def test_one_array_passed_twice_is_one_input():
    def f(a, b):
        a += 1
        return b * 2

    x = np.ones(3, dtype=np.float32)
    cnt = CompileCounter()
    out = ember.compile(f, backend=cnt)(x, x)
    np.testing.assert_array_equal(out, np.full(3, 4.0, np.float32))
    np.testing.assert_array_equal(x, np.full(3, 2.0, np.float32))
    assert len([n for n in cnt.graphs[0].graph.nodes if n.op == "placeholder"]) == 1


def test_read_only_input_runs_eagerly_with_a_reason():
    a = np.ones(3)
    a.flags.writeable = False
    f0 = len(convert.stats.failures)
    with pytest.warns(UserWarning, match="read-only NumPy array"):
        out = ember.compile(lambda x: x * 2, backend="eager")(a)
    np.testing.assert_array_equal(out, a * 2)
    assert "read-only" in convert.stats.failures[f0].reason


def test_stacking_sorting_statistics_einsum():
    def f(a, b, v):
        c = a.copy()
        c.sort(axis=0)
        return (np.vstack([a, b]), np.vstack((v, v)), np.hstack([a, a[:, :1]]),
                np.hstack((v, v[:2])), np.sort(a), np.sort(a, axis=None), c, np.diff(v),
                np.diff(a, n=2, axis=0), np.median(a), np.median(a, axis=1, keepdims=True),
                np.median(v.astype(int)), np.einsum("ij,kj->ik", a, b),
                np.einsum("i,i", v, v))  # fmt: skip

    a = rand(3, 4)
    a[1, 2] = np.nan  # NumPy sorts NaN last, as torch does
    check(f, a, rand(2, 4, seed=1), rand(4, seed=2))


def test_every_ufunc_matches_numpy_on_mixed_dtypes():
    """Each mapped ufunc over dtype pairs that promote (NEP 50 weak scalars included): where the
    call compiles, the result type, dtype and values are NumPy's."""
    from ember.dynamo.numpy_map import UFUNCS

    g = np.random.default_rng(0)
    arrays = {np.dtype(d): (g.integers(1, 4, 3) if np.dtype(d).kind in "biu"
                            else g.random(3) + 0.5).astype(d)
              for d in (np.bool_, np.int8, np.int64, np.float32, np.float64)}  # fmt: skip
    pairs = [(arrays[np.dtype(a)], b if not isinstance(b, type) else arrays[np.dtype(b)])
             for a, b in [(np.int64, 1.5), (np.int8, np.int64), (np.bool_, np.float32),
                          (np.float32, np.float64(2.0))]]  # fmt: skip
    compiled = failed = 0
    for uf in UFUNCS:
        for x, y in pairs:
            args = (x,) if uf.nin == 1 else (x, y)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    expected = uf(*args)
            except (TypeError, ValueError):
                continue  # NumPy has no loop for these dtypes (or matmul of a scalar)
            ember.reset()
            b0 = len(convert.stats.breaks) + len(convert.stats.failures)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = ember.compile(lambda *a, uf=uf: uf(*a), backend="eager")(*args)
            where = tuple(str(getattr(a, "dtype", type(a).__name__)) for a in args)
            assert_same_np(got, expected, f"np.{uf.__name__}{where}")
            broke = len(convert.stats.breaks) + len(convert.stats.failures) > b0
            compiled, failed = compiled + (not broke), failed + broke
    assert compiled > 250 and failed == 0, (compiled, failed)


def test_one_value_returned_twice_is_one_array():
    def f(a):
        b = a + 1
        return b, [b], torch.from_numpy(b)

    x, y, t = ember.compile(f, backend="eager")(rand(3))
    assert x is y[0] and np.shares_memory(x, t.numpy())


def test_writes_through_views_reach_the_base():
    def f(a):
        row = a[1]
        row += 10
        a.T[0, 2] = -1.0
        flat = a.reshape(-1)
        flat[0] = 7.0
        a[2].fill(np.float64(2.5))
        return a.sum(axis=0), row

    check(f, rand(3, 4))


def test_writes_near_a_flip_break_instead_of_diverging():
    def into_flip(a):
        b = np.flip(a)
        b[0] = 100.0  # NumPy's flip is a view: this writes into a
        return a

    def into_base(a):
        b = np.flip(a, 0)
        a += 1  # ...and this shows through b
        return b

    for fn, arg in ((into_flip, rand(4)), (into_base, rand(3, 2))):
        ember.reset()
        n0 = len(convert.stats.breaks) + len(convert.stats.failures)
        expected_arg = arg.copy()
        expected = fn(expected_arg)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the frame runs eagerly (a write is no call)
            got = ember.compile(fn, backend="eager")(arg)
        assert_same_np([got, arg], [expected, expected_arg])
        reasons = (convert.stats.breaks + convert.stats.failures)[n0:]
        assert reasons and "np.flip" in reasons[0].reason, reasons
    check(lambda a: np.flip(a, 1) * 2, rand(3, 2))


_SCALE = np.float64(0.5)


def test_numpy_scalars_in_torch_code_are_graph_constants():
    def f(x):  # fx printed these as `np.float64(0.5)`, a name the graph's code did not have
        return x * (x.shape[0] * _SCALE) + x * np.float32(2) - np.int64(3), x.reshape(
            (np.int64(2), -1))  # fmt: skip

    check(f, torch.arange(6.0))


def test_index_placement_numpy_and_torch_disagree_on_breaks():
    idx = np.array([2, 0])

    def agree(a):
        return a[1, idx], a[:, 1, idx], a[idx, :, 1], a[idx, 1:, idx]

    def disagree(a):  # NumPy: the integer joins the advanced indices, axes go first: (2, 4)
        return a[1, :, idx] * 2

    a = np.arange(60.0).reshape(3, 4, 5)
    check(agree, a)
    check(disagree, a, graphs=1, breaks=1)


def test_arange_dtype_and_length_follow_numpy():
    def f(a):
        return (np.arange(np.int32(5)), np.arange(0, np.float32(2), 0.5), np.arange(3, 11, 4),
                np.arange(1.0, 0.0, -0.25), np.arange(5, dtype=np.float32),
                a + np.arange(3.0))  # fmt: skip

    check(f, rand(3))
