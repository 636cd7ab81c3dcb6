"""What the C++ and Triton renderers share: index simplification and printing, loop merging,
kernel arguments, and the ops-handler plumbing with common-subexpression elimination.

A renderer is the `ops` handler while member bodies run: each op call emits one line and returns
a `CSEVar`. Subclasses set capability flags and override only what their language spells
differently (loads, stores, reductions, loop structure, op spellings).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re

import sympy
import torch

from ember.ir import FloorDiv, ModularIndexing
from ember.ir.symbols import expand_index

from .index_simplify import simplify_index
from .loop_ir import COMPARE_OPS, ExternBuffer, MultiOutput, compute_dtype, set_handler
from .scheduler import Kernel


class CantRender(Exception):
    """This variant (e.g. the vectorized loop) cannot express the kernel; use another."""


@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A rendered kernel: entry name, language, source, and the buffers it takes, in order."""

    name: str
    language: str
    source: str
    args: tuple  # buffer names
    arg_types: tuple  # "*fp32" etc. (ir KernelIR form)
    grid: tuple = ()
    meta: tuple = ()  # (("XBLOCK", 1024), ...) launch constants for Triton
    num_warps: int = 4


class CSEVar:
    """A value in generated code: its name, dtype and whether it is a vector."""

    def __init__(self, name: str, dtype: torch.dtype, vec: bool = False):
        self.name, self.dtype, self.vec = name, dtype, vec

    def __str__(self):
        return self.name

    __repr__ = __str__


# --- index expressions ---------------------------------------------------------------------------


C_MINMAX = ("std::max<int64_t>", "std::min<int64_t>")
PY_MINMAX = ("max", "min")  # the Python wrapper
TRITON_MINMAX = ("tl.maximum", "tl.minimum")  # a kernel's sizes are scalars, not Python ints


def print_index(expr, floordiv="/", mod="%", minmax=C_MINMAX) -> str:
    """An integer expression in C/Python syntax (non-negative operands assumed for / and %)."""

    def p(e):
        if e.is_Integer or e.is_Symbol:
            return str(e)
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=sympy.default_sort_key)
            out = p(terms[0])
            for t in terms[1:]:
                c, rest = t.as_coeff_Mul()
                out += f" - {p(-t)}" if c < 0 else f" + {p(t)}"
            return out
        if isinstance(e, sympy.Mul):
            return " * ".join(_paren(p(a), a) for a in e.args)
        if isinstance(e, FloorDiv):
            return f"(({p(e.args[0])}) {floordiv} {_paren(p(e.args[1]), e.args[1])})"
        if isinstance(e, ModularIndexing):
            x, d, m = e.args
            inner = p(x) if d == 1 else f"({p(x)}) {floordiv} {_paren(p(d), d)}"
            return f"(({inner}) {mod} {_paren(p(m), m)})"
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
            return " * ".join([_paren(p(e.base), e.base)] * int(e.exp))
        if isinstance(e, (sympy.Max, sympy.Min)):
            return _minmax(e, p, minmax)
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            # floor(n/d) or ceiling(n/d) of integers (a size rounded up to a multiple, as
            # torch's attention pads its mask): an integer division of non-negative operands
            n, d = sympy.fraction(sympy.together(e.args[0]))
            if n.is_integer and d.is_integer and d.is_positive:
                if isinstance(e, sympy.ceiling):
                    n = n + d - 1
                return f"(({p(n)}) {floordiv} {_paren(p(d), d)})"
        raise NotImplementedError(f"cannot print index expression {e}")

    return p(sympy.sympify(expr))


_SIZE_SYMBOL = re.compile(r"\bs\d+\b")


def size_symbols_in(lines) -> list[str]:
    """The dynamic size symbols ("s0", "s1", ...; DYNAMIC.md's names) that generated code uses."""
    found = {m.group(0) for line in lines for m in _SIZE_SYMBOL.finditer(line)}
    return sorted(found, key=lambda name: int(name[1:]))


def code_text(value) -> str:
    """A size or bound in generated code: sympy expressions through `print_index`."""
    if isinstance(value, sympy.Basic):
        return print_index(value)
    return str(value)


def _minmax(e, p, names):
    args = list(e.args)
    if isinstance(e, sympy.Max) and any(a == 1 for a in args):
        # Max(1, size) (a stride) where the size is a positive integer sympy did not order
        # against 1, e.g. 16*ceiling(s/16) built from a Mod
        positive = [a for a in args if a != 1 and a.is_integer and a.is_positive]
        if positive:
            args = [a for a in args if a != 1]
    if len(args) == 1:
        return p(args[0])
    fn = names[0] if isinstance(e, sympy.Max) else names[1]
    out = p(args[0])
    for a in args[1:]:
        out = f"{fn}({out}, {p(a)})"
    return out


