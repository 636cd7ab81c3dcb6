"""Elementwise ATen ops: arithmetic, comparison, math functions, with torch's type promotion."""

from __future__ import annotations

import math

import torch

from ember.primtorch import prims

from ._common import (
    ALWAYS_BOOL,
    BOOL_TO_LONG,
    COMPLEX_TO_FLOAT,
    DEFAULT,
    INT_TO_FLOAT,
    NO_OPMATH,
    aten,
    c,
    convert,
    broadcast_shape,
    device_of,
    dtype_of,
    elementwise,
    elementwise_dtypes,
    full,
    is_float,
    is_integral,
    is_tensor,
    like,
    operand,
    promote_operands,
)
from ._registry import register_decomposition


def _prim(name):
    """Look a prim up when called, so modules import before every prim is registered."""
    return lambda *args: getattr(prims, name)(*args)


# --- unary ops -----------------------------------------------------------------------------------

_INT_TO_FLOAT_UNARY = {
    "acos": "acos", "acosh": "acosh", "asin": "asin", "asinh": "asinh", "atan": "atan",
    "atanh": "atanh", "cos": "cos", "cosh": "cosh", "sin": "sin", "sinh": "sinh", "tan": "tan",
    "tanh": "tanh", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log",
    "log1p": "log1p", "log2": "log2", "log10": "log10", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "erf": "erf", "erfc": "erfc", "erfinv": "erfinv", "lgamma": "lgamma", "digamma": "digamma",
    "reciprocal": "reciprocal", "i0": "i0", "special_i0e": "i0e", "special_i1": "i1",
    "special_i1e": "i1e", "sigmoid": "sigmoid", "special_modified_bessel_i0": "i0",
    "special_modified_bessel_i1": "i1", "special_bessel_j0": "bessel_j0",
    "special_bessel_j1": "bessel_j1", "special_erfcx": "erfcx", "special_ndtri": "ndtri",
}  # fmt: skip


def _unary(prim_name, kind):
    prim = _prim(prim_name)

    def decomp(self):
        return elementwise(prim, self, kind=kind)

    decomp.__name__ = prim_name
    return decomp


def _register_unary():
    for aten_name, prim_name in _INT_TO_FLOAT_UNARY.items():
        register_decomposition(getattr(aten, aten_name))(_unary(prim_name, INT_TO_FLOAT))
    for name in ("neg", "bitwise_not"):
        register_decomposition(getattr(aten, name))(_unary(name, DEFAULT))


_register_unary()


@register_decomposition(aten.special_spherical_bessel_j0.default)
def special_spherical_bessel_j0(x):
    return elementwise(_prim("spherical_bessel_j0"), x, kind=INT_TO_FLOAT)


@register_decomposition(aten.abs)
def abs(self):
    if self.dtype is torch.bool:
        return prims.clone(self)
    return elementwise(_prim("abs"), self, kind=COMPLEX_TO_FLOAT)


@register_decomposition(aten.sign, aten.sgn)
def sign(self):
    if self.dtype is torch.bool:
        return prims.clone(self)
    return elementwise(_prim("sign"), self, kind=DEFAULT)


def _rounding(prim_name):
    prim = _prim(prim_name)

    def decomp(self):
        # Integers are already whole: torch returns a copy.
        if is_integral(self.dtype):
            return prims.clone(self)
        return elementwise(prim, self, kind=DEFAULT)

    return decomp


for _name in ("ceil", "floor", "trunc"):
    register_decomposition(getattr(aten, _name))(_rounding(_name))
register_decomposition(aten.fix)(_rounding("trunc"))


@register_decomposition(aten.round)
def round(self, *, decimals=0):
    if is_integral(self.dtype):
        return prims.clone(self)
    if decimals == 0:
        return elementwise(_prim("round"), self, kind=DEFAULT)
    # torch scales by 10**decimals (or divides by 10**-decimals) in the op's own precision.
    (x,), dtype = promote_operands(self, kind=DEFAULT)
    ten = c(10.0 ** builtins_abs(decimals), x)
    if decimals > 0:
        out = prims.div(prims.round(prims.mul(x, ten)), ten)
    else:
        out = prims.mul(prims.round(prims.div(x, ten)), ten)
    return convert(out, dtype)


def builtins_abs(x):
    return x if x >= 0 else -x


@register_decomposition(aten.signbit)
def signbit(self):
    if is_integral(self.dtype):
        return aten.lt(self, 0)
    return elementwise(_prim("signbit"), self, kind=ALWAYS_BOOL, compute=self.dtype)


