"""Symbolic sizes while tracing: which input sizes are symbols, ints computed from them, guards.

A dynamic input size is a sympy symbol ("s0", "s1"...) with a range and a hint (the value in the
call being compiled). Ints the program computes from sizes are `SymIntVT`s: an fx node computing
the int at run time (so the graph works for every size) plus its sympy expression (for guards and
branches). A Python decision on one (`if t > 16`, `range(t)`, a size forced to a constant) takes
the hint's answer and records the relation that made it, as a guard: the cache entry is reused
only for sizes that decide the same way.

The rules (documented for users in the README):
- sizes 0 and 1 are always specialised (a symbol is >= 2), so broadcasting and squeeze decisions
  never depend on a symbol (export's `Dim(min=1)` is traced so too, then checked at 1:
  export_size_one.py);
- a tensor gets symbolic sizes only if it is not a parameter or buffer of a module and its
  strides are exactly row-major contiguous for its sizes (others keep static sizes);
- `ember.compile(dynamic=True)` makes every other input size symbolic; `dynamic=None` (default)
  does so for `mark_dynamic`ed sizes, and for sizes that changed since the frame's previous
  compile (automatic dynamic, at the first recompile); `dynamic=False` specialises everything;
- a marked size whose value lies outside its declared range is specialised for that compile.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Callable, Optional

import sympy
import torch

from ember.ir import NODE_META_KEY, FloorDiv, SymbolSpec, TensorMeta, contiguous_strides, sym
from ember.ir.symbols import CeilDiv, exact_quotient

from . import variables as V


# node.meta key of a captured op's symbolic result sizes (its TensorMeta has the example's sizes)
SYM_SIZES = "ember_sym_sizes"


class SymbolicFallback(Exception):
    """Something symbolic this tracer cannot express: the frame is traced again, static.
    (Not an Unsupported: it must not turn into a graph break.)"""


class SpecializationError(RuntimeError):
    """ember.export: the program forces a size declared dynamic to a constant, or constrains it
    beyond its declared range; the message names the size and the user's line."""


class SymIntVT(V.VT):
    """An int computed from dynamic sizes: `node` computes it in the graph, `expr` over symbols."""

    def __init__(self, env: "ShapeEnv", node, expr: sympy.Expr):
        self.env = env
        self.node = node
        self.expr = expr

    @property
    def hint(self) -> int:
        return self.env.hint(self.expr)

    def python_type(self):
        return int

    def __repr__(self):
        return f"SymIntVT({self.expr}={self.hint})"


class SizeDecisionVT(V.ConstVT):
    """A comparison of sizes (`x.shape[0] > 4`): the bool at the hints, guarded, as any decision,
    except that torch.cond may take it back while nothing has read it (`retract`) and compute it
    in the graph instead, capturing both branches; a read after that guards it again."""

    def __init__(self, value: bool, env: "ShapeEnv", relation, fresh: bool, op, a, b):
        self._value, self.source = value, None
        self.env, self.relation, self.fresh = env, relation, fresh
        self.op, self.a, self.b = op, a, b
        self.read = False  # the bool was read: something took this branch of the guard
        self.retracted = False

    @property
    def value(self):
        self.read = True
        if self.retracted:  # read after torch.cond took the guard back: guard it now
            self.retracted = False
            self.env.assume(self.relation)
        return self._value

    def python_type(self):
        return bool

    def retract(self) -> bool:
        """Drop this decision's guard if it alone made it and nothing read it (True: dropped)."""
        rel = self.relation
        if self.read or not self.fresh or isinstance(rel, (sympy.Eq, sympy.Ne)):
            return False  # (an equality may have pinned a symbol: not undone here)
        if self.env.exporting:  # export checked it against the Dims' ranges: it holds there
            return False
        if self.env.relations.get(rel) is None:
            return False
        del self.env.relations[rel]
        self.retracted = True
        return True

    def restore(self) -> None:
        if self.retracted:
            self.retracted = False
            self.env.assume(self.relation)


class SymSliceVT(V.VT):
    """slice(start, stop, step) with a symbolic bound (used to index tensors)."""

    def __init__(self, parts: list):
        self.parts = list(parts) + [V.ConstVT(None)] * (3 - len(parts))

    def python_type(self):
        return slice


class SizeVT(V.ListVT):
    """A torch.Size with symbolic entries (a tuple of ConstVT/SymIntVT)."""

    def __init__(self, items):
        super().__init__(items, is_tuple=True)

    def python_type(self):
        return torch.Size


