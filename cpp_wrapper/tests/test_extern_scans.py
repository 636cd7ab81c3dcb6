"""The C++ runtime's scans, sort and topk (csrc/runtime/scans.cc) against eager, in process.

Each case is a hand-built artifact of one extern step whose outputs take eager's layouts; inputs
include transposed views, NaN, ties, integer dtypes and half precision.
"""

import dataclasses

import pytest
import torch
from ember.ir import BufferIR, StepIR, TensorMeta, new_artifact

from ember.cpp_wrapper import UnsupportedArtifactError, load_artifact


def _one_extern(op, x, args, kwargs, want):
    """An artifact computing extern.`op`(x, *args, **kwargs) with eager's output layouts."""
    outs = [f"out{i}" for i in range(len(want))]
    buffers = [BufferIR("x", "input", TensorMeta(x.dtype, x.shape, x.stride(), 0))]
    buffers += [BufferIR(n, "output", TensorMeta(w.dtype, w.shape, w.stride(), 0))
                for n, w in zip(outs, want)]  # fmt: skip
    step = StepIR("extern", f"extern.{op}", [{"node": "x"}, *args], kwargs, tuple(outs))
    return new_artifact(device="cpu", symbols=(), guards=(), buffers=tuple(buffers), kernels=(),
                        steps=(step,), inputs=("x",), outputs=tuple(outs))  # fmt: skip


# eager for the extern's (args, kwargs) where torch's signature differs
EAGER = {"sort": lambda x, dim, descending, stable=False: torch.sort(
    x, dim=dim, descending=descending, stable=stable)}  # fmt: skip


def _check(op, x, args=(), kwargs=None, tol=1e-5):
    want = EAGER.get(op, getattr(torch, op))(x, *args, **(kwargs or {}))
    want = list(want) if isinstance(want, tuple) else [want]
    got = load_artifact(_one_extern(op, x, list(args), kwargs or {}, want))(x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, equal_nan=True, atol=tol, rtol=tol)


def _data(dtype=torch.float32, shape=(6, 9), transposed=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g).to(dtype)
    else:
        x = torch.randint(-5, 6, shape, generator=g).to(dtype)
    return x.t() if transposed else x  # a strided input: the kernels read any strides


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "logcumsumexp"])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("transposed", [False, True])
def test_cumulative_ops(op, dim, transposed):
    _check(op, _data(transposed=transposed), [dim])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.float64,
                                   torch.float16, torch.bfloat16])  # fmt: skip
def test_cumsum_dtypes_promote_as_torch(dtype):
    x = _data(dtype)
    # halves: we accumulate in double and round once, torch in float: a last-bit difference
    _check("cumsum", x, [1], {"dtype": None}, tol=2e-2 if dtype.itemsize == 2 else 1e-5)
    if not dtype.is_floating_point:
        _check("cumprod", x.clamp(-2, 2), [1])


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_cummax_cummin_with_ties_and_nan(op):
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, float("nan"), 5.0, 0.0],
                      [4.0, 4.0, -1.0, -1.0, 7.0, 7.0, 2.0]])  # fmt: skip
    _check(op, x, [1])
    _check(op, _data(transposed=True), [0])
    _check(op, _data(torch.int64), [1])


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, -1])
def test_sort(descending, dim):
    _check("sort", _data(transposed=True), [dim, descending], {"stable": False})
    x = torch.tensor([[3.0, float("nan"), -1.0, float("inf"), -float("inf"), 0.5]])
    _check("sort", x, [1, descending], {"stable": True})
    _check("sort", _data(torch.int32, seed=1).unique()[None], [1, descending])  # distinct: no ties


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    x = _data(shape=(5, 11), transposed=True)
    for k in (1, 3, 5):
        _check("topk", x, [k, 0, largest, True])
    _check("topk", _data(torch.float64, shape=(4, 7)), [2, -1, largest, True])


def test_topk_with_a_dynamic_k_is_refused_at_build_time():
    x = _data()
    want = list(torch.topk(x, 2))
    art = _one_extern("topk", x, [{"expr": {"sym": "s0"}}, 1, True, True], {}, want)
    with pytest.raises(UnsupportedArtifactError, match="non-constant k"):
        load_artifact(art)


def test_an_unread_second_output_gets_scratch_storage():
    """Inductor declares no buffer for a result nobody reads (sort(...).values): the wrapper
    allocates one for the kernel to write and releases it after the step."""
    x = _data(transposed=True)
    values = torch.sort(x, dim=1).values
    art = _one_extern("sort", x, [1, False], {}, [values])
    step = dataclasses.replace(art.steps[0], outputs=("out0", "unread_indices"))
    got = load_artifact(dataclasses.replace(art, steps=(step,)))(x)
    assert len(got) == 1
    torch.testing.assert_close(got[0], values)
    step = dataclasses.replace(art.steps[0], outputs=("unread_values", "out0"))
    art = _one_extern("sort", x, [1, False], {}, [torch.sort(x, dim=1).indices])
    got = load_artifact(dataclasses.replace(art, steps=(step,)))(x)
    torch.testing.assert_close(got[0], torch.sort(x, dim=1).indices)