@register_decomposition(aten.positive, aten.resolve_conj, aten.resolve_neg)
def positive(self):
    return self  # torch returns self itself (an alias) for these on real tensors


@register_decomposition(aten.conj_physical)
def conj_physical(self):
    return prims.clone(self)


@register_decomposition(aten.logit)
def logit(self, eps=None):
    (x,), dtype = promote_operands(self, kind=INT_TO_FLOAT)
    if eps is not None:
        x = prims.minimum(prims.maximum(x, c(eps, x)), c(1.0 - eps, x))
        # clamp must keep NaN: maximum/minimum propagate it.
    out = prims.log(prims.div(x, prims.sub(c(1.0, x), x)))
    return convert(out, dtype)


@register_decomposition(aten.deg2rad)
def deg2rad(self):
    return elementwise(prims_mul_const(math.pi / 180), self, kind=INT_TO_FLOAT)


@register_decomposition(aten.rad2deg)
def rad2deg(self):
    return elementwise(prims_mul_const(180 / math.pi), self, kind=INT_TO_FLOAT)


def prims_mul_const(k):
    return lambda x: prims.mul(x, c(k, x))


@register_decomposition(aten.frac)
def frac(self):
    return elementwise(_prim("frac"), self, kind=DEFAULT)


@register_decomposition(aten.sinc)
def sinc(self):
    (x,), dtype = promote_operands(self, kind=INT_TO_FLOAT)
    pix = prims.mul(x, c(math.pi, x))
    out = prims.where(prims.eq(x, c(0.0, x)), c(1.0, x), prims.div(prims.sin(pix), pix))
    return convert(out, dtype)


@register_decomposition(aten.isnan)
def isnan(self):
    if not is_float(self.dtype):
        return like(False, self, torch.bool)
    return prims.ne(self, self)


@register_decomposition(aten.isinf)
def isinf(self):
    if not is_float(self.dtype):
        return like(False, self, torch.bool)
    return prims.eq(prims.abs(self), c(math.inf, self))


@register_decomposition(aten.isposinf)
def isposinf(self):
    if not is_float(self.dtype):
        return like(False, self, torch.bool)
    return prims.eq(self, c(math.inf, self))


@register_decomposition(aten.isneginf)
def isneginf(self):
    if not is_float(self.dtype):
        return like(False, self, torch.bool)
    return prims.eq(self, c(-math.inf, self))


@register_decomposition(aten.isfinite)
def isfinite(self):
    if not is_float(self.dtype):
        return like(True, self, torch.bool)
    not_nan = prims.eq(self, self)
    return prims.bitwise_and(not_nan, prims.ne(prims.abs(self), c(math.inf, self)))


@register_decomposition(aten.nan_to_num)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if not is_float(self.dtype):
        return prims.clone(self)
    info = torch.finfo(self.dtype)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    out = prims.where(prims.ne(self, self), c(nan, self), self)
    out = prims.where(prims.eq(self, c(math.inf, self)), c(posinf, self), out)
    return prims.where(prims.eq(self, c(-math.inf, self)), c(neginf, self), out)


# --- binary arithmetic ---------------------------------------------------------------------------


def _scaled(x, alpha):
    return x if alpha is None or alpha == 1 else aten.mul(x, alpha)


@register_decomposition(aten.add)
def add(self, other, alpha=1):
    if alpha != 1:
        # alpha scales `other` in the promoted dtype (an int tensor with float alpha is an error
        # in torch; promotion to the result dtype first keeps float16 math in float32).
        (a, b), dtype = promote_operands(self, other, kind=DEFAULT)
        b = prims.mul(b, c(alpha, b))
        return convert(prims.add(a, b), dtype)
    return elementwise(_prim("add"), self, other, kind=DEFAULT)


@register_decomposition(aten.sub)
def sub(self, other, alpha=1):
    (a, b), dtype = promote_operands(self, other, kind=DEFAULT)
    if alpha != 1:
        b = prims.mul(b, c(alpha, b))
    return convert(prims.sub(a, b), dtype)


@register_decomposition(aten.rsub)
def rsub(self, other, alpha=1):
    return (
        aten.sub(other, self, alpha=alpha) if is_tensor(other) else _rsub_scalar(self, other, alpha)
    )


def _rsub_scalar(self, other, alpha):
    (a, b), dtype = promote_operands(self, other, kind=DEFAULT)
    if alpha != 1:
        a = prims.mul(a, c(alpha, a))
    return convert(prims.sub(b, a), dtype)


