"""Type promotion and broadcasting helpers against torch's own rules."""

import itertools

import pytest
import torch

from ember.ir import TensorMeta, sym
from ember.primtorch import prims, utils

K = utils.ELEMENTWISE_TYPE_PROMOTION_KIND
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.complex64]  # fmt: skip
NUMBERS = [True, 3, 2.5, 1 + 2j]


def _operand(kind, dtype):
    return torch.ones((2,) if kind == "dim" else (), dtype=dtype)


def test_result_type_matches_torch_for_tensor_pairs():
    for (k1, d1), (k2, d2) in itertools.product(
        itertools.product(("dim", "zero"), DTYPES), repeat=2
    ):
        a, b = _operand(k1, d1), _operand(k2, d2)
        assert utils.result_type(a, b) == torch.result_type(a, b), (k1, d1, k2, d2)
        metas = TensorMeta.from_tensor(a), TensorMeta.from_tensor(b)
        assert utils.result_type(*metas) == torch.result_type(a, b)


def test_result_type_matches_torch_with_numbers():
    for kind, dtype, number in itertools.product(("dim", "zero"), DTYPES, NUMBERS):
        t = _operand(kind, dtype)
        assert utils.result_type(t, number) == torch.result_type(t, number), (kind, dtype, number)
        assert utils.result_type(number, t) == torch.result_type(t, number)
    assert utils.result_type(2, 3.5) == torch.get_default_dtype()


@pytest.mark.parametrize(
    "op, kind",
    [(torch.sqrt, K.INT_TO_FLOAT), (torch.eq, K.ALWAYS_BOOL), (torch.abs, K.COMPLEX_TO_FLOAT),
     (torch.add, K.DEFAULT), (torch.mul, K.DEFAULT), (torch.neg, K.DEFAULT)],
)  # fmt: skip
def test_elementwise_dtypes_give_torchs_result_dtype(op, kind):
    checked = 0
    for dtype in DTYPES:
        a = torch.ones(3, dtype=dtype)
        args = (a, a) if op in (torch.eq, torch.add, torch.mul) else (a,)
        try:
            expected = op(*args).dtype
        except RuntimeError:
            continue  # torch rejects the dtype (neg of bool, ...)
        assert utils.elementwise_dtypes(*args, type_promotion_kind=kind)[1] == expected, dtype
        checked += 1
    assert checked >= 7
    bools = torch.ones(3, dtype=torch.bool)
    assert utils.elementwise_dtypes(bools, type_promotion_kind=K.BOOL_TO_LONG)[1] == torch.int64


def test_computation_dtype_is_opmath():
    half = torch.ones(2, dtype=torch.float16)
    assert utils.elementwise_dtypes(half, half, type_promotion_kind=K.DEFAULT) == (
        torch.float32, torch.float16,
    )  # fmt: skip
    assert utils.elementwise_dtypes(half, type_promotion_kind=K.NO_OPMATH) == (
        torch.float16, torch.float16,
    )  # fmt: skip
    ints = torch.ones(2, dtype=torch.int32)
    assert utils.elementwise_dtypes(ints, 2.5, type_promotion_kind=K.DEFAULT)[1] == torch.float32


def test_broadcast_helpers():
    assert utils.broadcast_shapes((3, 1), (1, 4), (4,)) == (3, 4)
    with pytest.raises(ValueError):
        utils.broadcast_shapes((3,), (4,))
    t = torch.randn(3, 1)
    out = utils.broadcast_to(t, (2, 3, 4))
    assert out.shape == (2, 3, 4) and out.stride() == t.expand(2, 3, 4).stride()
    a, b, n = utils.broadcast(torch.randn(4), torch.randn(2, 1), 3)
    assert a.shape == b.shape == (2, 4) and n == 3
    s0 = sym("s0")
    meta = TensorMeta(torch.float32, (s0, 1), (1, 1))
    assert utils.broadcast_to(meta, (2, s0, 5)).sizes == (2, s0, 5)


def test_complex_and_half_pointwise_metas():
    for dtype in (torch.complex64, torch.float16, torch.bfloat16):
        x = torch.randn(2, 3, 4, 5, dtype=dtype).to(memory_format=torch.channels_last)
        for p, args in ((prims.exp, (x,)), (prims.abs, (x,)), (prims.add, (x, x)),
                        (prims.eq, (x, x)), (prims.mul, (x, 2))):  # fmt: skip
            out, meta = p(*args), p.meta(*args)
            assert meta.dtype == out.dtype and tuple(meta.strides) == out.stride(), (p, dtype)
