"""Index simplification: remove the FloorDiv/ModularIndexing that views and reshapes leave behind
when the loop ranges make them redundant.

A reshape reads its input through a flat index split into coordinates, e.g. (768*x0 + x1) split
as (//393216, //768 % 512, % 768); with x1 < 768 that is the plain 768*x0 + x1 again. Every rule
here is exact for non-negative integer loop variables within their ranges, and fires only where
that is proven (from the ranges and the symbols' assumptions); anything unproven stays as it is.
Integer and symbolic (dynamic-shape) sizes go through the same proofs. Also here: the strided
and affine index arithmetic lowering repeats, remembered (all of it pure in its arguments).
"""

from __future__ import annotations

import functools

import sympy

from ember.ir import FloorDiv, ModularIndexing
from ember.ir.symbols import exact_quotient, expand_index, free_symbols_of

_MAX_PASSES = 8


def simplify_index(expr, ranges: dict):
    """`expr` without the div/mod that `ranges` (loop variable -> size) make trivial."""
    expr = sympy.sympify(expr)
    if not expr.has(FloorDiv, ModularIndexing):
        return expr
    # A pure function of the expression and the ranges of its own variables, asked again and
    # again for the same ones (each layer's kernels index alike; the scheduler, the renderer and
    # the final substitution simplify each access anew): remembered, by those only.
    free = free_symbols_of(expr)  # (sympy computes expr.free_symbols anew on each access)
    key = (expr, frozenset((v, n) for v, n in ranges.items() if v in free))
    got = _SIMPLIFIED.get(key)
    if got is None:
        if len(_SIMPLIFIED) >= _MAX_REMEMBERED:
            _SIMPLIFIED.clear()
        got = _SIMPLIFIED[key] = _simplify(expr, ranges)
    return got


_SIMPLIFIED: dict = {}
_MAX_REMEMBERED = 1 << 16


def _simplify(expr, ranges: dict):
    simp = _Simplifier(ranges)
    for _ in range(_MAX_PASSES):
        new = expand_index(simp.visit(expr))
        if new == expr:
            break
        expr = new
    return expr


class _Simplifier:
    def __init__(self, ranges):
        self.ranges = {v: sympy.sympify(n) for v, n in ranges.items()}
        # Index expressions share subexpressions (a view of a view of a view repeats its
        # source's index in several places): each is simplified once per simplify_index call.
        # Funnel Transformer's backward built trees that visited millions of nodes without it.
        self.done: dict = {}

    def visit(self, e):
        if e.is_Atom:
            return e
        got = self.done.get(e)
        if got is None:
            got = self.done[e] = self._visit(e)
        return got

    def _visit(self, e):
        args = [self.visit(a) for a in e.args]
        if isinstance(e, FloorDiv):
            return self.floordiv(expand_index(args[0]), args[1])
        if isinstance(e, ModularIndexing):
            return self.modular(expand_index(args[0]), args[1], args[2])
        e = e.func(*args)
        return recombine(e) if isinstance(e, sympy.Add) else e

    # --- the rules ------------------------------------------------------------------------------
    def floordiv(self, x, d):
        if not d.is_positive:
            return FloorDiv(x, d)
        lo, hi = interval(x, self.ranges)
        if not _nonneg(lo):
            return FloorDiv(x, d)
        if _lt(hi, d):  # x < d
            return sympy.S.Zero
        if isinstance(x, FloorDiv):  # (x // a) // d = x // (a*d)
            return FloorDiv(x.args[0], x.args[1] * d)
        if isinstance(x, ModularIndexing):  # ((x // a) % (d*k)) // d = (x // (a*d)) % k
            k = exact_quotient(x.args[2], d)
            if k is not None:
                return ModularIndexing(x.args[0], x.args[1] * d, k)
        split = self.common_factor(x, d)
        if split is not None:  # x = a*y + r, 0 <= r < a, a | d: x // d = y // (d/a)
            a, y = split
            return FloorDiv(y, exact_quotient(d, a))
        mult, rest = _split_multiples(x, d)
        if mult != 0 and _nonneg(interval(rest, self.ranges)[0]):  # (d*m + r) // d = m + r // d
            return mult + FloorDiv(rest, d)
        return FloorDiv(x, d)

    def modular(self, x, d, m):
        if not (d.is_positive and m.is_positive):
            return ModularIndexing(x, d, m)
        lo, hi = interval(x, self.ranges)
        if not _nonneg(lo):
            return ModularIndexing(x, d, m)
        if _lt(hi, d * m):  # x < d*m: the modulus never wraps
            return self.floordiv(x, d)
        if isinstance(x, FloorDiv):  # (x // a) // d % m = x // (a*d) % m
            return ModularIndexing(x.args[0], x.args[1] * d, m)
        if isinstance(x, ModularIndexing) and exact_quotient(x.args[2], d * m) is not None:
            # ((x // a) % (d*m*k)) // d % m = x // (a*d) % m
            return ModularIndexing(x.args[0], x.args[1] * d, m)
        _, rest = _split_multiples(x, d * m)  # multiples of d*m never change the result
        if rest != x and _nonneg(interval(rest, self.ranges)[0]):
            return ModularIndexing(rest, d, m)
        split = self.common_factor(x, d)
        if split is not None:  # x = a*y + r, 0 <= r < a, a | d: x // d = y // (d/a)
            a, y = split
            return ModularIndexing(y, exact_quotient(d, a), m)
        return ModularIndexing(x, d, m)

    def common_factor(self, x, d):
        """(a, y) with x = a*y + r, a | d, a > 1 and 0 <= r < a proven; None if there is none."""
        terms = sympy.Add.make_args(x)
        candidates = []
        for t in terms:
            a = _gcd(t, d)
            if a is None:
                continue
            if a != 1 and a.is_positive and a not in candidates:
                candidates.append(a)
        for a in sorted(candidates, key=sympy.default_sort_key, reverse=True):
            y, r = sympy.S.Zero, sympy.S.Zero
            for t in terms:
                q = exact_quotient(t, a)
                if q is None:
                    r += t
                else:
                    y += q
            lo, hi = interval(r, self.ranges)
            if y != 0 and _nonneg(lo) and _lt(hi, a):
                return a, y
        return None


