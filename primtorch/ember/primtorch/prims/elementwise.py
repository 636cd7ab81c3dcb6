"""Elementwise prims: unary, binary and ternary pointwise ops and convert_element_type.

Operands have one shape and one dtype (decompositions broadcast and promote first). A Python
number may stand in for a tensor operand of a binary or ternary prim: it is a scalar of the tensor
operands' dtype (a float number with an integer tensor is an error). Output strides follow torch's
TensorIterator rule (`utils.elementwise_output_strides`): channels-last in gives channels-last out.
"""

from __future__ import annotations

import torch

from ember.ir import TensorMeta

from .. import utils
from .core import prim

_POINTWISE = ("pointwise",)

# Dtype classes an operand may have; each prim names one.
_DTYPE_CLASSES = {
    "any": lambda d: True,
    "no_bool": lambda d: d is not torch.bool,
    "float": lambda d: d.is_floating_point or d.is_complex,
    "real_float": lambda d: d.is_floating_point,
    "real": lambda d: not d.is_complex,
    "real_no_bool": lambda d: not d.is_complex and d is not torch.bool,
    "int": lambda d: utils.is_integer_dtype(d) or d is torch.bool,
    "int_only": utils.is_integer_dtype,
    "complex": lambda d: d.is_complex,
}


def _check_dtype(name: str, dtype: torch.dtype, cls: str) -> None:
    if not _DTYPE_CLASSES[cls](dtype):
        raise TypeError(f"prims.{name} does not accept {dtype} operands (it takes {cls} dtypes)")


def _tensor_operands(name: str, operands) -> list:
    tensors = [x for x in operands if utils.is_tensor_like(x)]
    if not tensors:
        raise TypeError(f"prims.{name} needs at least one tensor operand")
    return tensors


def _check_numbers(name: str, operands, dtype: torch.dtype) -> None:
    for x in operands:
        if utils.is_tensor_like(x) or x is None:
            continue
        if not utils.is_number(x):
            raise TypeError(f"prims.{name}: operand {x!r} is neither a tensor nor a number")
        kind = utils.dtype_of_number(x)
        if (kind.is_complex and not dtype.is_complex) or (
            kind.is_floating_point and not (dtype.is_floating_point or dtype.is_complex)
        ):
            raise TypeError(f"prims.{name}: the number {x!r} cannot be a {dtype} scalar")


def elementwise_meta(
    name: str, operands, out_dtype=None, cls: str = "any", typed=None
) -> TensorMeta:
    """Meta of an elementwise prim over same-shape operands; `typed` (default: all operands) are
    the ones that must share one dtype, of class `cls`."""
    tensors = _tensor_operands(name, operands)
    utils.check_same_shape(*tensors, name=f"prims.{name}")
    typed = operands if typed is None else typed
    typed_tensors = [x for x in typed if utils.is_tensor_like(x)]
    utils.check_same_dtype(*typed_tensors, name=f"prims.{name}")
    dtype = typed_tensors[0].dtype if typed_tensors else utils.result_type(*typed)
    _check_dtype(name, dtype, cls)
    _check_numbers(name, typed, dtype)
    return TensorMeta(
        dtype=out_dtype(dtype) if out_dtype is not None else dtype,
        sizes=tensors[0].sizes,
        strides=utils.elementwise_output_strides(*operands),
        device=utils.device_of(*tensors),
    )


def _wrap_numbers(args):
    # Numbers become 0-dim tensors of the operands' dtype, so torch neither promotes nor rejects.
    like = next(a for a in args if isinstance(a, torch.Tensor))
    return [
        torch.scalar_tensor(a, dtype=like.dtype, device=like.device) if utils.is_number(a) else a
        for a in args
    ]


def _unary(name, fn, cls="any", out_dtype=None, doc=""):
    def meta(a):
        if not utils.is_tensor_like(a):
            raise TypeError(f"prims.{name} takes a tensor, got {type(a).__name__}")
        return elementwise_meta(name, (a,), out_dtype, cls)

    return prim(name, "(Tensor a) -> Tensor", meta=meta, ref=fn, tags=_POINTWISE, doc=doc)


def _binary(name, fn, cls="any", out_dtype=None, doc=""):
    def meta(a, b):
        return elementwise_meta(name, (a, b), out_dtype, cls)

    def ref(a, b):
        return fn(*_wrap_numbers((a, b)))

    return prim(
        name, "(Tensor a, Tensor b) -> Tensor", meta=meta, ref=ref, tags=_POINTWISE, doc=doc
    )


def _to_bool(_):
    return torch.bool


