"""Printing ember.ir's integer expressions (sizes, strides, grids, guards) as C++ int64 code."""

from __future__ import annotations

from typing import Mapping

import sympy

from ember.ir import CeilDiv, FloorDiv, ModularIndexing

from .errors import UnsupportedArtifactError

_RELATIONS = {
    sympy.Equality: "==",
    sympy.Unequality: "!=",
    sympy.StrictLessThan: "<",
    sympy.LessThan: "<=",
    sympy.StrictGreaterThan: ">",
    sympy.GreaterThan: ">=",
}


def int_literal(value: int) -> str:
    return f"{value}LL" if not -(2**31) < value < 2**31 else str(value)


class CExprPrinter:
    """Prints an expression over the artifact's symbols (`names`: symbol name -> C variable)."""

    def __init__(self, names: Mapping[str, str]):
        self.names = dict(names)

    def __call__(self, expr) -> str:
        return self.print(sympy.sympify(expr))

    def print(self, e) -> str:
        if e is sympy.true or e is sympy.false:
            return "true" if e is sympy.true else "false"
        if e.is_Integer:
            return int_literal(int(e))
        if e.is_Symbol:
            if e.name not in self.names:
                raise UnsupportedArtifactError(f"expression uses the unbound symbol {e.name}")
            return self.names[e.name]
        if e.is_Rational:
            raise UnsupportedArtifactError(f"a non-integer size expression: {e}")
        p = self.print
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(p(a) for a in e.args) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + " * ".join(p(a) for a in e.args) + ")"
        if isinstance(e, sympy.Pow):
            base, exp = e.args
            if not (exp.is_Integer and int(exp) >= 0):
                raise UnsupportedArtifactError(f"a power with a non-natural exponent: {e}")
            return f"ember_abi::ipow({p(base)}, {int(exp)})"
        if isinstance(e, (sympy.Max, sympy.Min)):
            fn = "ember_abi::imax" if isinstance(e, sympy.Max) else "ember_abi::imin"
            out = p(e.args[0])
            for a in e.args[1:]:
                out = f"{fn}({out}, {p(a)})"
            return out
        if isinstance(e, sympy.Mod):
            return f"ember_abi::pymod({p(e.args[0])}, {p(e.args[1])})"
        if isinstance(e, FloorDiv):
            return f"ember_abi::floordiv({p(e.args[0])}, {p(e.args[1])})"
        if isinstance(e, CeilDiv):
            return f"ember_abi::ceildiv({p(e.args[0])}, {p(e.args[1])})"
        if isinstance(e, ModularIndexing):
            index, div, mod = (p(a) for a in e.args)
            return f"ember_abi::pymod(ember_abi::floordiv({index}, {div}), {mod})"
        for cls, op in _RELATIONS.items():
            if isinstance(e, cls):
                return f"({p(e.lhs)} {op} {p(e.rhs)})"
        if isinstance(e, sympy.And):
            return "(" + " && ".join(p(a) for a in e.args) + ")"
        if isinstance(e, sympy.Or):
            return "(" + " || ".join(p(a) for a in e.args) + ")"
        if isinstance(e, sympy.Not):
            return f"(!{p(e.args[0])})"
        raise UnsupportedArtifactError(f"cannot print {type(e).__name__} in C++: {e}")
