"""Symbolic sizes for tracing: a sympy-backed SymNode, the ShapeEnv that owns the symbols, and
SymbolicTensor, a tensor whose sizes are SymInts of ours.

`torch.SymInt(node)` accepts any object that implements the node protocol (the methods below); our
node holds a sympy expression over Ember's size symbols (`ember.ir.symbols.sym`) and the ShapeEnv
that knows each symbol's hint (its value in the example inputs) and range. Arithmetic stays
symbolic. A comparison that must be decided (`if x.size(0) > 8:`, `int(s)`) is evaluated at the
hints; unless the ranges decide it for every size, the decision is recorded as a guard (a sympy
relation), which the compiled program's caller must check (DYNAMIC.md).

A SymbolicTensor carries its real value at the hints (`.value`), so the tracer still computes what
eager computes while it records; only sizes, strides and the size arguments it records are
symbolic. Outside the tracer it computes as its value.
"""

from __future__ import annotations

import operator
from typing import Iterable, Optional

import sympy
import torch
from torch.utils import _pytree as pytree

from ember.ir import FloorDiv, SymbolSpec, TensorMeta
from ember.ir.symbols import as_expr, exact_quotient, sym


class ShapeEnv:
    """The symbols of one trace: hints, ranges, and the guards the trace assumed."""

    def __init__(self, specs: Iterable[SymbolSpec] = (), hints: Optional[dict] = None):
        self.specs = {s.symbol: s for s in specs}
        self.hints: dict[sympy.Symbol, int] = {}
        self.guards: list[sympy.Basic] = []
        for name, value in (hints or {}).items():
            self.hints[sym(name) if isinstance(name, str) else name] = sympy.Integer(value)
        # Each symbol s as lower + t with t >= 0: what sympy needs to decide range-implied facts.
        self._shift = {
            s: spec.lower + sympy.Symbol(f"_t_{s.name}", integer=True, nonnegative=True)
            for s, spec in self.specs.items()
        }

    # --- values --------------------------------------------------------------------------------
    def hint(self, expr) -> int | float | bool:
        """`expr` evaluated at the hints (a Python number or bool)."""
        expr = as_expr(expr)
        if expr.is_Integer:
            return int(expr)
        value = expr.xreplace(self.hints)
        if value is sympy.true or value is sympy.false:
            return bool(value)
        if value.is_Integer:
            return int(value)
        if value.is_Relational or isinstance(value, sympy.logic.boolalg.Boolean):
            return bool(value)
        return float(value)

    def hint_meta(self, meta: TensorMeta) -> TensorMeta:
        """`meta` with every size, stride and offset evaluated at the hints."""
        return TensorMeta(meta.dtype, tuple(self.hint(s) for s in meta.sizes),
                          tuple(self.hint(s) for s in meta.strides), self.hint(meta.storage_offset),
                          meta.device, meta.requires_grad)  # fmt: skip

    def symint(self, expr):
        """An int for a constant expression, else a torch.SymInt on our node."""
        expr = as_expr(expr)
        if expr.is_Integer:
            return int(expr)
        return torch.SymInt(SymNode(expr, self, int))

    # --- decisions -----------------------------------------------------------------------------
    def statically_known(self, rel) -> Optional[bool]:
        """True/False when the symbols' ranges decide `rel` for every size, else None."""
        rel = as_expr(rel)
        if rel is sympy.true or rel is sympy.false:
            return bool(rel)
        huge = _against_huge(rel)
        if huge is not None:
            return huge
        shifted = rel.xreplace(self._shift)
        if shifted is sympy.true or shifted is sympy.false:
            return bool(shifted)
        if isinstance(shifted, sympy.core.relational.Relational):
            diff = sympy.expand(shifted.lhs - shifted.rhs)
            if diff.is_number:
                return bool(shifted.func(diff, 0))
            for sign, holds in ((diff.is_positive, (">", ">=", "!=")),
                                (diff.is_nonnegative, (">=",)), (diff.is_negative, ("<", "<=", "!=")),
                                (diff.is_nonpositive, ("<=",)), (diff.is_zero, ("==", ">=", "<="))):  # fmt: skip
                if sign and shifted.rel_op in holds:
                    return True
            if diff.is_positive and shifted.rel_op in ("<", "<=", "=="):
                return False
            if diff.is_negative and shifted.rel_op in (">", ">=", "=="):
                return False
        return None

    def implies(self, rel) -> bool:
        """True when the ranges, or the guards recorded so far, make `rel` hold."""
        rel = as_expr(rel)
        if rel in self.guards or self.statically_known(rel) is True:
            return True
        subs = self._equalities()
        return bool(subs) and self.statically_known(rel.xreplace(subs)) is True

    def _equalities(self) -> dict:
        """symbol -> what the guards equate it to (Eq(s1, s0): s1 -> s0; Eq(s0, 4): s0 -> 4)."""
        subs = {}
        for g in self.guards:
            if not isinstance(g, sympy.Eq):
                continue
            a, b = g.lhs, g.rhs
            if a.is_Symbol and b.is_Symbol:
                a, b = sorted((a, b), key=lambda s: s.name, reverse=True)
            elif b.is_Symbol and a.is_Integer:
                a, b = b, a
            if a.is_Symbol and (b.is_Symbol or b.is_Integer):
                subs[a] = b
        return subs

    def guard_equal(self, a, b) -> bool:
        """a == b at the hints: True, with the guard Eq(a, b) recorded; else False."""
        if self.implies(sympy.Eq(a, b)):
            return True
        if self.hint(a) != self.hint(b):
            return False
        self.add_guard(sympy.Eq(a, b))
        return True

    def guard_bool(self, rel) -> bool:
        """Decide `rel` at the hints, recording the decision as a guard when it is not static."""
        known = self.statically_known(rel)
        if known is not None:
            return known
        value = bool(self.hint(rel))
        self.add_guard(rel if value else sympy.Not(rel))
        return value

    def guard_value(self, expr):
        """Specialise `expr` to its hint value (a guard `Eq(expr, value)`)."""
        expr = as_expr(expr)
        value = self.hint(expr)
        if not expr.is_number:
            self.add_guard(sympy.Eq(expr, value))
        return value

    def add_guard(self, rel) -> None:
        rel = sympy.simplify(rel) if isinstance(rel, sympy.Not) else rel
        if rel is sympy.true:
            return
        if rel not in self.guards:
            self.guards.append(rel)


