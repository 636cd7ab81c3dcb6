"""Helpers the decomposition modules share: operand preparation, promotion, dims and scalars."""

from __future__ import annotations

import numbers
from typing import Callable, Optional, Sequence

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ember.primtorch import prims, utils
from ember.primtorch.symbolic import to_expr

aten = torch.ops.aten
Kind = utils.ELEMENTWISE_TYPE_PROMOTION_KIND
DEFAULT, NO_OPMATH, INT_TO_FLOAT = Kind.DEFAULT, Kind.NO_OPMATH, Kind.INT_TO_FLOAT
ALWAYS_BOOL, COMPLEX_TO_FLOAT, BOOL_TO_LONG = (
    Kind.ALWAYS_BOOL,
    Kind.COMPLEX_TO_FLOAT,
    Kind.BOOL_TO_LONG,
)

Tensor = torch.Tensor


def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def dtype_of(x) -> torch.dtype:
    """A tensor's dtype, or the dtype torch gives a Python number standing alone."""
    return x.dtype if is_tensor(x) else utils.dtype_of_number(x)


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def is_integral(dtype: torch.dtype, include_bool: bool = True) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex) and (
        include_bool or dtype is not torch.bool
    )


def shape(x) -> tuple:
    """Sizes of a tensor as torch reports them (ints, or SymInts under symbolic tracing)."""
    return tuple(x.shape) if is_tensor(x) else ()


def convert(a: Tensor, dtype: torch.dtype) -> Tensor:
    """`a` as `dtype` (itself when it already has it)."""
    if a.dtype == dtype:
        return a
    return prims.convert_element_type(a, dtype)


def full(shape_, value, dtype: torch.dtype, device) -> Tensor:
    return prims.full(tuple(shape_), value, dtype, device)


def scalar_value(value, dtype: torch.dtype):
    """A Python number coerced to what a tensor of `dtype` can hold (int() of a float for ints)."""
    if isinstance(value, torch.Tensor):
        raise TypeError("scalar_value needs a Python number")
    if dtype is torch.bool:
        return bool(value)
    if not (dtype.is_floating_point or dtype.is_complex):
        return int(value)
    if (
        dtype.is_floating_point
        and isinstance(value, numbers.Complex)
        and not isinstance(value, numbers.Real)
    ):
        raise TypeError(f"cannot convert complex {value} to {dtype}")
    return value


def operand(x, shape_, dtype: torch.dtype, device):
    """A tensor as exactly `shape_` and `dtype`; a number coerced to `dtype` (prims accept numbers
    in place of tensor operands of binary and ternary elementwise prims)."""
    if is_tensor(x):
        if x.device != torch.device(device):  # a CPU scalar tensor beside GPU operands
            x = prims.device_put(x, torch.device(device))
        return utils.broadcast_to(convert(x, dtype), tuple(shape_))
    return scalar_value(x, dtype)


def c(value, t: Tensor):
    """A Python number as a scalar operand for an elementwise prim with tensor `t`."""
    return scalar_value(value, t.dtype)


def device_of(*args):
    """The device of an elementwise result, by torch's rule: a 0-dim CPU tensor may join operands
    on another device, whose device the result then has."""
    tensors = [a for a in args if is_tensor(a)]
    for a in tensors:
        if a.device.type != "cpu" or a.dim() > 0:
            return a.device
    return tensors[0].device if tensors else torch.device("cpu")


def broadcast_shape(*args) -> tuple:
    """The broadcast shape of the tensor arguments (numbers do not participate)."""
    shapes = [shape(a) for a in args if is_tensor(a)]
    if not shapes:
        return ()
    if all(_same_sizes(s, shapes[0]) for s in shapes):
        return shapes[0]
    return tuple(_as_size(s) for s in utils.broadcast_shapes(*shapes))


def _same_sizes(a: tuple, b: tuple) -> bool:
    """The same sizes, compared as expressions: `==` on SymInts would guard on the sizes."""
    return len(a) == len(b) and all(to_expr(x) == to_expr(y) for x, y in zip(a, b))


def _as_size(expr):
    # utils.broadcast_shapes returns sympy expressions; static ones go back to ints.
    try:
        return int(expr)
    except TypeError:
        return expr


def elementwise_dtypes(*args, kind: Kind) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) by torch's rules.

    torch.promote_types goes through the dispatcher; it runs with the tracer's mode off, since it
    reads dtypes only and records nothing.
    """
    with _disable_current_modes():
        return utils.elementwise_dtypes(*args, type_promotion_kind=kind)


def result_type(*args) -> torch.dtype:
    """torch.result_type over tensors and numbers (see elementwise_dtypes on the mode)."""
    with _disable_current_modes():
        return utils.result_type(*args)


def elementwise(
    prim: Callable, *args, kind: Kind = DEFAULT, compute: Optional[torch.dtype] = None
) -> Tensor:
    """Apply an elementwise prim with torch's promotion and broadcasting; returns result dtype."""
    compute_dtype, result_dtype = elementwise_dtypes(*args, kind=kind)
    if compute is not None:
        compute_dtype = compute
    out_shape = broadcast_shape(*args)
    device = device_of(*args)
    ops = [operand(a, out_shape, compute_dtype, device) for a in args]
    if not any(is_tensor(o) for o in ops):
        raise TypeError("elementwise decomposition needs a tensor operand")
    return convert(prim(*ops), result_dtype)


def promote_operands(*args, kind: Kind = DEFAULT):
    """(operands as tensors of the common shape in the computation dtype, result dtype)."""
    compute_dtype, result_dtype = elementwise_dtypes(*args, kind=kind)
    out_shape = broadcast_shape(*args)
    device = device_of(*args)
    return [operand(a, out_shape, compute_dtype, device) for a in args], result_dtype


def like(value, t: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """A tensor filled with `value`, of t's shape and device (and dtype unless given)."""
    dtype = dtype or t.dtype
    return full(t.shape, scalar_value(value, dtype), dtype, t.device)


def canon_dim(ndim: int, dim: int) -> int:
    return utils.canonicalize_dim(ndim, dim)


def canon_dims(ndim: int, dims) -> tuple[int, ...]:
    """Reduction dims: None or [] mean all dimensions."""
    if dims is None or (isinstance(dims, Sequence) and len(dims) == 0):
        return tuple(range(ndim))
    return utils.canonicalize_dims(ndim, dims)


def reduced_shape(shape_, dims, keepdim: bool) -> tuple:
    dims = set(dims)
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape_))
    return tuple(s for i, s in enumerate(shape_) if i not in dims)


def keepdim_reshape(out: Tensor, in_shape, dims, keepdim: bool) -> Tensor:
    """Re-insert reduced dims as size 1 when keepdim is set."""
    if not keepdim or not dims:
        return out
    return prims.expand_dims(out, tuple(sorted(dims)))


def numel(shape_):
    n = 1
    for s in shape_:
        n = n * s
    return n


def default_float(dtype: Optional[torch.dtype]) -> torch.dtype:
    return dtype if dtype is not None else torch.get_default_dtype()