@register_decomposition(aten.mul)
def mul(self, other):
    if dtype_of(self) is torch.bool and dtype_of(other) is torch.bool:
        return elementwise(_prim("bitwise_and"), self, other, kind=DEFAULT)
    return elementwise(_prim("mul"), self, other, kind=DEFAULT)


@register_decomposition(aten.div)
def div(self, other, *, rounding_mode=None):
    if rounding_mode is None:
        return elementwise(_prim("div"), self, other, kind=INT_TO_FLOAT)
    (a, b), dtype = promote_operands(self, other, kind=DEFAULT)
    if rounding_mode == "trunc":
        out = prims.trunc(prims.div(a, b)) if is_float(a.dtype) else prims.trunc_div(a, b)
    elif rounding_mode == "floor":
        out = prims.floor_div(a, b)
    else:
        raise ValueError(f"div: unknown rounding_mode {rounding_mode!r}")
    return convert(out, dtype)


@register_decomposition(aten.true_divide)
def true_divide(self, other):
    return aten.div(self, other)


@register_decomposition(aten.floor_divide)
def floor_divide(self, other):
    return aten.div(self, other, rounding_mode="floor")


@register_decomposition(aten.remainder)
def remainder(self, other):
    return elementwise(_prim("remainder"), self, other, kind=DEFAULT)


@register_decomposition(aten.fmod)
def fmod(self, other):
    return elementwise(_prim("fmod"), self, other, kind=DEFAULT)


# Exponents torch computes without pow (its pow kernels special-case them): products, roots and
# reciprocals are exact where pow is not, and far cheaper (GPT-2's GELU cubes every activation).
_INTEGRAL_POWERS = (2, 3)
_FLOAT_POWERS = {0.5: "sqrt", -0.5: "rsqrt", -1: "reciprocal"}


@register_decomposition(aten.pow)
def pow(self, exponent):
    if is_tensor(self) and not is_tensor(exponent) and not isinstance(exponent, complex) and (
            not self.dtype.is_complex):  # fmt: skip
        if exponent in _INTEGRAL_POWERS:
            # x*x (x*x*x) is what torch computes, and it stays exact for integers.
            compute, dtype = elementwise_dtypes(self, exponent, kind=BOOL_TO_LONG)
            a = convert(self, compute)
            out = prims.mul(a, a)
            if exponent == 3:
                out = prims.mul(out, a)
            return convert(out, dtype)
        if exponent in _FLOAT_POWERS and self.dtype.is_floating_point:
            compute, dtype = elementwise_dtypes(self, exponent, kind=BOOL_TO_LONG)
            out = getattr(prims, _FLOAT_POWERS[exponent])(convert(self, compute))
            return convert(out, dtype)
    return elementwise(_prim("pow"), self, exponent, kind=BOOL_TO_LONG)


@register_decomposition(aten.float_power)
def float_power(self, exponent):
    dtype = torch.float64
    a = convert(self, dtype) if is_tensor(self) else float(self)
    b = convert(exponent, dtype) if is_tensor(exponent) else float(exponent)
    return aten.pow(a, b)


def _binary(prim_name, kind):
    prim = _prim(prim_name)

    def decomp(self, other):
        return elementwise(prim, self, other, kind=kind)

    decomp.__name__ = prim_name
    return decomp


_BINARY = {
    "atan2": ("atan2", INT_TO_FLOAT), "hypot": ("hypot", DEFAULT),
    "maximum": ("maximum", DEFAULT), "minimum": ("minimum", DEFAULT),
    "fmax": ("fmax", DEFAULT), "fmin": ("fmin", DEFAULT),
    "nextafter": ("nextafter", NO_OPMATH), "igamma": ("igamma", INT_TO_FLOAT),
    "igammac": ("igammac", INT_TO_FLOAT), "special_zeta": ("zeta", INT_TO_FLOAT),
    "bitwise_and": ("bitwise_and", DEFAULT), "bitwise_or": ("bitwise_or", DEFAULT),
    "bitwise_xor": ("bitwise_xor", DEFAULT), "gcd": ("gcd", DEFAULT), "lcm": ("lcm", DEFAULT),
    "copysign": ("copysign", INT_TO_FLOAT),
    "bitwise_left_shift": ("shift_left", DEFAULT), "__lshift__": ("shift_left", DEFAULT),
    "bitwise_right_shift": ("shift_right_arithmetic", DEFAULT),
    "__rshift__": ("shift_right_arithmetic", DEFAULT),
    "eq": ("eq", ALWAYS_BOOL), "ne": ("ne", ALWAYS_BOOL), "lt": ("lt", ALWAYS_BOOL),
    "le": ("le", ALWAYS_BOOL), "gt": ("gt", ALWAYS_BOOL), "ge": ("ge", ALWAYS_BOOL),
}  # fmt: skip