# No size reaches this: a comparison with it (a slice's default end, INT64_MAX) is decided.
_HUGE = 2**62
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_BELOW_HUGE = {"<": True, "<=": True, ">": False, ">=": False, "==": False, "!=": True}


def _against_huge(rel) -> Optional[bool]:
    """`size-expr OP c` for a constant |c| >= 2**62, decided as sizes are far below it."""
    if not isinstance(rel, sympy.core.relational.Relational):
        return None
    sides = ((rel.rhs, rel.lhs, rel.rel_op), (rel.lhs, rel.rhs, _MIRROR[rel.rel_op]))
    for const, other, op in sides:
        if const.is_Integer and not other.is_number and abs(int(const)) >= _HUGE:
            below = _BELOW_HUGE[op]
            return below if const > 0 else (not below if op not in ("==", "!=") else below)
    return None


def _is_bool_expr(e) -> bool:
    return isinstance(e, sympy.logic.boolalg.Boolean)


class SymNode:
    """The node under a torch.SymInt/SymBool/SymFloat: a sympy expression and its ShapeEnv."""

    def __init__(self, expr, env: ShapeEnv, pytype: type):
        self.expr, self.env, self.pytype = expr, env, pytype

    # --- what kind of value ---------------------------------------------------------------------
    def is_int(self):
        return self.pytype is int

    def is_bool(self):
        return self.pytype is bool

    def is_float(self):
        return self.pytype is float

    def is_nested_int(self):
        return False

    def is_symbolic(self):
        return True

    def is_constant(self):
        return bool(getattr(self.expr, "is_number", False)) or self.expr in (sympy.true, sympy.false)

    def has_hint(self):
        return True

    @property
    def hint(self):
        return self.pytype(self.env.hint(self.expr))

    def maybe_as_int(self):
        return int(self.expr) if self.pytype is int and self.expr.is_Integer else None

    def str(self):
        return str(self.expr)

    _graph_repr = str
    __str__ = str

    def __repr__(self):
        return f"SymNode({self.expr})"

    # --- making nodes ---------------------------------------------------------------------------
    def _new(self, expr, pytype):
        return SymNode(expr, self.env, pytype)

    def wrap_int(self, value):
        return self._new(sympy.Integer(value), int)

    def wrap_float(self, value):
        return self._new(sympy.Float(value), float)

    def wrap_bool(self, value):
        return self._new(sympy.true if value else sympy.false, bool)

    def clone(self):
        return self

    # --- arithmetic -----------------------------------------------------------------------------
    def _num(self, other, fn, pytype=None):
        pytype = pytype or (float if float in (self.pytype, other.pytype) else int)
        return self._new(fn(self.expr, other.expr), pytype)

    def add(self, other):
        return self._num(other, operator.add)

    def sub(self, other):
        return self._num(other, operator.sub)

    def mul(self, other):
        return self._num(other, operator.mul)

    def truediv(self, other):
        return self._num(other, lambda a, b: a / b, float)

    int_truediv = float_truediv = truediv

    def floordiv(self, other):
        if float in (self.pytype, other.pytype):
            return self._num(other, lambda a, b: sympy.floor(a / b), float)
        return self._num(other, _floordiv)

    int_floordiv = floordiv

    def mod(self, other):
        return self._num(other, sympy.Mod)

    def pow(self, other):
        return self._num(other, sympy.Pow)

    float_pow = pow

    def pow_by_natural(self, other):
        return self._num(other, sympy.Pow, int)

    def sym_min(self, other):
        return self._num(other, sympy.Min)

    def sym_max(self, other):
        return self._num(other, sympy.Max)

    def neg(self):
        return self._new(-self.expr, self.pytype)

    def abs(self):
        return self._new(sympy.Abs(self.expr), self.pytype)

    def ceil(self):
        return self._new(sympy.ceiling(self.expr), int)

    def floor(self):
        return self._new(sympy.floor(self.expr), int)

    def sym_float(self):
        return self._new(self.expr, float)

    def sym_int(self):
        return self._new(sympy.floor(self.expr) if self.pytype is float else self.expr, int)

    # --- comparisons and logic ------------------------------------------------------------------
    def _rel(self, other, fn):
        return self._new(fn(self.expr, other.expr), bool)

    def eq(self, other):
        return self._rel(other, sympy.Eq)

    def ne(self, other):
        return self._rel(other, sympy.Ne)

    def lt(self, other):
        return self._rel(other, sympy.Lt)

    def le(self, other):
        return self._rel(other, sympy.Le)

    def gt(self, other):
        return self._rel(other, sympy.Gt)

    def ge(self, other):
        return self._rel(other, sympy.Ge)

    def sym_and(self, other):
        return self._rel(other, sympy.And)

    def sym_or(self, other):
        return self._rel(other, sympy.Or)

    and_, or_ = sym_and, sym_or

    def sym_not(self):
        return self._new(sympy.Not(self.expr), bool)

    def sym_ite(self, then, other):
        return then if self.guard_bool("", 0) else other

    # --- decisions (torch calls these with the C++ file and line) ---------------------------------
    def guard_int(self, file=None, line=None):
        return int(self.env.guard_value(self.expr))

    def guard_float(self, file=None, line=None):
        return float(self.env.guard_value(self.expr))

    def guard_bool(self, file=None, line=None):
        if not _is_bool_expr(self.expr):  # an int used as a bool
            return bool(self.env.guard_value(self.expr))
        return self.env.guard_bool(self.expr)

    expect_true = guard_size_oblivious = guard_bool

    def guard_or_false(self, file=None, line=None):
        known = self.env.statically_known(self.expr)
        return bool(known)

    def guard_or_true(self, file=None, line=None):
        known = self.env.statically_known(self.expr)
        return True if known is None else known

    def statically_known_true(self, file=None, line=None):
        return self.env.statically_known(self.expr) is True

    def bool_(self):
        return self.guard_bool()

    def int_(self):
        return self.guard_int()

    # --- layout predicates (torch asks these of a tensor with symbolic sizes) ---------------------
    def _layout(self, sizes, strides, fn):
        """Decide a layout predicate at the hints. Ember's symbolic strides are products of sizes,
        so a predicate of sizes >= 2 holds for all of them when it holds for the hints."""
        sz = [self.env.hint(_node_expr(s)) for s in sizes]
        st = [self.env.hint(_node_expr(s)) for s in strides]
        return self.wrap_bool(fn(torch.empty_strided(sz, st, device="meta")))

    def is_contiguous(self, sizes, strides):
        return self._layout(sizes, strides, lambda t: t.is_contiguous())

    def is_channels_last_contiguous_2d(self, sizes, strides):
        return self._layout(sizes, strides,
                            lambda t: t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last))  # fmt: skip

    def is_channels_last_contiguous_3d(self, sizes, strides):
        return self._layout(sizes, strides,
                            lambda t: t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d))  # fmt: skip

    def is_channels_last_strides_2d(self, sizes, strides):
        return self.is_channels_last_contiguous_2d(sizes, strides)

    def is_channels_last_strides_3d(self, sizes, strides):
        return self.is_channels_last_contiguous_3d(sizes, strides)

    def is_non_overlapping_and_dense(self, sizes, strides):
        return self._layout(sizes, strides, _dense)

    def is_non_overlapping_and_dense_indicator(self, sizes, strides):
        return self._new(sympy.Integer(int(self.is_non_overlapping_and_dense(sizes, strides).expr
                                           is sympy.true)), int)  # fmt: skip