def _paren(text, e):
    return text if (e.is_Atom or isinstance(e, (FloorDiv, ModularIndexing))) else f"({text})"


def merge_dims(sizes, vars_, exprs):
    """Merge adjacent loop dims that every index in `exprs` walks as one.

    Returns (new sizes, new vars, assignment): passing `assignment` (one expression per old var)
    in place of the old vars leaves every affine index unchanged.
    """
    # Pure in its arguments, and kernels of repeated layers ask with the same ones: each answer
    # costs many sympy expansions and coefficient extractions, so it is remembered.
    got = _merged_dims(tuple(sizes), tuple(vars_), tuple(sympy.sympify(e) for e in exprs))
    return list(got[0]), list(got[1]), list(got[2])


@functools.lru_cache(maxsize=1 << 12)
def _merged_dims(sizes, vars_, exprs):
    assign = {v: v for v in vars_}
    size = dict(zip(vars_, sizes))
    live = [v for v in vars_ if size[v] != 1]
    for v in vars_:
        if size[v] == 1:
            assign[v] = sympy.S.Zero
    exprs = [sympy.expand(sympy.sympify(e).subs(assign)) for e in exprs]
    k = len(live) - 2
    while k >= 0:
        a, b = live[k], live[k + 1]
        if all(_mergeable(e, a, b, size[b]) for e in exprs):
            exprs = [sympy.expand(e.subs(a, 0)) for e in exprs]
            assign[a] = sympy.S.Zero
            size[b] = size[a] * size[b]
            live.pop(k)
        k -= 1
    names = itertools.count()
    rename = {v: sympy.Symbol(f"{str(v)[0]}{next(names)}", integer=True, nonnegative=True)
              for v in live}  # fmt: skip
    final = {old: sympy.sympify(e).subs(rename) for old, e in assign.items()}
    new_vars = tuple(rename[v] for v in live)
    return tuple(size[v] for v in live), new_vars, tuple(final[v] for v in vars_)


def _mergeable(e, a, b, size_b) -> bool:
    if not (e.has(a) or e.has(b)):
        return True
    ca, cb = e.coeff(a), e.coeff(b)
    if ca.has(a, b) or cb.has(a, b):
        return False
    rest = sympy.expand(e - ca * a - cb * b)
    return not rest.has(a, b) and sympy.expand(ca - cb * size_b) == 0


# --- the renderer base ---------------------------------------------------------------------------


