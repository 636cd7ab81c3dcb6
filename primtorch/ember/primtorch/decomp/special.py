"""Chebyshev polynomials (T, U, V, W and their shifted forms) of a per-element degree n.

torch evaluates these by the three-term recurrence for small n and by the trigonometric closed
form for larger n inside (-1, 1). A recurrence over a per-element n is a data-dependent loop, so
here it is unrolled up to a static degree (RECURRENCE_DEGREE) and every element of larger degree
takes the closed form, which is exact mathematics on the whole real line (trigonometric inside
[-1, 1], hyperbolic outside): no element gets a wrong value, only one rounded differently.
"""

from __future__ import annotations

import torch


from ember.primtorch import prims, utils

from ._common import INT_TO_FLOAT, aten, convert, elementwise_dtypes, is_tensor
from ._registry import register_decomposition

RECURRENCE_DEGREE = 12


def _operands(x, n):
    _, dtype = elementwise_dtypes(x, n, kind=INT_TO_FLOAT)
    like = x if is_tensor(x) else n
    shape = tuple(
        int(s)
        for s in utils.broadcast_shapes(
            tuple(x.shape) if is_tensor(x) else (), tuple(n.shape) if is_tensor(n) else ()
        )
    )

    def full(v):
        if is_tensor(v):
            return utils.broadcast_to(convert(v, dtype), shape)
        return prims.full(shape, float(v), dtype, like.device)

    xt = full(x)
    nt = prims.trunc(full(n))  # torch truncates the degree to an integer
    return xt, nt, dtype


def _parity_sign(n):
    """(-1) ** n for integral n."""
    return prims.sub(1.0, prims.mul(prims.abs(prims.fmod(n, 2.0)), 2.0))


def _closed_form(kind, y, n):
    """The polynomial of degree n at y by its trigonometric / hyperbolic closed form."""
    inside = prims.le(prims.abs(y), 1.0)
    yc = prims.minimum(prims.maximum(y, -1.0), 1.0)
    theta = prims.acos(yc)
    ay = prims.abs(y)
    phi = prims.acosh(prims.maximum(ay, 1.0))
    sign = prims.where(prims.lt(y, 0.0), _parity_sign(n), 1.0)
    if kind == "t":
        trig = prims.cos(prims.mul(n, theta))
        hyp = prims.mul(sign, prims.cosh(prims.mul(n, phi)))
    elif kind == "u":
        n1 = prims.add(n, 1.0)
        s = prims.sin(theta)
        limit = prims.mul(n1, prims.cos(prims.mul(n1, theta)))  # sin theta == 0: x = +-1
        trig = prims.where(prims.ne(s, 0.0), prims.div(prims.sin(prims.mul(n1, theta)), s), limit)
        sh = prims.sinh(phi)
        hyp_lim = prims.mul(sign, n1)
        hyp = prims.where(
            prims.ne(sh, 0.0),
            prims.mul(sign, prims.div(prims.sinh(prims.mul(n1, phi)), sh)),
            hyp_lim,
        )
    else:
        # V_n(y) = cos((n + 1/2) t) / cos(t / 2), W_n(y) = sin((n + 1/2) t) / sin(t / 2) with
        # y = cos t; V_n(-y) = (-1)^n W_n(y), which also gives the hyperbolic branch for y < -1.
        half = prims.add(n, 0.5)
        num_c, den_c = prims.cos(prims.mul(half, theta)), prims.cos(prims.mul(theta, 0.5))
        num_s, den_s = prims.sin(prims.mul(half, theta)), prims.sin(prims.mul(theta, 0.5))
        two_n1 = prims.add(prims.mul(n, 2.0), 1.0)
        if kind == "v":
            trig = prims.where(
                prims.ne(den_c, 0.0), prims.div(num_c, den_c), prims.mul(_parity_sign(n), two_n1)
            )
        else:
            trig = prims.where(prims.ne(den_s, 0.0), prims.div(num_s, den_s), two_n1)
        ch = prims.div(prims.cosh(prims.mul(half, phi)), prims.cosh(prims.mul(phi, 0.5)))
        sh_den = prims.sinh(prims.mul(phi, 0.5))
        sh = prims.where(
            prims.ne(sh_den, 0.0), prims.div(prims.sinh(prims.mul(half, phi)), sh_den), two_n1
        )
        pos, neg = (ch, sh) if kind == "v" else (sh, ch)
        hyp = prims.where(prims.lt(y, 0.0), prims.mul(_parity_sign(n), neg), pos)
    return prims.where(inside, trig, hyp)