@dataclasses.dataclass
class SymbolInfo:
    """Where a symbol was read from: `source.size(dim)` of a graph input, and its hint."""

    spec: SymbolSpec
    source: object
    dim: int
    hint: int
    label: str = ""  # export: the Dim's name


@dataclasses.dataclass
class DimRange:
    """A requested dynamic size: its range, and for export the Dim it belongs to."""

    lower: int = 2
    upper: Optional[int] = None
    dim: object = None  # export: an ember.export Dim or a derived `k * Dim`


class ShapeEnv:
    """Symbols, their hints and sources, the relations the trace assumed, and size nodes."""

    def __init__(self, graph, where: Callable[[], str], exporting: bool = False):
        self.graph = graph
        self.where = where
        self.exporting = exporting
        self.symbols: list[SymbolInfo] = []
        self.hints: dict[sympy.Symbol, sympy.Integer] = {}
        self.relations: dict[sympy.Basic, str] = {}  # relation -> the user's file:line
        self.nodes: dict[sympy.Expr, object] = {}  # expression -> an fx node computing it
        self.dims: dict[int, sympy.Expr] = {}  # export: id(Dim) -> its symbol
        # The guard VM reads each dynamic input size into an int slot; a symbol's value is an
        # expression over slot symbols, and `definitions` relate slots that share symbols.
        self.slots: list[tuple] = []  # slot k: (source, dim)
        self.value_of: dict[sympy.Symbol, sympy.Expr] = {}  # symbol -> expression over slots
        self.definitions: list = []
        # Symbols an assumed equality pinned to a constant or to another symbol (guarded): the
        # graph's backend sees the replacement, not the symbol (see `assume`).
        self.replacements: dict[sympy.Symbol, sympy.Expr] = {}

    # -- symbols ---------------------------------------------------------------------------------
    def input_size(self, source, dim: int, hint: int, rng: "DimRange") -> sympy.Expr:
        """The expression of the dynamic input size `source.size(dim)` (its value is `hint`)."""
        slot = slot_symbol(len(self.slots))
        self.slots.append((source, dim))
        expr = self._symbol_for(source, dim, hint, rng)
        s = next(iter(expr.free_symbols))
        if s not in self.value_of:  # the first size of this symbol defines it
            scale = expr.coeff(s) if expr != s else 1
            self.value_of[s] = slot if scale == 1 else FloorDiv(slot, scale)
            if scale != 1:
                self.definitions.append(sympy.Eq(sympy.Mod(slot, scale), 0))
        else:
            self.definitions.append(sympy.Eq(slot, expr.xreplace(self.value_of)))
        return expr

    def _symbol_for(self, source, dim: int, hint: int, rng: "DimRange") -> sympy.Expr:
        if rng.dim is not None:
            root, scale = rng.dim.root(), rng.dim.scale
            if id(root) in self.dims:
                return scale * self.dims[id(root)]
            if hint % scale:
                raise SpecializationError(f"size {_size_name(source, dim)} = {hint} is not a "
                                           f"multiple of {scale} as `{rng.dim}` says")  # fmt: skip
            hint //= scale
        s = sym(f"s{len(self.symbols)}")
        label = rng.dim.root().name if rng.dim is not None else ""
        spec = SymbolSpec(s.name, rng.lower, rng.upper)
        self.symbols.append(SymbolInfo(spec, source, dim, hint, label))
        self.hints[s] = sympy.Integer(hint)
        if rng.dim is not None:
            self.dims[id(rng.dim.root())] = s
            return rng.dim.scale * s
        return s

    def guard_relations(self, extra=()) -> list:
        """Every relation the cache entry needs, over slot symbols: the symbols' ranges, the
        slot definitions, what the trace assumed and what the backend asserted (`extra`)."""
        out = list(self.definitions)
        for info in self.symbols:
            value = self.value_of[info.spec.symbol]
            out.append(value >= info.spec.lower)
            if info.spec.upper is not None:
                out.append(value <= info.spec.upper)
        out += [sympy.sympify(r).xreplace(self.value_of) for r in (*self.relations, *extra)]
        return [r for r in out if r is not sympy.true]

    def specs(self) -> tuple:
        """The symbols the graph keeps (replaced ones are constants or other symbols there)."""
        return tuple(i.spec for i in self.symbols if i.spec.symbol not in self.replacements)

    def simplify(self, expr) -> sympy.Expr:
        """`expr` with the replaced symbols substituted."""
        expr = sympy.sympify(expr)
        return expr.xreplace(self.replacements) if self.replacements else expr

    def pin_placeholders(self, graph) -> None:
        """Write the replacements into the placeholders' symbolic sizes (what the backend reads)."""
        for node in graph.find_nodes(op="placeholder"):
            meta = node.meta.get(NODE_META_KEY)
            if isinstance(meta, TensorMeta) and not meta.is_static():
                sizes = tuple(self.simplify(s) for s in meta.sizes)
                node.meta[NODE_META_KEY] = dataclasses.replace(
                    meta, sizes=sizes, strides=contiguous_strides(sizes))  # fmt: skip

    def hint(self, expr) -> int:
        value = sympy.sympify(expr).xreplace(self.hints)
        if value.is_Integer or value in (sympy.true, sympy.false):
            return int(bool(value)) if value in (sympy.true, sympy.false) else int(value)
        raise SymbolicFallback(f"cannot evaluate the size expression {expr}")

    # -- decisions and guards --------------------------------------------------------------------
    def decide(self, relation) -> bool:
        """The hint's answer to `relation`, recorded as a guard (or its negation)."""
        relation = sympy.sympify(relation)
        if relation in (sympy.true, sympy.false):
            return bool(relation)
        value = bool(relation.xreplace(self.hints))
        self.assume(relation if value else sympy.Not(relation))
        return value

    def decide_compare(self, op, a, b) -> V.VT:
        """`a <op> b` for ints, one symbolic: a guarded bool that torch.cond may take back."""
        relation = sympy.sympify(COMPARE[op](as_sym(a), as_sym(b)))
        if relation in (sympy.true, sympy.false):
            return V.ConstVT(bool(relation))
        value = bool(relation.xreplace(self.hints))
        recorded = sympy.sympify(relation if value else sympy.Not(relation))
        fresh = recorded not in self.relations
        self.assume(recorded)
        return SizeDecisionVT(value, self, recorded, fresh, op, a, b)

    def assume(self, relation) -> None:
        """Record that the trace is valid only where `relation` holds (it holds for the hints)."""
        relation = sympy.sympify(relation)
        if relation is sympy.true:
            return
        if self.exporting:
            self._check_export_assumption(relation)
        self.relations.setdefault(relation, self.where())
        if isinstance(relation, sympy.Eq) and not self.exporting:
            self._replace(relation)

    def _replace(self, eq) -> None:
        """Pin a symbol that `eq` (guarded) fixes: to a constant (`s2 == 768`, also through a
        product such as `768*s0*s1 == s0*s1*s2`) or to an earlier symbol (`s7 == s3`). A symbol
        that only the guards, not the graph, knew to be fixed leaves the backend with sizes it
        cannot prove equal (a LayerNorm weight of 768 broadcast against a hidden size s2)."""
        solved = _solve_pinned(self.simplify(eq.lhs - eq.rhs))
        if solved is None:
            return
        s, value = solved
        self.replacements = {k: v.xreplace({s: value}) for k, v in self.replacements.items()}
        self.replacements[s] = value

    def specialize(self, vt: SymIntVT) -> int:
        """A concrete int for a symbolic one (guarded: other values recompile)."""
        value = vt.hint
        self.assume(sympy.Eq(vt.expr, value))
        return value

    def _check_export_assumption(self, relation) -> None:
        if holds_in_ranges(relation, {i.spec.symbol: i.spec for i in self.symbols}):
            return
        where = self.where()
        if isinstance(relation, sympy.Eq) and len(relation.free_symbols) == 1:
            (s,) = relation.free_symbols
            info = next(i for i in self.symbols if i.spec.symbol == s)
            raise SpecializationError(
                f"ember.export: the program specialises the dynamic size "
                f"{_size_name(info.source, info.dim)} (Dim {info.label or s.name!r}) to the "
                f"constant {info.hint} at {where}; mark it static or remove the specialisation"
            )
        raise SpecializationError(
            f"ember.export: the program assumes {describe_relation(relation, self.symbols)} at "
            f"{where}, which the declared Dim ranges do not guarantee; declare Dims that "
            "guarantee it (a shared Dim for equal sizes, a narrower min/max)",
            where,
        )

    # -- ints in the graph -----------------------------------------------------------------------
    def int_vt(self, expr, make_node: Callable[[], object]) -> V.VT:
        """A ConstVT for a static expression, else the SymIntVT computed by `make_node()`."""
        expr = self.simplify(expr)
        if expr.is_Integer:
            return V.ConstVT(int(expr))
        node = self.nodes.get(expr)
        if node is None:
            node = self.nodes[expr] = make_node()
        return SymIntVT(self, node, expr)

    def size_vt(self, tensor_node, dim: int, expr) -> V.VT:
        return self.int_vt(expr, lambda: self.graph.call_method("size", (tensor_node, dim)))

    def arith(self, op, a: V.VT, b: V.VT) -> V.VT:
        """a <op> b for ints where one is symbolic: a graph node and its expression."""
        ea, eb = as_sym(a), as_sym(b)
        if op in (operator.floordiv, operator.mod):
            # Sizes are divided with non-negative operands (FloorDiv's meaning); other signs are
            # rare and would need Python's floor semantics downstream: trace statically.
            ok = (ea.is_nonnegative or self.decide(ea >= 0)) and (
                eb.is_positive or self.decide(eb > 0))
            expr = (exact_quotient(ea, eb) or FloorDiv(ea, eb)) if op is operator.floordiv else (
                sympy.Mod(ea, eb))
            expr = expr if ok else None
        elif op is operator.pow:
            expr = ea**eb if eb.is_Integer and int(eb) >= 0 else None
        else:
            expr = _SYMPY_OPS[op](ea, eb)
        if expr is None:
            raise SymbolicFallback(f"{op.__name__} of sizes that may be negative")
        node_a, node_b = graph_arg(a), graph_arg(b)
        return self.int_vt(expr, lambda: self.graph.call_function(op, (node_a, node_b)))

    def neg(self, a: SymIntVT) -> V.VT:
        return self.int_vt(-a.expr, lambda: self.graph.call_function(operator.neg, (a.node,)))