# --- unary ---------------------------------------------------------------------------------------

abs = _unary("abs", torch.abs, "no_bool", utils.real_dtype)
neg = _unary("neg", torch.neg, "no_bool")
exp = _unary("exp", torch.exp, "float")
exp2 = _unary("exp2", torch.exp2, "float")
expm1 = _unary("expm1", torch.expm1, "float")
log = _unary("log", torch.log, "float")
log1p = _unary("log1p", torch.log1p, "float")
log2 = _unary("log2", torch.log2, "float")
log10 = _unary("log10", torch.log10, "float")
sqrt = _unary("sqrt", torch.sqrt, "float")
rsqrt = _unary("rsqrt", torch.rsqrt, "float")
reciprocal = _unary("reciprocal", torch.reciprocal, "float")
sin = _unary("sin", torch.sin, "float")
cos = _unary("cos", torch.cos, "float")
tan = _unary("tan", torch.tan, "float")
asin = _unary("asin", torch.asin, "float")
acos = _unary("acos", torch.acos, "float")
atan = _unary("atan", torch.atan, "float")
sinh = _unary("sinh", torch.sinh, "float")
cosh = _unary("cosh", torch.cosh, "float")
tanh = _unary("tanh", torch.tanh, "float")
asinh = _unary("asinh", torch.asinh, "float")
acosh = _unary("acosh", torch.acosh, "float")
atanh = _unary("atanh", torch.atanh, "float")
sigmoid = _unary("sigmoid", torch.sigmoid, "float")
erf = _unary("erf", torch.erf, "real_float")
erfc = _unary("erfc", torch.erfc, "real_float")
erfinv = _unary("erfinv", torch.erfinv, "real_float")
erfcx = _unary("erfcx", torch.special.erfcx, "real_float")
ndtri = _unary("ndtri", torch.special.ndtri, "real_float")
lgamma = _unary("lgamma", torch.lgamma, "real_float")
digamma = _unary("digamma", torch.digamma, "real_float")
i0 = _unary("i0", torch.special.i0, "real_float")
i0e = _unary("i0e", torch.special.i0e, "real_float")
i1 = _unary("i1", torch.special.i1, "real_float")
i1e = _unary("i1e", torch.special.i1e, "real_float")
bessel_j0 = _unary("bessel_j0", torch.special.bessel_j0, "real_float")
bessel_j1 = _unary("bessel_j1", torch.special.bessel_j1, "real_float")
spherical_bessel_j0 = _unary("spherical_bessel_j0", torch.special.spherical_bessel_j0, "real_float")
sign = _unary("sign", torch.sign, "real")
sgn = _unary("sgn", torch.sgn, "complex", doc="z / |z| for complex z (0 at 0)")
signbit = _unary("signbit", torch.signbit, "real", _to_bool)
floor = _unary("floor", torch.floor, "real_no_bool")
ceil = _unary("ceil", torch.ceil, "real_no_bool")
round = _unary("round", torch.round, "real_no_bool", doc="round half to even")
trunc = _unary("trunc", torch.trunc, "real_no_bool")
frac = _unary("frac", torch.frac, "real_float")
isnan = _unary("isnan", torch.isnan, "any", _to_bool)
isinf = _unary("isinf", torch.isinf, "any", _to_bool)
isfinite = _unary("isfinite", torch.isfinite, "any", _to_bool)
bitwise_not = _unary("bitwise_not", torch.bitwise_not, "int")
logical_not = _unary("logical_not", torch.logical_not, "any", _to_bool)
conj_physical = _unary("conj_physical", torch.conj_physical, "complex")
real = _unary("real", lambda a: torch.real(a).clone(), "complex", utils.real_dtype)
imag = _unary("imag", lambda a: torch.imag(a).clone(), "complex", utils.real_dtype)


def _polygamma_meta(a, n):
    if n < 0:
        raise ValueError(f"prims.polygamma: order {n} must be non-negative")
    return elementwise_meta("polygamma", (a,), None, "real_float")


polygamma = prim(
    "polygamma",
    "(Tensor a, int n) -> Tensor",
    meta=_polygamma_meta,
    ref=lambda a, n: torch.special.polygamma(n, a),
    tags=_POINTWISE,
)

# --- binary --------------------------------------------------------------------------------------

