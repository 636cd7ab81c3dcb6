"""Symbolic integers: sizes, strides and indices as sympy expressions, and symbols with ranges.

A static size is a sympy Integer; a dynamic one is a positive integer Symbol whose range travels with
it in a `SymbolSpec`. The integer functions below are the only non-sympy heads that may appear in an
index or size expression, so every consumer (inductor's printers, the C++ wrapper) knows them all.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import sympy


class FloorDiv(sympy.Function):
    """Integer floor division of two non-negative integer expressions."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.S.Zero
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if base == divisor:
            return sympy.S.One
        return _fold_integer_divisor(base, divisor)


def _fold_integer_divisor(base, divisor):
    """FloorDiv's and CeilDiv's fold: base / divisor where a positive integer divisor divides the
    coefficient of every integer term of base (128*s0 / 128 is s0); None otherwise. Read off the
    coefficients, not expanded: index expressions build many divisions (exact_quotient is the
    general test)."""
    if not (divisor.is_Integer and divisor > 0) or base.is_Integer:
        return None
    terms = base.as_coefficients_dict()
    if not all(t.is_integer for t in terms):
        return None
    return _divide_coefficients(terms, int(divisor))


def _divide_coefficients(terms: dict, d: int):
    """The sum of term * coefficient / d over {term: coefficient} when d divides every
    coefficient (all integers), else None."""
    if not all(c.is_Integer and int(c) % d == 0 for c in terms.values()):
        return None
    return sympy.Add(*(t * (int(c) // d) for t, c in terms.items()))


def exact_quotient(a, b):
    """a / b when that is a polynomial with integer coefficients, so that a floor or ceiling
    division of the two is exact, else None: (32*s0*s1) / s1 is 32*s0 (torch's inferred -1 in a
    reshape), (2*s0 + 4) / 2 is s0 + 2."""
    a, b = sympy.sympify(a), sympy.sympify(b)
    if b.is_Integer and b != 0:
        # The common case (index arithmetic divides by sizes and strides), without `cancel`:
        # every coefficient of the expanded dividend must be a multiple of b.
        return _divide_coefficients(expand_index(a).as_coefficients_dict(), int(b))
    return _exact_quotient(a, b)


@functools.lru_cache(maxsize=1 << 16)
def _exact_quotient(a, b):
    num, den = sympy.fraction(sympy.cancel(a / b))
    if den != 1:
        return None
    coeffs = [term.as_coeff_Mul()[0] for term in sympy.Add.make_args(sympy.expand(num))]
    return num if all(k.is_Integer for k in coeffs) else None


class CeilDiv(sympy.Function):
    """Integer ceiling division of two non-negative integer expressions."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(-(-int(base) // int(divisor)))
        return _fold_integer_divisor(base, divisor)


class ModularIndexing(sympy.Function):
    """(index // divisor) % modulus: how a flat index splits into the coordinate of one dimension."""

    nargs = 3
    is_integer = True

    @classmethod
    def eval(cls, index, divisor, modulus):
        if index == 0 or modulus == 1:
            return sympy.S.Zero
        if index.is_Integer and divisor.is_Integer and modulus.is_Integer:
            return sympy.Integer((int(index) // int(divisor)) % int(modulus))
        return None


def sym(name: str) -> sympy.Symbol:
    """The sympy symbol Ember uses for a dynamic size called `name` (a positive integer)."""
    return sympy.Symbol(name, integer=True, positive=True)


def as_expr(value) -> sympy.Expr:
    """An int, a sympy expression or a size-like object as a sympy expression."""
    if isinstance(value, sympy.Basic):
        return value
    if isinstance(value, bool):
        return sympy.true if value else sympy.false
    if isinstance(value, int):
        return sympy.Integer(value)
    node = getattr(value, "node", None)  # a torch.SymInt whose node is ours carries `.expr`
    if node is not None and hasattr(node, "expr"):
        return node.expr
    return sympy.Integer(int(value))


# --- index arithmetic, remembered -------------------------------------------------------------
# A compile asks for the same few thousand index expressions' expansions and free symbols again
# and again (each layer indexes alike; the scheduler, the renderers and the wrapper each expand an
# access anew). sympy's own cache holds 1000 entries, which one large graph churns through, and
# `free_symbols` is never cached: a full tree walk per access. Both are pure functions of the
# (hashable, immutable) expression, so they are remembered here.


@functools.lru_cache(maxsize=1 << 16)
def expand_index(expr) -> sympy.Expr:
    """sympy.expand(expr), remembered by the expression."""
    return sympy.expand(expr)


@functools.lru_cache(maxsize=1 << 16)
def free_symbols_of(expr) -> frozenset:
    """expr's free symbols (of an int: none), remembered by the expression."""
    return frozenset(sympy.sympify(expr).free_symbols)


@dataclasses.dataclass(frozen=True)
class SymbolSpec:
    """A dynamic size: its name and inclusive value range (upper None means unbounded)."""

    name: str
    lower: int = 2
    upper: Optional[int] = None

    @property
    def symbol(self) -> sympy.Symbol:
        return sym(self.name)

    def contains(self, value: int) -> bool:
        return value >= self.lower and (self.upper is None or value <= self.upper)


# --- lossless JSON form of expressions --------------------------------------------------------
# An int stays an int, a symbol is {"sym": name}, anything else is [head, *args]. Only the heads in
# this table are accepted when reading, so a cache or package never evaluates arbitrary text.

_HEADS = {
    "add": sympy.Add,
    "mul": sympy.Mul,
    "pow": sympy.Pow,
    "max": sympy.Max,
    "min": sympy.Min,
    "mod": sympy.Mod,
    "floordiv": FloorDiv,
    "ceildiv": CeilDiv,
    "modidx": ModularIndexing,
    "eq": sympy.Eq,
    "ne": sympy.Ne,
    "lt": sympy.Lt,
    "le": sympy.Le,
    "gt": sympy.Gt,
    "ge": sympy.Ge,
    "and": sympy.And,
    "or": sympy.Or,
    "not": sympy.Not,
}
_HEAD_OF = {cls: head for head, cls in _HEADS.items()}
_HEAD_OF[sympy.StrictLessThan] = "lt"
_HEAD_OF[sympy.LessThan] = "le"
_HEAD_OF[sympy.StrictGreaterThan] = "gt"
_HEAD_OF[sympy.GreaterThan] = "ge"
_HEAD_OF[sympy.Equality] = "eq"
_HEAD_OF[sympy.Unequality] = "ne"


def expr_to_json(expr):
    """The JSON form of an integer expression, relation or boolean."""
    expr = as_expr(expr)
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    if expr.is_Integer:
        return int(expr)
    if expr.is_Rational:
        return ["div", int(expr.p), int(expr.q)]
    if expr.is_Symbol:
        return {"sym": expr.name}
    head = _HEAD_OF.get(type(expr))
    if head is None:
        raise TypeError(f"ember.ir cannot serialise the expression head {type(expr).__name__}: {expr}")
    return [head, *(expr_to_json(a) for a in expr.args)]


def expr_from_json(data) -> sympy.Expr:
    """Inverse of `expr_to_json`."""
    if isinstance(data, bool):
        return sympy.true if data else sympy.false
    if isinstance(data, int):
        return sympy.Integer(data)
    if isinstance(data, dict):
        return sym(data["sym"])
    head, *args = data
    if head == "div":
        return sympy.Rational(args[0], args[1])
    if head not in _HEADS:
        raise ValueError(f"unknown expression head {head!r} in serialised IR")
    return _HEADS[head](*(expr_from_json(a) for a in args))