_SYMPY_OPS = {operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul}
INT_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
           operator.pow}  # fmt: skip
COMPARE = {operator.eq: sympy.Eq, operator.ne: sympy.Ne, operator.lt: sympy.Lt,
           operator.le: sympy.Le, operator.gt: sympy.Gt, operator.ge: sympy.Ge}  # fmt: skip


def _solve_pinned(diff):
    """(symbol, value) when `diff == 0` forces one symbol to an integer or to another symbol,
    the factors that are products of sizes (never 0: sizes are >= 2) set aside; else None."""
    if not diff.free_symbols:
        return None
    factors = [f for f in sympy.Mul.make_args(sympy.factor(diff))
               if not (f.is_number or f.is_Symbol or (f.is_Pow and f.base.is_Symbol))]  # fmt: skip
    if len(factors) != 1:
        return None
    poly = sympy.expand(factors[0])
    syms = sorted(poly.free_symbols, key=_symbol_order)
    if not poly.is_polynomial(*syms):  # CeilDiv(s0, CeilDiv(s0, 2)) == 2 (chunk): no pin, and
        return None  # evaluating it at s0 = 0 below would divide by zero
    if len(syms) == 1:
        (s,) = syms
        a, b = poly.coeff(s), poly.subs(s, 0)
        if sympy.expand(a * s + b - poly) != 0 or a == 0:
            return None
        value = -b / a
        return (s, value) if value.is_Integer and value >= 2 else None
    if len(syms) == 2:
        first, later = syms
        a = poly.coeff(later)
        if a != 0 and sympy.expand(poly - a * later + a * first) == 0:
            return later, first  # a * (later - first) == 0
    return None