@functools.lru_cache(maxsize=1 << 14)
def _gcd(t, d):
    """sympy.gcd(t, d), None where sympy cannot take it; remembered (a polynomial gcd per term
    of each divided index, and each layer's windows and patches divide alike)."""
    try:
        return sympy.gcd(t, d)
    except (sympy.PolynomialError, TypeError, ValueError):
        return None


def recombine(e):
    """c*m*(x // (d*m)) + c*((x // d) % m) -> c*(x // d), and the same for a ModularIndexing in
    place of the first (then (x // d) % (m*k)): the digits of a split index put back together."""
    while True:
        terms = list(sympy.Add.make_args(e))
        parts = [_digit(t) for t in terms]
        pair = _find_pair(parts)
        if pair is None:
            return e
        i, j = pair
        (x, _, m_hi, _), (_, d, m, c) = parts[i], parts[j]
        new = FloorDiv(x, d) if m_hi is None else ModularIndexing(x, d, m * m_hi)
        rest = [t for k, t in enumerate(terms) if k not in (i, j)]
        e = sympy.Add(*rest, c * new)


def _find_pair(parts):
    for i, hi in enumerate(parts):
        for j, low in enumerate(parts):
            if i == j or hi is None or low is None:
                continue
            (x1, d1, _, c1), (x2, d2, m2, c2) = hi, low
            if m2 is None or x1 != x2:
                continue
            if sympy.expand(d1 - d2 * m2) == 0 and sympy.expand(c1 - c2 * m2) == 0:
                return i, j
    return None


def _digit(term):
    """(x, d, m or None, c) of the term c*ModularIndexing(x, d, m) or c*FloorDiv(x, d)."""
    factors = sympy.Mul.make_args(term)
    heads = [f for f in factors if isinstance(f, (FloorDiv, ModularIndexing))]
    if len(heads) != 1:
        return None
    f = heads[0]
    coeff = sympy.Mul(*[g for g in factors if g is not f])
    if isinstance(f, FloorDiv):
        return f.args[0], f.args[1], None, coeff
    return f.args[0], f.args[1], f.args[2], coeff


# --- ranges of expressions -----------------------------------------------------------------------