def _endpoints(kind, n):
    """(value at y = 1, value at y = -1) of the degree-n polynomial."""
    sign = _parity_sign(n)
    n1 = prims.add(n, 1.0)
    two_n1 = prims.add(prims.mul(n, 2.0), 1.0)
    one = prims.full(tuple(n.shape), 1.0, n.dtype, n.device)
    if kind == "t":
        return one, sign
    if kind == "u":
        return n1, prims.mul(sign, n1)
    if kind == "v":
        return one, prims.mul(sign, two_n1)
    return two_n1, sign


_FIRST = {  # degree-1 polynomial in y
    "t": lambda y: y,
    "u": lambda y: prims.mul(y, 2.0),
    "v": lambda y: prims.sub(prims.mul(y, 2.0), 1.0),
    "w": lambda y: prims.add(prims.mul(y, 2.0), 1.0),
}


def _chebyshev(kind, x, n, shifted):
    xt, nt, dtype = _operands(x, n)
    compute = utils.opmath_dtype(dtype)
    x_c, n_c = convert(xt, compute), convert(nt, compute)
    # torch forms the shifted argument as x + x - 1.
    y = prims.sub(prims.add(x_c, x_c), 1.0) if shifted else x_c
    prev = prims.full(tuple(y.shape), 1.0, compute, y.device)
    cur = _FIRST[kind](y)
    out = prims.where(prims.eq(n_c, 0.0), prev, cur)
    two_y = prims.add(y, y)
    for k in range(2, RECURRENCE_DEGREE + 1):
        prev, cur = cur, prims.sub(prims.mul(two_y, cur), prev)
        out = prims.where(prims.eq(n_c, float(k)), cur, out)
    big = prims.gt(n_c, float(RECURRENCE_DEGREE))
    # Inside (-1, 1) torch switches to the closed form above a small degree; so do we.
    switch = {"t": 6, "u": 8, "v": 8, "w": 8} if not shifted else {"t": 6, "u": 6, "v": 6, "w": 4}
    trig_region = prims.bitwise_and(prims.lt(prims.abs(y), 1.0), prims.gt(n_c, float(switch[kind])))
    use_closed = prims.bitwise_or(big, trig_region)
    safe_n = prims.where(use_closed, n_c, 0.0)
    out = prims.where(use_closed, _closed_form(kind, y, safe_n), out)
    # At y = +-1 the closed forms divide 0 by 0: torch gives the endpoint values exactly.
    at_one, at_minus_one = _endpoints(kind, n_c)
    out = prims.where(prims.eq(y, 1.0), at_one, out)
    out = prims.where(prims.eq(y, -1.0), at_minus_one, out)
    out = prims.where(prims.lt(n_c, 0.0), 0.0, out)
    return convert(out, dtype)


def _register(kind, shifted):
    name = f"special_{'shifted_' if shifted else ''}chebyshev_polynomial_{kind}"
    packet = getattr(aten, name)

    def decomp(x, n):
        return _chebyshev(kind, x, n, shifted)

    register_decomposition(packet)(decomp)


for _kind in "tuvw":
    _register(_kind, False)
    _register(_kind, True)


# --- modified Bessel functions of the second kind, by quadrature ---------------------------------
#
# K_nu(x) = integral over t >= 0 of exp(-x cosh t) cosh(nu t) dt. Both forms below integrate an even
# function analytic in a strip around the real line, where the trapezoid rule converges
# geometrically; each is used where its integrand is smooth on the step's scale:
# - x <= 1: the t form as written (exp(x) K is then formed without overflow);
# - x > 1: with x (cosh t - 1) = s^2, exp(x) K_nu(x) = integral exp(-s^2) cosh(nu t(s))
#   2 / sqrt(2x + s^2) ds, t(s) = 2 asinh(s / sqrt(2x)), whose peak no longer narrows with x.