def _symbol_order(s):
    return (len(s.name), s.name)


def slot_symbol(k: int) -> sympy.Symbol:
    """The guard VM's int slot k, as a symbol of guard expressions."""
    return sympy.Symbol(f"_slot{k}", integer=True, positive=True)


def as_sym(vt) -> sympy.Expr:
    """The sympy expression of an int VT (ConstVT int or SymIntVT)."""
    if isinstance(vt, SymIntVT):
        return vt.expr
    if isinstance(vt, V.ConstVT) and isinstance(vt.value, int) and not isinstance(vt.value, bool):
        return sympy.Integer(vt.value)
    raise TypeError(f"a {type(vt).__name__} used as a size")


def graph_arg(vt):
    """What stands for an int VT in a graph node's arguments."""
    return vt.node if isinstance(vt, SymIntVT) else vt.value


def is_int_vt(vt) -> bool:
    return isinstance(vt, SymIntVT) or (
        isinstance(vt, V.ConstVT) and isinstance(vt.value, int) and not isinstance(vt.value, bool)
    )


def _size_name(source, dim) -> str:
    return f"{source.name()}.size()[{dim}]"


def describe_relation(relation, symbols) -> str:
    names = {i.spec.symbol: sympy.Symbol(f"{_size_name(i.source, i.dim)}") for i in symbols}
    return str(relation.xreplace(names))