def interval(e, ranges) -> tuple:
    """Inclusive (lower, upper) bounds of integer expression `e`; either may be None (unknown)."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return e, e
    if e.is_Symbol:
        if e in ranges:
            return sympy.S.Zero, ranges[e] - 1
        if e.is_positive:
            return sympy.S.One, None
        if e.is_nonnegative:
            return sympy.S.Zero, None
        return None, None
    if isinstance(e, sympy.Add):
        bounds = [interval(a, ranges) for a in e.args]
        lo = None if any(b[0] is None for b in bounds) else sympy.Add(*[b[0] for b in bounds])
        hi = None if any(b[1] is None for b in bounds) else sympy.Add(*[b[1] for b in bounds])
        return lo, hi
    if isinstance(e, sympy.Mul):
        c, rest = e.as_coeff_Mul()
        if c != 1:
            if not c.is_Integer:
                return None, None
            lo, hi = interval(rest, ranges)
            lo, hi = (None if lo is None else c * lo), (None if hi is None else c * hi)
            return (lo, hi) if c > 0 else (hi, lo)
        bounds = [interval(a, ranges) for a in e.args]  # a product of non-negative factors
        if not all(_nonneg(b[0]) for b in bounds):
            return None, None
        hi = None if any(b[1] is None for b in bounds) else sympy.Mul(*[b[1] for b in bounds])
        return sympy.Mul(*[b[0] for b in bounds]), hi
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
        lo, hi = interval(e.base, ranges)
        if not _nonneg(lo):
            return None, None
        return lo**e.exp, None if hi is None else hi**e.exp
    if isinstance(e, FloorDiv):
        lo, hi = interval(e.args[0], ranges)
        return _div_bounds(lo, hi, e.args[1])
    if isinstance(e, ModularIndexing):
        x, d, m = e.args
        lo, hi = _div_bounds(*interval(x, ranges), d)
        if hi is not None and lo is not None and _lt(hi, m):
            return lo, hi
        return (sympy.S.Zero, m - 1) if m.is_positive else (None, None)
    return None, None


def _div_bounds(lo, hi, d):
    if not (d.is_positive and _nonneg(lo)):
        return None, None
    if d.is_Integer and lo.is_Integer:
        lo = lo // d
    else:
        lo = sympy.S.Zero
    if hi is not None:
        # an upper bound of floor(hi / d): exact for integers, hi / d (not rounded) otherwise
        hi = hi // d if (hi.is_Integer and d.is_Integer) else hi / d
    return lo, hi


def _nonneg(e) -> bool:
    """Proven e >= 0."""
    if e is None:
        return False
    e = expand_index(e)
    if e.is_Number:
        return bool(e >= 0)
    # s0*s1 - s0 is not known non-negative to sympy; its factored form s0*(s1 - 1) is
    return e.is_nonnegative is True or sympy.factor(e).is_nonnegative is True


def _lt(hi, bound) -> bool:
    """Proven that an integer at most `hi` is below the integer `bound`."""
    return hi is not None and _nonneg(bound - 1 - hi)


def _split_multiples(x, d):
    """(sum of the terms of x that d divides exactly, divided by d; the other terms)."""
    mult, rest = sympy.S.Zero, sympy.S.Zero
    for t in sympy.Add.make_args(expand_index(x)):
        q = exact_quotient(t, d)
        if q is None:
            rest += t
        else:
            mult += q
    return mult, rest


# --- index arithmetic, remembered ---------------------------------------------------------------
# Lowering rebuilds the same view indices for every layer and every time a body is run again
# (scheduling, rendering); sympy's arithmetic makes each answer cost far more than a lookup.


def strided_index(offset, strides, idx) -> sympy.Expr:
    """offset + sum(idx[d] * strides[d]): the flat index of a strided view's element `idx`."""
    try:
        return _strided_index(offset, tuple(strides), tuple(idx))
    except TypeError:  # an unhashable index (none known): computed as is
        return _strided_index.__wrapped__(offset, tuple(strides), tuple(idx))


@functools.lru_cache(maxsize=1 << 16)
def _strided_index(offset, strides: tuple, idx: tuple) -> sympy.Expr:
    # one Add of all terms: summing them one by one rebuilds an Add per term
    return sympy.Add(offset, *(i * s for i, s in zip(idx, strides)))


def linear_parts(expr, vars_) -> tuple | None:
    """(coefficients, constant) when `expr` is affine in `vars_`, else None."""
    return _linear_parts(sympy.sympify(expr), tuple(vars_))


@functools.lru_cache(maxsize=1 << 14)
def _linear_parts(expr, vars_: tuple) -> tuple | None:
    expr = sympy.expand(expr)
    coeffs = [expr.coeff(v) for v in vars_]
    const = expr.subs({v: 0 for v in vars_})
    if any(c.free_symbols & set(vars_) for c in coeffs):
        return None
    if sympy.expand(const + sum(c * v for c, v in zip(coeffs, vars_)) - expr) != 0:
        return None
    return tuple(coeffs), const


__all__ = ["interval", "linear_parts", "recombine", "simplify_index", "strided_index"]