_T_STEP, _T_NODES = 0.25, 400  # t up to 100: exp(-x cosh t) has vanished for every float x > 0
_S_STEP, _S_NODES = 0.25, 32  # s up to 8: exp(-s^2) < 1e-27


def _trapezoid(values, last, step):
    """Trapezoid sum over the nodes 0, step, 2 step, ... of an even integrand."""
    total = prims.sum(values, (last,))
    first = prims.squeeze(prims.slice_in_dim(values, 0, 1, 1, last), (last,))
    return prims.mul(prims.sub(total, prims.mul(first, 0.5)), step)


def _nodes(count, step, shape, device):
    nodes = prims.mul(convert(prims.iota(count, 0, 1, torch.int64, device), torch.float64), step)
    return prims.broadcast_in_dim(nodes, shape + (count,), (len(shape),))


def _scaled_bessel_k(x, nu):
    """exp(x) K_nu(x) for x > 0 (float64 x); other x are masked by the caller."""
    shape = tuple(x.shape)
    last = len(shape)
    small = prims.minimum(x, 1.0)  # t form, meant for x <= 1
    t = _nodes(_T_NODES, _T_STEP, shape, x.device)
    xs = prims.broadcast_in_dim(small, shape + (_T_NODES,), tuple(range(last)))
    integrand = prims.exp(prims.neg(prims.mul(xs, prims.sub(prims.cosh(t), 1.0))))
    if nu:
        integrand = prims.mul(integrand, prims.cosh(prims.mul(t, float(nu))))
    by_t = _trapezoid(integrand, last, _T_STEP)
    big = prims.maximum(x, 1.0)  # s form, meant for x > 1
    s = _nodes(_S_NODES, _S_STEP, shape, x.device)
    xb = prims.broadcast_in_dim(big, shape + (_S_NODES,), tuple(range(last)))
    root = prims.sqrt(prims.add(prims.mul(xb, 2.0), prims.mul(s, s)))
    integrand = prims.div(prims.mul(prims.exp(prims.neg(prims.mul(s, s))), 2.0), root)
    if nu:
        t_of_s = prims.mul(prims.asinh(prims.div(s, prims.sqrt(prims.mul(xb, 2.0)))), 2.0)
        integrand = prims.mul(integrand, prims.cosh(prims.mul(t_of_s, float(nu))))
    by_s = _trapezoid(integrand, last, _S_STEP)
    return prims.where(prims.le(x, 1.0), by_t, by_s)


def _bessel_k(self, nu, scaled):
    _, dtype = elementwise_dtypes(self, kind=INT_TO_FLOAT)
    x = convert(self, torch.float64)
    positive = prims.bitwise_and(prims.gt(x, 0.0), prims.lt(x, float("inf")))
    safe = prims.where(positive, x, 1.0)
    out = _scaled_bessel_k(safe, nu)
    if not scaled:
        out = prims.mul(out, prims.exp(prims.neg(safe)))
    out = prims.where(prims.eq(x, 0.0), float("inf"), out)
    out = prims.where(prims.eq(x, float("inf")), 0.0, out)
    out = prims.where(prims.bitwise_or(prims.lt(x, 0.0), prims.ne(x, x)), float("nan"), out)
    return convert(out, dtype)


for _name, _nu, _scaled in (
    ("special_modified_bessel_k0", 0, False),
    ("special_modified_bessel_k1", 1, False),
    ("special_scaled_modified_bessel_k0", 0, True),
    ("special_scaled_modified_bessel_k1", 1, True),
):

    def _decomp(self, _nu=_nu, _scaled=_scaled):
        return _bessel_k(self, _nu, _scaled)

    register_decomposition(getattr(aten, _name).default)(_decomp)