def holds_in_ranges(relation, specs: dict) -> bool:
    """Whether `relation` holds for every value of its symbols in their ranges: sympy proves it
    with each symbol written as lower + k, or with each bounded one written as upper - k (k a
    non-negative integer): either covers the ranges."""
    if isinstance(relation, sympy.Ne):  # (sympy leaves Ne(k + 2, 1) undecided)
        a, b = relation.args
        return holds_in_ranges(sympy.Gt(a, b), specs) or holds_in_ranges(sympy.Lt(a, b), specs)
    if any(s not in specs for s in relation.free_symbols):
        return False
    for side in ("lower", "upper"):
        subs = {}
        for s in relation.free_symbols:
            spec = specs[s]
            k = sympy.Symbol(f"k_{s.name}", integer=True, nonnegative=True)
            up = side == "upper" and spec.upper is not None
            subs[s] = spec.upper - k if up else spec.lower + k
        if sympy.simplify(relation.xreplace(subs)) is sympy.true:
            return True
    return False


# -- guards in the C++ guard VM -------------------------------------------------------------------
# Opcodes of the int-expression programs (csrc/eval_frame.cc: enum IntOp): postfix over int64.
I_SLOT, I_CONST, I_ADD, I_MUL, I_FLOORDIV, I_MOD, I_NEG = 0, 1, 2, 3, 4, 5, 6
I_EQ, I_NE, I_LT, I_LE, I_GT, I_GE, I_AND, I_OR, I_NOT, I_MIN, I_MAX, I_CEILDIV = range(7, 19)

_REL_OPS = {sympy.Eq: I_EQ, sympy.Ne: I_NE, sympy.StrictLessThan: I_LT, sympy.LessThan: I_LE,
            sympy.StrictGreaterThan: I_GT, sympy.GreaterThan: I_GE}  # fmt: skip
_NARY = {sympy.Add: I_ADD, sympy.Mul: I_MUL, sympy.And: I_AND, sympy.Or: I_OR, sympy.Min: I_MIN,
         sympy.Max: I_MAX}  # fmt: skip
_BINARY = {FloorDiv: I_FLOORDIV, CeilDiv: I_CEILDIV, sympy.Mod: I_MOD}


def compile_int_program(expr, slot_of: dict) -> tuple[int, ...]:
    """`expr` (an integer expression or relation over symbols) as a postfix program over the
    guard VM's int slots; `slot_of` maps each symbol to its slot. TypeError for other heads."""
    out: list[int] = []

    def emit(e):
        if e is sympy.true or e is sympy.false:
            out.extend((I_CONST, int(e is sympy.true)))
        elif e.is_Integer:
            out.extend((I_CONST, int(e)))
        elif e.is_Symbol:
            out.extend((I_SLOT, slot_of[e]))
        elif type(e) in _REL_OPS or type(e) in _BINARY:
            emit(e.args[0])
            emit(e.args[1])
            out.append(_REL_OPS.get(type(e), _BINARY.get(type(e))))
        elif type(e) in _NARY:
            emit(e.args[0])
            for a in e.args[1:]:
                emit(a)
                out.append(_NARY[type(e)])
        elif isinstance(e, sympy.Not):
            emit(e.args[0])
            out.append(I_NOT)
        elif isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 1:
            emit(e.base)
            for _ in range(int(e.exp) - 1):
                emit(e.base)
                out.append(I_MUL)
        else:
            raise TypeError(f"no guard instruction for {type(e).__name__} in {expr}")

    emit(sympy.sympify(expr))
    return tuple(out)


# -- Python text of an int expression (the transformed function rebuilds ints with it) -----------
def python_text(expr, text_of: Callable[[sympy.Symbol], str]) -> str:
    """Python source computing `expr`; `text_of(symbol)` is the source of a symbol's value."""
    e = sympy.sympify(expr)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return text_of(e)
    args = [python_text(a, text_of) for a in e.args]
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(args) + ")"
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
        return f"({args[0]} ** {int(e.exp)})"
    if isinstance(e, FloorDiv):
        return f"({args[0]} // {args[1]})"
    if isinstance(e, CeilDiv):
        return f"(-(-{args[0]} // {args[1]}))"
    if isinstance(e, sympy.Mod):
        return f"({args[0]} % {args[1]})"
    if isinstance(e, (sympy.Min, sympy.Max)):
        return f"{'min' if isinstance(e, sympy.Min) else 'max'}({', '.join(args)})"
    raise SymbolicFallback(f"cannot write the size expression {expr} as Python")