def _dense(t: torch.Tensor) -> bool:
    from .utils import is_non_overlapping_and_dense

    return is_non_overlapping_and_dense(tuple(t.shape), tuple(t.stride()))


def _node_expr(x):
    return x.expr if isinstance(x, SymNode) else as_expr(x)


def _floordiv(a, b):
    if b.is_Integer and b < 0 or a.is_number and a < 0:
        return sympy.floor(a / b)
    # a symbolic divisor (an integer one FloorDiv folds itself)
    exact = exact_quotient(a, b) if a.free_symbols and b.free_symbols else None
    return exact if exact is not None else FloorDiv(a, b)


# --- tensors with symbolic sizes -----------------------------------------------------------------


class SymbolicTensor(torch.Tensor):
    """A tensor whose sizes and strides are SymInts of our ShapeEnv; `.value` is its real value at
    the hints. The tracer records ops on it; outside the tracer an op runs on the values."""

    @staticmethod
    def __new__(cls, value: torch.Tensor, meta: TensorMeta, env: ShapeEnv):
        r = torch.Tensor._make_wrapper_subclass(
            cls, tuple(env.symint(s) for s in meta.sizes),
            strides=tuple(env.symint(s) for s in meta.strides),
            storage_offset=env.symint(meta.storage_offset), dtype=value.dtype,
            device=value.device, requires_grad=value.requires_grad,
        )  # fmt: skip
        r.value, r.env = value, env
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"SymbolicTensor({tuple(self.shape)}, {self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = func(*real_values(args), **real_values(kwargs or {}))
        if func._schema.is_mutable and isinstance(args[0], SymbolicTensor):
            return args[0]  # written in place: its value was
        return out