class Renderer:
    """Renders one scheduled Kernel; subclasses spell the language."""

    language = ""
    vectorizes = False  # renders an explicit vector loop (C++)
    block_values = False  # values are whole blocks, reductions are block reductions (Triton)

    def __init__(self, kernel: Kernel, buffers: dict, name: str):
        self.kernel, self.buffers, self.name = kernel, buffers, name
        self.lines: list[str] = []
        self.cse: dict = {}
        self.locals: dict = {}  # (buffer, index) -> CSEVar valid in the whole x iteration
        self._ids = itertools.count()
        self.args: dict[str, str] = {}  # buffer name -> parameter name
        self.mask_stack: list = []
        self._collect_args()

    # arguments: every buffer read from memory, and every stored non-local member
    def _collect_args(self):
        k = self.kernel
        reads, stores = [], []
        for m in k.members:
            rec = k.record(m)
            reads += [n for n, _ in rec.loads if n not in k.names]
            stores += [n for n, _ in rec.stores if n not in k.local]
        stored_and_read = [n for n in k.names if n not in k.local]
        for n in dict.fromkeys(reads):
            self.args[n] = f"in_ptr{len(self.args)}"
        for n in dict.fromkeys(stores + stored_and_read):
            self.args.setdefault(n, f"out_ptr{len(self.args)}")

    def arg_buffer(self, name):
        return self.buffers[name]

    # --- CSE ------------------------------------------------------------------------------------
    def newvar(self, dtype, vec=False) -> CSEVar:
        return CSEVar(f"tmp{next(self._ids)}", dtype, vec)

    def emit(self, text: str, dtype, vec=None, key=None) -> CSEVar:
        key = key or text
        if key in self.cse:
            return self.cse[key]
        var = self.newvar(dtype, self.vector_mode if vec is None else vec)
        self.lines.append(self.assign(var, text))
        self.cse[key] = var
        return var

    def masked_key(self, first_local: int, text: str):
        """The CSE key of a masked body whose temporaries are numbered from `first_local` on: its
        text with those renamed by position, so the same masked read (a padded slice used by
        several ops) is rendered once rather than once per use."""

        def rename(m):
            n = int(m.group(1))
            return f"local{n - first_local}" if n >= first_local else m.group(0)

        return ("masked", re.sub(r"\btmp(\d+)\b", rename, text))

    vector_mode = False

    def assign(self, var: CSEVar, text: str) -> str:
        raise NotImplementedError

    # --- the ops handler ------------------------------------------------------------------------
    def __getattr__(self, name):
        from .loop_ir import BINARY_OPS, UNARY_OPS

        if name in UNARY_OPS or name in BINARY_OPS:

            def op(*args):
                dtype = torch.bool if name in COMPARE_OPS else args[0].dtype
                return self.emit(self.op_text(name, args), dtype, vec=self.op_is_vector(args))

            return op
        raise AttributeError(name)

    def op_text(self, name, args) -> str:
        raise NotImplementedError

    def op_is_vector(self, args):
        """Whether an op's result is a vector (None: as the loop being rendered is)."""
        return None

    def index_text(self, expr) -> str:
        return print_index(simplify_index(expr, self.ranges))

    def kernel_indices(self):
        """The kernel's variables and every index its members use, simplified within the
        kernel's ranges (so that merge_dims sees a reshape's div/mod as the affine index it is)."""
        k = self.kernel
        xs, rs = k.vars()
        self.kernel_ranges = dict(zip([*xs, *rs], [*k.xsizes, *k.rsizes]))
        exprs = []
        for m in k.members:
            rec = k.record(m)
            exprs += [i for _, i in rec.loads + rec.stores] + rec.index_exprs
        return xs, rs, [simplify_index(e, self.kernel_ranges) for e in exprs]

    def run_members(self, members, xs, rs):
        """Emit the bodies of `members` into self.lines; xs, rs (expressions of the rendered loop
        variables, one per kernel dimension) stand for the kernel's variables."""
        kxs, krs = self.kernel.vars()
        krs = krs[: len(rs)]
        # Bodies index with the kernel's own variables: `final_index` simplifies within their
        # ranges first (merged loops make a reshape's div/mod affine only there), then substitutes.
        self.subst = {**dict(zip(kxs, xs)), **dict(zip(krs, rs))}
        self._final = {}
        with set_handler(self):
            for m in members:
                self.member = m
                m.node.body(*self.kernel.member_index(m, kxs, krs))

    def final_index(self, index):
        """A body's index (over the kernel's variables) over the rendered loop variables."""
        index = sympy.sympify(index)
        if index not in self._final:
            e = simplify_index(index, self.kernel_ranges).xreplace(self.subst)
            self._final[index] = simplify_index(expand_index(e), self.ranges)
        return self._final[index]

    def index_key(self, index):
        """An index as a cache key: the same element whatever form the lowering gave it (a
        reshape's div/mod of a variable by its own range, a size-1 loop's variable)."""
        ranges = getattr(self, "ranges", None) or {}
        index = simplify_index(index, ranges) if ranges else index
        unit = {v: 0 for v, n in ranges.items() if n == 1}
        return expand_index(sympy.sympify(index).subs(unit) if unit else index)

    def is_local_value(self, name, index):
        return (name, self.index_key(index)) in self.locals

    def dtype_of(self, name) -> torch.dtype:
        return self.buffers[name].dtype


# Element types of kernel pointer arguments, by their ir KernelIR names.
POINTER_TYPES = {
    torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16",
    torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
    torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1", torch.uint16: "u16",
    torch.uint32: "u32", torch.uint64: "u64",
}  # fmt: skip


def buffer_ptr_type(dtype: torch.dtype) -> str:
    """The ir KernelIR argument type of a buffer pointer ("*fp32")."""
    return "*" + POINTER_TYPES[dtype]


def is_float(dtype) -> bool:
    return dtype.is_floating_point


def compute_type(dtype):
    return compute_dtype(dtype)


__all__ = [
    "CSEVar", "CantRender", "ExternBuffer", "KernelSource", "MultiOutput", "POINTER_TYPES",
    "Renderer", "buffer_ptr_type", "code_text", "merge_dims", "print_index", "simplify_index",
    "size_symbols_in",
]  # fmt: skip
