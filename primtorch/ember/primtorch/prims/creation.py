"""Creation prims: tensors made from a shape, a value and a dtype (no tensor inputs)."""

from __future__ import annotations

import sympy
import torch

from ember.ir import TensorMeta, as_expr

from .. import utils
from .core import prim

_CREATION = ("creation",)


def _ints(values):
    return tuple(int(v) for v in values)


def _shape_canon(shape, *rest, **kwargs):
    return (tuple(shape), *rest), kwargs


def _full_meta(shape, fill_value, dtype, device):
    if not utils.is_number(fill_value):
        raise TypeError(f"prims.full: fill_value must be a number, got {type(fill_value).__name__}")
    return TensorMeta(dtype, shape, utils.make_contiguous_strides_for(shape), 0, str(device))


full = prim(
    "full",
    "(int[] shape, Scalar fill_value, dtype dtype, device device) -> Tensor",
    meta=_full_meta,
    ref=lambda shape, fill_value, dtype, device: torch.full(
        _ints(shape), fill_value, dtype=dtype, device=device
    ),
    canon=_shape_canon,
    tags=_CREATION,
    doc="a contiguous tensor of shape filled with fill_value",
)


def _iota_meta(length, start, step, dtype, device):
    if not (utils.is_integer_dtype(dtype) or dtype.is_floating_point):
        raise TypeError(f"prims.iota: dtype {dtype} is not numeric")
    return TensorMeta(dtype, (as_expr(length),), (1,), 0, str(device))


def _iota_ref(length, start, step, dtype, device):
    index = torch.arange(int(length), dtype=torch.int64, device=device)
    return (index * step + start).to(dtype)


iota = prim(
    "iota",
    "(int length, Scalar start, Scalar step, dtype dtype, device device) -> Tensor",
    meta=_iota_meta,
    ref=_iota_ref,
    tags=_CREATION,
    doc="[start + i * step for i in range(length)], computed as index * step + start",
)


def _empty_strided_meta(shape, strides, dtype, device):
    if len(shape) != len(strides):
        raise ValueError("prims.empty_strided: shape and strides lengths differ")
    return TensorMeta(dtype, shape, strides, 0, str(device))


empty_strided = prim(
    "empty_strided",
    "(int[] shape, int[] strides, dtype dtype, device device) -> Tensor",
    meta=_empty_strided_meta,
    ref=lambda shape, strides, dtype, device: torch.empty_strided(
        _ints(shape), _ints(strides), dtype=dtype, device=device
    ),
    canon=lambda shape, strides, dtype, device: ((tuple(shape), tuple(strides), dtype, device), {}),
    tags=_CREATION,
    doc="an uninitialised tensor with the given layout",
)


def _empty_permuted_meta(shape, physical_layout, dtype, device):
    if sorted(physical_layout) != list(range(len(shape))):
        raise ValueError(f"prims.empty_permuted: {physical_layout} is not a permutation")
    # physical_layout lists dims from outermost to innermost.
    strides = utils.strides_from_perm(
        [sympy.Max(as_expr(s), 1) for s in shape], list(reversed(physical_layout))
    )
    return TensorMeta(dtype, shape, strides, 0, str(device))


empty_permuted = prim(
    "empty_permuted",
    "(int[] shape, int[] physical_layout, dtype dtype, device device) -> Tensor",
    meta=_empty_permuted_meta,
    ref=lambda shape, physical_layout, dtype, device: torch.empty_permuted(
        _ints(shape), tuple(physical_layout), dtype=dtype, device=device
    ),
    canon=lambda shape, physical_layout, dtype, device: (
        (tuple(shape), tuple(physical_layout), dtype, device),
        {},
    ),
    tags=_CREATION,
    doc="an uninitialised dense tensor whose dims are laid out outermost-first as given",
)

scalar_tensor = prim(
    "scalar_tensor",
    "(Scalar value, dtype dtype, device device) -> Tensor",
    meta=lambda value, dtype, device: TensorMeta(dtype, (), (), 0, str(device)),
    ref=lambda value, dtype, device: torch.scalar_tensor(value, dtype=dtype, device=device),
    tags=_CREATION,
    doc="a 0-dim tensor holding value",
)