def real_values(tree):
    """`tree` with SymbolicTensors replaced by their values and symbolic sizes by their hints."""
    return pytree.tree_map(_real, tree)


def _real(x):
    if type(x) is SymbolicTensor:
        return x.value
    if isinstance(x, torch.SymInt) and isinstance(x.node, SymNode):
        return x.node.hint
    if isinstance(x, sympy.Basic) and x.free_symbols:
        raise TypeError("real_values: a bare sympy expression needs an env; use ShapeEnv.hint")
    return x


def symbolic_tensor(value: torch.Tensor, meta: TensorMeta, env: ShapeEnv) -> torch.Tensor:
    """`value` seen with `meta`'s (possibly symbolic) sizes: a SymbolicTensor, or `value` when
    static."""
    if meta.is_static():
        return value
    return SymbolicTensor(value, meta, env)


def bind_symbols(metas: list, tensors: list) -> dict:
    """symbol -> value, read from the first dimension whose size in `metas` is that bare symbol."""
    hints = {}
    for meta, t in zip(metas, tensors):
        if not isinstance(meta, TensorMeta):
            continue
        for s, real in zip(meta.sizes, t.shape):
            if s.is_Symbol and s not in hints:
                hints[s] = int(real)
    return hints


def free_size_symbols(value) -> set:
    """The size symbols in a (tree of) sympy expressions and TensorMetas."""
    out = set()
    for leaf in pytree.tree_leaves(value):
        if isinstance(leaf, TensorMeta):
            for e in (*leaf.sizes, *leaf.strides, leaf.storage_offset):
                out |= e.free_symbols
        elif isinstance(leaf, sympy.Basic):
            out |= leaf.free_symbols
    return out


_PY_FUNCTIONS = {
    "FloorDiv": operator.floordiv,
    "CeilDiv": lambda a, b: -(-a // b),
    "ModularIndexing": lambda x, d, m: (x // d) % m,
}


def expr_function(symbols, exprs):
    """A Python function `(*symbol values) -> [value of each expression]` (integer semantics for
    Ember's FloorDiv, CeilDiv and ModularIndexing), compiled once."""
    return sympy.lambdify(list(symbols), list(exprs), modules=[_PY_FUNCTIONS, "math"])


def is_symbolic_value(x) -> bool:
    """A SymInt/SymFloat/SymBool on our node."""
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) and isinstance(
        x.node, SymNode
    )


def to_expr(x):
    """A SymInt of ours as its sympy expression (plain numbers stay as they are)."""
    if is_symbolic_value(x):
        e = x.node.expr
        if e.is_Integer:
            return int(e)
        return e
    return x


__all__ = [
    "ShapeEnv", "SymNode", "SymbolicTensor", "bind_symbols", "expr_function", "free_size_symbols",
    "is_symbolic_value", "real_values", "symbolic_tensor", "to_expr",
]  # fmt: skip
