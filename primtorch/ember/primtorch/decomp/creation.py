"""Factory ops: full/zeros/ones/empty (and their _like and new_ forms), arange, linspace, eye."""

from __future__ import annotations

import math

import torch

from ember.primtorch import prims, utils

from . import _random
from ._common import aten, convert, is_tensor
from ._registry import register_decomposition


def _device(device, like=None):
    if device is not None:
        return torch.device(device)
    return like.device if like is not None else torch.device("cpu")


def _check_layout(layout):
    if layout not in (None, torch.strided):
        raise NotImplementedError(f"layout {layout} is not supported by Ember (strided only)")


def _fill_dtype(value) -> torch.dtype:
    if is_tensor(value):
        return value.dtype
    return utils.dtype_of_number(value)


def _fill_value(value, dtype):
    if dtype is torch.bool:
        return bool(value)
    if not (dtype.is_floating_point or dtype.is_complex):
        return int(value)
    return value


def _full(size, value, dtype, device):
    return prims.full(tuple(size), _fill_value(value, dtype), dtype, device)


@register_decomposition(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    return _full(size, fill_value, dtype or _fill_dtype(fill_value), _device(device))


@register_decomposition(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    return _full(size, 0, dtype or torch.get_default_dtype(), _device(device))


@register_decomposition(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    return _full(size, 1, dtype or torch.get_default_dtype(), _device(device))


@register_decomposition(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_layout(layout)
    fmt = (
        memory_format
        if memory_format not in (None, torch.preserve_format)
        else torch.contiguous_format
    )
    strides = utils.memory_format_strides(utils.shape_of(tuple(size)), fmt)
    return prims.empty_strided(
        tuple(size), _plain(strides), dtype or torch.get_default_dtype(), _device(device)
    )


def _plain(exprs):
    return tuple(int(e) if e.is_Integer else e for e in exprs)


@register_decomposition(aten.empty_strided)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    return prims.empty_strided(
        tuple(size), tuple(stride), dtype or torch.get_default_dtype(), _device(device)
    )


@register_decomposition(aten.empty_permuted)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    return prims.empty_permuted(
        tuple(size), tuple(physical_layout), dtype or torch.get_default_dtype(), _device(device)
    )


@register_decomposition(aten.scalar_tensor)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    dtype = dtype or torch.get_default_dtype()
    return prims.scalar_tensor(_fill_value(s, dtype), dtype, _device(device))


def _like_layout(out, self, memory_format):
    """`out` (contiguous) in the layout torch's *_like gives for `self` and memory_format."""
    if memory_format in (None, torch.preserve_format):
        strides = utils.preserve_format_strides(utils.shape_of(self), utils.strides_of(self))
    else:
        strides = utils.memory_format_strides(utils.shape_of(self), memory_format)
    if utils.is_contiguous(utils.shape_of(self), strides):
        return out
    return prims.copy_strided(out, _plain(strides))


def _like(self, value, dtype, layout, device, memory_format):
    _check_layout(layout)
    dtype = dtype or self.dtype
    out = _full(self.shape, value, dtype, _device(device, self))
    return _like_layout(out, self, memory_format)


@register_decomposition(aten.full_like)
def full_like(
    self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    return _like(self, fill_value, dtype, layout, device, memory_format)


@register_decomposition(aten.zeros_like)
def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _like(self, 0, dtype, layout, device, memory_format)


@register_decomposition(aten.ones_like)
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _like(self, 1, dtype, layout, device, memory_format)


@register_decomposition(aten.empty_like)
def empty_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_layout(layout)
    if memory_format in (None, torch.preserve_format):
        strides = utils.preserve_format_strides(utils.shape_of(self), utils.strides_of(self))
    else:
        strides = utils.memory_format_strides(utils.shape_of(self), memory_format)
    return prims.empty_strided(
        tuple(self.shape), _plain(strides), dtype or self.dtype, _device(device, self)
    )


def _new(self, size, value, dtype, layout, device):
    _check_layout(layout)
    return _full(size, value, dtype or self.dtype, _device(device, self))


@register_decomposition(aten.new_full)
def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _new(self, size, fill_value, dtype, layout, device)


@register_decomposition(aten.new_zeros)
def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _new(self, size, 0, dtype, layout, device)


@register_decomposition(aten.new_ones)
def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _new(self, size, 1, dtype, layout, device)


@register_decomposition(aten.new_empty)
def new_empty(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return aten.empty(size, dtype=dtype or self.dtype, device=device or self.device)


@register_decomposition(aten.new_empty_strided)
def new_empty_strided(self, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return prims.empty_strided(
        tuple(size), tuple(stride), dtype or self.dtype, _device(device, self)
    )


@register_decomposition(aten.fill.Scalar, aten.fill.Tensor)
def fill(self, value):
    if is_tensor(value):
        if value.ndim != 0:
            raise ValueError("fill_ only supports 0-dimension value tensor")
        return prims.clone(utils.broadcast_to(convert(value, self.dtype), tuple(self.shape)))
    return _like(self, value, None, None, None, None)


@register_decomposition(aten.zero)
def zero(self):
    return _like(self, 0, None, None, None, None)


# --- ranges --------------------------------------------------------------------------------------


def _arange_dtype(*values):
    if builtins_any(isinstance(v, float) for v in values):
        return torch.get_default_dtype()
    return torch.int64


def builtins_any(it):
    for x in it:
        if x:
            return True
    return False


def _index(n, device):
    return prims.iota(n, 0, 1, torch.int64, device)


def _int(v):
    """int(v), truncating; a symbolic size stays symbolic (int() would specialise it)."""
    return v if isinstance(v, torch.SymInt) else int(v)


@register_decomposition(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(start, end=None, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    if end is None:
        start, end = 0, start
    dtype = dtype or _arange_dtype(start, end, step)
    device = _device(device)
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if not dtype.is_floating_point:
        # Integer outputs: torch casts start, end and step to int64 first (truncating).
        start, end, step = _int(start), _int(end), _int(step)
        num = end - start + step - (1 if step > 0 else -1)
        if step > 0:  # no abs() of a symbolic size: its range decides num >= 0
            n = max(num // step, 0) if num >= 0 else 0
        else:
            n = max(abs(num) // abs(step) * (1 if (num >= 0) == (step > 0) else -1), 0)
        return convert(prims.iota(n, start, step, torch.int64, device), dtype)
    n = max(math.ceil((float(end) - float(start)) / float(step)), 0)
    # Values are start + i * step computed in double, then rounded once (as torch's CPU kernel).
    idx = convert(_index(n, device), torch.float64)
    out = prims.add(prims.mul(idx, float(step)), float(start))
    return convert(out, dtype)


@register_decomposition(aten.linspace.default)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    dtype = dtype or torch.get_default_dtype()
    device = _device(device)
    compute = utils.opmath_dtype(dtype) if dtype.is_floating_point else torch.float64
    if steps == 0:
        return _full((0,), 0, dtype, device)
    if steps == 1:
        return _full((1,), start, dtype, device)
    # torch: the first half counts up from start, the second half down from end (symmetric error).
    if dtype.is_floating_point:
        start_c, end_c = float(start), float(end)
    else:
        start_c, end_c = float(int(start)), float(int(end))
    step = (end_c - start_c) / (steps - 1)
    idx = convert(_index(steps, device), compute)
    up = prims.add(prims.mul(idx, step), start_c)
    down = prims.sub(end_c, prims.mul(prims.sub(float(steps - 1), idx), step))
    out = prims.where(prims.lt(idx, float(steps // 2)), up, down)
    return convert(out, dtype)


@register_decomposition(
    aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor
)
def linspace_tensor(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    # Tensor endpoints: the same symmetric formula as linspace, with the endpoints as tensors.
    _check_layout(layout)
    dtype = dtype or torch.get_default_dtype()
    device = _device(device, start if is_tensor(start) else end)
    compute = utils.opmath_dtype(dtype) if dtype.is_floating_point else torch.float64
    s = _scalar_operand(start, compute, device)
    e = _scalar_operand(end, compute, device)
    if not dtype.is_floating_point:  # integer outputs start from the truncated endpoints
        s, e = prims.trunc(s), prims.trunc(e)
    if steps <= 1:
        return convert(prims.broadcast_in_dim(s, (steps,), ()), dtype)
    step = prims.div(prims.sub(e, s), float(steps - 1))
    idx = convert(_index(steps, device), compute)
    bs = lambda t: prims.broadcast_in_dim(t, (steps,), ())  # noqa: E731
    up = prims.add(prims.mul(idx, bs(step)), bs(s))
    down = prims.sub(bs(e), prims.mul(prims.sub(float(steps - 1), idx), bs(step)))
    out = prims.where(prims.lt(idx, float(steps // 2)), up, down)
    return convert(out, dtype)


def _scalar_operand(v, dtype, device):
    if is_tensor(v):
        return convert(prims.reshape(v, ()), dtype)
    return prims.full((), _fill_value(v, dtype), dtype, device)


@register_decomposition(
    aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor
)
def logspace_tensor(
    start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None
):
    return _logspace(start, end, steps, base, dtype or torch.get_default_dtype(), device)


def _logspace(start, end, steps, base, dtype, device):
    """base ** linspace(start, end), rounded where torch's kernel rounds."""
    device = _device(device, start if is_tensor(start) else end if is_tensor(end) else None)
    if steps == 1:  # torch: base ** start in double
        e = (
            convert(prims.reshape(start, (1,)), torch.float64)
            if is_tensor(start)
            else prims.full((1,), float(start), torch.float64, device)
        )
        return convert(prims.pow(prims.full((1,), float(base), torch.float64, device), e), dtype)
    if not dtype.is_floating_point:
        # Integers: start and end are cast to the dtype first, exponents are computed in double.
        start = aten.trunc(start) if is_tensor(start) else int(start)
        end = aten.trunc(end) if is_tensor(end) else int(end)
        exps = aten.linspace(start, end, steps, dtype=torch.float64, device=device)
    else:
        # Floats: start, end and step are values of the dtype; exponents are formed in opmath.
        compute = utils.opmath_dtype(dtype)
        s = convert(_scalar_operand(start, dtype, device), compute)
        e = convert(_scalar_operand(end, dtype, device), compute)
        step = convert(convert(prims.div(prims.sub(e, s), float(steps - 1)), dtype), compute)
        idx = convert(_index(steps, device), compute)
        bs = lambda t: prims.broadcast_in_dim(t, (steps,), ())  # noqa: E731
        up = prims.add(bs(s), prims.mul(idx, bs(step)))
        down = prims.sub(bs(e), prims.mul(prims.sub(float(steps - 1), idx), bs(step)))
        exps = prims.where(prims.lt(idx, float(steps // 2)), up, down)
    base_t = prims.full(tuple(exps.shape), float(base), exps.dtype, exps.device)
    return convert(prims.pow(base_t, exps), dtype)


@register_decomposition(aten.logspace.default)
def logspace(
    start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None
):
    return _logspace(start, end, steps, base, dtype or torch.get_default_dtype(), device)


def _tri_indices(row, col, offset, upper, dtype, device):
    """(2, N) coordinates of the lower (upper) triangle, row by row: a cat of per-row ranges."""
    rows, cols = [], []
    for r in range(row):
        lo, hi = (max(0, r + offset), col) if upper else (0, min(col, r + offset + 1))
        if hi > lo:
            rows.append(prims.full((hi - lo,), r, torch.int64, device))
            cols.append(prims.iota(hi - lo, lo, 1, torch.int64, device))
    if not rows:
        return prims.full((2, 0), 0, dtype, device)
    r, c = prims.cat(rows, 0), prims.cat(cols, 0)
    out = prims.cat([prims.expand_dims(r, (0,)), prims.expand_dims(c, (0,))], 0)
    return convert(out, dtype)


@register_decomposition(aten.tril_indices)
def tril_indices(
    row, col, offset=0, *, dtype=torch.int64, layout=None, device=None, pin_memory=None
):
    return _tri_indices(row, col, offset, False, dtype or torch.int64, _device(device))


@register_decomposition(aten.triu_indices)
def triu_indices(
    row, col, offset=0, *, dtype=torch.int64, layout=None, device=None, pin_memory=None
):
    return _tri_indices(row, col, offset, True, dtype or torch.int64, _device(device))


@register_decomposition(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    m = n if m is None else m
    dtype = dtype or torch.get_default_dtype()
    device = _device(device)
    rows = prims.broadcast_in_dim(_index(n, device), (n, m), (0,))
    cols = prims.broadcast_in_dim(_index(m, device), (n, m), (1,))
    return convert(prims.eq(rows, cols), dtype)


# --- random --------------------------------------------------------------------------------------


def _rand_dtype(dtype):
    return dtype or torch.get_default_dtype()


@register_decomposition(aten.rand.default, aten.rand.generator)
def rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    return _random.uniform(tuple(size), _rand_dtype(dtype), _device(device))


@register_decomposition(aten.randn.default, aten.randn.generator)
def randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    _check_layout(layout)
    return _random.normal(tuple(size), _rand_dtype(dtype), _device(device))


@register_decomposition(aten.rand_like)
def rand_like(
    self,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    memory_format=None,
):
    return _random.uniform(tuple(self.shape), dtype or self.dtype, _device(device, self))


@register_decomposition(aten.randn_like)
def randn_like(
    self,
    *,
    generator=None,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    memory_format=None,
):
    return _random.normal(tuple(self.shape), dtype or self.dtype, _device(device, self))


@register_decomposition(aten.randint.default, aten.randint.generator)
def randint(
    high, size, *, generator=None, dtype=torch.int64, layout=None, device=None, pin_memory=None
):
    return _random.randint(tuple(size), 0, high, dtype or torch.int64, _device(device))


@register_decomposition(aten.randint.low, aten.randint.low_generator)
def randint_low(
    low, high, size, *, generator=None, dtype=torch.int64, layout=None, device=None, pin_memory=None
):
    return _random.randint(tuple(size), low, high, dtype or torch.int64, _device(device))


@register_decomposition(aten.randint_like.default, aten.randint_like.low_dtype)
def randint_like(
    self,
    low_or_high,
    high=None,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    memory_format=None,
):
    low, high = (0, low_or_high) if high is None else (low_or_high, high)
    return _random.randint(tuple(self.shape), low, high, dtype or self.dtype, _device(device, self))


@register_decomposition(aten.uniform.default)
def uniform(self, from_=0.0, to=1.0, *, generator=None):
    return _random.uniform(tuple(self.shape), self.dtype, self.device, from_, to)


@register_decomposition(
    aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor
)
def normal(mean, std=1.0, *, generator=None):
    like_t = mean if is_tensor(mean) else std
    shape = (
        tuple(aten.add(mean, std).shape)
        if is_tensor(mean) and is_tensor(std)
        else tuple(like_t.shape)
    )
    z = _random.normal(shape, like_t.dtype, like_t.device)
    return aten.add(aten.mul(z, std), mean)


@register_decomposition(aten.normal.float_float)
def normal_float_float(
    mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None
):
    return _random.normal(tuple(size), _rand_dtype(dtype), _device(device), mean, std)


@register_decomposition(aten.normal_functional)
def normal_functional(self, mean=0.0, std=1.0, *, generator=None):
    return _random.normal(tuple(self.shape), self.dtype, self.device, mean, std)


@register_decomposition(aten.bernoulli.default)
def bernoulli(self, *, generator=None):
    u = _random.uniform(
        tuple(self.shape),
        torch.float32 if self.dtype != torch.float64 else torch.float64,
        self.device,
    )
    return convert(prims.lt(u, convert(self, u.dtype)), self.dtype)


@register_decomposition(aten.bernoulli.p)
def bernoulli_p(self, p=0.5, *, generator=None):
    u = _random.uniform(
        tuple(self.shape),
        torch.float64 if self.dtype is torch.float64 else torch.float32,
        self.device,
    )
    return convert(prims.lt(u, float(p)), self.dtype)


@register_decomposition(aten.bernoulli.Tensor)
def bernoulli_tensor(self, p, *, generator=None):
    u = _random.uniform(
        tuple(self.shape),
        torch.float64 if self.dtype is torch.float64 else torch.float32,
        self.device,
    )
    return convert(
        prims.lt(u, utils.broadcast_to(convert(p, u.dtype), tuple(self.shape))), self.dtype
    )


@register_decomposition(aten.exponential)
def exponential(self, lambd=1.0, *, generator=None):
    u = _random.uniform(tuple(self.shape), utils.opmath_dtype(self.dtype), self.device)
    return convert(prims.div(prims.neg(prims.log1p(prims.neg(u))), float(lambd)), self.dtype)


@register_decomposition(aten.cauchy)
def cauchy(self, median=0.0, sigma=1.0, *, generator=None):
    u = _random.uniform(tuple(self.shape), utils.opmath_dtype(self.dtype), self.device)
    out = prims.add(
        prims.mul(prims.tan(prims.mul(prims.sub(u, 0.5), math.pi)), float(sigma)), float(median)
    )
    return convert(out, self.dtype)


@register_decomposition(aten.log_normal)
def log_normal(self, mean=1.0, std=2.0, *, generator=None):
    z = _random.normal(tuple(self.shape), utils.opmath_dtype(self.dtype), self.device, mean, std)
    return convert(prims.exp(z), self.dtype)


@register_decomposition(aten.geometric)
def geometric(self, p, *, generator=None):
    u = _random.uniform(tuple(self.shape), torch.float64, self.device)
    # Number of trials to the first success: ceil(log(1 - u) / log(1 - p)).
    out = prims.ceil(prims.div(prims.log1p(prims.neg(u)), math.log1p(-p)))
    return convert(prims.maximum(out, 1.0), self.dtype)


@register_decomposition(aten.multinomial)
def multinomial(self, num_samples, replacement=False, *, generator=None):
    probs = convert(self, torch.float64 if self.dtype is torch.float64 else torch.float32)
    if not replacement:
        # Gumbel top-k: the k largest of log(p) + Gumbel noise are k draws without replacement.
        u = _random.uniform(tuple(probs.shape), probs.dtype, probs.device)
        gumbel = prims.neg(prims.log(prims.neg(prims.log1p(prims.neg(u)))))
        keys = prims.add(prims.log(probs), gumbel)
        return aten.topk(keys, num_samples, -1)[1]
    # With replacement: invert the normalised CDF at uniform points.
    cdf = aten.cumsum(probs, -1)
    total = aten.slice(cdf, -1, cdf.shape[-1] - 1, cdf.shape[-1])
    shape = tuple(probs.shape[:-1]) + (num_samples,)
    u = aten.mul(_random.uniform(shape, probs.dtype, probs.device), total)
    idx = aten.searchsorted(cdf, u, right=True)
    return aten.clamp(idx, 0, probs.shape[-1] - 1)