for _aten_name, (_prim_name, _kind) in _BINARY.items():
    register_decomposition(getattr(aten, _aten_name))(_binary(_prim_name, _kind))


@register_decomposition(aten.heaviside)
def heaviside(self, values):
    (a, v), dtype = promote_operands(self, values, kind=DEFAULT)
    zero = c(0, a)
    step = convert(prims.gt(a, zero), a.dtype)
    return convert(prims.where(prims.eq(a, zero), v, step), dtype)


def _logical(prim_name):
    prim = _prim(prim_name)

    def decomp(self, other):
        return prim(*promote_operands(self, other, kind=NO_OPMATH)[0])

    return decomp


def _to_bool(x):
    if not is_tensor(x):
        return bool(x)
    if x.dtype is torch.bool:
        return x
    return prims.ne(x, c(0, x))


register_decomposition(aten.logical_and)(_logical("logical_and"))
register_decomposition(aten.logical_or)(_logical("logical_or"))
register_decomposition(aten.logical_xor)(_logical("logical_xor"))


@register_decomposition(aten.logical_not)
def logical_not(self):
    return prims.logical_not(self)


@register_decomposition(aten.logaddexp)
def logaddexp(self, other):
    (a, b), dtype = promote_operands(self, other, kind=DEFAULT)
    m = prims.maximum(a, b)
    # exp(-|a-b|) is NaN when both are the same infinity; the answer is then that infinity.
    both_inf = prims.bitwise_and(prims.eq(a, b), prims.eq(prims.abs(a), c(math.inf, a)))
    out = prims.add(m, prims.log1p(prims.exp(prims.neg(prims.abs(prims.sub(a, b))))))
    return convert(prims.where(both_inf, a, out), dtype)


@register_decomposition(aten.logaddexp2)
def logaddexp2(self, other):
    (a, b), dtype = promote_operands(self, other, kind=DEFAULT)
    m = prims.maximum(a, b)
    both_inf = prims.bitwise_and(prims.eq(a, b), prims.eq(prims.abs(a), c(math.inf, a)))
    diff = prims.exp2(prims.neg(prims.abs(prims.sub(a, b))))
    out = prims.add(m, prims.div(prims.log1p(diff), c(math.log(2.0), a)))
    return convert(prims.where(both_inf, a, out), dtype)


def _xlog(log_prim_name):
    def decomp(self, other):
        (x, y), dtype = promote_operands(self, other, kind=INT_TO_FLOAT)
        out = prims.mul(x, getattr(prims, log_prim_name)(y))
        out = prims.where(prims.eq(x, c(0.0, x)), c(0.0, x), out)
        return convert(prims.where(prims.ne(y, y), y, out), dtype)

    return decomp


register_decomposition(aten.xlogy)(_xlog("log"))
register_decomposition(aten.special_xlog1py)(_xlog("log1p"))


@register_decomposition(aten.special_entr)
def special_entr(self):
    (x,), dtype = promote_operands(self, kind=INT_TO_FLOAT)
    zero = c(0.0, x)
    out = prims.where(prims.gt(x, zero), prims.neg(prims.mul(x, prims.log(x))), c(-math.inf, x))
    out = prims.where(prims.eq(x, zero), zero, out)
    return convert(prims.where(prims.ne(x, x), x, out), dtype)


@register_decomposition(aten.special_log_ndtr)
def special_log_ndtr(self):
    (x,), dtype = promote_operands(self, kind=INT_TO_FLOAT)
    # log(ndtr(x)): for x < -1 use erfcx to avoid underflow (torch's formulation).
    t = prims.mul(x, c(1 / math.sqrt(2), x))
    small = prims.sub(prims.log(prims.mul(prims.erfcx(prims.neg(t)), c(0.5, x))), prims.mul(t, t))
    large = prims.log1p(prims.neg(prims.mul(prims.erfc(t), c(0.5, x))))
    return convert(prims.where(prims.lt(x, c(-1.0, x)), small, large), dtype)


@register_decomposition(aten.special_ndtr)
def special_ndtr(self):
    (x,), dtype = promote_operands(self, kind=INT_TO_FLOAT)
    t = prims.mul(x, c(1 / math.sqrt(2), x))
    return convert(prims.mul(prims.add(c(1.0, x), prims.erf(t)), c(0.5, x)), dtype)