add = _binary("add", torch.add)
sub = _binary("sub", torch.sub, "no_bool")
mul = _binary("mul", torch.mul)
div = _binary("div", torch.true_divide, "float", doc="true division (floating operands only)")
trunc_div = _binary(
    "trunc_div", lambda a, b: torch.div(a, b, rounding_mode="trunc"), "real_no_bool"
)
floor_div = _binary(
    "floor_div", lambda a, b: torch.div(a, b, rounding_mode="floor"), "real_no_bool"
)
remainder = _binary("remainder", torch.remainder, "real_no_bool", doc="Python's %: sign of b")
fmod = _binary("fmod", torch.fmod, "real_no_bool", doc="C's fmod: sign of a")
pow = _binary("pow", torch.pow, "no_bool")
atan2 = _binary("atan2", torch.atan2, "real_float")
hypot = _binary("hypot", torch.hypot, "real_float")
copysign = _binary("copysign", torch.copysign, "real_float")
nextafter = _binary("nextafter", torch.nextafter, "real_float")
maximum = _binary("maximum", torch.maximum, "real", doc="NaN-propagating maximum")
minimum = _binary("minimum", torch.minimum, "real", doc="NaN-propagating minimum")
fmax = _binary("fmax", torch.fmax, "real", doc="maximum ignoring NaN")
fmin = _binary("fmin", torch.fmin, "real", doc="minimum ignoring NaN")
eq = _binary("eq", torch.eq, "any", _to_bool)
ne = _binary("ne", torch.ne, "any", _to_bool)
lt = _binary("lt", torch.lt, "real", _to_bool)
le = _binary("le", torch.le, "real", _to_bool)
gt = _binary("gt", torch.gt, "real", _to_bool)
ge = _binary("ge", torch.ge, "real", _to_bool)
bitwise_and = _binary("bitwise_and", torch.bitwise_and, "int")
bitwise_or = _binary("bitwise_or", torch.bitwise_or, "int")
bitwise_xor = _binary("bitwise_xor", torch.bitwise_xor, "int")
shift_left = _binary("shift_left", torch.bitwise_left_shift, "int_only")
shift_right_arithmetic = _binary("shift_right_arithmetic", torch.bitwise_right_shift, "int_only")
logical_and = _binary("logical_and", torch.logical_and, "any", _to_bool)
logical_or = _binary("logical_or", torch.logical_or, "any", _to_bool)
logical_xor = _binary("logical_xor", torch.logical_xor, "any", _to_bool)
gcd = _binary("gcd", torch.gcd, "int_only")
lcm = _binary("lcm", torch.lcm, "int_only")
igamma = _binary("igamma", torch.special.gammainc, "real_float")
igammac = _binary("igammac", torch.special.gammaincc, "real_float")
zeta = _binary("zeta", torch.special.zeta, "real_float", doc="Hurwitz zeta(a, b)")
complex = _binary("complex", torch.complex, "real_float", utils.complex_dtype)

# --- ternary and conversion ----------------------------------------------------------------------


def _where_meta(pred, a, b):
    if not utils.is_tensor_like(pred) or pred.dtype is not torch.bool:
        raise TypeError("prims.where: pred must be a bool tensor")
    return elementwise_meta("where", (pred, a, b), None, "any", typed=(a, b))


def _where_ref(pred, a, b):
    like = next((x for x in (a, b) if isinstance(x, torch.Tensor)), None)
    dtype = like.dtype if like is not None else utils.result_type(a, b)

    def wrap(x):
        if isinstance(x, torch.Tensor):
            return x
        return torch.scalar_tensor(x, dtype=dtype, device=pred.device)

    return torch.where(pred, wrap(a), wrap(b))


where = prim(
    "where",
    "(Tensor pred, Tensor a, Tensor b) -> Tensor",
    meta=_where_meta,
    ref=_where_ref,
    tags=_POINTWISE,
    doc="pred ? a : b elementwise (pred bool; a and b one dtype, either may be a number)",
)


def _convert_meta(a, dtype):
    if a.dtype.is_complex and not dtype.is_complex:
        raise TypeError("prims.convert_element_type: complex to real discards data; use prims.real")
    out = elementwise_meta("convert_element_type", (a,))
    return TensorMeta(dtype, out.sizes, out.strides, device=out.device)


def _convert_ref(a, dtype):
    meta = _convert_meta(TensorMeta.from_tensor(a), dtype)
    out = torch.empty_strided(
        a.shape, tuple(int(s) for s in meta.strides), dtype=dtype, device=a.device
    )
    return out.copy_(a)


convert_element_type = prim(
    "convert_element_type",
    "(Tensor a, dtype dtype) -> Tensor",
    meta=_convert_meta,
    ref=_convert_ref,
    tags=_POINTWISE,
    doc="a converted to dtype (floats to ints truncate, as torch's casts do)",
)
