"""The C++ runtime's scans, sort and topk (csrc/runtime/scans.cc) against eager, in process.

Each test builds one artifact of several extern steps (one input per case, outputs in eager's
layouts), so a test compiles one model library; inputs include transposed views, NaN, ties,
integer dtypes and half precision.
"""

import dataclasses

import pytest
import torch
from ember.ir import BufferIR, StepIR, TensorMeta, new_artifact

from ember.cpp_wrapper import UnsupportedArtifactError, load_artifact

# eager for the extern's (args, kwargs) where torch's signature differs
EAGER = {"sort": lambda x, dim, descending, stable=False: torch.sort(
    x, dim=dim, descending=descending, stable=stable)}  # fmt: skip


def _meta(t):
    return TensorMeta(t.dtype, t.shape, t.stride(), 0)


def _artifact(cases):
    """An artifact with one input and one extern step per case (op, x, args, kwargs, want)."""
    buffers, steps, inputs, outputs = [], [], [], []
    for c, (op, x, args, kwargs, want) in enumerate(cases):
        buffers.append(BufferIR(f"x{c}", "input", _meta(x)))
        outs = [f"out{c}_{i}" for i in range(len(want))]
        buffers += [BufferIR(n, "output", _meta(w)) for n, w in zip(outs, want)]
        steps.append(StepIR("extern", f"extern.{op}", [{"node": f"x{c}"}, *args], kwargs,
                            tuple(outs)))  # fmt: skip
        inputs.append(f"x{c}")
        outputs += outs
    return new_artifact(
        device="cpu", symbols=(), guards=(), buffers=tuple(buffers), kernels=(),
        steps=tuple(steps), inputs=tuple(inputs), outputs=tuple(outputs),
    )  # fmt: skip


def _check(*cases):
    """Each case (op, x, args=(), kwargs={}) run by the runtime equals eager."""
    full = []
    for op, x, *rest in cases:
        args, kwargs = (list(rest[0]) if rest else []), (rest[1] if len(rest) > 1 else {})
        want = EAGER.get(op, getattr(torch, op))(x, *args, **kwargs)
        full.append((op, x, args, kwargs, list(want) if isinstance(want, tuple) else [want]))
    got = load_artifact(_artifact(full))(*(c[1] for c in full))
    wants = [(w, c) for c in full for w in c[4]]
    assert len(got) == len(wants)
    for g, (w, case) in zip(got, wants):
        assert g.dtype == w.dtype and g.shape == w.shape, case[:4]
        # halves: we accumulate in double and round once, torch in float: a last-bit difference
        tol = 2e-2 if w.dtype.itemsize == 2 and w.dtype.is_floating_point else 1e-5
        torch.testing.assert_close(g, w, equal_nan=True, atol=tol, rtol=tol,
                                   msg=lambda m: f"{case[0]}{case[2]}: {m}")  # fmt: skip


def _data(dtype=torch.float32, shape=(6, 9), transposed=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g).to(dtype)
    else:
        x = torch.randint(-5, 6, shape, generator=g).to(dtype)
    return x.t() if transposed else x  # a strided input: the kernels read any strides


@pytest.mark.parametrize("transposed", [False, True])
def test_cumulative_ops(transposed):
    x = _data(transposed=transposed)
    _check(*((op, x, [dim]) for op in ("cumsum", "cumprod", "logcumsumexp") for dim in (0, 1, -1)))


def test_cumulative_ops_of_each_dtype_promote_as_torch():
    dtypes = (torch.int64, torch.int32, torch.bool, torch.float64, torch.float16, torch.bfloat16)
    cases = [("cumsum", _data(d), [1], {"dtype": None}) for d in dtypes]
    cases += [("cumprod", _data(d).clamp(-2, 2), [1]) for d in dtypes if not d.is_floating_point]
    _check(*cases)


def test_cummax_cummin_with_ties_and_nan():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, float("nan"), 5.0, 0.0],
                      [4.0, 4.0, -1.0, -1.0, 7.0, 7.0, 2.0]])  # fmt: skip
    inputs = ((x, 1), (_data(transposed=True), 0), (_data(torch.int64), 1))
    _check(*((op, t, [d]) for op in ("cummax", "cummin") for t, d in inputs))


def test_sort():
    nan = torch.tensor([[3.0, float("nan"), -1.0, float("inf"), -float("inf"), 0.5]])
    distinct = _data(torch.int32, seed=1).unique()[None]  # no ties: indices are determined
    cases = []
    for descending in (False, True):
        for dim in (0, -1):
            cases.append(("sort", _data(transposed=True), [dim, descending], {"stable": False}))
        cases.append(("sort", nan, [1, descending], {"stable": True}))
        cases.append(("sort", distinct, [1, descending]))
    _check(*cases)


def test_topk():
    x = _data(shape=(5, 11), transposed=True)
    cases = [("topk", x, [k, 0, largest, True]) for k in (1, 3, 5) for largest in (True, False)]
    cases += [("topk", _data(torch.float64, shape=(4, 7)), [2, -1, largest, True])
              for largest in (True, False)]  # fmt: skip
    _check(*cases)


def test_topk_with_a_dynamic_k_is_refused_at_build_time():
    x = _data()
    art = _artifact([("topk", x, [{"expr": {"sym": "s0"}}, 1, True, True], {},
                      list(torch.topk(x, 2)))])  # fmt: skip
    with pytest.raises(UnsupportedArtifactError, match="non-constant k"):
        load_artifact(art)


def test_an_unread_output_gets_scratch_storage():
    """Inductor declares no buffer for a result nobody reads (sort(...).values): the wrapper
    allocates one for the kernel to write and releases it after the step."""
    x = _data(transposed=True)
    values, indices = torch.sort(x, dim=1)
    for kept, outputs in ((values, ("out0_0", "unread")), (indices, ("unread", "out0_0"))):
        art = _artifact([("sort", x, [1, False], {}, [kept])])
        step = dataclasses.replace(art.steps[0], outputs=outputs)
        got = load_artifact(dataclasses.replace(art, steps=(step,)))(x)
        assert len(got) == 1
        torch.testing.assert_close(got[0], kept)