@register_decomposition(aten.polygamma)
def polygamma(n, self):
    if n == 0:
        return aten.digamma(self)
    (x,), dtype = promote_operands(self, kind=INT_TO_FLOAT)
    out = prims.polygamma(x, n)
    return convert(out, dtype)


@register_decomposition(aten.mvlgamma)
def mvlgamma(self, p):
    (x,), dtype = promote_operands(self, kind=INT_TO_FLOAT)
    out = c(p * (p - 1) / 4 * math.log(math.pi), x)
    for i in range(p):
        out = prims.add(out, prims.lgamma(prims.sub(x, c(i / 2, x))))
    return convert(out, dtype)


# --- ternary and clamping ------------------------------------------------------------------------


@register_decomposition(aten.where)
def where(condition, self, other):
    _, dtype = elementwise_dtypes(self, other, kind=NO_OPMATH)
    cond = _to_bool(condition)
    out_shape = broadcast_shape(cond, self, other)
    device = device_of(cond, self, other)
    cond = operand(cond, out_shape, torch.bool, device)
    a, b = (operand(t, out_shape, dtype, device) for t in (self, other))
    if not is_tensor(a) and not is_tensor(b):
        a = full(out_shape, a, dtype, device)
    return prims.where(cond, a, b)


@register_decomposition(aten.clamp)
def clamp(self, min=None, max=None):
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    args = [self] + [v for v in (min, max) if v is not None]
    ops, dtype = promote_operands(*args, kind=NO_OPMATH)
    out, rest = ops[0], ops[1:]
    if min is not None:
        out = _clamp_min(out, rest.pop(0))
    if max is not None:
        out = _clamp_max(out, rest.pop(0))
    return convert(out, dtype)


def _clamp_min(x, lo):
    # NaN in x stays NaN; a NaN bound makes the result NaN (torch propagates both).
    return prims.where(prims.lt(x, lo), lo, x) if not is_float(x.dtype) else _nan_clamp(x, lo, "lt")


def _clamp_max(x, hi):
    return prims.where(prims.gt(x, hi), hi, x) if not is_float(x.dtype) else _nan_clamp(x, hi, "gt")


def _nan_clamp(x, bound, cmp):
    out = prims.where(getattr(prims, cmp)(x, bound), bound, x)
    if not is_tensor(bound):
        return like(bound, x) if math.isnan(bound) else out
    return prims.where(prims.ne(bound, bound), bound, out)


@register_decomposition(aten.clamp_min)
def clamp_min(self, min):
    return aten.clamp(self, min=min)


@register_decomposition(aten.clamp_max)
def clamp_max(self, max):
    return aten.clamp(self, max=max)


@register_decomposition(aten.lerp)
def lerp(self, end, weight):
    if not is_tensor(weight):
        (a, b), dtype = promote_operands(self, end, kind=DEFAULT)
        diff = prims.sub(b, a)
        # torch picks the formula by |w| < 0.5 for accuracy near both ends.
        if builtins_abs(weight) < 0.5:
            out = prims.add(a, prims.mul(diff, c(weight, diff)))
        else:
            out = prims.sub(b, prims.mul(diff, c(1 - weight, diff)))
        return convert(out, dtype)
    (a, b, w), dtype = promote_operands(self, end, weight, kind=DEFAULT)
    diff = prims.sub(b, a)
    half = c(0.5, w)
    low = prims.add(a, prims.mul(w, diff))
    high = prims.sub(b, prims.mul(diff, prims.sub(c(1.0, w), w)))
    # torch picks the formula by |w| < 0.5 for accuracy near both ends.
    return convert(prims.where(prims.lt(prims.abs(w), half), low, high), dtype)


@register_decomposition(aten.addcmul)
def addcmul(self, tensor1, tensor2, *, value=1):
    (a, t1, t2), dtype = promote_operands(self, tensor1, tensor2, kind=DEFAULT)
    prod = prims.mul(t1, t2)
    if value != 1:
        prod = prims.mul(prod, c(value, prod))
    return convert(prims.add(a, prod), dtype)


@register_decomposition(aten.addcdiv)
def addcdiv(self, tensor1, tensor2, *, value=1):
    (a, t1, t2), dtype = promote_operands(self, tensor1, tensor2, kind=DEFAULT)
    quot = prims.div(t1, t2)
    if value != 1:
        quot = prims.mul(quot, c(value, quot))
    return convert(prims.add(a, quot), dtype)
