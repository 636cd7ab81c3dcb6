"""Type promotion, broadcasting, dimension and stride rules shared by prims and decompositions.

Everything here works on torch tensors, TensorMetas and Python numbers alike, with sizes that may
be sympy expressions. Symbolic comparisons assume that every size symbol is at least 2 (sizes 0
and 1 are specialised before tracing, as `ember.ir.SymbolSpec`'s default lower bound says).
"""

from __future__ import annotations

import contextlib
import enum
import numbers
import threading
from typing import Optional

import sympy
import torch

from ember.ir import TensorMeta, as_expr, contiguous_strides
from ember.ir.symbols import CeilDiv, FloorDiv

# --- dtype categories --------------------------------------------------------------------------


def is_float_dtype(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def is_complex_dtype(dtype: torch.dtype) -> bool:
    return dtype.is_complex


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """Integer dtypes, bool excluded."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype is torch.bool)


def is_boolean_dtype(dtype: torch.dtype) -> bool:
    return dtype is torch.bool


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    """complex64 -> float32, complex128 -> float64; other dtypes unchanged."""
    return {torch.complex64: torch.float32, torch.complex128: torch.float64,
            torch.complex32: torch.float16}.get(dtype, dtype)  # fmt: skip


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 -> complex64, float64 -> complex128 (complex dtypes unchanged)."""
    if dtype.is_complex:
        return dtype
    return {torch.float16: torch.complex32, torch.bfloat16: torch.complex64,
            torch.float32: torch.complex64, torch.float64: torch.complex128}[dtype]  # fmt: skip


def opmath_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch computes in for `dtype` (float16/bfloat16 compute in float32)."""
    return {torch.float16: torch.float32, torch.bfloat16: torch.float32,
            torch.complex32: torch.complex64}.get(dtype, dtype)  # fmt: skip


def dtype_of_number(x) -> torch.dtype:
    """The dtype torch gives a Python number when it stands alone (a "wrapped number")."""
    if isinstance(x, (bool, torch.SymBool)):
        return torch.bool
    if isinstance(x, (numbers.Integral, torch.SymInt)) or (
        isinstance(x, sympy.Expr) and x.is_integer
    ):
        return torch.int64
    if isinstance(x, (numbers.Real, sympy.Expr, torch.SymFloat)):
        return torch.get_default_dtype()
    if isinstance(x, numbers.Complex):
        return complex_dtype(torch.get_default_dtype())
    raise TypeError(f"{type(x).__name__} is not a number")


def is_number(x) -> bool:
    return isinstance(
        x, (numbers.Number, sympy.Expr, torch.SymInt, torch.SymFloat, torch.SymBool)
    ) and not isinstance(x, torch.Tensor)


def is_tensor_like(x) -> bool:
    return isinstance(x, (torch.Tensor, TensorMeta))


# --- type promotion ----------------------------------------------------------------------------


class ELEMENTWISE_TYPE_PROMOTION_KIND(enum.Enum):
    """How an elementwise op turns the promoted dtype into computation and result dtypes."""

    DEFAULT = "default"
    NO_OPMATH = "no_opmath"
    INT_TO_FLOAT = "int_to_float"
    ALWAYS_BOOL = "always_bool"
    COMPLEX_TO_FLOAT = "complex_to_float"
    BOOL_TO_LONG = "bool_to_long"


def _category(dtype: Optional[torch.dtype]) -> int:
    if dtype is None:
        return -1
    if dtype is torch.bool:
        return 0
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 1


def _promote(a: Optional[torch.dtype], b: Optional[torch.dtype]) -> Optional[torch.dtype]:
    if a is None:
        return b
    if b is None:
        return a
    return torch.promote_types(a, b)


def _combine(higher: Optional[torch.dtype], lower: Optional[torch.dtype]):
    # A lower-priority participant (0-dim tensor, Python number) only changes the result when it is
    # of a higher category; a complex one keeps the float width of a floating higher participant.
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        return complex_dtype(higher) if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher is torch.bool or lower.is_floating_point:
        return _promote(higher, lower)
    return higher


def result_type(*args) -> torch.dtype:
    """torch.result_type over tensors, TensorMetas and Python numbers (None entries ignored)."""
    dim_result = zero_result = wrapped_result = None
    seen = False
    for a in args:
        if a is None:
            continue
        seen = True
        if is_tensor_like(a):
            ndim = a.ndim if isinstance(a, TensorMeta) else a.dim()
            if ndim > 0:
                dim_result = _promote(dim_result, a.dtype)
            else:
                zero_result = _promote(zero_result, a.dtype)
        elif is_number(a):
            wrapped_result = _promote(wrapped_result, dtype_of_number(a))
        elif isinstance(a, torch.dtype):
            dim_result = _promote(dim_result, a)
        else:
            raise TypeError(f"cannot take the dtype of {type(a).__name__}")
    if not seen:
        raise ValueError("result_type needs at least one tensor or number")
    return _combine(dim_result, _combine(zero_result, wrapped_result))


def elementwise_dtypes(
    *args, type_promotion_kind: ELEMENTWISE_TYPE_PROMOTION_KIND
) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) of an elementwise op, following torch's rules."""
    kind = ELEMENTWISE_TYPE_PROMOTION_KIND(type_promotion_kind)
    promoted = result_type(*args)
    K = ELEMENTWISE_TYPE_PROMOTION_KIND
    if kind is K.NO_OPMATH:
        return promoted, promoted
    if kind is K.INT_TO_FLOAT:
        if _category(promoted) < 2:
            promoted = torch.get_default_dtype()
        return opmath_dtype(promoted), promoted
    if kind is K.ALWAYS_BOOL:
        return opmath_dtype(promoted), torch.bool
    if kind is K.COMPLEX_TO_FLOAT:
        return opmath_dtype(promoted), real_dtype(promoted)
    if kind is K.BOOL_TO_LONG:
        if promoted is torch.bool:
            return torch.int64, torch.int64
        return opmath_dtype(promoted), promoted
    return opmath_dtype(promoted), promoted


# --- symbolic decisions ------------------------------------------------------------------------


def _at_least_two(expr: sympy.Expr) -> sympy.Expr:
    subs = {s: sympy.Symbol(f"_{s.name}_m2", integer=True, nonnegative=True) + 2
            for s in expr.free_symbols}  # fmt: skip
    return expr.xreplace(subs)


# While a symbolic trace runs: its ShapeEnv (what its ranges and guards imply; guards it records).
# Per thread, as the trace is: another thread's trace must neither see these ranges nor record
# its guards here.
_LOCAL = threading.local()


def _assumptions() -> list:
    stack = getattr(_LOCAL, "assumptions", None)
    if stack is None:
        stack = _LOCAL.assumptions = []
    return stack


def _active_env():
    stack = _assumptions()
    if stack:
        return stack[-1]
    # Autograd's worker threads (a traced CUDA backward) record into the tracing thread's
    # recorder (prims.core.lent_to_autograd_workers); its shape env comes with it.
    from ember.primtorch.prims import core  # utils is imported by prims: not at module level

    if core._engine_thread():
        return getattr(core.current_recorder(), "shape_env", None)
    return None


@contextlib.contextmanager
def assuming(env):
    """`known` also accepts what `env.implies(rel)` (a trace's ranges and guards) says holds, and
    `guard_equal` records equalities in `env`."""
    stack = _assumptions()
    stack.append(env)
    try:
        yield
    finally:
        stack.pop()


def guard_equal(a, b) -> bool:
    """a == b for every size the trace covers: known, or true at the hints of the active trace
    (which then records the guard Eq(a, b)). Two inputs' sequence lengths, say, are distinct
    symbols that a broadcast between them needs equal."""
    if known_eq(a, b):
        return True
    env = _active_env()
    return env is not None and env.guard_equal(as_expr(a), as_expr(b))


def known(rel) -> bool:
    """True when a sympy relation (or bool) holds for every size assignment (symbols >= 2), or
    under the active trace's assumptions (`assuming`)."""
    if isinstance(rel, bool):
        return rel
    rel = sympy.sympify(rel)
    if rel is sympy.true:
        return True
    if rel is sympy.false or not rel.free_symbols:
        return bool(rel)
    lhs = _at_least_two(rel.lhs - rel.rhs)
    if _decided(type(rel), lhs):
        return True
    env = _active_env()
    return env is not None and env.implies(rel)


_ORDERS = (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt)


def _decided(order, lhs: sympy.Expr) -> bool:
    """Whether `order(lhs, 0)` holds for all values of its symbols. A remainder `Mod(x, c)`
    that lhs is linear in counts as any value in [0, c - 1] (both ends must hold): a padded size
    `s - Mod(s, 8) + 8` is then known to exceed `s`."""
    if order(sympy.expand(lhs), 0) is sympy.true:
        return True
    if order not in _ORDERS:
        return False
    divisions = _as_remainders(lhs)
    if divisions is not lhs:
        return _decided(order, divisions)
    for mod in lhs.atoms(sympy.Mod):
        c = mod.args[1]
        if not (c.is_Integer and c > 0):
            continue
        d = sympy.Dummy("mod", integer=True)
        free = sympy.expand(lhs.xreplace({mod: d}))
        if d in sympy.expand(free.diff(d)).free_symbols:
            continue  # not linear in it: its ends do not bound it
        return all(_decided(order, free.xreplace({d: end})) for end in (0, c - 1))
    return False


def _as_remainders(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with each integer division by a positive constant c written through its remainder,
    floor(p / c) = (p - Mod(p, c)) / c (and a ceiling as the floor of p + c - 1), so that
    `_decided` bounds it: a size rounded up to a multiple, 16*FloorDiv(s + 15, 16), is then known
    to be at least s. `expr` itself when it has none."""
    subs = {}
    for f in expr.atoms(FloorDiv, CeilDiv, sympy.floor, sympy.ceiling):
        if isinstance(f, (FloorDiv, CeilDiv)):
            p, c = f.args
        else:
            p, c = sympy.fraction(sympy.together(f.args[0]))
        if not (c.is_Integer and c > 0):
            continue
        if isinstance(f, (CeilDiv, sympy.ceiling)):
            p = p + c - 1
        subs[f] = (p - sympy.Mod(p, c)) / c
    return expr.xreplace(subs) if subs else expr


def _static(a):
    # Static sizes (ints, sympy Integers) skip sympy entirely: tracing calls these per op.
    if isinstance(a, int):
        return a
    if isinstance(a, sympy.Integer):
        return int(a)
    return None


def known_eq(a, b) -> bool:
    x, y = _static(a), _static(b)
    if x is not None and y is not None:
        return x == y
    return known(sympy.Eq(as_expr(a), as_expr(b)))


def known_ne(a, b) -> bool:
    x, y = _static(a), _static(b)
    if x is not None and y is not None:
        return x != y
    return known(sympy.Ne(as_expr(a), as_expr(b)))


def known_lt(a, b) -> bool:
    x, y = _static(a), _static(b)
    if x is not None and y is not None:
        return x < y
    return known(sympy.Lt(as_expr(a), as_expr(b)))


def known_le(a, b) -> bool:
    x, y = _static(a), _static(b)
    if x is not None and y is not None:
        return x <= y
    return known(sympy.Le(as_expr(a), as_expr(b)))


def compare(a, b) -> int:
    """-1, 0 or 1 when a < b, a == b or a > b is decidable; raises when it is not."""
    x, y = _static(a), _static(b)
    if x is not None and y is not None:
        return (x > y) - (x < y)
    a, b = as_expr(a), as_expr(b)
    if known_eq(a, b):
        return 0
    if known_lt(a, b):
        return -1
    if known_lt(b, a):
        return 1
    raise ValueError(f"cannot decide how {a} compares with {b} for all sizes")


# --- dimensions and shapes ---------------------------------------------------------------------


def canonicalize_dim(ndim: int, dim: int, wrap_scalar: bool = True) -> int:
    """A dimension index in [0, ndim) (a 0-dim tensor accepts 0 and -1)."""
    rank = max(ndim, 1) if wrap_scalar else ndim
    if not -rank <= dim < rank:
        raise IndexError(f"dimension {dim} is out of range for a tensor of {ndim} dimensions")
    return dim + rank if dim < 0 else dim


def canonicalize_dims(ndim: int, dims) -> tuple[int, ...]:
    """Canonical dims (an int or a sequence), checked for duplicates."""
    if isinstance(dims, int):
        dims = (dims,)
    out = tuple(canonicalize_dim(ndim, d) for d in dims)
    if len(set(out)) != len(out):
        raise ValueError(f"duplicate dimensions in {tuple(dims)}")
    return out


def shape_of(x) -> tuple:
    """Sizes of a tensor or TensorMeta as sympy expressions (a number has shape ())."""
    if isinstance(x, TensorMeta):
        return x.sizes
    if isinstance(x, torch.Tensor):
        return tuple(as_expr(s) for s in x.shape)
    if is_number(x):
        return ()
    return tuple(as_expr(s) for s in x)


def broadcast_shapes(*shapes) -> tuple:
    """The broadcast of shapes (sequences of ints or sympy expressions), right-aligned."""
    shapes = [tuple(as_expr(s) for s in shape) for shape in shapes]
    ndim = max((len(s) for s in shapes), default=0)
    out = [sympy.S.One] * ndim
    for shape in shapes:
        for i, size in enumerate(shape):
            j = ndim - len(shape) + i
            if known_eq(size, 1):
                continue
            if known_eq(out[j], 1) or guard_equal(out[j], size):
                out[j] = size if known_eq(out[j], 1) else out[j]
            else:
                raise ValueError(
                    f"shapes {[tuple(s) for s in shapes]} do not broadcast: size {out[j]} against "
                    f"{size} at dimension {j}"
                )
    return tuple(out)


def broadcast_to(t, shape):
    """`t` broadcast to `shape` through prims.broadcast_in_dim (t itself when shapes agree)."""
    from .prims import views

    shape = tuple(shape)
    t_shape = shape_of(t)
    if len(t_shape) == len(shape) and all(known_eq(a, b) for a, b in zip(t_shape, shape)):
        return t
    if len(t_shape) > len(shape):
        raise ValueError(f"cannot broadcast a tensor of shape {t_shape} to {shape}")
    offset = len(shape) - len(t_shape)
    dims = tuple(range(offset, len(shape)))
    if isinstance(t, TensorMeta):
        return views.broadcast_in_dim.meta(t, shape, dims)
    return views.broadcast_in_dim(t, shape, dims)


def broadcast(*args):
    """Broadcast every tensor argument to their common shape (numbers and None pass through)."""
    shape = broadcast_shapes(*(shape_of(a) for a in args if is_tensor_like(a)))
    return tuple(broadcast_to(a, shape) if is_tensor_like(a) else a for a in args)


def reduction_output_shape(shape, dims) -> tuple:
    """`shape` with the reduced `dims` removed."""
    dims = set(dims)
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def numel(shape) -> sympy.Expr:
    out = sympy.S.One
    for s in shape:
        out = out * as_expr(s)
    return out


def infer_size(shape, numel_) -> tuple:
    """Resolve one -1 in a reshape target shape from the number of elements."""
    shape = [as_expr(s) for s in shape]
    holes = [i for i, s in enumerate(shape) if s == -1]
    if len(holes) > 1:
        raise ValueError(f"only one dimension can be inferred in {tuple(shape)}")
    if holes:
        rest = numel(s for s in shape if s != -1)
        shape[holes[0]] = sympy.simplify(as_expr(numel_) / rest)
    return tuple(shape)


# --- strides -----------------------------------------------------------------------------------


def strides_of(x) -> tuple:
    if isinstance(x, TensorMeta):
        return x.strides
    return tuple(as_expr(s) for s in x.stride())


def make_contiguous_strides_for(shape) -> tuple:
    """Row-major strides (torch's: a size-0 dimension counts as 1)."""
    static = [_static(s) for s in shape]
    if None in static:
        return contiguous_strides(shape)
    strides, running = [], 1
    for size in reversed(static):
        strides.append(sympy.Integer(running))
        running *= max(size, 1)
    return tuple(reversed(strides))


def make_channels_last_strides_for(shape) -> tuple:
    """Channels-last strides for a 4-D (NHWC) or 5-D (NDHWC) shape."""
    shape = [as_expr(s) for s in shape]
    if len(shape) not in (4, 5):
        raise ValueError(f"channels-last needs 4 or 5 dimensions, got {len(shape)}")
    order = [1] + list(range(len(shape) - 1, 1, -1)) + [0]  # fastest first: C, W, H, (D), N
    strides = [sympy.S.Zero] * len(shape)
    running = sympy.S.One
    for d in order:
        strides[d] = running
        running = running * sympy.Max(shape[d], 1)
    return tuple(strides)


def strides_from_perm(shape, perm) -> tuple:
    """Dense strides where perm lists dimensions from fastest to slowest."""
    strides = [sympy.S.Zero] * len(shape)
    running = sympy.S.One
    for d in perm:
        strides[d] = running
        running = running * as_expr(shape[d])
    return tuple(strides)


def is_contiguous(shape, strides) -> bool:
    """torch's is_contiguous: row-major strides, ignoring dimensions of size 1 (or any size 0)."""
    if any(known_eq(s, 0) for s in shape):
        return True
    expected = sympy.S.One
    for size, stride in zip(reversed(shape), reversed(strides)):
        if known_eq(size, 1):
            continue
        if not known_eq(stride, expected):
            return False
        expected = expected * size
    return True


def is_channels_last_contiguous(shape, strides) -> bool:
    """torch's is_contiguous(memory_format=channels_last) for a 4-D shape."""
    if len(shape) != 4:
        return False
    expected = sympy.S.One
    for d in (1, 3, 2, 0):
        if known_eq(shape[d], 1):
            continue
        if not known_eq(strides[d], expected):
            return False
        expected = expected * shape[d]
    return True


def is_non_overlapping_and_dense(shape, strides) -> bool:
    """torch's is_non_overlapping_and_dense: some permutation of the dims is contiguous."""
    ints = [_static(x) for x in (*shape, *strides)]
    if None not in ints:  # static: the same rule on ints (sympy's Lt per dim cost ~0.5 ms a call)
        return _non_overlapping_and_dense_ints(ints[: len(shape)], ints[len(shape):])
    if len(shape) == 1:
        return known(sympy.Lt(shape[0], 2)) or known_eq(strides[0], 1)
    dims = [d for d in range(len(shape)) if not known(sympy.Lt(shape[d], 2))]
    dims.sort(key=lambda d: sort_key(strides[d]))
    expected = sympy.S.One
    for d in dims:
        if not known_eq(strides[d], expected):
            return False
        expected = expected * shape[d]
    return True


def _non_overlapping_and_dense_ints(shape, strides) -> bool:
    if len(shape) == 1:
        return shape[0] < 2 or strides[0] == 1
    expected = 1
    for d in sorted((d for d in range(len(shape)) if shape[d] >= 2), key=lambda d: strides[d]):
        if strides[d] != expected:
            return False
        expected *= shape[d]
    return True


def sort_key(expr) -> int:
    """An int that orders strides (or sizes) as their values order, symbolic ones included."""
    # Static strides sort numerically; symbolic ones by their value with every symbol at 2 + a
    # large offset, which orders products of sizes the way they order for all sizes >= 2.
    expr = as_expr(expr)
    if expr.is_Integer:
        return int(expr)
    return int(expr.xreplace({s: 4099 for s in expr.free_symbols}))


def suggest_memory_format(shape, strides) -> torch.memory_format:
    """torch's suggest_memory_format: channels-last when the strides are channels-last-like."""
    if len(shape) == 4 and _is_channels_last_strides(shape, strides, (1, 3, 2, 0)):
        return torch.channels_last
    if len(shape) == 5 and _is_channels_last_strides(shape, strides, (1, 4, 3, 2, 0)):
        return torch.channels_last_3d
    return torch.contiguous_format


def _is_channels_last_strides(shape, strides, order) -> bool:
    # Strides must not decrease along C, W, H, (D), N; ambiguous layouts (N and C of equal stride,
    # a zero C stride) count as contiguous, as in torch.
    if known_eq(strides[1], 0):
        return False
    min_stride = sympy.S.Zero
    for d in order:
        if known_eq(shape[d], 0):
            return False
        if known_lt(strides[d], min_stride):
            return False
        if d == 0 and known_eq(min_stride, strides[1]):
            return False
        min_stride = strides[d]
        if known(sympy.Gt(shape[d], 1)):
            min_stride = min_stride * shape[d]
    return True


def preserve_format_strides(shape, strides) -> tuple:
    """Strides torch gives `empty_like(x, memory_format=torch.preserve_format)` (and clone)."""
    if is_non_overlapping_and_dense(shape, strides):
        return tuple(as_expr(s) for s in strides)
    return elementwise_output_strides(TensorMeta(torch.float32, shape, strides))


def memory_format_strides(shape, memory_format: torch.memory_format) -> tuple:
    """Dense strides of `shape` in a torch memory format."""
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        return make_channels_last_strides_for(shape)
    return make_contiguous_strides_for(shape)


def elementwise_output_strides(*operands) -> tuple:
    """Output strides of a torch elementwise op on same-shape operands (numbers ignored).

    This is TensorIterator's rule: contiguous, channels-last and "same dense strides" fast paths
    when every operand is a tensor of the output shape, else a stable sort of the dimensions by
    the operands' strides (first operand with an opinion wins; broadcast strides abstain).
    """
    tensors = [x for x in operands if is_tensor_like(x)]
    if not tensors:
        raise ValueError("elementwise_output_strides needs a tensor operand")
    shape = shape_of(tensors[0])
    ndim = len(shape)
    if ndim == 0:
        return ()
    fast = _fast_setup_strides(shape, [strides_of(t) for t in tensors])
    if fast is not None and len(tensors) == len([x for x in operands if x is not None]):
        return fast
    perm = _elementwise_perm(shape, [strides_of(t) for t in tensors])
    if perm == list(range(ndim - 1, -1, -1)):
        return make_contiguous_strides_for(shape)
    return _perm_strides(shape, perm)


def _perm_strides(shape, perm):
    # Unlike make_contiguous_strides_for, torch's permuted allocation does not clamp sizes at 1.
    strides = [sympy.S.Zero] * len(shape)
    running = sympy.S.One
    for d in perm:
        strides[d] = running
        running = running * as_expr(shape[d])
    return tuple(strides)


def _fast_setup_strides(shape, all_strides):
    if all(is_contiguous(shape, s) for s in all_strides):
        return make_contiguous_strides_for(shape)
    if all(is_channels_last_contiguous(shape, s) for s in all_strides):
        return make_channels_last_strides_for(shape)
    if all(is_non_overlapping_and_dense(shape, s) for s in all_strides):
        first = all_strides[-1]
        if all(all(known_eq(a, b) for a, b in zip(first, s)) for s in all_strides):
            return tuple(first)
    return None


def _elementwise_perm(shape, all_strides) -> list[int]:
    ndim = len(shape)

    def should_swap(d0, d1) -> int:
        for strides in all_strides:
            s0, s1 = strides[d0], strides[d1]
            if known_eq(s0, 0) or known_eq(s1, 0):
                continue
            c = _soft_compare(s0, s1)
            if c != 0:
                return c
            if _soft_compare(shape[d0], shape[d1]) > 0:
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))  # fastest-moving first
    for i in range(1, ndim):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    return perm


def _soft_compare(a, b) -> int:
    # Undecidable symbolic comparisons abstain (0) rather than guess.
    try:
        return compare(a, b)
    except ValueError:
        return 0


def compute_view_strides(old_shape, old_strides, new_shape) -> Optional[tuple]:
    """Strides of `old.view(new_shape)`, or None when the view is impossible (torch's rule)."""
    old_shape = [as_expr(s) for s in old_shape]
    old_strides = [as_expr(s) for s in old_strides]
    new_shape = [as_expr(s) for s in new_shape]
    if any(known_eq(s, 0) for s in old_shape):
        if len(old_shape) == len(new_shape) and all(map(known_eq, old_shape, new_shape)):
            return tuple(old_strides)
        return make_contiguous_strides_for(new_shape)
    if not old_shape:
        return tuple(sympy.S.One for _ in new_shape)
    new_strides = [sympy.S.Zero] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_strides[-1]
    tensor_numel = view_numel = sympy.S.One
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel = tensor_numel * old_shape[d]
        boundary = d == 0 or (
            not known_eq(old_shape[d - 1], 1)
            and not known_eq(old_strides[d - 1], tensor_numel * chunk_base)
        )
        if not boundary:
            continue
        while view_d >= 0 and (
            known_lt(view_numel, tensor_numel) or known_eq(new_shape[view_d], 1)
        ):
            new_strides[view_d] = view_numel * chunk_base
            view_numel = view_numel * new_shape[view_d]
            view_d -= 1
        if not known_eq(view_numel, tensor_numel):
            return None
        if d > 0:
            chunk_base = old_strides[d - 1]
            tensor_numel = view_numel = sympy.S.One
    if view_d != -1:
        return None
    return tuple(sympy.expand(s) for s in new_strides)


def check(cond: bool, message) -> None:
    """Raise a ValueError with `message` (a string or a callable returning one) unless cond."""
    if not cond:
        raise ValueError(message() if callable(message) else message)


def check_same_shape(*args, name: str = "op") -> None:
    tensors = [a for a in args if is_tensor_like(a)]
    if not tensors:
        return
    first = shape_of(tensors[0])
    for t in tensors[1:]:
        s = shape_of(t)
        check(
            len(s) == len(first) and all(map(known_eq, s, first)),
            lambda: f"{name}: operands must have equal shapes, got {first} and {s}",
        )


def check_same_dtype(*args, name: str = "op") -> None:
    tensors = [a for a in args if is_tensor_like(a)]
    if not tensors:
        return
    for t in tensors[1:]:
        check(
            t.dtype == tensors[0].dtype,
            lambda: (
                f"{name}: operands must have equal dtypes, got {tensors[0].dtype} and {t.dtype}"
            ),
        )


def device_of(*args) -> str:
    """The device of the tensor operands (all must agree)."""
    devices = {str(a.device) for a in args if is_tensor_like(a)}
    if len(devices) > 1:
        raise ValueError(f"operands are on different devices: {sorted(devices)}")
    return devices.pop() if devices else "cpu"


__all__ = [
    "ELEMENTWISE_TYPE_PROMOTION_KIND", "broadcast", "broadcast_shapes", "broadcast_to",
    "canonicalize_dim", "canonicalize_dims", "check", "check_same_dtype", "check_same_shape",
    "compare", "complex_dtype", "compute_view_strides", "device_of", "dtype_of_number",
    "elementwise_dtypes", "elementwise_output_strides", "infer_size", "is_boolean_dtype",
    "is_channels_last_contiguous", "is_complex_dtype", "is_contiguous", "is_float_dtype",
    "is_integer_dtype", "is_non_overlapping_and_dense", "is_number", "is_tensor_like", "known",
    "known_eq", "known_le", "known_lt", "known_ne", "make_channels_last_strides_for",
    "make_contiguous_strides_for", "memory_format_strides", "numel", "opmath_dtype",
    "preserve_format_strides", "real_dtype", "reduction_output_shape", "result_type", "shape_of",
    "strides_from_perm", "strides_of", "suggest_memory_format",
]  # fmt: skip
